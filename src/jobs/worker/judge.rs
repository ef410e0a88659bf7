//! Judging an attempt's end: what the attempt row records, what the customer is
//! charged by the charging policy, and what becomes of the job.

use crate::billing::{AttemptEnding, CallBound, ChargingPolicy, ModelPrice};
use crate::jobs::fallbacks::ModelChain;
use crate::jobs::flow;
use crate::jobs::input::{DEFAULT_DEADLINE, Deadline, JobInput};
use crate::jobs::queue::{AttemptReport, Claim, JobError, JobErrorCode, JobOutcome};
use crate::llm::TokenUsage;
use crate::llm::{Completion, ProviderError};
use entity::{AttemptOutcome, Timestamp, attempts, jobs};
use rand::Rng;
use std::time::Duration;

/// First retry delay; each further retry doubles it.
const BACKOFF_BASE: Duration = Duration::from_secs(2);
/// Longest delay between retries.
const BACKOFF_CAP: Duration = Duration::from_secs(60);
/// Longest `Retry-After` honoured; a provider asking for more is treated as this.
const RETRY_AFTER_CAP: Duration = Duration::from_secs(600);
/// How the wait for the provider ended.
#[derive(Debug)]
pub(super) enum CallEnd {
    Answered(Result<Completion, ProviderError>),
    TimedOut,
    Cancelled,
    /// Cancel was requested before the call was made; it never was.
    CancelledBeforeSending,
    /// The job has no paid call left; the call was not made.
    BudgetSpent,
    /// No provider of this process serves the model; the call was not made.
    NotServed,
    LeaseLost,
    /// The job's deadline came while the call ran; it was abandoned.
    PastDeadline,
    /// The job's deadline had passed before the call was made; it never was.
    PastDeadlineBeforeSending,
    /// The worker is shutting down and the grace period is over.
    Aborted,
    /// The grace period was over before the call was made; it never was.
    AbortedBeforeSending,
}

impl CallEnd {
    /// Whether the request left for the provider (which may then count it against
    /// its limits, answered or not).
    pub(super) fn was_sent(&self) -> bool {
        match self {
            Self::Answered(Err(ProviderError::NotSent { .. }))
            | Self::CancelledBeforeSending
            | Self::BudgetSpent
            | Self::NotServed
            | Self::PastDeadlineBeforeSending
            | Self::AbortedBeforeSending => false,
            Self::Answered(_)
            | Self::TimedOut
            | Self::Cancelled
            | Self::PastDeadline
            | Self::LeaseLost
            | Self::Aborted => true,
        }
    }
}

/// What an attempt's end is judged with besides the attempt itself.
pub(super) struct CallContext<'a> {
    pub(super) input: &'a JobInput,
    /// The job's models, its own first.
    pub(super) chain: &'a ModelChain,
    /// The pauses in force on the chain's models when the call ended (model, until).
    pub(super) pauses: &'a [(String, Timestamp)],
    pub(super) charging: ChargingPolicy,
    pub(super) latency: Duration,
    pub(super) ended_at: Timestamp,
    /// Bytes of reply text streamed to subscribers before the call ended.
    pub(super) streamed_bytes: u64,
}

impl<'a> CallContext<'a> {
    /// The facts of one attempt of the job, to judge its end.
    pub(super) fn facts<'b>(
        &'b self,
        claim: &'b Claim,
        attempt: &'b attempts::Model,
        price: &'b ModelPrice,
    ) -> CallFacts<'b>
    where
        'a: 'b,
    {
        CallFacts {
            claim,
            attempt,
            price,
            input: self.input,
            chain: self.chain,
            pauses: self.pauses,
            bound: self.input.call_bound(),
            charging: self.charging,
            latency: self.latency,
            ended_at: self.ended_at,
            streamed_bytes: self.streamed_bytes,
        }
    }
}

/// What an attempt's end is judged with.
pub(super) struct CallFacts<'a> {
    claim: &'a Claim,
    attempt: &'a attempts::Model,
    price: &'a ModelPrice,
    input: &'a JobInput,
    chain: &'a ModelChain,
    pauses: &'a [(String, Timestamp)],
    bound: CallBound,
    charging: ChargingPolicy,
    latency: Duration,
    ended_at: Timestamp,
    /// Bytes of reply text streamed to subscribers before the call ended.
    streamed_bytes: u64,
}

