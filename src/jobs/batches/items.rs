//! Adding items to a batch: a chunk of up to 1,000 in one transaction, written with
//! set-based statements — every item's job, hold, ledger entry and `CREATED` event in
//! one statement each, one conditional update of the tenant's balance and one of its
//! spend counters for the whole chunk — all or nothing.
//!
//! An item's `customId` is unique within its batch: a chunk sent again adds nothing
//! for the items already there with the same input (they count as replayed), and an
//! item there with another input makes the whole call a conflict.

use super::BatchSettings;
use crate::billing::alerts;
use crate::billing::batch_totals::BatchTotals;
use crate::billing::{ChargingPolicy, ledger, limits, prices};
use crate::bus::EventBus;
use crate::db::bulk::{self, OnConflict};
use crate::db::{WriteTransaction, begin_write};
use crate::error::ServiceError;
use crate::jobs::events;
use crate::jobs::input::{
    Deadline, IdempotencyKey, JobInput, MessageRequest, NewJob, Priority, check_json,
    parse_max_output_tokens, parse_messages,
};
use crate::jobs::labels::Labels;
use crate::jobs::measuring::Measuring;
use crate::jobs::parts::check_model_takes;
use crate::llm::ProviderRegistry;
use crate::llm::parts::pdf::InflateBudget;
use entity::{BatchMode, BatchStatus, EventKind, JobStatus, JsonText, Timestamp, batches, jobs};
use sea_orm::sea_query::{Expr, ExprTrait};
use sea_orm::{
    ColumnTrait, ConnectionTrait, DatabaseConnection, DbBackend, EntityTrait, IntoActiveModel,
    QueryFilter, QuerySelect, Statement,
};
use serde_json::Value;
use sha2::{Digest, Sha256};
use std::collections::{HashMap, HashSet};
use std::time::Duration;
use uuid::Uuid;

/// Most items one call adds.
pub const MAX_ITEMS_PER_CALL: usize = 1_000;
/// Longest `customId`, in characters.
const MAX_CUSTOM_ID_LENGTH: usize = 200;
/// How often a chunk is tried again after a concurrent chunk took one of its custom
/// ids first (the next try finds that item and compares it).
const RACE_RETRIES: u32 = 3;

/// An item as the API receives it, before any check.
#[derive(Clone, Debug)]
pub struct ItemRequest {
    pub custom_id: String,
    pub messages: Vec<MessageRequest>,
    pub max_output_tokens: Option<i32>,
    pub metadata: Option<Value>,
}

/// What a call added.
#[derive(Clone, Debug)]
pub struct AddedItems {
    pub added: usize,
    pub replayed: usize,
    pub batch: batches::Model,
}

/// An item that passed every check, as the job it becomes.
struct Item {
    custom_id: String,
    job: NewJob,
    fingerprint: String,
}

/// What the operator's configuration gives every item, and where their documents
/// are measured.
#[derive(Clone, Debug)]
pub struct ItemRules {
    /// The deadline of an item whose batch names none, counted from when it is added.
    pub default_deadline: Duration,
    /// What a failed call may charge, which sizes each item's hold.
    pub charging: ChargingPolicy,
    pub measuring: Measuring,
}

