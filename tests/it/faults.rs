//! Money under faults of the database and of the machines: a database that refuses
//! writes for a while (a failover), a worker whose clock runs ahead, a tenant's row
//! held by a frozen process, a provider that is down for a few seconds. Each ends with the simulator's billed calls against the
//! recorded attempts and the billing audit.

use crate::helpers::{
    AppOptions, Backend, TestApp, TestDatabase, spawn_app_with, test_worker_settings,
};
use crate::invariants::assert_billing_invariants;
use crate::processes::ServeProcess;
use sea_orm::{ConnectionTrait, Database};
use serde_json::{Value, json};
use std::time::{Duration, Instant};

on_both_backends!(a_ten_second_provider_outage_fails_no_job);

/// The test database's name, from its URL.
fn database_name(app: &TestApp) -> String {
    let url = app.database_url();
    let path = url.rsplit('/').next().unwrap();
    path.split('?').next().unwrap().to_owned()
}

/// Makes every session of the test database read-only (or writable again), the way a
/// primary that became a standby would: new sessions default to read-only
/// transactions, and every open session is cut, so the pools reconnect into it.
async fn set_read_only(server: &str, database: &str, read_only: bool) {
    let admin = Database::connect(server).await.unwrap();
    let setting = if read_only {
        format!("ALTER DATABASE {database} SET default_transaction_read_only = on")
    } else {
        format!("ALTER DATABASE {database} RESET default_transaction_read_only")
    };
    admin.execute_unprepared(&setting).await.unwrap();
    admin
        .execute_unprepared(&format!(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity \
             WHERE datname = '{database}' AND pid <> pg_backend_pid()"
        ))
        .await
        .unwrap();
    admin.close().await.unwrap();
}

fn delayed_job(key: &str, delay_ms: u64) -> Value {
    json!({
        "idempotencyKey": key,
        "model": "gpt-4o-mini",
        "messages": [{"role": "user", "content": format!("{key} [mock:delay_ms={delay_ms}]")}],
        "maxOutputTokens": 50,
    })
}