impl CallFacts<'_> {
    /// The attempt row's report: the customer charge follows from how the call ended,
    /// the charging policy, and the output it streamed.
    fn report(
        &self,
        outcome: AttemptOutcome,
        usage: Option<TokenUsage>,
        ending: AttemptEnding,
        error: Option<JobError>,
        provider_request_id: Option<String>,
    ) -> AttemptReport {
        // What produced the streamed output: counted exactly when the provider reported
        // usage, and estimated from the prompt and the text when the call ended first.
        let delivered = (self.streamed_bytes > 0).then(|| match &usage {
            Some(usage) => *usage,
            None => self.bound.estimated_delivery(self.streamed_bytes),
        });
        AttemptReport {
            outcome,
            usage,
            not_billed: ending == AttemptEnding::NotBilled,
            customer_charge: self.charging.customer_charge(
                self.price,
                self.bound,
                ending,
                delivered.as_ref(),
            ),
            delivered_output_tokens: delivered.map(|usage| usage.output_tokens),
            error,
            provider_request_id,
            latency: self.latency,
            ended_at: self.ended_at,
            model_paused_until: None,
            wait: false,
        }
    }

    /// Queued again (see [`Self::again`]) while attempts are left and the retry comes
    /// before the deadline; failed otherwise.
    fn retry_or_fail(&self, error: JobError, retry_after: Option<Duration>) -> JobOutcome {
        let job = &self.claim.job;
        if job.attempt_count < job.max_attempts {
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
        let current = &self.claim.job.model;
        let mut paused = self.pauses.to_vec();
        paused.extend(paused_until.map(|until| (current.clone(), until)));
        let (at, model) = match self.chain.next(current, &paused, self.ended_at) {
            Some(other) => (
                other.paused_until.unwrap_or(self.ended_at),
                Some(other.model),
            ),
            None => (
                self.ended_at.plus(
                    chrono::Duration::from_std(retry_delay(self.attempt.number, retry_after))
                        .unwrap_or(chrono::Duration::MAX),
                ),
                None,
            ),
        };
        if at < deadline_of(&self.claim.job) {
            next(at, model)
        } else {
            JobOutcome::Failed(JobError::new(
                JobErrorCode::DeadlineExceeded,
                "the provider could not take the call before the job's deadline",
            ))
        }
    }

    /// Decides what an attempt's end means for the attempt row and for the job.
    pub(super) fn judge(&self, end: CallEnd) -> (AttemptReport, JobOutcome) {
        let not_sent = |code, message: &str| {
            let error = JobError::new(code, message);
            (
                self.report(
                    AttemptOutcome::PermanentError,
                    None,
                    AttemptEnding::NotBilled,
                    Some(error.clone()),
                    None,
                ),
                JobOutcome::Failed(error),
            )
        };
        match end {
            CallEnd::Answered(Ok(completion)) => self.answered(completion),
            CallEnd::Answered(Err(error)) => self.refused(error),
            CallEnd::TimedOut => self.unknown_outcome(format!(
                "no answer within the attempt timeout of {} s",
                self.latency.as_secs()
            )),
            CallEnd::Cancelled => {
                let error = JobError::new(
                    JobErrorCode::Cancelled,
                    "cancelled while the provider call was running",
                );
                (
                    self.report(
                        AttemptOutcome::Cancelled,
                        None,
                        AttemptEnding::CancelledDuringCall,
                        Some(error),
                        None,
                    ),
                    JobOutcome::Cancelled,
                )
            }
            CallEnd::CancelledBeforeSending => {
                let error = JobError::new(
                    JobErrorCode::Cancelled,
                    "cancelled before the provider was called",
                );
                (
                    self.report(
                        AttemptOutcome::Cancelled,
                        None,
                        AttemptEnding::NotBilled,
                        Some(error),
                        None,
                    ),
                    JobOutcome::Cancelled,
                )
            }
            CallEnd::PastDeadline => {
                let error = JobError::new(
                    JobErrorCode::DeadlineExceeded,
                    "the job's deadline passed while the provider call was running",
                );
                (
                    self.report(
                        AttemptOutcome::Cancelled,
                        None,
                        AttemptEnding::CancelledDuringCall,
                        Some(error.clone()),
                        None,
                    ),
                    JobOutcome::Failed(error),
                )
            }
            CallEnd::PastDeadlineBeforeSending => {
                let error = JobError::new(
                    JobErrorCode::DeadlineExceeded,
                    "the job's deadline passed before the provider was called",
                );
                (
                    self.report(
                        AttemptOutcome::Cancelled,
                        None,
                        AttemptEnding::NotBilled,
                        Some(error.clone()),
                        None,
                    ),
                    JobOutcome::Failed(error),
                )
            }
            CallEnd::BudgetSpent => not_sent(
                JobErrorCode::PaidCallLimit,
                "not sent: the job already made as many provider calls that may have been billed as it may pay for",
            ),
            CallEnd::NotServed => not_sent(
                JobErrorCode::ModelNotServed,
                "not sent: no configured provider serves this model",
            ),
            CallEnd::AbortedBeforeSending => {
                // Nothing was sent: the job goes back as if never claimed, and the
                // row, not billed, spends nothing.
                let error = JobError::new(
                    JobErrorCode::WorkerShutdown,
                    "not sent: the worker shut down before the call",
                );
                (
                    self.report(
                        AttemptOutcome::RetryableError,
                        None,
                        AttemptEnding::NotBilled,
                        Some(error),
                        None,
                    ),
                    JobOutcome::HandBack,
                )
            }
            CallEnd::Aborted => {
                // The request was in flight: it may be billed, so its bound stays, and
                // sending it again is a retry of an unknown outcome like any other. The
                // first few such hand-backs of a job count apart from its paid calls
                // (`budget::FREE_HAND_BACKS`): a rolling restart is the operator's.
                let error = JobError::new(
                    JobErrorCode::WorkerShutdown,
                    "the worker shut down during the call",
                );
                let outcome = if self.claim.job.retry_unknown_outcome {
                    JobOutcome::HandBack
                } else {
                    JobOutcome::Failed(JobError::new(
                        JobErrorCode::OutcomeUnknown,
                        "the worker shut down during the call, and the job does not retry unknown outcomes",
                    ))
                };
                let report = self.report(
                    AttemptOutcome::Unknown,
                    None,
                    AttemptEnding::ShutDown,
                    Some(error),
                    None,
                );
                (report, outcome)
            }
            CallEnd::LeaseLost => unreachable!("a lost lease is handled before judging"),
        }
    }

    fn answered(&self, mut completion: Completion) -> (AttemptReport, JobOutcome) {
        let within_bound = self.bound.limit(completion.usage);
        if within_bound != completion.usage {
            tracing::error!(
                job.id = %self.claim.job.id, model = %self.claim.job.model,
                reported = ?completion.usage, recorded = ?within_bound,
                "the provider reported more tokens than the request could use; recorded at the bound"
            );
            completion.usage = within_bound;
        }
        let request_id = completion.request_id.clone();
        match accept(&completion, self.input) {
            Ok(result) => (
                self.report(
                    AttemptOutcome::Succeeded,
                    Some(completion.usage),
                    AttemptEnding::Accepted(completion.usage),
                    None,
                    request_id,
                ),
                JobOutcome::Succeeded { result },
            ),
            Err(error) => (
                self.report(
                    AttemptOutcome::InvalidOutput,
                    Some(completion.usage),
                    AttemptEnding::Rejected,
                    Some(error.clone()),
                    request_id,
                ),
                // The finish fails it instead once its invalid-output retries are spent.
                self.retry_or_fail(error, None),
            ),
        }
    }

    fn refused(&self, error: ProviderError) -> (AttemptReport, JobOutcome) {
        let request_id = error.request_id().map(str::to_owned);
        let failed = |outcome, error: JobError, request_id| {
            self.report(
                outcome,
                None,
                AttemptEnding::NotBilled,
                Some(error),
                request_id,
            )
        };
        match error {
            ProviderError::NotSent { message } => {
                let error = JobError::new(JobErrorCode::ProviderUnavailable, message);
                let mut report = failed(AttemptOutcome::RetryableError, error, None);
                report.wait = true;
                (report, self.wait(None, None))
            }
            ProviderError::Transient {
                status,
                message,
                retry_after,
                ..
            } => {
                let error = JobError::new(
                    JobErrorCode::ProviderUnavailable,
                    format!("provider answered {status}: {message}"),
                );
                let mut report = failed(AttemptOutcome::RetryableError, error.clone(), request_id);
                // A rate limit is the provider's, not this job's: every worker holds
                // off the model, not only this job's retry. The provider did no work
                // and billed nothing, so the job waits instead of spending an attempt.
                if flow::pauses_model(status, retry_after) {
                    let until = flow::paused_until(self.ended_at, retry_after);
                    report.model_paused_until = Some(until);
                    report.wait = true;
                    (report, self.wait(retry_after, Some(until)))
                } else {
                    (report, self.retry_or_fail(error, retry_after))
                }
            }
            ProviderError::Permanent {
                status, message, ..
            } => {
                let message = tenant_message(self.claim, status, message);
                let error = JobError::new(
                    JobErrorCode::ProviderRejected,
                    format!("provider refused the request with {status}: {message}"),
                );
                (
                    failed(AttemptOutcome::PermanentError, error.clone(), request_id),
                    JobOutcome::Failed(error),
                )
            }
            ProviderError::OutcomeUnknown { message } => self.unknown_outcome(message),
        }
    }

    /// The request may have been billed: the cost stays a bound, and the job is retried
    /// only if it allows paying twice.
    fn unknown_outcome(&self, message: String) -> (AttemptReport, JobOutcome) {
        let error = JobError::new(JobErrorCode::OutcomeUnknown, message);
        let outcome = if self.claim.job.retry_unknown_outcome {
            self.retry_or_fail(error.clone(), None)
        } else {
            JobOutcome::Failed(error.clone())
        };
        (self.unknown_report(error), outcome)
    }

    /// The report of a call sent whose outcome is unknown: no usage, the bound stands.
    fn unknown_report(&self, error: JobError) -> AttemptReport {
        self.report(
            AttemptOutcome::Unknown,
            None,
            AttemptEnding::Unknown,
            Some(error),
            None,
        )
    }

    /// The report and outcome to record when the database refused `refused`: the call
    /// with its usage and exact cost (so the bill is explained) and the job failed —
    /// whatever the answer was, it could not be kept.
    pub(super) fn not_stored(&self, refused: AttemptReport) -> (AttemptReport, JobOutcome) {
        let error = JobError::new(
            JobErrorCode::ResultNotStored,
            format!(
                "the outcome of attempt {} could not be stored; the call is recorded with its usage",
                self.attempt.number
            ),
        );
        let ending = if refused.not_billed {
            AttemptEnding::NotBilled
        } else {
            AttemptEnding::Rejected
        };
        let report = self.report(
            AttemptOutcome::PermanentError,
            refused.usage,
            ending,
            Some(error.clone()),
            refused.provider_request_id,
        );
        (report, JobOutcome::Failed(error))
    }
}

