//! Step 1: a closed batch's due queued items become one provider batch — claimed,
//! their attempts started and the row written in one transaction, before anything is
//! sent — and the upload follows.

use super::{Submitter, settle};
use crate::billing::{AttemptEnding, ModelPrice, prices};
use crate::db::begin_write;
use crate::jobs::input::JobInput;
use crate::jobs::lifecycle::JobError;
use crate::jobs::queue::{self, AttemptStart, Claim, StartedAttempt, abandon_claim};
use crate::llm::ChatRequest;
use crate::llm::batches::{BatchApi, BatchItem};
use entity::JobErrorCode;
use entity::{
    BatchMode, BatchStatus, JobStatus, ProviderBatchState, Timestamp, attempts, batches, jobs,
    provider_batches,
};
use sea_orm::sea_query::{Expr, ExprTrait, Func, LockBehavior, LockType, Query};
use sea_orm::{
    ActiveValue::Set, ColumnTrait, DbBackend, DbErr, EntityTrait, QueryFilter, QueryOrder,
    QuerySelect,
};
use std::collections::HashMap;
use std::time::Duration;
use tokio_util::sync::CancellationToken;
use uuid::Uuid;

/// Most items one provider batch takes, below both providers' own limits: its
/// requests are built in memory for the upload, and its results settle in one pass.
pub const MAX_ITEMS_PER_PROVIDER_BATCH: u64 = 10_000;
/// The same on SQLite, whose statements take at most 32,766 parameters: the claim's
/// transaction starts every item's attempt in one statement (about 25 values each).
const MAX_ITEMS_PER_PROVIDER_BATCH_SQLITE: u64 = 500;
/// How long an item in a provider batch is owned without renewal: past the
/// provider's completion window and a day more. The submitter settles it long
/// before (its unknown-fate bound ends it); the lease is what lets the job rescue
/// take it back if the provider batch row itself was lost.
pub(crate) const ITEM_LEASE: Duration = Duration::from_secs(48 * 60 * 60);

/// Submits the due queued items of every closed, uncancelled PROVIDER_BATCH batch.
pub(super) async fn submit_closed_batches(
    submitter: &Submitter,
    stop: &CancellationToken,
) -> Result<(), DbErr> {
    let now = Timestamp::now();
    let due_items = Query::select()
        .expr(Expr::value(1))
        .from(jobs::Entity)
        .and_where(
            Expr::col((jobs::Entity, jobs::Column::BatchId))
                .equals((batches::Entity, batches::Column::Id)),
        )
        .and_where(Expr::col((jobs::Entity, jobs::Column::Status)).eq(JobStatus::Queued))
        .and_where(Expr::col((jobs::Entity, jobs::Column::NextRunAt)).lte(now))
        .to_owned();
    let closed = batches::Entity::find()
        .filter(batches::Column::Mode.eq(BatchMode::ProviderBatch))
        .filter(batches::Column::Status.eq(BatchStatus::Closed))
        .filter(batches::Column::CancelRequested.eq(false))
        .filter(Expr::exists(due_items))
        .order_by_asc(batches::Column::ClosedAt)
        .all(&submitter.db)
        .await?;
    for batch in closed {
        while !stop.is_cancelled() {
            match submit_one(submitter, &batch).await {
                Ok(0) => break,
                Ok(_) => {}
                // One batch's failure is its own: the others still go out.
                Err(error) => {
                    tracing::warn!(batch.id = %batch.id, error = %error, "submitting a provider batch failed; its items wait for the next try");
                    break;
                }
            }
        }
    }
    Ok(())
}

/// The chat request of an item, as a worker would send it.
pub(super) fn chat_request(job: &jobs::Model, input: &JobInput) -> ChatRequest {
    ChatRequest {
        model: job.model.clone(),
        messages: input.messages.clone(),
        max_output_tokens: input.max_output_tokens,
        response_schema: input.response_schema.clone(),
        parameters: input.parameters.clone(),
        tools: input.tools.clone(),
    }
}

/// The custom id of an attempt in its provider batch: the attempt's id, 32 hex
/// digits, which both providers accept and which names the attempt — and through it
/// its job, its run token and its provider batch — with no table of its own.
pub(super) fn custom_id(attempt_id: Uuid) -> String {
    attempt_id.simple().to_string()
}

