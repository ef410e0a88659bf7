//! The audit's invariants about grants that expire, the charges attributed to grants
//! and the spend counters: clean after expiries, and each deliberate corruption named
//! by its invariant.

use crate::audit::{Scenario, assert_only_violated, bump_tenant, report, scenario};
use crate::helpers::{ADMIN_TOKEN, Backend};
use entity::{LedgerEntryKind, Timestamp, credit_grants, ledger_entries, tenants};
use jobledger::billing::audit::{Invariant, Subject};
use jobledger::billing::grant_expiry;
// `ExprTrait` only where used: in scope, its `is_null` shadows `Value::is_null`.
use sea_orm::sea_query::Expr;
use sea_orm::{ColumnTrait, EntityTrait, QueryFilter};
use serde_json::json;
use uuid::Uuid;

on_both_backends!(
    expiries_audit_clean,
    a_grant_losing_more_than_it_had_breaks_grant_expiry_within_grant,
    an_expiry_dated_off_its_instant_breaks_grant_expiry_within_grant,
    an_expiry_the_grant_does_not_record_breaks_expired_equals_grant_expiries,
    charges_counted_twice_break_charges_attributed_to_grants,
    a_drifted_spend_counter_breaks_spend_counters_match_jobs,
    a_charge_moved_onto_a_lapsed_grant_breaks_no_charge_after_expiry,
);

/// The audit scenario, plus a grant of 1 that expired (half-held at its instant: the
/// scenario's queued job holds part of it) and its expiry entry.
async fn with_expiry(backend: Backend) -> (Scenario, Uuid) {
    let s = scenario(backend).await;
    let expires_at = Timestamp::from(chrono::Utc::now() + chrono::Duration::hours(1));
    let granted = s
        .app
        .graphql(
            Some(ADMIN_TOKEN),
            "mutation($i: GrantCreditsInput!) { grantCredits(input: $i) { id } }",
            json!({"i": {
                "tenantId": s.tenant.id, "amount": "1", "idempotencyKey": "expiring",
                "expiresAt": expires_at.to_datetime().to_rfc3339(),
            }}),
        )
        .await;
    assert!(granted["errors"].is_null(), "{granted}");
    let expired = grant_expiry::sweep(&s.app.app.db, expires_at)
        .await
        .unwrap();
    assert!(expired.is_positive());
    let id = granted["data"]["grantCredits"]["id"]
        .as_str()
        .unwrap()
        .parse()
        .unwrap();
    (s, id)
}

async fn expiry_entry(s: &Scenario) -> ledger_entries::Model {
    ledger_entries::Entity::find()
        .filter(ledger_entries::Column::TenantId.eq(s.tenant.id))
        .filter(ledger_entries::Column::Kind.eq(LedgerEntryKind::Expiry))
        .one(&s.app.app.db)
        .await
        .unwrap()
        .expect("an expiry entry")
}

/// Adds `nanos` to the amount of the tenant's expiry entry.
async fn bump_expiry_entry(s: &Scenario, nanos: i64) {
    let entry = expiry_entry(s).await;
    ledger_entries::Entity::update_many()
        .col_expr(
            ledger_entries::Column::AmountNanos,
            Expr::value(entry.amount_nanos + nanos),
        )
        .filter(ledger_entries::Column::Id.eq(entry.id))
        .exec(&s.app.app.db)
        .await
        .unwrap();
}

async fn expiries_audit_clean(backend: Backend) {
    let (s, _) = with_expiry(backend).await;
    let report = report(&s.app).await;
    assert!(report.is_clean(), "{report}");
    assert_eq!(report.check(Invariant::GrantExpiryWithinGrant).checked, 2);
    assert_eq!(report.check(Invariant::SpendCountersMatchJobs).checked, 1);
}

async fn a_grant_losing_more_than_it_had_breaks_grant_expiry_within_grant(backend: Backend) {
    use sea_orm::sea_query::ExprTrait as _;
    let (s, grant) = with_expiry(backend).await;
    // Half a credit more expired, everywhere it is recorded: the grant of 1 lost more
    // than it had, though every total still agrees.
    let half = 500_000_000;
    credit_grants::Entity::update_many()
        .col_expr(
            credit_grants::Column::ExpiredNanos,
            Expr::col(credit_grants::Column::ExpiredNanos).add(half),
        )
        .filter(credit_grants::Column::Id.eq(grant))
        .exec(&s.app.app.db)
        .await
        .unwrap();
    bump_expiry_entry(&s, half).await;
    bump_tenant(&s.app, &s.tenant, tenants::Column::ExpiredNanos, half).await;
    // The grant lapsed backing the queued job's hold: what it has left no longer
    // matches that backing either.
    let report = report(&s.app).await;
    assert_eq!(
        report.violated(),
        [
            Invariant::GrantExpiryWithinGrant,
            Invariant::NoChargeAfterExpiry
        ],
        "{report}"
    );
    for invariant in report.violated() {
        assert!(
            report
                .check(invariant)
                .violations
                .iter()
                .any(|v| v.subject == Subject::Grant(grant)),
            "{report}"
        );
    }
}

