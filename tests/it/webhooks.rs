//! Webhooks: signed deliveries from a durable outbox, retried, recorded, resumed after
//! a restart, and never sent to private addresses unless allowed.

use crate::helpers::{
    ADMIN_TOKEN, AppOptions, Backend, TestApp, TestTenant, decimal, error_code, job_input,
    spawn_app, spawn_app_with,
};
use crate::invariants::assert_billing_invariants;
use axum::http::{HeaderMap, StatusCode};
use base64::Engine;
use base64::engine::general_purpose::STANDARD;
use hmac::{Hmac, Mac};
use serde_json::{Value, json};
use sha2::Sha256;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU16, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

on_both_backends!(
    a_delivery_is_signed_retried_after_a_500_and_recorded,
    pending_deliveries_resume_after_a_restart,
    private_urls_are_refused_without_the_flag,
    concurrent_creates_never_pass_the_endpoint_limit,
    a_tenant_lists_its_live_webhooks_and_no_one_elses,
    balance_low_fires_once_per_crossing_and_spend_limit_reached_once_per_period,
);

/// A request the receiver got.
#[derive(Clone, Debug)]
pub struct Received {
    pub headers: HeaderMap,
    pub body: String,
}

/// A webhook endpoint in the test: answers `failing_status` to the first
/// `failures_left` requests and 204 afterwards, and keeps every request.
#[derive(Clone)]
pub struct Receiver {
    address: SocketAddr,
    received: Arc<Mutex<Vec<Received>>>,
    failures_left: Arc<AtomicUsize>,
    failing_status: Arc<AtomicU16>,
}