/// Adds `requests` to an OPEN batch of the tenant, all or nothing (see the module).
pub async fn add_items(
    db: &DatabaseConnection,
    bus: &EventBus,
    providers: &ProviderRegistry,
    tenant_id: Uuid,
    batch_id: Uuid,
    requests: Vec<ItemRequest>,
    rules: ItemRules,
) -> Result<AddedItems, ServiceError> {
    let ItemRules {
        default_deadline,
        charging,
        measuring,
    } = rules;
    if requests.is_empty() || requests.len() > MAX_ITEMS_PER_CALL {
        return Err(ServiceError::validation(format!(
            "items must hold 1 to {MAX_ITEMS_PER_CALL} items"
        )));
    }
    let batch = super::find_batch(db, tenant_id, batch_id).await?;
    if batch.status != BatchStatus::Open {
        return Err(not_open());
    }
    let settings: BatchSettings = serde_json::from_value(batch.settings.0.clone())
        .map_err(|error| sea_orm::DbErr::Custom(format!("batch settings: {error}")))?;
    // Items added after it would only fail there: the client learns it now.
    if settings
        .deadline
        .is_some_and(|deadline| deadline <= Timestamp::now())
    {
        return Err(ServiceError::validation(
            "the batch's deadline has passed: it takes no more items",
        ));
    }
    let deadline = settings
        .deadline
        .map_or(Deadline::After(default_deadline), Deadline::At);
    let documents = requests
        .iter()
        .any(|request| MessageRequest::any_document(&request.messages));
    let (items, repeated) = {
        let (batch, settings) = (batch.clone(), settings.clone());
        measuring
            .run(documents, move || {
                parse_items(&batch, &settings, deadline, requests, charging)
            })
            .await?
    };
    let mut tries = 0;
    loop {
        tries += 1;
        match write_chunk(db, bus, providers, &batch, &items).await {
            Ok(Chunk::Written(added)) => {
                return Ok(AddedItems {
                    replayed: added.replayed + repeated,
                    ..*added
                });
            }
            Ok(Chunk::Closed) => return Err(not_open()),
            // A concurrent chunk took a custom id first, or PostgreSQL broke a lock
            // cycle between two chunks: the next try reads what they wrote.
            Ok(Chunk::Raced) if tries < RACE_RETRIES => continue,
            Err(ServiceError::Database(error))
                if tries < RACE_RETRIES && crate::db::is_transient(&error) =>
            {
                continue;
            }
            Ok(Chunk::Raced) => return Err(ServiceError::IdempotencyConflict),
            Err(error) => return Err(error),
        }
    }
}

/// Adds `rerun`, a rerun of the item `original_custom_id`, to its OPEN batch, as an
/// item named by [`rerun_custom_id`]: it runs, counts and is
/// charged with the batch, and the batch finishes only after it. `None` when the batch
/// no longer takes items (closed, cancelled, or past its deadline), or when an item the
/// client added took the name: the rerun is then a job of its own. The rerun keeps the client's own key, so it replays and conflicts
/// as every rerun does.
pub async fn add_rerun(
    db: &DatabaseConnection,
    bus: &EventBus,
    providers: &ProviderRegistry,
    batch: &batches::Model,
    original_custom_id: &str,
    mut rerun: NewJob,
) -> Result<Option<AddedItems>, ServiceError> {
    if batch.status != BatchStatus::Open {
        return Ok(None);
    }
    let settings: BatchSettings = serde_json::from_value(batch.settings.0.clone())
        .map_err(|error| sea_orm::DbErr::Custom(format!("batch settings: {error}")))?;
    if let Some(deadline) = settings.deadline {
        if deadline <= Timestamp::now() {
            return Ok(None);
        }
        // An item of the batch ends by the batch's deadline, as every other does.
        rerun.deadline = Deadline::At(deadline);
    }
    let custom_id = rerun_custom_id(original_custom_id, rerun.idempotency_key.as_str());
    let fingerprint = rerun.fingerprint();
    let items = [Item {
        custom_id,
        job: rerun,
        fingerprint,
    }];
    for tries in 1..=RACE_RETRIES {
        match write_chunk(db, bus, providers, batch, &items).await {
            Ok(Chunk::Written(added)) => return Ok(Some(*added)),
            Ok(Chunk::Closed) => return Ok(None),
            Ok(Chunk::Raced) => continue,
            // An item the client added holds the name with another input: the rerun
            // is a job of its own.
            Err(ServiceError::IdempotencyConflict) => return Ok(None),
            Err(ServiceError::Database(error))
                if tries < RACE_RETRIES && crate::db::is_transient(&error) =>
            {
                continue;
            }
            Err(error) => return Err(error),
        }
    }
    // The rerun's key names another job (the caller checked it was free just before).
    Err(ServiceError::IdempotencyConflict)
}

/// The name of a rerun in its batch: the original's (cut to leave room) and a digest of
/// the rerun's key, within [`MAX_CUSTOM_ID_LENGTH`] however long the key is.
fn rerun_custom_id(original_custom_id: &str, key: &str) -> String {
    const SUFFIX_LENGTH: usize = "/rerun/".len() + 16;
    let kept: String = original_custom_id
        .chars()
        .take(MAX_CUSTOM_ID_LENGTH - SUFFIX_LENGTH)
        .collect();
    let digest = hex::encode(&Sha256::digest(key.as_bytes())[..8]);
    format!("{kept}/rerun/{digest}")
}

