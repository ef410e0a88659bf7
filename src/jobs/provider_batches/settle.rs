//! Settling a provider batch's attempts: each through the worker's own judge and the
//! queue's fenced finish, so the charge, the release, the events and the batch's
//! counters move exactly once per attempt — a result line read again finds its
//! attempt finished, or its job no longer run by this token, and changes nothing.

use super::Submitter;
use crate::billing::{ModelPrice, prices};
use crate::jobs::input::JobInput;
use crate::jobs::queue::{AttemptEnd, Claim, StartedAttempt, finish_attempts};
use crate::jobs::tokens::counting_for;
use crate::jobs::worker::{CallEnd, judge_batch_request};
use crate::llm::batches::ItemResult;
use crate::llm::{Completion, ProviderError};
use entity::{AttemptOutcome, JobStatus, Timestamp, attempts, jobs, provider_batches};
use sea_orm::{
    ColumnTrait, DbErr, EntityTrait, PaginatorTrait, QueryFilter, QueryOrder, QuerySelect,
};
use std::collections::HashMap;
use std::time::Duration;
use uuid::Uuid;

/// Attempts settled per transaction.
pub(super) const CHUNK: usize = 500;

/// The answer of a request the provider never ran.
pub(super) fn not_run(why: &str) -> Result<Completion, ProviderError> {
    Err(ProviderError::NotSent {
        message: why.to_owned(),
    })
}

/// What a result line's outcome is, as the judge reads an answer.
pub(super) fn answer_of(result: ItemResult) -> Result<Completion, ProviderError> {
    match result {
        ItemResult::Succeeded(completion) => Ok(completion),
        ItemResult::Errored(error) => Err(error),
        ItemResult::Expired => not_run("the provider batch expired before the request ran"),
        ItemResult::Cancelled => not_run("the provider batch was cancelled before the request ran"),
        ItemResult::Unknown(message) => Err(ProviderError::OutcomeUnknown { message }),
    }
}

/// Settles the attempts of `row` named in `answers` (by attempt id) that still run;
/// how many it settled.
pub(super) async fn settle(
    submitter: &Submitter,
    row: &provider_batches::Model,
    answers: Vec<(Uuid, Result<Completion, ProviderError>)>,
) -> Result<usize, DbErr> {
    if answers.is_empty() {
        return Ok(0);
    }
    let ids: Vec<Uuid> = answers.iter().map(|(id, _)| *id).collect();
    let running: HashMap<Uuid, attempts::Model> = attempts::Entity::find()
        .filter(attempts::Column::Id.is_in(ids))
        .filter(attempts::Column::ProviderBatchId.eq(row.id))
        .filter(attempts::Column::Outcome.eq(AttemptOutcome::Running))
        .all(&submitter.db)
        .await?
        .into_iter()
        .map(|attempt| (attempt.id, attempt))
        .collect();
    if running.is_empty() {
        return Ok(0);
    }
    let jobs: HashMap<Uuid, jobs::Model> = jobs::Entity::find()
        .filter(jobs::Column::Id.is_in(running.values().map(|attempt| attempt.job_id)))
        .all(&submitter.db)
        .await?
        .into_iter()
        .map(|job| (job.id, job))
        .collect();
    let prices = batch_prices(submitter, running.values()).await?;
    let ended_at = Timestamp::now();
    let since = row.uploading_at.unwrap_or(row.created_at);
    let latency =
        Duration::from_micros(u64::try_from(ended_at.micros() - since.micros()).unwrap_or(0));
    let mut ends = Vec::with_capacity(running.len());
    for (id, answer) in answers {
        let Some(attempt) = running.get(&id) else {
            continue;
        };
        let (Some(job), Some(price)) = (jobs.get(&attempt.job_id), prices.get(&attempt.id)) else {
            continue;
        };
        let Ok(input) = serde_json::from_value::<JobInput>(job.input.0.clone()) else {
            continue;
        };
        let claim = Claim {
            job: job.clone(),
            run_token: attempt.run_token,
            tenant_rate: Default::default(),
        };
        let bound = input
            .call_bound(counting_for(&submitter.providers, &job.model), &job.model)
            .within(job.token_bound);
        let end = match answer {
            // A request the provider never ran ends as a call never made would: an
            // item cancelled, or past its deadline, is recorded so, not as a wait.
            Err(ProviderError::NotSent { .. }) if job.cancel_requested => {
                CallEnd::CancelledBeforeSending
            }
            Err(ProviderError::NotSent { .. })
                if job.deadline.is_some_and(|deadline| deadline <= ended_at) =>
            {
                CallEnd::PastDeadlineBeforeSending
            }
            answer => CallEnd::Answered(answer),
        };
        // An answer that may have been billed without a result (an unknown fate, or a
        // line that cannot be read) is never sent again: the judge fails the item with
        // the attempt's cost bound, reconcilable later (invariant 1;
        // `CallEnding::UnknownInProviderBatch`).
        let (report, outcome) = judge_batch_request(
            &claim,
            attempt,
            price,
            &input,
            bound,
            submitter.charging,
            latency,
            ended_at,
            end,
        );
        ends.push(AttemptEnd {
            claim,
            attempt: attempt.clone(),
            price: price.clone(),
            report,
            outcome,
        });
    }
    finish(submitter, &ends).await
}

