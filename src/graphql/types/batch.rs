//! A batch, its progress and pages of batches.

use super::{JobConnection, JobStatus, PageInfo, connect, edge, money, time};
use crate::graphql::app;
use crate::graphql::provider_batches::{ProviderBatch, RealtimeComparisonView};
use crate::graphql::scalars::Amount;
use crate::jobs::batches::{self, BatchView, provider_view};
use crate::page::PageRequest;
use async_graphql::{Context, Enum, Object, SimpleObject};
use chrono::{DateTime, Utc};
use entity::batches as rows;
use uuid::Uuid;

/// How a batch's items are run.
#[derive(Enum, Clone, Copy, Debug, PartialEq, Eq)]
#[graphql(remote = "entity::BatchMode")]
pub enum BatchMode {
    /// Each item is an ordinary job, queued as soon as it is added.
    Realtime,
    /// The items go through the provider's batch API at its batch price.
    ProviderBatch,
}

/// Where a batch is in its life.
#[derive(Enum, Clone, Copy, Debug, PartialEq, Eq)]
#[graphql(remote = "entity::BatchStatus")]
pub enum BatchStatus {
    /// Takes items.
    Open,
    /// Takes no more items; some are not finished.
    Closed,
    /// Closed, and every item finished.
    Finished,
}

/// A batch's items by status.
#[derive(SimpleObject, Clone, Copy)]
pub struct BatchCounts {
    pub queued: i64,
    pub running: i64,
    pub succeeded: i64,
    pub failed: i64,
    pub cancelled: i64,
}

impl From<&BatchView> for BatchCounts {
    fn from(view: &BatchView) -> Self {
        Self {
            queued: view.queued,
            running: view.running,
            succeeded: view.batch.succeeded,
            failed: view.batch.failed,
            cancelled: view.batch.cancelled,
        }
    }
}

/// One handle for many jobs of one model. Its counts and money are kept on its row,
/// so reading it costs the same at any size.
pub struct Batch(rows::Model, tokio::sync::OnceCell<BatchView>);

impl From<rows::Model> for Batch {
    fn from(row: rows::Model) -> Self {
        Self(row, tokio::sync::OnceCell::new())
    }
}

impl From<BatchView> for Batch {
    fn from(view: BatchView) -> Self {
        Self(
            view.batch.clone(),
            tokio::sync::OnceCell::new_with(Some(view)),
        )
    }
}

impl Batch {
    /// The row with its running items counted, read once per batch and request.
    async fn view(&self, context: &Context<'_>) -> async_graphql::Result<&BatchView> {
        Ok(self
            .1
            .get_or_try_init(|| batches::view(&app(context).db, self.0.clone()))
            .await?)
    }
}

#[Object]
impl Batch {
    async fn id(&self) -> Uuid {
        self.0.id
    }

    async fn name(&self) -> Option<&str> {
        self.0.name.as_deref()
    }

    async fn mode(&self) -> BatchMode {
        self.0.mode.into()
    }

    async fn model(&self) -> &str {
        &self.0.model
    }

    async fn status(&self) -> BatchStatus {
        self.0.status.into()
    }

    /// Whether the tenant cancelled the batch.
    async fn cancel_requested(&self) -> bool {
        self.0.cancel_requested
    }

    /// Items added so far.
    async fn item_count(&self) -> i64 {
        self.0.item_count
    }

    async fn created_at(&self) -> DateTime<Utc> {
        time(self.0.created_at)
    }

    /// The deadline every item shares, if the batch was created with one; else each
    /// item has its own (`Job.deadline`), the configured default from when it was added.
    async fn deadline(&self) -> async_graphql::Result<Option<DateTime<Utc>>> {
        let settings: batches::BatchSettings = serde_json::from_value(self.0.settings.0.clone())
            .map_err(|error| {
                crate::error::ServiceError::from(sea_orm::DbErr::Custom(format!(
                    "batch settings: {error}"
                )))
            })?;
        Ok(settings.deadline.map(time))
    }

