//! Finding an upload again after a crash or a lost answer, before anything is sent
//! again (see `docs/provider-batches.md`, "Finding an upload again after a crash").
//!
//! OpenAI's batches carry our id in their metadata: what the search finds is ours.
//! Anthropic's carry nothing of ours before their results do: what it finds is a
//! candidate, recorded unattributed, and its first result line says whose it is —
//! ours, it is settled; someone else's, it is ruled out and the row searches again.

use super::poll::{abandon, fenced, finish_row, state, unreadable};
use super::upload::{items, record_submitted, send, take_upload_slot};
use super::{Submitter, rows, settle};
use crate::llm::Provider;
use crate::llm::batches::{Found, ResultLine};
use entity::{ProviderBatchState, Timestamp, attempts, provider_batches};
use sea_orm::sea_query::Expr;
use sea_orm::{ColumnTrait, DbErr, EntityTrait, QueryFilter, QuerySelect};
use std::collections::HashSet;
use std::sync::Arc;
use uuid::Uuid;

/// How far back of an upload's start a search for it looks: the providers' clocks
/// and ours differ, and OpenAI dates to the second.
const SEARCH_SLACK: chrono::Duration = chrono::Duration::seconds(10);
/// A row left `uploading`: the provider is searched for the upload before anything is
/// sent again.
pub(super) async fn recover(
    submitter: &Submitter,
    row: &provider_batches::Model,
    token: Uuid,
    provider: &Arc<dyn Provider>,
    cancelled: bool,
) -> Result<(), DbErr> {
    // A create still in flight is not listed yet: a search now could miss it and
    // upload the items a second time. Every upload again follows a search made
    // after this, so nothing is re-sent within the grace of the last send either.
    if let Some(sent) = row.sent_at {
        let searchable = sent.plus(
            chrono::Duration::from_std(submitter.settings.create_grace)
                .unwrap_or(chrono::Duration::MAX),
        );
        if searchable > Timestamp::now() {
            let wait = fenced(submitter, row, token).col_expr(
                provider_batches::Column::NextPollAt,
                Expr::value(searchable),
            );
            return rows::write(&submitter.db, wait).await.map(drop);
        }
    }
    let api = submitter.calls(provider);
    let began = row.uploading_at.unwrap_or(row.created_at);
    let since = began.to_datetime() - SEARCH_SLACK;
    // The provider's batches some row of ours recorded: one created since the upload
    // began was recorded since, too.
    let mut known: HashSet<String> = provider_batches::Entity::find()
        .select_only()
        .column(provider_batches::Column::ProviderBatchId)
        .filter(provider_batches::Column::Provider.eq(&row.provider))
        .filter(provider_batches::Column::ProviderBatchId.is_not_null())
        .filter(provider_batches::Column::SubmittedAt.gte(Timestamp::from(since - SEARCH_SLACK)))
        .into_tuple::<Option<String>>()
        .all(&submitter.db)
        .await?
        .into_iter()
        .flatten()
        .collect();
    known.extend(ruled_out(row));
    // What the upload sent, as recorded when it was built: an attempt settled since
    // (a cancel, a deadline) is still a request of the batch the provider holds. A
    // row uploaded before the count was recorded falls back on its attempts still
    // running.
    let sent = match row
        .upload_requests
        .and_then(|count| usize::try_from(count).ok())
    {
        Some(count) => count,
        None => settle::running_count(submitter, row).await?,
    };
    match api.find(row.id, since, &known, sent).await {
        Ok(Found::Batch(remote)) => {
            let attributed = remote.ours == Some(row.id);
            if attributed {
                tracing::warn!(provider_batch.id = %row.id, provider_batch = %remote.id, "found the upload again after it was lost");
            } else {
                tracing::warn!(provider_batch.id = %row.id, provider_batch = %remote.id, "found a provider batch that may be the lost upload; its results will tell");
            }
            record_submitted(submitter, row, token, &remote, None, attributed)
                .await
                .map(drop)
        }
        // Nothing of the upload was made (or only OpenAI's input file, which bills
        // nothing): the cancelled batch's items end here, unsent.
        Ok(Found::InputFile(_) | Found::Nothing) if cancelled => {
            abandon(submitter, row, token).await
        }
        Ok(Found::InputFile(file)) => {
            tracing::warn!(provider_batch.id = %row.id, file = %file, "found the input file without its batch; creating the batch from it");
            let Some(row) = &answered(submitter, row, token).await? else {
                return Ok(());
            };
            send(submitter, row, token, provider, &[], Some(&file)).await
        }
        Ok(Found::Nothing) => {
            tracing::warn!(provider_batch.id = %row.id, "the provider has nothing of the upload; uploading again");
            let Some(row) = &answered(submitter, row, token).await? else {
                return Ok(());
            };
            settle::settle_past_deadline(submitter, row).await?;
            let items = items(submitter, row).await?;
            if items.is_empty() {
                return finish_row(submitter, row, token, ProviderBatchState::Abandoned).await;
            }
            let encoded: Vec<Vec<u8>> = items.iter().map(|item| api.encode(item)).collect();
            send(submitter, row, token, provider, &encoded, None).await
        }
        Err(error) => unreadable(submitter, row, token, &error).await,
    }
}

