//! The durable execution engine: retries by class, unknown outcomes and their cost
//! bounds, cancellation of running jobs, shutdown hand-back and lease expiry.

use crate::helpers::{
    AppOptions, Backend, TestApp, TestTenant, decimal, event_kinds, job_input, spawn_app,
    spawn_app_with, test_worker_settings,
};
use crate::invariants::assert_billing_invariants;
use entity::{Timestamp, jobs};
use jobledger::jobs::queue::{self, ClaimRequest};
use jobledger::jobs::worker::WorkerSettings;
use rust_decimal::Decimal;
use sea_orm::sea_query::Expr;
use sea_orm::{ColumnTrait, ConnectionTrait, EntityTrait, QueryFilter, TransactionTrait};
use serde_json::{Value, json};
use std::time::{Duration, Instant};
use uuid::Uuid;

on_both_backends!(
    a_rate_limit_is_retried_after_its_retry_after,
    a_late_finish_does_not_shorten_the_retry_after,
    a_dropped_connection_is_an_unknown_outcome_with_a_cost_bound,
    a_hung_call_times_out_as_unknown_and_is_retried,
    unknown_outcomes_are_not_retried_when_the_job_forbids_it,
    exhausted_attempts_fail_the_job_and_release_the_hold,
    cancelling_a_running_job_aborts_its_call,
    shutdown_hands_running_jobs_back_without_spending_an_attempt,
    a_lapsed_lease_is_taken_back_and_the_job_still_succeeds,
    claims_are_fair_across_tenants,
    shutdown_fails_a_job_that_forbids_retrying_unknown_outcomes,
    a_call_longer_than_the_lease_keeps_it_by_renewing,
    a_credentials_error_does_not_show_the_providers_text_to_the_tenant,
    a_cancel_before_the_call_means_no_call,
    a_tenant_runs_at_most_its_concurrency_bound,
    a_job_that_cannot_run_fails_instead_of_coming_back_for_ever,
    api_load_cannot_starve_the_workers,
);

const LIMIT: Duration = Duration::from_secs(30);

fn outcomes(job: &Value) -> Vec<String> {
    job["attempts"]
        .as_array()
        .unwrap()
        .iter()
        .map(|attempt| attempt["outcome"].as_str().unwrap().to_owned())
        .collect()
}

async fn run(app: &TestApp, tenant: &TestTenant, input: Value) -> Value {
    let id = app.create_job_ok(tenant, input).await;
    app.wait_until_finished(tenant, id, LIMIT).await
}

async fn a_rate_limit_is_retried_after_its_retry_after(backend: Backend) {
    let app = spawn_app(backend).await;
    let tenant = app.funded_tenant("acme", "5").await;
    let job = run(
        &app,
        &tenant,
        job_input(
            "limited",
            "hi [mock:status=429][mock:retry_after=2][mock:fail_first=1]",
        ),
    )
    .await;
    assert_eq!(job["status"], "SUCCEEDED", "{job}");
    assert_eq!(outcomes(&job), ["RETRYABLE_ERROR", "SUCCEEDED"]);
    assert_eq!(job["attempts"][0]["errorCode"], "PROVIDER_UNAVAILABLE");
    let first_finished: chrono::DateTime<chrono::Utc> = job["attempts"][0]["finishedAt"]
        .as_str()
        .unwrap()
        .parse()
        .unwrap();
    let second_started: chrono::DateTime<chrono::Utc> = job["attempts"][1]["startedAt"]
        .as_str()
        .unwrap()
        .parse()
        .unwrap();
    assert!(
        second_started - first_finished >= chrono::Duration::milliseconds(1_900),
        "the retry came before Retry-After: {first_finished} → {second_started}"
    );
    assert_billing_invariants(&app.app.db).await;
}

