//! Credit of a lapsed grant that still backs open holds, tied to those holds.
//!
//! At a grant's instant, what is left of it either expires or backs holds that were
//! open at that instant. The backed part is written down per hold ([`assign`]): only
//! the charge of that hold may consume it, and what the hold does not consume expires
//! when it resolves ([`settle`]). Re-matching held credit to grants at every sweep
//! instead would let a hold taken after the instant inherit the backing of an older
//! one, and its charge spend credit that had expired.

use super::Credits;
use crate::billing::balance;
use entity::{
    LedgerEntryKind, ReservationStatus, Timestamp, credit_grants, credit_reservations,
    hold_backings, ledger_entries, tenants,
};
use sea_orm::sea_query::{Expr, ExprTrait, Query};
use sea_orm::{
    ActiveValue::Set, ColumnTrait, ConnectionTrait, DbErr, EntityTrait, QueryFilter, QueryOrder,
    QuerySelect,
};
use std::collections::{BTreeMap, HashMap};
use uuid::Uuid;

/// Holds read per page while a lapsing grant is set aside for them.
const ASSIGN_PAGE: u64 = 500;
/// Rows per multi-row insert, far below SQLite's bound on parameters.
const INSERT_CHUNK: usize = 500;

/// The tenant's held credit, not yet backed by a lapsed grant, of holds taken before
/// `instant`: what a grant lapsing at `instant` may back.
pub(super) async fn unbacked_before(
    db: &impl ConnectionTrait,
    tenant_id: Uuid,
    instant: Timestamp,
) -> Result<Credits, DbErr> {
    let unbacked: Option<i64> = credit_reservations::Entity::find()
        .select_only()
        .column_as(
            Expr::col(credit_reservations::Column::AmountNanos)
                .sub(Expr::col(credit_reservations::Column::BackedNanos))
                .sum()
                .cast_as("BIGINT"),
            "unbacked",
        )
        .filter(held_before(tenant_id, instant))
        .into_tuple()
        .one(db)
        .await?
        .flatten();
    Ok(Credits::from_nanos(unbacked.unwrap_or(0)))
}

fn held_before(tenant_id: Uuid, instant: Timestamp) -> sea_orm::Condition {
    sea_orm::Condition::all()
        .add(credit_reservations::Column::TenantId.eq(tenant_id))
        .add(credit_reservations::Column::Status.eq(ReservationStatus::Held))
        .add(credit_reservations::Column::CreatedAt.lt(instant))
        .add(
            Expr::col(credit_reservations::Column::BackedNanos)
                .lt(Expr::col(credit_reservations::Column::AmountNanos)),
        )
}

/// Sets `amount` of `grant` aside for the holds taken before its instant that are
/// not fully backed yet, oldest first. The caller computed `amount` from
/// [`unbacked_before`] under the tenant's lock, so the holds cover it.
pub(super) async fn assign(
    db: &impl ConnectionTrait,
    grant: &credit_grants::Model,
    instant: Timestamp,
    amount: Credits,
) -> Result<(), DbErr> {
    let mut left = amount.nanos();
    let mut after: Option<Uuid> = None;
    while left > 0 {
        let mut query = credit_reservations::Entity::find()
            .filter(held_before(grant.tenant_id, instant))
            .order_by_asc(credit_reservations::Column::Id)
            .limit(ASSIGN_PAGE);
        if let Some(after) = after {
            query = query.filter(credit_reservations::Column::Id.gt(after));
        }
        let page = query.all(db).await?;
        let Some(last) = page.last() else {
            break;
        };
        after = Some(last.id);
        let full_page = page.len() as u64 == ASSIGN_PAGE;
        let mut rows = Vec::new();
        let mut whole = Vec::new();
        for reservation in page {
            if left == 0 {
                break;
            }
            let unbacked = reservation.amount_nanos - reservation.backed_nanos;
            let taken = Ord::min(unbacked, left);
            left -= taken;
            rows.push(hold_backings::ActiveModel {
                id: Set(Uuid::now_v7()),
                tenant_id: Set(grant.tenant_id),
                grant_id: Set(grant.id),
                reservation_id: Set(reservation.id),
                amount_nanos: Set(taken),
                consumed_nanos: Set(0),
                expired_nanos: Set(0),
                resolved: Set(false),
            });
            if taken == unbacked {
                whole.push(reservation.id);
            } else {
                credit_reservations::Entity::update_many()
                    .col_expr(
                        credit_reservations::Column::BackedNanos,
                        Expr::col(credit_reservations::Column::BackedNanos).add(taken),
                    )
                    .filter(credit_reservations::Column::Id.eq(reservation.id))
                    .exec(db)
                    .await?;
            }
        }
        for chunk in rows.chunks(INSERT_CHUNK) {
            hold_backings::Entity::insert_many(chunk.to_vec())
                .exec(db)
                .await?;
        }
        for chunk in whole.chunks(INSERT_CHUNK) {
            credit_reservations::Entity::update_many()
                .col_expr(
                    credit_reservations::Column::BackedNanos,
                    Expr::col(credit_reservations::Column::AmountNanos),
                )
                .filter(credit_reservations::Column::Id.is_in(chunk.iter().copied()))
                .exec(db)
                .await?;
        }
        if !full_page {
            break;
        }
    }
    if left > 0 {
        // The holds were summed under the same lock a moment ago; the audit names the
        // grant whose backing does not add up.
        tracing::error!(grant.id = %grant.id, left = %Credits::from_nanos(left), "a lapsing grant found fewer holds to back than it counted");
    }
    Ok(())
}