/// `row` once the provider answered its search: the unknown-fate bound counts the
/// provider's silence from its last answer, and a search that found nothing of the
/// upload is one (else creates refused before reaching the provider would, after the
/// bound, give items never sent an unknown outcome). `None`: the row is no longer
/// this token's.
async fn answered(
    submitter: &Submitter,
    row: &provider_batches::Model,
    token: Uuid,
) -> Result<Option<provider_batches::Model>, DbErr> {
    let read = fenced(submitter, row, token).col_expr(
        provider_batches::Column::LastReadAt,
        Expr::value(Timestamp::now()),
    );
    rows::write(&submitter.db, read).await
}

/// The provider ids of the batches `row`'s searches ruled out.
fn ruled_out(row: &provider_batches::Model) -> Vec<String> {
    row.ruled_out
        .as_deref()
        .and_then(|text| serde_json::from_str(text).ok())
        .unwrap_or_default()
}

/// Whether `line` names one of `row`'s attempts (settled or not: a crash may have
/// come between two chunks).
pub(super) async fn names_an_attempt_of(
    submitter: &Submitter,
    row: &provider_batches::Model,
    line: Option<&ResultLine>,
) -> Result<bool, DbErr> {
    let Some(attempt) = line.and_then(|line| Uuid::try_parse(&line.custom_id).ok()) else {
        return Ok(false);
    };
    Ok(attempts::Entity::find_by_id(attempt)
        .filter(attempts::Column::ProviderBatchId.eq(row.id))
        .one(&submitter.db)
        .await?
        .is_some())
}

/// A candidate whose results name none of the row's attempts was someone else's
/// batch: nothing of it is settled, and the row goes back to searching for its upload,
/// leaving the candidate out — found nothing, it uploads again.
pub(super) async fn rule_out(
    submitter: &Submitter,
    row: &provider_batches::Model,
    token: Uuid,
    candidate: &str,
) -> Result<(), DbErr> {
    let mut out = ruled_out(row);
    out.push(candidate.to_owned());
    let back = fenced(submitter, row, token)
        .col_expr(
            provider_batches::Column::State,
            state(ProviderBatchState::Uploading),
        )
        .col_expr(
            provider_batches::Column::ProviderBatchId,
            Expr::value(Option::<String>::None),
        )
        .col_expr(
            provider_batches::Column::RuledOut,
            Expr::value(serde_json::to_string(&out).expect("ids serialize")),
        )
        .col_expr(
            provider_batches::Column::SubmittedAt,
            Expr::value(Option::<Timestamp>::None),
        )
        .col_expr(
            provider_batches::Column::EndedAt,
            Expr::value(Option::<Timestamp>::None),
        )
        .col_expr(provider_batches::Column::Polls, Expr::value(0))
        .col_expr(
            provider_batches::Column::NextPollAt,
            Expr::value(Timestamp::now()),
        );
    if take_upload_slot(submitter, row, token, back)
        .await?
        .is_some()
    {
        tracing::warn!(provider_batch.id = %row.id, provider_batch = %candidate, "the candidate's results name none of the row's attempts: it was someone else's; searching again");
    }
    Ok(())
}