impl Receiver {
    pub async fn start(failures: usize, failing_status: u16) -> Self {
        let receiver = Self {
            address: "127.0.0.1:0".parse().unwrap(),
            received: Arc::default(),
            failures_left: Arc::new(AtomicUsize::new(failures)),
            failing_status: Arc::new(AtomicU16::new(failing_status)),
        };
        let state = receiver.clone();
        let router = axum::Router::new().route(
            "/hook",
            axum::routing::post(move |headers: HeaderMap, body: String| {
                let state = state.clone();
                async move {
                    state
                        .received
                        .lock()
                        .unwrap()
                        .push(Received { headers, body });
                    let failing = state
                        .failures_left
                        .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |left| {
                            left.checked_sub(1)
                        })
                        .is_ok();
                    if failing {
                        let status = state.failing_status.load(Ordering::SeqCst);
                        (StatusCode::from_u16(status).unwrap(), "receiver says no")
                    } else {
                        (StatusCode::NO_CONTENT, "")
                    }
                }
            }),
        );
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let address = listener.local_addr().unwrap();
        tokio::spawn(async move { axum::serve(listener, router).await });
        Self {
            address,
            ..receiver
        }
    }

    pub fn url(&self) -> String {
        format!("http://{}/hook", self.address)
    }

    pub fn received(&self) -> Vec<Received> {
        self.received.lock().unwrap().clone()
    }

    /// Waits until at least `count` requests arrived.
    pub async fn wait_for(&self, count: usize, limit: Duration) -> Vec<Received> {
        let deadline = Instant::now() + limit;
        loop {
            let received = self.received();
            if received.len() >= count {
                return received;
            }
            assert!(
                Instant::now() < deadline,
                "only {} of {count} deliveries arrived",
                received.len()
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }
}

/// The signature the Standard Webhooks specification defines, computed here.
fn expected_signature(secret: &str, received: &Received) -> String {
    let key = STANDARD
        .decode(secret.strip_prefix("whsec_").expect("a whsec_ secret"))
        .unwrap();
    let header = |name: &str| received.headers[name].to_str().unwrap().to_owned();
    let signed = format!(
        "{}.{}.{}",
        header("webhook-id"),
        header("webhook-timestamp"),
        received.body
    );
    let mut mac = Hmac::<Sha256>::new_from_slice(&key).unwrap();
    mac.update(signed.as_bytes());
    format!("v1,{}", STANDARD.encode(mac.finalize().into_bytes()))
}

pub async fn create_webhook(app: &TestApp, tenant: &TestTenant, url: &str, events: Value) -> Value {
    app.operation(
        Some(&tenant.key),
        "CreateWebhook",
        json!({"input": {"url": url, "events": events}}),
    )
    .await
}

async fn deliveries(app: &TestApp, tenant: &TestTenant) -> Vec<Value> {
    let response = app
        .operation(Some(&tenant.key), "WebhookDeliveries", json!({"first": 50}))
        .await;
    assert!(response["errors"].is_null(), "{response}");
    response["data"]["webhookDeliveries"]["edges"]
        .as_array()
        .unwrap()
        .iter()
        .map(|edge| edge["node"].clone())
        .collect()
}

/// Polls the deliveries until the first is no longer pending.
async fn settled_delivery(app: &TestApp, tenant: &TestTenant, limit: Duration) -> Value {
    let deadline = Instant::now() + limit;
    loop {
        let list = deliveries(app, tenant).await;
        if let Some(first) = list.first()
            && first["status"] != "PENDING"
        {
            return first.clone();
        }
        assert!(Instant::now() < deadline, "never settled: {list:?}");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

async fn a_delivery_is_signed_retried_after_a_500_and_recorded(backend: Backend) {
    let receiver = Receiver::start(1, 500).await;
    let app = spawn_app(backend).await;
    let tenant = app.funded_tenant("acme", "5").await;
    let stranger = app.funded_tenant("globex", "5").await;
    let created = create_webhook(
        &app,
        &tenant,
        &receiver.url(),
        json!(["JOB_SUCCEEDED", "JOB_CANCELLED"]),
    )
    .await;
    assert!(created["errors"].is_null(), "{created}");
    let secret = created["data"]["createWebhook"]["secret"]
        .as_str()
        .unwrap()
        .to_owned();
    let webhook = &created["data"]["createWebhook"]["webhook"];
    assert_eq!(webhook["url"], receiver.url());
    assert_eq!(webhook["events"], json!(["JOB_SUCCEEDED", "JOB_CANCELLED"]));

    let mut input = job_input("hooked", "hello");
    input["labels"] = json!([{"key": "user", "value": "u-42"}, {"key": "doc", "value": "d-7"}]);
    input["metadata"] = json!({"upload": "batch-3", "pages": [1, 2]});
    let id = app.create_job_ok(&tenant, input).await;
    let job = app
        .wait_until_finished(&tenant, id, Duration::from_secs(30))
        .await;
    assert_eq!(job["status"], "SUCCEEDED");

    // The first try gets a 500; the retry comes within ten seconds.
    let received = receiver.wait_for(2, Duration::from_secs(20)).await;
    let delivery_id = received[0].headers["webhook-id"].to_str().unwrap();
    assert_eq!(
        received[1].headers["webhook-id"].to_str().unwrap(),
        delivery_id,
        "a retry carries the same webhook-id"
    );
    for try_received in &received {
        assert_eq!(
            try_received.headers["webhook-signature"].to_str().unwrap(),
            expected_signature(&secret, try_received)
        );
        let timestamp: i64 = try_received.headers["webhook-timestamp"]
            .to_str()
            .unwrap()
            .parse()
            .unwrap();
        assert!((chrono::Utc::now().timestamp() - timestamp).abs() < 60);
        let body: Value = serde_json::from_str(&try_received.body).unwrap();
        assert_eq!(body["type"], "job.succeeded");
        assert!(chrono::DateTime::parse_from_rfc3339(body["timestamp"].as_str().unwrap()).is_ok());
        assert_eq!(body["data"]["jobId"], json!(id));
        assert_eq!(body["data"]["status"], "SUCCEEDED");
        assert_eq!(
            decimal(&body["data"]["customerCharge"]),
            decimal(&job["charge"]["amount"])
        );
        // What the client gave the job, so the receiver knows whose it is.
        assert_eq!(body["data"]["idempotencyKey"], "hooked");
        assert_eq!(
            body["data"]["labels"],
            json!({"doc": "d-7", "user": "u-42"})
        );
        assert_eq!(
            body["data"]["metadata"],
            json!({"upload": "batch-3", "pages": [1, 2]})
        );
    }

    let recorded = settled_delivery(&app, &tenant, Duration::from_secs(10)).await;
    assert_eq!(recorded["id"], delivery_id);
    assert_eq!(recorded["webhookId"], webhook["id"]);
    assert_eq!(recorded["eventType"], "JOB_SUCCEEDED");
    assert_eq!(recorded["status"], "DELIVERED");
    assert_eq!(recorded["attempts"], 2);
    assert_eq!(recorded["lastStatusCode"], 204);
    assert!(recorded["deliveredAt"].is_string());
    assert_eq!(deliveries(&app, &stranger).await, Vec::<Value>::new());
    // Both tries are counted: the refused one and the delivered one.
    let metrics = crate::operations::scrape(app.address).await;
    for result in ["success", "failure"] {
        let series = format!("jobledger_webhook_deliveries_total{{result=\"{result}\"}}");
        assert_eq!(
            crate::operations::sample(&metrics, &series),
            Some(1.into()),
            "{series}"
        );
    }

    // Deleting: only the owner may, and nothing more is queued for the endpoint.
    let refused = app
        .operation(
            Some(&stranger.key),
            "DeleteWebhook",
            json!({"id": webhook["id"]}),
        )
        .await;
    assert_eq!(error_code(&refused), "NOT_FOUND");
    let deleted = app
        .operation(
            Some(&tenant.key),
            "DeleteWebhook",
            json!({"id": webhook["id"]}),
        )
        .await;
    assert_eq!(deleted["data"]["deleteWebhook"]["id"], webhook["id"]);
    let mut later = job_input("cancelled", "hello");
    later["runAt"] = json!((chrono::Utc::now() + chrono::Duration::hours(1)).to_rfc3339());
    let cancelled = app.create_job_ok(&tenant, later).await;
    let response = app
        .operation(Some(&tenant.key), "CancelJob", json!({"id": cancelled}))
        .await;
    assert_eq!(response["data"]["cancelJob"]["status"], "CANCELLED");
    assert_eq!(deliveries(&app, &tenant).await.len(), 1);
    assert_billing_invariants(&app.app.db).await;
}

async fn pending_deliveries_resume_after_a_restart(backend: Backend) {
    let receiver = Receiver::start(usize::MAX, 503).await;
    let app = spawn_app_with(backend, AppOptions::no_workers()).await;
    let tenant = app.funded_tenant("acme", "5").await;
    let created = create_webhook(&app, &tenant, &receiver.url(), json!(["JOB_CANCELLED"])).await;
    assert!(created["errors"].is_null(), "{created}");
    let id = app
        .create_job_ok(&tenant, job_input("cancel-me", "hello"))
        .await;
    let response = app
        .operation(Some(&tenant.key), "CancelJob", json!({"id": id}))
        .await;
    assert_eq!(response["data"]["cancelJob"]["status"], "CANCELLED");
    receiver.wait_for(1, Duration::from_secs(10)).await;
    let pending = deliveries(&app, &tenant).await;
    assert_eq!(pending[0]["status"], "PENDING", "{pending:?}");

    // A new process on the same database takes over, and the endpoint recovers.
    let app = app.restart(AppOptions::no_workers()).await;
    receiver.failures_left.store(0, Ordering::SeqCst);
    let recorded = settled_delivery(&app, &tenant, Duration::from_secs(40)).await;
    assert_eq!(recorded["status"], "DELIVERED");
    let received = receiver.received();
    let last = received.last().unwrap();
    assert_eq!(
        last.headers["webhook-id"].to_str().unwrap(),
        recorded["id"].as_str().unwrap()
    );
    assert_eq!(
        received
            .iter()
            .filter(|request| request.headers["webhook-id"] == last.headers["webhook-id"])
            .count(),
        received.len(),
        "one delivery, tried until it succeeded"
    );
    let body: Value = serde_json::from_str(&last.body).unwrap();
    assert_eq!(body["type"], "job.cancelled");
    assert_eq!(body["data"]["status"], "CANCELLED");
    assert_eq!(decimal(&body["data"]["customerCharge"]), 0.into());
    // A job created without labels or metadata says so rather than leaving them out.
    assert_eq!(body["data"]["labels"], json!({}));
    assert!(body["data"]["metadata"].is_null(), "{body}");
    assert!(body["data"]["idempotencyKey"].is_string(), "{body}");
    assert_eq!(recorded["attempts"], received.len());
}

async fn private_urls_are_refused_without_the_flag(backend: Backend) {
    let options = AppOptions {
        worker: None,
        allow_private_webhooks: false,
        cors_origins: Vec::new(),
        ..AppOptions::default()
    };
    let app = spawn_app_with(backend, options).await;
    let tenant = app.funded_tenant("acme", "5").await;
    for url in [
        "http://127.0.0.1:9/hook",
        "http://localhost:9/hook",
        "http://[::1]:9/hook",
        "http://[::ffff:127.0.0.1]:9/hook",
        "http://10.0.0.1/hook",
        "http://169.254.169.254/latest/meta-data",
        "ftp://example.com/hook",
        "not a url",
        "http://user:password@example.com/hook",
    ] {
        let refused = create_webhook(&app, &tenant, url, json!(["JOB_SUCCEEDED"])).await;
        assert_eq!(error_code(&refused), "VALIDATION", "{url}: {refused}");
    }
    let no_events = create_webhook(&app, &tenant, "http://93.184.216.34/hook", json!([])).await;
    assert_eq!(error_code(&no_events), "VALIDATION");
    assert_eq!(deliveries(&app, &tenant).await, Vec::<Value>::new());
}

/// 40 endpoints created at once: exactly the 16 a tenant may have are. (Each create
/// counted the live endpoints outside a transaction: 23 passed on PostgreSQL, 18 on
/// SQLite.)
async fn a_tenant_lists_its_live_webhooks_and_no_one_elses(backend: Backend) {
    let app = spawn_app_with(backend, AppOptions::no_workers()).await;
    let (acme, other) = (
        app.create_tenant("acme").await,
        app.create_tenant("other").await,
    );
    let list = |tenant: &TestTenant| {
        let key = tenant.key.clone();
        let app = &app;
        async move {
            let answer = app.operation(Some(&key), "Webhooks", json!({})).await;
            assert!(answer["errors"].is_null(), "{answer}");
            answer["data"]["webhooks"].as_array().unwrap().clone()
        }
    };
    assert!(list(&acme).await.is_empty());
    let mut created = Vec::new();
    for (path, events) in [
        ("first", json!(["JOB_SUCCEEDED", "JOB_FAILED"])),
        ("second", json!(["BATCH_FINISHED"])),
        ("third", json!(["BALANCE_LOW"])),
    ] {
        let url = format!("http://127.0.0.1:9/{path}");
        let answer = create_webhook(&app, &acme, &url, events).await;
        assert!(answer["errors"].is_null(), "{answer}");
        created.push(answer["data"]["createWebhook"]["webhook"].clone());
    }
    create_webhook(
        &app,
        &other,
        "http://127.0.0.1:9/other",
        json!(["JOB_FAILED"]),
    )
    .await;
    let deleted = app
        .operation(
            Some(&acme.key),
            "DeleteWebhook",
            json!({"id": created[1]["id"]}),
        )
        .await;
    assert!(deleted["errors"].is_null(), "{deleted}");

    // Newest first, the deleted one gone, each as createWebhook answered it.
    assert_eq!(list(&acme).await, [created[2].clone(), created[0].clone()]);
    let others = list(&other).await;
    assert_eq!(others.len(), 1);
    assert_eq!(others[0]["url"], "http://127.0.0.1:9/other");
    let keyless = app.operation(None, "Webhooks", json!({})).await;
    assert_eq!(error_code(&keyless), "UNAUTHENTICATED");
    let admin = app
        .operation(Some(ADMIN_TOKEN), "Webhooks", json!({}))
        .await;
    assert_eq!(
        error_code(&admin),
        "FORBIDDEN",
        "the webhooks are a tenant's"
    );
}

async fn concurrent_creates_never_pass_the_endpoint_limit(backend: Backend) {
    let app = spawn_app_with(backend, AppOptions::no_workers()).await;
    let tenant = app.create_tenant("acme").await;
    let creates = (0..40).map(|index| {
        let (app, tenant) = (&app, &tenant);
        async move {
            let url = format!("http://127.0.0.1:9/hook/{index}");
            create_webhook(app, tenant, &url, json!(["JOB_SUCCEEDED"])).await
        }
    });
    let answers = futures_util::future::join_all(creates).await;
    let created = answers
        .iter()
        .filter(|answer| answer["errors"].is_null())
        .count();
    assert_eq!(created, 16, "endpoints created by 40 concurrent creates");
    for answer in answers.iter().filter(|answer| !answer["errors"].is_null()) {
        assert_eq!(error_code(answer), "VALIDATION", "{answer}");
    }
}

async fn balance_low_fires_once_per_crossing_and_spend_limit_reached_once_per_period(
    backend: Backend,
) {
    let receiver = Receiver::start(0, 500).await;
    let app = spawn_app_with(backend, AppOptions::no_workers()).await;
    let tenant = app.funded_tenant("acme", "1").await;
    let created = create_webhook(
        &app,
        &tenant,
        &receiver.url(),
        json!(["BALANCE_LOW", "SPEND_LIMIT_REACHED"]),
    )
    .await;
    assert!(created["errors"].is_null(), "{created}");
    let first = app.create_job(&tenant, job_input("a", "hello")).await;
    let hold = decimal(&first["data"]["createJob"]["job"]["reservation"]["amount"]);
    let nano = rust_decimal::Decimal::new(1, 9);
    let one = rust_decimal::Decimal::ONE;
    // Above the threshold after two holds, below it after the third.
    let threshold = one - hold * rust_decimal::Decimal::from(3) + nano;
    let set = app
        .operation(
            Some(ADMIN_TOKEN),
            "SetTenantLimits",
            json!({"input": {"tenantId": tenant.id, "lowBalanceThreshold": threshold.to_string()}}),
        )
        .await;
    assert!(set["errors"].is_null(), "{set}");
    for key in ["b", "c", "d"] {
        app.create_job_ok(&tenant, job_input(key, "hello")).await;
    }
    // A grant takes the balance back above the threshold: the next crossing alerts.
    let granted = app
        .grant(
            &tenant,
            &(hold * rust_decimal::Decimal::from(2) - nano).to_string(),
        )
        .await;
    assert!(granted["errors"].is_null(), "{granted}");
    app.create_job_ok(&tenant, job_input("e", "hello")).await;

    let spend = app
        .operation(Some(&tenant.key), "AccountLimits", json!({}))
        .await["data"]["account"]["spend"]["today"]
        .clone();
    let set = app
        .operation(
            Some(ADMIN_TOKEN),
            "SetTenantLimits",
            json!({"input": {"tenantId": tenant.id, "dailySpendLimit": spend}}),
        )
        .await;
    assert!(set["errors"].is_null(), "{set}");
    for key in ["f", "g"] {
        let refused = app.create_job(&tenant, job_input(key, "hello")).await;
        assert_eq!(error_code(&refused), "SPEND_LIMIT_EXCEEDED");
    }

    let received = receiver.wait_for(3, Duration::from_secs(15)).await;
    // Nothing more comes: wait past a poll of the dispatcher.
    tokio::time::sleep(Duration::from_secs(2)).await;
    let received = if receiver.received().len() > received.len() {
        receiver.received()
    } else {
        received
    };
    let bodies: Vec<Value> = received
        .iter()
        .map(|request| serde_json::from_str(&request.body).unwrap())
        .collect();
    let of_type =
        |kind: &str| -> Vec<&Value> { bodies.iter().filter(|body| body["type"] == kind).collect() };
    let low = of_type("balance.low");
    assert_eq!(low.len(), 2, "once per crossing: {bodies:?}");
    let mut available: Vec<rust_decimal::Decimal> = low
        .iter()
        .map(|body| decimal(&body["data"]["available"]))
        .collect();
    available.sort();
    let three = rust_decimal::Decimal::from(3);
    assert_eq!(
        available,
        vec![one - hold * three - nano, one - hold * three],
        "after the third hold, and after the fifth with the grant"
    );
    assert_eq!(decimal(&low[0]["data"]["threshold"]), threshold);
    let reached = of_type("spend_limit.reached");
    assert_eq!(reached.len(), 1, "once per period: {bodies:?}");
    assert_eq!(reached[0]["data"]["period"], "DAY");
    assert_eq!(reached[0]["data"]["limit"], spend);
    let listed = deliveries(&app, &tenant).await;
    assert_eq!(listed.len(), 3, "{listed:?}");
    assert_billing_invariants(&app.app.db).await;
}
