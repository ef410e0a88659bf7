//! Batches: one handle for many jobs of one model — a customer's 200,000 documents.
//!
//! A batch is created with the settings its items share, takes items in chunks
//! ([`items`]), each chunk one transaction of set-based statements, and runs each item
//! as an ordinary job. Its counts and money live on its row and are moved by the same
//! transactions that move its items ([`crate::billing::batch_totals`]), so reading a batch is one row at
//! any size. Closing it says no more items come; it is FINISHED once every item has
//! finished. Cancelling closes it and cancels its unfinished items in bulk ([`cancel`]).

pub mod cancel;
pub mod items;
pub mod provider_view;
pub mod results;
pub mod updates;

use super::input::{
    self, IdempotencyKey, Priority, check_json, check_response_schema, parse_max_attempts,
    parse_max_output_tokens, parse_model,
};
use crate::billing::Credits;
use crate::billing::batch_totals::BatchTotals;
use crate::db::begin_write;
use crate::error::ServiceError;
use crate::jobs::parameters::{ParameterRequest, parse_parameters};
use crate::jobs::tools::{ToolRequest, parse_tools};
use crate::llm::{Parameters, ProviderRegistry, Tools};
use crate::page::{Page, PageRequest};
use entity::{BatchMode, BatchStatus, JobStatus, JsonText, Timestamp, batches, jobs};
use sea_orm::sea_query::{Expr, Func, OnConflict};
use sea_orm::{
    ActiveValue::Set, ColumnTrait, ConnectionTrait, DatabaseConnection, EntityTrait,
    PaginatorTrait, QueryFilter, QueryOrder, QuerySelect,
};
use serde::{Deserialize, Serialize};
use serde_json::Value;
use uuid::Uuid;

/// Longest batch name, in characters.
const MAX_NAME_LENGTH: usize = 200;

/// A createBatch request as the API receives it, before any check.
#[derive(Clone, Debug)]
pub struct BatchRequest {
    pub idempotency_key: String,
    pub name: Option<String>,
    pub mode: BatchMode,
    pub model: String,
    pub max_output_tokens: i32,
    pub response_schema: Option<Value>,
    pub max_attempts: Option<i32>,
    pub priority: Option<i32>,
    pub deadline: Option<Timestamp>,
    pub metadata: Option<Value>,
    /// `tools` and `toolChoice`, offered by every item.
    pub tools: ToolRequest,
}

/// The job settings every item of a batch shares, as stored on its row.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct BatchSettings {
    /// The items' `maxOutputTokens` when an item does not say.
    pub max_output_tokens: u32,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub response_schema: Option<Value>,
    pub max_attempts: u32,
    pub priority: i32,
    /// The deadline every item shares, when the client named one; else each item has
    /// the configured default, counted from when it was added.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub deadline: Option<Timestamp>,
    /// The batch's own metadata (each item has its own too).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub metadata: Option<Value>,
    /// The functions every item's model may call; absent when none are offered, so
    /// that batches created before tools existed keep their fingerprints.
    #[serde(default, skip_serializing_if = "Tools::is_empty")]
    pub tools: Tools,
    /// Sent with every call of every item; absent when none were given, as for tools.
    #[serde(default, skip_serializing_if = "Parameters::is_empty")]
    pub parameters: Parameters,
}

/// A createBatch request that passed every check.
#[derive(Clone, Debug, PartialEq)]
pub struct NewBatch {
    pub idempotency_key: IdempotencyKey,
    pub name: Option<String>,
    pub mode: BatchMode,
    pub model: String,
    pub settings: BatchSettings,
}

impl NewBatch {
    /// Checks every rule and returns the first broken one as a `Validation` error.
    pub fn parse(request: BatchRequest) -> Result<Self, ServiceError> {
        let idempotency_key = IdempotencyKey::parse(request.idempotency_key)?;
        if let Some(name) = &request.name {
            if name.chars().count() > MAX_NAME_LENGTH {
                return Err(ServiceError::validation(format!(
                    "name must be at most {MAX_NAME_LENGTH} characters"
                )));
            }
            crate::validation::free_text("name", name)?;
        }
        let model = parse_model(request.model)?;
        let max_output_tokens = parse_max_output_tokens(request.max_output_tokens)?;
        let max_attempts = parse_max_attempts(request.max_attempts)?;
        if let Some(schema) = &request.response_schema {
            check_response_schema(schema)?;
        }
        if let Some(metadata) = &request.metadata {
            check_json("metadata", metadata)?;
        }
        let priority = request
            .priority
            .map_or(Ok(Priority::DEFAULT), Priority::parse)?;
        let tools = parse_tools(request.tools)?;
        if let Some(deadline) = request.deadline {
            input::parse_deadline(deadline, None)?;
        }
        Ok(Self {
            idempotency_key,
            name: request.name,
            mode: request.mode,
            model,
            settings: BatchSettings {
                max_output_tokens,
                response_schema: request.response_schema,
                max_attempts,
                priority: priority.value(),
                deadline: request.deadline,
                metadata: request.metadata,
                tools,
                parameters: Parameters::default(),
            },
        })
    }

