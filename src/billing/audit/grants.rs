//! Each credit grant against its expiry: never more lost than it had, its expiry
//! entries in the ledger agreeing with what it records as expired, and after its
//! instant consumed only through the holds it backed.

use super::report::{Invariant, Recorder, Subject, VIOLATIONS_SHOWN, Violation, credits};
use entity::{
    LedgerEntryKind, ReservationStatus, Timestamp, credit_grants, credit_reservations,
    hold_backings, ledger_entries,
};
use sea_orm::sea_query::{Expr, ExprTrait, IntoColumnRef, Query};
use sea_orm::{
    ColumnTrait, Condition, ConnectionTrait, DbErr, EntityTrait, FromQueryResult, PaginatorTrait,
    QueryFilter, QueryOrder, QuerySelect,
};
use std::collections::HashMap;
use uuid::Uuid;

/// A grant's expiry entries, summed.
#[derive(FromQueryResult)]
struct GrantExpiries {
    grant_id: Uuid,
    count: i64,
    total: i64,
    earliest: i64,
    latest: i64,
}

pub(super) async fn audit_grants(
    db: &impl ConnectionTrait,
    recorder: &mut Recorder,
    page_size: u64,
) -> Result<(), DbErr> {
    let mut after: Option<Uuid> = None;
    loop {
        let mut query = credit_grants::Entity::find()
            .order_by_asc(credit_grants::Column::Id)
            .limit(page_size);
        if let Some(after) = after {
            query = query.filter(credit_grants::Column::Id.gt(after));
        }
        let page = query.all(db).await?;
        let Some(last) = page.last() else {
            break;
        };
        after = Some(last.id);
        audit_grant_page(db, recorder, &page).await?;
        audit_backings(db, recorder, &page).await?;
        if (page.len() as u64) < page_size {
            break;
        }
    }
    audit_stray_expiries(db, recorder).await
}

async fn audit_grant_page(
    db: &impl ConnectionTrait,
    recorder: &mut Recorder,
    page: &[credit_grants::Model],
) -> Result<(), DbErr> {
    let invariant = Invariant::GrantExpiryWithinGrant;
    recorder.checked(invariant, page.len() as u64);
    let expiries: HashMap<Uuid, GrantExpiries> = ledger_entries::Entity::find()
        .select_only()
        .column(ledger_entries::Column::GrantId)
        .column_as(
            Expr::col(ledger_entries::Column::Id)
                .count()
                .cast_as("BIGINT"),
            "count",
        )
        .column_as(
            Expr::col(ledger_entries::Column::AmountNanos)
                .sum()
                .cast_as("BIGINT"),
            "total",
        )
        .column_as(
            Expr::col(ledger_entries::Column::CreatedAt).min(),
            "earliest",
        )
        .column_as(Expr::col(ledger_entries::Column::CreatedAt).max(), "latest")
        .filter(ledger_entries::Column::Kind.eq(LedgerEntryKind::Expiry))
        .filter(ledger_entries::Column::GrantId.is_in(page.iter().map(|grant| grant.id)))
        .group_by(ledger_entries::Column::GrantId)
        .into_model::<GrantExpiries>()
        .all(db)
        .await?
        .into_iter()
        .map(|row| (row.grant_id, row))
        .collect();
    for grant in page {
        let mut problems = Vec::new();
        let (amount, consumed, expired) = (
            grant.amount_nanos,
            grant.consumed_nanos,
            grant.expired_nanos,
        );
        if consumed < 0 || expired < 0 {
            problems.push(format!(
                "consumed {} or expired {} is negative",
                credits(consumed),
                credits(expired)
            ));
        }
        if i128::from(consumed) + i128::from(expired) > i128::from(amount) {
            problems.push(format!(
                "consumed {} + expired {} exceed the grant of {}",
                credits(consumed),
                credits(expired),
                credits(amount)
            ));
        }
        let entries = expiries.get(&grant.id);
        let in_ledger = entries.map_or(0, |entries| entries.total);
        if in_ledger != expired {
            problems.push(format!(
                "{} expiry entries total {}, the grant records {} expired",
                entries.map_or(0, |entries| entries.count),
                credits(in_ledger),
                credits(expired)
            ));
        }
        if let Some(entries) = entries {
            match grant.expires_at {
                None => problems.push("a grant that never expires has expiry entries".to_owned()),
                Some(expires_at)
                    if Timestamp(entries.earliest) != expires_at
                        || Timestamp(entries.latest) != expires_at =>
                {
                    problems.push(format!(
                        "expiry entries dated {}..{}, not at the grant's expiry {}",
                        Timestamp(entries.earliest).to_datetime().to_rfc3339(),
                        Timestamp(entries.latest).to_datetime().to_rfc3339(),
                        expires_at.to_datetime().to_rfc3339()
                    ))
                }
                Some(_) => {}
            }
        }
        if !problems.is_empty() {
            recorder.violation(invariant, Subject::Grant(grant.id), problems.join("; "));
        }
    }
    Ok(())
}

