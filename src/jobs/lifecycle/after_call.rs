//! What a job becomes when its call ended: the rows of the worker's judgement. The
//! worker (`worker/judge.rs`) reads the reply or the error and records the attempt; it
//! names how the call ended as a [`CallEnding`], and [`Schedule::after_call`] decides.

use super::{JobError, JobOutcome, Schedule};
use entity::Timestamp;
use serde_json::Value;
use std::time::Duration;

/// How a call ended, as far as its job's fate goes.
#[derive(Clone, Debug, PartialEq)]
pub enum CallEnding {
    /// The reply is the job's result.
    Accepted(Value),
    /// The reply failed the job's response schema or a tool's: retried while attempts
    /// remain (the finish fails it once its invalid-output retries are spent).
    InvalidOutput(JobError),
    /// The provider did no work and billed nothing: a connection refused before the
    /// request was sent, a request its provider batch never ran (expired, cancelled,
    /// missing from the results). A wait that spends no attempt.
    NotSent,
    /// The provider's rate limit (a realtime 429, a 503/529 with `Retry-After`) paused
    /// the model until `until`: a wait, on a fallback if one is free.
    ModelPaused {
        retry_after: Option<Duration>,
        until: Timestamp,
    },
    /// A refusal worth trying again (a 5xx, a provider batch request's 429): it spends
    /// an attempt.
    Retryable {
        error: JobError,
        retry_after: Option<Duration>,
    },
    /// The provider refused the request for good (a 4xx): trying again would be
    /// refused again.
    Rejected(JobError),
    /// Sent, and nobody can tell whether it was billed: retried only if the job allows
    /// paying twice.
    Unknown(JobError),
    /// As `Unknown`, for a request of a provider batch: never sent again, since an item
    /// goes out again only when known not billed (a second provider batch could run it
    /// beside the first), whatever the job's `retryUnknownOutcome`.
    UnknownInProviderBatch(JobError),
    /// The call was not made, and would not be if tried again: no provider serves the
    /// model, or the job has no paid call left.
    NotMade(JobError),
    /// The job's deadline came before or during the call (`error` says which).
    PastDeadline(JobError),
    /// The tenant cancelled it, before or during the call.
    Cancelled,
    /// The database refused the attempt's outcome: whatever the answer was, it could
    /// not be kept.
    NotStored(JobError),
    /// The worker shut down before sending: the job goes back as if never claimed.
    ShutDownBeforeSending,
    /// The worker shut down during the call: it may be billed.
    ShutDownInFlight,
}

impl Schedule<'_> {
    /// What the job becomes after its call ended as `ending`.
    pub fn after_call(&self, ending: CallEnding) -> JobOutcome {
        match ending {
            CallEnding::Accepted(result) => JobOutcome::Succeeded { result },
            CallEnding::InvalidOutput(error) => self.retry_or_fail(error, None),
            CallEnding::NotSent => self.wait(None, None),
            CallEnding::ModelPaused { retry_after, until } => self.wait(retry_after, Some(until)),
            CallEnding::Retryable { error, retry_after } => self.retry_or_fail(error, retry_after),
            CallEnding::Rejected(error)
            | CallEnding::NotMade(error)
            | CallEnding::UnknownInProviderBatch(error)
            | CallEnding::PastDeadline(error)
            | CallEnding::NotStored(error) => JobOutcome::Failed(error),
            CallEnding::Unknown(error) => self.unknown_outcome(error),
            CallEnding::Cancelled => JobOutcome::Cancelled,
            CallEnding::ShutDownBeforeSending => JobOutcome::HandBack,
            CallEnding::ShutDownInFlight => self.aborted_in_flight(),
        }
    }
}
