//! Batches: creating them, adding items, closing, cancelling and reading them.

use super::mutation::MessageInput;
use super::types::{Batch, BatchConnection, BatchMode, connect};
use super::{app, principal};
use crate::jobs::batches::items::{self, ItemRequest};
use crate::jobs::batches::{self, BatchRequest, NewBatch, cancel};
use crate::jobs::parameters::ParameterRequest;
use crate::jobs::tools::ToolRequest;
use crate::page::PageRequest;
use async_graphql::{Context, InputObject, Json, Object, SimpleObject};
use chrono::{DateTime, Utc};
use entity::Timestamp;
use uuid::Uuid;

/// A batch to create: the model and the job settings every item shares.
#[derive(InputObject)]
pub struct CreateBatchInput {
    /// The client's unique name for this request: repeating it returns the same batch.
    pub idempotency_key: String,
    pub name: Option<String>,
    /// REALTIME (default) or PROVIDER_BATCH.
    pub mode: Option<BatchMode>,
    pub model: String,
    /// Each item's `maxOutputTokens` when the item does not say.
    pub max_output_tokens: i32,
    /// A JSON Schema every item's reply must satisfy.
    pub response_schema: Option<Json<serde_json::Value>>,
    /// Attempts each item may use (default 3, at most 10).
    pub max_attempts: Option<i32>,
    /// 0 to 9 (default 5), as a job's.
    pub priority: Option<i32>,
    /// Every item fails `DEADLINE_EXCEEDED` if it has not finished by then; without
    /// it each item has the configured default deadline, counted from when it is added.
    /// In the past: VALIDATION. Once passed the batch takes no more items.
    pub deadline: Option<DateTime<Utc>>,
    /// Any JSON the client wants kept with the batch.
    pub metadata: Option<Json<serde_json::Value>>,
    /// Function tools every item's model may call, in OpenAI's shape, as createJob's.
    pub tools: Option<Json<serde_json::Value>>,
    /// Whether and which tool the model must call, as createJob's.
    pub tool_choice: Option<Json<serde_json::Value>>,
    /// Sampling temperature of every item's calls, as createJob's.
    pub temperature: Option<f64>,
    /// Nucleus sampling of every item's calls, as createJob's.
    pub top_p: Option<f64>,
    /// Sequences that end every item's reply, as createJob's.
    pub stop: Option<Vec<String>>,
    /// The seed of every item's calls, as createJob's (dropped for Anthropic).
    pub seed: Option<i32>,
    /// Other fields of every item's provider request body, checked as createJob's.
    pub provider_options: Option<Json<serde_json::Value>>,
}

/// One item: a job of the batch, named by the client.
#[derive(InputObject)]
pub struct BatchItemInput {
    /// Unique within the batch: sending the item again adds nothing.
    pub custom_id: String,
    pub messages: Vec<MessageInput>,
    /// The batch's when not given.
    pub max_output_tokens: Option<i32>,
    pub metadata: Option<Json<serde_json::Value>>,
}

/// The batch, and whether an earlier request with the same key created it.
#[derive(SimpleObject)]
pub struct CreateBatchPayload {
    pub replayed: bool,
    pub batch: Batch,
}

/// What one addBatchItems call did.
#[derive(SimpleObject)]
pub struct AddBatchItemsPayload {
    /// Items added by this call.
    pub added: i32,
    /// Items that were there already with the same input.
    pub replayed: i32,
    pub batch: Batch,
}

/// The changes of batches.
#[derive(Default)]
pub struct BatchMutation;

