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
