//! Starting attempts: each attempt's row and its `ATTEMPT_STARTED` event are stored
//! before the provider is called — for a whole claimed batch in one transaction and a
//! few statements.

use super::{AttemptStart, Claim, StartedAttempt, UNROUTED_PROVIDER, fenced_update_of_all};
use crate::billing::Credits;
use crate::billing::batch_totals::BatchTotals;
use crate::db::begin_write;
use crate::jobs::budget::{self, Spent};
use crate::jobs::events;
use crate::jobs::holds;
use entity::{AttemptOutcome, EventKind, Timestamp, attempts, jobs};
use sea_orm::sea_query::{Expr, ExprTrait};
use sea_orm::{ActiveValue::Set, ConnectionTrait, DatabaseConnection, DbErr, EntityTrait};
use serde_json::json;
use std::collections::HashMap;
use uuid::Uuid;

/// Records the attempt row and its `ATTEMPT_STARTED` event before the provider is
/// called. `None` when the claim no longer owns the job.
pub async fn start_attempt(
    db: &DatabaseConnection,
    claim: &Claim,
    start: &AttemptStart,
) -> Result<Option<StartedAttempt>, DbErr> {
    Ok(start_attempts(db, &[(claim, start)]).await?.remove(0))
}

/// [`start_attempt`] for several claims in one transaction: the answer holds one entry
/// per claim, in order, `None` where the claim no longer owns its job.
pub async fn start_attempts(
    db: &DatabaseConnection,
    starts: &[(&Claim, &AttemptStart)],
) -> Result<Vec<Option<StartedAttempt>>, DbErr> {
    let transaction = begin_write(db).await?;
    let started = start_attempts_in(&transaction, starts).await?;
    transaction.commit().await?;
    Ok(started)
}

/// [`start_attempts`] in the caller's write transaction, for a writer that records
/// more in it (the provider-batch submitter writes its row with the attempts).
pub async fn start_attempts_in(
    transaction: &impl ConnectionTrait,
    starts: &[(&Claim, &AttemptStart)],
) -> Result<Vec<Option<StartedAttempt>>, DbErr> {
    let mut started = Vec::with_capacity(starts.len());
    for some in starts.chunks(STARTS_PER_STATEMENT) {
        started.extend(start_some_in(transaction, some).await?);
    }
    Ok(started)
}

/// Attempts started by one set of statements: an attempt row binds about 25
/// parameters and PostgreSQL takes at most 65,535 a statement, and its events' notices
/// are one select-list entry each, of which it takes at most 1,664. A provider batch
/// starts up to 10,000 at once.
const STARTS_PER_STATEMENT: usize = 1_000;

