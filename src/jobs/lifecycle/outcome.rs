//! How an attempt ended and what becomes of its job: the words the worker's judgement,
//! the finish and the tables of this module share.

use crate::billing::Credits;
use crate::db::storable_text;
use crate::llm::TokenUsage;
use entity::{AttemptOutcome, JobErrorCode, Timestamp};
use serde_json::Value;
use std::time::Duration;

/// What became of the provider call, for the attempt row.
#[derive(Clone, Debug)]
pub struct AttemptReport {
    pub outcome: AttemptOutcome,
    /// Usage the provider reported; with it the cost is exact.
    pub usage: Option<TokenUsage>,
    /// True when the request cannot have been billed (never sent, or refused with an
    /// error status): the cost is then exactly zero.
    pub not_billed: bool,
    /// What the customer pays for this attempt, by the charging policy.
    pub customer_charge: Credits,
    /// Output streamed to the client, when the call streamed any.
    pub delivered_output_tokens: Option<u64>,
    pub error: Option<JobError>,
    pub provider_request_id: Option<String>,
    pub latency: Duration,
    /// When the call ended: the attempt's `finished_at`, and the instant a retry's
    /// backoff counts from (the finisher may write it a little later).
    pub ended_at: Timestamp,
    /// The provider answered 429: the model is paused for every worker until then.
    pub model_paused_until: Option<Timestamp>,
    /// The provider refused the call without doing any work (a wait): the attempt
    /// does not count against `maxAttempts`, whatever becomes of the job.
    pub wait: bool,
}

/// A machine-readable code and a human message.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct JobError {
    pub code: JobErrorCode,
    pub message: String,
}

impl JobError {
    /// An error with one of the codes jobledger uses. The message may quote a
    /// provider, so a NUL character in it (which PostgreSQL text cannot hold) becomes
    /// U+FFFD.
    pub fn new(code: JobErrorCode, message: impl Into<String>) -> Self {
        Self {
            code,
            message: storable_text(message.into()),
        }
    }
}

/// What becomes of the job after the attempt.
#[derive(Clone, Debug)]
pub enum JobOutcome {
    /// The result is accepted; the customer is charged what the attempts carry.
    Succeeded { result: Value },
    /// Queued again, to be claimed at `at`; on `model` when it is a fallback other
    /// than the model just called.
    Retry {
        at: Timestamp,
        model: Option<String>,
    },
    /// Failed for good; the hold is settled for what the attempts charged, if
    /// anything, and released otherwise.
    Failed(JobError),
    /// Cancelled as the tenant asked; the hold is resolved as for `Failed`.
    Cancelled,
    /// Given back at once because the worker is shutting down: queued again, and the
    /// attempt does not count against `maxAttempts`.
    HandBack,
    /// Queued again at `at` after a call the provider refused without doing any work
    /// (a rate limit, an overload with `Retry-After`, a connection refused before the
    /// request was sent). Nothing was billed, so like a hand-back the attempt does not
    /// count against `maxAttempts`; the job's deadline bounds how long it waits. On
    /// `model` as for `Retry`.
    Wait {
        at: Timestamp,
        model: Option<String>,
    },
}
