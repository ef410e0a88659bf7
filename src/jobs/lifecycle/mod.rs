//! A job's fate, decided in one place.
//!
//! Every path that changes what a job is — an attempt's end judged by its worker and
//! written by the finish, a lost lease taken back, a claim that cannot run, a queued
//! job past its deadline — asks this module what the job becomes, and `queue/` writes
//! the answer: these functions read nothing and write nothing. They take the job (its
//! locked row), what its attempts spent so far ([`Spent`]), how the attempt ended and
//! the clock, and give a [`Transition`]: the next status and its event, when it runs
//! next and on which model, its error, whether the attempt is given back to
//! `maxAttempts`, and how its hold is resolved when it ends.
//!
//! | what happened | where | the job becomes |
//! |---|---|---|
//! | the worker judged the call's end | [`Schedule::after_call`] (from `worker/judge.rs`, for realtime calls and provider batch requests alike) | a [`JobOutcome`]: succeeded, retried (backoff, next model, deadline), waiting, handed back, failed, cancelled |
//! | that outcome meets the locked row | [`after_attempt`] (from `queue/finish.rs`) | the outcome, unless a cancel landed, the invalid-output retries or the paid calls are spent |
//! | the lease lapsed | [`after_lost_lease`] (from `queue/rescue.rs`) | cancelled, queued again, or failed |
//! | the lease lapsed while its attempt is in a provider batch that still runs | [`lease_is_lost`] (from `queue/rescue.rs`) | unchanged, its lease renewed: the submitter settles it |
//! | the claim cannot run | [`abandoned`] (from `queue::abandon_claim`) | failed `NOT_RUNNABLE` or as named |
//! | queued past its deadline | [`past_deadline`] (from `queue/deadlines.rs`) | failed `DEADLINE_EXCEEDED` |
//! | the tenant cancelled it | [`cancel`] (from `service::cancel_job`, `batches/cancel.rs`) | cancelled now, asked to stop, or left as it is |

use crate::backoff::{Backoff, Jitter};
use crate::billing::Credits;
use crate::billing::ledger::Resolution;
use crate::jobs::budget::Spent;
use crate::jobs::fallbacks::ModelChain;
use crate::jobs::input::{DEFAULT_DEADLINE, Deadline};
use entity::{
    AttemptOutcome, EventKind, JobErrorCode, JobStatus, ProviderBatchState, Timestamp, jobs,
};
use serde_json::{Value, json};
use std::time::Duration;
use uuid::Uuid;

mod after_call;
mod outcome;
#[cfg(test)]
mod tests;

pub use after_call::CallEnding;
pub use outcome::{AttemptReport, JobError, JobOutcome};

/// Replies that may fail a job's response schema before it fails for good: the first
/// try and two retries, within `maxAttempts`.
pub const INVALID_OUTPUT_RETRIES: u32 = 2;

/// A job's retries: from 2 s, doubling to 60 s, with equal jitter so that jobs failing
/// together do not retry together.
const RETRY_BACKOFF: Backoff = Backoff {
    first: Duration::from_secs(2),
    cap: Duration::from_secs(60),
    jitter: Jitter::Equal,
};
/// Longest `Retry-After` honoured; a provider asking for more is treated as this.
const RETRY_AFTER_CAP: Duration = Duration::from_secs(600);

/// What a job becomes, for `queue/` to write under the job's fence.
#[derive(Clone, Debug, PartialEq)]
pub struct Transition {
    pub status: JobStatus,
    /// The event that tells it.
    pub event: EventKind,
    /// The event's data.
    pub data: Value,
    /// The result, when the job succeeded.
    pub result: Option<Value>,
    /// The job's error, when it failed.
    pub error: Option<JobError>,
    /// When the job may next be claimed; `None` leaves the column as it is.
    pub next_run_at: Option<Timestamp>,
    /// The fallback model the job runs on from now, when it changes.
    pub model: Option<String>,
    /// The claim's attempt does not count against `maxAttempts` (a hand-back, a wait,
    /// a claim lost before its attempt was recorded): `attempt_count` goes back by one.
    pub gives_back_attempt: bool,
    /// The attempt a succeeded job's charge names.
    final_attempt: Option<Uuid>,
}

