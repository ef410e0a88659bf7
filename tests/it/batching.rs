//! Batched starts and finishes: a claimed batch starts in one transaction, and attempts
//! that end together finish in one — in statements that do not grow per job, each job
//! still fenced by its own run token and settled exactly once.

use crate::fencing::{attempt_start, success_report};
use crate::helpers::{AppOptions, Backend, TestApp, job_input, spawn_app_with};
use crate::invariants::assert_billing_invariants;
use entity::JobErrorCode;
use entity::{JobStatus, Timestamp, charges, jobs};
use jobledger::jobs::lifecycle::{JobError, JobOutcome};
use jobledger::jobs::queue::{self, AttemptEnd, AttemptStart, Claim, ClaimRequest, StartedAttempt};
use sea_orm::sea_query::Expr;
use sea_orm::{ColumnTrait, DatabaseConnection, EntityTrait, PaginatorTrait, QueryFilter};
use serde_json::json;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;
use uuid::Uuid;

on_both_backends!(
    a_batch_starts_and_finishes_in_statements_that_do_not_grow_per_job,
    a_group_finishes_each_job_by_its_own_claim,
);

const LEASE: Duration = Duration::from_secs(30);

/// A clone of the app's database that counts the statements run through it.
fn counted(db: &DatabaseConnection) -> (DatabaseConnection, Arc<AtomicUsize>) {
    let statements = Arc::new(AtomicUsize::new(0));
    let counter = statements.clone();
    let mut db = db.clone();
    db.set_metric_callback(move |_| {
        counter.fetch_add(1, Ordering::SeqCst);
    });
    (db, statements)
}

async fn start_all(
    app: &TestApp,
    db: &DatabaseConnection,
    claims: &[Claim],
) -> Vec<(AttemptStart, StartedAttempt)> {
    let mut starts = Vec::new();
    for claim in claims {
        starts.push(attempt_start(app, claim).await);
    }
    let pairs: Vec<_> = claims.iter().zip(&starts).collect();
    let started = queue::start_attempts(db, &pairs).await.unwrap();
    starts
        .into_iter()
        .zip(started)
        .map(|(start, started)| (start, started.expect("every claim owns its job")))
        .collect()
}

fn end(
    claim: &Claim,
    start: &AttemptStart,
    started: &StartedAttempt,
    outcome: JobOutcome,
) -> AttemptEnd {
    AttemptEnd {
        claim: claim.clone(),
        attempt: started.attempt.clone(),
        price: start.price.clone(),
        report: success_report(&start.price),
        outcome,
    }
}

async fn a_batch_starts_and_finishes_in_statements_that_do_not_grow_per_job(backend: Backend) {
    const JOBS: usize = 24;
    let app = spawn_app_with(backend, AppOptions::no_workers()).await;
    let tenants = [
        app.funded_tenant("acme", "50").await,
        app.funded_tenant("globex", "50").await,
    ];
    for index in 0..JOBS {
        let tenant = &tenants[index % 2];
        app.create_job_ok(tenant, job_input(&format!("batch-{index}"), "hello"))
            .await;
    }
    let claims = queue::claim(&app.app.db, ClaimRequest::new(JOBS as u32, LEASE))
        .await
        .unwrap();
    assert_eq!(claims.len(), JOBS);
    let (db, statements) = counted(&app.app.db);
    let started = start_all(&app, &db, &claims).await;
    let start_statements = statements.swap(0, Ordering::SeqCst);
    // Claimed jobs, their attempts so far, their holds, the attempt rows, the events.
    assert!(
        start_statements <= 6,
        "{start_statements} statements to start {JOBS} attempts"
    );
    let ends: Vec<AttemptEnd> = claims
        .iter()
        .zip(&started)
        .enumerate()
        .map(|(index, (claim, (start, started)))| {
            let outcome = match index % 3 {
                0 => JobOutcome::Succeeded {
                    result: json!(format!("answer {index}")),
                },
                1 => JobOutcome::Retry {
                    at: Timestamp::now(),
                    model: None,
                },
                _ => JobOutcome::Failed(JobError::new(JobErrorCode::ProviderRejected, "no")),
            };
            end(claim, start, started, outcome)
        })
        .collect();
    let finished = queue::finish_attempts(&db, &ends).await.unwrap();
    let finish_statements = statements.load(Ordering::SeqCst);
    assert!(finished.iter().all(Option::is_some));
    // A fixed number for the whole group (one statement per kind of row, the
    // tenants' rows once each); finishing them one by one took a dozen each.
    assert!(
        finish_statements <= 20,
        "{finish_statements} statements to finish {JOBS} attempts"
    );
    for (index, claim) in claims.iter().enumerate() {
        let job = jobs::Entity::find_by_id(claim.job.id)
            .one(&app.app.db)
            .await
            .unwrap()
            .unwrap();
        let expected = [JobStatus::Succeeded, JobStatus::Queued, JobStatus::Failed][index % 3];
        assert_eq!(job.status, expected, "job {index}");
    }
    assert_billing_invariants(&app.app.db).await;
}

/// Marks a claimed job's lease as passed, takes it back and claims it again.
async fn lose_and_reclaim(db: &DatabaseConnection, job_id: Uuid) -> Claim {
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
    let fresh = queue::claim(db, ClaimRequest::new(1, LEASE))
        .await
        .unwrap()
        .remove(0);
    assert_eq!(fresh.job.id, job_id);
    fresh
}