/// Judges one request of a provider batch as a call of the worker is judged: `answer`
/// is the completion or the provider's error its result line carried; a request the
/// provider never ran (expired, cancelled, missing from the results) comes as
/// [`ProviderError::NotSent`], a wait that spends no attempt. `latency`: from the
/// upload to the batch's end.
#[allow(clippy::too_many_arguments)]
pub fn judge_batch_request(
    claim: &Claim,
    attempt: &attempts::Model,
    price: &ModelPrice,
    input: &JobInput,
    charging: ChargingPolicy,
    latency: Duration,
    ended_at: Timestamp,
    answer: Result<Completion, ProviderError>,
) -> (AttemptReport, JobOutcome) {
    let chain = ModelChain::of_job(&claim.job);
    let context = CallContext {
        input,
        chain: &chain,
        pauses: &[],
        charging,
        latency,
        ended_at,
        streamed_bytes: 0,
    };
    context
        .facts(claim, attempt, price)
        .judge(CallEnd::Answered(answer))
}

/// The instant by which `job` must have finished. A job without one finished before
/// deadlines were recorded, or was written by a path that sets none: it gets the
/// built-in default from its creation, so that its waits stay bounded.
pub(super) fn deadline_of(job: &jobs::Model) -> Timestamp {
    job.deadline
        .unwrap_or_else(|| Deadline::After(DEFAULT_DEADLINE).instant(job.created_at))
}

