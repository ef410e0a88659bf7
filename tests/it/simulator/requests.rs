//! Requests the simulator refuses, and the log of the calls it served.

use super::{Server, chat, header, messages};

use jobledger::llm::simulator::CallRecord;
use reqwest::StatusCode;
use serde_json::{Value, json};

#[tokio::test]
async fn bad_requests_get_provider_shaped_400s() {
    let server = Server::start().await;
    let client = reqwest::Client::new();
    let response = client
        .post(server.url("/v1/chat/completions"))
        .header("content-type", "application/json")
        .body("{not json")
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), StatusCode::BAD_REQUEST);
    assert!(header(&response, "x-request-id").is_some());
    let body: Value = response.json().await.unwrap();
    assert_eq!(body["error"]["type"], "invalid_request_error");
    assert!(body["error"]["message"].is_string());

    // Valid JSON, but Anthropic requires max_tokens.
    let response = server
        .anthropic(json!({ "model": "claude-test", "messages": [] }))
        .await;
    assert_eq!(response.status(), StatusCode::BAD_REQUEST);
    let body: Value = response.json().await.unwrap();
    assert_eq!(body["type"], "error");
    assert_eq!(body["error"]["type"], "invalid_request_error");

    let calls = server.sim.calls();
    assert_eq!(calls.len(), 2);
    assert_eq!((calls[0].model.as_str(), calls[0].status), ("", 400));
    assert_eq!(
        (calls[1].model.as_str(), calls[1].status),
        ("claude-test", 400)
    );
    assert!(calls.iter().all(|call| !call.billed));
}

#[tokio::test]
async fn calls_endpoint_lists_in_order_and_delete_clears() {
    let server = Server::start().await;
    let first = server.openai(chat("one")).await;
    let first_id = header(&first, "x-request-id").unwrap().to_owned();
    let second = server.anthropic(messages("[mock:status=401] two")).await;
    let second_id = header(&second, "request-id").unwrap().to_owned();
    assert_ne!(first_id, second_id);

    let response = reqwest::get(server.url("/_mock/calls")).await.unwrap();
    assert_eq!(response.status(), StatusCode::OK);
    let raw: Value = response.json().await.unwrap();
    // A single call is no batch's.
    assert!(raw[0]["batch_id"].is_null());
    let fields: Vec<&String> = raw[0].as_object().unwrap().keys().collect();
    assert_eq!(
        fields,
        [
            "batch_id",
            "billed",
            "input_tokens",
            "model",
            "output_tokens",
            "received_at",
            "request",
            "request_id",
            "status"
        ]
    );
    let listed: Vec<CallRecord> = serde_json::from_value(raw).unwrap();
    assert_eq!(listed, server.sim.calls());
    assert_eq!(listed.len(), 2);
    assert_eq!(listed[0].request_id, first_id);
    assert_eq!(listed[1].request_id, second_id);
    assert_eq!(
        (listed[1].model.as_str(), listed[1].status),
        ("claude-test", 401)
    );
    assert!(listed[0].received_at <= listed[1].received_at);

    assert_eq!(server.clear_calls().await, StatusCode::NO_CONTENT);
    let listed: Vec<CallRecord> = server.listed_calls().await;
    assert!(listed.is_empty());
    assert!(server.sim.calls().is_empty());
}

/// Each call lists the body the simulator received, so that a test can check what a
/// client sent — parameters and tools included; a body that is not JSON is `null`,
/// and a very large one is not kept whole.
#[tokio::test]
async fn each_call_lists_the_request_as_received() {
    let server = Server::start().await;
    let mut sent = chat("with parameters");
    sent["temperature"] = json!(0.25);
    sent["tools"] = json!([{"type": "function", "function": {"name": "lookup", "parameters": {"type": "object"}}}]);
    server.openai(sent.clone()).await;
    let anthropic = messages("plain");
    server.anthropic(anthropic.clone()).await;
    reqwest::Client::new()
        .post(server.url("/v1/chat/completions"))
        .header("content-type", "application/json")
        .body("{not json")
        .send()
        .await
        .unwrap();
    let mut large = chat(&"x".repeat(100 * 1024));
    large["model"] = json!("large");
    let large_bytes = serde_json::to_vec(&large).unwrap().len();
    server.openai(large).await;
    let raw: Value = reqwest::get(server.url("/_mock/calls"))
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(raw[0]["request"], sent);
    assert_eq!(raw[1]["request"], anthropic);
    assert_eq!(raw[2]["request"], Value::Null);
    assert_eq!(raw[3]["request"], json!({"omittedBytes": large_bytes}));
}