impl Transition {
    fn new(status: JobStatus, event: EventKind, data: Value) -> Self {
        Self {
            status,
            event,
            data,
            result: None,
            error: None,
            next_run_at: None,
            model: None,
            gives_back_attempt: false,
            final_attempt: None,
        }
    }

    /// The job failed with `error`: its event says why.
    fn failed(error: JobError) -> Self {
        let data = json!({"error": {"code": error.code, "message": error.message}});
        Self {
            error: Some(error),
            ..Self::new(JobStatus::Failed, EventKind::Failed, data)
        }
    }

    /// How the job's hold is resolved by this transition, given what its attempts
    /// charged (`spent`, this attempt included); `None` while the job goes on.
    pub fn hold(&self, job_id: Uuid, spent: &Spent) -> Option<Resolution> {
        self.status
            .is_terminal()
            .then(|| resolution(job_id, self.status, self.final_attempt, spent))
    }
}

/// How a terminal job's hold is resolved: charged the sum of its attempts' customer
/// charges (the settlement caps it at the hold), the rest released. A succeeded job is
/// always settled, even for nothing; any other job only when an attempt charged.
/// What the paid calls cost beyond the charge is the operator's (`absorbed`).
pub fn resolution(
    job_id: Uuid,
    status: JobStatus,
    final_attempt: Option<Uuid>,
    spent: &Spent,
) -> Resolution {
    let charged_attempt = match status {
        JobStatus::Succeeded => final_attempt,
        _ if spent.customer_charges.is_positive() => spent.last_charged_attempt,
        _ => None,
    };
    let charged = if charged_attempt.is_some() {
        spent.customer_charges
    } else {
        Credits::ZERO
    };
    Resolution {
        job_id,
        charge: charged_attempt.map(|attempt_id| (attempt_id, spent.customer_charges)),
        absorbed: spent.provider_exposure - charged,
    }
}

/// What becomes of `job` (its locked row, this attempt counted in `attempt_count` and
/// in `spent`) after attempt `number` (`attempt_id`) ended as `report` says and its
/// worker judged `outcome`. The row may have moved since the worker judged: a cancel
/// that landed while the call ran wins over going round again (a job the tenant
/// cancelled is never queued for another, paid, attempt), and the locked row's
/// attempts decide whether the invalid-output retries and the paid calls are spent.
pub fn after_attempt(
    job: &jobs::Model,
    spent: &Spent,
    attempt_id: Uuid,
    number: i32,
    report: &AttemptReport,
    outcome: JobOutcome,
    now: Timestamp,
) -> Transition {
    let goes_on = matches!(
        outcome,
        JobOutcome::Retry { .. } | JobOutcome::HandBack | JobOutcome::Wait { .. }
    );
    let outcome = match outcome {
        _ if goes_on && job.cancel_requested => JobOutcome::Cancelled,
        // A model that keeps answering off-schema is not paid for forever.
        JobOutcome::Retry { .. }
            if report.outcome == AttemptOutcome::InvalidOutput
                && spent.invalid_outputs > INVALID_OUTPUT_RETRIES =>
        {
            JobOutcome::Failed(report.error.clone().unwrap_or_else(|| {
                JobError::new(
                    JobErrorCode::InvalidOutput,
                    "the reply failed the response schema",
                )
            }))
        }
        _ if goes_on && !spent.calls_left(job) => JobOutcome::Failed(paid_call_limit(spent)),
        other => other,
    };
    let error = match &outcome {
        JobOutcome::Failed(error) => Some(error),
        _ => report.error.as_ref(),
    };
    let mut data = attempt_event_data(Some(number), report.outcome, error);
    // The timeline tells why the model's other jobs wait too.
    if let Some(until) = report.model_paused_until {
        data["modelPausedUntil"] = json!(until.to_datetime().to_rfc3339());
    }
    // A wait gives its attempt back even when the job then ends.
    let gives_back_attempt = report.wait || matches!(outcome, JobOutcome::HandBack);
    let mut transition = match outcome {
        JobOutcome::Succeeded { result } => Transition {
            result: Some(result),
            final_attempt: Some(attempt_id),
            ..Transition::new(JobStatus::Succeeded, EventKind::Succeeded, data)
        },
        JobOutcome::Retry { at, model } | JobOutcome::Wait { at, model } => Transition {
            next_run_at: Some(at),
            model,
            ..Transition::new(JobStatus::Queued, EventKind::RetryScheduled, data)
        },
        JobOutcome::HandBack => Transition {
            next_run_at: Some(now),
            ..Transition::new(JobStatus::Queued, EventKind::RetryScheduled, data)
        },
        JobOutcome::Failed(error) => Transition {
            error: Some(error),
            ..Transition::new(JobStatus::Failed, EventKind::Failed, data)
        },
        JobOutcome::Cancelled => Transition::new(JobStatus::Cancelled, EventKind::Cancelled, data),
    };
    transition.gives_back_attempt = gives_back_attempt;
    transition
}

