//! Finishing attempts: the attempt's outcome and cost, the job's new state, its event
//! and — when the job ends — its hold settled or released, in one transaction fenced
//! by each attempt's run token. A worker finishes the attempts that end together in
//! one transaction with a few statements for all of them; each job is still fenced by
//! its own run token and settled exactly once.

use super::{
    AttemptReport, Claim, ErrorCode, INVALID_OUTPUT_RETRIES, JobError, JobOutcome,
    attempt_event_data, fenced_update_of_all, paid_call_limit, releasing_update, storable_text,
    with_error,
};
use crate::billing::{Credits, ModelPrice, ledger};
use crate::db::begin_write;
use crate::jobs::budget::{self, Spent};
use crate::jobs::bus::EventNotice;
use crate::jobs::events;
use entity::{AttemptOutcome, EventKind, JobStatus, JsonText, Timestamp, attempts, jobs};
use sea_orm::sea_query::{Expr, ExprTrait};
use sea_orm::{ColumnTrait, ConnectionTrait, DatabaseConnection, DbErr, EntityTrait, QueryFilter};
use serde_json::json;
use std::collections::HashMap;
use uuid::Uuid;

/// An attempt whose call is over, as its worker judged it: what to record, and what
/// becomes of the job.
#[derive(Clone, Debug)]
pub struct AttemptEnd {
    pub claim: Claim,
    pub attempt: attempts::Model,
    pub price: ModelPrice,
    pub report: AttemptReport,
    pub outcome: JobOutcome,
}

/// Finishes an attempt in one transaction fenced by its run token: the job's new
/// state, the attempt's outcome, cost and customer charge, the settlement or release
/// of the hold, and the event. `None` when the claim no longer owns the job; then
/// nothing is written.
pub async fn finish_attempt(
    db: &DatabaseConnection,
    claim: &Claim,
    attempt: &attempts::Model,
    price: &ModelPrice,
    report: AttemptReport,
    outcome: JobOutcome,
) -> Result<Option<Vec<EventNotice>>, DbErr> {
    let end = AttemptEnd {
        claim: claim.clone(),
        attempt: attempt.clone(),
        price: price.clone(),
        report,
        outcome,
    };
    Ok(finish_attempts(db, std::slice::from_ref(&end))
        .await?
        .remove(0))
}

/// [`finish_attempt`] for several attempts (of distinct jobs) in one transaction: the
/// answer holds one entry per attempt, in order, `None` where the claim no longer owns
/// its job — for that job nothing is written, and the others finish all the same.
/// Any error rolls back the whole batch.
pub async fn finish_attempts(
    db: &DatabaseConnection,
    ends: &[AttemptEnd],
) -> Result<Vec<Option<Vec<EventNotice>>>, DbErr> {
    let transaction = begin_write(db).await?;
    let now = Timestamp::now();
    // Locks every job still owned and reads it as it is now.
    let locked: HashMap<Uuid, jobs::Model> =
        fenced_update_of_all(ends.iter().map(|end| &end.claim))
            .col_expr(jobs::Column::UpdatedAt, Expr::value(now))
            .exec_with_returning(&transaction)
            .await?
            .into_iter()
            .map(|job| (job.id, job))
            .collect();
    // The ends whose claim still owns its job. A job appears once: an earlier claim
    // of it, lost to lease expiry, no longer matches its run token.
    let owned: Vec<(usize, &jobs::Model)> = ends
        .iter()
        .enumerate()
        .filter_map(|(index, end)| {
            let current = locked.get(&end.claim.job.id)?;
            (current.run_token == Some(end.claim.run_token)).then_some((index, current))
        })
        .collect();
    if owned.is_empty() {
        transaction.rollback().await?;
        return Ok(ends.iter().map(|_| None).collect());
    }
    for (index, _) in &owned {
        let end = &ends[*index];
        record_attempt(&transaction, &end.attempt, &end.price, &end.report, now).await?;
    }
    let job_ids: Vec<Uuid> = owned.iter().map(|(_, current)| current.id).collect();
    let spent = Spent::load_many(&transaction, &job_ids).await?;
    let mut finished = Vec::with_capacity(owned.len());
    let mut resolutions = Vec::new();
    for (index, current) in owned {
        let end = &ends[index];
        let spent = spent.get(&current.id).cloned().unwrap_or_default();
        let (job, kind, data) = finish_job(&transaction, end, current, &spent, now).await?;
        if job.status.is_terminal() {
            resolutions.push(budget::resolution(&job, Some(end.attempt.id), &spent));
        }
        finished.push((index, job, kind, data));
    }
    let notices = events::append_many(
        &transaction,
        finished
            .iter()
            .map(|(_, job, kind, data)| (job, *kind, Some(data.clone()))),
    )
    .await?;
    // Last: it locks the tenants' rows, which every job of those tenants needs.
    ledger::resolve_holds(&transaction, &resolutions).await?;
    transaction.commit().await?;
    let mut answers: Vec<Option<Vec<EventNotice>>> = ends.iter().map(|_| None).collect();
    for ((index, ..), notice) in finished.iter().zip(notices) {
        answers[*index] = Some(vec![notice]);
    }
    Ok(answers)
}

