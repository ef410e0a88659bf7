//! Operations: `/metrics` moves by exactly what the jobs did, on the API and on a
//! worker process's own metrics listener; `/healthz` and `/readyz` answer there too,
//! and `/readyz` turns 503 when the database goes away or lacks a migration.

use crate::helpers::{
    ADMIN_TOKEN, AppOptions, Backend, TestApp, job_input, spawn_app_with, test_worker_settings,
};
use entity::{attempts, charges};
use jobledger::config::{OperationsSettings, ProviderSettings, Settings};
use jobledger::jobs::queue::{self, ClaimRequest};
use jobledger::startup::Application;
use rust_decimal::Decimal;
use sea_orm::{ConnectionTrait, EntityTrait};
use serde_json::json;
use std::net::SocketAddr;
use std::str::FromStr;
use std::time::{Duration, Instant};
use tokio_util::sync::CancellationToken;

on_both_backends!(
    metrics_count_exactly_what_jobs_did,
    readiness_needs_every_migration
);

/// A `jobledger worker` process: workers and a metrics listener, no API.
struct WorkerProcess {
    metrics: SocketAddr,
    shutdown: CancellationToken,
    task: tokio::task::JoinHandle<std::io::Result<()>>,
}

impl WorkerProcess {
    async fn start(app: &TestApp) -> Self {
        let settings = Settings {
            listen: None,
            database_url: app.database_url(),
            listen_database_url: None,
            admin_token: Some(ADMIN_TOKEN.to_owned()),
            worker: Some(test_worker_settings()),
            providers: ProviderSettings {
                simulator_url: Some(app.simulator_url()),
                ..ProviderSettings::default()
            },
            customer_markup: Decimal::from_str("1.25").unwrap(),
            config_file: None,
            operations: OperationsSettings {
                metrics_listen: Some("127.0.0.1:0".parse().unwrap()),
                retention: None,
                ..OperationsSettings::default()
            },
            allow_private_webhooks: false,
            cors_origins: Vec::new(),
            default_deadline: None,
        };
        let application = Application::build(settings)
            .await
            .expect("the worker builds");
        assert_eq!(application.address(), None, "a worker serves no API");
        let metrics = application.metrics_address().expect("a metrics listener");
        let shutdown = CancellationToken::new();
        let task = tokio::spawn(application.run(shutdown.clone()));
        Self {
            metrics,
            shutdown,
            task,
        }
    }

    async fn stop(self) {
        self.shutdown.cancel();
        self.task
            .await
            .expect("the worker does not panic")
            .expect("the worker stops cleanly");
    }
}

/// One scrape, as `name{labels} value` lines.
pub async fn scrape(address: SocketAddr) -> String {
    let response = reqwest::get(format!("http://{address}/metrics"))
        .await
        .unwrap();
    assert_eq!(response.status(), 200);
    assert!(
        response.headers()["content-type"]
            .to_str()
            .unwrap()
            .starts_with("text/plain"),
    );
    response.text().await.unwrap()
}

/// The value of the series written exactly `series` (name and labels), or `None`.
pub fn sample(text: &str, series: &str) -> Option<Decimal> {
    text.lines().find_map(|line| {
        let value = line.strip_prefix(series)?.strip_prefix(' ')?;
        Some(Decimal::from_scientific(value).unwrap_or_else(|_| value.parse().unwrap()))
    })
}

fn value(text: &str, series: &str) -> Decimal {
    sample(text, series).unwrap_or_else(|| panic!("no series {series} in:\n{text}"))
}