/// Finishes `ends` in one transaction and publishes their events; how many finished.
async fn finish(submitter: &Submitter, ends: &[AttemptEnd]) -> Result<usize, DbErr> {
    if ends.is_empty() {
        return Ok(0);
    }
    let answers = finish_attempts(&submitter.db, ends).await?;
    let mut settled = 0;
    for notices in answers.into_iter().flatten() {
        settled += 1;
        submitter.bus.publish(notices);
    }
    Ok(settled)
}

/// The batch view of the price each attempt started with, by attempt id: its
/// provider side the version in force then (`model_price_id`), its customer side the
/// one its job was held at (`customer_price_id`; the same when the row has none).
async fn batch_prices<'a>(
    submitter: &Submitter,
    attempts: impl Iterator<Item = &'a attempts::Model> + Clone,
) -> Result<HashMap<Uuid, ModelPrice>, DbErr> {
    let mut ids: Vec<Uuid> = attempts
        .clone()
        .flat_map(|attempt| [Some(attempt.model_price_id), attempt.customer_price_id])
        .flatten()
        .collect();
    ids.sort_unstable();
    ids.dedup();
    let versions = prices::versions(&submitter.db, ids).await?;
    Ok(attempts
        .filter_map(|attempt| {
            let billed = versions.get(&attempt.model_price_id)?.clone();
            let charged = match attempt.customer_price_id {
                Some(id) if id != billed.id => billed.charged_at(versions.get(&id)?),
                _ => billed,
            };
            Some((attempt.id, charged.batch_view()?))
        })
        .collect())
}

/// Settles, `CHUNK` at a time, every attempt of `row` still running with the same
/// answer (a request the provider never ran, or an unknown fate); how many.
pub(super) async fn settle_all_running(
    submitter: &Submitter,
    row: &provider_batches::Model,
    answer: impl Fn() -> Result<Completion, ProviderError>,
) -> Result<usize, DbErr> {
    let mut settled = 0;
    let mut after = Uuid::nil();
    loop {
        let ids: Vec<Uuid> = attempts::Entity::find()
            .select_only()
            .column(attempts::Column::Id)
            .filter(attempts::Column::ProviderBatchId.eq(row.id))
            .filter(attempts::Column::Outcome.eq(AttemptOutcome::Running))
            .filter(attempts::Column::Id.gt(after))
            .order_by_asc(attempts::Column::Id)
            .limit(CHUNK as u64)
            .into_tuple()
            .all(&submitter.db)
            .await?;
        let Some(last) = ids.last().copied() else {
            return Ok(settled);
        };
        after = last;
        let answers = ids.into_iter().map(|id| (id, answer())).collect();
        settled += settle(submitter, row, answers).await?;
    }
}