/// How one try at writing a chunk ended.
enum Chunk {
    Written(Box<AddedItems>),
    /// A concurrent chunk took one of its custom ids between the read and the insert:
    /// nothing was written.
    Raced,
    /// A close, cancel or deadline won the batch's row: nothing was written.
    Closed,
}

fn not_open() -> ServiceError {
    ServiceError::validation("the batch is no longer OPEN: it takes no more items")
}

/// Checks every item; one broken rule refuses the call, naming the item. An item
/// repeated within the call with the same input is added once; the answer counts its
/// repetitions, which are replayed.
fn parse_items(
    batch: &batches::Model,
    settings: &BatchSettings,
    deadline: Deadline,
    requests: Vec<ItemRequest>,
    charging: ChargingPolicy,
) -> Result<(Vec<Item>, usize), ServiceError> {
    let priority = Priority::parse(settings.priority)?;
    let mut seen: HashMap<String, String> = HashMap::with_capacity(requests.len());
    let mut items = Vec::with_capacity(requests.len());
    let mut repeated = 0;
    // The call is the request: all its items' documents share one inflate budget.
    let mut inflate = InflateBudget::default();
    for (index, request) in requests.into_iter().enumerate() {
        let at = |error: ServiceError| match error {
            ServiceError::Validation(message) => {
                ServiceError::validation(format!("items[{index}]: {message}"))
            }
            other => other,
        };
        let length = request.custom_id.chars().count();
        if length == 0 || length > MAX_CUSTOM_ID_LENGTH {
            return Err(at(ServiceError::validation(format!(
                "customId must be 1 to {MAX_CUSTOM_ID_LENGTH} characters"
            ))));
        }
        crate::validation::single_line("customId", &request.custom_id).map_err(at)?;
        let messages = parse_messages(request.messages, &mut inflate).map_err(at)?;
        check_model_takes(
            &batch.model,
            messages.iter().flat_map(|message| &message.parts),
        )
        .map_err(at)?;
        let max_output_tokens = match request.max_output_tokens {
            Some(tokens) => parse_max_output_tokens(tokens).map_err(at)?,
            None => settings.max_output_tokens,
        };
        if let Some(metadata) = &request.metadata {
            check_json("metadata", metadata).map_err(at)?;
        }
        // The job's own key: unique per tenant as every job's, and telling whose item
        // it is.
        let idempotency_key = IdempotencyKey::of_item(batch.id, &request.custom_id);
        let job = NewJob {
            idempotency_key,
            model: batch.model.clone(),
            input: JobInput {
                messages,
                max_output_tokens,
                response_schema: settings.response_schema.clone(),
                metadata: request.metadata,
                stream_output: false,
                parameters: settings.parameters.clone(),
                tools: settings.tools.clone(),
            },
            max_attempts: settings.max_attempts,
            retry_unknown_outcome: true,
            priority,
            run_at: None,
            deadline,
            // Items take no labels (the contract's item input has none).
            labels: Labels::default(),
            rerun_of: None,
            // Items take no fallbacks: a batch is one model.
            fallback_models: Vec::new(),
            charging,
        };
        let fingerprint = job.fingerprint();
        match seen.get(&request.custom_id) {
            Some(earlier) if *earlier == fingerprint => {
                repeated += 1;
                continue;
            }
            Some(_) => return Err(ServiceError::IdempotencyConflict),
            None => {
                seen.insert(request.custom_id.clone(), fingerprint.clone());
            }
        }
        items.push(Item {
            custom_id: request.custom_id,
            job,
            fingerprint,
        });
    }
    Ok((items, repeated))
}