    async fn closed_at(&self) -> Option<DateTime<Utc>> {
        self.0.closed_at.map(time)
    }

    async fn finished_at(&self) -> Option<DateTime<Utc>> {
        self.0.finished_at.map(time)
    }

    async fn counts(&self, context: &Context<'_>) -> async_graphql::Result<BatchCounts> {
        Ok(self.view(context).await?.into())
    }

    /// Credit still held by the unfinished items (0 once FINISHED).
    async fn reserved(&self) -> Amount {
        money(self.0.reserved_nanos)
    }

    /// Σ the items' exact provider costs.
    async fn provider_cost(&self) -> Amount {
        money(self.0.provider_cost_nanos)
    }

    /// Σ the items' exact costs and the bounds of the costs not known.
    async fn provider_cost_upper_bound(&self) -> Amount {
        money(
            self.0
                .provider_cost_nanos
                .saturating_add(self.0.unknown_bound_nanos),
        )
    }

    /// Σ the items' charges.
    async fn customer_charge(&self) -> Amount {
        money(self.0.customer_charge_nanos)
    }

    /// PROVIDER_BATCH: the uploads to the provider's batch API that carried its
    /// items, oldest first, with their state and their attempts by outcome; empty
    /// for a REALTIME batch and before the batch is closed.
    async fn provider_batches(
        &self,
        context: &Context<'_>,
    ) -> async_graphql::Result<Vec<ProviderBatch>> {
        let views = provider_view::provider_batches_of(&app(context).db, &self.0).await?;
        Ok(views.into_iter().map(ProviderBatch::from).collect())
    }

    /// PROVIDER_BATCH: its accepted answers as charged, against what the same usage
    /// is charged at the realtime price, and the saving. Null for a REALTIME batch.
    async fn realtime_comparison(
        &self,
        context: &Context<'_>,
    ) -> async_graphql::Result<Option<RealtimeComparisonView>> {
        if self.0.mode != entity::BatchMode::ProviderBatch {
            return Ok(None);
        }
        let comparison = provider_view::realtime_comparison(&app(context).db, &self.0).await?;
        Ok(Some(comparison.into()))
    }

    /// The items as jobs, in the order they were added, `first` at a time (at most
    /// 100), of one status if asked.
    #[graphql(complexity = "crate::graphql::cost::page_complexity(first, child_complexity)")]
    async fn jobs(
        &self,
        context: &Context<'_>,
        first: Option<i32>,
        after: Option<String>,
        status: Option<JobStatus>,
    ) -> async_graphql::Result<JobConnection> {
        let page = PageRequest::new(first, after.as_deref())?;
        let items =
            batches::list_items(&app(context).db, &self.0, page, status.map(Into::into)).await?;
        let (edges, page_info) = connect(items, |job| (job.id, super::Job::without_payloads(job)));
        Ok(JobConnection { edges, page_info })
    }
}

/// A page of batches.
#[derive(SimpleObject)]
pub struct BatchConnection {
    pub edges: Vec<BatchEdge>,
    pub page_info: PageInfo,
}

edge!(
    /// A batch and the cursor to page on from it.
    BatchEdge of Batch
);

/// A batch's progress at one moment.
#[derive(SimpleObject)]
pub struct BatchUpdate {
    pub batch_id: Uuid,
    pub status: BatchStatus,
    pub counts: BatchCounts,
    pub customer_charge: Amount,
    pub reserved: Amount,
    /// When the state was read.
    pub at: DateTime<Utc>,
}

impl From<BatchView> for BatchUpdate {
    fn from(view: BatchView) -> Self {
        Self {
            batch_id: view.batch.id,
            status: view.batch.status.into(),
            counts: (&view).into(),
            customer_charge: money(view.batch.customer_charge_nanos),
            reserved: money(view.batch.reserved_nanos),
            at: Utc::now(),
        }
    }
}