async fn a_group_finishes_each_job_by_its_own_claim(backend: Backend) {
    let app = spawn_app_with(backend, AppOptions::no_workers()).await;
    let db = &app.app.db;
    let tenant = app.funded_tenant("acme", "50").await;
    let mut ids = Vec::new();
    for name in ["lost", "cancelled", "succeeded", "retried", "handed-back"] {
        ids.push(app.create_job_ok(&tenant, job_input(name, "hello")).await);
    }
    let mut claims = queue::claim(db, ClaimRequest::new(5, LEASE)).await.unwrap();
    claims.sort_by_key(|claim| ids.iter().position(|id| *id == claim.job.id));
    let started = start_all(&app, db, &claims).await;

    // The first job's claim is lost and the job claimed again; both attempts end in
    // the same group.
    let fresh = lose_and_reclaim(db, ids[0]).await;
    let fresh_started = start_all(&app, db, std::slice::from_ref(&fresh)).await;
    // The tenant asks to cancel the second job while its call runs.
    let response = app
        .operation(Some(&tenant.key), "CancelJob", json!({"id": ids[1]}))
        .await;
    assert_eq!(
        response["data"]["cancelJob"]["cancelRequested"], true,
        "{response}"
    );

    let mut ends = vec![
        end(
            &claims[0],
            &started[0].0,
            &started[0].1,
            JobOutcome::Succeeded {
                result: json!("stale"),
            },
        ),
        end(
            &claims[1],
            &started[1].0,
            &started[1].1,
            JobOutcome::Retry {
                at: Timestamp::now(),
                model: None,
            },
        ),
        end(
            &claims[2],
            &started[2].0,
            &started[2].1,
            JobOutcome::Succeeded {
                result: json!("fine"),
            },
        ),
        end(
            &claims[3],
            &started[3].0,
            &started[3].1,
            JobOutcome::Retry {
                at: Timestamp::now(),
                model: None,
            },
        ),
        end(
            &claims[4],
            &started[4].0,
            &started[4].1,
            JobOutcome::HandBack,
        ),
    ];
    ends.push(end(
        &fresh,
        &fresh_started[0].0,
        &fresh_started[0].1,
        JobOutcome::Failed(JobError::new(JobErrorCode::ProviderRejected, "refused")),
    ));
    let finished = queue::finish_attempts(db, &ends).await.unwrap();
    assert!(finished[0].is_none(), "the lost claim finished its job");
    assert!(finished[1..].iter().all(Option::is_some), "{finished:?}");

    let status = |job: &serde_json::Value| job["status"].as_str().unwrap().to_owned();
    let lost = app.job(&tenant, ids[0]).await;
    assert_eq!(
        status(&lost),
        "FAILED",
        "the fresh claim's outcome stands: {lost}"
    );
    assert_ne!(lost["result"], "stale");
    assert_eq!(status(&app.job(&tenant, ids[1]).await), "CANCELLED");
    let succeeded = app.job(&tenant, ids[2]).await;
    assert_eq!(status(&succeeded), "SUCCEEDED");
    assert_eq!(succeeded["result"], "fine");
    assert_eq!(status(&app.job(&tenant, ids[3]).await), "QUEUED");
    let handed_back = jobs::Entity::find_by_id(ids[4])
        .one(db)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(handed_back.status, JobStatus::Queued);
    assert_eq!(handed_back.attempt_count, 0, "a hand-back does not count");
    // Every job that ended was charged at most once, the lost one for both calls.
    for id in &ids {
        let charged = charges::Entity::find()
            .filter(charges::Column::JobId.eq(*id))
            .count(db)
            .await
            .unwrap();
        assert!(charged <= 1, "job {id} charged {charged} times");
    }
    assert_billing_invariants(db).await;
}

/// On SQLite the writers of one process take turns in the order they asked: each
/// waits in a queue in memory rather than in SQLite's busy handler, whose sleeps and
/// retries let late writers in first.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sqlite_writers_of_one_process_take_turns_in_order() {
    const WRITERS: usize = 8;
    let directory = tempfile::tempdir().unwrap();
    let url = format!("sqlite:{}", directory.path().join("turns.db").display());
    let db = jobledger::db::connect(&url).await.unwrap();
    jobledger::db::migrate(&db).await.unwrap();
    let first = jobledger::db::begin_write(&db).await.unwrap();
    let order = Arc::new(std::sync::Mutex::new(Vec::new()));
    let mut writers = Vec::new();
    for writer in 0..WRITERS {
        let (db, order) = (db.clone(), order.clone());
        writers.push(tokio::spawn(async move {
            let transaction = jobledger::db::begin_write(&db).await.unwrap();
            order.lock().unwrap().push(writer);
            transaction.commit().await.unwrap();
        }));
        // Each writer is waiting before the next one asks.
        tokio::time::sleep(Duration::from_millis(30)).await;
    }
    tokio::time::sleep(Duration::from_millis(100)).await;
    first.commit().await.unwrap();
    for writer in writers {
        writer.await.unwrap();
    }
    assert_eq!(*order.lock().unwrap(), (0..WRITERS).collect::<Vec<_>>());
}