/// One try at writing the chunk.
async fn write_chunk(
    db: &DatabaseConnection,
    bus: &EventBus,
    providers: &ProviderRegistry,
    batch: &batches::Model,
    items: &[Item],
) -> Result<Chunk, ServiceError> {
    let tenant_id = batch.tenant_id;
    let now = Timestamp::now();
    let price = prices::price_at(db, &batch.model, now)
        .await?
        .ok_or_else(|| {
            ServiceError::validation(format!(
                "model {:?} has no price and cannot be run",
                batch.model
            ))
        })?;
    // A PROVIDER_BATCH item is held, charged and billed at the batch price.
    let price = match batch.mode {
        BatchMode::Realtime => price,
        BatchMode::ProviderBatch => price.batch_view().ok_or_else(|| {
            ServiceError::validation(format!(
                "model {:?} has no batch price any more: PROVIDER_BATCH cannot run it",
                batch.model
            ))
        })?,
    };
    // Before anything is held: an item the model cannot run would fail every attempt.
    let counting = crate::jobs::tokens::counting_for(providers, &batch.model);
    for item in items {
        let bound = item.job.input.call_bound(counting, &batch.model);
        price
            .limits
            .check_call(&batch.model, bound)
            .map_err(|refusal| {
                ServiceError::validation(format!("item {:?}: {refusal}", item.custom_id))
            })?;
    }
    let transaction = begin_write(db).await?;
    let custom_ids: Vec<&str> = items.iter().map(|item| item.custom_id.as_str()).collect();
    let existing = existing_items(&transaction, batch.id, &custom_ids).await?;
    let mut replayed = items.len();
    let mut fresh = Vec::with_capacity(items.len());
    for item in items {
        match existing.get(&item.custom_id) {
            Some(hash) if *hash == item.fingerprint => {}
            Some(_) => {
                transaction.rollback().await?;
                return Err(ServiceError::IdempotencyConflict);
            }
            None => {
                replayed -= 1;
                fresh.push(item);
            }
        }
    }
    if fresh.is_empty() {
        return nothing_added(db, transaction, batch, replayed).await;
    }
    let simulated = providers.simulates(&batch.model);
    // Every item is held at this version (its batch view, for a PROVIDER_BATCH), and
    // its attempts charge at it, as a job's do at the version it was quoted at.
    let mut held = prices::HeldPrices::default();
    held.hold(&price);
    let held = held.to_column();
    let mut rows = Vec::with_capacity(fresh.len());
    for item in &fresh {
        let bound = item.job.input.call_bound(counting, &batch.model);
        let row = job_row(batch, item, simulated, bound.tokens(), &held, now);
        let hold = item.job.charging.job_hold(
            bound,
            &price,
            item.job.max_attempts,
            item.job.input.stream_output,
        );
        rows.push((row, item, hold));
    }
    // Ids follow the items' order (the order they were added); the rows are inserted
    // in custom-id order, so two chunks that overlap take the unique index's entries in
    // one order and never wait on each other in a cycle.
    let mut by_custom_id: Vec<&jobs::Model> = rows.iter().map(|(row, _, _)| row).collect();
    by_custom_id.sort_by(|a, b| a.custom_id.cmp(&b.custom_id));
    let inserted: HashSet<Uuid> = bulk::insert(
        &transaction,
        by_custom_id
            .into_iter()
            .cloned()
            .map(IntoActiveModel::into_active_model)
            .collect(),
        OnConflict::Skip,
    )
    .await?
    .into_iter()
    .collect();
    if inserted.len() != rows.len() {
        // Items a concurrent chunk took between the read and the insert. The insert
        // waited for that chunk's commit before it skipped them (PostgreSQL; SQLite
        // writes one chunk at a time and never gets here), so a read now sees them:
        // taken with the same input they are replayed, as if read at first, and the
        // chunk goes on with the rest. Starting over instead lost again and again
        // when many clients sent overlapping chunks at once.
        let (taken, kept): (Vec<_>, Vec<_>) = rows
            .into_iter()
            .partition(|(row, _, _)| !inserted.contains(&row.id));
        let taken_ids: Vec<&str> = taken
            .iter()
            .map(|(_, item, _)| item.custom_id.as_str())
            .collect();
        let stored = existing_items(&transaction, batch.id, &taken_ids).await?;
        for (_, item, _) in &taken {
            match stored.get(&item.custom_id) {
                Some(hash) if *hash == item.fingerprint => replayed += 1,
                Some(_) => {
                    transaction.rollback().await?;
                    return Err(ServiceError::IdempotencyConflict);
                }
                // Skipped for another reason: try the chunk again from the start.
                None => {
                    transaction.rollback().await?;
                    return Ok(Chunk::Raced);
                }
            }
        }
        rows = kept;
        if rows.is_empty() {
            return nothing_added(db, transaction, batch, replayed).await;
        }
    }
    let added = rows.len();
    let holds: Vec<_> = rows.iter().map(|(row, _, hold)| (row.id, *hold)).collect();
    let rows: Vec<jobs::Model> = rows.into_iter().map(|(row, _, _)| row).collect();
    let notices = events::append_many(
        &transaction,
        rows.iter().map(|job| (job, EventKind::Created, None)),
    )
    .await?;
    // Last: the hold locks the tenant's row, which every create of the tenant needs.
    let total = match ledger::hold_many(&transaction, tenant_id, &holds).await {
        Ok(total) => total,
        Err(refusal) => {
            transaction.rollback().await?;
            return Err(refusal);
        }
    };
    let counted_at = match limits::admit_spend(&transaction, tenant_id, total, now).await {
        Ok(counted_at) => counted_at,
        Err(refusal) => {
            transaction.rollback().await?;
            crate::jobs::service::report_spend_limit(db, tenant_id, &refusal, now).await?;
            return Err(refusal);
        }
    };
    // This process's clock is behind the one that started the tenant's current day:
    // the items are dated into that day, which counted their holds.
    if counted_at != now {
        jobs::Entity::update_many()
            .col_expr(jobs::Column::CreatedAt, Expr::value(counted_at))
            .filter(jobs::Column::Id.is_in(inserted.iter().copied()))
            .exec(&transaction)
            .await?;
    }
    alerts::after_balance_fell(&transaction, tenant_id, total).await?;
    // The batch row last, after the tenant's, as every writer of both: it takes the
    // items only while OPEN, so a close or cancel that won the row refuses the chunk.
    let counted = batches::Entity::update_many()
        .col_expr(
            batches::Column::ItemCount,
            Expr::col(batches::Column::ItemCount).add(added as i64),
        )
        .col_expr(batches::Column::UpdatedAt, Expr::value(now))
        .filter(batches::Column::Id.eq(batch.id))
        .filter(batches::Column::Status.eq(BatchStatus::Open))
        .exec(&transaction)
        .await?;
    if counted.rows_affected != 1 {
        transaction.rollback().await?;
        return Ok(Chunk::Closed);
    }
    let mut totals = BatchTotals::default();
    totals.held(batch.id, total);
    totals.apply(&transaction).await?;
    let batch = super::find_batch(&transaction, tenant_id, batch.id).await?;
    transaction.commit().await?;
    tracing::info!(batch.id = %batch.id, tenant.id = %tenant_id, added, replayed, hold = %total, "batch items added");
    bus.publish(notices);
    Ok(Chunk::Written(Box::new(AddedItems {
        added,
        replayed,
        batch,
    })))
}

