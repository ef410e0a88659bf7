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

    /// The status as a SQL string literal, for hand-written statements: a literal, not
    /// a bound value, so that the planner matches the partial indexes on `status`
    /// (`WHERE status = 'queued'`). Checked against the stored value in the tests.
    pub fn sql(self) -> &'static str {
        match self {
            Self::Queued => "'queued'",
            Self::Running => "'running'",
            Self::Succeeded => "'succeeded'",
            Self::Failed => "'failed'",
            Self::Cancelled => "'cancelled'",
        }
    }

    /// The status as the API spells it (the GraphQL `JobStatus` enum, webhook bodies,
    /// batch results).
    pub fn api_name(self) -> &'static str {
        match self {
            Self::Queued => "QUEUED",
            Self::Running => "RUNNING",
            Self::Succeeded => "SUCCEEDED",
            Self::Failed => "FAILED",
            Self::Cancelled => "CANCELLED",
        }
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

/// Where a price version came from. At start, a built-in price never replaces an
/// imported one, and an import never replaces a config file's price: the config file
/// wins over an import, which wins over the built-in list.
#[derive(
    Clone, Copy, Debug, PartialEq, Eq, Hash, EnumIter, DeriveActiveEnum, Serialize, Deserialize,
)]
#[sea_orm(rs_type = "String", db_type = "String(StringLen::None)")]
pub enum PriceOrigin {
    /// The list compiled into the binary.
    #[sea_orm(string_value = "built_in")]
    BuiltIn,
    /// The config file (`--config`).
    #[sea_orm(string_value = "config")]
    Config,
    /// `jobledger prices import`.
    #[sea_orm(string_value = "import")]
    Import,
}

/// The API family that serves a model whose name does not tell it (an imported one).
#[derive(
    Clone, Copy, Debug, PartialEq, Eq, Hash, EnumIter, DeriveActiveEnum, Serialize, Deserialize,
)]
#[sea_orm(rs_type = "String", db_type = "String(StringLen::None)")]
pub enum ProviderFamily {
    /// The OpenAI-compatible provider.
    #[sea_orm(string_value = "openai")]
    OpenAi,
    /// Anthropic.
    #[sea_orm(string_value = "anthropic")]
    Anthropic,
}

/// Whose budget a rate-limit bucket holds.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, EnumIter, DeriveActiveEnum)]
#[sea_orm(rs_type = "String", db_type = "String(StringLen::None)")]
pub enum BucketScope {
    #[sea_orm(string_value = "provider")]
    Provider,
    #[sea_orm(string_value = "model")]
    Model,
    #[sea_orm(string_value = "tenant")]
    Tenant,
}

impl BucketScope {
    /// The name stored in `rate_limit_buckets.scope` and used as a metrics label.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Provider => "provider",
            Self::Model => "model",
            Self::Tenant => "tenant",
        }
    }
}

/// What a webhook delivery reports: the `type` of its body, stored in
/// `webhook_deliveries.event_type` and listed in `webhooks.events`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, EnumIter, DeriveActiveEnum)]
#[sea_orm(rs_type = "String", db_type = "String(StringLen::None)")]
pub enum WebhookEvent {
    #[sea_orm(string_value = "job.succeeded")]
    JobSucceeded,
    #[sea_orm(string_value = "job.failed")]
    JobFailed,
    #[sea_orm(string_value = "job.cancelled")]
    JobCancelled,
    #[sea_orm(string_value = "balance.low")]
    BalanceLow,
    #[sea_orm(string_value = "spend_limit.reached")]
    SpendLimitReached,
    #[sea_orm(string_value = "batch.finished")]
    BatchFinished,
}

impl WebhookEvent {
    /// Every event type, in a stable order.
    pub const ALL: [Self; 6] = [
        Self::JobSucceeded,
        Self::JobFailed,
        Self::JobCancelled,
        Self::BalanceLow,
        Self::SpendLimitReached,
        Self::BatchFinished,
    ];

    /// The `type` of the delivered body, as stored.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::JobSucceeded => "job.succeeded",
            Self::JobFailed => "job.failed",
            Self::JobCancelled => "job.cancelled",
            Self::BalanceLow => "balance.low",
            Self::SpendLimitReached => "spend_limit.reached",
            Self::BatchFinished => "batch.finished",
        }
    }

    /// The event type a stored name names.
    pub fn parse(name: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|kind| kind.as_str() == name)
    }

    /// The event a job's end reports: `None` while the job has not ended.
    pub fn of_job_end(status: crate::JobStatus) -> Option<Self> {
        match status {
            crate::JobStatus::Succeeded => Some(Self::JobSucceeded),
            crate::JobStatus::Failed => Some(Self::JobFailed),
            crate::JobStatus::Cancelled => Some(Self::JobCancelled),
            crate::JobStatus::Queued | crate::JobStatus::Running => None,
        }
    }
}

