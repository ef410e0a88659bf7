//! `jobledger audit` and the reconciliation of unknown outcomes.
//!
//! The audit is clean after a normal scenario; each deliberate corruption (one per
//! invariant, each on a fresh app) makes it name exactly that invariant; the real
//! binary exits 0 on a clean database and 1 on a corrupted one. A reconciliation
//! turns an unknown attempt's bound into its exact cost and leaves the audit clean.

use crate::helpers::{
    ADMIN_TOKEN, AppOptions, Backend, TestApp, TestTenant, decimal, error_code, job_input,
    spawn_app,
};
use crate::invariants::assert_billing_invariants;
use entity::{
    JobStatus, LedgerEntryKind, ReservationStatus, Timestamp, attempts, charges, credit_grants,
    credit_reservations, jobs, ledger_entries, model_prices, tenants,
};
use jobledger::billing::audit::{self, AuditReport, Invariant, Subject};
use rust_decimal::Decimal;
// Not imported at the top: in scope, its `is_null` shadows `serde_json::Value::is_null`.
use sea_orm::sea_query::Expr;
use sea_orm::{
    ActiveValue::Set, ColumnTrait, ConnectionTrait, DbBackend, EntityTrait, QueryFilter,
    QueryOrder, Statement,
};
use serde_json::{Value, json};
use std::time::Duration;
use uuid::Uuid;

on_both_backends!(
    a_normal_scenario_audits_clean,
    the_report_does_not_depend_on_the_page_size,
    a_bumped_cached_balance_breaks_balance_matches_ledger,
    an_over_spent_tenant_breaks_available_non_negative,
    a_grant_without_its_ledger_entry_breaks_granted_equals_grants,
    a_hold_without_a_reservation_breaks_held_equals_open_reservations,
    a_charge_entry_without_a_charge_breaks_charged_equals_charges,
    an_open_hold_with_a_settled_part_breaks_reservation_amounts_consistent,
    a_hold_released_twice_breaks_reservation_resolved_once,
    a_failed_job_with_an_open_hold_breaks_reservation_matches_job_status,
    a_job_without_a_reservation_breaks_one_reservation_per_job,
    a_charge_on_the_wrong_job_breaks_charge_matches_attempts,
    an_attempt_without_cost_or_bound_breaks_unknown_cost_has_upper_bound,
    a_changed_reconciled_cost_breaks_reconciliation_matches_attempt,
    the_audit_command_exits_zero_when_clean_and_one_on_a_violation,
    reconciling_a_dropped_attempt_makes_its_cost_exact,
    reconciling_never_changes_the_customer_charge,
);

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

async fn a_normal_scenario_audits_clean(backend: Backend) {
    let s = scenario(backend).await;
    let report = report(&s.app).await;
    assert!(report.is_clean(), "{report}");
    assert_eq!(report.checks.len(), Invariant::ALL.len());
    assert_eq!(report.check(Invariant::BalanceMatchesLedger).checked, 1);
    assert_eq!(report.check(Invariant::OneReservationPerJob).checked, 5);
    assert_eq!(report.check(Invariant::UnknownCostHasUpperBound).checked, 3);
    let text = report.to_string();
    for invariant in Invariant::ALL {
        assert!(
            text.contains(&format!("OK        {invariant} (")),
            "{invariant} missing from the report:\n{text}"
        );
    }
    assert!(text.ends_with("clean: all 16 invariants hold\n"), "{text}");
    assert_billing_invariants(&s.app.app.db).await;
    let snapshot = audit::audit_snapshot(&s.app.app.db).await.unwrap();
    assert_eq!(snapshot, report);
}

async fn the_report_does_not_depend_on_the_page_size(backend: Backend) {
    let s = scenario(backend).await;
    // A second tenant, so that tenants page too.
    let other = s.app.funded_tenant("globex", "1").await;
    s.app
        .create_job_ok(&other, job_input("theirs", "hello"))
        .await;
    let whole = report(&s.app).await;
    assert!(whole.is_clean(), "{whole}");
    assert_eq!(whole.check(Invariant::BalanceMatchesLedger).checked, 2);
    assert_eq!(whole.check(Invariant::OneReservationPerJob).checked, 6);
    for page_size in [1, 2, 5] {
        let paged = audit::audit_in_pages(&s.app.app.db, page_size)
            .await
            .unwrap();
        assert_eq!(paged, whole, "pages of {page_size}");
    }
    // Violations on several pages are all found.
    jobs::Entity::update_many()
        .col_expr(jobs::Column::Status, Expr::value(JobStatus::Failed))
        .filter(jobs::Column::Status.eq(JobStatus::Queued))
        .exec(&s.app.app.db)
        .await
        .unwrap();
    let paged = audit::audit_in_pages(&s.app.app.db, 1).await.unwrap();
    assert_eq!(paged, report(&s.app).await);
    assert_eq!(
        paged
            .check(Invariant::ReservationMatchesJobStatus)
            .violation_count,
        2,
        "{paged}"
    );
}