/// The answer to a chunk whose items were all there already: nothing is written, and
/// the batch is read afresh for the answer.
async fn nothing_added(
    db: &DatabaseConnection,
    transaction: WriteTransaction,
    batch: &batches::Model,
    replayed: usize,
) -> Result<Chunk, ServiceError> {
    transaction.rollback().await?;
    let batch = super::find_batch(db, batch.tenant_id, batch.id).await?;
    Ok(Chunk::Written(Box::new(AddedItems {
        added: 0,
        replayed,
        batch,
    })))
}

/// The request hashes of the items of the batch among `items`, by custom id.
///
/// On PostgreSQL one probe of the unique index per custom id, whatever the batch's
/// size: the ids travel as one array and each is looked up in a LATERAL subquery
/// (its LIMIT keeps the planner from turning it into a join). Written as
/// `custom_id = ANY($2)` the array stayed a parameter, which PostgreSQL cannot hash:
/// the plan read every item of the batch and compared each with all 1,000 ids (1.7 s
/// a chunk at 18,000 items); as a join, the custom plans hashed every item of the
/// batch (12 ms at 20,000, growing with it); as a list of 1,000 placeholders, the
/// generic plan walked the batch (32 s at 144,000). SQLite plans each statement
/// afresh and probes its index for each value of the list.
async fn existing_items(
    transaction: &impl ConnectionTrait,
    batch_id: Uuid,
    custom_ids: &[&str],
) -> Result<HashMap<String, String>, sea_orm::DbErr> {
    let backend = transaction.get_database_backend();
    let rows: Vec<(Option<String>, String)> = if backend == DbBackend::Postgres {
        let statement = Statement::from_sql_and_values(
            DbBackend::Postgres,
            "SELECT wanted.custom_id, found.request_hash \
             FROM unnest($2::text[]) AS wanted(custom_id) \
             CROSS JOIN LATERAL ( \
                 SELECT request_hash FROM jobs \
                 WHERE jobs.batch_id = $1 AND jobs.custom_id = wanted.custom_id \
                 LIMIT 1 \
             ) AS found",
            [
                batch_id.into(),
                bulk::text_array(custom_ids.iter().copied()).into(),
            ],
        );
        let mut rows = Vec::with_capacity(custom_ids.len());
        for row in transaction.query_all_raw(statement).await? {
            rows.push((
                row.try_get("", "custom_id")?,
                row.try_get("", "request_hash")?,
            ));
        }
        rows
    } else {
        let mut rows = Vec::with_capacity(custom_ids.len());
        for some in custom_ids.chunks(bulk::SQLITE_MAX_PLACEHOLDERS - 1) {
            rows.extend(
                jobs::Entity::find()
                    .select_only()
                    .column(jobs::Column::CustomId)
                    .column(jobs::Column::RequestHash)
                    .filter(jobs::Column::BatchId.eq(batch_id))
                    .filter(jobs::Column::CustomId.is_in(some.iter().copied()))
                    .into_tuple::<(Option<String>, String)>()
                    .all(transaction)
                    .await?,
            );
        }
        rows
    };
    Ok(rows
        .into_iter()
        .filter_map(|(custom_id, hash)| Some((custom_id?, hash)))
        .collect())
}

