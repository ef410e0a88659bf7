//! Steps 3 and 4 on a row: read it, cancel it, settle its results, or give its items
//! unknown fates; and what every step shares (fenced writes, backoff).

use super::settle::{self, CHUNK, answer_of, not_run};
use super::{Submitter, rows, search};
use crate::backoff::{Backoff, Jitter};
use crate::llm::batches::{RemoteBatch, RemoteState};
use crate::llm::{Provider, ProviderError};
use entity::{JobStatus, ProviderBatchState, Timestamp, jobs, provider_batches};
use sea_orm::sea_query::{Expr, ExprTrait};
use sea_orm::{ColumnTrait, DbErr, EntityTrait, QueryFilter, QueryOrder, QuerySelect};
use std::sync::Arc;
use std::time::Duration;
use uuid::Uuid;

/// The longest wait between two tries after the provider failed to answer.
const MAX_BACKOFF: Duration = Duration::from_secs(600);

pub(super) fn backend(submitter: &Submitter) -> sea_orm::DbBackend {
    submitter.db.get_database_backend()
}

/// The fenced update of the row by `token`.
pub(super) fn fenced(
    submitter: &Submitter,
    row: &provider_batches::Model,
    token: Uuid,
) -> sea_orm::UpdateMany<provider_batches::Entity> {
    rows::fenced(backend(submitter), row.id, token)
}

pub(super) fn state(state: ProviderBatchState) -> Expr {
    Expr::value(state)
}

pub(super) fn after(delay: Duration) -> Timestamp {
    Timestamp::now().plus(chrono::Duration::from_std(delay).unwrap_or(chrono::Duration::MAX))
}

/// A submitted row: cancelled at the provider when its batch was, read, and settled
/// once ended.
pub(super) async fn poll(
    submitter: &Submitter,
    row: &provider_batches::Model,
    token: Uuid,
    provider: &Arc<dyn Provider>,
    cancelled: bool,
) -> Result<(), DbErr> {
    let api = submitter.calls(provider);
    let Some(id) = row.provider_batch_id.clone() else {
        return Ok(());
    };
    // A candidate may be someone else's batch: it is never cancelled, and its
    // deadlines do not make it read sooner. If it is ours, the provider runs it whole
    // and what it finished is charged.
    let deadline = if row.attributed {
        earliest_deadline(submitter, row).await?
    } else {
        None
    };
    let past_deadline = deadline.is_some_and(|deadline| deadline <= Timestamp::now());
    if cancelled && !row.attributed && !row.cancel_sent {
        tracing::warn!(provider_batch.id = %row.id, provider_batch = %id, "the batch was cancelled while its provider batch is a candidate not known to be ours; it is not cancelled at the provider");
    }
    if (cancelled || past_deadline) && row.attributed && !row.cancel_sent {
        if past_deadline && !cancelled {
            // A request the provider has not run by then would finish too late: what
            // it finished before the cancel is charged and kept, the rest comes back
            // cancelled and its items fail DEADLINE_EXCEEDED (or go out again, if
            // their own deadlines are later).
            tracing::info!(provider_batch.id = %row.id, provider_batch = %id, "an item's deadline passed while its provider batch ran; cancelling it");
        }
        if let Err(error) = api.cancel(&id).await {
            // A provider refuses to cancel a batch that has ended already (OpenAI: 409):
            // its results are then what the cancel charges, and they are read below.
            match api.read(&id).await {
                Ok(remote) if remote.state == RemoteState::Ended => {}
                // The provider answers and refuses the cancel: no silence toward the
                // unknown-fate bound (the batch runs on, and its results will
                // settle it); the cancel is tried again after the backoff.
                Ok(_) => return cancel_refused(submitter, row, token, &error).await,
                Err(_) => return unreadable(submitter, row, token, &error).await,
            }
        }
        let sent = fenced(submitter, row, token)
            .col_expr(provider_batches::Column::CancelSent, Expr::value(true))
            .col_expr(
                provider_batches::Column::State,
                state(ProviderBatchState::Cancelling),
            );
        rows::write(&submitter.db, sent).await?;
        tracing::info!(provider_batch.id = %row.id, provider_batch = %id, "asked the provider to cancel the provider batch");
    }
    let remote = match api.read(&id).await {
        Ok(remote) => remote,
        Err(error) => return unreadable(submitter, row, token, &error).await,
    };
    let now = Timestamp::now();
    if remote.state != RemoteState::Ended {
        let next = fenced(submitter, row, token)
            .col_expr(provider_batches::Column::LastReadAt, Expr::value(now))
            .col_expr(
                provider_batches::Column::LastError,
                Expr::value(Option::<String>::None),
            )
            .col_expr(
                provider_batches::Column::Polls,
                Expr::col(provider_batches::Column::Polls).add(1),
            )
            .col_expr(
                provider_batches::Column::NextPollAt,
                Expr::value(next_poll(submitter, deadline.filter(|_| !row.cancel_sent))),
            );
        rows::write(&submitter.db, next).await?;
        return Ok(());
    }
    let ended = fenced(submitter, row, token)
        .col_expr(
            provider_batches::Column::State,
            state(ProviderBatchState::Ended),
        )
        .col_expr(provider_batches::Column::EndedAt, Expr::value(now))
        .col_expr(provider_batches::Column::LastReadAt, Expr::value(now));
    let Some(row) = rows::write(&submitter.db, ended).await? else {
        return Ok(());
    };
    tracing::info!(provider_batch.id = %row.id, provider_batch = %id, "provider batch ended; settling its results");
    settle_results(submitter, &row, token, provider, Some(remote)).await
}

