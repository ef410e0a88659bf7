//! The simulator's batch APIs over real HTTP: each provider's shapes, the
//! delay, per-request directives, cancel, lists, the call log and the bounds.

mod anthropic;
mod openai;

use std::time::{Duration, Instant};

use jobledger::llm::simulator::{CallRecord, Simulator};
use serde_json::Value;

use super::Server;

/// Long enough to see a batch in progress, short enough for a test.
const DELAY: Duration = Duration::from_millis(400);

async fn start() -> Server {
    Server::start_with(Simulator::new().with_batch_delay(DELAY)).await
}

async fn get_json(server: &Server, path: &str) -> Value {
    let response = reqwest::get(server.url(path)).await.unwrap();
    assert!(
        response.status().is_success(),
        "GET {path}: {}",
        response.status()
    );
    response.json().await.unwrap()
}

/// Polls `path` until `done` holds of its JSON (bounded: 5 s).
async fn poll(server: &Server, path: &str, done: impl Fn(&Value) -> bool) -> Value {
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        let value = get_json(server, path).await;
        if done(&value) {
            return value;
        }
        assert!(Instant::now() < deadline, "{path} never got there: {value}");
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
}

/// JSON lines.
fn lines(text: &str) -> Vec<Value> {
    text.lines()
        .filter(|line| !line.trim().is_empty())
        .map(|line| serde_json::from_str(line).unwrap())
        .collect()
}

/// The call log entries of one batch.
fn calls_of<'a>(calls: &'a [CallRecord], batch_id: &str) -> Vec<&'a CallRecord> {
    calls
        .iter()
        .filter(|call| call.batch_id.as_deref() == Some(batch_id))
        .collect()
}

/// The `GET /_mock/batches` entry of `id`.
async fn mock_batch(server: &Server, id: &str) -> Value {
    let listed = get_json(server, "/_mock/batches").await;
    listed
        .as_array()
        .unwrap()
        .iter()
        .find(|batch| batch["id"] == id)
        .unwrap_or_else(|| panic!("{id} not in {listed}"))
        .clone()
}

/// `jobledger mock-llm --batch-delay-ms N`: the served simulator's batches end N ms after
/// their creation, well before the 1 s default.
#[tokio::test]
async fn mock_llm_takes_the_batch_delay_from_its_flag() {
    let address = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap();
    let _mock = tokio::process::Command::new(env!("CARGO_BIN_EXE_jobledger"))
        .args([
            "mock-llm",
            "--listen",
            &address.to_string(),
            "--batch-delay-ms",
            "150",
        ])
        .env("RUST_LOG", "warn")
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    let base = format!("http://{address}");
    let client = reqwest::Client::new();
    let deadline = Instant::now() + Duration::from_secs(30);
    while client
        .get(format!("{base}/_mock/calls"))
        .send()
        .await
        .is_err()
    {
        assert!(Instant::now() < deadline, "mock-llm never answered");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let params = super::messages("hello");
    let created: Value = client
        .post(format!("{base}/v1/messages/batches"))
        .json(&serde_json::json!({ "requests": [{ "custom_id": "a", "params": params }] }))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let id = created["id"].as_str().unwrap();
    let ended = loop {
        let batch: Value = client
            .get(format!("{base}/v1/messages/batches/{id}"))
            .send()
            .await
            .unwrap()
            .json()
            .await
            .unwrap();
        if batch["processing_status"] == "ended" {
            break batch;
        }
        assert!(Instant::now() < deadline, "never ended: {batch}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    let at =
        |field: &str| chrono::DateTime::parse_from_rfc3339(ended[field].as_str().unwrap()).unwrap();
    let took = at("ended_at") - at("created_at");
    assert!(
        took >= chrono::Duration::milliseconds(145) && took < chrono::Duration::milliseconds(900),
        "{ended}"
    );
    let calls: Vec<CallRecord> = client
        .get(format!("{base}/_mock/calls"))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(calls_of(&calls, id).len(), 1);
}