/// What becomes of `job` (its locked row) whose attempt stopped renewing its lease at
/// `now`. `lost_attempt`: the number of the attempt row the claim recorded, if it got
/// that far; a worker that died between its claim and its attempt row sent nothing, and
/// the claim is given back without counting, whatever the retry policy says. Otherwise
/// the lost call may have been billed: the job is queued again only while attempts and
/// paid calls are left and it allows retrying an unknown outcome.
pub fn after_lost_lease(
    job: &jobs::Model,
    spent: &Spent,
    lost_attempt: Option<i32>,
    now: Timestamp,
) -> Transition {
    let event_data = |error: Option<&JobError>| {
        attempt_event_data(lost_attempt, AttemptOutcome::LeaseExpired, error)
    };
    let queued = || Transition {
        gives_back_attempt: lost_attempt.is_none(),
        ..Transition::new(
            JobStatus::Queued,
            EventKind::RetryScheduled,
            event_data(None),
        )
    };
    let failed = |error: JobError| Transition {
        data: event_data(Some(&error)),
        error: Some(error),
        ..Transition::new(JobStatus::Failed, EventKind::Failed, Value::Null)
    };
    let mut transition = if job.cancel_requested {
        Transition::new(JobStatus::Cancelled, EventKind::Cancelled, event_data(None))
    } else if lost_attempt.is_none() {
        queued()
    } else if job.attempt_count >= job.max_attempts {
        failed(JobError::new(
            JobErrorCode::LeaseExpired,
            format!(
                "attempt {} stopped renewing its lease and no attempts are left",
                job.attempt_count
            ),
        ))
    } else if !spent.calls_left(job) {
        failed(paid_call_limit(spent))
    } else if !job.retry_unknown_outcome {
        failed(JobError::new(
            JobErrorCode::OutcomeUnknown,
            "the attempt stopped renewing its lease after its request may have been sent, and the job does not retry unknown outcomes",
        ))
    } else {
        queued()
    };
    // Queued again at once; an ended job's `next_run_at` says when it was taken back.
    transition.next_run_at = Some(now);
    transition
}

/// Whether a job whose lease lapsed has lost its attempt. `provider_batch`: the state
/// of the provider batch its running attempt is in, if it is in one. An item's lease
/// in a provider batch is only the last resort for a row that was lost: while the row
/// still has work, the submitter owns the item and settles it from the provider's
/// results; taking it back would send it again while the provider may still run, and
/// bill, the request it holds.
pub fn lease_is_lost(provider_batch: Option<ProviderBatchState>) -> bool {
    provider_batch.is_none_or(ProviderBatchState::is_final)
}