/// A scrape once each of `gauges` shows its value: the gauges kept in the database
/// are read by a background refresher every few seconds, not by the scrape (bounded:
/// 10 s).
pub async fn scrape_settled(address: SocketAddr, gauges: &[(&str, i64)]) -> String {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let text = scrape(address).await;
        if gauges
            .iter()
            .all(|(series, expected)| sample(&text, series) == Some((*expected).into()))
        {
            return text;
        }
        assert!(
            Instant::now() < deadline,
            "the gauges {gauges:?} did not settle:\n{text}"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

async fn metrics_count_exactly_what_jobs_did(backend: Backend) {
    // The API process runs no workers; a separate worker process runs every job.
    let api = spawn_app_with(backend, AppOptions::no_workers()).await;
    let tenant = api.funded_tenant("observed", "10").await;
    let before = scrape(api.address).await;
    assert_eq!(value(&before, "jobledger_jobs_created_total"), 0.into());

    // A worker claimed this one and died before its attempt: its lease lapses and
    // another worker takes it back.
    let expired = api
        .create_job_ok(&tenant, job_input("expired", "orphan"))
        .await;
    let claimed = queue::claim(
        &api.app.db,
        ClaimRequest::new(10, Duration::from_millis(300)),
    )
    .await
    .unwrap();
    assert_eq!(claimed.len(), 1);
    let succeeds = api
        .create_job_ok(&tenant, job_input("succeeds", "hello"))
        .await;
    let rejected = api
        .create_job_ok(&tenant, job_input("rejected", "no [mock:status=400]"))
        .await;
    let retried = api
        .create_job_ok(
            &tenant,
            job_input("retried", "again [mock:status=503] [mock:fail_first=1]"),
        )
        .await;
    let mut unknown = job_input("unknown", "lost [mock:drop]");
    unknown["retryUnknownOutcome"] = json!(false);
    let unknown = api.create_job_ok(&tenant, unknown).await;
    // A replay creates nothing.
    api.create_job_ok(&tenant, job_input("succeeds", "hello"))
        .await;
    tokio::time::sleep(Duration::from_millis(400)).await;

    let worker = WorkerProcess::start(&api).await;
    for (id, status) in [
        (succeeds, "SUCCEEDED"),
        (rejected, "FAILED"),
        (retried, "SUCCEEDED"),
        (unknown, "FAILED"),
        (expired, "SUCCEEDED"),
    ] {
        let job = api
            .wait_until_finished(&tenant, id, Duration::from_secs(30))
            .await;
        assert_eq!(job["status"], status, "{job}");
    }
    let api_text = scrape(api.address).await;
    let worker_text = scrape_settled(
        worker.metrics,
        &[("jobledger_jobs_queued", 0), ("jobledger_jobs_running", 0)],
    )
    .await;

    // The API counts what it created; the worker what it ran.
    assert_eq!(value(&api_text, "jobledger_jobs_created_total"), 5.into());
    assert_eq!(
        value(&api_text, "jobledger_create_job_latency_seconds_count"),
        6.into(),
        "replays are timed too"
    );
    assert_eq!(
        value(&worker_text, "jobledger_jobs_created_total"),
        0.into()
    );
    for (series, expected) in [
        ("jobledger_jobs_finished_total{status=\"succeeded\"}", 3),
        ("jobledger_jobs_finished_total{status=\"failed\"}", 2),
        ("jobledger_jobs_finished_total{status=\"cancelled\"}", 0),
        ("jobledger_lease_expired_total", 1),
        ("jobledger_provider_unknown_outcomes_total", 1),
        (
            "jobledger_job_retries_total{class=\"PROVIDER_UNAVAILABLE\"}",
            1,
        ),
        ("jobledger_job_retries_total{class=\"LEASE_EXPIRED\"}", 1),
        (
            "jobledger_provider_attempts_total{outcome=\"succeeded\",model=\"gpt-4o-mini\",provider=\"simulator\"}",
            3,
        ),
        (
            "jobledger_provider_attempts_total{outcome=\"permanent_error\",model=\"gpt-4o-mini\",provider=\"simulator\"}",
            1,
        ),
        (
            "jobledger_provider_attempts_total{outcome=\"retryable_error\",model=\"gpt-4o-mini\",provider=\"simulator\"}",
            1,
        ),
        (
            "jobledger_provider_attempts_total{outcome=\"unknown\",model=\"gpt-4o-mini\",provider=\"simulator\"}",
            1,
        ),
        ("jobledger_attempt_duration_seconds_count", 6),
        // The orphan's claim, given back uncounted, was not its first.
        ("jobledger_queue_wait_seconds_count", 5),
        ("jobledger_job_end_to_end_seconds_count", 5),
        ("jobledger_jobs_queued", 0),
        ("jobledger_jobs_running", 0),
        ("jobledger_provider_calls_in_flight", 0),
        ("jobledger_webhook_deliveries_total{result=\"success\"}", 0),
        ("jobledger_tenants_low_credit", 0),
    ] {
        assert_eq!(value(&worker_text, series), expected.into(), "{series}");
    }
    assert!(value(&worker_text, "jobledger_claim_latency_seconds_count") >= 1.into());

    // Money: exactly what the attempt rows and the ledger hold.
    let attempts = attempts::Entity::find().all(&api.app.db).await.unwrap();
    let provider_cost: i64 = attempts
        .iter()
        .filter_map(|attempt| {
            attempt
                .provider_cost_nanos
                .or(attempt.provider_cost_upper_bound_nanos)
        })
        .sum();
    let charged: i64 = charges::Entity::find()
        .all(&api.app.db)
        .await
        .unwrap()
        .iter()
        .map(|charge| charge.amount_nanos)
        .sum();
    let labels = "{model=\"gpt-4o-mini\",provider=\"simulator\"}";
    assert!(provider_cost > 0 && charged > 0);
    assert_eq!(
        value(
            &worker_text,
            &format!("jobledger_provider_cost_credits_total{labels}")
        ),
        Decimal::new(provider_cost, 9),
    );
    assert_eq!(
        value(
            &worker_text,
            &format!("jobledger_customer_charges_credits_total{labels}")
        ),
        Decimal::new(charged, 9),
    );
    assert_eq!(
        value(&api_text, "jobledger_customer_charges_credits_total"),
        0.into()
    );

    // A job queued for later shows in every process's gauge, as scheduled, not as
    // waiting for a worker (which the queue-stuck alert pages on).
    let mut later = job_input("later", "later");
    later["runAt"] = json!((chrono::Utc::now() + chrono::Duration::days(30)).to_rfc3339());
    let held = api.create_job_ok(&tenant, later.clone()).await;
    scrape_settled(
        worker.metrics,
        &[
            ("jobledger_jobs_queued", 0),
            ("jobledger_jobs_scheduled", 1),
            ("jobledger_tenants_low_credit", 0),
        ],
    )
    .await;
    // A tenant granted exactly one such job's hold has nothing left once it is taken.
    let hold = api.job(&tenant, held).await["reservation"]["amount"].clone();
    let frugal = api.funded_tenant("frugal", hold.as_str().unwrap()).await;
    api.create_job_ok(&frugal, later).await;
    scrape_settled(
        api.address,
        &[
            ("jobledger_jobs_queued", 0),
            ("jobledger_jobs_scheduled", 2),
            ("jobledger_tenants_low_credit", 1),
        ],
    )
    .await;

    // The worker's listener has the probes too.
    let probe = |path: &str| format!("http://{}/{path}", worker.metrics);
    assert_eq!(reqwest::get(probe("healthz")).await.unwrap().status(), 200);
    let ready = reqwest::get(probe("readyz")).await.unwrap();
    assert_eq!(ready.status(), 200);
    assert_eq!(ready.text().await.unwrap(), "ready");
    worker.stop().await;
}

/// The newest migration's version, as `seaql_migrations` names it.
async fn newest_migration(app: &TestApp) -> String {
    let row = app
        .app
        .db
        .query_one_raw(sea_orm::Statement::from_string(
            app.app.db.get_database_backend(),
            "SELECT version FROM seaql_migrations ORDER BY version DESC LIMIT 1",
        ))
        .await
        .unwrap()
        .unwrap();
    row.try_get("", "version").unwrap()
}

async fn readyz(app: &TestApp) -> (u16, String) {
    let response = reqwest::get(format!("http://{}/readyz", app.address))
        .await
        .unwrap();
    (response.status().as_u16(), response.text().await.unwrap())
}

async fn readiness_needs_every_migration(backend: Backend) {
    let app = spawn_app_with(backend, AppOptions::no_workers()).await;
    assert_eq!(readyz(&app).await, (200, "ready".to_owned()));
    let version = newest_migration(&app).await;
    let backend = app.app.db.get_database_backend();
    let placeholder = if backend == sea_orm::DbBackend::Postgres {
        "$1"
    } else {
        "?"
    };
    app.app
        .db
        .execute_raw(sea_orm::Statement::from_sql_and_values(
            backend,
            format!("DELETE FROM seaql_migrations WHERE version = {placeholder}"),
            [version.clone().into()],
        ))
        .await
        .unwrap();
    assert_eq!(
        readyz(&app).await,
        (503, "1 migrations not applied".to_owned())
    );
    let insert = if backend == sea_orm::DbBackend::Postgres {
        "INSERT INTO seaql_migrations (version, applied_at) VALUES ($1, $2)"
    } else {
        "INSERT INTO seaql_migrations (version, applied_at) VALUES (?, ?)"
    };
    app.app
        .db
        .execute_raw(sea_orm::Statement::from_sql_and_values(
            backend,
            insert,
            [version.into(), 0i64.into()],
        ))
        .await
        .unwrap();
    assert_eq!(readyz(&app).await, (200, "ready".to_owned()));
}

/// `/readyz` answers 503 while PostgreSQL refuses the application's connections, and
/// 200 again once it accepts them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn readiness_follows_the_database_away_and_back() {
    let Some(backend) = Backend::postgres() else {
        return;
    };
    let Backend::Postgres(server) = &backend else {
        unreachable!()
    };
    let app = spawn_app_with(backend.clone(), AppOptions::no_workers()).await;
    let url = app.database_url();
    let name = url
        .rsplit('/')
        .next()
        .unwrap()
        .split('?')
        .next()
        .unwrap()
        .to_owned();
    let admin = sea_orm::Database::connect(server).await.unwrap();
    admin
        .execute_unprepared(&format!("ALTER DATABASE {name} ALLOW_CONNECTIONS false"))
        .await
        .unwrap();
    admin
        .execute_unprepared(&format!(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = '{name}'"
        ))
        .await
        .unwrap();
    let (status, reason) = readyz(&app).await;
    assert_eq!(status, 503, "{reason}");
    assert!(
        ["database unreachable", "database did not answer within 1 s"].contains(&reason.as_str()),
        "{reason}"
    );
    // The process itself is fine, and says in its metrics that its database is not.
    let health = reqwest::get(format!("http://{}/healthz", app.address))
        .await
        .unwrap();
    assert_eq!(health.status(), 200);
    // The gauge follows the background refresher, within seconds.
    scrape_settled(app.address, &[("jobledger_database_up", 0)]).await;
    admin
        .execute_unprepared(&format!("ALTER DATABASE {name} ALLOW_CONNECTIONS true"))
        .await
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let (status, reason) = readyz(&app).await;
        if status == 200 {
            assert_eq!(reason, "ready");
            scrape_settled(app.address, &[("jobledger_database_up", 1)]).await;
            break;
        }
        assert!(Instant::now() < deadline, "never ready again: {reason}");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    admin.close().await.ok();
}

/// Probes that meet a database stuck behind a lock answer 503 and tie up at most one
/// connection between them: the others wait for their turn, and the waiting one gives
/// up on the server after a second too. (Each probe used to keep a connection until
/// the lock went: 30 probes took 15 of the pool's 16, and the API stalled.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn probes_against_a_stuck_database_hold_at_most_one_connection() {
    let Some(backend) = Backend::postgres() else {
        return;
    };
    let app = spawn_app_with(backend, AppOptions::no_workers()).await;
    let blocker = sea_orm::Database::connect(app.database_url())
        .await
        .unwrap();
    let transaction = sea_orm::TransactionTrait::begin(&blocker).await.unwrap();
    transaction
        .execute_unprepared("LOCK TABLE seaql_migrations IN ACCESS EXCLUSIVE MODE")
        .await
        .unwrap();
    let probes = (0..20).map(|_| readyz(&app));
    for (status, reason) in futures_util::future::join_all(probes).await {
        assert_eq!(status, 503, "{reason}");
    }
    let waiting = blocker
        .query_one_raw(sea_orm::Statement::from_string(
            sea_orm::DbBackend::Postgres,
            "SELECT count(*) FROM pg_stat_activity
             WHERE datname = current_database() AND wait_event_type = 'Lock'",
        ))
        .await
        .unwrap()
        .unwrap()
        .try_get_by_index::<i64>(0)
        .unwrap();
    assert!(waiting <= 1, "{waiting} probe connections wait on the lock");
    transaction.rollback().await.unwrap();
    let (status, reason) = readyz(&app).await;
    assert_eq!((status, reason.as_str()), (200, "ready"));
    blocker.close().await.ok();
}
