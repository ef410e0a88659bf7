//! Step 1's sending and step 2: a row's upload — the move to `uploading` under the
//! provider's upload slot, the creating requests, and what the provider answered.

use super::poll::{
    after, backoff, earliest_deadline, fenced, finish_row, next_poll, state, unreadable,
};
use super::settle::{self, CHUNK, not_run};
use super::submit::{chat_request, custom_id};
use super::{Submitter, orphans, rows};
use crate::jobs::input::JobInput;
use crate::llm::batches::{BatchItem, RemoteBatch, created_nothing};
use crate::llm::{Provider, ProviderError};
use entity::{AttemptOutcome, ProviderBatchState, Timestamp, attempts, jobs, provider_batches};
use sea_orm::sea_query::{Expr, ExprTrait};
use sea_orm::{ColumnTrait, DbErr, EntityTrait, QueryFilter, QueryOrder};
use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;
use uuid::Uuid;

/// The requests of the row's attempts still running, in attempt order.
pub(super) async fn items(
    submitter: &Submitter,
    row: &provider_batches::Model,
) -> Result<Vec<BatchItem>, DbErr> {
    let attempts = attempts::Entity::find()
        .filter(attempts::Column::ProviderBatchId.eq(row.id))
        .filter(attempts::Column::Outcome.eq(AttemptOutcome::Running))
        .order_by_asc(attempts::Column::Id)
        .all(&submitter.db)
        .await?;
    let mut jobs: HashMap<Uuid, jobs::Model> = HashMap::with_capacity(attempts.len());
    for ids in attempts.chunks(CHUNK) {
        jobs.extend(
            jobs::Entity::find()
                .filter(jobs::Column::Id.is_in(ids.iter().map(|attempt| attempt.job_id)))
                .all(&submitter.db)
                .await?
                .into_iter()
                .map(|job| (job.id, job)),
        );
    }
    Ok(attempts
        .iter()
        .filter_map(|attempt| {
            let job = jobs.get(&attempt.job_id)?;
            let input: JobInput = serde_json::from_value(job.input.0.clone()).ok()?;
            Some(BatchItem {
                custom_id: custom_id(attempt.id),
                request: chat_request(job, &input),
            })
        })
        .collect())
}

/// `preparing` → `uploading` (fenced, and only while no other upload of the provider
/// is in flight), then the upload.
pub(super) async fn upload(
    submitter: &Submitter,
    row: &provider_batches::Model,
    token: Uuid,
    provider: &Arc<dyn Provider>,
) -> Result<(), DbErr> {
    let api = submitter.calls(provider);
    let late = settle::settle_past_deadline(submitter, row).await?;
    if late > 0 {
        tracing::info!(provider_batch.id = %row.id, items = late, "items whose deadlines passed before their provider batch was sent end unsent");
    }
    let items = items(submitter, row).await?;
    if items.is_empty() {
        // Every attempt was settled (a cancel, deadlines) before anything was sent.
        return finish_row(submitter, row, token, ProviderBatchState::Abandoned).await;
    }
    let encoded: Vec<Vec<u8>> = items.iter().map(|item| api.encode(item)).collect();
    let begin = fenced(submitter, row, token)
        .col_expr(
            provider_batches::Column::State,
            state(ProviderBatchState::Uploading),
        )
        .col_expr(
            provider_batches::Column::UploadingAt,
            Expr::value(Timestamp::now()),
        )
        .filter(provider_batches::Column::State.eq(ProviderBatchState::Preparing));
    let Some(row) = take_upload_slot(submitter, row, token, begin).await? else {
        return Ok(());
    };
    send(submitter, &row, token, provider, &encoded, None).await
}

/// Moves the row to `uploading` by `update` (fenced), unless it takes the provider's
/// upload slot (`exclusive_upload`) and another upload holds it: at most one does, so
/// that a search after a crash can always tell which provider batch was whose. The row
/// then waits its turn, a second.
/// The row as moved, if it was.
pub(super) async fn take_upload_slot(
    submitter: &Submitter,
    row: &provider_batches::Model,
    token: Uuid,
    update: sea_orm::UpdateMany<provider_batches::Entity>,
) -> Result<Option<provider_batches::Model>, DbErr> {
    match rows::write(&submitter.db, update).await {
        Err(error) if crate::db::is_unique_violation(&error) => {
            let wait = fenced(submitter, row, token).col_expr(
                provider_batches::Column::NextPollAt,
                Expr::value(after(Duration::from_secs(1))),
            );
            rows::write(&submitter.db, wait).await?;
            Ok(None)
        }
        moved => moved,
    }
}