async fn a_bumped_cached_balance_breaks_balance_matches_ledger(backend: Backend) {
    let s = scenario(backend).await;
    bump_tenant(&s.app, &s.tenant, tenants::Column::HeldNanos, 1).await;
    assert_only_violated(
        &s.app,
        Invariant::BalanceMatchesLedger,
        Subject::Tenant(s.tenant.id),
    )
    .await;
}

async fn an_over_spent_tenant_breaks_available_non_negative(backend: Backend) {
    let s = scenario(backend).await;
    // The grant shrinks to one nano-credit everywhere it is recorded — grant row,
    // ledger entry, cached balance — so only the balance itself is wrong.
    let db = &s.app.app.db;
    let granted = tenant_row(&s.app, &s.tenant).await.granted_nanos;
    credit_grants::Entity::update_many()
        .col_expr(credit_grants::Column::AmountNanos, Expr::value(1_i64))
        .filter(credit_grants::Column::TenantId.eq(s.tenant.id))
        .exec(db)
        .await
        .unwrap();
    ledger_entries::Entity::update_many()
        .col_expr(ledger_entries::Column::AmountNanos, Expr::value(1_i64))
        .filter(ledger_entries::Column::TenantId.eq(s.tenant.id))
        .filter(ledger_entries::Column::Kind.eq(LedgerEntryKind::Grant))
        .exec(db)
        .await
        .unwrap();
    bump_tenant(
        &s.app,
        &s.tenant,
        tenants::Column::GrantedNanos,
        1 - granted,
    )
    .await;
    assert_only_violated(
        &s.app,
        Invariant::AvailableNonNegative,
        Subject::Tenant(s.tenant.id),
    )
    .await;
}

async fn a_grant_without_its_ledger_entry_breaks_granted_equals_grants(backend: Backend) {
    use sea_orm::sea_query::ExprTrait as _;
    let s = scenario(backend).await;
    credit_grants::Entity::update_many()
        .col_expr(
            credit_grants::Column::AmountNanos,
            Expr::col(credit_grants::Column::AmountNanos).add(1),
        )
        .filter(credit_grants::Column::TenantId.eq(s.tenant.id))
        .exec(&s.app.app.db)
        .await
        .unwrap();
    assert_only_violated(
        &s.app,
        Invariant::GrantedEqualsGrants,
        Subject::Tenant(s.tenant.id),
    )
    .await;
}

async fn a_hold_without_a_reservation_breaks_held_equals_open_reservations(backend: Backend) {
    let s = scenario(backend).await;
    // A hold in the ledger and the cache that no reservation explains.
    insert_entry(&s.app, &s.tenant, LedgerEntryKind::Hold, 7, None).await;
    bump_tenant(&s.app, &s.tenant, tenants::Column::HeldNanos, 7).await;
    assert_only_violated(
        &s.app,
        Invariant::HeldEqualsOpenReservations,
        Subject::Tenant(s.tenant.id),
    )
    .await;
}

async fn a_charge_entry_without_a_charge_breaks_charged_equals_charges(backend: Backend) {
    let s = scenario(backend).await;
    // Held and charged in the ledger (held nets out) and the cache, with no charge row.
    insert_entry(&s.app, &s.tenant, LedgerEntryKind::Hold, 7, None).await;
    insert_entry(&s.app, &s.tenant, LedgerEntryKind::Charge, 7, None).await;
    bump_tenant(&s.app, &s.tenant, tenants::Column::ChargedNanos, 7).await;
    assert_only_violated(
        &s.app,
        Invariant::ChargedEqualsCharges,
        Subject::Tenant(s.tenant.id),
    )
    .await;
}

