//! Finishing attempts: the attempt's outcome and cost, the job's new state, its event
//! and — when the job ends — its hold settled or released, in one transaction fenced
//! by each attempt's run token. A worker finishes the attempts that end together in
//! one transaction with a few statements for all of them; each job is still fenced by
//! its own run token and settled exactly once.

use super::{Claim, apply, fenced_update_of_all, releasing_update};
use crate::billing::batch_totals::BatchTotals;
use crate::billing::{Credits, ModelPrice};
use crate::bus::EventNotice;
use crate::db::storable_text;
use crate::db::{Values, begin_write};
use crate::jobs::budget::Spent;
use crate::jobs::events;
use crate::jobs::holds;
use crate::jobs::lifecycle::{self, Transition};
use crate::jobs::lifecycle::{AttemptReport, JobError, JobOutcome};
use entity::{JobStatus, JsonText, Timestamp, attempts, jobs};
use sea_orm::sea_query::Expr;
use sea_orm::{ConnectionTrait, DatabaseConnection, DbBackend, DbErr, EntityTrait};
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
    let mut progress = BatchTotals::default();
    record_attempts(
        &transaction,
        owned
            .iter()
            .map(|(index, current)| (&ends[*index], *current)),
        &mut progress,
    )
    .await?;
    let job_ids: Vec<Uuid> = owned.iter().map(|(_, current)| current.id).collect();
    let spent = Spent::load_many(&transaction, &job_ids).await?;
    let changes: Vec<(usize, Transition, Spent)> = owned
        .iter()
        .map(|(index, current)| {
            let spent = spent.get(&current.id).cloned().unwrap_or_default();
            let end = &ends[*index];
            let transition = lifecycle::after_attempt(
                current,
                &spent,
                end.attempt.id,
                end.attempt.number,
                &end.report,
                end.outcome.clone(),
                now,
            );
            (*index, transition, spent)
        })
        .collect();
    let mut written = write_jobs(&transaction, &changes, ends, now).await?;
    let mut finished = Vec::with_capacity(changes.len());
    for (index, change, spent) in changes {
        let end = &ends[index];
        // Each row is locked by this transaction and was owned a moment ago, so the
        // fenced update matched it; if it did not, the group is rolled back rather
        // than half-written.
        let job = written.remove(&end.claim.job.id).ok_or_else(|| {
            DbErr::Custom(format!(
                "job {} left its claim mid-finish",
                end.claim.job.id
            ))
        })?;
        let resolution = change.hold(job.id, &spent);
        finished.push((index, job, change.event, change.data, resolution));
    }
    let notices = events::append_many(
        &transaction,
        finished
            .iter_mut()
            .map(|(_, job, kind, data, _)| (&*job, *kind, Some(std::mem::take(data)))),
    )
    .await?;
    let terminal: Vec<_> = finished
        .iter()
        .filter_map(|(_, job, _, _, resolution)| Some((job, (*resolution)?)))
        .collect();
    // Last: it locks the tenants' rows, which every job of those tenants needs.
    holds::resolve_holds(&transaction, &terminal, progress).await?;
    transaction.commit().await?;
    let mut answers: Vec<Option<Vec<EventNotice>>> = ends.iter().map(|_| None).collect();
    for ((index, ..), notice) in finished.iter().zip(notices) {
        answers[*index] = Some(vec![notice]);
    }
    Ok(answers)
}

/// Writes every job's change in one statement, each fenced by its own run token and
/// ending its claim; returns the jobs as written.
async fn write_jobs(
    transaction: &impl ConnectionTrait,
    changes: &[(usize, Transition, Spent)],
    ends: &[AttemptEnd],
    now: Timestamp,
) -> Result<HashMap<Uuid, jobs::Model>, DbErr> {
    let backend = transaction.get_database_backend();
    let mut values = Values::new(
        backend,
        "v",
        [
            "id",
            "run_token",
            "status",
            "result",
            "error_code",
            "error_message",
            "next_run_at",
            "model",
            "finished_at",
            "hand_back",
        ],
    );
    let at = values.bind(now);
    // Bound from the enum, so the text cannot drift from the stored value.
    let running = values.bind(JobStatus::Running);
    for (index, change, _) in changes {
        let claim = &ends[*index].claim;
        values.push([
            claim.job.id.into(),
            claim.run_token.into(),
            change.status.into(),
            change.result.clone().map(JsonText).into(),
            change.error.as_ref().map(|error| error.code).into(),
            change
                .error
                .as_ref()
                .map(|error| error.message.clone())
                .into(),
            change.next_run_at.into(),
            change.model.clone().into(),
            change.status.is_terminal().then_some(now).into(),
            i32::from(change.gives_back_attempt).into(),
        ]);
    }
    // An error, a result or a finish time is only ever set, never cleared, as the
    // job's earlier attempts left it.
    let returning = if backend == DbBackend::Postgres {
        "jobs.*"
    } else {
        "*"
    };
    let sql = format!(
        "UPDATE jobs SET
            status = v.status,
            result = COALESCE(v.result, jobs.result),
            error_code = COALESCE(v.error_code, jobs.error_code),
            error_message = COALESCE(v.error_message, jobs.error_message),
            next_run_at = COALESCE(v.next_run_at, jobs.next_run_at),
            model = COALESCE(v.model, jobs.model),
            finished_at = COALESCE(v.finished_at, jobs.finished_at),
            attempt_count = jobs.attempt_count - v.hand_back,
            last_event_seq = jobs.last_event_seq + 1,
            run_token = NULL,
            lease_until = NULL,
            updated_at = {at}
        FROM v
        WHERE jobs.id = v.id AND jobs.run_token = v.run_token AND jobs.status = {running}
        RETURNING {returning}"
    );
    Ok(jobs::Entity::find()
        .from_raw_sql(values.statement(&sql))
        .all(transaction)
        .await?
        .into_iter()
        .map(|job| (job.id, job))
        .collect())
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
    let transition = lifecycle::abandoned(error.clone());
    let Some(job) = apply(releasing_update(claim, now), &transition, now)
        .exec_with_returning(&transaction)
        .await?
        .into_iter()
        .next()
    else {
        transaction.rollback().await?;
        return Ok(None);
    };
    let spent = Spent::load(&transaction, job.id).await?;
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
    Ok(Some(notice))
}

