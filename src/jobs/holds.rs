//! A terminal job's hold: what it resolves to, and what its resolution writes with it
//! in the same transaction — the tenant's spend released, the `job.*` webhook
//! deliveries, the batch's totals.

use super::budget::Spent;
use crate::billing::batch_totals::BatchTotals;
use crate::billing::ledger::{self, Resolution};
use crate::billing::{Credits, limits};
use crate::jobs::lifecycle;
use entity::{ReservationStatus, credit_reservations, jobs};
use sea_orm::{ColumnTrait, ConnectionTrait, DbErr, EntityTrait, QueryFilter};
use std::collections::HashMap;
use uuid::Uuid;

/// How a terminal job's hold is resolved: charged the sum of its attempts' customer
/// charges (the settlement caps it at the hold), the rest released. A succeeded job is
/// always settled, even for nothing; any other job only when an attempt charged.
/// ([`lifecycle::resolution`] of the job as it is.)
pub fn resolution(job: &jobs::Model, final_attempt: Option<Uuid>, spent: &Spent) -> Resolution {
    lifecycle::resolution(job.id, job.status, final_attempt, spent)
}

/// Resolves a terminal job's hold (see [`resolution`]) in the caller's transaction.
pub async fn resolve_hold(
    transaction: &impl ConnectionTrait,
    job: &jobs::Model,
    final_attempt: Option<Uuid>,
    spent: &Spent,
) -> Result<(), DbErr> {
    resolve_holds(
        transaction,
        &[(job, resolution(job, final_attempt, spent))],
        BatchTotals::default(),
    )
    .await
}

/// Resolves terminal jobs' holds (each with its [`resolution`]) in the caller's
/// transaction, and writes in it what follows from each: the spend its settlement
/// released ([`limits::release_spend`]) and its `job.*` webhook deliveries. `job` is
/// the row after its terminal update. Last, the batches of those jobs move by what
/// finished, together with `progress`, the transaction's other changes to them.
pub async fn resolve_holds(
    transaction: &impl ConnectionTrait,
    terminal: &[(&jobs::Model, Resolution)],
    mut progress: BatchTotals,
) -> Result<(), DbErr> {
    let resolutions: Vec<Resolution> = terminal.iter().map(|(_, resolution)| *resolution).collect();
    let settlements = ledger::resolve_holds(transaction, &resolutions).await?;
    // After the ledger, which locks the tenants' rows in id order: the spend counters
    // are on those rows, so this takes no lock of its own.
    let released = terminal
        .iter()
        .zip(&settlements)
        .filter_map(|((job, _), settlement)| {
            let settlement = settlement.as_ref()?;
            // What the operator absorbs stays in the tenant's spend: the caps bound it.
            Some((
                job.tenant_id,
                job.created_at,
                settlement.released - settlement.absorbed,
            ))
        });
    limits::release_spends(transaction, released).await?;
    // The webhook outbox rows commit with the jobs' terminal state, or not at all.
    let finished: Vec<(&jobs::Model, Credits)> = terminal
        .iter()
        .zip(&settlements)
        .map(|((job, _), settlement)| {
            let charged = settlement
                .as_ref()
                .map_or(Credits::ZERO, |settlement| settlement.charged);
            (*job, charged)
        })
        .collect();
    crate::outbox::enqueue_jobs_finished(transaction, &finished).await?;
    for ((job, _), settlement) in terminal.iter().zip(&settlements) {
        progress.item_finished(job, settlement.as_ref());
    }
    // After the tenants' rows, as every writer of both.
    progress.apply(transaction).await?;
    Ok(())
}

/// The credits held for each of `job_ids` while its hold is open; a job whose hold is
/// resolved is missing.
pub async fn open_holds(
    db: &impl ConnectionTrait,
    job_ids: &[Uuid],
) -> Result<HashMap<Uuid, Credits>, DbErr> {
    Ok(credit_reservations::Entity::find()
        .filter(credit_reservations::Column::JobId.is_in(job_ids.iter().copied()))
        .filter(credit_reservations::Column::Status.eq(ReservationStatus::Held))
        .all(db)
        .await?
        .into_iter()
        .map(|reservation| {
            (
                reservation.job_id,
                Credits::from_nanos(reservation.amount_nanos),
            )
        })
        .collect())
}
