//! Resolving holds: a job's hold settled for what it charged, the rest released, or
//! released whole — exactly once, with the ledger entries and cached balance that
//! explain it.

use super::INSERT_CHUNK;
use crate::billing::Credits;
use crate::billing::balance::entry;
use crate::db::Values;
use entity::{
    LedgerEntryKind, ReservationStatus, Timestamp, charges, credit_reservations, ledger_entries,
    tenants,
};
use sea_orm::sea_query::{Expr, ExprTrait};
use sea_orm::{
    ActiveValue::Set, ColumnTrait, ConnectionTrait, DbBackend, DbErr, EntityTrait, QueryFilter,
};
use std::collections::{BTreeMap, HashMap, HashSet};
use uuid::Uuid;

/// How a job's hold was resolved.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Settlement {
    pub charged: Credits,
    pub released: Credits,
    /// Of `released`, the provider cost the operator absorbs (see
    /// [`Resolution::absorbed`]).
    pub absorbed: Credits,
}

/// Charges the customer for a job's accepted attempt — at most the hold — and
/// releases the rest, in the caller's transaction.
///
/// Returns `None` when the reservation was already resolved: a hold resolves exactly
/// once, whoever asks twice.
pub async fn settle(
    db: &impl ConnectionTrait,
    job_id: Uuid,
    attempt_id: Uuid,
    charge: Credits,
) -> Result<Option<Settlement>, DbErr> {
    let resolution = Resolution {
        job_id,
        charge: Some((attempt_id, charge)),
        absorbed: Credits::ZERO,
    };
    Ok(resolve_holds(db, &[resolution]).await?.remove(0))
}

/// Releases a job's whole hold (failed or cancelled jobs). `None` when already resolved.
pub async fn release(db: &impl ConnectionTrait, job_id: Uuid) -> Result<Option<Settlement>, DbErr> {
    let resolution = Resolution {
        job_id,
        charge: None,
        absorbed: Credits::ZERO,
    };
    Ok(resolve_holds(db, &[resolution]).await?.remove(0))
}

/// How one job's hold is to be resolved.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Resolution {
    pub job_id: Uuid,
    /// The attempt the customer is charged for and the amount (capped at the hold);
    /// `None` releases the whole hold.
    pub charge: Option<(Uuid, Credits)>,
    /// The provider cost of the job's paid calls beyond what the customer is charged
    /// (an unknown outcome the policy does not pass on, a call cancelled after its
    /// prompt): the operator's, recorded up to what the hold releases.
    pub absorbed: Credits,
}

