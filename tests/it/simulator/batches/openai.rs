//! OpenAI's Batch API: files, batches, output and error files.

use reqwest::StatusCode;
use serde_json::{Value, json};

use super::{DELAY, calls_of, get_json, lines, mock_batch, poll, start};
use crate::simulator::{Server, chat};

const BOUNDARY: &str = "sim-batch-boundary";

/// A multipart upload of `file` with `purpose=batch`, as OpenAI's clients send it.
async fn upload_raw(server: &Server, file: &[u8]) -> reqwest::Response {
    let mut body = format!(
        "--{BOUNDARY}\r\nContent-Disposition: form-data; name=\"purpose\"\r\n\r\nbatch\r\n\
         --{BOUNDARY}\r\nContent-Disposition: form-data; name=\"file\"; filename=\"in.jsonl\"\r\n\
         Content-Type: application/jsonl\r\n\r\n"
    )
    .into_bytes();
    body.extend_from_slice(file);
    body.extend_from_slice(format!("\r\n--{BOUNDARY}--\r\n").as_bytes());
    reqwest::Client::new()
        .post(server.url("/v1/files"))
        .header(
            "content-type",
            format!("multipart/form-data; boundary={BOUNDARY}"),
        )
        .body(body)
        .send()
        .await
        .unwrap()
}

fn input_line(custom_id: &str, content: &str) -> String {
    json!({
        "custom_id": custom_id,
        "method": "POST",
        "url": "/v1/chat/completions",
        "body": chat(content),
    })
    .to_string()
}

/// Uploads the requests `(custom_id, content)` and creates a batch of them.
async fn create_batch(server: &Server, requests: &[(&str, &str)], metadata: Value) -> Value {
    let file: Vec<String> = requests
        .iter()
        .map(|(id, content)| input_line(id, content))
        .collect();
    let response = upload_raw(server, file.join("\n").as_bytes()).await;
    assert_eq!(response.status(), StatusCode::OK);
    let file: Value = response.json().await.unwrap();
    assert_eq!(file["object"], "file");
    assert_eq!(file["purpose"], "batch");
    let response = server
        .post(
            "/v1/batches",
            json!({
                "input_file_id": file["id"],
                "endpoint": "/v1/chat/completions",
                "completion_window": "24h",
                "metadata": metadata,
            }),
        )
        .await;
    assert_eq!(response.status(), StatusCode::OK);
    let batch: Value = response.json().await.unwrap();
    assert_eq!(batch["object"], "batch");
    assert_eq!(batch["input_file_id"], file["id"]);
    assert_eq!(batch["metadata"], metadata);
    batch
}

async fn file_lines(server: &Server, id: &Value) -> Vec<Value> {
    let id = id.as_str().unwrap_or_else(|| panic!("no file id: {id}"));
    let response = reqwest::get(server.url(&format!("/v1/files/{id}/content")))
        .await
        .unwrap();
    assert_eq!(response.status(), StatusCode::OK);
    lines(&response.text().await.unwrap())
}

fn by_custom_id<'a>(lines: &'a [Value], custom_id: &str) -> &'a Value {
    lines
        .iter()
        .find(|line| line["custom_id"] == custom_id)
        .unwrap_or_else(|| panic!("no {custom_id} in {lines:?}"))
}

fn ended(batch: &Value) -> bool {
    !matches!(batch["status"].as_str(), Some("validating" | "in_progress"))
}