    /// The batch with `temperature`, `topP`, `stop`, `seed` and `providerOptions` for
    /// every call of every item, checked as a job's; part of the fingerprint like
    /// every setting.
    pub fn with_parameters(mut self, request: ParameterRequest) -> Result<Self, ServiceError> {
        self.settings.parameters = parse_parameters(request)?;
        Ok(self)
    }

    /// SHA-256 of everything the request asks for: two requests with one idempotency
    /// key are the same request exactly when this matches.
    fn fingerprint(&self) -> String {
        let request = serde_json::json!({
            "name": self.name,
            "mode": self.mode,
            "model": self.model,
            "settings": self.settings,
        });
        input::fingerprint_of(&request)
    }
}

/// The answer to a createBatch: the batch, and whether it existed before.
#[derive(Clone, Debug)]
pub struct CreatedBatch {
    pub batch: batches::Model,
    pub replayed: bool,
}

/// Creates an OPEN batch — or, when the tenant used this idempotency key before with
/// the same request, returns that batch (another request: `IDEMPOTENCY_CONFLICT`).
pub async fn create_batch(
    db: &DatabaseConnection,
    providers: &ProviderRegistry,
    tenant_id: Uuid,
    new: NewBatch,
) -> Result<CreatedBatch, ServiceError> {
    let Some(provider) = providers.provider_for(&new.model) else {
        return Err(ServiceError::validation(format!(
            "model {:?} is not served: no configured provider routes it",
            new.model
        )));
    };
    // Every item is sent with these parameters: its provider must take them as they
    // are.
    crate::jobs::parameters::check_parameters_for(
        &new.model,
        provider.request_shape(),
        &new.settings.parameters,
    )?;
    let now = Timestamp::now();
    let fingerprint = new.fingerprint();
    // A deadline that has passed refuses only a new batch: a retry finds the first.
    if new
        .settings
        .deadline
        .is_some_and(|deadline| deadline <= now)
    {
        let existing = batches::Entity::find()
            .filter(batches::Column::TenantId.eq(tenant_id))
            .filter(batches::Column::IdempotencyKey.eq(new.idempotency_key.as_str()))
            .one(db)
            .await?;
        return match existing {
            Some(batch) if batch.request_hash == fingerprint => Ok(CreatedBatch {
                batch,
                replayed: true,
            }),
            Some(_) => Err(ServiceError::IdempotencyConflict),
            None => Err(input::past_deadline()),
        };
    }
    let Some(price) = crate::billing::prices::price_at(db, &new.model, now).await? else {
        return Err(ServiceError::validation(format!(
            "model {:?} has no price and cannot be run",
            new.model
        )));
    };
    price
        .limits
        .check_output(&new.model, u64::from(new.settings.max_output_tokens))?;
    if new.mode == BatchMode::ProviderBatch {
        check_provider_batch(providers, &new.model, &price)?;
    }
    let row = batches::ActiveModel {
        id: Set(Uuid::now_v7()),
        tenant_id: Set(tenant_id),
        idempotency_key: Set(new.idempotency_key.as_str().to_owned()),
        request_hash: Set(fingerprint.clone()),
        name: Set(new.name.clone()),
        mode: Set(new.mode),
        status: Set(BatchStatus::Open),
        cancel_requested: Set(false),
        model: Set(new.model.clone()),
        settings: Set(JsonText(
            serde_json::to_value(&new.settings).expect("batch settings serialize"),
        )),
        item_count: Set(0),
        succeeded: Set(0),
        failed: Set(0),
        cancelled: Set(0),
        reserved_nanos: Set(0),
        provider_cost_nanos: Set(0),
        unknown_bound_nanos: Set(0),
        customer_charge_nanos: Set(0),
        created_at: Set(now),
        updated_at: Set(now),
        closed_at: Set(None),
        finished_at: Set(None),
    };
    let transaction = begin_write(db).await?;
    let inserted = batches::Entity::insert(row)
        .on_conflict(
            OnConflict::columns([batches::Column::TenantId, batches::Column::IdempotencyKey])
                .do_nothing()
                .to_owned(),
        )
        .exec_with_returning(&transaction)
        .await;
    match inserted {
        Ok(batch) => {
            transaction.commit().await?;
            tracing::info!(batch.id = %batch.id, tenant.id = %tenant_id, model = %batch.model, "batch created");
            Ok(CreatedBatch {
                batch,
                replayed: false,
            })
        }
        Err(sea_orm::DbErr::RecordNotInserted | sea_orm::DbErr::RecordNotFound(_)) => {
            transaction.rollback().await?;
            let existing = batches::Entity::find()
                .filter(batches::Column::TenantId.eq(tenant_id))
                .filter(batches::Column::IdempotencyKey.eq(new.idempotency_key.as_str()))
                .one(db)
                .await?
                .ok_or(ServiceError::NotFound)?;
            if existing.request_hash == fingerprint {
                Ok(CreatedBatch {
                    batch: existing,
                    replayed: true,
                })
            } else {
                Err(ServiceError::IdempotencyConflict)
            }
        }
        Err(error) => Err(error.into()),
    }
}