/// Resolves several jobs' holds in the caller's transaction with a few statements for
/// all of them: each is settled ([`settle`]) or released ([`release`]) exactly once;
/// the answer for a hold already resolved is `None`. Tenants' rows are updated last,
/// once per tenant and in id order, so that concurrent batches never wait on each
/// other in a cycle.
pub async fn resolve_holds(
    db: &impl ConnectionTrait,
    resolutions: &[Resolution],
) -> Result<Vec<Option<Settlement>>, DbErr> {
    let mut reservations: HashMap<Uuid, credit_reservations::Model> =
        credit_reservations::Entity::find()
            .filter(
                credit_reservations::Column::JobId
                    .is_in(resolutions.iter().map(|resolution| resolution.job_id)),
            )
            .filter(credit_reservations::Column::Status.eq(ReservationStatus::Held))
            .all(db)
            .await?
            .into_iter()
            .map(|reservation| (reservation.job_id, reservation))
            .collect();
    let now = Timestamp::now();
    // What each hold becomes, decided on the reservation as read.
    let mut planned = Vec::with_capacity(resolutions.len());
    for resolution in resolutions {
        let Some(reservation) = reservations.remove(&resolution.job_id) else {
            planned.push(None);
            continue;
        };
        let held = Credits::from_nanos(reservation.amount_nanos);
        let charged = resolution
            .charge
            .map_or(Credits::ZERO, |(_, amount)| amount.min(held));
        let released = held - charged;
        let absorbed = if resolution.absorbed.is_positive() {
            resolution.absorbed.min(released)
        } else {
            Credits::ZERO
        };
        planned.push(Some((
            reservation,
            Settlement {
                charged,
                released,
                absorbed,
            },
        )));
    }
    let resolved = mark_resolved(db, &planned, resolutions, now).await?;
    let mut settlements = Vec::with_capacity(resolutions.len());
    let mut charge_rows = Vec::new();
    let mut entry_rows = Vec::new();
    // Per tenant: credits no longer held, credits charged, and whether a hold backed
    // by a lapsed grant resolved (what it leaves of the grant is due to expire now).
    let mut tenant_moves: BTreeMap<Uuid, (Credits, Credits, bool)> = BTreeMap::new();
    for (resolution, plan) in resolutions.iter().zip(planned) {
        // The status condition makes resolution happen once even if two callers
        // raced past the read above.
        let Some((reservation, settlement)) =
            plan.filter(|(reservation, _)| resolved.contains(&reservation.id))
        else {
            settlements.push(None);
            continue;
        };
        let Settlement {
            charged, released, ..
        } = settlement;
        let job = (Some(resolution.job_id), None);
        if let Some((attempt_id, _)) = resolution.charge {
            charge_rows.push(charges::ActiveModel {
                id: Set(Uuid::now_v7()),
                job_id: Set(resolution.job_id),
                tenant_id: Set(reservation.tenant_id),
                attempt_id: Set(attempt_id),
                amount_nanos: Set(charged.nanos()),
                created_at: Set(now),
            });
            entry_rows.push(entry(
                reservation.tenant_id,
                job,
                LedgerEntryKind::Charge,
                charged,
                now,
            ));
        }
        if released.is_positive() {
            entry_rows.push(entry(
                reservation.tenant_id,
                job,
                LedgerEntryKind::Release,
                released,
                now,
            ));
        }
        let moves = tenant_moves.entry(reservation.tenant_id).or_insert((
            Credits::ZERO,
            Credits::ZERO,
            false,
        ));
        *moves = (
            moves.0 + charged + released,
            moves.1 + charged,
            moves.2 || reservation.backed_nanos > 0,
        );
        settlements.push(Some(settlement));
    }
    for chunk in charge_rows.chunks(INSERT_CHUNK) {
        charges::Entity::insert_many(chunk.to_vec())
            .exec(db)
            .await?;
    }
    for chunk in entry_rows.chunks(INSERT_CHUNK) {
        ledger_entries::Entity::insert_many(chunk.to_vec())
            .exec(db)
            .await?;
    }
    // Last: a tenant's row is what every hold and settlement of the tenant needs, so
    // it stays locked for these statements and the caller's commit only.
    for (tenant_id, (unheld, charged, backed)) in tenant_moves {
        let mut update = tenants::Entity::update_many()
            .col_expr(
                tenants::Column::HeldNanos,
                Expr::col(tenants::Column::HeldNanos).sub(unheld.nanos()),
            )
            .col_expr(
                tenants::Column::ChargedNanos,
                Expr::col(tenants::Column::ChargedNanos).add(charged.nanos()),
            )
            .filter(tenants::Column::Id.eq(tenant_id));
        if backed {
            // Due at once: the next hold carries the expiry out before it can take
            // the released credit, and so does the sweep.
            update = update.col_expr(
                tenants::Column::NextExpiryAt,
                crate::billing::grant_expiry::earliest_expiry(now),
            );
        }
        update.exec(db).await?;
    }
    Ok(settlements)
}

/// Marks the planned holds settled or released in one statement, only where each is
/// still held; returns the reservations it marked.
async fn mark_resolved(
    db: &impl ConnectionTrait,
    planned: &[Option<(credit_reservations::Model, Settlement)>],
    resolutions: &[Resolution],
    now: Timestamp,
) -> Result<HashSet<Uuid>, DbErr> {
    let backend = db.get_database_backend();
    let mut values = Values::new(
        backend,
        "v",
        [
            "id",
            "status",
            "settled_amount_nanos",
            "released_amount_nanos",
            "absorbed_nanos",
        ],
    );
    let at = values.bind(now);
    for (plan, resolution) in planned.iter().zip(resolutions) {
        let Some((reservation, settlement)) = plan else {
            continue;
        };
        let status = if resolution.charge.is_some() {
            ReservationStatus::Settled
        } else {
            ReservationStatus::Released
        };
        values.push([
            reservation.id.into(),
            status.into(),
            settlement.charged.nanos().into(),
            settlement.released.nanos().into(),
            settlement.absorbed.nanos().into(),
        ]);
    }
    if values.is_empty() {
        return Ok(HashSet::new());
    }
    let returning = if backend == DbBackend::Postgres {
        "credit_reservations.id"
    } else {
        "id"
    };
    let sql = format!(
        "UPDATE credit_reservations SET
            status = v.status,
            settled_amount_nanos = v.settled_amount_nanos,
            released_amount_nanos = v.released_amount_nanos,
            absorbed_nanos = v.absorbed_nanos,
            resolved_at = {at}
        FROM v
        WHERE credit_reservations.id = v.id AND credit_reservations.status = 'held'
        RETURNING {returning}"
    );
    let mut marked = HashSet::new();
    for row in db.query_all_raw(values.statement(&sql)).await? {
        marked.insert(row.try_get_by_index::<Uuid>(0)?);
    }
    Ok(marked)
}