async fn an_open_hold_with_a_settled_part_breaks_reservation_amounts_consistent(backend: Backend) {
    let s = scenario(backend).await;
    credit_reservations::Entity::update_many()
        .col_expr(
            credit_reservations::Column::SettledAmountNanos,
            Expr::value(1_i64),
        )
        .filter(credit_reservations::Column::JobId.eq(s.queued))
        .exec(&s.app.app.db)
        .await
        .unwrap();
    assert_only_violated(
        &s.app,
        Invariant::ReservationAmountsConsistent,
        Subject::Job(s.queued),
    )
    .await;
}

async fn a_hold_released_twice_breaks_reservation_resolved_once(backend: Backend) {
    let s = scenario(backend).await;
    // Held and released once more: the balances still add up, the history does not.
    let amount = reservation_of(&s.app, s.failed).await.amount_nanos;
    insert_entry(
        &s.app,
        &s.tenant,
        LedgerEntryKind::Hold,
        amount,
        Some(s.failed),
    )
    .await;
    insert_entry(
        &s.app,
        &s.tenant,
        LedgerEntryKind::Release,
        amount,
        Some(s.failed),
    )
    .await;
    assert_only_violated(
        &s.app,
        Invariant::ReservationResolvedOnce,
        Subject::Job(s.failed),
    )
    .await;
}

async fn a_failed_job_with_an_open_hold_breaks_reservation_matches_job_status(backend: Backend) {
    let s = scenario(backend).await;
    jobs::Entity::update_many()
        .col_expr(jobs::Column::Status, Expr::value(JobStatus::Failed))
        .filter(jobs::Column::Id.eq(s.queued))
        .exec(&s.app.app.db)
        .await
        .unwrap();
    assert_only_violated(
        &s.app,
        Invariant::ReservationMatchesJobStatus,
        Subject::Job(s.queued),
    )
    .await;
}

async fn a_job_without_a_reservation_breaks_one_reservation_per_job(backend: Backend) {
    let s = scenario(backend).await;
    let reservation = reservation_of(&s.app, s.cancelled).await;
    assert_eq!(reservation.status, ReservationStatus::Released);
    credit_reservations::Entity::delete_by_id(reservation.id)
        .exec(&s.app.app.db)
        .await
        .unwrap();
    assert_only_violated(
        &s.app,
        Invariant::OneReservationPerJob,
        Subject::Job(s.cancelled),
    )
    .await;
}

async fn a_charge_on_the_wrong_job_breaks_charge_matches_attempts(backend: Backend) {
    let s = scenario(backend).await;
    // The succeeded job's charge moves to the failed job of the same tenant: the
    // tenant's totals still agree, the jobs do not.
    charges::Entity::update_many()
        .col_expr(charges::Column::JobId, Expr::value(s.failed))
        .filter(charges::Column::JobId.eq(s.succeeded))
        .exec(&s.app.app.db)
        .await
        .unwrap();
    let report = report(&s.app).await;
    assert_eq!(
        report.violated(),
        [Invariant::ChargeMatchesAttempts],
        "{report}"
    );
    let subjects: Vec<Subject> = report
        .check(Invariant::ChargeMatchesAttempts)
        .violations
        .iter()
        .map(|violation| violation.subject)
        .collect();
    assert!(subjects.contains(&Subject::Job(s.succeeded)), "{report}");
    assert!(subjects.contains(&Subject::Job(s.failed)), "{report}");
}

async fn an_attempt_without_cost_or_bound_breaks_unknown_cost_has_upper_bound(backend: Backend) {
    let s = scenario(backend).await;
    let attempt = first_attempt(&s.app, s.unknown).await;
    assert!(attempt.provider_cost_nanos.is_none());
    attempts::Entity::update_many()
        .col_expr(
            attempts::Column::ProviderCostUpperBoundNanos,
            Expr::value(Option::<i64>::None),
        )
        .filter(attempts::Column::Id.eq(attempt.id))
        .exec(&s.app.app.db)
        .await
        .unwrap();
    assert_only_violated(
        &s.app,
        Invariant::UnknownCostHasUpperBound,
        Subject::Attempt(attempt.id),
    )
    .await;
}

