//! Several processes on one PostgreSQL database: event notices cross between them
//! through LISTEN/NOTIFY, so pickup and cancellation do not wait for a poll or a
//! lease renewal.

use crate::helpers::{AppOptions, Backend, job_input, spawn_app_with, test_worker_settings};
use crate::invariants::assert_billing_invariants;
use jobledger::jobs::worker::WorkerSettings;
use serde_json::json;
use std::time::{Duration, Instant};

/// Workers that would take a minute to notice anything without a notification.
fn deaf_worker() -> WorkerSettings {
    WorkerSettings {
        lease: Duration::from_secs(60),
        poll_interval: Duration::from_secs(60),
        ..test_worker_settings()
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn notices_cross_processes_for_pickup_and_cancel() {
    let Some(backend @ Backend::Postgres(_)) = Backend::postgres() else {
        return;
    };
    let api = spawn_app_with(backend, AppOptions::no_workers()).await;
    let workers = api
        .another_process(AppOptions::workers(deaf_worker()))
        .await;
    let tenant = api.funded_tenant("acme", "5").await;

    // Created on the API process, run by the worker process long before its poll.
    let quick = api
        .create_job_ok(&tenant, job_input("quick", "hello"))
        .await;
    let job = api
        .wait_until_finished(&tenant, quick, Duration::from_secs(15))
        .await;
    assert_eq!(job["status"], "SUCCEEDED", "{job}");

    // Cancelled on the API process, aborted by the worker process long before its
    // next lease renewal (every 20 s here).
    let long = api
        .create_job_ok(&tenant, job_input("long", "hello [mock:hang]"))
        .await;
    let deadline = Instant::now() + Duration::from_secs(15);
    while api.job(&tenant, long).await["attempts"]
        .as_array()
        .unwrap()
        .is_empty()
    {
        assert!(Instant::now() < deadline, "the long job never started");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let cancel = api
        .operation(Some(&tenant.key), "CancelJob", json!({"id": long}))
        .await;
    assert_eq!(
        cancel["data"]["cancelJob"]["cancelRequested"], true,
        "{cancel}"
    );
    let job = api
        .wait_until_finished(&tenant, long, Duration::from_secs(10))
        .await;
    assert_eq!(job["status"], "CANCELLED", "{job}");
    assert_eq!(job["attempts"][0]["outcome"], "CANCELLED");
    assert_billing_invariants(&api.app.db).await;
    drop(workers);
}

on_both_backends!(concurrent_migrations_of_a_fresh_database_all_succeed);

/// Processes deployed together race to migrate a fresh database: each waits for the
/// other (an advisory lock on PostgreSQL, the write lock on SQLite) and all succeed.
async fn concurrent_migrations_of_a_fresh_database_all_succeed(backend: Backend) {
    let database = crate::helpers::TestDatabase::create(&backend).await;
    let migrations: Vec<_> = (0..3)
        .map(|_| {
            tokio::process::Command::new(env!("CARGO_BIN_EXE_jobledger"))
                .args(["migrate", "--database-url", &database.url])
                .output()
        })
        .collect();
    for output in futures_util::future::join_all(migrations).await {
        let output = output.expect("the binary runs");
        assert!(
            output.status.success(),
            "a concurrent migrate failed: {}",
            String::from_utf8_lossy(&output.stderr)
        );
    }
    let db = jobledger::db::connect(&database.url).await.unwrap();
    jobledger::db::migrate(&db)
        .await
        .expect("nothing is left to apply");
    assert_billing_invariants(&db).await;
}