/// The earliest deadline of the items the row still runs: the provider batch is
/// cancelled when it passes.
pub(super) async fn earliest_deadline(
    submitter: &Submitter,
    row: &provider_batches::Model,
) -> Result<Option<Timestamp>, DbErr> {
    // An item of a provider batch is run under the row's id as its run token.
    Ok(jobs::Entity::find()
        .select_only()
        .column(jobs::Column::Deadline)
        .filter(jobs::Column::RunToken.eq(row.id))
        .filter(jobs::Column::Status.eq(JobStatus::Running))
        .filter(jobs::Column::Deadline.is_not_null())
        .order_by_asc(jobs::Column::Deadline)
        .limit(1)
        .into_tuple::<Option<Timestamp>>()
        .one(&submitter.db)
        .await?
        .flatten())
}

/// The next read of a submitted row: after the poll interval, or at the earliest
/// deadline of its items if that comes first, so that the cancel is not late.
pub(super) fn next_poll(submitter: &Submitter, deadline: Option<Timestamp>) -> Timestamp {
    let poll = after(submitter.settings.poll);
    deadline.map_or(poll, |deadline| {
        Ord::min(Ord::max(deadline, Timestamp::now()), poll)
    })
}

/// Streams an ended batch's results, settling them a chunk at a time; then the
/// attempts it holds no line for (treated as expired), and the row is `settled`.
pub(super) async fn settle_results(
    submitter: &Submitter,
    row: &provider_batches::Model,
    token: Uuid,
    provider: &Arc<dyn Provider>,
    remote: Option<RemoteBatch>,
) -> Result<(), DbErr> {
    let api = submitter.calls(provider);
    let remote = match remote {
        Some(remote) => remote,
        None => {
            let Some(id) = &row.provider_batch_id else {
                return Ok(());
            };
            match api.read(id).await {
                Ok(remote) => remote,
                Err(error) => return unreadable(submitter, row, token, &error).await,
            }
        }
    };
    let mut lines = match api.results(&remote).await {
        Ok(lines) => lines,
        Err(error) => return unreadable(submitter, row, token, &error).await,
    };
    // A candidate's first line tells whose it is: a batch holds the requests of one
    // upload, named by their attempts' ids.
    let mut first = None;
    if !row.attributed {
        let line = match lines.next().await {
            Ok(line) => line,
            Err(error) => return unreadable(submitter, row, token, &error).await,
        };
        if !search::names_an_attempt_of(submitter, row, line.as_ref()).await? {
            return search::rule_out(submitter, row, token, &remote.id).await;
        }
        let attributed = fenced(submitter, row, token)
            .col_expr(provider_batches::Column::Attributed, Expr::value(true));
        if rows::write(&submitter.db, attributed).await?.is_none() {
            return Ok(());
        }
        tracing::info!(provider_batch.id = %row.id, provider_batch = %remote.id, "the candidate's results name the row's attempts: it is the lost upload");
        first = line;
    }
    let mut chunk = Vec::with_capacity(CHUNK);
    let mut settled = 0;
    loop {
        let next = match first.take() {
            Some(line) => Ok(Some(line)),
            None => lines.next().await,
        };
        match next {
            Ok(Some(line)) => match Uuid::try_parse(&line.custom_id) {
                Ok(attempt) => chunk.push((attempt, answer_of(line.result))),
                Err(_) => {
                    tracing::warn!(provider_batch.id = %row.id, custom_id = %line.custom_id, "a result names no attempt of ours; ignored");
                }
            },
            Ok(None) => break,
            Err(error) => {
                settle::settle(submitter, row, std::mem::take(&mut chunk)).await?;
                return unreadable(submitter, row, token, &error).await;
            }
        }
        if chunk.len() == CHUNK {
            settled += settle::settle(submitter, row, std::mem::take(&mut chunk)).await?;
            // Renews the lease: a large batch's results take a while.
            if rows::write(&submitter.db, fenced(submitter, row, token))
                .await?
                .is_none()
            {
                return Ok(());
            }
        }
    }
    settled += settle::settle(submitter, row, chunk).await?;
    // A request the results do not mention: of a batch the provider refused to run,
    // an error that spends an attempt (not billed); of one it ran, a fate unknown — it
    // may have run, and been billed, with its line lost (a results file cut short),
    // so it is never sent again (invariant 1).
    let refused = remote.refused.clone();
    let missing = settle::settle_all_running(submitter, row, || match &refused {
        Some(reason) => Err(ProviderError::Transient {
            status: 400,
            message: reason.clone(),
            retry_after: None,
            request_id: None,
        }),
        None => Err(ProviderError::OutcomeUnknown {
            message: "the provider batch ended without a result for the request".to_owned(),
        }),
    })
    .await?;
    if missing > 0 {
        match &remote.refused {
            Some(reason) => {
                tracing::warn!(provider_batch.id = %row.id, missing, reason = %reason, "the provider refused to run the provider batch; its requests spend an attempt");
            }
            None => {
                tracing::warn!(provider_batch.id = %row.id, missing, "the provider batch ended without results for some requests; their fates are unknown");
            }
        }
    }
    tracing::info!(provider_batch.id = %row.id, settled = settled + missing, "provider batch settled");
    finish_row(submitter, row, token, ProviderBatchState::Settled).await
}

