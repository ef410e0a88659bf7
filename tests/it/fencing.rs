//! Fencing by run token: an attempt that lost its job writes nothing, and concurrent
//! claims never hand one job to two attempts.

use crate::helpers::{
    AppOptions, Backend, TestApp, job_input, spawn_app_with, test_worker_settings,
};
use crate::invariants::assert_billing_invariants;
use entity::JobErrorCode;
use entity::{
    AttemptOutcome, JobStatus, ReservationStatus, Timestamp, attempts, charges,
    credit_reservations, job_events, jobs, ledger_entries,
};
use jobledger::billing::{Credits, ModelPrice, prices};
use jobledger::jobs::input::JobInput;
use jobledger::jobs::lifecycle::{AttemptReport, JobError, JobOutcome};
use jobledger::jobs::queue::{self, AttemptStart, Claim, ClaimRequest, Renewal};
use jobledger::jobs::worker::{Worker, WorkerSettings};
use jobledger::llm::TokenUsage;
use sea_orm::sea_query::Expr;
use sea_orm::{ColumnTrait, EntityTrait, PaginatorTrait, QueryFilter};
use serde_json::json;
use std::collections::HashSet;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;
use tokio_util::sync::CancellationToken;
use uuid::Uuid;

on_both_backends!(
    a_cancel_the_worker_missed_wins_over_a_retry,
    a_stale_run_token_cannot_renew_start_or_finish,
    concurrent_claims_never_share_a_job,
    a_worker_renews_all_its_leases_in_one_statement_a_round,
);

const LEASE: Duration = Duration::from_secs(30);

pub async fn attempt_start(app: &TestApp, claim: &Claim) -> AttemptStart {
    let price: ModelPrice = prices::price_at(&app.app.db, &claim.job.model, Timestamp::now())
        .await
        .unwrap()
        .unwrap();
    let input: JobInput = serde_json::from_value(claim.job.input.0.clone()).unwrap();
    // The tests' models are served by the simulator, which counts a quarter of the bytes.
    let bound = input.call_bound(jobledger::llm::PromptCounting::QuarterBytes, "gpt-4o-mini");
    AttemptStart {
        worker_id: "test-worker".into(),
        provider: Some("simulator".into()),
        provider_cost_bound: bound.provider_cost(&price),
        customer_charge_bound: bound.customer_cost(&price),
        customer_charge_if_lost: Credits::ZERO,
        price,
    }
}

pub fn success_report(price: &ModelPrice) -> AttemptReport {
    let usage = TokenUsage {
        input_tokens: 10,
        cached_input_tokens: 0,
        output_tokens: 5,
    };
    AttemptReport {
        outcome: AttemptOutcome::Succeeded,
        usage: Some(usage),
        not_billed: false,
        customer_charge: price.customer_charge(&usage),
        delivered_output_tokens: None,
        error: None,
        provider_request_id: Some("req-stale".into()),
        latency: Duration::from_millis(5),
        ended_at: Timestamp::now(),
        model_paused_until: None,
        wait: false,
    }
}

/// Everything a stale finish could touch.
async fn snapshot(
    app: &TestApp,
    job_id: Uuid,
) -> (jobs::Model, u64, u64, u64, credit_reservations::Model) {
    let db = &app.app.db;
    (
        jobs::Entity::find_by_id(job_id)
            .one(db)
            .await
            .unwrap()
            .unwrap(),
        job_events::Entity::find()
            .filter(job_events::Column::JobId.eq(job_id))
            .count(db)
            .await
            .unwrap(),
        ledger_entries::Entity::find().count(db).await.unwrap(),
        charges::Entity::find().count(db).await.unwrap(),
        credit_reservations::Entity::find()
            .filter(credit_reservations::Column::JobId.eq(job_id))
            .one(db)
            .await
            .unwrap()
            .unwrap(),
    )
}

