//! The closed sets of values some columns hold, stored as their lowercase names.

use sea_orm::entity::prelude::*;
use serde::{Deserialize, Serialize};

/// Where a job is in its lifecycle.
#[derive(
    Clone, Copy, Debug, PartialEq, Eq, Hash, EnumIter, DeriveActiveEnum, Serialize, Deserialize,
)]
#[sea_orm(rs_type = "String", db_type = "String(StringLen::None)")]
pub enum JobStatus {
    #[sea_orm(string_value = "queued")]
    Queued,
    #[sea_orm(string_value = "running")]
    Running,
    #[sea_orm(string_value = "succeeded")]
    Succeeded,
    #[sea_orm(string_value = "failed")]
    Failed,
    #[sea_orm(string_value = "cancelled")]
    Cancelled,
}

impl JobStatus {
    /// A terminal job never changes status again.
    pub fn is_terminal(self) -> bool {
        matches!(self, Self::Succeeded | Self::Failed | Self::Cancelled)
    }
}

/// How a batch's items are run.
#[derive(
    Clone, Copy, Debug, PartialEq, Eq, Hash, EnumIter, DeriveActiveEnum, Serialize, Deserialize,
)]
#[sea_orm(rs_type = "String", db_type = "String(StringLen::None)")]
pub enum BatchMode {
    /// Each item is an ordinary job, queued as soon as it is added.
    #[sea_orm(string_value = "realtime")]
    Realtime,
    /// The items go through the provider's batch API at its batch price.
    #[sea_orm(string_value = "provider_batch")]
    ProviderBatch,
}

/// Where a provider batch is in its life (see `docs/provider-batches.md`).
#[derive(
    Clone, Copy, Debug, PartialEq, Eq, Hash, EnumIter, DeriveActiveEnum, Serialize, Deserialize,
)]
#[sea_orm(rs_type = "String", db_type = "String(StringLen::None)")]
pub enum ProviderBatchState {
    /// Its row and its items' attempts are written; nothing was sent yet.
    #[sea_orm(string_value = "preparing")]
    Preparing,
    /// The upload is under way or was: the provider may have the batch.
    #[sea_orm(string_value = "uploading")]
    Uploading,
    /// The provider took it and named it; polled until it ends.
    #[sea_orm(string_value = "submitted")]
    Submitted,
    /// The tenant cancelled; the provider was asked to cancel it, and it is polled
    /// until it ends.
    #[sea_orm(string_value = "cancelling")]
    Cancelling,
    /// The provider says it ended; its results are being settled.
    #[sea_orm(string_value = "ended")]
    Ended,
    /// Every item of it is settled.
    #[sea_orm(string_value = "settled")]
    Settled,
    /// Nothing of it was sent (cancelled while preparing).
    #[sea_orm(string_value = "abandoned")]
    Abandoned,
    /// The provider could not be read about it for longer than the bound: its items
    /// ended with the cost bound of an unknown outcome.
    #[sea_orm(string_value = "unknown")]
    Unknown,
}

impl ProviderBatchState {
    /// Whether nothing more happens to it.
    pub fn is_final(self) -> bool {
        matches!(self, Self::Settled | Self::Abandoned | Self::Unknown)
    }

    /// The state as stored and as the API and metrics name it, in lower case.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Preparing => "preparing",
            Self::Uploading => "uploading",
            Self::Submitted => "submitted",
            Self::Cancelling => "cancelling",
            Self::Ended => "ended",
            Self::Settled => "settled",
            Self::Abandoned => "abandoned",
            Self::Unknown => "unknown",
        }
    }
}

/// Where a batch is in its life.
#[derive(
    Clone, Copy, Debug, PartialEq, Eq, Hash, EnumIter, DeriveActiveEnum, Serialize, Deserialize,
)]
#[sea_orm(rs_type = "String", db_type = "String(StringLen::None)")]
pub enum BatchStatus {
    /// Takes items.
    #[sea_orm(string_value = "open")]
    Open,
    /// Takes no more items; some are not finished.
    #[sea_orm(string_value = "closed")]
    Closed,
    /// Closed, and every item finished.
    #[sea_orm(string_value = "finished")]
    Finished,
}