/// One provider batch of `batch`'s due queued items; how many items it claimed
/// (0: nothing was due, or the model cannot go through a batch API now).
async fn submit_one(submitter: &Submitter, batch: &batches::Model) -> Result<usize, DbErr> {
    let Some(provider) = submitter.providers.provider_for(&batch.model) else {
        tracing::warn!(batch.id = %batch.id, model = %batch.model, "no provider serves the batch's model; its items wait");
        return Ok(0);
    };
    let Some(api) = provider.batch_api() else {
        tracing::warn!(batch.id = %batch.id, model = %batch.model, provider = provider.name(), "the batch's provider has no batch API; its items wait");
        return Ok(0);
    };
    let now = Timestamp::now();
    let Some(price) = prices::price_at(&submitter.db, &batch.model, now)
        .await?
        .filter(|price| price.batch.is_some())
    else {
        tracing::warn!(batch.id = %batch.id, model = %batch.model, "the batch's model has no batch price now; its items wait");
        return Ok(0);
    };
    let backend = submitter.db.get_database_backend();
    let transaction = begin_write(&submitter.db).await?;
    let mut candidates = jobs::Entity::find()
        .filter(jobs::Column::BatchId.eq(batch.id))
        .filter(jobs::Column::Status.eq(JobStatus::Queued))
        .filter(jobs::Column::NextRunAt.lte(now))
        .order_by_asc(jobs::Column::Id)
        .limit(if backend == DbBackend::Postgres {
            MAX_ITEMS_PER_PROVIDER_BATCH
        } else {
            MAX_ITEMS_PER_PROVIDER_BATCH_SQLITE
        });
    // An item admitted for a real provider never goes to the simulator (as a
    // worker's call would not).
    if submitter.providers.simulates(&batch.model) {
        candidates = candidates.filter(jobs::Column::Simulated.eq(true));
    }
    if backend == DbBackend::Postgres {
        candidates = candidates.lock_with_behavior(LockType::Update, LockBehavior::SkipLocked);
    }
    let candidates = candidates.all(&transaction).await?;
    if candidates.is_empty() {
        transaction.rollback().await?;
        return Ok(0);
    }
    let bytes = submitter
        .upload_sizes
        .bound(provider.name(), api.limits().bytes);
    let (chosen, unreadable) = within_limits(api, bytes, candidates);
    let row_id = Uuid::now_v7();
    // Each item's run token is the provider batch's id: every write about the item
    // from now on is fenced by it, as a worker's by its claim's.
    let ids: Vec<Uuid> = chosen
        .iter()
        .map(|(job, _)| job.id)
        .chain(unreadable.iter().map(|job| job.id))
        .collect();
    let claimed = jobs::Entity::update_many()
        .col_expr(jobs::Column::Status, Expr::value(JobStatus::Running))
        .col_expr(
            jobs::Column::AttemptCount,
            Expr::col(jobs::Column::AttemptCount).add(1),
        )
        .col_expr(jobs::Column::RunToken, Expr::value(row_id))
        .col_expr(
            jobs::Column::LeaseUntil,
            crate::db::lease_until(backend, ITEM_LEASE),
        )
        .col_expr(
            jobs::Column::StartedAt,
            Func::coalesce([Expr::col(jobs::Column::StartedAt), Expr::value(now)]).into(),
        )
        .col_expr(jobs::Column::UpdatedAt, Expr::value(now))
        .filter(jobs::Column::Id.is_in(ids))
        .filter(jobs::Column::Status.eq(JobStatus::Queued))
        .exec_with_returning(&transaction)
        .await?;
    let claims: Vec<Claim> = claimed
        .into_iter()
        .map(|job| Claim {
            job,
            run_token: row_id,
            tenant_rate: Default::default(),
        })
        .collect();
    let inputs: HashMap<Uuid, JobInput> = chosen
        .into_iter()
        .map(|(job, input)| (job.id, input))
        .collect();
    let (runnable, broken): (Vec<&Claim>, Vec<&Claim>) = claims
        .iter()
        .partition(|claim| inputs.contains_key(&claim.job.id));
    // Each item is billed at the batch price in force and charged at the one it was
    // held at (the batch view of each, so the price a batch line is judged at).
    let mut held = HashMap::new();
    let mut item_prices: HashMap<Uuid, ModelPrice> = HashMap::with_capacity(runnable.len());
    for claim in &runnable {
        let charged = prices::attempt_price(&transaction, &claim.job, price.clone(), &mut held)
            .await?
            .batch_view()
            .expect("the version in force has a batch price, which the held one keeps");
        item_prices.insert(claim.job.id, charged);
    }
    let starts: Vec<AttemptStart> = runnable
        .iter()
        .map(|claim| {
            let price = &item_prices[&claim.job.id];
            let bound = inputs[&claim.job.id]
                .call_bound(
                    crate::jobs::tokens::counting_for(&submitter.providers, &claim.job.model),
                    &claim.job.model,
                )
                .within(claim.job.token_bound);
            AttemptStart {
                worker_id: submitter.worker_id.clone(),
                provider: Some(provider.name().to_owned()),
                provider_cost_bound: bound.provider_cost(price),
                customer_charge_bound: bound.customer_cost(price),
                customer_charge_if_lost: submitter.charging.customer_charge(
                    price,
                    bound,
                    AttemptEnding::Unknown,
                    None,
                ),
                price: price.clone(),
            }
        })
        .collect();
    let pairs: Vec<(&Claim, &AttemptStart)> = runnable.iter().copied().zip(starts.iter()).collect();
    let started = queue::start_attempts_in(&transaction, &pairs).await?;
    let mut going: Vec<(&Claim, StartedAttempt)> = Vec::new();
    let mut held_back: Vec<(&Claim, StartedAttempt)> = Vec::new();
    for (claim, started) in runnable.iter().copied().zip(started) {
        let Some(started) = started else { continue };
        if started.cancel_requested || started.budget_refusal.is_some() {
            held_back.push((claim, started));
        } else {
            going.push((claim, started));
        }
    }
    if !going.is_empty() {
        let bound: i64 = going
            .iter()
            .filter_map(|(_, started)| started.attempt.provider_cost_upper_bound_nanos)
            .sum();
        provider_batches::Entity::insert(provider_batches::ActiveModel {
            id: Set(row_id),
            batch_id: Set(batch.id),
            tenant_id: Set(batch.tenant_id),
            provider: Set(provider.name().to_owned()),
            model: Set(batch.model.clone()),
            state: Set(ProviderBatchState::Preparing),
            provider_batch_id: Set(None),
            input_file_id: Set(None),
            item_count: Set(going.len() as i64),
            cost_bound_nanos: Set(bound),
            // Free and due at once: the upload is the row's first step, in a task of
            // its own (`steps::start_due_rows`), in this process or another.
            run_token: Set(None),
            lease_until: Set(None),
            next_poll_at: Set(now),
            polls: Set(0),
            cancel_sent: Set(false),
            last_read_at: Set(now),
            last_error: Set(None),
            created_at: Set(now),
            uploading_at: Set(None),
            submitted_at: Set(None),
            ended_at: Set(None),
            attributed: Set(true),
            ruled_out: Set(None),
            sent_at: Set(None),
            upload_requests: Set(None),
            exclusive_upload: Set(!api.finds_by_our_id()),
        })
        .exec_without_returning(&transaction)
        .await?;
        attempts::Entity::update_many()
            .col_expr(attempts::Column::ProviderBatchId, Expr::value(row_id))
            .filter(attempts::Column::Id.is_in(going.iter().map(|(_, started)| started.attempt.id)))
            .exec(&transaction)
            .await?;
    }
    transaction.commit().await?;
    let count = claims.len();
    submitter.bus.publish(
        going
            .iter()
            .chain(held_back.iter())
            .map(|(_, started)| started.notice.clone()),
    );
    tracing::info!(batch.id = %batch.id, provider_batch.id = %row_id, provider = provider.name(), items = going.len(), "provider batch prepared");
    for claim in broken {
        let error = JobError::new(
            JobErrorCode::NotRunnable,
            "the item's stored input cannot be read",
        );
        if let Some(notice) = abandon_claim(&submitter.db, claim, &error).await? {
            submitter.bus.publish([notice]);
        }
    }
    settle::held_back(submitter, &item_prices, &inputs, held_back).await?;
    Ok(count)
}

/// The candidates that fit one provider batch, in order: at most the provider's
/// requests, in at most `max_bytes` (each request measured as it will be uploaded,
/// with a custom id of the length it will have), and always the first; and the
/// items whose stored input cannot be read, which are claimed only to be ended.
fn within_limits(
    api: &dyn BatchApi,
    max_bytes: usize,
    candidates: Vec<jobs::Model>,
) -> (Vec<(jobs::Model, JobInput)>, Vec<jobs::Model>) {
    let limits = api.limits();
    let mut chosen = Vec::with_capacity(candidates.len());
    let mut unreadable = Vec::new();
    let mut bytes = 0;
    for job in candidates {
        let Ok(input) = serde_json::from_value::<JobInput>(job.input.0.clone()) else {
            unreadable.push(job);
            continue;
        };
        let item = BatchItem {
            custom_id: custom_id(Uuid::nil()),
            request: chat_request(&job, &input),
        };
        // The line's newline, or the array's comma.
        let size = api.encode(&item).len() + 1;
        if chosen.len() >= limits.requests || (!chosen.is_empty() && bytes + size > max_bytes) {
            break;
        }
        bytes += size;
        chosen.push((job, input));
    }
    (chosen, unreadable)
}