/// Ends, unsent, the attempts of `row` whose items' deadlines have passed: a row not
/// sent yet would bring their answers back too late. Their items fail
/// `DEADLINE_EXCEEDED`, as a realtime call past its deadline does. How many it ended.
pub(super) async fn settle_past_deadline(
    submitter: &Submitter,
    row: &provider_batches::Model,
) -> Result<usize, DbErr> {
    // An item of a provider batch is run under the row's id as its run token.
    let late: Vec<Uuid> = jobs::Entity::find()
        .select_only()
        .column(jobs::Column::Id)
        .filter(jobs::Column::RunToken.eq(row.id))
        .filter(jobs::Column::Status.eq(JobStatus::Running))
        .filter(jobs::Column::Deadline.lte(Timestamp::now()))
        .into_tuple()
        .all(&submitter.db)
        .await?;
    let mut settled = 0;
    for jobs in late.chunks(CHUNK) {
        let ids: Vec<Uuid> = attempts::Entity::find()
            .select_only()
            .column(attempts::Column::Id)
            .filter(attempts::Column::ProviderBatchId.eq(row.id))
            .filter(attempts::Column::Outcome.eq(AttemptOutcome::Running))
            .filter(attempts::Column::JobId.is_in(jobs.iter().copied()))
            .into_tuple()
            .all(&submitter.db)
            .await?;
        let answers = ids
            .into_iter()
            .map(|id| {
                (
                    id,
                    not_run("the item's deadline passed before its provider batch was sent"),
                )
            })
            .collect();
        settled += settle(submitter, row, answers).await?;
    }
    Ok(settled)
}

/// How many attempts of `row` still run.
pub(super) async fn running_count(
    submitter: &Submitter,
    row: &provider_batches::Model,
) -> Result<usize, DbErr> {
    let count = attempts::Entity::find()
        .filter(attempts::Column::ProviderBatchId.eq(row.id))
        .filter(attempts::Column::Outcome.eq(AttemptOutcome::Running))
        .count(&submitter.db)
        .await?;
    Ok(usize::try_from(count).unwrap_or(usize::MAX))
}

/// Whether any attempt of `row` still runs.
pub(super) async fn any_running(
    submitter: &Submitter,
    row: &provider_batches::Model,
) -> Result<bool, DbErr> {
    Ok(attempts::Entity::find()
        .select_only()
        .column(attempts::Column::Id)
        .filter(attempts::Column::ProviderBatchId.eq(row.id))
        .filter(attempts::Column::Outcome.eq(AttemptOutcome::Running))
        .limit(1)
        .into_tuple::<Uuid>()
        .one(&submitter.db)
        .await?
        .is_some())
}

/// Ends at once the attempts started and never sent: the tenant cancelled the item
/// meanwhile (the judge's wait becomes the cancel), or its budget refused the call
/// (failed, not billed). `prices`: each item's, by job id.
pub(super) async fn held_back(
    submitter: &Submitter,
    prices: &HashMap<Uuid, ModelPrice>,
    inputs: &HashMap<Uuid, JobInput>,
    held: Vec<(&Claim, StartedAttempt)>,
) -> Result<(), DbErr> {
    let now = Timestamp::now();
    let mut ends = Vec::with_capacity(held.len());
    for (claim, started) in held {
        let (Some(input), Some(price)) = (inputs.get(&claim.job.id), prices.get(&claim.job.id))
        else {
            continue;
        };
        let end = if let Some(refusal) = started.budget_refusal {
            CallEnd::BudgetSpent(refusal)
        } else {
            CallEnd::Answered(not_run("cancelled before it was sent"))
        };
        let (report, outcome) = judge_batch_request(
            claim,
            &started.attempt,
            price,
            input,
            input
                .call_bound(
                    counting_for(&submitter.providers, &claim.job.model),
                    &claim.job.model,
                )
                .within(claim.job.token_bound),
            submitter.charging,
            Duration::ZERO,
            now,
            end,
        );
        ends.push(AttemptEnd {
            claim: claim.clone(),
            attempt: started.attempt,
            price: price.clone(),
            report,
            outcome,
        });
    }
    finish(submitter, &ends).await.map(|_| ())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Requests the provider never ran go out again (a wait); a result nobody can read
    /// is an unknown outcome, which [`settle`] never sends again.
    #[test]
    fn what_each_result_line_means() {
        for never_ran in [ItemResult::Expired, ItemResult::Cancelled] {
            assert!(matches!(
                answer_of(never_ran),
                Err(ProviderError::NotSent { .. })
            ));
        }
        assert!(matches!(
            answer_of(ItemResult::Unknown("a new result type".into())),
            Err(ProviderError::OutcomeUnknown { .. })
        ));
    }
}
