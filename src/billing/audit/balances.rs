//! Each tenant's balance: the cached one against a replay of its ledger, and each
//! ledger total against the rows that explain it.

use super::report::{Invariant, Recorder, Subject, credits};
use crate::billing::balance::Balance;
use crate::billing::ledger;
use entity::{ReservationStatus, charges, credit_grants, credit_reservations, tenants};
use sea_orm::sea_query::{Expr, ExprTrait};
use sea_orm::{
    ColumnTrait, ConnectionTrait, DbErr, EntityTrait, QueryFilter, QueryOrder, QuerySelect, Select,
};
use std::collections::HashMap;
use uuid::Uuid;

/// Sums of `amount` per tenant over the rows `select` picks, for the tenants in `ids`.
async fn sums_by_tenant<E: EntityTrait>(
    db: &impl ConnectionTrait,
    select: Select<E>,
    tenant_id: E::Column,
    amount: E::Column,
    ids: &[Uuid],
) -> Result<HashMap<Uuid, i64>, DbErr> {
    let rows: Vec<(Uuid, i64)> = select
        .select_only()
        .column(tenant_id)
        .column_as(Expr::col(amount).sum().cast_as("BIGINT"), "total")
        .filter(tenant_id.is_in(ids.iter().copied()))
        .group_by(tenant_id)
        .into_tuple()
        .all(db)
        .await?;
    Ok(rows.into_iter().collect())
}

pub(super) async fn audit_tenants(
    db: &impl ConnectionTrait,
    recorder: &mut Recorder,
    page_size: u64,
) -> Result<(), DbErr> {
    let mut after: Option<Uuid> = None;
    loop {
        let mut query = tenants::Entity::find()
            .order_by_asc(tenants::Column::Id)
            .limit(page_size);
        if let Some(after) = after {
            query = query.filter(tenants::Column::Id.gt(after));
        }
        let page = query.all(db).await?;
        let Some(last) = page.last() else {
            return Ok(());
        };
        after = Some(last.id);
        let ids: Vec<Uuid> = page.iter().map(|tenant| tenant.id).collect();
        let grants = sums_by_tenant(
            db,
            credit_grants::Entity::find(),
            credit_grants::Column::TenantId,
            credit_grants::Column::AmountNanos,
            &ids,
        )
        .await?;
        let open_holds = sums_by_tenant(
            db,
            credit_reservations::Entity::find()
                .filter(credit_reservations::Column::Status.eq(ReservationStatus::Held)),
            credit_reservations::Column::TenantId,
            credit_reservations::Column::AmountNanos,
            &ids,
        )
        .await?;
        let charged = sums_by_tenant(
            db,
            charges::Entity::find(),
            charges::Column::TenantId,
            charges::Column::AmountNanos,
            &ids,
        )
        .await?;
        let grants_expired = sums_by_tenant(
            db,
            credit_grants::Entity::find(),
            credit_grants::Column::TenantId,
            credit_grants::Column::ExpiredNanos,
            &ids,
        )
        .await?;
        let grants_consumed = sums_by_tenant(
            db,
            credit_grants::Entity::find(),
            credit_grants::Column::TenantId,
            credit_grants::Column::ConsumedNanos,
            &ids,
        )
        .await?;
        super::spend::audit_spend_counters(db, recorder, &page).await?;
        for invariant in [
            Invariant::BalanceMatchesLedger,
            Invariant::AvailableNonNegative,
            Invariant::GrantedEqualsGrants,
            Invariant::HeldEqualsOpenReservations,
            Invariant::ChargedEqualsCharges,
            Invariant::ExpiredEqualsGrantExpiries,
            Invariant::ChargesAttributedToGrants,
        ] {
            recorder.checked(invariant, page.len() as u64);
        }
        for tenant in &page {
            let subject = Subject::Tenant(tenant.id);
            let cached = Balance::from(tenant);
            let replayed = ledger::replay_balance(db, tenant.id).await?;
            if cached != replayed {
                recorder.violation(
                    Invariant::BalanceMatchesLedger,
                    subject,
                    format!(
                        "cached granted/held/charged/expired {}/{}/{}/{} ≠ ledger replay {}/{}/{}/{}",
                        cached.granted,
                        cached.held,
                        cached.charged,
                        cached.expired,
                        replayed.granted,
                        replayed.held,
                        replayed.charged,
                        replayed.expired
                    ),
                );
            }
            // Computed without saturation, so a negative amount shows as negative.
            let available = i128::from(cached.granted.nanos())
                - i128::from(cached.expired.nanos())
                - i128::from(cached.charged.nanos())
                - i128::from(cached.held.nanos());
            if available < 0
                || cached.held.nanos() < 0
                || cached.charged.nanos() < 0
                || cached.expired.nanos() < 0
            {
                recorder.violation(
                    Invariant::AvailableNonNegative,
                    subject,
                    format!(
                        "granted {} − expired {} − charged {} − held {} = {} nano-credits available",
                        cached.granted, cached.expired, cached.charged, cached.held, available
                    ),
                );
            }
            let consumed = grants_consumed.get(&tenant.id).copied().unwrap_or(0);
            if consumed != tenant.attributed_nanos || tenant.attributed_nanos > tenant.charged_nanos
            {
                recorder.violation(
                    Invariant::ChargesAttributedToGrants,
                    subject,
                    format!(
                        "grants consumed {}, the tenant counts {} attributed of {} charged",
                        credits(consumed),
                        credits(tenant.attributed_nanos),
                        credits(tenant.charged_nanos)
                    ),
                );
            }
            // Each ledger total against the rows that must explain it.
            let explained = [
                (
                    Invariant::GrantedEqualsGrants,
                    "granted",
                    replayed.granted,
                    "credit grants",
                    &grants,
                ),
                (
                    Invariant::HeldEqualsOpenReservations,
                    "held",
                    replayed.held,
                    "open reservations",
                    &open_holds,
                ),
                (
                    Invariant::ChargedEqualsCharges,
                    "charged",
                    replayed.charged,
                    "charges",
                    &charged,
                ),
                (
                    Invariant::ExpiredEqualsGrantExpiries,
                    "expired",
                    replayed.expired,
                    "grant expiries",
                    &grants_expired,
                ),
            ];
            for (invariant, total, in_ledger, rows, by_tenant) in explained {
                let in_rows = by_tenant.get(&tenant.id).copied().unwrap_or(0);
                if in_ledger.nanos() != in_rows {
                    recorder.violation(
                        invariant,
                        subject,
                        format!("ledger {total} {in_ledger} ≠ {rows} {}", credits(in_rows)),
                    );
                }
            }
        }
        if (page.len() as u64) < page_size {
            return Ok(());
        }
    }
}
