//! Failing queued jobs whose deadline passed: waiting for their `runAt`, a retry's
//! backoff or a provider's `Retry-After`, they would never finish in time. A running
//! attempt's deadline is its worker's to keep (it cancels the call); a job taken back
//! from a lost lease is queued again and found here.

use super::apply;
use crate::bus::EventNotice;
use crate::db::begin_write;
use crate::jobs::budget::Spent;
use crate::jobs::events;
use crate::jobs::holds;
use crate::jobs::lifecycle;
use entity::{JobStatus, jobs};
use sea_orm::sea_query::{Expr, ExprTrait};
use sea_orm::{
    ColumnTrait, DatabaseConnection, DbErr, EntityTrait, QueryFilter, QueryOrder, QuerySelect,
};

/// Most jobs one sweep fails: one transaction, a few statements.
const DEADLINE_BATCH: u64 = 100;

/// Fails up to [`DEADLINE_BATCH`] queued jobs whose deadline passed — `FAILED` with
/// `DEADLINE_EXCEEDED`, their holds resolved by what their earlier attempts charged —
/// and returns their events. Read by a range of the partial index of queued jobs'
/// deadlines, oldest first, so the sweep costs what it fails, never a scan. Judged by
/// the clock leases are judged by ([`crate::db::lease_clock`]).
pub async fn fail_past_deadlines(db: &DatabaseConnection) -> Result<Vec<EventNotice>, DbErr> {
    let now = crate::db::lease_clock(db).await?;
    let transaction = begin_write(db).await?;
    let due: Vec<_> = jobs::Entity::find()
        .select_only()
        .column(jobs::Column::Id)
        .filter(jobs::Column::Status.eq(JobStatus::Queued))
        .filter(jobs::Column::Deadline.is_not_null())
        .filter(jobs::Column::Deadline.lte(now))
        .order_by_asc(jobs::Column::Deadline)
        .limit(DEADLINE_BATCH)
        .into_tuple::<uuid::Uuid>()
        .all(&transaction)
        .await?;
    if due.is_empty() {
        transaction.rollback().await?;
        return Ok(Vec::new());
    }
    let transition = lifecycle::past_deadline();
    // Conditioned again on the locked rows: a claim or a cancel may have taken a job
    // between the read and this statement.
    let failed = apply(jobs::Entity::update_many(), &transition, now)
        .col_expr(jobs::Column::UpdatedAt, Expr::value(now))
        .col_expr(
            jobs::Column::LastEventSeq,
            Expr::col(jobs::Column::LastEventSeq).add(1),
        )
        .filter(jobs::Column::Id.is_in(due))
        .filter(jobs::Column::Status.eq(JobStatus::Queued))
        .filter(jobs::Column::Deadline.lte(now))
        .exec_with_returning(&transaction)
        .await?;
    if failed.is_empty() {
        transaction.rollback().await?;
        return Ok(Vec::new());
    }
    let ids: Vec<_> = failed.iter().map(|job| job.id).collect();
    // Attempts that ran before (retries, waits) may carry charges.
    let spent = Spent::load_many(&transaction, &ids).await?;
    let notices = events::append_many(
        &transaction,
        failed
            .iter()
            .map(|job| (job, transition.event, Some(transition.data.clone()))),
    )
    .await?;
    let resolutions: Vec<_> = failed
        .iter()
        .filter_map(|job| {
            let spent = spent.get(&job.id).cloned().unwrap_or_default();
            Some((job, transition.hold(job.id, &spent)?))
        })
        .collect();
    // Last: it locks the tenants' rows, which every job of those tenants needs.
    holds::resolve_holds(&transaction, &resolutions, Default::default()).await?;
    transaction.commit().await?;
    for job in &failed {
        tracing::info!(job.id = %job.id, tenant.id = %job.tenant_id, "job failed: its deadline passed while it was queued");
    }
    Ok(notices)
}