#[tokio::test]
async fn an_openai_batch_ends_after_the_delay_with_each_request_as_a_single_call() {
    let server = start().await;
    let metadata = json!({ "jobledger_batch": "b-1" });
    let batch = create_batch(
        &server,
        &[
            ("ok", "Summarise the quarter"),
            ("refused", "[mock:status=500] this one fails"),
            ("late", "[mock:batch_expire] this one expires once"),
        ],
        metadata.clone(),
    )
    .await;
    assert_eq!(batch["status"], "validating");
    let id = batch["id"].as_str().unwrap().to_owned();
    let path = format!("/v1/batches/{id}");

    let running = get_json(&server, &path).await;
    assert_eq!(running["status"], "in_progress", "{running}");
    assert_eq!(
        running["request_counts"],
        json!({ "total": 3, "completed": 0, "failed": 0 })
    );
    assert!(running["output_file_id"].is_null());
    assert!(
        calls_of(&server.sim.calls(), &id).is_empty(),
        "nothing runs before the end"
    );

    let done = poll(&server, &path, ended).await;
    let took = chrono::Utc::now().timestamp() - done["created_at"].as_i64().unwrap();
    assert!((0..=3).contains(&took), "{done}");
    // One request expired: the batch reads expired, as OpenAI's does.
    assert_eq!(done["status"], "expired", "{done}");
    assert_eq!(
        done["request_counts"],
        json!({ "total": 3, "completed": 1, "failed": 2 })
    );
    assert!(done["expired_at"].is_i64() && done["completed_at"].is_null());

    // The succeeded request answers what a single call of the same content does.
    let single: Value = server
        .openai(chat("Summarise the quarter"))
        .await
        .json()
        .await
        .unwrap();
    let output = file_lines(&server, &done["output_file_id"]).await;
    assert_eq!(output.len(), 1);
    let ok = by_custom_id(&output, "ok");
    assert_eq!(ok["response"]["status_code"], 200);
    assert!(ok["error"].is_null());
    let body = &ok["response"]["body"];
    assert_eq!(body["object"], "chat.completion");
    assert_eq!(body["choices"], single["choices"]);
    assert_eq!(body["usage"], single["usage"]);
    assert_eq!(ok["response"]["request_id"], body["id"]);

    let errors = file_lines(&server, &done["error_file_id"]).await;
    assert_eq!(errors.len(), 2);
    let refused = by_custom_id(&errors, "refused");
    assert_eq!(refused["response"]["status_code"], 500);
    assert_eq!(refused["response"]["body"]["error"]["type"], "server_error");
    let late = by_custom_id(&errors, "late");
    assert!(late["response"].is_null());
    assert_eq!(late["error"]["code"], "batch_expired");

    // The call log: the processed requests, with the batch's id; the expired one is absent.
    let calls = server.sim.calls();
    let logged = calls_of(&calls, &id);
    assert_eq!(logged.len(), 2, "{logged:?}");
    let ok_call = logged
        .iter()
        .find(|call| call.request_id == body["id"])
        .unwrap();
    assert_eq!((ok_call.status, ok_call.billed), (200, true));
    assert_eq!(ok_call.input_tokens, single["usage"]["prompt_tokens"]);
    assert_eq!(ok_call.output_tokens, single["usage"]["completion_tokens"]);
    let refused_call = logged.iter().find(|call| call.status == 500).unwrap();
    assert!(!refused_call.billed);
    assert_eq!(refused_call.output_tokens, 0);
    assert_eq!(
        refused_call.request_id,
        refused["response"]["request_id"].as_str().unwrap()
    );
    // The single call made above is no batch's.
    assert!(calls.iter().any(|call| call.batch_id.is_none()));
    let listed = server.listed_calls().await;
    assert_eq!(listed, server.sim.calls());
    let raw: Value = reqwest::get(server.url("/_mock/calls"))
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert!(
        raw.as_array()
            .unwrap()
            .iter()
            .all(|call| call.get("batch_id").is_some())
    );

    // The expired content goes through in the next batch.
    let again = create_batch(
        &server,
        &[("late", "[mock:batch_expire] this one expires once")],
        json!({}),
    )
    .await;
    let again_id = again["id"].as_str().unwrap().to_owned();
    let again = poll(&server, &format!("/v1/batches/{again_id}"), ended).await;
    assert_eq!(again["status"], "completed", "{again}");
    assert!(again["error_file_id"].is_null());
    let output = file_lines(&server, &again["output_file_id"]).await;
    assert_eq!(
        by_custom_id(&output, "late")["response"]["status_code"],
        200
    );
    let logged = calls_of(&server.sim.calls(), &again_id).len();
    assert_eq!(logged, 1);

    let listed = mock_batch(&server, &id).await;
    assert_eq!(listed["provider"], "openai");
    assert_eq!(listed["requests"], 3);
    assert_eq!(listed["status"], "expired");
    assert_eq!(listed["metadata"], metadata);
    assert!(listed["created_at"].is_string());
    assert_eq!(mock_batch(&server, &again_id).await["status"], "completed");
}