/// Makes the upload (or, with `input_file`, creates the batch from OpenAI's file) and
/// records what the provider answered.
pub(super) async fn send(
    submitter: &Submitter,
    row: &provider_batches::Model,
    token: Uuid,
    provider: &Arc<dyn Provider>,
    encoded: &[Vec<u8>],
    input_file: Option<&str>,
) -> Result<(), DbErr> {
    let api = submitter.calls(provider);
    tracing::info!(provider_batch.id = %row.id, provider = %row.provider, items = encoded.len(), "uploading a provider batch");
    // What a search for the upload looks for, should its answer be lost: the
    // requests as built now, whatever becomes of their attempts meanwhile. (Created
    // from OpenAI's input file found again, the upload is the one recorded before.)
    if !encoded.is_empty() {
        let count = fenced(submitter, row, token).col_expr(
            provider_batches::Column::UploadRequests,
            Expr::value(encoded.len() as i64),
        );
        if rows::write(&submitter.db, count).await?.is_none() {
            return Ok(());
        }
    }
    let gate = rows::OwnerGate {
        db: &submitter.db,
        id: row.id,
        token,
    };
    let answer = api.submit(row.id, encoded, input_file, &gate).await;
    match answer {
        Ok(submitted) => {
            // The provider named it in answer to our create: it is ours.
            let recorded = record_submitted(
                submitter,
                row,
                token,
                &submitted.batch,
                submitted.input_file_id,
                true,
            )
            .await?;
            if !recorded {
                // The row was taken over while the create was answered: the batch
                // may be the one the new owner finds, or a second one beside its own.
                orphans::look_after(submitter, row.id, provider.clone(), submitted.batch.id);
            }
            Ok(())
        }
        // Nothing was sent: back to preparing, uploaded again later.
        Err(error) if created_nothing(&error) => {
            let back = fenced(submitter, row, token)
                .col_expr(
                    provider_batches::Column::State,
                    state(ProviderBatchState::Preparing),
                )
                .col_expr(
                    provider_batches::Column::UploadingAt,
                    Expr::value(Option::<Timestamp>::None),
                )
                .col_expr(
                    provider_batches::Column::LastError,
                    Expr::value(error.to_string()),
                )
                .col_expr(
                    provider_batches::Column::NextPollAt,
                    Expr::value(after(backoff(submitter, row))),
                )
                .col_expr(
                    provider_batches::Column::Polls,
                    Expr::col(provider_batches::Column::Polls).add(1),
                );
            rows::write(&submitter.db, back).await?;
            Ok(())
        }
        // Too large for the provider, or for a gateway in front of it, which did not
        // forward it: nothing was made. The items go out again in smaller provider
        // batches; a single request too large fails below.
        Err(ProviderError::Permanent { status: 413, .. }) if encoded.len() > 1 => {
            let bytes: usize = encoded.iter().map(Vec::len).sum();
            submitter.upload_sizes.refused(&row.provider, bytes);
            tracing::warn!(provider_batch.id = %row.id, provider = %row.provider, bytes, items = encoded.len(), "the provider refused the upload as too large; its items go out in smaller provider batches");
            settle::settle_all_running(submitter, row, || {
                not_run("the provider refused the upload as too large; the item goes out in a smaller provider batch")
            })
            .await?;
            finish_row(submitter, row, token, ProviderBatchState::Abandoned).await
        }
        // The provider refused the batch: nothing of it exists there, and the same
        // requests would be refused again. Each item is judged by that refusal.
        Err(ProviderError::Permanent {
            status,
            message,
            request_id,
        }) => {
            tracing::error!(provider_batch.id = %row.id, status, error = %message, "the provider refused the batch");
            settle::settle_all_running(submitter, row, || {
                Err(ProviderError::Permanent {
                    status,
                    message: message.clone(),
                    request_id: request_id.clone(),
                })
            })
            .await?;
            // Why the row ended with no provider batch, for the console and the
            // operator.
            let refused = fenced(submitter, row, token).col_expr(
                provider_batches::Column::LastError,
                Expr::value(crate::db::storable_text(format!(
                    "refused ({status}): {message}"
                ))),
            );
            rows::write(&submitter.db, refused).await?;
            finish_row(submitter, row, token, ProviderBatchState::Settled).await
        }
        // The provider may have the batch, or be making it still (a 429 or 529 too,
        // which a gateway may have answered after forwarding the create): searched
        // for once the create grace has passed, before anything is sent again. The
        // grace counts from now, when the call was given up: a create held on its way
        // (past its time bound, in a proxy) may reach the provider until then.
        Err(error) => {
            let given_up = fenced(submitter, row, token).col_expr(
                provider_batches::Column::SentAt,
                Expr::value(Timestamp::now()),
            );
            rows::write(&submitter.db, given_up).await?;
            unreadable(submitter, row, token, &error).await
        }
    }
}

pub(super) async fn record_submitted(
    submitter: &Submitter,
    row: &provider_batches::Model,
    token: Uuid,
    remote: &RemoteBatch,
    input_file_id: Option<String>,
    attributed: bool,
) -> Result<bool, DbErr> {
    let now = Timestamp::now();
    // A candidate is polled at the poll interval only: it is not cancelled when a
    // deadline passes, so reading it at the deadline would change nothing.
    let deadline = if attributed {
        earliest_deadline(submitter, row).await?
    } else {
        None
    };
    let update = fenced(submitter, row, token)
        .col_expr(
            provider_batches::Column::State,
            state(ProviderBatchState::Submitted),
        )
        .col_expr(
            provider_batches::Column::ProviderBatchId,
            Expr::value(remote.id.clone()),
        )
        .col_expr(
            provider_batches::Column::InputFileId,
            Expr::value(input_file_id.or_else(|| row.input_file_id.clone())),
        )
        .col_expr(
            provider_batches::Column::Attributed,
            Expr::value(attributed),
        )
        .col_expr(provider_batches::Column::SubmittedAt, Expr::value(now))
        .col_expr(provider_batches::Column::LastReadAt, Expr::value(now))
        .col_expr(
            provider_batches::Column::LastError,
            Expr::value(Option::<String>::None),
        )
        .col_expr(provider_batches::Column::Polls, Expr::value(0))
        .col_expr(
            provider_batches::Column::NextPollAt,
            Expr::value(next_poll(submitter, deadline)),
        );
    let recorded = rows::write(&submitter.db, update).await?.is_some();
    if recorded {
        tracing::info!(provider_batch.id = %row.id, provider = %row.provider, provider_batch = %remote.id, "provider batch submitted");
    }
    Ok(recorded)
}