/// The wait a `Retry-After` asks for counts from when the call ended, and the attempt
/// says it ended then, however late its finish is written. (The attempt's end used to
/// be the instant the finisher wrote it: a finish held up behind another writer made a
/// correct retry look early — CI failed so under load. On SQLite the held write turn below delays the
/// finish before it reads the clock; on PostgreSQL the held row delays only its commit.)
async fn a_late_finish_does_not_shorten_the_retry_after(backend: Backend) {
    let app = spawn_app(backend).await;
    let tenant = app.funded_tenant("acme", "5").await;
    let id = app
        .create_job_ok(
            &tenant,
            job_input(
                "limited-late",
                "hi [mock:status=429][mock:retry_after=2][mock:fail_first=1][mock:delay_ms=600]",
            ),
        )
        .await;
    let started = Instant::now();
    while app.job(&tenant, id).await["status"] != "RUNNING" {
        assert!(started.elapsed() < LIMIT, "the job never started");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    // Another writer holds on past the call's end, so the finish waits for it.
    match app.app.db.get_database_backend() {
        sea_orm::DbBackend::Sqlite => {
            let turn = jobledger::db::begin_write(&app.app.db).await.unwrap();
            tokio::time::sleep(Duration::from_millis(1_400)).await;
            turn.rollback().await.unwrap();
        }
        _ => {
            let frozen = sea_orm::Database::connect(&app.database_url())
                .await
                .unwrap();
            let transaction = frozen.begin().await.unwrap();
            transaction
                .execute_unprepared(&format!("SELECT id FROM jobs WHERE id = '{id}' FOR UPDATE"))
                .await
                .unwrap();
            tokio::time::sleep(Duration::from_millis(1_400)).await;
            transaction.rollback().await.unwrap();
        }
    }
    let job = app.wait_until_finished(&tenant, id, LIMIT).await;
    assert_eq!(job["status"], "SUCCEEDED", "{job}");
    assert_eq!(outcomes(&job), ["RETRYABLE_ERROR", "SUCCEEDED"], "{job}");
    let at = |attempt: usize, field: &str| -> chrono::DateTime<chrono::Utc> {
        job["attempts"][attempt][field]
            .as_str()
            .unwrap()
            .parse()
            .unwrap()
    };
    let gap = at(1, "startedAt") - at(0, "finishedAt");
    assert!(
        gap >= chrono::Duration::milliseconds(1_900),
        "the retry came {gap} after the first attempt ended, before its Retry-After: {job}"
    );
    assert_billing_invariants(&app.app.db).await;
}

async fn a_dropped_connection_is_an_unknown_outcome_with_a_cost_bound(backend: Backend) {
    let app = spawn_app(backend).await;
    let tenant = app.funded_tenant("acme", "5").await;
    let job = run(
        &app,
        &tenant,
        job_input("dropped", "hi [mock:drop][mock:fail_first=1]"),
    )
    .await;
    assert_eq!(job["status"], "SUCCEEDED", "{job}");
    assert_eq!(outcomes(&job), ["UNKNOWN", "SUCCEEDED"]);
    let lost = &job["attempts"][0];
    assert_eq!(lost["errorCode"], "OUTCOME_UNKNOWN");
    assert!(
        lost["providerCost"].is_null(),
        "an unknown cost is not zero: {lost}"
    );
    let bound = decimal(&lost["providerCostUpperBound"]);
    assert!(bound > Decimal::ZERO);
    let cost = &job["cost"];
    assert_eq!(cost["unknownAttempts"], 1);
    assert_eq!(
        decimal(&cost["providerCostUpperBound"]),
        decimal(&cost["providerCost"]) + bound
    );
    // Both calls were billed by the provider; both attempts are on record.
    let billed = app.billed_calls();
    assert_eq!(billed, 2);
    assert_eq!(job["attempts"].as_array().unwrap().len(), billed);
    assert_billing_invariants(&app.app.db).await;
}

async fn a_hung_call_times_out_as_unknown_and_is_retried(backend: Backend) {
    let worker = WorkerSettings {
        attempt_timeout: Duration::from_secs(1),
        ..test_worker_settings()
    };
    let app = spawn_app_with(backend, AppOptions::workers(worker)).await;
    let tenant = app.funded_tenant("acme", "5").await;
    let job = run(
        &app,
        &tenant,
        job_input("hung", "hi [mock:hang][mock:fail_first=1]"),
    )
    .await;
    assert_eq!(job["status"], "SUCCEEDED", "{job}");
    assert_eq!(outcomes(&job), ["UNKNOWN", "SUCCEEDED"]);
    assert!(job["attempts"][0]["providerCostUpperBound"].is_string());
    assert_billing_invariants(&app.app.db).await;
}

async fn unknown_outcomes_are_not_retried_when_the_job_forbids_it(backend: Backend) {
    let app = spawn_app(backend).await;
    let tenant = app.funded_tenant("acme", "5").await;
    let mut input = job_input("pay-once", "hi [mock:drop]");
    input["retryUnknownOutcome"] = json!(false);
    let job = run(&app, &tenant, input).await;
    assert_eq!(job["status"], "FAILED");
    assert_eq!(job["error"]["code"], "OUTCOME_UNKNOWN");
    assert_eq!(outcomes(&job), ["UNKNOWN"]);
    assert!(job["charge"].is_null());
    assert_eq!(job["reservation"]["status"], "RELEASED");
    assert_eq!(job["cost"]["unknownAttempts"], 1);
    assert_eq!(app.simulator.calls().len(), 1, "no second call");
    assert_billing_invariants(&app.app.db).await;
}

async fn exhausted_attempts_fail_the_job_and_release_the_hold(backend: Backend) {
    let app = spawn_app(backend).await;
    let tenant = app.funded_tenant("acme", "5").await;
    let mut input = job_input("always-down", "hi [mock:status=503]");
    input["maxAttempts"] = json!(2);
    let job = run(&app, &tenant, input).await;
    assert_eq!(job["status"], "FAILED");
    assert_eq!(job["error"]["code"], "PROVIDER_UNAVAILABLE");
    assert_eq!(job["attemptCount"], 2);
    assert_eq!(outcomes(&job), ["RETRYABLE_ERROR", "RETRYABLE_ERROR"]);
    assert_eq!(
        decimal(&job["cost"]["providerCost"]),
        Decimal::ZERO,
        "error answers are not billed"
    );
    assert_eq!(
        job["reservation"]["releasedAmount"],
        job["reservation"]["amount"]
    );
    assert_eq!(
        decimal(&app.balance(&tenant).await["available"]),
        Decimal::from(5)
    );
    assert_billing_invariants(&app.app.db).await;
}

/// Polls until the job has an attempt running.
async fn wait_until_running(app: &TestApp, tenant: &TestTenant, id: Uuid) {
    let deadline = Instant::now() + LIMIT;
    loop {
        let job = app.job(tenant, id).await;
        if job["status"] == "RUNNING" && !job["attempts"].as_array().unwrap().is_empty() {
            return;
        }
        assert!(Instant::now() < deadline, "the job never started: {job}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

async fn cancelling_a_running_job_aborts_its_call(backend: Backend) {
    let app = spawn_app(backend).await;
    let tenant = app.funded_tenant("acme", "5").await;
    let id = app
        .create_job_ok(&tenant, job_input("long", "hi [mock:delay_ms=20000]"))
        .await;
    wait_until_running(&app, &tenant, id).await;
    let response = app
        .operation(Some(&tenant.key), "CancelJob", json!({"id": id}))
        .await;
    assert_eq!(
        response["data"]["cancelJob"]["cancelRequested"], true,
        "{response}"
    );
    // The call would take 20 s; the worker must abort it long before.
    let job = app
        .wait_until_finished(&tenant, id, Duration::from_secs(5))
        .await;
    assert_eq!(job["status"], "CANCELLED");
    assert_eq!(outcomes(&job), ["CANCELLED"]);
    assert!(
        job["attempts"][0]["providerCostUpperBound"].is_string(),
        "a cancelled call may still be billed"
    );
    // The default policy charges the prompt of a call cancelled after it was sent.
    assert!(decimal(&job["charge"]["amount"]) > Decimal::ZERO, "{job}");
    assert_eq!(job["reservation"]["status"], "SETTLED");
    let kinds = event_kinds(&job);
    assert_eq!(
        kinds,
        [
            "CREATED",
            "ATTEMPT_STARTED",
            "CANCEL_REQUESTED",
            "CANCELLED"
        ]
    );
    assert_billing_invariants(&app.app.db).await;
}

async fn shutdown_hands_running_jobs_back_without_spending_an_attempt(backend: Backend) {
    let worker = WorkerSettings {
        shutdown_grace: Duration::from_millis(500),
        ..test_worker_settings()
    };
    let app = spawn_app_with(backend, AppOptions::workers(worker)).await;
    let tenant = app.funded_tenant("acme", "5").await;
    // The first call hangs; the next one (on the restarted app) answers at once.
    let id = app
        .create_job_ok(
            &tenant,
            job_input("handed-back", "hi [mock:hang][mock:fail_first=1]"),
        )
        .await;
    wait_until_running(&app, &tenant, id).await;
    let app = app.restart(AppOptions::default()).await;
    let job = app.wait_until_finished(&tenant, id, LIMIT).await;
    assert_eq!(job["status"], "SUCCEEDED", "{job}");
    assert_eq!(outcomes(&job), ["UNKNOWN", "SUCCEEDED"]);
    assert_eq!(job["attempts"][0]["errorCode"], "WORKER_SHUTDOWN");
    assert!(job["attempts"][0]["providerCostUpperBound"].is_string());
    assert_eq!(
        job["attemptCount"], 1,
        "the handed-back attempt does not count"
    );
    let kinds = event_kinds(&job);
    assert_eq!(
        kinds,
        [
            "CREATED",
            "ATTEMPT_STARTED",
            "RETRY_SCHEDULED",
            "ATTEMPT_STARTED",
            "SUCCEEDED"
        ]
    );
    let calls = app.simulator.calls();
    assert_eq!(calls.len(), 2, "one aborted call, one answered: {calls:?}");
    assert!(calls[0].billed, "the provider bills the call it started");
    assert_billing_invariants(&app.app.db).await;
}

async fn a_lapsed_lease_is_taken_back_and_the_job_still_succeeds(backend: Backend) {
    let app = spawn_app_with(backend, AppOptions::no_workers()).await;
    let tenant = app.funded_tenant("acme", "5").await;
    let id = app
        .create_job_ok(&tenant, job_input("orphan", "hello"))
        .await;
    // A worker claims the job and dies without a word: its lease is in the past.
    let claim = queue::claim(&app.app.db, ClaimRequest::new(1, Duration::from_secs(60)))
        .await
        .unwrap()
        .remove(0);
    assert_eq!(claim.job.id, id);
    jobs::Entity::update_many()
        .col_expr(
            jobs::Column::LeaseUntil,
            Expr::value(Timestamp::now().plus(chrono::Duration::seconds(-1))),
        )
        .filter(jobs::Column::Id.eq(id))
        .exec(&app.app.db)
        .await
        .unwrap();
    let app = app.restart(AppOptions::default()).await;
    let job = app.wait_until_finished(&tenant, id, LIMIT).await;
    assert_eq!(job["status"], "SUCCEEDED", "{job}");
    assert_eq!(
        job["attemptCount"], 1,
        "a claim that never started an attempt does not count"
    );
    let kinds = event_kinds(&job);
    assert_eq!(
        kinds,
        ["CREATED", "RETRY_SCHEDULED", "ATTEMPT_STARTED", "SUCCEEDED"]
    );
    assert_billing_invariants(&app.app.db).await;
}

/// When each job's accepted attempt started and finished.
async fn attempt_spans(
    app: &TestApp,
    tenant: &TestTenant,
    ids: &[Uuid],
) -> Vec<(chrono::DateTime<chrono::Utc>, chrono::DateTime<chrono::Utc>)> {
    let mut spans = Vec::new();
    for id in ids {
        let job = app.wait_until_finished(tenant, *id, LIMIT).await;
        assert_eq!(job["status"], "SUCCEEDED", "{job}");
        let attempt = &job["attempts"][0];
        spans.push((
            attempt["startedAt"].as_str().unwrap().parse().unwrap(),
            attempt["finishedAt"].as_str().unwrap().parse().unwrap(),
        ));
    }
    spans.sort();
    spans
}

async fn claims_are_fair_across_tenants(backend: Backend) {
    let app = spawn_app_with(backend, AppOptions::no_workers()).await;
    let busy = app.funded_tenant("busy", "50").await;
    let quiet = app.funded_tenant("quiet", "5").await;
    let mut busy_jobs = Vec::new();
    for index in 0..20 {
        busy_jobs.push(
            app.create_job_ok(
                &busy,
                job_input(&format!("bulk-{index}"), "hi [mock:delay_ms=200]"),
            )
            .await,
        );
    }
    // The quiet tenant's only job is the newest of all.
    let quiet_job = app
        .create_job_ok(&quiet, job_input("single", "hi [mock:delay_ms=200]"))
        .await;
    let worker = WorkerSettings {
        concurrency: 2,
        ..test_worker_settings()
    };
    let app = app.restart(AppOptions::workers(worker)).await;

    let quiet_started = attempt_spans(&app, &quiet, &[quiet_job]).await[0].0;
    let busy_spans = attempt_spans(&app, &busy, &busy_jobs).await;
    let busy_before = busy_spans
        .iter()
        .filter(|(started, _)| *started < quiet_started)
        .count();
    assert!(
        busy_before <= 1,
        "{busy_before} of the busy tenant's jobs started before the quiet tenant's only job"
    );
    assert_billing_invariants(&app.app.db).await;
}

async fn a_tenant_runs_at_most_its_concurrency_bound(backend: Backend) {
    let app = spawn_app_with(backend, AppOptions::no_workers()).await;
    let bounded = app.funded_tenant("bounded", "5").await;
    let other = app.funded_tenant("other", "5").await;
    let mut bounded_jobs = Vec::new();
    for index in 0..3 {
        bounded_jobs.push(
            app.create_job_ok(
                &bounded,
                job_input(&format!("one-at-a-time-{index}"), "hi [mock:delay_ms=400]"),
            )
            .await,
        );
    }
    let other_job = app
        .create_job_ok(&other, job_input("alongside", "hi [mock:delay_ms=400]"))
        .await;
    let worker = WorkerSettings {
        concurrency: 4,
        tenant_concurrency: Some(1),
        ..test_worker_settings()
    };
    let app = app.restart(AppOptions::workers(worker)).await;

    let spans = attempt_spans(&app, &bounded, &bounded_jobs).await;
    for pair in spans.windows(2) {
        assert!(
            pair[1].0 >= pair[0].1,
            "two of one tenant's jobs overlapped: {pair:?}"
        );
    }
    // The bound is per tenant: another tenant's job runs beside the first one.
    let other_span = attempt_spans(&app, &other, &[other_job]).await[0];
    assert!(
        other_span.0 < spans[0].1,
        "the other tenant waited for the bounded one: {other_span:?} vs {spans:?}"
    );
}

async fn shutdown_fails_a_job_that_forbids_retrying_unknown_outcomes(backend: Backend) {
    let worker = WorkerSettings {
        shutdown_grace: Duration::from_millis(300),
        ..test_worker_settings()
    };
    let app = spawn_app_with(backend, AppOptions::workers(worker)).await;
    let tenant = app.funded_tenant("acme", "5").await;
    let mut input = job_input("pay-once", "hi [mock:hang]");
    input["retryUnknownOutcome"] = json!(false);
    let id = app.create_job_ok(&tenant, input).await;
    wait_until_running(&app, &tenant, id).await;
    let app = app.restart(AppOptions::default()).await;
    let job = app.wait_until_finished(&tenant, id, LIMIT).await;
    assert_eq!(job["status"], "FAILED", "{job}");
    assert_eq!(job["error"]["code"], "OUTCOME_UNKNOWN");
    assert_eq!(outcomes(&job), ["UNKNOWN"]);
    assert_eq!(
        app.simulator.calls().len(),
        1,
        "the request was not sent a second time"
    );
    assert_billing_invariants(&app.app.db).await;
}

async fn a_cancel_before_the_call_means_no_call(backend: Backend) {
    let app = spawn_app_with(backend, AppOptions::no_workers()).await;
    let tenant = app.funded_tenant("acme", "5").await;
    let id = app
        .create_job_ok(&tenant, job_input("cancelled-early", "hello"))
        .await;
    // The state a cancel leaves when it lands between a claim and the attempt's start.
    jobs::Entity::update_many()
        .col_expr(jobs::Column::CancelRequested, Expr::value(true))
        .filter(jobs::Column::Id.eq(id))
        .exec(&app.app.db)
        .await
        .unwrap();
    let app = app.restart(AppOptions::default()).await;
    let job = app.wait_until_finished(&tenant, id, LIMIT).await;
    assert_eq!(job["status"], "CANCELLED", "{job}");
    assert_eq!(outcomes(&job), ["CANCELLED"]);
    assert_eq!(
        decimal(&job["attempts"][0]["providerCost"]),
        Decimal::ZERO,
        "nothing was sent"
    );
    assert!(
        app.simulator.calls().is_empty(),
        "the provider was called for a cancelled job"
    );
    assert_eq!(job["reservation"]["status"], "RELEASED");
    assert_billing_invariants(&app.app.db).await;
}

async fn a_call_longer_than_the_lease_keeps_it_by_renewing(backend: Backend) {
    let worker = WorkerSettings {
        lease: Duration::from_secs(1),
        poll_interval: Duration::from_millis(50),
        ..test_worker_settings()
    };
    let app = spawn_app_with(backend, AppOptions::workers(worker)).await;
    let tenant = app.funded_tenant("acme", "5").await;
    // Three leases long: without renewal the worker's own sweep would take it back.
    let job = run(
        &app,
        &tenant,
        job_input("long-call", "hi [mock:delay_ms=3000]"),
    )
    .await;
    assert_eq!(job["status"], "SUCCEEDED", "{job}");
    assert_eq!(
        outcomes(&job),
        ["SUCCEEDED"],
        "one attempt, never taken back"
    );
    assert_eq!(app.simulator.calls().len(), 1);
    assert_billing_invariants(&app.app.db).await;
}

async fn a_credentials_error_does_not_show_the_providers_text_to_the_tenant(backend: Backend) {
    let app = spawn_app(backend).await;
    let tenant = app.funded_tenant("acme", "5").await;
    let job = run(&app, &tenant, job_input("bad-key", "hi [mock:status=401]")).await;
    assert_eq!(job["status"], "FAILED");
    assert_eq!(job["error"]["code"], "PROVIDER_REJECTED");
    let message = job["error"]["message"].as_str().unwrap();
    assert!(message.contains("operator has the details"), "{message}");
    assert_eq!(job["attempts"][0]["errorCode"], "PROVIDER_REJECTED");
    // A refusal of the request itself (400) stays readable: the tenant can fix it.
    let job = run(
        &app,
        &tenant,
        job_input("bad-request", "hi [mock:status=400]"),
    )
    .await;
    let message = job["error"]["message"].as_str().unwrap();
    assert!(!message.contains("operator has the details"), "{message}");
}

/// A job whose stored input no worker can read (here: corrupted by hand) fails once,
/// with its hold released and no call made, instead of being claimed, abandoned to
/// lease expiry and handed back uncounted for ever.
async fn a_job_that_cannot_run_fails_instead_of_coming_back_for_ever(backend: Backend) {
    let api = spawn_app_with(backend, AppOptions::no_workers()).await;
    let tenant = api.funded_tenant("acme", "5").await;
    let id = api
        .create_job_ok(&tenant, job_input("corrupt", "hello"))
        .await;
    jobs::Entity::update_many()
        .col_expr(
            jobs::Column::Input,
            Expr::value(entity::JsonText(json!({"not": "a job input"}))),
        )
        .filter(jobs::Column::Id.eq(id))
        .exec(&api.app.db)
        .await
        .unwrap();
    let workers = api.another_process(AppOptions::default()).await;
    let job = api.wait_until_finished(&tenant, id, LIMIT).await;
    assert_eq!(job["status"], "FAILED", "{job}");
    assert_eq!(job["error"]["code"], "NOT_RUNNABLE", "{job}");
    assert!(job["attempts"].as_array().unwrap().is_empty(), "{job}");
    assert_eq!(job["reservation"]["status"], "RELEASED");
    assert!(api.simulator.calls().is_empty());
    assert_eq!(event_kinds(&job), ["CREATED", "FAILED"]);
    assert_billing_invariants(&api.app.db).await;
    drop(workers);
}

/// The workers of a `serve` have a pool of their own: with every connection of the
/// API's pool taken (as a burst of slow requests would take them), a running job
/// still renews its lease, finishes and settles.
async fn api_load_cannot_starve_the_workers(backend: Backend) {
    let app = spawn_app(backend).await;
    let tenant = app.funded_tenant("acme", "5").await;
    let id = app
        .create_job_ok(&tenant, job_input("starved", "hello [mock:delay_ms=1000]"))
        .await;
    // Every connection the pool will give (the LISTEN connection may hold one).
    let mut held = Vec::new();
    while let Ok(transaction) =
        tokio::time::timeout(Duration::from_millis(500), app.app.db.begin()).await
    {
        held.push(transaction.unwrap());
    }
    assert!(held.len() as u32 >= jobledger::db::POOL_SIZE - 1);
    // Watched through a connection of its own: the API's pool is all taken.
    let observer = jobledger::db::connect(&app.database_url()).await.unwrap();
    let started = Instant::now();
    let finished = loop {
        let job = jobs::Entity::find_by_id(id)
            .one(&observer)
            .await
            .unwrap()
            .unwrap();
        if job.status.is_terminal() {
            break job;
        }
        assert!(
            started.elapsed() < Duration::from_secs(15),
            "the job did not finish while the API's pool was taken: {:?}",
            job.status
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    assert_eq!(finished.status, entity::JobStatus::Succeeded);
    drop(held);
    assert_billing_invariants(&observer).await;
}