/// What a tenant may read of a provider's refusal. Authentication and configuration
/// errors (401, 403, 404) are the operator's to fix and their text can carry a
/// fragment of our key or our account: the operator finds it in the log instead.
fn tenant_message(claim: &Claim, status: u16, message: String) -> String {
    if matches!(status, 401 | 403 | 404) {
        tracing::error!(
            job.id = %claim.job.id, model = %claim.job.model, status, provider_message = %message,
            "the provider refused our credentials or configuration"
        );
        "the provider refused the service's credentials or configuration; the operator has the details".to_owned()
    } else {
        message
    }
}

/// The job's result from a reply: the parsed JSON when the job has a response schema,
/// the text otherwise.
fn accept(completion: &Completion, input: &JobInput) -> Result<serde_json::Value, JobError> {
    let Some(schema) = &input.response_schema else {
        return Ok(serde_json::Value::String(completion.text.clone()));
    };
    // The tenant is told that the reply failed, and nothing of how: an answer it is
    // not charged for must not leave through the error. Every detail depends on the
    // reply — an instance path carries its keys and positions, a count its size, the
    // parser's position or fault kind where it broke — and even the schema paths that
    // fail do: a schema of `allOf: [{not: {pattern: "^.{p}c"}}, …]` fails exactly the
    // branches that spell the reply, character by character. So both texts are fixed.
    let invalid = |message: &str| JobError::new(JobErrorCode::InvalidOutput, message);
    let value: serde_json::Value =
        serde_json::from_str(strip_code_fence(&completion.text)).map_err(|_| invalid(NOT_JSON))?;
    // The schema compiled when the job was created; it still does.
    let validator = jsonschema::validator_for(schema)
        .map_err(|error| invalid(&format!("the response schema does not compile: {error}")))?;
    if validator.is_valid(&value) {
        Ok(value)
    } else {
        Err(invalid(SCHEMA_MISMATCH))
    }
}