/// `Validation` unless `model` can go through its provider's batch API: it needs a
/// batch price in the price map, and a provider whose batch API jobledger submits to.
fn check_provider_batch(
    providers: &ProviderRegistry,
    model: &str,
    price: &crate::billing::ModelPrice,
) -> Result<(), ServiceError> {
    if price.batch.is_none() {
        return Err(ServiceError::validation(format!(
            "model {model:?} has no batch price: PROVIDER_BATCH is for models priced for \
             their provider's batch API (REALTIME runs it)"
        )));
    }
    match providers.provider_for(model) {
        Some(provider) if provider.submits_batches() => Ok(()),
        provider => Err(ServiceError::validation(format!(
            "model {model:?}: provider {:?} has no batch API jobledger submits to, so \
             PROVIDER_BATCH cannot run it (REALTIME can)",
            provider.as_ref().map_or("none", |provider| provider.name())
        ))),
    }
}

/// A tenant's batch; `NotFound` for another tenant's.
pub async fn find_batch(
    db: &impl ConnectionTrait,
    tenant_id: Uuid,
    batch_id: Uuid,
) -> Result<batches::Model, ServiceError> {
    batches::Entity::find_by_id(batch_id)
        .filter(batches::Column::TenantId.eq(tenant_id))
        .one(db)
        .await?
        .ok_or(ServiceError::NotFound)
}

/// A batch as read, with its items counted by status.
#[derive(Clone, Debug)]
pub struct BatchView {
    pub batch: batches::Model,
    pub queued: i64,
    pub running: i64,
}

impl BatchView {
    /// Credit still held by the unfinished items.
    pub fn reserved(&self) -> Credits {
        Credits::from_nanos(self.batch.reserved_nanos)
    }

    /// Σ the items' exact provider costs.
    pub fn provider_cost(&self) -> Credits {
        Credits::from_nanos(self.batch.provider_cost_nanos)
    }

    /// Σ the items' exact costs and the bounds of costs not known.
    pub fn provider_cost_upper_bound(&self) -> Credits {
        Credits::from_nanos(self.batch.provider_cost_nanos)
            + Credits::from_nanos(self.batch.unknown_bound_nanos)
    }

    /// Σ the items' charges.
    pub fn customer_charge(&self) -> Credits {
        Credits::from_nanos(self.batch.customer_charge_nanos)
    }
}

/// A tenant's batch with its items counted by status, in one statement: the row,
/// and an index range over its running items, which are never more than the workers
/// run at once. Queued is what is neither running nor finished. Counting the running
/// ones on the row instead would add a write of the batch row to every claim and every
/// retry, for a number this reads in microseconds. `NotFound` for another tenant's.
pub async fn read(
    db: &impl ConnectionTrait,
    tenant_id: Uuid,
    batch_id: Uuid,
) -> Result<BatchView, ServiceError> {
    let row = batches::Entity::find_by_id(batch_id)
        .filter(batches::Column::TenantId.eq(tenant_id))
        .column_as(running_items(), "running")
        .into_model::<ViewRow>()
        .one(db)
        .await?
        .ok_or(ServiceError::NotFound)?;
    Ok(BatchView::of(row.batch, row.running))
}

