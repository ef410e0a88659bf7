//! Subscriptions over WebSocket and SSE: `jobUpdates` replays from a sequence number, then
//! streams live events, completing after the terminal one; `accountJobUpdates` carries
//! every event of a tenant's jobs once, across processes; connections and tenants are
//! capped; a refused or revoked key closes the connection with 4403.

mod account_updates;
mod caps;
mod job_updates;
mod keys;
mod resume;
mod sse;

use crate::contract::operation;
use crate::helpers::{TestApp, TestTenant};
use crate::socket::{GraphqlSocket, Received};
use futures_util::StreamExt;
use serde_json::{Value, json};
use std::time::Duration;

const LIMIT: Duration = Duration::from_secs(20);

fn seqs_and_kinds(payloads: &[Value]) -> Vec<(i64, String)> {
    payloads
        .iter()
        .map(|payload| {
            assert!(payload["errors"].is_null(), "{payload}");
            let event = &payload["data"]["jobUpdates"];
            (
                event["seq"].as_i64().unwrap(),
                event["kind"].as_str().unwrap().to_owned(),
            )
        })
        .collect()
}

/// A second key of `tenant`, named `name`: its secret and its id.
async fn another_key(app: &TestApp, tenant: &TestTenant, name: &str) -> (String, String) {
    let created = app
        .operation(Some(&tenant.key), "CreateApiKey", json!({"name": name}))
        .await;
    let text = |value: &Value| value.as_str().unwrap().to_owned();
    (
        text(&created["data"]["createApiKey"]["apiKey"]),
        text(&created["data"]["createApiKey"]["key"]["id"]),
    )
}

/// The account stream of the contract, by operation name.
fn account_updates() -> String {
    operation("AccountJobUpdates")
}

/// The next `next` or `error` message for subscription `id`, skipping those of others.
async fn message_for(socket: &mut GraphqlSocket, id: &str) -> Value {
    loop {
        match socket.next(LIMIT).await {
            Received::Message(message) if message["id"] == id => return message,
            Received::Message(_) => {}
            other => panic!("the connection ended: {other:?}"),
        }
    }
}

/// Sends `body` to `/graphql/sse` and collects `(event, data)` pairs until `complete`.
async fn sse_events(app: &TestApp, key: Option<&str>, body: Value) -> Vec<(String, String)> {
    let mut request = app
        .http
        .post(format!("http://{}/graphql/sse", app.address))
        .header("accept", "text/event-stream")
        .json(&body);
    if let Some(key) = key {
        request = request.bearer_auth(key);
    }
    let response = request.send().await.unwrap();
    assert_eq!(response.status(), 200);
    assert!(
        response.headers()["content-type"]
            .to_str()
            .unwrap()
            .starts_with("text/event-stream")
    );
    let mut body = response.bytes_stream();
    let mut buffer = String::new();
    let mut events = Vec::new();
    let collect = async {
        while let Some(chunk) = body.next().await {
            buffer.push_str(std::str::from_utf8(&chunk.unwrap()).unwrap());
            while let Some(end) = buffer.find("\n\n") {
                let block: String = buffer.drain(..end + 2).collect();
                let mut event = None;
                let mut data = String::new();
                for line in block.lines() {
                    if let Some(name) = line.strip_prefix("event:") {
                        event = Some(name.trim().to_owned());
                    } else if let Some(text) = line.strip_prefix("data:") {
                        data.push_str(text.trim_start());
                    }
                }
                // Comments (keep-alives) carry no event.
                if let Some(event) = event {
                    let complete = event == "complete";
                    events.push((event, data));
                    if complete {
                        return;
                    }
                }
            }
        }
        panic!("the stream ended without `complete`: {events:?}");
    };
    tokio::time::timeout(LIMIT, collect)
        .await
        .expect("the stream completed in time");
    events
}