/// What becomes of a claimed job that cannot be run at all (its stored input is
/// unreadable, its model has no price, the database refuses to record its attempt):
/// failed with `error` before any call. Without this, lease expiry would hand such a
/// job back for ever, uncounted.
pub fn abandoned(error: JobError) -> Transition {
    Transition::failed(error)
}

/// What becomes of a queued job whose deadline passed: waiting for its `runAt`, a
/// retry's backoff or a provider's `Retry-After`, it would never finish in time.
pub fn past_deadline() -> Transition {
    Transition::failed(JobError::new(
        JobErrorCode::DeadlineExceeded,
        "the job's deadline passed before it could finish",
    ))
}

/// What a tenant's cancel does to a job, decided on its locked row: `cancelJob` and a
/// batch's cancel both ask.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Cancel {
    /// Queued (or waiting for a retry): cancelled at once, its hold resolved for what
    /// earlier attempts charged.
    Ends,
    /// Running: marked `cancel_requested`; its worker aborts the call and finishes the
    /// attempt as cancelled.
    Asks,
    /// Finished, or already asked: left as it is.
    Nothing,
}

/// The statuses in which a cancel changes a job (`Ends` or `Asks`): the bulk cancel
/// selects by them.
pub const CANCELLABLE: [JobStatus; 2] = [JobStatus::Queued, JobStatus::Running];

/// What a cancel does to a job in `status`.
pub fn cancel(status: JobStatus, cancel_requested: bool) -> Cancel {
    match status {
        JobStatus::Queued => Cancel::Ends,
        JobStatus::Running if !cancel_requested => Cancel::Asks,
        _ => Cancel::Nothing,
    }
}

impl Cancel {
    /// The event the cancel writes, if it changes the job.
    pub fn event(self) -> Option<EventKind> {
        match self {
            Self::Ends => Some(EventKind::Cancelled),
            Self::Asks => Some(EventKind::CancelRequested),
            Self::Nothing => None,
        }
    }
}

/// The instant by which `job` must have finished. A job without one finished before
/// deadlines were recorded, or was written by a path that sets none: it gets the
/// built-in default from its creation, so that its waits stay bounded.
pub fn deadline_of(job: &jobs::Model) -> Timestamp {
    job.deadline
        .unwrap_or_else(|| Deadline::After(DEFAULT_DEADLINE).instant(job.created_at))
}

/// When and on which model a job whose attempt did not settle it runs again, as its
/// worker judges the attempt's end: the [`JobOutcome`]s that depend on the job's
/// attempts, its retry policy, its model chain, the models' pauses and its deadline.
#[derive(Clone, Copy, Debug)]
pub struct Schedule<'a> {
    /// The job as claimed.
    pub job: &'a jobs::Model,
    /// The attempt that just ended.
    pub attempt_number: i32,
    /// The job's models, its own first.
    pub chain: &'a ModelChain,
    /// The pauses in force on the chain's models when the call ended (model, until).
    pub pauses: &'a [(String, Timestamp)],
    /// When the call ended: what a backoff counts from.
    pub ended_at: Timestamp,
    /// Where a retry's backoff lands within its jitter, from 0 (the shortest) to 1
    /// ([`crate::backoff::draw`]).
    pub jitter: f64,
}

