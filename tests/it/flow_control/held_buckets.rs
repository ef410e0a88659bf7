//! A bucket row held by another transaction: the claim defers its jobs instead of waiting, creates buckets before its transaction, and records a rate-limited attempt at once.

use super::*;

/// gpt-4o-mini's bucket, held as by a claim of a stalled process until the returned
/// transaction ends.
async fn hold_model_bucket(db: &sea_orm::DatabaseConnection) -> sea_orm::DatabaseTransaction {
    use sea_orm::{ConnectionTrait, TransactionTrait};
    db.execute_unprepared(
        "INSERT INTO rate_limit_buckets (scope, key, refilled_at) VALUES ('model', 'gpt-4o-mini', 0)",
    )
    .await
    .unwrap();
    let stalled = db.begin().await.unwrap();
    stalled
        .execute_unprepared("SELECT * FROM rate_limit_buckets FOR UPDATE")
        .await
        .unwrap();
    stalled
}

/// A claim never waits for a bucket another transaction holds (a stalled process
/// mid-claim): it takes what needs no such bucket and leaves the rest for later.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_held_bucket_defers_its_jobs_without_stalling_the_claim() {
    use jobledger::jobs::flow::{FlowLimits, RateLimit};
    use jobledger::jobs::queue::{self, ClaimRequest};
    let Some(backend @ Backend::Postgres(_)) = Backend::postgres() else {
        return;
    };
    let app = spawn_app_with(backend, AppOptions::no_workers()).await;
    let tenant = app.funded_tenant("held", "20").await;
    let limited = app.create_job_ok(&tenant, job_input("limited", "hi")).await;
    let mut free = job_input("free", "hi");
    free["model"] = json!("gpt-4o");
    let free = app.create_job_ok(&tenant, free).await;
    let flow = FlowLimits::new(
        std::collections::BTreeMap::from([(
            "gpt-4o-mini".to_owned(),
            RateLimit {
                requests_per_minute: std::num::NonZeroU32::new(6_000),
                ..RateLimit::default()
            },
        )]),
        std::collections::BTreeMap::new(),
        crate::helpers::simulated_models(),
    );
    let db = &app.app.db;
    let stalled = hold_model_bucket(db).await;
    let request = ClaimRequest {
        flow: &flow,
        ..ClaimRequest::new(10, Duration::from_secs(60))
    };
    // A deadline only to fail rather than hang: the claim waits for nothing.
    let claimed = tokio::time::timeout(Duration::from_secs(30), queue::claim(db, request))
        .await
        .expect("the claim waited for the held bucket")
        .unwrap();
    let ids: Vec<Uuid> = claimed.iter().map(|claim| claim.job.id).collect();
    assert_eq!(ids, [free]);
    stalled.rollback().await.unwrap();
    let claimed = queue::claim(db, request).await.unwrap();
    let ids: Vec<Uuid> = claimed.iter().map(|claim| claim.job.id).collect();
    assert_eq!(ids, [limited], "once the bucket is free its job is claimed");
}

/// A claim's transaction never holds a bucket row it created: an insert of a key that
/// another transaction inserted waits for that transaction to end (`SKIP LOCKED` does
/// not apply), so a claim stalled after creating a bucket would stop every claim that
/// wants it. Buckets are created, committed, before the claim's transaction.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_claim_creates_its_buckets_before_its_transaction() {
    use jobledger::jobs::flow::{BucketKey, storage};
    use sea_orm::{ConnectionTrait, TransactionTrait};
    let Some(backend @ Backend::Postgres(_)) = Backend::postgres() else {
        return;
    };
    let app = spawn_app_with(backend, AppOptions::no_workers()).await;
    let db = &app.app.db;
    let keys = [BucketKey::model("gpt-4o-mini")];
    let stalled = db.begin().await.unwrap();
    let held = storage::lock(&stalled, &keys, Timestamp::now())
        .await
        .unwrap();
    assert!(
        held.is_empty(),
        "the claim's lock created the bucket: {held:?}"
    );
    // Another process creating the bucket meanwhile waits for nothing.
    tokio::time::timeout(
        Duration::from_secs(10),
        storage::create_missing(db, &keys, Timestamp::now()),
    )
    .await
    .expect("creating the bucket waited for the stalled claim")
    .unwrap();
    let held = storage::lock(&stalled, &keys, Timestamp::now())
        .await
        .unwrap();
    assert_eq!(held.len(), 1, "the committed bucket is locked");
    // A claim stalled after writing its levels back holds an updated row: the next
    // claims, which make sure their buckets exist, do not wait for it either.
    stalled
        .execute_unprepared("UPDATE rate_limit_buckets SET requests = 0")
        .await
        .unwrap();
    let wanted = [BucketKey::model("gpt-4o"), BucketKey::model("gpt-4o-mini")];
    tokio::time::timeout(
        Duration::from_secs(10),
        storage::create_missing(db, &wanted, Timestamp::now()),
    )
    .await
    .expect("making sure the buckets exist waited for the stalled claim's update")
    .unwrap();
    stalled.rollback().await.unwrap();
    assert_eq!(
        rate_limit_buckets::Entity::find()
            .all(db)
            .await
            .unwrap()
            .len(),
        2
    );
}

/// A 429's pause is written beside the attempt's finish: a claim of a stalled process
/// holding the model's bucket row does not hold up recording the attempt — nor, when
/// more 429s arrive at once than the pool has connections, the rest of the process.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_held_bucket_does_not_delay_recording_a_rate_limited_attempt() {
    let Some(backend @ Backend::Postgres(_)) = Backend::postgres() else {
        return;
    };
    let workers = WorkerSettings {
        concurrency: 24,
        ..test_worker_settings()
    };
    let app = spawn_app_with(backend, AppOptions::workers(workers)).await;
    let tenant = app.funded_tenant("held-pause", "20").await;
    let db = &app.app.db;
    let stalled = hold_model_bucket(db).await;
    let mut limited = Vec::new();
    // More at once than the pool's 16 connections.
    for index in 0..20 {
        let mut input = job_input(
            &format!("limited-while-held-{index}"),
            "hello [mock:status=429][mock:retry_after=1][mock:fail_first=1000]",
        );
        input["maxAttempts"] = json!(1);
        // A 429 is a wait, not an attempt: the deadline is what ends the job.
        input["deadline"] = json!((chrono::Utc::now() + chrono::Duration::seconds(3)).to_rfc3339());
        limited.push(app.create_job_ok(&tenant, input).await);
    }
    let mut other = job_input("other-model-while-held", "hello");
    other["model"] = json!("gpt-4o");
    let other = app.create_job_ok(&tenant, other).await;
    // Recording waits at most a second for the pause to be written, not for the row,
    // and the other model's job runs meanwhile.
    for id in limited.iter().chain([&other]) {
        let job = app
            .wait_until_finished(&tenant, *id, Duration::from_secs(8))
            .await;
        let expected = if *id == other { "SUCCEEDED" } else { "FAILED" };
        assert_eq!(job["status"], expected, "{job}");
        if *id != other {
            // The 429 was recorded before the deadline ended the job.
            assert_eq!(job["attempts"][0]["outcome"], "RETRYABLE_ERROR", "{job}");
            assert_eq!(job["error"]["code"], "DEADLINE_EXCEEDED", "{job}");
        }
    }
    stalled.rollback().await.unwrap();
    assert_billing_invariants(db).await;
}