async fn start_some_in(
    transaction: &impl ConnectionTrait,
    starts: &[(&Claim, &AttemptStart)],
) -> Result<Vec<Option<StartedAttempt>>, DbErr> {
    let now = Timestamp::now();
    // Locks every job still owned, and reserves the seq of its event.
    let locked: HashMap<Uuid, jobs::Model> =
        fenced_update_of_all(starts.iter().map(|(claim, _)| *claim))
            .col_expr(jobs::Column::UpdatedAt, Expr::value(now))
            .col_expr(
                jobs::Column::LastEventSeq,
                Expr::col(jobs::Column::LastEventSeq).add(1),
            )
            .exec_with_returning(transaction)
            .await?
            .into_iter()
            .map(|job| (job.id, job))
            .collect();
    // Keyed by job, but only where the job is still this claim's.
    let owned: HashMap<Uuid, &jobs::Model> = starts
        .iter()
        .filter_map(|(claim, _)| {
            let job = locked.get(&claim.job.id)?;
            (job.run_token == Some(claim.run_token)).then_some((job.id, job))
        })
        .collect();
    if owned.is_empty() {
        return Ok(starts.iter().map(|_| None).collect());
    }
    let job_ids: Vec<Uuid> = owned.keys().copied().collect();
    // Numbered by the rows already there, not by attempt_count: an attempt handed back
    // at shutdown does not count against maxAttempts but is still a row of its own.
    // The fenced UPDATE above holds the jobs' row locks, so numbering and the budget
    // check cannot race.
    let spent = Spent::load_many(transaction, &job_ids).await?;
    let holds = holds::open_holds(transaction, &job_ids).await?;
    let mut rows = Vec::with_capacity(owned.len());
    // Per job: why the call may not be made for want of budget, if it may not.
    let mut refusals: HashMap<Uuid, Option<budget::Refusal>> = HashMap::with_capacity(owned.len());
    for (claim, start) in starts {
        let Some(job) = owned.get(&claim.job.id) else {
            continue;
        };
        let earlier = spent.get(&job.id).cloned().unwrap_or_default();
        let hold = holds.get(&job.id).copied().unwrap_or(Credits::ZERO);
        let refusal = earlier.refuses_call(job, hold, start.customer_charge_bound);
        refusals.insert(job.id, refusal);
        rows.push(attempt_row(
            claim,
            start,
            job,
            &earlier,
            refusal.is_some(),
            now,
        ));
    }
    let inserted: HashMap<Uuid, attempts::Model> = attempts::Entity::insert_many(rows)
        .exec_with_returning(transaction)
        .await?
        .into_iter()
        .map(|attempt| (attempt.job_id, attempt))
        .collect();
    // A call about to be made carries its cost bound into its batch's sums.
    let mut progress = BatchTotals::default();
    for attempt in inserted.values() {
        if let Some(job) = owned.get(&attempt.job_id) {
            progress.attempt_cost(
                job,
                (None, None),
                (
                    attempt.provider_cost_nanos,
                    attempt.provider_cost_upper_bound_nanos,
                ),
            );
        }
    }
    progress.apply(transaction).await?;
    let started_events = starts.iter().filter_map(|(claim, _)| {
        let job = *owned.get(&claim.job.id)?;
        let number = inserted.get(&job.id)?.number;
        Some((
            job,
            EventKind::AttemptStarted,
            Some(json!({"attempt": number})),
        ))
    });
    let mut notices: HashMap<Uuid, _> = events::append_many(transaction, started_events)
        .await?
        .into_iter()
        .map(|notice| (notice.job_id, notice))
        .collect();
    Ok(starts
        .iter()
        .map(|(claim, _)| {
            let job = owned.get(&claim.job.id)?;
            Some(StartedAttempt {
                attempt: inserted.get(&job.id)?.clone(),
                notice: notices.remove(&job.id)?,
                cancel_requested: job.cancel_requested,
                budget_refusal: refusals
                    .get(&job.id)
                    .copied()
                    .unwrap_or(Some(budget::Refusal::NoPaidCallLeft)),
            })
        })
        .collect())
}

/// The row of an attempt about to start. A call that will not be made is recorded as
/// not billed from the start, so that losing the worker now cannot count it as paid.
fn attempt_row(
    claim: &Claim,
    start: &AttemptStart,
    job: &jobs::Model,
    earlier: &Spent,
    budget_spent: bool,
    now: Timestamp,
) -> attempts::ActiveModel {
    let will_call = start.provider.is_some() && !budget_spent && !job.cancel_requested;
    let (cost, cost_bound, customer_charge) = if will_call {
        (
            None,
            Some(start.provider_cost_bound.nanos()),
            start.customer_charge_if_lost.nanos(),
        )
    } else {
        (Some(0), None, 0)
    };
    attempts::ActiveModel {
        id: Set(Uuid::now_v7()),
        job_id: Set(job.id),
        tenant_id: Set(job.tenant_id),
        number: Set(i32::try_from(earlier.attempts).unwrap_or(i32::MAX - 1) + 1),
        run_token: Set(claim.run_token),
        worker_id: Set(start.worker_id.clone()),
        outcome: Set(AttemptOutcome::Running),
        error_code: Set(None),
        error_message: Set(None),
        provider: Set(start
            .provider
            .clone()
            .unwrap_or_else(|| UNROUTED_PROVIDER.to_owned())),
        model: Set(job.model.clone()),
        provider_request_id: Set(None),
        input_tokens: Set(None),
        cached_input_tokens: Set(None),
        output_tokens: Set(None),
        provider_cost_nanos: Set(cost),
        provider_cost_upper_bound_nanos: Set(cost_bound),
        customer_charge_nanos: Set(Some(customer_charge)),
        delivered_output_tokens: Set(None),
        model_price_id: Set(start.price.id),
        customer_price_id: Set(Some(start.price.customer_version)),
        provider_batch_id: Set(None),
        latency_ms: Set(None),
        started_at: Set(now),
        finished_at: Set(None),
    }
}
