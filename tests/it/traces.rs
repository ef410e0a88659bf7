//! Traces: with `OTEL_EXPORTER_OTLP_ENDPOINT` set, a GraphQL operation and an attempt
//! — with its provider call and the provider's request id inside — arrive at the
//! collector as spans over OTLP/HTTP. The test runs the real binary: the tracing
//! subscriber is global to a process.

use crate::helpers::{ADMIN_TOKEN, job_input};
use axum::Router;
use axum::body::Bytes;
use axum::extract::State;
use axum::routing::post;
use serde_json::{Value, json};
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// A collector that keeps the body of every export it receives.
#[derive(Clone, Default)]
struct Collector {
    exports: Arc<Mutex<Vec<Bytes>>>,
}

impl Collector {
    async fn start(&self) -> std::net::SocketAddr {
        async fn receive(State(collector): State<Collector>, body: Bytes) -> &'static str {
            collector.exports.lock().unwrap().push(body);
            ""
        }
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let address = listener.local_addr().unwrap();
        let router = Router::new()
            .route("/v1/traces", post(receive))
            .with_state(self.clone());
        tokio::spawn(async move { axum::serve(listener, router).await });
        address
    }

    /// Everything received, as bytes (protobuf keeps strings as they are).
    fn received(&self) -> Vec<u8> {
        self.exports.lock().unwrap().concat()
    }
}

fn contains(haystack: &[u8], needle: &str) -> bool {
    haystack
        .windows(needle.len())
        .any(|window| window == needle.as_bytes())
}

/// Sends one contract operation to the process at `address`; returns `data`.
async fn operation(address: SocketAddr, key: &str, name: &str, variables: Value) -> Value {
    let response: Value = reqwest::Client::new()
        .post(format!("http://{address}/graphql"))
        .bearer_auth(key)
        .json(&json!({"query": crate::contract::operation(name), "variables": variables}))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert!(response["errors"].is_null(), "{name}: {response}");
    response["data"].clone()
}

/// A real `jobledger serve` with `OTEL_EXPORTER_OTLP_ENDPOINT` pointing at a collector
/// stub: its operations and attempts arrive there as spans once it stops, and its log
/// lines inside an attempt carry the trace id.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn operations_and_attempts_arrive_at_the_collector_as_spans() {
    let collector = Collector::default();
    let collector_address = collector.start().await;
    let folder = tempfile::tempdir().unwrap();
    let address = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap();
    let child = tokio::process::Command::new(env!("CARGO_BIN_EXE_jobledger"))
        .args(["serve", "--listen", &address.to_string(), "--database-url"])
        .arg(format!(
            "sqlite:{}",
            folder.path().join("traced.db").display()
        ))
        .env("JOBLEDGER_ADMIN_TOKEN", ADMIN_TOKEN)
        .env(
            "OTEL_EXPORTER_OTLP_ENDPOINT",
            format!("http://{collector_address}"),
        )
        .env("RUST_LOG", "info")
        .env_remove("JOBLEDGER_LOG_FORMAT")
        .stderr(std::process::Stdio::piped())
        .stdout(std::process::Stdio::null())
        .kill_on_drop(true)
        .spawn()
        .expect("the binary runs");
    let deadline = Instant::now() + Duration::from_secs(30);
    while reqwest::get(format!("http://{address}/healthz"))
        .await
        .is_err()
    {
        assert!(Instant::now() < deadline, "serve never answered");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let created = operation(
        address,
        ADMIN_TOKEN,
        "CreateTenant",
        json!({"name": "traced"}),
    )
    .await;
    let tenant_id = created["createTenant"]["tenant"]["id"]
        .as_str()
        .unwrap()
        .to_owned();
    let key = created["createTenant"]["apiKey"]
        .as_str()
        .unwrap()
        .to_owned();
    operation(
        address,
        ADMIN_TOKEN,
        "GrantCredits",
        json!({"input": {"tenantId": tenant_id, "amount": "5", "idempotencyKey": "grant"}}),
    )
    .await;
    let job = operation(
        address,
        &key,
        "CreateJob",
        json!({"input": job_input("traced", "hello")}),
    )
    .await;
    let job_id = job["createJob"]["job"]["id"].as_str().unwrap().to_owned();
    let request_id = loop {
        let job = operation(address, &key, "Job", json!({"id": job_id})).await;
        if job["job"]["status"] == "SUCCEEDED" {
            break job["job"]["attempts"][0]["providerRequestId"]
                .as_str()
                .unwrap()
                .to_owned();
        }
        assert!(Instant::now() < deadline, "the job never finished: {job}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    // SIGTERM: a graceful stop sends the spans still batched.
    let pid = child.id().unwrap().to_string();
    let killed = std::process::Command::new("kill")
        .args(["-TERM", &pid])
        .status()
        .unwrap();
    assert!(killed.success());
    let output = tokio::time::timeout(Duration::from_secs(30), child.wait_with_output())
        .await
        .expect("serve stops within 30 s")
        .unwrap();
    assert!(output.status.success(), "serve failed: {output:?}");

    let received = collector.received();
    for expected in [
        "jobledger",
        "graphql CreateJob",
        "attempt",
        "provider call",
        "provider.request_id",
        &request_id,
        "job.id",
        &job_id,
        "tenant.id",
        &tenant_id,
        "attempt.number",
        "gpt-4o-mini",
    ] {
        assert!(
            contains(&received, expected),
            "no {expected:?} in the exported spans"
        );
    }
    let logs = String::from_utf8_lossy(&output.stderr);
    let started = logs
        .lines()
        .find(|line| line.contains("attempt finished"))
        .unwrap_or_else(|| panic!("no attempt log line in:\n{logs}"));
    // The span's fields lead the line (between colour codes when the log is text).
    assert!(
        started.contains("trace_id") && started.contains(&job_id),
        "{started}"
    );
}
