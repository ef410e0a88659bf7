//! Taking back jobs whose attempt stopped renewing its lease.

use super::{Claim, apply, lock_claimed, releasing_update};
use crate::bus::EventNotice;
use crate::db::begin_write;
use crate::jobs::budget::Spent;
use crate::jobs::events;
use crate::jobs::holds;
use crate::jobs::lifecycle;
use crate::jobs::provider_batches::ITEM_LEASE;
use entity::JobErrorCode;
use entity::{AttemptOutcome, JobStatus, Timestamp, attempts, jobs, provider_batches};
use sea_orm::sea_query::Expr;
use sea_orm::{
    ColumnTrait, DatabaseConnection, DbErr, EntityTrait, QueryFilter, QueryOrder, QuerySelect,
};
use std::collections::HashSet;
use uuid::Uuid;

/// Most expired leases handled in one sweep.
const EXPIRY_BATCH: u64 = 100;

/// Takes back jobs whose attempt stopped renewing its lease (its worker crashed,
/// froze or lost the database). The lost attempt becomes `lease_expired`, keeping its
/// cost bound; the job is queued again, or ends when it was cancelled, has no
/// attempts left, or forbids retrying an unknown outcome.
///
/// Leases are judged by the database's clock ([`crate::db::lease_clock`]), never by
/// this process's. `held_here` names the jobs whose attempts run in this process: they
/// are alive whatever their row says (after the database refused writes for longer
/// than a lease, their renewal comes next), so they are never taken back from here.
pub async fn expire_leases(
    db: &DatabaseConnection,
    held_here: &HashSet<Uuid>,
) -> Result<Vec<EventNotice>, DbErr> {
    let now = crate::db::lease_clock(db).await?;
    let expired = jobs::Entity::find()
        .filter(jobs::Column::Status.eq(JobStatus::Running))
        .filter(jobs::Column::LeaseUntil.lt(now))
        .order_by_asc(jobs::Column::LeaseUntil)
        .limit(EXPIRY_BATCH + held_here.len() as u64)
        .all(db)
        .await?;
    let mut notices = Vec::new();
    for job in expired
        .into_iter()
        .filter(|job| !held_here.contains(&job.id))
        .take(EXPIRY_BATCH as usize)
    {
        let Some(run_token) = job.run_token else {
            continue;
        };
        let claim = Claim {
            job,
            run_token,
            tenant_rate: Default::default(),
        };
        if let Some(notice) = expire_lease(db, &claim, now).await? {
            notices.push(notice);
        }
    }
    Ok(notices)
}

async fn expire_lease(
    db: &DatabaseConnection,
    claim: &Claim,
    now: Timestamp,
) -> Result<Option<EventNotice>, DbErr> {
    let transaction = begin_write(db).await?;
    // Decide from the row as it is now, locked, not from the copy read before: a
    // cancel may have landed in between.
    let Some(job) = lock_claimed(&transaction, claim, now)
        .await?
        .filter(|job| job.lease_until.is_some_and(|lease| lease < now))
    else {
        // Renewed or finished in the meantime: the lease was not lost after all.
        transaction.rollback().await?;
        return Ok(None);
    };
    // A worker that died between its claim and its attempt row sent nothing: the
    // claim is given back without counting, whatever the retry policy says.
    let lost_attempt = attempts::Entity::find()
        .filter(attempts::Column::JobId.eq(job.id))
        .filter(attempts::Column::RunToken.eq(claim.run_token))
        .one(&transaction)
        .await?;
    let provider_batch = match lost_attempt
        .as_ref()
        .and_then(|attempt| attempt.provider_batch_id)
    {
        Some(row) => provider_batches::Entity::find_by_id(row)
            .one(&transaction)
            .await?
            .map(|row| row.state),
        None => None,
    };
    if !lifecycle::lease_is_lost(provider_batch) {
        // The submitter holds the item: its lease is renewed, so that the sweep does
        // not meet it again on every pass.
        jobs::Entity::update_many()
            .col_expr(
                jobs::Column::LeaseUntil,
                crate::db::lease_until(db.get_database_backend(), ITEM_LEASE),
            )
            .filter(jobs::Column::Id.eq(job.id))
            .filter(jobs::Column::RunToken.eq(claim.run_token))
            .exec(&transaction)
            .await?;
        transaction.commit().await?;
        tracing::warn!(job.id = %job.id, provider_batch = ?provider_batch, "a lapsed lease of an item in a live provider batch was renewed, not taken back");
        return Ok(None);
    }
    // The lost attempt keeps the cost bound and the customer charge recorded when it
    // started: its call may have been billed.
    attempts::Entity::update_many()
        .col_expr(
            attempts::Column::Outcome,
            Expr::value(AttemptOutcome::LeaseExpired),
        )
        .col_expr(attempts::Column::FinishedAt, Expr::value(now))
        .col_expr(
            attempts::Column::ErrorCode,
            Expr::value(JobErrorCode::LeaseExpired),
        )
        .filter(attempts::Column::JobId.eq(job.id))
        .filter(attempts::Column::RunToken.eq(claim.run_token))
        .filter(attempts::Column::Outcome.eq(AttemptOutcome::Running))
        .exec(&transaction)
        .await?;
    let spent = Spent::load(&transaction, job.id).await?;
    let transition = lifecycle::after_lost_lease(
        &job,
        &spent,
        lost_attempt.map(|attempt| attempt.number),
        now,
    );
    let update = apply(releasing_update(claim, now), &transition, now)
        .filter(jobs::Column::LeaseUntil.lt(now));
    let Some(job) = update
        .exec_with_returning(&transaction)
        .await?
        .into_iter()
        .next()
    else {
        // Renewed or finished in the meantime: the lease was not lost after all.
        transaction.rollback().await?;
        return Ok(None);
    };
    let notice = events::append(
        &transaction,
        &job,
        transition.event,
        Some(transition.data.clone()),
    )
    .await?;
    // Last: it locks the tenant's row, which every job of the tenant needs.
    if let Some(hold) = transition.hold(job.id, &spent) {
        holds::resolve_holds(&transaction, &[(&job, hold)], Default::default()).await?;
    }
    transaction.commit().await?;
    tracing::warn!(job.id = %job.id, status = ?job.status, "took back a job whose lease expired");
    Ok(Some(notice))
}
