//! The GraphQL types of jobs, attempts, money and accounts: the enums they share here,
//! each object with its kin.

mod account;
mod attempt;
mod batch;
mod costs;
mod job;
mod page;

pub use account::{Account, CreditGrant, Tenant};
pub use attempt::Attempt;
pub use batch::{Batch, BatchConnection, BatchMode, BatchUpdate};
pub use costs::{Charge, JobCost, Reservation};
pub use job::{Job, JobConnection, JobEvent, Label, PayloadGate};
pub(crate) use page::edge;
pub use page::{Edge, PageInfo, connect};

use super::scalars::Amount;
use crate::billing::Credits;
use async_graphql::Enum;
use chrono::{DateTime, Utc};
use entity::Timestamp;

fn time(timestamp: Timestamp) -> DateTime<Utc> {
    timestamp.to_datetime()
}

fn money(nanos: i64) -> Amount {
    Amount::from(Credits::from_nanos(nanos))
}

/// Token counts fit GraphQL's 32-bit Int for any real call; saturate rather than fail.
fn token_count(count: Option<i64>) -> Option<i32> {
    count.map(|count| i32::try_from(count).unwrap_or(i32::MAX))
}

/// Where a job is in its lifecycle.
#[derive(Enum, Clone, Copy, Debug, PartialEq, Eq)]
#[graphql(remote = "entity::JobStatus")]
pub enum JobStatus {
    Queued,
    Running,
    Succeeded,
    Failed,
    Cancelled,
}

/// How an attempt ended.
#[derive(Enum, Clone, Copy, Debug, PartialEq, Eq)]
#[graphql(remote = "entity::AttemptOutcome")]
pub enum AttemptOutcome {
    Running,
    Succeeded,
    RetryableError,
    PermanentError,
    InvalidOutput,
    /// The request was sent and no answer came back: it may have been billed.
    Unknown,
    Cancelled,
    LeaseExpired,
}

/// The state of a job's credit hold.
#[derive(Enum, Clone, Copy, Debug, PartialEq, Eq)]
#[graphql(remote = "entity::ReservationStatus")]
pub enum ReservationStatus {
    Held,
    Settled,
    Released,
}

/// What happened to a job.
#[derive(Enum, Clone, Copy, Debug, PartialEq, Eq)]
#[graphql(remote = "entity::EventKind")]
pub enum EventKind {
    Created,
    AttemptStarted,
    RetryScheduled,
    CancelRequested,
    Succeeded,
    Failed,
    Cancelled,
    /// Live text of a streaming attempt; not stored, so not replayed.
    OutputDelta,
}

/// Why an attempt ended as it did, or why a job failed: `Job.error.code` and
/// `Attempt.errorCode`.
#[derive(Enum, Clone, Copy, Debug, PartialEq, Eq)]
#[graphql(remote = "entity::JobErrorCode")]
pub enum JobErrorCode {
    /// The provider refused the request with a permanent status; not billed, not
    /// retried.
    ProviderRejected,
    /// The provider was unreachable or answered a retryable status; retried with
    /// backoff while attempts remain.
    ProviderUnavailable,
    /// The request was sent and no answer came back: it may have been billed. Retried
    /// only when the job's `retryUnknownOutcome` allows it.
    OutcomeUnknown,
    /// The reply did not satisfy the job's response schema (or was not JSON).
    InvalidOutput,
    /// The worker running the attempt stopped renewing its lease; another process took
    /// the job back.
    LeaseExpired,
    /// The tenant cancelled the job.
    Cancelled,
    /// The worker shut down during the attempt and handed the job back.
    WorkerShutdown,
    /// The job made as many calls that may have been billed as it may pay for, or
    /// their cost reached its hold.
    PaidCallLimit,
    /// No configured provider serves the job's model; no call was made.
    ModelNotServed,
    /// The answer came back and was paid for, but could not be stored.
    ResultNotStored,
    /// The job cannot be run at all (unreadable input, a model without a price); no
    /// call was made.
    NotRunnable,
    /// The job had not finished by its `deadline`: a queued job fails there, a running
    /// attempt is cancelled (outcome `CANCELLED`).
    DeadlineExceeded,
}