/// How one resolved hold uses up its backings.
#[derive(Debug, PartialEq, Eq)]
struct Use {
    consumed: i64,
    expired: i64,
}

/// A resolved hold's charge consumes its backings in the order charges consume
/// grants (they are all past their instant, so the soonest-expiring first); what the
/// charge does not cover expires.
fn use_up(backings: &[i64], charged: i64) -> Vec<Use> {
    let mut charge_left = Ord::max(charged, 0);
    backings
        .iter()
        .map(|&amount| {
            let consumed = Ord::min(amount, charge_left);
            charge_left -= consumed;
            Use {
                consumed,
                expired: amount - consumed,
            }
        })
        .collect()
}

/// An open backing whose hold has resolved.
fn resolved_hold() -> Expr {
    Expr::exists(
        Query::select()
            .expr(Expr::val(1))
            .from(credit_reservations::Entity)
            .and_where(
                Expr::col((credit_reservations::Entity, credit_reservations::Column::Id))
                    .equals((hold_backings::Entity, hold_backings::Column::ReservationId)),
            )
            .and_where(
                Expr::col((
                    credit_reservations::Entity,
                    credit_reservations::Column::Status,
                ))
                .ne(ReservationStatus::Held),
            )
            .to_owned(),
    )
}

/// Uses up the backings of the tenant's holds that have resolved since (see
/// [`use_up`]): consumed credit counts as attributed, the rest expires through
/// `expiry` entries dated at each grant's instant. Returns the credits that expired.
///
/// Run it under the tenant's lock before charges are spread over the grants: a
/// resolved hold's charge is attributed to its own backings first.
pub(super) async fn settle(db: &impl ConnectionTrait, tenant_id: Uuid) -> Result<Credits, DbErr> {
    let backings = hold_backings::Entity::find()
        .filter(hold_backings::Column::TenantId.eq(tenant_id))
        .filter(hold_backings::Column::Resolved.eq(false))
        .filter(resolved_hold())
        .all(db)
        .await?;
    if backings.is_empty() {
        return Ok(Credits::ZERO);
    }
    let charged: HashMap<Uuid, i64> = credit_reservations::Entity::find()
        .select_only()
        .column(credit_reservations::Column::Id)
        .column(credit_reservations::Column::SettledAmountNanos)
        .filter(
            credit_reservations::Column::Id
                .is_in(backings.iter().map(|backing| backing.reservation_id)),
        )
        .into_tuple::<(Uuid, i64)>()
        .all(db)
        .await?
        .into_iter()
        .collect();
    let grants: HashMap<Uuid, credit_grants::Model> = credit_grants::Entity::find()
        .filter(credit_grants::Column::Id.is_in(backings.iter().map(|backing| backing.grant_id)))
        .all(db)
        .await?
        .into_iter()
        .map(|grant| (grant.id, grant))
        .collect();
    let mut by_hold: BTreeMap<Uuid, Vec<&hold_backings::Model>> = BTreeMap::new();
    for backing in &backings {
        by_hold
            .entry(backing.reservation_id)
            .or_default()
            .push(backing);
    }
    // Per grant: (consumed, expired).
    let mut per_grant: BTreeMap<Uuid, (i64, i64)> = BTreeMap::new();
    let mut released_whole = Vec::new();
    for (reservation_id, mut held) in by_hold {
        held.sort_by_key(|backing| {
            grants
                .get(&backing.grant_id)
                .map(|grant| (grant.expires_at, grant.created_at, grant.id))
        });
        let amounts: Vec<i64> = held.iter().map(|backing| backing.amount_nanos).collect();
        let charge = charged.get(&reservation_id).copied().unwrap_or(0);
        for (backing, used) in held.iter().zip(use_up(&amounts, charge)) {
            let totals = per_grant.entry(backing.grant_id).or_insert((0, 0));
            *totals = (totals.0 + used.consumed, totals.1 + used.expired);
            if used.consumed == 0 {
                released_whole.push(backing.id);
                continue;
            }
            hold_backings::Entity::update_many()
                .col_expr(
                    hold_backings::Column::ConsumedNanos,
                    Expr::value(used.consumed),
                )
                .col_expr(
                    hold_backings::Column::ExpiredNanos,
                    Expr::value(used.expired),
                )
                .col_expr(hold_backings::Column::Resolved, Expr::value(true))
                .filter(hold_backings::Column::Id.eq(backing.id))
                .exec(db)
                .await?;
        }
    }
    for chunk in released_whole.chunks(INSERT_CHUNK) {
        hold_backings::Entity::update_many()
            .col_expr(
                hold_backings::Column::ExpiredNanos,
                Expr::col(hold_backings::Column::AmountNanos),
            )
            .col_expr(hold_backings::Column::Resolved, Expr::value(true))
            .filter(hold_backings::Column::Id.is_in(chunk.iter().copied()))
            .exec(db)
            .await?;
    }
    let (mut consumed, mut expired) = (0, 0);
    let mut entries = Vec::new();
    for (grant_id, (grant_consumed, grant_expired)) in per_grant {
        consumed += grant_consumed;
        expired += grant_expired;
        credit_grants::Entity::update_many()
            .col_expr(
                credit_grants::Column::ConsumedNanos,
                Expr::col(credit_grants::Column::ConsumedNanos).add(grant_consumed),
            )
            .col_expr(
                credit_grants::Column::ExpiredNanos,
                Expr::col(credit_grants::Column::ExpiredNanos).add(grant_expired),
            )
            .filter(credit_grants::Column::Id.eq(grant_id))
            .exec(db)
            .await?;
        if let (true, Some(expires_at)) = (
            grant_expired > 0,
            grants.get(&grant_id).and_then(|grant| grant.expires_at),
        ) {
            entries.push(balance::entry(
                tenant_id,
                (None, Some(grant_id)),
                LedgerEntryKind::Expiry,
                Credits::from_nanos(grant_expired),
                expires_at,
            ));
        }
    }
    if !entries.is_empty() {
        ledger_entries::Entity::insert_many(entries)
            .exec(db)
            .await?;
    }
    tenants::Entity::update_many()
        .col_expr(
            tenants::Column::AttributedNanos,
            Expr::col(tenants::Column::AttributedNanos).add(consumed),
        )
        .col_expr(
            tenants::Column::ExpiredNanos,
            Expr::col(tenants::Column::ExpiredNanos).add(expired),
        )
        .filter(tenants::Column::Id.eq(tenant_id))
        .exec(db)
        .await?;
    Ok(Credits::from_nanos(expired))
}