async fn a_stale_run_token_cannot_renew_start_or_finish(backend: Backend) {
    let app = spawn_app_with(backend, AppOptions::no_workers()).await;
    let db = &app.app.db;
    let tenant = app.funded_tenant("acme", "5").await;
    let job_id = app
        .create_job_ok(&tenant, job_input("fenced", "hello"))
        .await;

    let stale = queue::claim(db, ClaimRequest::new(1, LEASE))
        .await
        .unwrap()
        .remove(0);
    let start = attempt_start(&app, &stale).await;
    let stale_attempt = queue::start_attempt(db, &stale, &start)
        .await
        .unwrap()
        .unwrap()
        .attempt;

    // The stale worker freezes; its lease passes and the job is taken back and claimed
    // by a fresh attempt.
    jobs::Entity::update_many()
        .col_expr(
            jobs::Column::LeaseUntil,
            Expr::value(Timestamp::now().plus(chrono::Duration::seconds(-1))),
        )
        .filter(jobs::Column::Id.eq(job_id))
        .exec(db)
        .await
        .unwrap();
    let taken_back = queue::expire_leases(db, &Default::default()).await.unwrap();
    assert_eq!(taken_back.len(), 1);
    let fresh = queue::claim(db, ClaimRequest::new(1, LEASE))
        .await
        .unwrap()
        .remove(0);
    assert_eq!(fresh.job.id, job_id);
    assert_ne!(fresh.run_token, stale.run_token);
    assert_eq!(fresh.job.attempt_count, 2);
    let fresh_attempt = queue::start_attempt(db, &fresh, &start)
        .await
        .unwrap()
        .unwrap()
        .attempt;

    let before = snapshot(&app, job_id).await;
    assert_eq!(
        crate::helpers::renew_lease(db, &stale, LEASE).await,
        Renewal::Lost
    );
    assert!(
        queue::start_attempt(db, &stale, &start)
            .await
            .unwrap()
            .is_none()
    );
    let outcomes = [
        JobOutcome::Succeeded {
            result: json!("stale"),
        },
        JobOutcome::Failed(JobError::new(JobErrorCode::ProviderRejected, "stale")),
        JobOutcome::Cancelled,
        JobOutcome::Retry {
            at: Timestamp::now(),
            model: None,
        },
    ];
    for outcome in outcomes {
        let finished = queue::finish_attempt(
            db,
            &stale,
            &stale_attempt,
            &start.price,
            success_report(&start.price),
            outcome,
        )
        .await
        .unwrap();
        assert!(finished.is_none(), "a stale attempt finished the job");
    }
    let after = snapshot(&app, job_id).await;
    assert_eq!(before, after, "a stale attempt wrote something");
    assert_eq!(after.0.status, JobStatus::Running);
    assert_eq!(after.0.run_token, Some(fresh.run_token));
    assert_eq!(after.4.status, ReservationStatus::Held);
    let stale_row = attempts::Entity::find_by_id(stale_attempt.id)
        .one(db)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(stale_row.outcome, AttemptOutcome::LeaseExpired);
    assert!(stale_row.provider_cost_nanos.is_none());
    assert_eq!(
        stale_row.provider_cost_upper_bound_nanos,
        Some(start.provider_cost_bound.nanos())
    );
    assert!(
        stale_row.provider_request_id.is_none(),
        "the stale report was not recorded"
    );

    // The owner of the job finishes it normally.
    let report = success_report(&start.price);
    let finished = queue::finish_attempt(
        db,
        &fresh,
        &fresh_attempt,
        &start.price,
        report,
        JobOutcome::Succeeded {
            result: json!("fresh"),
        },
    )
    .await
    .unwrap();
    assert!(finished.is_some());
    let job = app.job(&tenant, job_id).await;
    assert_eq!(job["status"], "SUCCEEDED");
    assert_eq!(job["result"], "fresh");
    assert_eq!(
        job["cost"]["unknownAttempts"], 1,
        "the lost attempt keeps its bound"
    );
    assert_billing_invariants(db).await;
}

async fn concurrent_claims_never_share_a_job(backend: Backend) {
    let app = spawn_app_with(backend, AppOptions::no_workers()).await;
    let tenant = app.funded_tenant("acme", "50").await;
    for index in 0..40 {
        app.create_job_ok(&tenant, job_input(&format!("claim-{index}"), "hello"))
            .await;
    }
    let claims = futures_util::future::join_all(
        (0..8).map(|_| queue::claim(&app.app.db, ClaimRequest::new(7, LEASE))),
    )
    .await;
    let mut seen = HashSet::new();
    let mut total = 0;
    for claimed in claims {
        let claimed = claimed.expect("a claim failed");
        assert!(claimed.len() <= 7, "a claim took more than its limit");
        for claim in claimed {
            total += 1;
            assert!(
                seen.insert(claim.job.id),
                "job {} was claimed twice",
                claim.job.id
            );
            assert_eq!(claim.job.status, JobStatus::Running);
            assert_eq!(claim.job.attempt_count, 1);
        }
    }
    assert_eq!(total, 40, "8 claims of 7 take all 40 jobs");
    let running = jobs::Entity::find()
        .filter(jobs::Column::Status.eq(JobStatus::Running))
        .count(&app.app.db)
        .await
        .unwrap();
    assert_eq!(running, 40);
    assert!(
        queue::claim(&app.app.db, ClaimRequest::new(5, LEASE))
            .await
            .unwrap()
            .is_empty()
    );
}