#[tokio::test]
async fn a_cancelled_openai_batch_processes_nothing() {
    let server = start().await;
    let batch = create_batch(&server, &[("a", "one"), ("b", "two")], json!({})).await;
    let id = batch["id"].as_str().unwrap().to_owned();
    let response = server
        .post(&format!("/v1/batches/{id}/cancel"), json!({}))
        .await;
    assert_eq!(response.status(), StatusCode::OK);
    let cancelling: Value = response.json().await.unwrap();
    assert_eq!(cancelling["status"], "cancelling");
    assert!(cancelling["cancelling_at"].is_i64());

    // Past the delay it stays cancelled, with nothing processed or billed.
    tokio::time::sleep(DELAY * 2).await;
    let cancelled = get_json(&server, &format!("/v1/batches/{id}")).await;
    assert_eq!(cancelled["status"], "cancelled", "{cancelled}");
    assert!(cancelled["cancelled_at"].is_i64());
    assert_eq!(
        cancelled["request_counts"],
        json!({ "total": 2, "completed": 0, "failed": 2 })
    );
    assert!(cancelled["output_file_id"].is_null());
    let errors = file_lines(&server, &cancelled["error_file_id"]).await;
    assert_eq!(errors.len(), 2);
    assert!(
        errors
            .iter()
            .all(|line| line["error"]["code"] == "batch_cancelled")
    );
    assert!(calls_of(&server.sim.calls(), &id).is_empty());
    assert_eq!(mock_batch(&server, &id).await["status"], "cancelled");

    // An ended batch cannot be cancelled again.
    let again = server
        .post(&format!("/v1/batches/{id}/cancel"), json!({}))
        .await;
    assert_eq!(again.status(), StatusCode::CONFLICT);
}

#[tokio::test]
async fn openai_batches_list_newest_first_in_pages() {
    let server = start().await;
    let mut ids = Vec::new();
    for n in 0..3 {
        let batch = create_batch(&server, &[("a", &format!("batch {n}"))], json!({ "n": n })).await;
        ids.push(batch["id"].as_str().unwrap().to_owned());
    }
    let first = get_json(&server, "/v1/batches?limit=2").await;
    assert_eq!(first["object"], "list");
    let page: Vec<&str> = first["data"]
        .as_array()
        .unwrap()
        .iter()
        .map(|b| b["id"].as_str().unwrap())
        .collect();
    assert_eq!(page, [ids[2].as_str(), ids[1].as_str()]);
    assert_eq!(first["has_more"], true);
    assert_eq!(first["last_id"], ids[1]);
    let next = get_json(&server, &format!("/v1/batches?limit=2&after={}", ids[1])).await;
    let page: Vec<&str> = next["data"]
        .as_array()
        .unwrap()
        .iter()
        .map(|b| b["id"].as_str().unwrap())
        .collect();
    assert_eq!(page, [ids[0].as_str()]);
    assert_eq!(next["has_more"], false);
    let all = get_json(&server, "/v1/batches").await;
    assert_eq!(all["data"].as_array().unwrap().len(), 3);
}

#[tokio::test]
async fn oversize_and_invalid_openai_input_is_refused_whole() {
    let server = start().await;
    // One request over OpenAI's 50,000.
    let line = input_line("x", "hi");
    let file: Vec<String> = (0..50_001)
        .map(|n| line.replacen("\"x\"", &format!("\"r{n}\""), 1))
        .collect();
    let response = upload_raw(&server, file.join("\n").as_bytes()).await;
    assert_eq!(response.status(), StatusCode::BAD_REQUEST);
    let body: Value = response.json().await.unwrap();
    assert!(
        body["error"]["message"].as_str().unwrap().contains("50000"),
        "{body}"
    );
    // Exactly 50,000 is taken.
    let response = upload_raw(&server, file[..50_000].join("\n").as_bytes()).await;
    assert_eq!(response.status(), StatusCode::OK);

    // Over the bytes bound: 413, before the file is held whole.
    let big = vec![b' '; 64 * 1024 * 1024 + 1];
    let response = upload_raw(&server, &big).await;
    assert_eq!(response.status(), StatusCode::PAYLOAD_TOO_LARGE);

    // A duplicate custom_id or a body /v1/chat/completions would refuse.
    let twice = [input_line("same", "a"), input_line("same", "b")].join("\n");
    let response = upload_raw(&server, twice.as_bytes()).await;
    assert_eq!(response.status(), StatusCode::BAD_REQUEST);
    let no_messages = json!({ "custom_id": "a", "method": "POST", "url": "/v1/chat/completions",
        "body": { "model": "gpt-test" } })
    .to_string();
    let response = upload_raw(&server, no_messages.as_bytes()).await;
    assert_eq!(response.status(), StatusCode::BAD_REQUEST);
    let listed = get_json(&server, "/_mock/batches").await;
    assert_eq!(listed, json!([]));
}
