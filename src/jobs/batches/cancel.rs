//! Cancelling a batch: it is closed first — so no chunk can add items after — and
//! then its unfinished items are cancelled in bulk, a few hundred per transaction, as
//! `cancelJob` would cancel each: a queued item becomes CANCELLED with its hold
//! resolved by the charging policy, a running one is asked to stop and ends as its
//! worker sees the request.

use super::{close, find_batch};
use crate::billing::batch_totals::BatchTotals;
use crate::bus::{EventBus, EventNotice};
use crate::db::begin_write;
use crate::error::ServiceError;
use crate::jobs::budget::Spent;
use crate::jobs::holds;
use crate::jobs::lifecycle::{self, Cancel};
use crate::jobs::{events, observe};
use crate::metrics::Metrics;
use entity::{JobStatus, ProviderBatchState, Timestamp, batches, jobs, provider_batches};
use sea_orm::sea_query::{Expr, ExprTrait, LockBehavior, LockType};
use sea_orm::{
    ColumnTrait, DatabaseConnection, DbBackend, EntityTrait, PaginatorTrait, QueryFilter,
    QueryOrder, QuerySelect,
};
use std::time::Duration;
use tokio_util::sync::CancellationToken;
use uuid::Uuid;

/// Items cancelled per transaction: short enough that workers finishing other items
/// of the tenant never wait long for its row.
const ITEMS_PER_TRANSACTION: u64 = 500;
/// How long a cancel waits for items that other transactions hold (a claim, a finish)
/// before it leaves them to the flag they will see.
const PATIENCE: Duration = Duration::from_secs(10);
/// The pause before looking again at items another transaction holds.
const RECHECK: Duration = Duration::from_millis(25);

/// Closes the batch and cancels every item not yet finished; returns the batch as it
/// is then (FINISHED at once when nothing of it was running).
pub async fn cancel_batch(
    db: &DatabaseConnection,
    bus: &EventBus,
    metrics: &Metrics,
    tenant_id: Uuid,
    batch_id: Uuid,
) -> Result<batches::Model, ServiceError> {
    let transaction = begin_write(db).await?;
    close(&transaction, tenant_id, batch_id, true).await?;
    // Its provider batches are read now, not at their next poll: the cancel must reach
    // the provider before it runs (and bills) more of them.
    provider_batches::Entity::update_many()
        .col_expr(
            provider_batches::Column::NextPollAt,
            Expr::value(Timestamp::now()),
        )
        .filter(provider_batches::Column::BatchId.eq(batch_id))
        .filter(
            provider_batches::Column::State
                .is_in([ProviderBatchState::Preparing, ProviderBatchState::Submitted]),
        )
        .exec(&transaction)
        .await?;
    transaction.commit().await?;
    let cancelled = cancel_items(db, bus, metrics, batch_id).await?;
    tracing::info!(batch.id = %batch_id, tenant.id = %tenant_id, items = cancelled, "batch cancelled");
    find_batch(db, tenant_id, batch_id).await
}

/// How often [`run`] looks for cancelled batches with items left to cancel.
const RESUME_INTERVAL: Duration = Duration::from_secs(5);

/// Finishes the cancels that a process stopped mid-way (killed between the close and
/// the last of its transactions): every few seconds, the unfinished items of each
/// cancelled batch that are not yet asked to cancel are cancelled as cancelBatch would.
pub async fn run(db: DatabaseConnection, bus: EventBus, metrics: Metrics, stop: CancellationToken) {
    loop {
        if let Err(error) = resume(&db, &bus, &metrics).await {
            tracing::warn!(error = %error, "resuming batch cancels failed; it runs again shortly");
        }
        tokio::select! {
            () = stop.cancelled() => return,
            () = tokio::time::sleep(RESUME_INTERVAL) => {}
        }
    }
}

async fn resume(
    db: &DatabaseConnection,
    bus: &EventBus,
    metrics: &Metrics,
) -> Result<(), ServiceError> {
    let pending: Vec<Uuid> = batches::Entity::find()
        .select_only()
        .column(batches::Column::Id)
        .filter(batches::Column::CancelRequested.eq(true))
        .filter(batches::Column::Status.eq(entity::BatchStatus::Closed))
        .filter(Expr::cust(format!(
            "EXISTS (SELECT 1 FROM jobs WHERE jobs.batch_id = batches.id \
             AND jobs.status IN ({}, {}) AND NOT jobs.cancel_requested)",
            JobStatus::Queued.sql(),
            JobStatus::Running.sql()
        )))
        .into_tuple()
        .all(db)
        .await?;
    for batch_id in pending {
        let cancelled = cancel_items(db, bus, metrics, batch_id).await?;
        if cancelled > 0 {
            tracing::warn!(batch.id = %batch_id, items = cancelled, "finished a batch cancel that had stopped mid-way");
        }
    }
    Ok(())
}