async fn a_changed_reconciled_cost_breaks_reconciliation_matches_attempt(backend: Backend) {
    let s = scenario(backend).await;
    let attempt = first_attempt(&s.app, s.unknown).await;
    let response = reconcile(&s.app, ADMIN_TOKEN, attempt.id, 10, 0, 5, "usage report").await;
    assert!(response["errors"].is_null(), "{response}");
    assert_billing_invariants(&s.app.app.db).await;
    let reconciliation: Uuid = response["data"]["reconcileAttempt"]["reconciliation"]["id"]
        .as_str()
        .unwrap()
        .parse()
        .unwrap();
    {
        use sea_orm::sea_query::ExprTrait as _;
        attempts::Entity::update_many()
            .col_expr(
                attempts::Column::ProviderCostNanos,
                Expr::col(attempts::Column::ProviderCostNanos).add(1),
            )
            .filter(attempts::Column::Id.eq(attempt.id))
            .exec(&s.app.app.db)
            .await
            .unwrap();
    }
    assert_only_violated(
        &s.app,
        Invariant::ReconciliationMatchesAttempt,
        Subject::Reconciliation(reconciliation),
    )
    .await;
}

/// The URL of the database the app runs on, for another process to open.
async fn database_url(app: &TestApp, backend: &Backend) -> String {
    let db = &app.app.db;
    match backend {
        Backend::Sqlite => {
            let row = db
                .query_one_raw(Statement::from_string(
                    DbBackend::Sqlite,
                    "SELECT file FROM pragma_database_list WHERE name = 'main'",
                ))
                .await
                .unwrap()
                .unwrap();
            format!("sqlite:{}", row.try_get::<String>("", "file").unwrap())
        }
        Backend::Postgres(server_url) => {
            let row = db
                .query_one_raw(Statement::from_string(
                    DbBackend::Postgres,
                    "SELECT current_database() AS name",
                ))
                .await
                .unwrap()
                .unwrap();
            let name: String = row.try_get("", "name").unwrap();
            let (base, query) = server_url
                .split_once('?')
                .map_or((server_url.as_str(), None), |(b, q)| (b, Some(q)));
            let authority = base.find("://").map_or(0, |index| index + 3);
            let path = base[authority..]
                .find('/')
                .map_or(base.len(), |index| authority + index);
            let mut url = format!("{}/{name}", &base[..path]);
            if let Some(query) = query {
                url = format!("{url}?{query}");
            }
            url
        }
    }
}

/// Runs `jobledger audit --database-url url`: (exit code, stdout, stderr).
async fn run_audit_command(url: &str) -> (i32, String, String) {
    let output = tokio::process::Command::new(env!("CARGO_BIN_EXE_jobledger"))
        .args(["audit", "--database-url", url])
        .env("RUST_LOG", "warn")
        .output()
        .await
        .expect("the binary runs");
    (
        output.status.code().expect("the audit exits by itself"),
        String::from_utf8(output.stdout).unwrap(),
        String::from_utf8(output.stderr).unwrap(),
    )
}

async fn the_audit_command_exits_zero_when_clean_and_one_on_a_violation(backend: Backend) {
    let s = scenario(backend.clone()).await;
    let url = database_url(&s.app, &backend).await;

    let (code, stdout, stderr) = run_audit_command(&url).await;
    assert_eq!(code, 0, "stdout:\n{stdout}\nstderr:\n{stderr}");
    assert_eq!(stdout.lines().count(), Invariant::ALL.len() + 1, "{stdout}");
    for invariant in Invariant::ALL {
        assert!(
            stdout.contains(&format!("OK        {invariant} (")),
            "{stdout}"
        );
    }
    assert!(stdout.contains("clean: all 16 invariants hold"), "{stdout}");

    bump_tenant(&s.app, &s.tenant, tenants::Column::HeldNanos, 1).await;
    let (code, stdout, stderr) = run_audit_command(&url).await;
    assert_eq!(code, 1, "stdout:\n{stdout}\nstderr:\n{stderr}");
    assert!(
        stdout.contains("VIOLATED  balance_matches_ledger: 1 violation"),
        "{stdout}"
    );
    assert!(
        stdout.contains(&format!("- tenant {}: cached", s.tenant.id)),
        "{stdout}"
    );
    assert!(
        stdout.contains("OK        held_equals_open_reservations"),
        "{stdout}"
    );
    assert!(
        stdout.contains("NOT CLEAN: 1 of 16 invariants violated"),
        "{stdout}"
    );

    if matches!(backend, Backend::Sqlite) {
        // A database that is not there is "could not audit" (2), and is not created.
        let directory = tempfile::tempdir().unwrap();
        let missing = directory.path().join("missing.db");
        let (code, _, stderr) = run_audit_command(&format!("sqlite:{}", missing.display())).await;
        assert_eq!(code, 2, "{stderr}");
        assert!(stderr.contains("the audit could not run"), "{stderr}");
        assert!(!missing.exists(), "the audit created a database");
    }
}