/// After a grant's instant only the holds taken before it consume it: what is left of
/// a lapsed grant equals its open backings, and each backing is used up by its own
/// hold alone.
async fn audit_backings(
    db: &impl ConnectionTrait,
    recorder: &mut Recorder,
    page: &[credit_grants::Model],
) -> Result<(), DbErr> {
    let invariant = Invariant::NoChargeAfterExpiry;
    recorder.checked(invariant, page.len() as u64);
    let of_page = hold_backings::Entity::find()
        .filter(hold_backings::Column::GrantId.is_in(page.iter().map(|grant| grant.id)))
        .all(db)
        .await?;
    let reservations: HashMap<Uuid, credit_reservations::Model> =
        credit_reservations::Entity::find()
            .filter(
                credit_reservations::Column::Id
                    .is_in(of_page.iter().map(|backing| backing.reservation_id)),
            )
            .all(db)
            .await?
            .into_iter()
            .map(|reservation| (reservation.id, reservation))
            .collect();
    // Every backing of those holds, of any grant: (backed, consumed) per hold.
    let mut per_hold: HashMap<Uuid, (i64, i64)> = HashMap::new();
    for backing in hold_backings::Entity::find()
        .filter(hold_backings::Column::ReservationId.is_in(reservations.keys().copied()))
        .all(db)
        .await?
    {
        let sums = per_hold.entry(backing.reservation_id).or_insert((0, 0));
        *sums = (
            sums.0 + backing.amount_nanos,
            sums.1 + backing.consumed_nanos,
        );
    }
    let mut by_grant: HashMap<Uuid, Vec<&hold_backings::Model>> = HashMap::new();
    for backing in &of_page {
        by_grant.entry(backing.grant_id).or_default().push(backing);
    }
    for grant in page {
        let mut problems = Vec::new();
        let backings = by_grant.remove(&grant.id).unwrap_or_default();
        let left = grant.amount_nanos - grant.consumed_nanos - grant.expired_nanos;
        let still_backed: i64 = backings
            .iter()
            .filter(|backing| !backing.resolved)
            .map(|backing| backing.amount_nanos)
            .sum();
        if grant.lapsed && left != still_backed {
            problems.push(format!(
                "lapsed with {} left but backing {} of open holds",
                credits(left),
                credits(still_backed)
            ));
        }
        if !grant.lapsed && !backings.is_empty() {
            problems.push(format!("{} backings of a grant not lapsed", backings.len()));
        }
        for backing in backings {
            let (amount, consumed, expired) = (
                backing.amount_nanos,
                backing.consumed_nanos,
                backing.expired_nanos,
            );
            let used_up = consumed >= 0 && expired >= 0 && consumed + expired == amount;
            let untouched = consumed == 0 && expired == 0;
            if amount <= 0 || (backing.resolved && !used_up) || (!backing.resolved && !untouched) {
                problems.push(format!(
                    "backing {} of {} has consumed {} and expired {} (resolved: {})",
                    backing.id,
                    credits(amount),
                    credits(consumed),
                    credits(expired),
                    backing.resolved
                ));
            }
            let Some(hold) = reservations.get(&backing.reservation_id) else {
                problems.push(format!("backing {} names no hold", backing.id));
                continue;
            };
            if grant
                .expires_at
                .is_none_or(|instant| hold.created_at >= instant)
                || hold.tenant_id != grant.tenant_id
            {
                problems.push(format!(
                    "backs hold {}, taken after the grant's instant or of another tenant",
                    hold.id
                ));
            }
            if backing.resolved && hold.status == ReservationStatus::Held {
                problems.push(format!(
                    "backing {} used up while its hold is open",
                    backing.id
                ));
            }
            let (backed, consumed_by_hold) = per_hold.get(&hold.id).copied().unwrap_or((0, 0));
            if backed != hold.backed_nanos
                || backed > hold.amount_nanos
                || consumed_by_hold > hold.settled_amount_nanos
            {
                problems.push(format!(
                    "hold {} of {} records {} backed, its backings {} of which {} consumed, \
                     it settled {}",
                    hold.id,
                    credits(hold.amount_nanos),
                    credits(hold.backed_nanos),
                    credits(backed),
                    credits(consumed_by_hold),
                    credits(hold.settled_amount_nanos)
                ));
            }
        }
        if !problems.is_empty() {
            recorder.violation(invariant, Subject::Grant(grant.id), problems.join("; "));
        }
    }
    Ok(())
}

/// Expiry entries that name no grant, or a grant of another tenant.
async fn audit_stray_expiries(
    db: &impl ConnectionTrait,
    recorder: &mut Recorder,
) -> Result<(), DbErr> {
    let own_grant = Expr::exists(
        Query::select()
            .expr(Expr::val(1))
            .from(credit_grants::Entity)
            .and_where(
                Expr::col((credit_grants::Entity, credit_grants::Column::Id)).equals(
                    (ledger_entries::Entity, ledger_entries::Column::GrantId).into_column_ref(),
                ),
            )
            .and_where(
                Expr::col((credit_grants::Entity, credit_grants::Column::TenantId)).equals(
                    (ledger_entries::Entity, ledger_entries::Column::TenantId).into_column_ref(),
                ),
            )
            .to_owned(),
    );
    let strays = ledger_entries::Entity::find()
        .filter(ledger_entries::Column::Kind.eq(LedgerEntryKind::Expiry))
        .filter(
            Condition::any()
                .add(ledger_entries::Column::GrantId.is_null())
                .add(own_grant.not()),
        );
    let count = strays.clone().count(db).await?;
    if count > 0 {
        let shown = strays
            .order_by_asc(ledger_entries::Column::Id)
            .limit(VIOLATIONS_SHOWN as u64)
            .all(db)
            .await?
            .into_iter()
            .map(|entry| Violation {
                subject: Subject::LedgerEntry(entry.id),
                detail: format!(
                    "expires {} of tenant {} for grant {:?}, not a grant of that tenant",
                    credits(entry.amount_nanos),
                    entry.tenant_id,
                    entry.grant_id
                ),
            })
            .collect();
        recorder.violations(Invariant::GrantExpiryWithinGrant, count, shown);
    }
    Ok(())
}
