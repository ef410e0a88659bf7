//! One deliberate corruption per invariant, each on a fresh scenario: the audit names
//! exactly that invariant, about the row that breaks it.

use super::reconcile::reconcile;
use super::{
    assert_only_violated, bump_tenant, first_attempt, insert_entry, report, reservation_of,
    scenario, tenant_row,
};
use crate::helpers::{ADMIN_TOKEN, Backend};
use crate::invariants::assert_billing_invariants;
use entity::{
    JobStatus, LedgerEntryKind, ReservationStatus, attempts, charges, credit_grants,
    credit_reservations, jobs, ledger_entries, tenants,
};
use jobledger::billing::audit::{Invariant, Subject};
// Not imported at the top: in scope, its `is_null` shadows `serde_json::Value::is_null`.
use sea_orm::sea_query::Expr;
use sea_orm::{ColumnTrait, EntityTrait, QueryFilter};
use uuid::Uuid;

on_both_backends!(
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
);

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
