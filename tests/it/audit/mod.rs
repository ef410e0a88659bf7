//! `jobledger audit` and the reconciliation of unknown outcomes.
//!
//! The audit is clean after a normal scenario; each deliberate corruption (one per
//! invariant, each on a fresh app) makes it name exactly that invariant; the real
//! binary exits 0 on a clean database and 1 on a corrupted one. A reconciliation
//! turns an unknown attempt's bound into its exact cost and leaves the audit clean.

mod command;
mod corruptions;
mod reconcile;
mod reports;

use crate::helpers::{AppOptions, Backend, TestApp, TestTenant, job_input, spawn_app};
use entity::{LedgerEntryKind, Timestamp, attempts, credit_reservations, ledger_entries, tenants};
use jobledger::billing::audit::{self, AuditReport, Invariant, Subject};
// Not imported at the top: in scope, its `is_null` shadows `serde_json::Value::is_null`.
use sea_orm::sea_query::Expr;
use sea_orm::{ActiveValue::Set, ColumnTrait, EntityTrait, QueryFilter, QueryOrder};
use serde_json::json;
use std::time::Duration;
use uuid::Uuid;

const LIMIT: Duration = Duration::from_secs(30);

/// A tenant with one job in every state, and the app with no workers left running
/// (so the rows stay as they are while a test corrupts them).
pub struct Scenario {
    pub app: TestApp,
    pub tenant: TestTenant,
    succeeded: Uuid,
    failed: Uuid,
    /// Failed after a dropped connection: its only attempt carries a cost bound.
    unknown: Uuid,
    cancelled: Uuid,
    queued: Uuid,
}

pub async fn scenario(backend: Backend) -> Scenario {
    let app = spawn_app(backend).await;
    let tenant = app.funded_tenant("acme", "5").await;
    let succeeded = app
        .create_job_ok(
            &tenant,
            job_input("ok", "Summarise: the quarter went well."),
        )
        .await;
    let failed = app
        .create_job_ok(&tenant, job_input("refused", "hi [mock:status=400]"))
        .await;
    let mut lost = job_input("lost", "hi [mock:drop]");
    lost["retryUnknownOutcome"] = json!(false);
    let unknown = app.create_job_ok(&tenant, lost).await;
    for (id, status) in [
        (succeeded, "SUCCEEDED"),
        (failed, "FAILED"),
        (unknown, "FAILED"),
    ] {
        let job = app.wait_until_finished(&tenant, id, LIMIT).await;
        assert_eq!(job["status"], status, "{job}");
    }
    // No workers from here on: the next job stays queued with its hold open.
    let app = app.restart(AppOptions::no_workers()).await;
    let queued = app
        .create_job_ok(&tenant, job_input("waiting", "hello"))
        .await;
    let cancelled = app
        .create_job_ok(&tenant, job_input("changed-my-mind", "hello again"))
        .await;
    let response = app
        .operation(Some(&tenant.key), "CancelJob", json!({"id": cancelled}))
        .await;
    assert_eq!(
        response["data"]["cancelJob"]["status"], "CANCELLED",
        "{response}"
    );
    Scenario {
        app,
        tenant,
        succeeded,
        failed,
        unknown,
        cancelled,
        queued,
    }
}

pub async fn report(app: &TestApp) -> AuditReport {
    audit::audit(&app.app.db).await.expect("the audit runs")
}

/// Asserts that the audit names exactly `invariant`, about `subject`.
pub async fn assert_only_violated(app: &TestApp, invariant: Invariant, subject: Subject) {
    let report = report(app).await;
    assert_eq!(report.violated(), [invariant], "{report}");
    let check = report.check(invariant);
    assert!(
        check.violations.iter().any(|v| v.subject == subject),
        "{invariant} does not name {subject}:\n{report}"
    );
    // The snapshot variant agrees.
    let snapshot = audit::audit_snapshot(&app.app.db).await.unwrap();
    assert_eq!(snapshot.violated(), [invariant], "{snapshot}");
}

async fn tenant_row(app: &TestApp, tenant: &TestTenant) -> tenants::Model {
    tenants::Entity::find_by_id(tenant.id)
        .one(&app.app.db)
        .await
        .unwrap()
        .unwrap()
}

async fn reservation_of(app: &TestApp, job_id: Uuid) -> credit_reservations::Model {
    credit_reservations::Entity::find()
        .filter(credit_reservations::Column::JobId.eq(job_id))
        .one(&app.app.db)
        .await
        .unwrap()
        .unwrap()
}

async fn first_attempt(app: &TestApp, job_id: Uuid) -> attempts::Model {
    attempts::Entity::find()
        .filter(attempts::Column::JobId.eq(job_id))
        .order_by_asc(attempts::Column::Number)
        .one(&app.app.db)
        .await
        .unwrap()
        .unwrap()
}

/// Appends a ledger entry as the ledger would, without the rows that should explain it.
async fn insert_entry(
    app: &TestApp,
    tenant: &TestTenant,
    kind: LedgerEntryKind,
    nanos: i64,
    job_id: Option<Uuid>,
) {
    ledger_entries::Entity::insert(ledger_entries::ActiveModel {
        id: Set(Uuid::now_v7()),
        tenant_id: Set(tenant.id),
        kind: Set(kind),
        amount_nanos: Set(nanos),
        job_id: Set(job_id),
        grant_id: Set(None),
        created_at: Set(Timestamp::now()),
    })
    .exec(&app.app.db)
    .await
    .unwrap();
}

/// Adds `nanos` to one of the tenant's cached balance columns.
pub async fn bump_tenant(app: &TestApp, tenant: &TestTenant, column: tenants::Column, nanos: i64) {
    use sea_orm::sea_query::ExprTrait as _;
    tenants::Entity::update_many()
        .col_expr(column, Expr::col(column).add(nanos))
        .filter(tenants::Column::Id.eq(tenant.id))
        .exec(&app.app.db)
        .await
        .unwrap();
}