/// Waits until the simulator has received `count` calls.
async fn wait_for_calls(app: &TestApp, count: usize, limit: Duration) {
    let deadline = Instant::now() + limit;
    while app.simulator.calls().len() < count {
        assert!(
            Instant::now() < deadline,
            "only {} of {count} calls arrived",
            app.simulator.calls().len()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Twenty answers arrive at two worker processes while the database takes no writes
/// for 8 s, longer than a lease (read-only after a failover, every connection cut):
/// each is kept with its exact usage and recorded once the database takes writes
/// again, and neither process takes back the other's jobs whose leases lapsed in the
/// meantime — twenty jobs succeeded on twenty billed calls. (Read-only was a
/// permanent refusal: 19 of 20 answers were dropped and bought again; and then, with
/// two processes, each took back the other's jobs as soon as writes passed.)
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn paid_answers_survive_a_database_that_refuses_writes() {
    let Some(backend @ Backend::Postgres(_)) = Backend::postgres() else {
        return;
    };
    let Backend::Postgres(server) = backend.clone() else {
        unreachable!()
    };
    let mut settings = test_worker_settings();
    settings.concurrency = 10;
    let app = spawn_app_with(backend, AppOptions::workers(settings.clone())).await;
    let _other = app.another_process(AppOptions::workers(settings)).await;
    let tenant = app.funded_tenant("acme", "100").await;
    let mut ids = Vec::new();
    for n in 0..20 {
        ids.push(
            app.create_job_ok(&tenant, delayed_job(&format!("doc-{n}"), 2_000))
                .await,
        );
    }
    wait_for_calls(&app, 20, Duration::from_secs(20)).await;
    let database = database_name(&app);
    set_read_only(&server, &database, true).await;
    // The answers come back during the outage, and the leases lapse in the rows.
    tokio::time::sleep(Duration::from_secs(8)).await;
    set_read_only(&server, &database, false).await;

    for id in &ids {
        let job = app
            .wait_until_finished(&tenant, *id, Duration::from_secs(60))
            .await;
        assert_eq!(job["status"], "SUCCEEDED", "{job}");
        assert_eq!(job["attempts"].as_array().unwrap().len(), 1, "{job}");
    }
    let billed = app.billed_calls();
    assert_eq!(billed, 20, "each answer was bought once");
    assert_billing_invariants(&app.app.db).await;
}

/// A `jobledger worker` whose clock runs 45 s ahead (Debian's `faketime`) shares the
/// database with a worker that runs calls longer than a lease: it takes back none of
/// them, because leases are written and judged by the PostgreSQL server's clock.
/// (Judged by each process's clock, it took back every running job: 24 LEASE_EXPIRED
/// of 40 and 64 billed calls.)
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_worker_whose_clock_runs_ahead_takes_back_no_running_job() {
    let Some(backend @ Backend::Postgres(_)) = Backend::postgres() else {
        return;
    };
    let mut settings = test_worker_settings();
    settings.concurrency = 10;
    settings.lease = Duration::from_secs(3);
    let app = spawn_app_with(backend, AppOptions::workers(settings)).await;
    let tenant = app.funded_tenant("acme", "100").await;
    let log = tempfile::NamedTempFile::new().unwrap();
    // The library itself, not the `faketime` command: that forks, and killing it
    // would leave the worker running after the test.
    let library = std::fs::read_dir("/usr/lib")
        .unwrap()
        .filter_map(|entry| {
            let path = entry.ok()?.path().join("faketime/libfaketimeMT.so.1");
            path.exists().then_some(path)
        })
        .next()
        .expect("Debian's faketime (apt-get install faketime)");
    let _skewed = tokio::process::Command::new(env!("CARGO_BIN_EXE_jobledger"))
        .arg("worker")
        .env("LD_PRELOAD", &library)
        .env("FAKETIME", "+45s")
        .args(["--database-url", &app.database_url()])
        .args(["--workers", "2", "--lease-seconds", "3"])
        .env("OPENAI_BASE_URL", app.simulator_url())
        .env_remove("DATABASE_URL")
        .env_remove("OPENAI_API_KEY")
        // Timers run on the monotonic clock, which stays true.
        .env("FAKETIME_DONT_FAKE_MONOTONIC", "1")
        .env("RUST_LOG", "info,sqlx=warn,sea_orm=warn")
        .stdout(log.reopen().unwrap())
        .stderr(log.reopen().unwrap())
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(30);
    while !std::fs::read_to_string(log.path())
        .unwrap_or_default()
        .contains("worker started")
    {
        assert!(Instant::now() < deadline, "the skewed worker never started");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let mut ids = Vec::new();
    for n in 0..12 {
        // Each call outlasts two leases: only renewals keep it.
        ids.push(
            app.create_job_ok(&tenant, delayed_job(&format!("long-{n}"), 7_000))
                .await,
        );
    }
    for id in &ids {
        let job = app
            .wait_until_finished(&tenant, *id, Duration::from_secs(90))
            .await;
        assert_eq!(job["status"], "SUCCEEDED", "{job}");
        let outcomes: Vec<&Value> = job["attempts"]
            .as_array()
            .unwrap()
            .iter()
            .map(|attempt| &attempt["outcome"])
            .collect();
        assert_eq!(outcomes, [&json!("SUCCEEDED")], "{job}");
    }
    let billed = app.billed_calls();
    assert_eq!(billed, ids.len(), "no call was bought twice");
    assert_billing_invariants(&app.app.db).await;
}

/// A process frozen inside tenant A's transaction holds A's row — or the row of one of
/// A's running jobs, or of its hold: tenant B's jobs, run by the same workers in the
/// same groups of finishes, still finish in seconds, and A's once the row is free. (A
/// group of finishes mixed tenants and waited for A's row: B finished 1 of 100 jobs in
/// 12 s; with only tenant rows looked at, a held job or hold row still stalled B.)
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_held_row_of_one_tenant_does_not_stall_another_tenants_finishes() {
    let Some(backend @ Backend::Postgres(_)) = Backend::postgres() else {
        return;
    };
    let mut settings = test_worker_settings();
    settings.concurrency = 16;
    let app = spawn_app_with(backend, AppOptions::workers(settings)).await;
    for held in ["tenant", "job", "hold"] {
        let a = app.funded_tenant(&format!("a-{held}"), "100").await;
        let b = app.funded_tenant(&format!("b-{held}"), "100").await;
        let mut a_jobs = Vec::new();
        for n in 0..4 {
            a_jobs.push(
                app.create_job_ok(&a, delayed_job(&format!("a-{held}-{n}"), 1_500))
                    .await,
            );
        }
        // The frozen process: a transaction holding one of A's rows.
        let lock = match held {
            "tenant" => format!("SELECT id FROM tenants WHERE id = '{}' FOR UPDATE", a.id),
            "job" => format!("SELECT id FROM jobs WHERE id = '{}' FOR UPDATE", a_jobs[0]),
            _ => format!(
                "SELECT id FROM credit_reservations WHERE job_id = '{}' FOR UPDATE",
                a_jobs[0]
            ),
        };
        let frozen = Database::connect(&app.database_url()).await.unwrap();
        let transaction = sea_orm::TransactionTrait::begin(&frozen).await.unwrap();
        transaction.execute_unprepared(&lock).await.unwrap();
        // A's calls answer meanwhile, and the finish of the held one waits for the row.
        tokio::time::sleep(Duration::from_secs(2)).await;
        let held_at = Instant::now();
        let mut b_jobs = Vec::new();
        for n in 0..40 {
            b_jobs.push(
                app.create_job_ok(&b, delayed_job(&format!("b-{held}-{n}"), 100))
                    .await,
            );
        }
        for id in &b_jobs {
            let job = app
                .wait_until_finished(&b, *id, Duration::from_secs(20))
                .await;
            assert_eq!(job["status"], "SUCCEEDED", "{held}: {job}");
        }
        let b_done = held_at.elapsed();
        let a_waiting = app.job(&a, a_jobs[0]).await;
        transaction.rollback().await.unwrap();
        assert!(
            b_done < Duration::from_secs(8),
            "{held}: tenant B's 40 jobs took {b_done:?} behind A's held row"
        );
        assert_eq!(
            a_waiting["status"], "RUNNING",
            "{held}: A's finish waits for its row"
        );
        for id in &a_jobs {
            let job = app
                .wait_until_finished(&a, *id, Duration::from_secs(30))
                .await;
            assert_eq!(job["status"], "SUCCEEDED", "{held}: {job}");
        }
    }
    assert_billing_invariants(&app.app.db).await;
}

/// The provider refuses connections for 10 s (not started yet): nothing is sent, so
/// each refusal is a wait that spends no attempt, and every job succeeds once it is
/// back, each on one billed call. (Refusals spent the three attempts in ~6 s: every
/// job failed PROVIDER_UNAVAILABLE.)
async fn a_ten_second_provider_outage_fails_no_job(backend: Backend) {
    let database = TestDatabase::create(&backend).await;
    let provider = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap();
    let base_url = format!("http://{provider}/v1");
    let serve = ServeProcess::start_with(
        &database.url,
        &["--workers", "8"],
        &[("OPENAI_BASE_URL", base_url.as_str())],
    )
    .await;
    let (_, key) = serve.funded_tenant("10").await;
    let mut ids = Vec::new();
    for n in 0..20 {
        let created = serve
            .graphql(
                &key,
                "mutation($i: CreateJobInput!) { createJob(input: $i) { job { id } } }",
                json!({"i": delayed_job(&format!("outage-{n}"), 10)}),
            )
            .await;
        ids.push(created["data"]["createJob"]["job"]["id"].clone());
    }
    tokio::time::sleep(Duration::from_secs(10)).await;
    let _provider = tokio::process::Command::new(env!("CARGO_BIN_EXE_jobledger"))
        .args(["mock-llm", "--listen", &provider.to_string()])
        .env("RUST_LOG", "warn")
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(90);
    for id in &ids {
        loop {
            let job = serve
                .graphql(
                    &key,
                    "query($id: UUID!) { job(id: $id) { status error { code } attempts { outcome } } }",
                    json!({"id": id}),
                )
                .await;
            let status = job["data"]["job"]["status"]
                .as_str()
                .unwrap_or_default()
                .to_owned();
            if status == "SUCCEEDED" {
                break;
            }
            assert!(
                status != "FAILED" && status != "CANCELLED",
                "a job failed during the outage: {job}"
            );
            assert!(Instant::now() < deadline, "never finished: {job}");
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }
    let calls: Vec<Value> = reqwest::get(format!("http://{provider}/_mock/calls"))
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let billed = calls
        .iter()
        .filter(|call| call["billed"] == json!(true))
        .count();
    assert_eq!(billed, ids.len(), "one billed call per job");
    let db = jobledger::db::connect(&database.url).await.unwrap();
    assert_billing_invariants(&db).await;
}
