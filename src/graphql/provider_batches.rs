//! A PROVIDER_BATCH batch's uploads to the provider's batch API, and its answered
//! items against the realtime price: the `Batch` fields `providerBatches` and
//! `realtimeComparison`.

use super::scalars::Amount;
use super::types::AttemptOutcome;
use crate::jobs::batches::provider_view::{ProviderBatchView, RealtimeComparison};
use async_graphql::{Enum, SimpleObject};
use chrono::{DateTime, Utc};
use uuid::Uuid;

/// Where an upload to a provider's batch API is in its life.
#[derive(Enum, Clone, Copy, Debug, PartialEq, Eq)]
#[graphql(remote = "entity::ProviderBatchState")]
pub enum ProviderBatchState {
    /// Written; nothing sent yet.
    Preparing,
    /// Being uploaded: the provider may have it.
    Uploading,
    /// The provider took it; read until it ends.
    Submitted,
    /// The batch was cancelled and the provider asked to cancel this one.
    Cancelling,
    /// The provider says it ended; its results are being settled.
    Ended,
    /// Every item of it is settled.
    Settled,
    /// Nothing of it was sent (cancelled first).
    Abandoned,
    /// The provider could not be read about it for too long: its items ended with
    /// the cost bound of an unknown outcome.
    Unknown,
}

/// Attempts of one outcome.
#[derive(SimpleObject)]
pub struct OutcomeCount {
    pub outcome: AttemptOutcome,
    pub count: i64,
}

/// One upload of a batch's items to the provider's batch API.
#[derive(SimpleObject)]
pub struct ProviderBatch {
    pub id: Uuid,
    /// The provider's name, as attempts record it.
    pub provider: String,
    pub model: String,
    pub state: ProviderBatchState,
    /// The provider's id for it, once known.
    pub provider_batch_id: Option<String>,
    /// Items it carries.
    pub item_count: i64,
    /// Its items' attempts by outcome so far (an item sent again after its request
    /// expired has an attempt in each upload that carried it).
    pub outcomes: Vec<OutcomeCount>,
    /// Σ its items' call bounds at the provider's batch price.
    pub cost_bound: Amount,
    pub created_at: DateTime<Utc>,
    pub submitted_at: Option<DateTime<Utc>>,
    pub ended_at: Option<DateTime<Utc>>,
}

impl From<ProviderBatchView> for ProviderBatch {
    fn from(view: ProviderBatchView) -> Self {
        let row = view.row;
        Self {
            id: row.id,
            provider: row.provider,
            model: row.model,
            state: row.state.into(),
            provider_batch_id: row.provider_batch_id,
            item_count: row.item_count,
            outcomes: view
                .outcomes
                .into_iter()
                .map(|(outcome, count)| OutcomeCount {
                    outcome: outcome.into(),
                    count,
                })
                .collect(),
            cost_bound: crate::billing::Credits::from_nanos(row.cost_bound_nanos).into(),
            created_at: row.created_at.to_datetime(),
            submitted_at: row.submitted_at.map(|at| at.to_datetime()),
            ended_at: row.ended_at.map(|at| at.to_datetime()),
        }
    }
}

/// A batch's accepted answers priced both ways: as charged at the batch price, and
/// at the customer's realtime price of the same price version. Answers that came
/// back without going through a provider batch, and attempts without an accepted
/// answer, count on neither side.
#[derive(SimpleObject)]
#[graphql(name = "RealtimeComparison")]
pub struct RealtimeComparisonView {
    /// Accepted answers counted.
    pub answers: i64,
    /// What they were charged.
    pub charged: Amount,
    /// What their usage is charged at the realtime price.
    pub at_realtime_price: Amount,
    /// `atRealtimePrice − charged`.
    pub saving: Amount,
}

impl From<RealtimeComparison> for RealtimeComparisonView {
    fn from(comparison: RealtimeComparison) -> Self {
        Self {
            answers: comparison.answers,
            charged: comparison.charged.into(),
            at_realtime_price: comparison.at_realtime_price.into(),
            saving: comparison.saving().into(),
        }
    }
}
