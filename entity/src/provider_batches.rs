//! One upload to a provider's batch API, recorded before it is made.

use crate::{ProviderBatchState, Timestamp};
use sea_orm::entity::prelude::*;

#[derive(Clone, Debug, PartialEq, Eq, DeriveEntityModel)]
#[sea_orm(table_name = "provider_batches")]
pub struct Model {
    /// Ours (UUID v7); sent to the provider in OpenAI's `metadata` and as the input
    /// file's name.
    #[sea_orm(primary_key, auto_increment = false)]
    pub id: Uuid,
    /// The jobledger batch it serves.
    pub batch_id: Uuid,
    pub tenant_id: Uuid,
    /// The provider's name as attempts record it.
    pub provider: String,
    pub model: String,
    pub state: ProviderBatchState,
    /// The provider's id for the batch, once known.
    pub provider_batch_id: Option<String>,
    /// OpenAI: the uploaded input file, once known.
    pub input_file_id: Option<String>,
    pub item_count: i64,
    /// Σ its items' call bounds at the provider's batch price.
    pub cost_bound_nanos: i64,
    /// The submitter that owns it now, as a job claim: its token and lease.
    pub run_token: Option<Uuid>,
    pub lease_until: Option<Timestamp>,
    /// When it is looked at next.
    pub next_poll_at: Timestamp,
    /// Reads of the provider's batch so far: the backoff grows with them.
    pub polls: i32,
    /// The tenant cancelled the batch and the provider was asked to cancel it.
    pub cancel_sent: bool,
    /// The last time the provider answered about it (or its creation): past the
    /// unknown-fate bound without an answer, its items' fates are unknown.
    pub last_read_at: Timestamp,
    /// Why the last call to the provider about it failed, for the operator.
    pub last_error: Option<String>,
    pub created_at: Timestamp,
    pub uploading_at: Option<Timestamp>,
    pub submitted_at: Option<Timestamp>,
    pub ended_at: Option<Timestamp>,
    /// Whether `provider_batch_id` is known to be its own: named by its upload's
    /// answer, or by our id in OpenAI's metadata. An Anthropic batch found after a lost
    /// answer carries nothing of ours until its results do: it is a candidate, neither
    /// cancelled nor settled as ours before its results name the row's attempts.
    pub attributed: bool,
    /// Provider batches its searches found whose results named none of its attempts:
    /// a JSON array of provider ids, left out of its next search.
    pub ruled_out: Option<String>,
    /// When its upload last sent a request that creates something at the provider:
    /// after an ambiguous answer, it is not searched for before a grace period has
    /// passed since, as the provider may still be making it.
    pub sent_at: Option<Timestamp>,
    /// How many requests its upload holds: what a search for it looks for.
    pub upload_requests: Option<i64>,
    /// Whether its upload takes the provider's one upload slot: a search can tell an
    /// upload from others only by when it was made and how many requests it holds
    /// (Anthropic), unlike one that finds our id in the batch (OpenAI's metadata).
    pub exclusive_upload: bool,
}

#[derive(Copy, Clone, Debug, EnumIter, DeriveRelation)]
pub enum Relation {}

impl ActiveModelBehavior for ActiveModel {}