/// [`read`] for a batch row already read.
pub async fn view(
    db: &impl ConnectionTrait,
    batch: batches::Model,
) -> Result<BatchView, ServiceError> {
    let running = jobs::Entity::find()
        .filter(jobs::Column::BatchId.eq(batch.id))
        .filter(jobs::Column::Status.eq(entity::JobStatus::Running))
        .count(db)
        .await?;
    Ok(BatchView::of(
        batch,
        i64::try_from(running).unwrap_or(i64::MAX),
    ))
}

/// `COUNT(*)` of the running items of the batch row being read.
fn running_items() -> Expr {
    Expr::cust(format!(
        "(SELECT COUNT(*) FROM jobs WHERE jobs.batch_id = batches.id AND jobs.status = {})",
        JobStatus::Running.sql()
    ))
}

/// A batch row with its running items counted.
#[derive(Debug, sea_orm::FromQueryResult)]
struct ViewRow {
    #[sea_orm(nested)]
    batch: batches::Model,
    running: i64,
}

impl BatchView {
    fn of(batch: batches::Model, running: i64) -> Self {
        let queued =
            (batch.item_count - batch.succeeded - batch.failed - batch.cancelled - running).max(0);
        Self {
            batch,
            queued,
            running,
        }
    }
}

/// A tenant's batches after the cursor `after` (a batch id), newest first.
pub async fn list_batches(
    db: &impl ConnectionTrait,
    tenant_id: Uuid,
    page: PageRequest,
) -> Result<Page<batches::Model>, ServiceError> {
    let mut query = batches::Entity::find().filter(batches::Column::TenantId.eq(tenant_id));
    if let Some(after) = page.after {
        query = query.filter(batches::Column::Id.lt(after));
    }
    let batches = query
        .order_by_desc(batches::Column::Id)
        .limit(page.first + 1)
        .all(db)
        .await?;
    Ok(Page::from_rows(batches, page.first))
}

/// A page of a batch's items, in the order they were added, after the cursor `after`
/// (a job id), of one status if asked; payloads left out as in the jobs list.
pub async fn list_items(
    db: &impl ConnectionTrait,
    batch: &batches::Model,
    page: PageRequest,
    status: Option<entity::JobStatus>,
) -> Result<Page<jobs::Model>, ServiceError> {
    let mut query = super::service::jobs_without_payloads()
        .filter(jobs::Column::BatchId.eq(batch.id))
        .filter(jobs::Column::TenantId.eq(batch.tenant_id));
    if let Some(after) = page.after {
        query = query.filter(jobs::Column::Id.gt(after));
    }
    if let Some(status) = status {
        query = query.filter(jobs::Column::Status.eq(status));
    }
    let items = query
        .order_by_asc(jobs::Column::Id)
        .limit(page.first + 1)
        .all(db)
        .await?;
    Ok(Page::from_rows(items, page.first))
}

/// No more items: the batch is CLOSED, or FINISHED at once when every item it has is
/// finished. Closing a batch that is no longer open changes nothing.
pub async fn close_batch(
    db: &DatabaseConnection,
    tenant_id: Uuid,
    batch_id: Uuid,
) -> Result<batches::Model, ServiceError> {
    let transaction = begin_write(db).await?;
    let closed = close(&transaction, tenant_id, batch_id, false).await?;
    transaction.commit().await?;
    Ok(closed)
}

/// Closes an open batch in the caller's transaction (and marks it cancel-requested
/// when `cancel`), finishing it when nothing of it is left to run; writes the
/// `batch.finished` delivery if it finished.
async fn close(
    transaction: &impl ConnectionTrait,
    tenant_id: Uuid,
    batch_id: Uuid,
    cancel: bool,
) -> Result<batches::Model, ServiceError> {
    let now = Timestamp::now();
    let mut update = batches::Entity::update_many()
        .col_expr(batches::Column::UpdatedAt, Expr::value(now))
        .col_expr(
            batches::Column::ClosedAt,
            Expr::from(Func::coalesce([
                Expr::col(batches::Column::ClosedAt),
                Expr::value(now),
            ])),
        )
        .col_expr(
            batches::Column::Status,
            Expr::cust("CASE WHEN status = 'open' THEN 'closed' ELSE status END"),
        )
        .filter(batches::Column::Id.eq(batch_id))
        .filter(batches::Column::TenantId.eq(tenant_id));
    if cancel {
        update = update.col_expr(batches::Column::CancelRequested, Expr::value(true));
    }
    update.exec(transaction).await?;
    // A batch whose items all finished already finishes now: no item will move it.
    BatchTotals::default()
        .touch(batch_id)
        .apply(transaction)
        .await?;
    find_batch(transaction, tenant_id, batch_id).await
}
