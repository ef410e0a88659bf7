//! The order jobs run in: priority within a tenant, fairness across tenants, and
//! scheduled starts (`runAt`).

use crate::helpers::{
    AppOptions, Backend, decimal, error_code, job_input, spawn_app_with, test_worker_settings,
};
use crate::invariants::assert_billing_invariants;
use chrono::{DateTime, SubsecRound, Utc};
use jobledger::jobs::queue::{self, ClaimRequest, TenantCursor};
use serde_json::json;
use std::time::Duration;
use uuid::Uuid;

on_both_backends!(
    priority_orders_a_tenants_jobs_and_tenants_take_turns,
    a_scheduled_job_starts_at_its_run_at_and_not_before,
);

const LEASE: Duration = Duration::from_secs(600);

async fn priority_orders_a_tenants_jobs_and_tenants_take_turns(backend: Backend) {
    let app = spawn_app_with(backend, AppOptions::no_workers()).await;
    let busy = app.funded_tenant("busy", "50").await;
    let quiet = app.funded_tenant("quiet", "5").await;
    let mut jobs = std::collections::HashMap::new();
    for (index, priority) in [1, 9, 5, 9, 0].into_iter().enumerate() {
        let mut input = job_input(&format!("busy-{index}"), "hello");
        input["priority"] = json!(priority);
        let id = app.create_job_ok(&busy, input).await;
        jobs.insert(id, format!("busy p{priority} #{index}"));
    }
    // The quiet tenant's only job is the newest and the least urgent of all.
    let mut input = job_input("quiet", "hello");
    input["priority"] = json!(0);
    jobs.insert(app.create_job_ok(&quiet, input).await, "quiet p0".into());

    // One job per claim, as a worker with one free slot claims: tenants take turns,
    // and within the busy tenant the highest priority goes first, then the oldest.
    let mut cursor = TenantCursor::default();
    let mut order = Vec::new();
    for _ in 0..jobs.len() {
        let claimed = queue::claim_in_turn(&app.app.db, ClaimRequest::new(1, LEASE), &mut cursor)
            .await
            .unwrap()
            .claims;
        assert_eq!(claimed.len(), 1, "claimed so far: {order:?}");
        order.push(jobs[&claimed[0].job.id].clone());
    }
    assert_eq!(
        order,
        [
            "busy p9 #1",
            "quiet p0",
            "busy p9 #3",
            "busy p5 #2",
            "busy p1 #0",
            "busy p0 #4"
        ]
    );

    let (busy_job, _) = jobs
        .iter()
        .find(|(_, name)| name.as_str() == "busy p5 #2")
        .unwrap();
    let schedule = schedule_of(&app, &busy.key, *busy_job).await;
    assert_eq!(schedule["priority"], 5);
    assert_eq!(schedule["status"], "RUNNING");
    assert!(schedule["runAt"].is_null());
    let mut invalid = job_input("too-urgent", "hello");
    invalid["priority"] = json!(10);
    assert_eq!(
        error_code(&app.create_job(&busy, invalid).await),
        "VALIDATION"
    );
    assert_billing_invariants(&app.app.db).await;
}

async fn a_scheduled_job_starts_at_its_run_at_and_not_before(backend: Backend) {
    let app = spawn_app_with(backend, AppOptions::workers(test_worker_settings())).await;
    let tenant = app.funded_tenant("planner", "5").await;
    let run_at = Utc::now() + chrono::Duration::milliseconds(2_500);
    let mut input = job_input("later", "hello");
    input["runAt"] = json!(run_at.to_rfc3339());
    input["priority"] = json!(7);
    let id = app.create_job_ok(&tenant, input).await;
    // Created and held now, queued until then.
    let schedule = schedule_of(&app, &tenant.key, id).await;
    assert_eq!(schedule["status"], "QUEUED");
    assert_eq!(schedule["priority"], 7);
    assert_eq!(
        schedule["runAt"]
            .as_str()
            .unwrap()
            .parse::<DateTime<Utc>>()
            .unwrap(),
        run_at.trunc_subsecs(6)
    );
    assert!(decimal(&app.balance(&tenant).await["held"]) > rust_decimal::Decimal::ZERO);
    let job = app
        .wait_until_finished(&tenant, id, Duration::from_secs(15))
        .await;
    assert_eq!(job["status"], "SUCCEEDED", "{job}");
    let started: DateTime<Utc> = job["startedAt"].as_str().unwrap().parse().unwrap();
    assert!(started >= run_at, "started at {started}, before {run_at}");
    assert!(
        started - run_at < chrono::Duration::seconds(1),
        "started at {started}, more than a second after {run_at}"
    );
    let call = &app.simulator.calls()[0];
    assert!(call.received_at >= run_at, "the provider was called early");
    assert_billing_invariants(&app.app.db).await;
}

async fn schedule_of(app: &crate::helpers::TestApp, key: &str, id: Uuid) -> serde_json::Value {
    let response = app
        .operation(Some(key), "JobSchedule", json!({"id": id}))
        .await;
    assert!(response["errors"].is_null(), "{response}");
    response["data"]["job"].clone()
}
