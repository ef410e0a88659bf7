//! Which rows' steps run, and when: each due row's step is a task of its own, and
//! each provider has [`ROWS_AT_ONCE`] slots of its own for them.

use super::{Submitter, poll, rows, search, upload};
use crate::keyed_slots::KeyedSlots;
use crate::llm::{Provider, ProviderError};
use entity::{ProviderBatchState, Timestamp, batches, provider_batches};
use sea_orm::sea_query::Expr;
use sea_orm::{DbErr, EntityTrait};
use std::sync::Arc;
use tokio::task::JoinSet;
use tokio_util::sync::CancellationToken;
use uuid::Uuid;

/// Rows of one provider one process advances at once.
pub(super) const ROWS_AT_ONCE: usize = 8;

/// The steps under way, counted by provider. A provider that stalls holds each of
/// its rows' steps up to the call timeout; with slots of its own, its rows fill
/// those and leave the other providers' rows theirs.
pub(super) type Slots = KeyedSlots<String>;

/// Starts a step, in `steps`, for each due row whose lease is free (a row whose
/// step is under way is leased to it), as many of each provider's as it has free
/// slots for.
pub(super) async fn start_due_rows(
    submitter: &Arc<Submitter>,
    slots: &Slots,
    steps: &mut JoinSet<()>,
    stop: &CancellationToken,
) -> Result<(), DbErr> {
    for provider in rows::due_providers(&submitter.db).await? {
        let room = ROWS_AT_ONCE.saturating_sub(slots.taken(&provider));
        if room == 0 {
            continue;
        }
        for due in rows::due(&submitter.db, &provider, room).await? {
            let Some(slot) = slots.try_take(&provider, ROWS_AT_ONCE) else {
                break;
            };
            let submitter = submitter.clone();
            let stop = stop.clone();
            steps.spawn(async move {
                let _slot = slot;
                if let Err(error) = advance_one(&submitter, due.id, &stop).await {
                    tracing::warn!(provider_batch.id = %due.id, error = %error, "a provider batch step failed; it is tried again");
                }
            });
        }
    }
    Ok(())
}

/// One step of the row `id`, if its lease is still free.
async fn advance_one(
    submitter: &Submitter,
    id: Uuid,
    stop: &CancellationToken,
) -> Result<(), DbErr> {
    if stop.is_cancelled() {
        return Ok(());
    }
    let token = Uuid::new_v4();
    let Some(row) = rows::take(&submitter.db, id, token).await? else {
        return Ok(());
    };
    let cancelled = cancel_requested(submitter, &row).await?;
    // The lease is renewed while the step runs: a step waiting on the provider is
    // no lapse for another process to take the row over and ask again.
    let step = rows::while_owned(
        &submitter.db,
        row.id,
        token,
        advance(submitter, &row, token, cancelled),
    )
    .await;
    if let Err(error) = step {
        tracing::warn!(provider_batch.id = %row.id, error = %error, "a provider batch step failed; it is tried again");
    }
    // A cancel that came while the step ran (an upload, a read) found the row's next
    // look set by the step, up to a poll interval away: it is due now, so that the
    // cancel reaches the provider before it runs what is not run yet.
    if !cancelled && cancel_requested(submitter, &row).await? {
        let due = poll::fenced(submitter, &row, token).col_expr(
            provider_batches::Column::NextPollAt,
            Expr::value(Timestamp::now()),
        );
        rows::write(&submitter.db, due).await?;
    }
    rows::release(&submitter.db, row.id, token).await
}

/// The provider the row was uploaded to, if this process still routes its model
/// there and it has a batch API.
fn provider_of(submitter: &Submitter, row: &provider_batches::Model) -> Option<Arc<dyn Provider>> {
    submitter
        .providers
        .provider_for(&row.model)
        .filter(|provider| provider.name() == row.provider && provider.batch_api().is_some())
}

/// Whether the tenant cancelled the row's batch.
async fn cancel_requested(
    submitter: &Submitter,
    row: &provider_batches::Model,
) -> Result<bool, DbErr> {
    Ok(batches::Entity::find_by_id(row.batch_id)
        .one(&submitter.db)
        .await?
        .is_some_and(|batch| batch.cancel_requested))
}

async fn advance(
    submitter: &Submitter,
    row: &provider_batches::Model,
    token: Uuid,
    cancelled: bool,
) -> Result<(), DbErr> {
    let Some(provider) = provider_of(submitter, row) else {
        let error = ProviderError::NotSent {
            message: format!(
                "this process routes {:?} to no batch API of provider {:?}",
                row.model, row.provider
            ),
        };
        return poll::unreadable(submitter, row, token, &error).await;
    };
    match row.state {
        ProviderBatchState::Preparing if cancelled => poll::abandon(submitter, row, token).await,
        ProviderBatchState::Preparing => upload::upload(submitter, row, token, &provider).await,
        ProviderBatchState::Uploading => {
            search::recover(submitter, row, token, &provider, cancelled).await
        }
        ProviderBatchState::Submitted | ProviderBatchState::Cancelling => {
            poll::poll(submitter, row, token, &provider, cancelled).await
        }
        ProviderBatchState::Ended => {
            poll::settle_results(submitter, row, token, &provider, None).await
        }
        ProviderBatchState::Settled
        | ProviderBatchState::Abandoned
        | ProviderBatchState::Unknown => Ok(()),
    }
}