/// Writes the job's state after its attempt, decided on the locked row with this
/// attempt counted; returns the job as written and its event.
async fn finish_job(
    transaction: &impl ConnectionTrait,
    end: &AttemptEnd,
    current: &jobs::Model,
    spent: &Spent,
    now: Timestamp,
) -> Result<(jobs::Model, EventKind, serde_json::Value), DbErr> {
    let report = &end.report;
    let outcome = match end.outcome.clone() {
        // A cancel that landed while the call ran wins over going round again: a job
        // the tenant cancelled is never queued for another (paid) attempt.
        JobOutcome::Retry { .. } | JobOutcome::HandBack if current.cancel_requested => {
            JobOutcome::Cancelled
        }
        // A model that keeps answering off-schema is not paid for forever.
        JobOutcome::Retry { .. }
            if report.outcome == AttemptOutcome::InvalidOutput
                && spent.invalid_outputs > INVALID_OUTPUT_RETRIES =>
        {
            JobOutcome::Failed(report.error.clone().unwrap_or_else(|| {
                JobError::new(
                    ErrorCode::InvalidOutput,
                    "the reply failed the response schema",
                )
            }))
        }
        JobOutcome::Retry { .. } | JobOutcome::HandBack if !spent.calls_left(current) => {
            JobOutcome::Failed(paid_call_limit(spent))
        }
        other => other,
    };
    let (status, kind) = match &outcome {
        JobOutcome::Succeeded { .. } => (JobStatus::Succeeded, EventKind::Succeeded),
        JobOutcome::Retry { .. } => (JobStatus::Queued, EventKind::RetryScheduled),
        JobOutcome::Failed(_) => (JobStatus::Failed, EventKind::Failed),
        JobOutcome::Cancelled => (JobStatus::Cancelled, EventKind::Cancelled),
        JobOutcome::HandBack => (JobStatus::Queued, EventKind::RetryScheduled),
    };
    let update =
        releasing_update(&end.claim, now).col_expr(jobs::Column::Status, Expr::value(status));
    let update = match &outcome {
        JobOutcome::Succeeded { result } => update
            .col_expr(jobs::Column::Result, Expr::value(JsonText(result.clone())))
            .col_expr(jobs::Column::FinishedAt, Expr::value(now)),
        JobOutcome::Retry { at } => update.col_expr(jobs::Column::NextRunAt, Expr::value(*at)),
        JobOutcome::Failed(error) => {
            with_error(update, error).col_expr(jobs::Column::FinishedAt, Expr::value(now))
        }
        JobOutcome::Cancelled => update.col_expr(jobs::Column::FinishedAt, Expr::value(now)),
        JobOutcome::HandBack => update
            .col_expr(jobs::Column::NextRunAt, Expr::value(now))
            .col_expr(
                jobs::Column::AttemptCount,
                Expr::col(jobs::Column::AttemptCount).sub(1),
            ),
    };
    // The row is locked by this transaction and was owned a moment ago, so the fenced
    // update matches; if it did not, the batch is rolled back rather than half-written.
    let job = update
        .exec_with_returning(transaction)
        .await?
        .into_iter()
        .next()
        .ok_or_else(|| DbErr::Custom(format!("job {} left its claim mid-finish", current.id)))?;
    let error = match &outcome {
        JobOutcome::Failed(error) => Some(error),
        _ => report.error.as_ref(),
    };
    let data = attempt_event_data(Some(end.attempt.number), report.outcome, error);
    Ok((job, kind, data))
}

