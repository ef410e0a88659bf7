//! End-to-end tests of the provider simulator over real HTTP.

mod batches;
mod faults;
mod requests;
mod streams;
mod structured;
mod usage;

use std::time::{Duration, Instant};

use jobledger::llm::simulator::{CallRecord, Simulator};
use reqwest::StatusCode;
use serde_json::{Value, json};
use tokio::net::TcpListener;
use tokio::sync::oneshot;
use tokio::task::JoinHandle;

struct Server {
    base: String,
    addr: std::net::SocketAddr,
    sim: Simulator,
    stop: Option<oneshot::Sender<()>>,
    task: JoinHandle<std::io::Result<()>>,
}

impl Server {
    async fn start() -> Self {
        Self::start_with(Simulator::new()).await
    }

    async fn start_with(sim: Simulator) -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let (stop, stopped) = oneshot::channel::<()>();
        let task = tokio::spawn(sim.clone().serve(listener, async move {
            let _ = stopped.await;
        }));
        Self {
            base: format!("http://{addr}"),
            addr,
            sim,
            stop: Some(stop),
            task,
        }
    }

    fn url(&self, path: &str) -> String {
        format!("{}{path}", self.base)
    }

    async fn post(&self, path: &str, body: Value) -> reqwest::Response {
        reqwest::Client::new()
            .post(self.url(path))
            .json(&body)
            .send()
            .await
            .unwrap()
    }

    async fn openai(&self, body: Value) -> reqwest::Response {
        self.post("/v1/chat/completions", body).await
    }

    async fn anthropic(&self, body: Value) -> reqwest::Response {
        self.post("/v1/messages", body).await
    }

    /// The call log as `GET /_mock/calls` lists it.
    async fn listed_calls(&self) -> Vec<CallRecord> {
        reqwest::get(self.url("/_mock/calls"))
            .await
            .unwrap()
            .json()
            .await
            .unwrap()
    }

    /// Clears the call log with `DELETE /_mock/calls`; the status it answered.
    async fn clear_calls(&self) -> StatusCode {
        reqwest::Client::new()
            .delete(self.url("/_mock/calls"))
            .send()
            .await
            .unwrap()
            .status()
    }

    async fn shutdown(mut self) -> std::io::Result<()> {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        tokio::time::timeout(Duration::from_secs(5), self.task)
            .await
            .expect("serve did not stop within 5 s")
            .unwrap()
    }
}

fn chat(content: &str) -> Value {
    json!({ "model": "gpt-test", "messages": [{ "role": "user", "content": content }] })
}

fn messages(content: &str) -> Value {
    json!({
        "model": "claude-test",
        "max_tokens": 1024,
        "messages": [{ "role": "user", "content": content }],
    })
}

fn ceil4(bytes: usize) -> u64 {
    bytes.div_ceil(4) as u64
}

/// Polls `check` against the call log until it holds (bounded: 5 s).
async fn wait_for_calls(sim: &Simulator, check: impl Fn(&[CallRecord]) -> bool) -> Vec<CallRecord> {
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        let calls = sim.calls();
        if check(&calls) {
            return calls;
        }
        assert!(
            Instant::now() < deadline,
            "call log never matched: {calls:?}"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// `(event name, data)` pairs of an SSE body.
fn parse_sse(body: &str) -> Vec<(Option<String>, String)> {
    body.split("\n\n")
        .filter(|block| !block.trim().is_empty())
        .map(|block| {
            let mut name = None;
            let mut data = Vec::new();
            for line in block.lines() {
                if let Some(value) = line.strip_prefix("event:") {
                    name = Some(value.trim().to_owned());
                } else if let Some(value) = line.strip_prefix("data:") {
                    data.push(value.strip_prefix(' ').unwrap_or(value));
                }
            }
            (name, data.join("\n"))
        })
        .collect()
}

fn header<'a>(response: &'a reqwest::Response, name: &str) -> Option<&'a str> {
    response
        .headers()
        .get(name)
        .and_then(|value| value.to_str().ok())
}