impl Schedule<'_> {
    /// Queued again (see [`Self::again`]) while attempts are left and the retry comes
    /// before the deadline; failed with `error` otherwise.
    fn retry_or_fail(&self, error: JobError, retry_after: Option<Duration>) -> JobOutcome {
        if self.job.attempt_count < self.job.max_attempts {
            self.again(retry_after, None, |at, model| JobOutcome::Retry {
                at,
                model,
            })
        } else {
            JobOutcome::Failed(error)
        }
    }

    /// After a call the provider refused without doing any work (a 429, a 503 or 529
    /// with `Retry-After`, a connection refused before the request was sent): a wait
    /// that spends neither an attempt nor a paid call, bounded by the job's deadline
    /// alone. `paused_until`: the pause the refusal put on the model.
    fn wait(&self, retry_after: Option<Duration>, paused_until: Option<Timestamp>) -> JobOutcome {
        self.again(retry_after, paused_until, |at, model| JobOutcome::Wait {
            at,
            model,
        })
    }

    /// A call sent whose outcome is unknown (`error` says how): it may have been
    /// billed, so the job is retried only if it allows paying twice.
    fn unknown_outcome(&self, error: JobError) -> JobOutcome {
        if self.job.retry_unknown_outcome {
            self.retry_or_fail(error, None)
        } else {
            JobOutcome::Failed(error)
        }
    }

    /// A call aborted at shutdown after it was sent: it may be billed, and sending it
    /// again is a retry of an unknown outcome like any other, handed back at once. The
    /// first few such hand-backs of a job count apart from its paid calls
    /// (`budget::FREE_HAND_BACKS`): a rolling restart is the operator's.
    fn aborted_in_flight(&self) -> JobOutcome {
        if self.job.retry_unknown_outcome {
            JobOutcome::HandBack
        } else {
            JobOutcome::Failed(JobError::new(
                JobErrorCode::OutcomeUnknown,
                "the worker shut down during the call, and the job does not retry unknown outcomes",
            ))
        }
    }

    /// `next` on the chain's next model ([`ModelChain::next`]) at once, or when its
    /// pause ends if every model is paused; on the same model at the end of the backoff
    /// (or the longer `Retry-After`). Failed `DEADLINE_EXCEEDED` at once when that is
    /// not before the deadline, since the job could not run again in time and its hold
    /// would only sit until then.
    fn again(
        &self,
        retry_after: Option<Duration>,
        paused_until: Option<Timestamp>,
        next: impl FnOnce(Timestamp, Option<String>) -> JobOutcome,
    ) -> JobOutcome {
        let current = &self.job.model;
        let mut paused = self.pauses.to_vec();
        paused.extend(paused_until.map(|until| (current.clone(), until)));
        let (at, model) = match self.chain.next(current, &paused, self.ended_at) {
            Some(other) => (
                other.paused_until.unwrap_or(self.ended_at),
                Some(other.model),
            ),
            None => {
                let delay = retry_delay(self.attempt_number, retry_after, self.jitter);
                (
                    self.ended_at
                        .plus(chrono::Duration::from_std(delay).unwrap_or(chrono::Duration::MAX)),
                    None,
                )
            }
        };
        if at < deadline_of(self.job) {
            next(at, model)
        } else {
            JobOutcome::Failed(JobError::new(
                JobErrorCode::DeadlineExceeded,
                "the provider could not take the call before the job's deadline",
            ))
        }
    }
}

/// The wait before retry `attempt + 1`: [`RETRY_BACKOFF`], placed within its jitter by
/// `jitter`; a longer `Retry-After` wins, up to [`RETRY_AFTER_CAP`].
fn retry_delay(attempt: i32, retry_after: Option<Duration>, jitter: f64) -> Duration {
    let backoff = RETRY_BACKOFF.at(u32::try_from(attempt).unwrap_or(0), jitter);
    match retry_after {
        Some(wanted) => backoff.max(wanted.min(RETRY_AFTER_CAP)),
        None => backoff,
    }
}

/// The error of a job whose budget of paid calls is spent.
fn paid_call_limit(spent: &Spent) -> JobError {
    JobError::new(
        JobErrorCode::PaidCallLimit,
        format!(
            "the job made {} provider calls that may have been billed, as many as it may pay for",
            spent.paid_calls
        ),
    )
}

/// What an event about an attempt's end says: which attempt, how it ended, and why.
fn attempt_event_data(
    number: Option<i32>,
    outcome: AttemptOutcome,
    error: Option<&JobError>,
) -> Value {
    json!({
        "attempt": number,
        "outcome": outcome,
        "error": error.map(|error| json!({"code": error.code, "message": error.message})),
    })
}