const RECONCILE: &str = r#"
mutation Reconcile($input: ReconcileAttemptInput!) {
  reconcileAttempt(input: $input) {
    reconciliation {
      id attemptId jobId tenantId previousUpperBound providerCost
      inputTokens cachedInputTokens outputTokens providerRequestId note reconciledBy createdAt
    }
    attempt {
      number outcome providerCost providerCostUpperBound
      inputTokens cachedInputTokens outputTokens providerRequestId
    }
  }
}"#;

async fn reconcile(
    app: &TestApp,
    key: &str,
    attempt_id: Uuid,
    input_tokens: i64,
    cached_input_tokens: i64,
    output_tokens: i64,
    note: &str,
) -> Value {
    app.graphql(
        Some(key),
        RECONCILE,
        json!({"input": {
            "attemptId": attempt_id,
            "inputTokens": input_tokens,
            "cachedInputTokens": cached_input_tokens,
            "outputTokens": output_tokens,
            "providerRequestId": "req-from-usage-report",
            "note": note,
        }}),
    )
    .await
}

/// The provider cost of `usage` at the attempt's stored price, computed here from the
/// price row: each part rounded up to the nano-credit.
async fn expected_cost(
    app: &TestApp,
    attempt: &attempts::Model,
    usage: (i64, i64, i64),
) -> Decimal {
    let price = model_prices::Entity::find_by_id(attempt.model_price_id)
        .one(&app.app.db)
        .await
        .unwrap()
        .unwrap();
    let part = |tokens: i64, nanos_per_million: i64| {
        (i128::from(tokens) * i128::from(nanos_per_million) + 999_999) / 1_000_000
    };
    let (input, cached, output) = usage;
    let nanos = part(input - cached, price.provider_input_nanos_per_million)
        + part(cached, price.provider_cached_input_nanos_per_million)
        + part(output, price.provider_output_nanos_per_million);
    Decimal::from_i128_with_scale(nanos, 9).normalize()
}

async fn reconciling_a_dropped_attempt_makes_its_cost_exact(backend: Backend) {
    let app = spawn_app(backend).await;
    let tenant = app.funded_tenant("acme", "5").await;
    let mut input = job_input("pay-once", "hi [mock:drop]");
    input["retryUnknownOutcome"] = json!(false);
    let id = app.create_job_ok(&tenant, input).await;
    let job = app.wait_until_finished(&tenant, id, LIMIT).await;
    assert_eq!(job["status"], "FAILED", "{job}");
    assert_eq!(job["cost"]["unknownAttempts"], 1);
    let bound = decimal(&job["attempts"][0]["providerCostUpperBound"]);
    let balance = app.balance(&tenant).await;
    let attempt = first_attempt(&app, id).await;

    // Only an admin may reconcile, and only an attempt that exists.
    let response = reconcile(&app, &tenant.key, attempt.id, 120, 20, 50, "report").await;
    assert_eq!(error_code(&response), "FORBIDDEN", "{response}");
    let response = reconcile(&app, ADMIN_TOKEN, Uuid::now_v7(), 120, 20, 50, "report").await;
    assert_eq!(error_code(&response), "NOT_FOUND", "{response}");
    // Usage that cannot be is refused, and nothing is written.
    for (input_tokens, cached, output, note) in [
        (10, 20, 5, "report"),
        (-1, 0, 5, "report"),
        (10, 0, 5, "  "),
    ] {
        let response = reconcile(
            &app,
            ADMIN_TOKEN,
            attempt.id,
            input_tokens,
            cached,
            output,
            note,
        )
        .await;
        assert_eq!(error_code(&response), "VALIDATION", "{response}");
    }
    assert_eq!(first_attempt(&app, id).await, attempt);

    let response = reconcile(
        &app,
        ADMIN_TOKEN,
        attempt.id,
        120,
        20,
        50,
        "provider usage report of 2026-12-01",
    )
    .await;
    assert!(response["errors"].is_null(), "{response}");
    let expected = expected_cost(&app, &attempt, (120, 20, 50)).await;
    assert!(expected > Decimal::ZERO && expected < bound);
    let payload = &response["data"]["reconcileAttempt"];
    let reconciliation = &payload["reconciliation"];
    assert_eq!(decimal(&reconciliation["providerCost"]), expected);
    assert_eq!(decimal(&reconciliation["previousUpperBound"]), bound);
    assert_eq!(reconciliation["attemptId"], json!(attempt.id));
    assert_eq!(reconciliation["jobId"], json!(id));
    assert_eq!(reconciliation["tenantId"], json!(tenant.id));
    assert_eq!(reconciliation["inputTokens"], 120);
    assert_eq!(reconciliation["cachedInputTokens"], 20);
    assert_eq!(reconciliation["outputTokens"], 50);
    assert_eq!(
        reconciliation["note"],
        "provider usage report of 2026-12-01"
    );
    assert_eq!(reconciliation["reconciledBy"], "admin");
    assert_eq!(payload["attempt"]["outcome"], "UNKNOWN");
    assert_eq!(decimal(&payload["attempt"]["providerCost"]), expected);

    // The tenant sees the exact cost; nothing about its credits changed.
    let job = app.job(&tenant, id).await;
    let cost = &job["cost"];
    assert_eq!(cost["unknownAttempts"], 0, "{job}");
    assert_eq!(decimal(&cost["providerCost"]), expected);
    assert_eq!(decimal(&cost["providerCostUpperBound"]), expected);
    assert_eq!(decimal(&cost["customerCharge"]), Decimal::ZERO);
    assert_eq!(decimal(&cost["margin"]), -expected);
    let attempt_seen = &job["attempts"][0];
    assert_eq!(decimal(&attempt_seen["providerCost"]), expected);
    assert!(attempt_seen["providerCostUpperBound"].is_null());
    assert_eq!(attempt_seen["inputTokens"], 120);
    assert_eq!(attempt_seen["cachedInputTokens"], 20);
    assert_eq!(attempt_seen["outputTokens"], 50);
    assert_eq!(attempt_seen["providerRequestId"], "req-from-usage-report");
    assert!(job["charge"].is_null());
    assert_eq!(app.balance(&tenant).await, balance);
    assert_billing_invariants(&app.app.db).await;
    assert_eq!(
        report(&app)
            .await
            .check(Invariant::ReconciliationMatchesAttempt)
            .checked,
        1
    );

    // Once exact, never again.
    let response = reconcile(&app, ADMIN_TOKEN, attempt.id, 1, 0, 1, "again").await;
    assert_eq!(error_code(&response), "VALIDATION", "{response}");
    assert_eq!(
        decimal(&app.job(&tenant, id).await["cost"]["providerCost"]),
        expected
    );
}