/// The codes a failed job or attempt carries, as clients see them in `error.code`,
/// stored in `jobs.error_code` and `attempts.error_code` as these very texts.
#[derive(
    Clone, Copy, Debug, PartialEq, Eq, Hash, EnumIter, DeriveActiveEnum, Serialize, Deserialize,
)]
#[sea_orm(rs_type = "String", db_type = "String(StringLen::None)")]
#[serde(rename_all = "SCREAMING_SNAKE_CASE")]
pub enum JobErrorCode {
    /// The provider refused the request (4xx); retrying cannot help.
    #[sea_orm(string_value = "PROVIDER_REJECTED")]
    ProviderRejected,
    /// The provider was unreachable or answered with a retryable error.
    #[sea_orm(string_value = "PROVIDER_UNAVAILABLE")]
    ProviderUnavailable,
    /// The request was sent and no answer came back.
    #[sea_orm(string_value = "OUTCOME_UNKNOWN")]
    OutcomeUnknown,
    /// The reply did not satisfy the job's response schema.
    #[sea_orm(string_value = "INVALID_OUTPUT")]
    InvalidOutput,
    /// The worker running the attempt stopped renewing its lease.
    #[sea_orm(string_value = "LEASE_EXPIRED")]
    LeaseExpired,
    /// The attempt was aborted because the tenant cancelled the job.
    #[sea_orm(string_value = "CANCELLED")]
    Cancelled,
    /// The worker shut down during the call and handed the job back.
    #[sea_orm(string_value = "WORKER_SHUTDOWN")]
    WorkerShutdown,
    /// The job made as many calls that may have been billed as it may pay for
    /// (`maxAttempts`: lost calls and hand-backs past the free ones included), or
    /// their cost reached its hold.
    #[sea_orm(string_value = "PAID_CALL_LIMIT")]
    PaidCallLimit,
    /// No configured provider serves the job's model (the simulator only serves what
    /// it is allowed to).
    #[sea_orm(string_value = "MODEL_NOT_SERVED")]
    ModelNotServed,
    /// The answer came back and was paid for, but the database refused to store it.
    #[sea_orm(string_value = "RESULT_NOT_STORED")]
    ResultNotStored,
    /// The job cannot be run at all (its stored input is unreadable, its model has no
    /// price); no call was made.
    #[sea_orm(string_value = "NOT_RUNNABLE")]
    NotRunnable,
    /// The job had not finished by its deadline: queued, it failed there; running,
    /// its attempt was cancelled.
    #[sea_orm(string_value = "DEADLINE_EXCEEDED")]
    DeadlineExceeded,
}

impl JobErrorCode {
    /// Every code, in the order of the declaration.
    pub const ALL: [Self; 12] = [
        Self::ProviderRejected,
        Self::ProviderUnavailable,
        Self::OutcomeUnknown,
        Self::InvalidOutput,
        Self::LeaseExpired,
        Self::Cancelled,
        Self::WorkerShutdown,
        Self::PaidCallLimit,
        Self::ModelNotServed,
        Self::ResultNotStored,
        Self::NotRunnable,
        Self::DeadlineExceeded,
    ];

    /// The code whose text is `text`, as a job or attempt row stores it.
    pub fn parse(text: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|code| code.as_str() == text)
    }

    /// The code's text.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::ProviderRejected => "PROVIDER_REJECTED",
            Self::ProviderUnavailable => "PROVIDER_UNAVAILABLE",
            Self::OutcomeUnknown => "OUTCOME_UNKNOWN",
            Self::InvalidOutput => "INVALID_OUTPUT",
            Self::LeaseExpired => "LEASE_EXPIRED",
            Self::Cancelled => "CANCELLED",
            Self::WorkerShutdown => "WORKER_SHUTDOWN",
            Self::PaidCallLimit => "PAID_CALL_LIMIT",
            Self::ModelNotServed => "MODEL_NOT_SERVED",
            Self::ResultNotStored => "RESULT_NOT_STORED",
            Self::NotRunnable => "NOT_RUNNABLE",
            Self::DeadlineExceeded => "DEADLINE_EXCEEDED",
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use sea_orm::{ActiveEnum, Iterable};

    #[test]
    fn each_value_is_stored_as_the_text_it_always_was() {
        for scope in BucketScope::iter() {
            assert_eq!(scope.to_value(), scope.as_str());
            assert_eq!(
                BucketScope::try_from_value(&scope.as_str().to_owned()).unwrap(),
                scope
            );
        }
        let stored: Vec<String> = WebhookEvent::iter().map(|event| event.to_value()).collect();
        assert_eq!(
            stored,
            [
                "job.succeeded",
                "job.failed",
                "job.cancelled",
                "balance.low",
                "spend_limit.reached",
                "batch.finished"
            ]
        );
        for event in WebhookEvent::ALL {
            assert_eq!(WebhookEvent::parse(&event.to_value()), Some(event));
        }
        assert_eq!(WebhookEvent::iter().count(), WebhookEvent::ALL.len());
    }

    #[test]
    fn a_status_in_hand_written_sql_is_its_stored_value_quoted() {
        for status in JobStatus::iter() {
            assert_eq!(status.sql(), format!("'{}'", status.to_value()));
        }
    }

    #[test]
    fn an_error_code_is_stored_and_serialised_as_its_text() {
        assert_eq!(JobErrorCode::iter().count(), JobErrorCode::ALL.len());
        for code in JobErrorCode::ALL {
            assert_eq!(code.to_value(), code.as_str());
            assert_eq!(
                serde_json::to_value(code).unwrap(),
                serde_json::json!(code.as_str())
            );
            assert_eq!(JobErrorCode::parse(code.as_str()), Some(code));
        }
        assert_eq!(JobErrorCode::PaidCallLimit.to_value(), "PAID_CALL_LIMIT");
    }
}
