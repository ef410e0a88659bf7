//! The GraphQL types of jobs, attempts, money and accounts: the enums they share here,
//! each object with its kin.

mod account;
mod attempt;
mod batch;
mod costs;
mod job;

pub use account::{Account, CreditGrant, Tenant};
pub use attempt::Attempt;
pub use batch::{Batch, BatchConnection, BatchEdge, BatchMode, BatchUpdate, page_arguments};
pub use costs::{Charge, JobCost, Reservation};
pub use job::{Job, JobConnection, JobEdge, JobEvent, PageInfo, PayloadGate};

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
