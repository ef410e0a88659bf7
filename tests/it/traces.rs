//! Traces: with an OTLP endpoint, a GraphQL operation and an attempt — with its
//! provider call and the provider's request id inside — arrive at the collector as
//! spans over OTLP/HTTP.

use crate::helpers::{Backend, job_input, spawn_app};
use axum::Router;
use axum::body::Bytes;
use axum::extract::State;
use axum::routing::post;
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tracing_subscriber::layer::SubscriberExt;

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

// One thread: the test's subscriber is the thread's default, and every task of the
// application runs on this thread.
#[tokio::test(flavor = "current_thread")]
async fn operations_and_attempts_arrive_at_the_collector_as_spans() {
    let collector = Collector::default();
    let address = collector.start().await;
    let provider = jobledger::telemetry::tracer_provider(&format!("http://{address}/")).unwrap();
    let subscriber = tracing_subscriber::registry()
        .with(jobledger::telemetry::traces_layer(&provider))
        .with(jobledger::telemetry::default_filter());
    let _default = tracing::subscriber::set_default(subscriber);

    let app = spawn_app(Backend::Sqlite).await;
    let tenant = app.funded_tenant("traced", "10").await;
    let id = app
        .create_job_ok(&tenant, job_input("traced", "hello"))
        .await;
    app.wait_until_finished(&tenant, id, Duration::from_secs(20))
        .await;
    let request_id = app.simulator.calls()[0].request_id.clone();
    // The attempt's span ends just after the job's status is written: flush until it
    // is there. The exporter blocks its caller until the collector answered: not on
    // this thread, which serves the collector.
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    loop {
        let flush = provider.clone();
        tokio::task::spawn_blocking(move || flush.force_flush())
            .await
            .unwrap()
            .unwrap();
        if contains(&collector.received(), "attempt.number") || std::time::Instant::now() > deadline
        {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }

    let received = collector.received();
    for expected in [
        "jobledger",
        "graphql CreateJob",
        "attempt",
        "provider call",
        "provider.request_id",
        &request_id,
        "job.id",
        &id.to_string(),
        "tenant.id",
        &tenant.id.to_string(),
        "attempt.number",
        "gpt-4o-mini",
    ] {
        assert!(
            contains(&received, expected),
            "no {expected:?} in the exported spans"
        );
    }
    drop(app);
    tokio::task::spawn_blocking(move || provider.shutdown())
        .await
        .unwrap()
        .unwrap();
}