/// How one attempt ended (or `Running` while it has not).
#[derive(
    Clone, Copy, Debug, PartialEq, Eq, Hash, EnumIter, DeriveActiveEnum, Serialize, Deserialize,
)]
#[sea_orm(rs_type = "String", db_type = "String(StringLen::None)")]
pub enum AttemptOutcome {
    #[sea_orm(string_value = "running")]
    Running,
    #[sea_orm(string_value = "succeeded")]
    Succeeded,
    #[sea_orm(string_value = "retryable_error")]
    RetryableError,
    #[sea_orm(string_value = "permanent_error")]
    PermanentError,
    #[sea_orm(string_value = "invalid_output")]
    InvalidOutput,
    /// The request was sent and no answer came back: the provider may have billed it.
    #[sea_orm(string_value = "unknown")]
    Unknown,
    #[sea_orm(string_value = "cancelled")]
    Cancelled,
    /// The worker stopped renewing its lease; another attempt took the job over.
    #[sea_orm(string_value = "lease_expired")]
    LeaseExpired,
}

/// The state of a job's credit hold.
#[derive(
    Clone, Copy, Debug, PartialEq, Eq, Hash, EnumIter, DeriveActiveEnum, Serialize, Deserialize,
)]
#[sea_orm(rs_type = "String", db_type = "String(StringLen::None)")]
pub enum ReservationStatus {
    #[sea_orm(string_value = "held")]
    Held,
    #[sea_orm(string_value = "settled")]
    Settled,
    #[sea_orm(string_value = "released")]
    Released,
}

/// A movement of credits in the append-only ledger.
///
/// Amounts are always positive; the kind gives the direction:
/// granted = Σ grant, charged = Σ charge, held = Σ hold − Σ release − Σ charge,
/// expired = Σ expiry.
#[derive(
    Clone, Copy, Debug, PartialEq, Eq, Hash, EnumIter, DeriveActiveEnum, Serialize, Deserialize,
)]
#[sea_orm(rs_type = "String", db_type = "String(StringLen::None)")]
pub enum LedgerEntryKind {
    #[sea_orm(string_value = "grant")]
    Grant,
    #[sea_orm(string_value = "hold")]
    Hold,
    #[sea_orm(string_value = "release")]
    Release,
    #[sea_orm(string_value = "charge")]
    Charge,
    /// What was left of a grant at its expiry, never more than was available.
    #[sea_orm(string_value = "expiry")]
    Expiry,
}

/// What happened to a job, as recorded in its event stream.
#[derive(
    Clone, Copy, Debug, PartialEq, Eq, Hash, EnumIter, DeriveActiveEnum, Serialize, Deserialize,
)]
#[sea_orm(rs_type = "String", db_type = "String(StringLen::None)")]
pub enum EventKind {
    #[sea_orm(string_value = "created")]
    Created,
    #[sea_orm(string_value = "attempt_started")]
    AttemptStarted,
    #[sea_orm(string_value = "retry_scheduled")]
    RetryScheduled,
    #[sea_orm(string_value = "cancel_requested")]
    CancelRequested,
    #[sea_orm(string_value = "succeeded")]
    Succeeded,
    #[sea_orm(string_value = "failed")]
    Failed,
    #[sea_orm(string_value = "cancelled")]
    Cancelled,
    /// Text the model produced so far, streamed live to subscribers and never stored
    /// (the final result is).
    #[sea_orm(string_value = "output_delta")]
    OutputDelta,
}

impl EventKind {
    /// The last event of a job's stream.
    pub fn is_terminal(self) -> bool {
        matches!(self, Self::Succeeded | Self::Failed | Self::Cancelled)
    }
}

/// What an API key may do.
#[derive(
    Clone, Copy, Debug, PartialEq, Eq, Hash, EnumIter, DeriveActiveEnum, Serialize, Deserialize,
)]
#[sea_orm(rs_type = "String", db_type = "String(StringLen::None)")]
pub enum ApiKeyRole {
    #[sea_orm(string_value = "tenant")]
    Tenant,
    #[sea_orm(string_value = "admin")]
    Admin,
}

/// Where a webhook delivery is.
#[derive(
    Clone, Copy, Debug, PartialEq, Eq, Hash, EnumIter, DeriveActiveEnum, Serialize, Deserialize,
)]
#[sea_orm(rs_type = "String", db_type = "String(StringLen::None)")]
pub enum WebhookDeliveryStatus {
    /// Not yet accepted by the endpoint; tried again at `next_attempt_at`.
    #[sea_orm(string_value = "pending")]
    Pending,
    /// The endpoint answered 2xx.
    #[sea_orm(string_value = "delivered")]
    Delivered,
    /// Given up: retried for a day without success, or its endpoint was deleted.
    #[sea_orm(string_value = "failed")]
    Failed,
}