/// Whether a hold of the tenant backed by a lapsed grant has resolved, so that
/// [`settle`] has work: read without a lock, for the sweep to skip idle tenants.
pub(super) async fn any_to_settle(
    db: &impl ConnectionTrait,
    tenant_id: Uuid,
) -> Result<bool, DbErr> {
    let found = hold_backings::Entity::find()
        .select_only()
        .column(hold_backings::Column::Id)
        .filter(hold_backings::Column::TenantId.eq(tenant_id))
        .filter(hold_backings::Column::Resolved.eq(false))
        .filter(resolved_hold())
        .limit(1)
        .into_tuple::<Uuid>()
        .one(db)
        .await?;
    Ok(found.is_some())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn uses(backings: &[i64], charged: i64) -> Vec<(i64, i64)> {
        use_up(backings, charged)
            .into_iter()
            .map(|used| (used.consumed, used.expired))
            .collect()
    }

    #[test]
    fn a_released_hold_lets_all_its_backing_expire() {
        assert_eq!(uses(&[40, 10], 0), vec![(0, 40), (0, 10)]);
    }

    #[test]
    fn a_charge_consumes_the_backings_in_order_and_the_rest_expires() {
        assert_eq!(uses(&[40, 10], 45), vec![(40, 0), (5, 5)]);
        assert_eq!(uses(&[40], 30), vec![(30, 10)]);
    }

    #[test]
    fn a_charge_above_the_backing_consumes_all_of_it() {
        assert_eq!(uses(&[40, 10], 80), vec![(40, 0), (10, 0)]);
    }
}