/// A row cancelled before anything was sent: its attempts end unsent (their jobs
/// cancelled), and it is `abandoned`.
pub(super) async fn abandon(
    submitter: &Submitter,
    row: &provider_batches::Model,
    token: Uuid,
) -> Result<(), DbErr> {
    settle::settle_all_running(submitter, row, || {
        not_run("the batch was cancelled before its provider batch was sent")
    })
    .await?;
    finish_row(submitter, row, token, ProviderBatchState::Abandoned).await
}

pub(super) async fn finish_row(
    submitter: &Submitter,
    row: &provider_batches::Model,
    token: Uuid,
    to: ProviderBatchState,
) -> Result<(), DbErr> {
    // A row whose attempts are not all settled yet (another transaction holds one)
    // stays as it is and is looked at again.
    if settle::any_running(submitter, row).await? {
        let again = fenced(submitter, row, token).col_expr(
            provider_batches::Column::NextPollAt,
            Expr::value(after(Duration::from_secs(1))),
        );
        rows::write(&submitter.db, again).await?;
        return Ok(());
    }
    let update = fenced(submitter, row, token)
        .col_expr(provider_batches::Column::State, state(to))
        .col_expr(
            provider_batches::Column::EndedAt,
            Expr::value(row.ended_at.unwrap_or_else(Timestamp::now)),
        );
    rows::write(&submitter.db, update).await?;
    Ok(())
}

