//! The webhook dispatcher against hostile endpoints: one tenant's hanging endpoints
//! never delay another tenant's delivery, and deliveries never go through a proxy
//! named by the environment.

use crate::helpers::{
    AppOptions, Backend, TestApp, TestDatabase, TestTenant, job_input, spawn_app_with,
};
use crate::processes::ServeProcess;
use crate::webhooks::{Receiver, create_webhook};
use serde_json::{Value, json};
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};
use tokio::io::AsyncReadExt;

on_both_backends!(hanging_endpoints_of_other_tenants_do_not_delay_a_delivery);

/// A TCP server that accepts every connection and never answers, counting the
/// connections it accepted and those the other side closed.
#[derive(Clone, Default)]
struct HangingServer {
    accepted: Arc<AtomicUsize>,
    closed: Arc<AtomicUsize>,
}

impl HangingServer {
    /// Starts the server; returns it and its address.
    async fn start() -> (Self, std::net::SocketAddr) {
        let server = Self::default();
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let address = listener.local_addr().unwrap();
        let state = server.clone();
        tokio::spawn(async move {
            while let Ok((mut socket, _)) = listener.accept().await {
                state.accepted.fetch_add(1, Ordering::SeqCst);
                let closed = state.closed.clone();
                tokio::spawn(async move {
                    let mut buffer = [0_u8; 4096];
                    // Reads whatever comes and answers nothing, until the client gives up.
                    while matches!(socket.read(&mut buffer).await, Ok(read) if read > 0) {}
                    closed.fetch_add(1, Ordering::SeqCst);
                });
            }
        });
        (server, address)
    }
}

/// Queues one `job.cancelled` per endpoint of the tenant subscribed to it: a job
/// scheduled for later, cancelled at once (no provider call).
async fn cancel_a_job(app: &TestApp, tenant: &TestTenant, key: &str) {
    let mut later = job_input(key, "hello");
    later["runAt"] = json!((chrono::Utc::now() + chrono::Duration::hours(1)).to_rfc3339());
    let id = app.create_job_ok(tenant, later).await;
    let response = app
        .operation(Some(&tenant.key), "CancelJob", json!({"id": id}))
        .await;
    assert_eq!(
        response["data"]["cancelJob"]["status"], "CANCELLED",
        "{response}"
    );
}

async fn hanging_endpoints_of_other_tenants_do_not_delay_a_delivery(backend: Backend) {
    let (hanging, hanging_address) = HangingServer::start().await;
    let healthy = Receiver::start(0, 500).await;
    let app = spawn_app_with(backend, AppOptions::no_workers()).await;
    // Two tenants with as many hanging endpoints as a tenant may have: together more
    // than a process's shared slots.
    let mut noisy = Vec::new();
    for name in ["noisy-a", "noisy-b"] {
        let tenant = app.funded_tenant(name, "5").await;
        for endpoint in 0..16 {
            let url = format!("http://{hanging_address}/{name}/{endpoint}");
            let created = create_webhook(&app, &tenant, &url, json!(["JOB_CANCELLED"])).await;
            assert!(created["errors"].is_null(), "{created}");
        }
        noisy.push(tenant);
    }
    let quiet = app.funded_tenant("quiet", "5").await;
    let created = create_webhook(&app, &quiet, &healthy.url(), json!(["JOB_CANCELLED"])).await;
    assert!(created["errors"].is_null(), "{created}");

    for (index, tenant) in noisy.iter().enumerate() {
        cancel_a_job(&app, tenant, &format!("noisy-{index}")).await;
    }
    // The noisy tenants' endpoints hold what slots they may before the quiet
    // tenant's event exists.
    let deadline = Instant::now() + Duration::from_secs(10);
    while hanging.accepted.load(Ordering::SeqCst) < 8 {
        assert!(
            Instant::now() < deadline,
            "the hanging endpoints were never tried"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    cancel_a_job(&app, &quiet, "quiet").await;
    let received = healthy.wait_for(1, Duration::from_secs(30)).await;
    // Read as soon as it arrived: no hanging try has ended yet (each waits for the
    // 10 s timeout), so the quiet delivery did not wait for a slot to free up.
    let closed = hanging.closed.load(Ordering::SeqCst);
    let accepted = hanging.accepted.load(Ordering::SeqCst);
    assert_eq!(
        closed, 0,
        "a hanging try ended before the quiet tenant's delivery"
    );
    assert!(
        accepted <= 2 * 4,
        "at most 4 deliveries per tenant in flight: {accepted} hanging"
    );
    let body: Value = serde_json::from_str(&received[0].body).unwrap();
    assert_eq!(body["type"], "job.cancelled");
}

/// A `serve` whose environment names a proxy for every scheme still delivers
/// straight to the endpoint: the proxy would resolve the name again, past the
/// address check.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn deliveries_ignore_proxies_named_by_the_environment() {
    let (proxy, proxy_address) = HangingServer::start().await;
    let receiver = Receiver::start(0, 500).await;
    let database = TestDatabase::create(&Backend::Sqlite).await;
    let proxy_url = format!("http://{proxy_address}");
    let serve = ServeProcess::start_with(
        &database.url,
        &["--allow-private-webhooks"],
        &[
            ("HTTP_PROXY", &proxy_url),
            ("HTTPS_PROXY", &proxy_url),
            ("ALL_PROXY", &proxy_url),
            ("http_proxy", &proxy_url),
            ("https_proxy", &proxy_url),
            ("all_proxy", &proxy_url),
        ],
    )
    .await;
    let (_, key) = serve.funded_tenant("5").await;
    let webhook = serve
        .graphql(
            &key,
            "mutation($input: CreateWebhookInput!) { createWebhook(input: $input) { secret } }",
            json!({"input": {"url": receiver.url(), "events": ["JOB_CANCELLED"]}}),
        )
        .await;
    assert!(webhook["errors"].is_null(), "{webhook}");
    let mut input = job_input("later", "hello");
    input["runAt"] = json!((chrono::Utc::now() + chrono::Duration::hours(1)).to_rfc3339());
    let job = serve
        .graphql(
            &key,
            "mutation($input: CreateJobInput!) { createJob(input: $input) { job { id } } }",
            json!({"input": input}),
        )
        .await;
    let cancelled = serve
        .graphql(
            &key,
            "mutation($id: UUID!) { cancelJob(id: $id) { status } }",
            json!({"id": job["data"]["createJob"]["job"]["id"]}),
        )
        .await;
    assert_eq!(
        cancelled["data"]["cancelJob"]["status"], "CANCELLED",
        "{cancelled}"
    );
    receiver.wait_for(1, Duration::from_secs(30)).await;
    assert_eq!(
        proxy.accepted.load(Ordering::SeqCst),
        0,
        "a delivery went to the proxy"
    );
}