#[Object]
impl BatchMutation {
    /// Creates an OPEN batch; idempotent by key.
    async fn create_batch(
        &self,
        context: &Context<'_>,
        input: CreateBatchInput,
    ) -> async_graphql::Result<CreateBatchPayload> {
        let tenant_id = principal(context)?.tenant_id()?;
        let new = NewBatch::parse(BatchRequest {
            idempotency_key: input.idempotency_key,
            name: input.name,
            mode: input.mode.unwrap_or(BatchMode::Realtime).into(),
            model: input.model,
            max_output_tokens: input.max_output_tokens,
            response_schema: input.response_schema.map(|json| json.0),
            max_attempts: input.max_attempts,
            priority: input.priority,
            deadline: input.deadline.map(Timestamp::from),
            metadata: input.metadata.map(|json| json.0),
            tools: ToolRequest {
                tools: input.tools.map(|json| json.0),
                tool_choice: input.tool_choice.map(|json| json.0),
            },
        })?
        .with_parameters(ParameterRequest {
            temperature: input.temperature,
            top_p: input.top_p,
            stop: input.stop,
            seed: input.seed.map(i64::from),
            provider_options: input.provider_options.map(|json| json.0),
        })?;
        let app = app(context);
        let created = batches::create_batch(&app.db, &app.providers, tenant_id, new).await?;
        Ok(CreateBatchPayload {
            replayed: created.replayed,
            batch: created.batch.into(),
        })
    }

    /// Adds up to 1,000 items to an OPEN batch, all or nothing; each is queued at once.
    #[graphql(complexity = "child_complexity + 1")]
    async fn add_batch_items(
        &self,
        context: &Context<'_>,
        batch_id: Uuid,
        items: Vec<BatchItemInput>,
    ) -> async_graphql::Result<AddBatchItemsPayload> {
        let tenant_id = principal(context)?.tenant_id()?;
        let requests = items
            .into_iter()
            .map(|item| ItemRequest {
                custom_id: item.custom_id,
                messages: item
                    .messages
                    .into_iter()
                    .map(super::mutation::MessageInput::into_request)
                    .collect(),
                max_output_tokens: item.max_output_tokens,
                metadata: item.metadata.map(|json| json.0),
            })
            .collect();
        let app = app(context);
        let added = items::add_items(
            &app.db,
            &app.bus,
            &app.providers,
            tenant_id,
            batch_id,
            requests,
            items::ItemRules {
                default_deadline: app.default_deadline,
                charging: app.charging,
                measuring: app.measuring.clone(),
            },
        )
        .await?;
        Ok(AddBatchItemsPayload {
            added: i32::try_from(added.added).unwrap_or(i32::MAX),
            replayed: i32::try_from(added.replayed).unwrap_or(i32::MAX),
            batch: added.batch.into(),
        })
    }

    /// No more items: the batch is FINISHED once every item has finished.
    async fn close_batch(&self, context: &Context<'_>, id: Uuid) -> async_graphql::Result<Batch> {
        let tenant_id = principal(context)?.tenant_id()?;
        Ok(batches::close_batch(&app(context).db, tenant_id, id)
            .await?
            .into())
    }

    /// Closes the batch and cancels every item not yet finished, as cancelJob would.
    async fn cancel_batch(&self, context: &Context<'_>, id: Uuid) -> async_graphql::Result<Batch> {
        let tenant_id = principal(context)?.tenant_id()?;
        let app = app(context);
        Ok(
            cancel::cancel_batch(&app.db, &app.bus, &app.metrics, tenant_id, id)
                .await?
                .into(),
        )
    }
}

/// The reads of batches.
#[derive(Default)]
pub struct BatchQuery;

#[Object]
impl BatchQuery {
    /// One of the caller's batches. An admin reads any tenant's by naming the tenant.
    async fn batch(
        &self,
        context: &Context<'_>,
        id: Uuid,
        tenant_id: Option<Uuid>,
    ) -> async_graphql::Result<Batch> {
        let db = &app(context).db;
        let tenant_id = principal(context)?.report_tenant(db, tenant_id).await?;
        Ok(batches::read(db, tenant_id, id).await?.into())
    }

    /// The caller's batches, newest first, `first` at a time (at most 100).
    #[graphql(complexity = "super::cost::page_complexity(first, child_complexity)")]
    async fn batches(
        &self,
        context: &Context<'_>,
        first: Option<i32>,
        after: Option<String>,
        tenant_id: Option<Uuid>,
    ) -> async_graphql::Result<BatchConnection> {
        let db = &app(context).db;
        let tenant_id = principal(context)?.report_tenant(db, tenant_id).await?;
        let page = PageRequest::new(first, after.as_deref())?;
        let page = batches::list_batches(db, tenant_id, page).await?;
        let (edges, page_info) = connect(page, |batch| (batch.id, batch.into()));
        Ok(BatchConnection { edges, page_info })
    }
}
