//! Retention (`--retention-days`): the events and payloads (input, result) of jobs
//! finished long ago are pruned, so that the database stops growing with every prompt
//! ever sent. The job row, its attempts (usage, costs, charges) and every ledger row
//! are kept forever: the books and the dashboards' sums never change.
//!
//! The sweep works in small batches, each a short transaction over finished jobs
//! only: the claim locks queued jobs and never waits for it. A job keeps its terminal
//! event, so that subscribing to a pruned job still ends at once. Webhook deliveries
//! that were delivered or given up before the cutoff go too; pending ones stay.

use entity::{
    EventKind, JobStatus, JsonText, Timestamp, WebhookDeliveryStatus, job_events, jobs,
    webhook_deliveries,
};
use sea_orm::sea_query::Expr;
use sea_orm::{
    ColumnTrait, DatabaseConnection, DbErr, EntityTrait, QueryFilter, QueryOrder, QuerySelect,
};
use std::time::Duration;
use tokio_util::sync::CancellationToken;
use uuid::Uuid;

/// Jobs pruned in one transaction.
pub const PRUNE_BATCH: u64 = 100;
/// How soon after start the first sweep runs.
const FIRST_SWEEP_DELAY: Duration = Duration::from_secs(5);
/// Time between sweeps.
const SWEEP_INTERVAL: Duration = Duration::from_secs(60);
/// A pause between batches, so that a long backlog never monopolises the database.
const BATCH_PAUSE: Duration = Duration::from_millis(50);

/// What a prune removed.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Pruned {
    /// Jobs whose payloads were replaced.
    pub jobs: u64,
    /// Events deleted.
    pub events: u64,
    /// Finished webhook deliveries deleted.
    pub deliveries: u64,
}

/// Prunes one batch of jobs finished before `cutoff` and not pruned yet.
pub async fn prune_batch(db: &DatabaseConnection, cutoff: Timestamp) -> Result<Pruned, DbErr> {
    let ids: Vec<Uuid> = jobs::Entity::find()
        .select_only()
        .column(jobs::Column::Id)
        .filter(jobs::Column::FinishedAt.is_not_null())
        .filter(jobs::Column::PayloadsPrunedAt.is_null())
        .filter(jobs::Column::FinishedAt.lt(cutoff))
        .order_by_asc(jobs::Column::FinishedAt)
        .limit(PRUNE_BATCH)
        .into_tuple()
        .all(db)
        .await?;
    let deliveries = prune_deliveries(db, cutoff).await?;
    if ids.is_empty() {
        return Ok(Pruned {
            deliveries,
            ..Pruned::default()
        });
    }
    let transaction = crate::db::begin_write(db).await?;
    let now = Timestamp::now();
    // Only finished jobs: a job cannot leave a terminal status, so no claim, renewal
    // or settlement ever waits on these rows.
    let pruned = jobs::Entity::update_many()
        .col_expr(
            jobs::Column::Input,
            Expr::value(JsonText(serde_json::json!({}))),
        )
        .col_expr(jobs::Column::Result, Expr::value(Option::<JsonText>::None))
        .col_expr(jobs::Column::PayloadsPrunedAt, Expr::value(now))
        .filter(jobs::Column::Id.is_in(ids.iter().copied()))
        .filter(jobs::Column::PayloadsPrunedAt.is_null())
        .filter(jobs::Column::Status.is_in([
            JobStatus::Succeeded,
            JobStatus::Failed,
            JobStatus::Cancelled,
        ]))
        .exec_with_returning(&transaction)
        .await?;
    let events = job_events::Entity::delete_many()
        .filter(job_events::Column::JobId.is_in(pruned.iter().map(|job| job.id)))
        .filter(job_events::Column::Kind.is_not_in([
            EventKind::Succeeded,
            EventKind::Failed,
            EventKind::Cancelled,
        ]))
        .exec(&transaction)
        .await?
        .rows_affected;
    transaction.commit().await?;
    Ok(Pruned {
        jobs: pruned.len() as u64,
        events,
        deliveries,
    })
}

/// Deletes one batch of webhook deliveries created before `cutoff` that were
/// delivered or given up; a pending one is never touched.
async fn prune_deliveries(db: &DatabaseConnection, cutoff: Timestamp) -> Result<u64, DbErr> {
    let ids: Vec<Uuid> = webhook_deliveries::Entity::find()
        .select_only()
        .column(webhook_deliveries::Column::Id)
        .filter(webhook_deliveries::Column::CreatedAt.lt(cutoff))
        .filter(webhook_deliveries::Column::Status.ne(WebhookDeliveryStatus::Pending))
        .limit(PRUNE_BATCH)
        .into_tuple()
        .all(db)
        .await?;
    if ids.is_empty() {
        return Ok(0);
    }
    Ok(webhook_deliveries::Entity::delete_many()
        .filter(webhook_deliveries::Column::Id.is_in(ids))
        .filter(webhook_deliveries::Column::Status.ne(WebhookDeliveryStatus::Pending))
        .exec(db)
        .await?
        .rows_affected)
}

/// Prunes every job finished before `cutoff`, batch after batch.
pub async fn prune(db: &DatabaseConnection, cutoff: Timestamp) -> Result<Pruned, DbErr> {
    let mut total = Pruned::default();
    loop {
        let batch = prune_batch(db, cutoff).await?;
        total.jobs += batch.jobs;
        total.events += batch.events;
        total.deliveries += batch.deliveries;
        if batch.jobs < PRUNE_BATCH && batch.deliveries < PRUNE_BATCH {
            return Ok(total);
        }
        tokio::time::sleep(BATCH_PAUSE).await;
    }
}

/// Sweeps shortly after start and then every minute, pruning jobs finished more than
/// `retention` ago, until `shutdown` is cancelled.
pub async fn run(db: DatabaseConnection, retention: Duration, shutdown: CancellationToken) {
    let mut wait = FIRST_SWEEP_DELAY;
    loop {
        tokio::select! {
            _ = shutdown.cancelled() => return,
            _ = tokio::time::sleep(wait) => {}
        }
        wait = SWEEP_INTERVAL;
        let cutoff = Timestamp::now()
            .plus(-chrono::Duration::from_std(retention).unwrap_or(chrono::Duration::MAX));
        let started = std::time::Instant::now();
        let swept = tokio::select! {
            _ = shutdown.cancelled() => return,
            swept = prune(&db, cutoff) => swept,
        };
        match swept {
            Ok(pruned) if pruned.jobs > 0 || pruned.deliveries > 0 => tracing::info!(
                jobs = pruned.jobs,
                events = pruned.events,
                deliveries = pruned.deliveries,
                duration_ms = started.elapsed().as_millis() as u64,
                "retention pruned old jobs' events and payloads"
            ),
            Ok(_) => {}
            Err(error) => tracing::warn!(error = %error, "the retention sweep failed"),
        }
    }
}