/// The job an item becomes.
fn job_row(
    batch: &batches::Model,
    item: &Item,
    simulated: bool,
    token_bound: i64,
    held_prices: &JsonText,
    now: Timestamp,
) -> jobs::Model {
    jobs::Model {
        id: Uuid::now_v7(),
        tenant_id: batch.tenant_id,
        idempotency_key: item.job.idempotency_key.as_str().to_owned(),
        request_hash: item.fingerprint.clone(),
        status: JobStatus::Queued,
        cancel_requested: false,
        model: batch.model.clone(),
        input: JsonText(serde_json::to_value(&item.job.input).expect("job input serializes")),
        retry_unknown_outcome: item.job.retry_unknown_outcome,
        result: None,
        error_code: None,
        error_message: None,
        attempt_count: 0,
        max_attempts: item.job.max_attempts as i32,
        run_token: None,
        lease_until: None,
        next_run_at: now,
        priority: item.job.priority.value(),
        run_at: None,
        simulated,
        token_bound: Some(token_bound),
        last_event_seq: 1,
        created_at: now,
        updated_at: now,
        started_at: None,
        finished_at: None,
        payloads_pruned_at: None,
        batch_id: Some(batch.id),
        custom_id: Some(item.custom_id.clone()),
        rerun_of: item.job.rerun_of,
        deadline: Some(item.job.deadline.instant(now)),
        model_chain: None,
        held_prices: Some(held_prices.clone()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_reruns_name_stays_within_the_custom_id_limit_and_tells_keys_apart() {
        let long = "d".repeat(MAX_CUSTOM_ID_LENGTH);
        let name = rerun_custom_id(&long, &"k".repeat(255));
        assert_eq!(name.chars().count(), MAX_CUSTOM_ID_LENGTH);
        assert!(name.contains("/rerun/"));
        assert_ne!(rerun_custom_id("doc-1", "a"), rerun_custom_id("doc-1", "b"));
        assert!(rerun_custom_id("doc-1", "a").starts_with("doc-1/rerun/"));
        let multibyte = "é".repeat(MAX_CUSTOM_ID_LENGTH);
        assert!(rerun_custom_id(&multibyte, "a").chars().count() <= MAX_CUSTOM_ID_LENGTH);
    }
}