async fn reconciling_never_changes_the_customer_charge(backend: Backend) {
    let app = spawn_app(backend).await;
    let tenant = app.funded_tenant("acme", "5").await;
    let id = app
        .create_job_ok(
            &tenant,
            job_input("retried", "hi [mock:drop][mock:fail_first=1]"),
        )
        .await;
    let before = app.wait_until_finished(&tenant, id, LIMIT).await;
    assert_eq!(before["status"], "SUCCEEDED", "{before}");
    let balance = app.balance(&tenant).await;
    let attempts = attempts::Entity::find()
        .filter(attempts::Column::JobId.eq(id))
        .order_by_asc(attempts::Column::Number)
        .all(&app.app.db)
        .await
        .unwrap();
    let [lost, accepted] = attempts.as_slice() else {
        panic!("two attempts expected: {attempts:?}");
    };

    // The accepted attempt's cost is exact already.
    let response = reconcile(&app, ADMIN_TOKEN, accepted.id, 10, 0, 5, "report").await;
    assert_eq!(error_code(&response), "VALIDATION", "{response}");

    let response = reconcile(&app, ADMIN_TOKEN, lost.id, 40, 0, 30, "report").await;
    assert!(response["errors"].is_null(), "{response}");
    let lost_cost = expected_cost(&app, lost, (40, 0, 30)).await;
    let after = app.job(&tenant, id).await;
    assert_eq!(after["charge"], before["charge"]);
    assert_eq!(after["reservation"], before["reservation"]);
    assert_eq!(app.balance(&tenant).await, balance);
    let accepted_cost = decimal(&before["cost"]["providerCost"]);
    assert_eq!(after["cost"]["unknownAttempts"], 0);
    assert_eq!(
        decimal(&after["cost"]["providerCost"]),
        accepted_cost + lost_cost
    );
    assert_eq!(
        decimal(&after["cost"]["margin"]),
        decimal(&after["cost"]["customerCharge"]) - accepted_cost - lost_cost
    );
    assert_billing_invariants(&app.app.db).await;
}
