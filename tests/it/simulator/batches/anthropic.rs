//! Anthropic's Message Batches API.

use reqwest::StatusCode;
use serde_json::{Value, json};

use super::{DELAY, calls_of, get_json, lines, mock_batch, poll, start};
use crate::simulator::{Server, messages};

fn batch_body(requests: &[(&str, &str)]) -> Value {
    let requests: Vec<Value> = requests
        .iter()
        .map(|(id, content)| json!({ "custom_id": id, "params": messages(content) }))
        .collect();
    json!({ "requests": requests })
}

async fn create_batch(server: &Server, requests: &[(&str, &str)]) -> Value {
    let response = server
        .post("/v1/messages/batches", batch_body(requests))
        .await;
    assert_eq!(response.status(), StatusCode::OK);
    let batch: Value = response.json().await.unwrap();
    assert_eq!(batch["type"], "message_batch");
    batch
}

async fn results(server: &Server, batch: &Value) -> Vec<Value> {
    let url = batch["results_url"]
        .as_str()
        .unwrap_or_else(|| panic!("{batch}"));
    let response = reqwest::get(url).await.unwrap();
    assert_eq!(response.status(), StatusCode::OK);
    let id = batch["id"].as_str().unwrap();
    assert!(
        url.starts_with(&server.base)
            && url.ends_with(&format!("/v1/messages/batches/{id}/results"))
    );
    lines(&response.text().await.unwrap())
}

fn by_custom_id<'a>(lines: &'a [Value], custom_id: &str) -> &'a Value {
    lines
        .iter()
        .find(|line| line["custom_id"] == custom_id)
        .unwrap_or_else(|| panic!("no {custom_id} in {lines:?}"))
}

fn ended(batch: &Value) -> bool {
    batch["processing_status"] == "ended"
}

#[tokio::test]
async fn an_anthropic_batch_ends_after_the_delay_with_each_request_as_a_single_call() {
    let server = start().await;
    let batch = create_batch(
        &server,
        &[
            ("ok", "Summarise the quarter"),
            ("refused", "[mock:status=429] this one fails"),
            ("late", "[mock:batch_expire] this one expires once"),
        ],
    )
    .await;
    assert_eq!(batch["processing_status"], "in_progress");
    assert_eq!(batch["request_counts"]["processing"], 3);
    assert!(batch["results_url"].is_null());
    let id = batch["id"].as_str().unwrap().to_owned();
    assert!(id.starts_with("msgbatch_"));
    let path = format!("/v1/messages/batches/{id}");
    let early = reqwest::get(server.url(&format!("{path}/results")))
        .await
        .unwrap();
    assert_eq!(early.status(), StatusCode::BAD_REQUEST);
    assert!(
        calls_of(&server.sim.calls(), &id).is_empty(),
        "nothing runs before the end"
    );

    let done = poll(&server, &path, ended).await;
    assert_eq!(
        done["request_counts"],
        json!({ "processing": 0, "succeeded": 1, "errored": 1, "canceled": 0, "expired": 1 })
    );
    assert!(done["ended_at"].is_string());
    let created =
        chrono::DateTime::parse_from_rfc3339(done["created_at"].as_str().unwrap()).unwrap();
    let ended_at =
        chrono::DateTime::parse_from_rfc3339(done["ended_at"].as_str().unwrap()).unwrap();
    assert!(
        ended_at - created
            >= chrono::Duration::from_std(DELAY).unwrap() - chrono::Duration::milliseconds(5)
    );

    let single: Value = server
        .anthropic(messages("Summarise the quarter"))
        .await
        .json()
        .await
        .unwrap();
    let results = results(&server, &done).await;
    assert_eq!(results.len(), 3);
    let ok = &by_custom_id(&results, "ok")["result"];
    assert_eq!(ok["type"], "succeeded");
    assert_eq!(ok["message"]["content"], single["content"]);
    assert_eq!(ok["message"]["usage"], single["usage"]);
    let refused = &by_custom_id(&results, "refused")["result"];
    assert_eq!(refused["type"], "errored");
    assert_eq!(refused["error"]["type"], "error");
    assert_eq!(refused["error"]["error"]["type"], "rate_limit_error");
    assert_eq!(
        by_custom_id(&results, "late")["result"],
        json!({ "type": "expired" })
    );

    let calls = server.sim.calls();
    let logged = calls_of(&calls, &id);
    assert_eq!(logged.len(), 2, "{logged:?}");
    let ok_call = logged
        .iter()
        .find(|call| call.request_id == ok["message"]["id"])
        .unwrap();
    assert_eq!((ok_call.status, ok_call.billed), (200, true));
    assert_eq!(ok_call.input_tokens, single["usage"]["input_tokens"]);
    assert_eq!(ok_call.output_tokens, single["usage"]["output_tokens"]);
    assert_eq!(ok_call.model, "claude-test");
    assert_eq!(
        ok_call.request["messages"][0]["content"],
        "Summarise the quarter"
    );
    let refused_call = logged.iter().find(|call| call.status == 429).unwrap();
    assert!(!refused_call.billed);

    // Expired once: the next batch processes the same content.
    let again = create_batch(
        &server,
        &[("late", "[mock:batch_expire] this one expires once")],
    )
    .await;
    let again_id = again["id"].as_str().unwrap().to_owned();
    let again = poll(&server, &format!("/v1/messages/batches/{again_id}"), ended).await;
    assert_eq!(again["request_counts"]["succeeded"], 1, "{again}");
    let results = super::anthropic::results(&server, &again).await;
    assert_eq!(
        by_custom_id(&results, "late")["result"]["type"],
        "succeeded"
    );
    assert_eq!(calls_of(&server.sim.calls(), &again_id).len(), 1);

    let listed = mock_batch(&server, &id).await;
    assert_eq!(listed["provider"], "anthropic");
    assert_eq!(listed["requests"], 3);
    assert_eq!(listed["status"], "ended");
    assert!(listed["metadata"].is_null());
}