/// Records each attempt's outcome, usage, cost and customer charge in one statement,
/// each fenced by its run token.
/// Each attempt's change of cost goes into `progress`, for its job's batch.
async fn record_attempts<'a>(
    transaction: &impl ConnectionTrait,
    ends: impl IntoIterator<Item = (&'a AttemptEnd, &'a jobs::Model)>,
    progress: &mut BatchTotals,
) -> Result<(), DbErr> {
    let mut values = Values::new(
        transaction.get_database_backend(),
        "v",
        [
            "id",
            "run_token",
            "outcome",
            "latency_ms",
            "provider_request_id",
            "customer_charge_nanos",
            "delivered_output_tokens",
            "error_code",
            "error_message",
            "input_tokens",
            "cached_input_tokens",
            "output_tokens",
            "provider_cost_nanos",
            "finished_at",
        ],
    );
    for (end, job) in ends {
        let report = &end.report;
        // Exact cost when usage is known or nothing can have been billed;
        // otherwise the bound stored at the start stands.
        let exact_cost = match (&report.usage, report.not_billed) {
            (Some(usage), _) => Some(end.price.provider_cost(usage)),
            (None, true) => Some(Credits::ZERO),
            (None, false) => None,
        };
        let before = (
            end.attempt.provider_cost_nanos,
            end.attempt.provider_cost_upper_bound_nanos,
        );
        let after = match exact_cost {
            Some(cost) => (Some(cost.nanos()), None),
            None => before,
        };
        progress.attempt_cost(job, before, after);
        let usage = report.usage.as_ref();
        values.push([
            end.attempt.id.into(),
            end.attempt.run_token.into(),
            report.outcome.into(),
            i64::try_from(report.latency.as_millis())
                .unwrap_or(i64::MAX)
                .into(),
            report.provider_request_id.clone().map(storable_text).into(),
            report.customer_charge.nanos().into(),
            report.delivered_output_tokens.map(tokens).into(),
            report.error.as_ref().map(|error| error.code).into(),
            report
                .error
                .as_ref()
                .map(|error| error.message.clone())
                .into(),
            usage.map(|usage| tokens(usage.input_tokens)).into(),
            usage.map(|usage| tokens(usage.cached_input_tokens)).into(),
            usage.map(|usage| tokens(usage.output_tokens)).into(),
            exact_cost.map(Credits::nanos).into(),
            report.ended_at.into(),
        ]);
    }
    let sql = "UPDATE attempts SET
            outcome = v.outcome,
            finished_at = v.finished_at,
            latency_ms = v.latency_ms,
            provider_request_id = v.provider_request_id,
            customer_charge_nanos = v.customer_charge_nanos,
            delivered_output_tokens = v.delivered_output_tokens,
            error_code = v.error_code,
            error_message = v.error_message,
            input_tokens = COALESCE(v.input_tokens, attempts.input_tokens),
            cached_input_tokens = COALESCE(v.cached_input_tokens, attempts.cached_input_tokens),
            output_tokens = COALESCE(v.output_tokens, attempts.output_tokens),
            provider_cost_nanos = COALESCE(v.provider_cost_nanos, attempts.provider_cost_nanos),
            provider_cost_upper_bound_nanos = CASE WHEN v.provider_cost_nanos IS NULL
                THEN attempts.provider_cost_upper_bound_nanos END
        FROM v
        WHERE attempts.id = v.id AND attempts.run_token = v.run_token";
    transaction.execute_raw(values.statement(sql)).await?;
    Ok(())
}

fn tokens(count: u64) -> i64 {
    i64::try_from(count).unwrap_or(i64::MAX)
}