/// Cancels the batch's unfinished items, a transaction at a time; returns how many.
async fn cancel_items(
    db: &DatabaseConnection,
    bus: &EventBus,
    metrics: &Metrics,
    batch_id: Uuid,
) -> Result<usize, ServiceError> {
    let started = std::time::Instant::now();
    let mut cancelled = 0usize;
    loop {
        let notices = cancel_some(db, batch_id).await?;
        if !notices.is_empty() {
            cancelled += notices.len();
            observe::job_ended(metrics, &notices);
            bus.publish(notices);
            continue;
        }
        // Nothing left that this could lock: done, unless other transactions hold some
        // items (a claim taking them, a worker finishing them) for a moment.
        let held = unfinished(batch_id).count(db).await?;
        if held == 0 || started.elapsed() > PATIENCE {
            break;
        }
        tokio::time::sleep(RECHECK).await;
    }
    Ok(cancelled)
}

/// The batch's items that are not finished and not yet asked to cancel.
fn unfinished(batch_id: Uuid) -> sea_orm::Select<jobs::Entity> {
    jobs::Entity::find()
        .filter(jobs::Column::BatchId.eq(batch_id))
        .filter(jobs::Column::Status.is_in(lifecycle::CANCELLABLE))
        .filter(jobs::Column::CancelRequested.eq(false))
}

/// Cancels up to [`ITEMS_PER_TRANSACTION`] items in one transaction; returns their
/// events (none when nothing was left to lock).
async fn cancel_some(
    db: &DatabaseConnection,
    batch_id: Uuid,
) -> Result<Vec<EventNotice>, ServiceError> {
    let transaction = begin_write(db).await?;
    let now = Timestamp::now();
    let mut pick = unfinished(batch_id)
        .select_only()
        .column(jobs::Column::Id)
        .order_by_asc(jobs::Column::Id)
        .limit(ITEMS_PER_TRANSACTION);
    // Items a worker holds are passed over, not waited for: they are looked at again.
    if db.get_database_backend() == DbBackend::Postgres {
        pick = pick.lock_with_behavior(LockType::Update, LockBehavior::SkipLocked);
    }
    let ids: Vec<Uuid> = pick.into_tuple().all(&transaction).await?;
    if ids.is_empty() {
        transaction.rollback().await?;
        return Ok(Vec::new());
    }
    // Decided on each row as locked: a queued item ends now, a running one is asked.
    let changed = jobs::Entity::update_many()
        .col_expr(
            jobs::Column::Status,
            Expr::Case(Box::new(
                Expr::case(
                    jobs::Column::Status.eq(JobStatus::Queued),
                    Expr::value(JobStatus::Cancelled),
                )
                .finally(Expr::col(jobs::Column::Status)),
            )),
        )
        .col_expr(
            jobs::Column::FinishedAt,
            Expr::Case(Box::new(
                Expr::case(jobs::Column::Status.eq(JobStatus::Queued), Expr::value(now))
                    .finally(Expr::col(jobs::Column::FinishedAt)),
            )),
        )
        .col_expr(jobs::Column::CancelRequested, Expr::value(true))
        .col_expr(jobs::Column::UpdatedAt, Expr::value(now))
        .col_expr(
            jobs::Column::LastEventSeq,
            Expr::col(jobs::Column::LastEventSeq).add(1),
        )
        .filter(jobs::Column::Id.is_in(ids))
        .filter(jobs::Column::Status.is_in(lifecycle::CANCELLABLE))
        .filter(jobs::Column::CancelRequested.eq(false))
        .exec_with_returning(&transaction)
        .await?;
    let ended: Vec<&jobs::Model> = changed
        .iter()
        .filter(|job| job.status == JobStatus::Cancelled)
        .collect();
    let ended_ids: Vec<Uuid> = ended.iter().map(|job| job.id).collect();
    // Attempts that ran before (a retry waiting for its backoff) may carry charges.
    let spent = Spent::load_many(&transaction, &ended_ids).await?;
    let notices = events::append_many(
        &transaction,
        changed.iter().map(|job| {
            // The row as changed: a cancel that ended the job, or one that asked it.
            let asked = if job.status == JobStatus::Cancelled {
                Cancel::Ends
            } else {
                Cancel::Asks
            };
            (
                job,
                asked
                    .event()
                    .expect("a changed row's cancel writes an event"),
                None,
            )
        }),
    )
    .await?;
    let terminal: Vec<_> = ended
        .iter()
        .map(|job| {
            let spent = spent.get(&job.id).cloned().unwrap_or_default();
            (*job, holds::resolution(job, None, &spent))
        })
        .collect();
    // Last: it locks the tenant's row, then the batch's.
    holds::resolve_holds(&transaction, &terminal, BatchTotals::default()).await?;
    transaction.commit().await?;
    Ok(notices)
}