/// Ends a claimed job that cannot be run at all — its stored input is unreadable, its
/// model has no price, or the database refuses to record its attempt — before any
/// call: FAILED with `error`, its hold resolved. Without this, lease expiry would hand
/// such a job back for ever, uncounted. `None` when the claim no longer owns the job.
pub async fn abandon_claim(
    db: &DatabaseConnection,
    claim: &Claim,
    error: &JobError,
) -> Result<Option<EventNotice>, DbErr> {
    let transaction = begin_write(db).await?;
    let now = Timestamp::now();
    let Some(job) = with_error(releasing_update(claim, now), error)
        .col_expr(jobs::Column::Status, Expr::value(JobStatus::Failed))
        .col_expr(jobs::Column::FinishedAt, Expr::value(now))
        .exec_with_returning(&transaction)
        .await?
        .into_iter()
        .next()
    else {
        transaction.rollback().await?;
        return Ok(None);
    };
    let spent = Spent::load(&transaction, job.id).await?;
    let data = json!({"error": {"code": error.code, "message": error.message}});
    let notice = events::append(&transaction, &job, EventKind::Failed, Some(data)).await?;
    // Last: it locks the tenant's row, which every job of the tenant needs.
    budget::resolve_hold(&transaction, &job, None, &spent).await?;
    transaction.commit().await?;
    Ok(Some(notice))
}

async fn record_attempt(
    db: &impl ConnectionTrait,
    attempt: &attempts::Model,
    price: &ModelPrice,
    report: &AttemptReport,
    now: Timestamp,
) -> Result<(), DbErr> {
    // Exact cost when usage is known or nothing can have been billed; otherwise the
    // bound stored at the start stands.
    let exact_cost = match (&report.usage, report.not_billed) {
        (Some(usage), _) => Some(price.provider_cost(usage)),
        (None, true) => Some(Credits::ZERO),
        (None, false) => None,
    };
    let mut update = attempts::Entity::update_many()
        .col_expr(attempts::Column::Outcome, Expr::value(report.outcome))
        .col_expr(attempts::Column::FinishedAt, Expr::value(now))
        .col_expr(
            attempts::Column::LatencyMs,
            Expr::value(i64::try_from(report.latency.as_millis()).unwrap_or(i64::MAX)),
        )
        .col_expr(
            attempts::Column::ProviderRequestId,
            Expr::value(report.provider_request_id.clone().map(storable_text)),
        )
        .col_expr(
            attempts::Column::CustomerChargeNanos,
            Expr::value(report.customer_charge.nanos()),
        )
        .col_expr(
            attempts::Column::DeliveredOutputTokens,
            Expr::value(report.delivered_output_tokens.map(tokens)),
        )
        .col_expr(
            attempts::Column::ErrorCode,
            Expr::value(report.error.as_ref().map(|error| error.code.clone())),
        )
        .col_expr(
            attempts::Column::ErrorMessage,
            Expr::value(report.error.as_ref().map(|error| error.message.clone())),
        );
    if let Some(usage) = &report.usage {
        update = update
            .col_expr(
                attempts::Column::InputTokens,
                Expr::value(tokens(usage.input_tokens)),
            )
            .col_expr(
                attempts::Column::CachedInputTokens,
                Expr::value(tokens(usage.cached_input_tokens)),
            )
            .col_expr(
                attempts::Column::OutputTokens,
                Expr::value(tokens(usage.output_tokens)),
            );
    }
    if let Some(cost) = exact_cost {
        update = update
            .col_expr(
                attempts::Column::ProviderCostNanos,
                Expr::value(cost.nanos()),
            )
            .col_expr(
                attempts::Column::ProviderCostUpperBoundNanos,
                Expr::value(Option::<i64>::None),
            );
    }
    update
        .filter(attempts::Column::Id.eq(attempt.id))
        .filter(attempts::Column::RunToken.eq(attempt.run_token))
        .exec(db)
        .await?;
    Ok(())
}

fn tokens(count: u64) -> i64 {
    i64::try_from(count).unwrap_or(i64::MAX)
}