/// A cancel lands while the call runs and the worker never notices (another process,
/// or the call failing at that moment): whatever the attempt proposes next — a retry,
/// a hand-back, or its lease lapsing — the job ends cancelled and is never run again.
async fn a_cancel_the_worker_missed_wins_over_a_retry(backend: Backend) {
    let app = spawn_app_with(backend, AppOptions::no_workers()).await;
    let db = &app.app.db;
    let tenant = app.funded_tenant("acme", "5").await;
    let proposals = [
        (
            "retry",
            Some(JobOutcome::Retry {
                at: Timestamp::now(),
                model: None,
            }),
        ),
        ("hand-back", Some(JobOutcome::HandBack)),
        ("lease-lapse", None),
    ];
    for (key, proposal) in proposals {
        let job_id = app.create_job_ok(&tenant, job_input(key, "hello")).await;
        let claim = queue::claim(db, ClaimRequest::new(1, LEASE))
            .await
            .unwrap()
            .remove(0);
        let start = attempt_start(&app, &claim).await;
        let attempt = queue::start_attempt(db, &claim, &start)
            .await
            .unwrap()
            .unwrap()
            .attempt;
        let cancel = app
            .operation(Some(&tenant.key), "CancelJob", json!({"id": job_id}))
            .await;
        assert_eq!(cancel["data"]["cancelJob"]["status"], "RUNNING", "{cancel}");
        assert_eq!(cancel["data"]["cancelJob"]["cancelRequested"], true);
        match proposal {
            Some(outcome) => {
                let report = AttemptReport {
                    outcome: AttemptOutcome::RetryableError,
                    usage: None,
                    not_billed: true,
                    customer_charge: Credits::ZERO,
                    delivered_output_tokens: None,
                    error: Some(JobError::new(JobErrorCode::ProviderUnavailable, "503")),
                    provider_request_id: None,
                    latency: Duration::from_millis(5),
                    ended_at: Timestamp::now(),
                    model_paused_until: None,
                    wait: false,
                };
                let finished =
                    queue::finish_attempt(db, &claim, &attempt, &start.price, report, outcome)
                        .await
                        .unwrap();
                assert!(finished.is_some());
            }
            None => {
                jobs::Entity::update_many()
                    .col_expr(
                        jobs::Column::LeaseUntil,
                        Expr::value(Timestamp::now().plus(chrono::Duration::seconds(-1))),
                    )
                    .filter(jobs::Column::Id.eq(job_id))
                    .exec(db)
                    .await
                    .unwrap();
                assert_eq!(
                    queue::expire_leases(db, &Default::default())
                        .await
                        .unwrap()
                        .len(),
                    1
                );
            }
        }
        let job = app.job(&tenant, job_id).await;
        assert_eq!(job["status"], "CANCELLED", "{key}: {job}");
        assert_eq!(job["reservation"]["status"], "RELEASED", "{key}");
        assert!(
            queue::claim(db, ClaimRequest::new(5, LEASE))
                .await
                .unwrap()
                .is_empty(),
            "{key}: a cancelled job was claimed again"
        );
    }
    assert_billing_invariants(db).await;
}

/// A worker renews the leases of all its running attempts together: one statement a
/// round, however many attempts run, and every lease holds through calls longer than
/// the lease itself.
async fn a_worker_renews_all_its_leases_in_one_statement_a_round(backend: Backend) {
    const JOBS: usize = 12;
    let app = spawn_app_with(backend, AppOptions::no_workers()).await;
    let tenant = app.funded_tenant("acme", "50").await;
    let mut ids = Vec::new();
    for n in 0..JOBS {
        ids.push(
            app.create_job_ok(
                &tenant,
                job_input(&format!("lease-{n}"), "hi [mock:delay_ms=3000]"),
            )
            .await,
        );
    }
    let renewals = Arc::new(AtomicUsize::new(0));
    let counter = renewals.clone();
    let mut db = app.app.db.clone();
    // The clone's own callback: only the worker below is counted.
    db.set_metric_callback(move |info| {
        // A renewal, batched or not, sets the lease and nothing else; a claim sets
        // the status first.
        if info
            .statement
            .sql
            .starts_with(r#"UPDATE "jobs" SET "lease_until" = "#)
        {
            counter.fetch_add(1, Ordering::SeqCst);
        }
    });
    let lease = Duration::from_millis(1_500);
    let worker = Worker::new(
        "counted".into(),
        db,
        app.app.bus.clone(),
        app.app.providers.clone(),
        WorkerSettings {
            concurrency: JOBS,
            lease,
            ..test_worker_settings()
        },
        app.app.metrics.clone(),
    );
    let stop = CancellationToken::new();
    let running = tokio::spawn(worker.run(stop.clone()));
    for id in &ids {
        let job = app
            .wait_until_finished(&tenant, *id, Duration::from_secs(30))
            .await;
        assert_eq!(job["status"], "SUCCEEDED", "{job}");
        assert_eq!(
            job["attempts"].as_array().unwrap().len(),
            1,
            "the lease held through a call twice its length: {job}"
        );
    }
    stop.cancel();
    running.await.unwrap();
    // Calls of 3 s with a round every 0.5 s: about 6 rounds (some more while jobs
    // start and finish at slightly different times); one statement per attempt and
    // round would be about 72.
    let statements = renewals.load(Ordering::SeqCst);
    assert!(
        (3..=JOBS * 2).contains(&statements),
        "{statements} renewal statements for {JOBS} attempts"
    );
    assert_billing_invariants(&app.app.db).await;
}