#[tokio::test]
async fn a_cancelled_anthropic_batch_processes_nothing() {
    let server = start().await;
    let batch = create_batch(&server, &[("a", "one"), ("b", "two")]).await;
    let id = batch["id"].as_str().unwrap().to_owned();
    let response = server
        .post(&format!("/v1/messages/batches/{id}/cancel"), json!({}))
        .await;
    assert_eq!(response.status(), StatusCode::OK);
    let canceling: Value = response.json().await.unwrap();
    assert_eq!(canceling["processing_status"], "canceling");
    assert!(canceling["cancel_initiated_at"].is_string());

    tokio::time::sleep(DELAY * 2).await;
    let ended = get_json(&server, &format!("/v1/messages/batches/{id}")).await;
    assert_eq!(ended["processing_status"], "ended", "{ended}");
    assert_eq!(
        ended["request_counts"],
        json!({ "processing": 0, "succeeded": 0, "errored": 0, "canceled": 2, "expired": 0 })
    );
    let results = results(&server, &ended).await;
    assert!(
        results
            .iter()
            .all(|line| line["result"] == json!({ "type": "canceled" }))
    );
    assert!(calls_of(&server.sim.calls(), &id).is_empty());
    assert_eq!(mock_batch(&server, &id).await["status"], "ended");
}

#[tokio::test]
async fn anthropic_batches_list_newest_first_in_pages() {
    let server = start().await;
    let mut ids = Vec::new();
    for n in 0..3 {
        let batch = create_batch(&server, &[("a", &format!("batch {n}"))]).await;
        ids.push(batch["id"].as_str().unwrap().to_owned());
    }
    let ids_of = |list: &Value| -> Vec<String> {
        list["data"]
            .as_array()
            .unwrap()
            .iter()
            .map(|b| b["id"].as_str().unwrap().to_owned())
            .collect()
    };
    let first = get_json(&server, "/v1/messages/batches?limit=2").await;
    assert_eq!(ids_of(&first), [ids[2].clone(), ids[1].clone()]);
    assert_eq!(first["has_more"], true);
    assert_eq!(first["first_id"], ids[2]);
    let next = get_json(
        &server,
        &format!("/v1/messages/batches?limit=2&after_id={}", ids[1]),
    )
    .await;
    assert_eq!(ids_of(&next), [ids[0].clone()]);
    assert_eq!(next["has_more"], false);
    let back = get_json(
        &server,
        &format!("/v1/messages/batches?limit=1&before_id={}", ids[1]),
    )
    .await;
    assert_eq!(ids_of(&back), [ids[2].clone()]);
    // The OpenAI list holds none of them.
    let openai = get_json(&server, "/v1/batches").await;
    assert_eq!(openai["data"], json!([]));
}

#[tokio::test]
async fn oversize_and_invalid_anthropic_batches_are_refused_whole() {
    let server = start().await;
    // One request over Anthropic's 100,000.
    let requests: Vec<Value> = (0..100_001)
        .map(|n| json!({ "custom_id": format!("r{n}"), "params": { "model": "m", "max_tokens": 1, "messages": [{ "role": "user", "content": "x" }] } }))
        .collect();
    let response = server
        .post("/v1/messages/batches", json!({ "requests": requests }))
        .await;
    assert_eq!(response.status(), StatusCode::BAD_REQUEST);
    let body: Value = response.json().await.unwrap();
    assert_eq!(body["type"], "error");
    assert!(
        body["error"]["message"]
            .as_str()
            .unwrap()
            .contains("100000"),
        "{body}"
    );

    // Over the bytes bound: 413 in Anthropic's shape.
    let big = vec![b' '; 64 * 1024 * 1024 + 1];
    let response = reqwest::Client::new()
        .post(server.url("/v1/messages/batches"))
        .header("content-type", "application/json")
        .body(big)
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), StatusCode::PAYLOAD_TOO_LARGE);
    let body: Value = response.json().await.unwrap();
    assert_eq!(body["error"]["type"], "request_too_large");

    // A custom id Anthropic refuses, a duplicate, params /v1/messages refuses.
    for bad in [
        batch_body(&[("not ok!", "a")]),
        batch_body(&[("same", "a"), ("same", "b")]),
        json!({ "requests": [{ "custom_id": "a", "params": { "model": "m", "messages": [] } }] }),
        json!({ "requests": [] }),
    ] {
        let response = server.post("/v1/messages/batches", bad.clone()).await;
        assert_eq!(response.status(), StatusCode::BAD_REQUEST, "{bad}");
    }
    assert_eq!(get_json(&server, "/_mock/batches").await, json!([]));
}