/// A later charge spread onto the lapsed grant instead of the lasting one (what
/// re-matching held credit at every sweep did): every total still agrees, but the
/// grant has less left than it backs.
async fn a_charge_moved_onto_a_lapsed_grant_breaks_no_charge_after_expiry(backend: Backend) {
    use sea_orm::sea_query::ExprTrait as _;
    let (s, grant) = with_expiry(backend).await;
    let lasting = credit_grants::Entity::find()
        .filter(credit_grants::Column::TenantId.eq(s.tenant.id))
        .filter(credit_grants::Column::Id.ne(grant))
        .one(&s.app.app.db)
        .await
        .unwrap()
        .expect("the scenario's grant");
    assert!(lasting.consumed_nanos > 0, "the scenario charged something");
    let moved = Ord::min(lasting.consumed_nanos, 1_000);
    for (id, by) in [(grant, moved), (lasting.id, -moved)] {
        credit_grants::Entity::update_many()
            .col_expr(
                credit_grants::Column::ConsumedNanos,
                Expr::col(credit_grants::Column::ConsumedNanos).add(by),
            )
            .filter(credit_grants::Column::Id.eq(id))
            .exec(&s.app.app.db)
            .await
            .unwrap();
    }
    assert_only_violated(
        &s.app,
        Invariant::NoChargeAfterExpiry,
        Subject::Grant(grant),
    )
    .await;
}

async fn an_expiry_dated_off_its_instant_breaks_grant_expiry_within_grant(backend: Backend) {
    let (s, grant) = with_expiry(backend).await;
    let entry = expiry_entry(&s).await;
    ledger_entries::Entity::update_many()
        .col_expr(
            ledger_entries::Column::CreatedAt,
            Expr::value(Timestamp(entry.created_at.micros() - 1)),
        )
        .filter(ledger_entries::Column::Id.eq(entry.id))
        .exec(&s.app.app.db)
        .await
        .unwrap();
    assert_only_violated(
        &s.app,
        Invariant::GrantExpiryWithinGrant,
        Subject::Grant(grant),
    )
    .await;
}

async fn an_expiry_the_grant_does_not_record_breaks_expired_equals_grant_expiries(
    backend: Backend,
) {
    let (s, grant) = with_expiry(backend).await;
    // The ledger and the cached balance agree; the grant does not know.
    bump_expiry_entry(&s, 1).await;
    bump_tenant(&s.app, &s.tenant, tenants::Column::ExpiredNanos, 1).await;
    let report = report(&s.app).await;
    assert_eq!(
        report.violated(),
        [
            Invariant::ExpiredEqualsGrantExpiries,
            Invariant::GrantExpiryWithinGrant
        ],
        "{report}"
    );
    let named = |invariant| {
        report
            .check(invariant)
            .violations
            .iter()
            .map(|violation| violation.subject)
            .collect::<Vec<_>>()
    };
    assert_eq!(
        named(Invariant::ExpiredEqualsGrantExpiries),
        [Subject::Tenant(s.tenant.id)]
    );
    assert_eq!(
        named(Invariant::GrantExpiryWithinGrant),
        [Subject::Grant(grant)]
    );
}

async fn charges_counted_twice_break_charges_attributed_to_grants(backend: Backend) {
    let (s, _) = with_expiry(backend).await;
    bump_tenant(&s.app, &s.tenant, tenants::Column::AttributedNanos, 1).await;
    assert_only_violated(
        &s.app,
        Invariant::ChargesAttributedToGrants,
        Subject::Tenant(s.tenant.id),
    )
    .await;
}

async fn a_drifted_spend_counter_breaks_spend_counters_match_jobs(backend: Backend) {
    let (s, _) = with_expiry(backend).await;
    bump_tenant(&s.app, &s.tenant, tenants::Column::SpendMonthNanos, -1).await;
    assert_only_violated(
        &s.app,
        Invariant::SpendCountersMatchJobs,
        Subject::Tenant(s.tenant.id),
    )
    .await;
}