/// What the tenant reads of a reply that is not JSON, whatever the reply.
const NOT_JSON: &str = "the reply is not JSON";
/// What the tenant reads of a reply that fails its response schema, whatever failed.
const SCHEMA_MISMATCH: &str = "the reply does not match the response schema";

/// Models asked for JSON often wrap it in a Markdown code fence anyway.
fn strip_code_fence(text: &str) -> &str {
    let trimmed = text.trim();
    let Some(inner) = trimmed.strip_prefix("```") else {
        return trimmed;
    };
    let inner = inner.trim_end().strip_suffix("```").unwrap_or(inner);
    // Drop the info string (`json`) after the opening fence.
    inner
        .trim_start_matches(|c: char| c.is_ascii_alphanumeric())
        .trim()
}

/// The wait before retry `attempt + 1`: exponential backoff from 2 s doubling to a
/// 60 s cap, with "equal jitter" (uniform between half and all of it) so that jobs
/// failing together do not retry together; a longer `Retry-After` wins.
fn retry_delay(attempt: i32, retry_after: Option<Duration>) -> Duration {
    let exponent = u32::try_from(attempt.saturating_sub(1))
        .unwrap_or(0)
        .min(16);
    let backoff = BACKOFF_BASE.saturating_mul(1 << exponent).min(BACKOFF_CAP);
    let jittered = rand::rng().random_range(backoff / 2..=backoff);
    match retry_after {
        Some(wanted) => jittered.max(wanted.min(RETRY_AFTER_CAP)),
        None => jittered,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backoff_doubles_with_jitter_and_stops_at_the_cap() {
        for _ in 0..100 {
            let first = retry_delay(1, None);
            assert!(first >= Duration::from_secs(1) && first <= Duration::from_secs(2));
            let third = retry_delay(3, None);
            assert!(third >= Duration::from_secs(4) && third <= Duration::from_secs(8));
            let late = retry_delay(30, None);
            assert!(late >= Duration::from_secs(30) && late <= BACKOFF_CAP);
        }
    }

    #[test]
    fn code_fences_around_json_are_ignored() {
        assert_eq!(strip_code_fence("```json\n{\"a\": 1}\n```"), "{\"a\": 1}");
        assert_eq!(strip_code_fence("  {\"a\": 1} "), "{\"a\": 1}");
        assert_eq!(strip_code_fence("```\n[1]\n```"), "[1]");
        assert_eq!(strip_code_fence("```json {\"a\": 1}```"), "{\"a\": 1}");
    }

    #[test]
    fn a_longer_retry_after_wins_and_is_capped() {
        assert_eq!(
            retry_delay(1, Some(Duration::from_secs(30))),
            Duration::from_secs(30)
        );
        assert_eq!(
            retry_delay(1, Some(Duration::from_secs(86_400))),
            RETRY_AFTER_CAP
        );
    }
}