/// The wait before the next try after `row`'s provider failed to answer: doubling
/// from one second with each failure, up to the poll interval's tenfold (at most
/// ten minutes).
pub(super) fn backoff(submitter: &Submitter, row: &provider_batches::Model) -> Duration {
    let backoff = Backoff {
        first: Duration::from_secs(1),
        cap: (submitter.settings.poll * 10).min(MAX_BACKOFF),
        jitter: Jitter::None,
    };
    // `polls` counts the failures before this one.
    backoff.nominal(u32::try_from(row.polls).unwrap_or(0).saturating_add(1))
}

/// The provider could not be read about the row (or refused to say): tried again
/// after a backoff, unless it has been silent past the unknown-fate bound.
pub(super) async fn unreadable(
    submitter: &Submitter,
    row: &provider_batches::Model,
    token: Uuid,
    error: &ProviderError,
) -> Result<(), DbErr> {
    let now = Timestamp::now();
    let silent =
        Duration::from_micros(u64::try_from(now.micros() - row.last_read_at.micros()).unwrap_or(0));
    if silent >= submitter.settings.unknown_after {
        return unknown(submitter, row, token, silent).await;
    }
    tracing::warn!(provider_batch.id = %row.id, provider = %row.provider, error = %error, "the provider could not be read about a provider batch; trying again");
    back_off(submitter, row, token, error.to_string()).await
}

/// Records `why` the row's step failed and looks at it again after the backoff.
async fn back_off(
    submitter: &Submitter,
    row: &provider_batches::Model,
    token: Uuid,
    why: String,
) -> Result<(), DbErr> {
    let update = fenced(submitter, row, token)
        .col_expr(
            provider_batches::Column::LastError,
            Expr::value(crate::db::storable_text(why)),
        )
        .col_expr(
            provider_batches::Column::Polls,
            Expr::col(provider_batches::Column::Polls).add(1),
        )
        .col_expr(
            provider_batches::Column::NextPollAt,
            Expr::value(after(backoff(submitter, row))),
        );
    rows::write(&submitter.db, update).await.map(drop)
}

/// The provider read the row's batch but refused to cancel it: an answer, so the row
/// is not silent; the cancel goes again after the backoff.
async fn cancel_refused(
    submitter: &Submitter,
    row: &provider_batches::Model,
    token: Uuid,
    error: &ProviderError,
) -> Result<(), DbErr> {
    tracing::warn!(provider_batch.id = %row.id, provider = %row.provider, error = %error, "the provider refused to cancel a provider batch that still runs; trying again");
    let read = fenced(submitter, row, token).col_expr(
        provider_batches::Column::LastReadAt,
        Expr::value(Timestamp::now()),
    );
    if rows::write(&submitter.db, read).await?.is_none() {
        return Ok(());
    }
    back_off(submitter, row, token, format!("cancel refused: {error}")).await
}

/// Past the bound: every attempt still running ends `UNKNOWN` with its cost bound
/// (within its item's hold), and the row is `unknown`.
async fn unknown(
    submitter: &Submitter,
    row: &provider_batches::Model,
    token: Uuid,
    silent: Duration,
) -> Result<(), DbErr> {
    let message = format!(
        "provider {} could not be read about its batch for {} s, past the bound of {} s: what it did with the request is unknown",
        row.provider,
        silent.as_secs(),
        submitter.settings.unknown_after.as_secs()
    );
    tracing::error!(provider_batch.id = %row.id, provider = %row.provider, silent_seconds = silent.as_secs(), "a provider batch's fate is unknown; its items end with their cost bounds");
    settle::settle_all_running(submitter, row, || {
        Err(ProviderError::OutcomeUnknown {
            message: message.clone(),
        })
    })
    .await?;
    finish_row(submitter, row, token, ProviderBatchState::Unknown).await
}
