//! Judging an attempt's end: what the attempt row records, what the customer is
//! charged by the charging policy, and — through [`Schedule`], where a job's fate is
//! decided — what becomes of the job.

use crate::backoff;
use crate::billing::{AttemptEnding, CallBound, ChargingPolicy, ModelPrice};
use crate::jobs::budget::Refusal;
use crate::jobs::fallbacks::ModelChain;
use crate::jobs::flow;
use crate::jobs::input::JobInput;
use crate::jobs::lifecycle::{AttemptReport, JobError, JobOutcome};
use crate::jobs::lifecycle::{CallEnding, Schedule};
use crate::jobs::queue::Claim;
use crate::llm::TokenUsage;
use crate::llm::{Completion, ProviderError};
use entity::JobErrorCode;
use entity::{AttemptOutcome, Timestamp, attempts};
use std::time::Duration;

/// How the wait for the provider ended, when the attempt still owns its job (a lost
/// lease is [`super::attempt::LeaseLost`], and nothing is judged).
#[derive(Debug)]
pub enum CallEnd {
    Answered(Result<Completion, ProviderError>),
    TimedOut,
    Cancelled,
    /// Cancel was requested before the call was made; it never was.
    CancelledBeforeSending,
    /// The job's budget refused the call, for the reason given; it was not made.
    BudgetSpent(Refusal),
    /// No provider of this process serves the model; the call was not made.
    NotServed,
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
            | Self::BudgetSpent(_)
            | Self::NotServed
            | Self::PastDeadlineBeforeSending
            | Self::AbortedBeforeSending => false,
            Self::Answered(_)
            | Self::TimedOut
            | Self::Cancelled
            | Self::PastDeadline
            | Self::Aborted => true,
        }
    }
}

/// What an attempt's end is judged with: the attempt, its job and the call.
pub(super) struct CallFacts<'a> {
    pub(super) claim: &'a Claim,
    pub(super) attempt: &'a attempts::Model,
    pub(super) price: &'a ModelPrice,
    pub(super) input: &'a JobInput,
    /// The call's bound, its prompt counted by the provider's rule.
    pub(super) bound: CallBound,
    /// The job's models, its own first.
    pub(super) chain: &'a ModelChain,
    /// The pauses in force on the chain's models when the call ended (model, until).
    pub(super) pauses: &'a [(String, Timestamp)],
    pub(super) charging: ChargingPolicy,
    pub(super) latency: Duration,
    pub(super) ended_at: Timestamp,
    /// Bytes of reply text streamed to subscribers before the call ended.
    pub(super) streamed_bytes: u64,
    /// A request of a provider batch rather than a realtime call. Its 429 is its own
    /// refusal, not the model's rate: it spends an attempt (so that one the provider
    /// keeps refusing fails by `maxAttempts` instead of going out in batch after batch
    /// for ever) and pauses nobody. Its unknown outcome is never sent again.
    pub(super) in_provider_batch: bool,
}

/// What the attempt row records of a call, before the customer charge that follows
/// from it.
struct CallRecord {
    outcome: AttemptOutcome,
    /// How the call ended for the charging policy.
    ending: AttemptEnding,
    usage: Option<TokenUsage>,
    error: Option<JobError>,
    provider_request_id: Option<String>,
}

impl CallRecord {
    /// A call that ended as `outcome`, charged as `ending`: no usage, no error, no
    /// request id until told.
    fn new(outcome: AttemptOutcome, ending: AttemptEnding) -> Self {
        Self {
            outcome,
            ending,
            usage: None,
            error: None,
            provider_request_id: None,
        }
    }

    fn error(self, error: JobError) -> Self {
        Self {
            error: Some(error),
            ..self
        }
    }

    fn usage(self, usage: Option<TokenUsage>) -> Self {
        Self { usage, ..self }
    }

    fn request_id(self, provider_request_id: Option<String>) -> Self {
        Self {
            provider_request_id,
            ..self
        }
    }
}

impl CallFacts<'_> {
    fn bound(&self) -> CallBound {
        self.bound
    }

    /// When and where the job runs again, should the call's end let it.
    fn schedule(&self) -> Schedule<'_> {
        Schedule {
            job: &self.claim.job,
            attempt_number: self.attempt.number,
            chain: self.chain,
            pauses: self.pauses,
            ended_at: self.ended_at,
            jitter: backoff::draw(),
        }
    }

    /// The attempt row's report: the customer charge follows from how the call ended,
    /// the charging policy, and the output it streamed.
    fn report(&self, record: CallRecord) -> AttemptReport {
        let bound = self.bound();
        // What produced the streamed output: counted exactly when the provider reported
        // usage, and estimated from the prompt and the text when the call ended first.
        let delivered = (self.streamed_bytes > 0).then(|| match &record.usage {
            Some(usage) => *usage,
            None => bound.estimated_delivery(self.streamed_bytes),
        });
        AttemptReport {
            outcome: record.outcome,
            usage: record.usage,
            not_billed: record.ending == AttemptEnding::NotBilled,
            customer_charge: self.charging.customer_charge(
                self.price,
                bound,
                record.ending,
                delivered.as_ref(),
            ),
            delivered_output_tokens: delivered.map(|usage| usage.output_tokens),
            error: record.error,
            provider_request_id: record.provider_request_id,
            latency: self.latency,
            ended_at: self.ended_at,
            model_paused_until: None,
            wait: false,
        }
    }

    /// Decides what an attempt's end means for the attempt row, and names how the call
    /// ended for [`Schedule::after_call`], which decides what becomes of the job.
    pub(super) fn judge(&self, end: CallEnd) -> (AttemptReport, JobOutcome) {
        let (report, ending) = self.record(end);
        (report, self.schedule().after_call(ending))
    }

    fn record(&self, end: CallEnd) -> (AttemptReport, CallEnding) {
        // A call that ends the job with `error`, recorded as `outcome`.
        let ends_job = |outcome, charged, error: JobError, ending: fn(JobError) -> CallEnding| {
            let report = self.report(CallRecord::new(outcome, charged).error(error.clone()));
            (report, ending(error))
        };
        let cancelled = |charged, message: &str| {
            let error = JobError::new(JobErrorCode::Cancelled, message);
            let record = CallRecord::new(AttemptOutcome::Cancelled, charged).error(error);
            (self.report(record), CallEnding::Cancelled)
        };
        match end {
            CallEnd::Answered(Ok(completion)) => self.answered(completion),
            CallEnd::Answered(Err(error)) => self.refused(error),
            CallEnd::TimedOut => self.unknown_outcome(format!(
                "no answer within the attempt timeout of {} s",
                self.latency.as_secs()
            )),
            CallEnd::Cancelled => cancelled(
                AttemptEnding::CancelledDuringCall,
                "cancelled while the provider call was running",
            ),
            CallEnd::CancelledBeforeSending => cancelled(
                AttemptEnding::NotBilled,
                "cancelled before the provider was called",
            ),
            CallEnd::PastDeadline => ends_job(
                AttemptOutcome::Cancelled,
                AttemptEnding::CancelledDuringCall,
                JobError::new(
                    JobErrorCode::DeadlineExceeded,
                    "the job's deadline passed while the provider call was running",
                ),
                CallEnding::PastDeadline,
            ),
            CallEnd::PastDeadlineBeforeSending => ends_job(
                AttemptOutcome::Cancelled,
                AttemptEnding::NotBilled,
                JobError::new(
                    JobErrorCode::DeadlineExceeded,
                    "the job's deadline passed before the provider was called",
                ),
                CallEnding::PastDeadline,
            ),
            CallEnd::BudgetSpent(refusal) => ends_job(
                AttemptOutcome::PermanentError,
                AttemptEnding::NotBilled,
                JobError::new(JobErrorCode::PaidCallLimit, refusal_message(refusal)),
                CallEnding::NotMade,
            ),
            CallEnd::NotServed => ends_job(
                AttemptOutcome::PermanentError,
                AttemptEnding::NotBilled,
                JobError::new(
                    JobErrorCode::ModelNotServed,
                    "not sent: no configured provider serves this model",
                ),
                CallEnding::NotMade,
            ),
            CallEnd::AbortedBeforeSending => {
                // Nothing was sent: the row, not billed, spends nothing.
                let error = JobError::new(
                    JobErrorCode::WorkerShutdown,
                    "not sent: the worker shut down before the call",
                );
                let record =
                    CallRecord::new(AttemptOutcome::RetryableError, AttemptEnding::NotBilled)
                        .error(error);
                (self.report(record), CallEnding::ShutDownBeforeSending)
            }
            CallEnd::Aborted => {
                // The request was in flight: it may be billed, so its bound stays.
                let error = JobError::new(
                    JobErrorCode::WorkerShutdown,
                    "the worker shut down during the call",
                );
                let record =
                    CallRecord::new(AttemptOutcome::Unknown, AttemptEnding::ShutDown).error(error);
                (self.report(record), CallEnding::ShutDownInFlight)
            }
        }
    }

    fn answered(&self, mut completion: Completion) -> (AttemptReport, CallEnding) {
        let within_bound = self.bound().limit(completion.usage);
        if within_bound != completion.usage {
            tracing::error!(
                job.id = %self.claim.job.id, model = %self.claim.job.model,
                reported = ?completion.usage, recorded = ?within_bound,
                "the provider reported more tokens than the request could use; recorded at the bound"
            );
            completion.usage = within_bound;
        }
        let usage = completion.usage;
        let request_id = completion.request_id.clone();
        match accept(&completion, self.input) {
            Ok(result) => (
                self.report(
                    CallRecord::new(AttemptOutcome::Succeeded, AttemptEnding::Accepted(usage))
                        .usage(Some(usage))
                        .request_id(request_id),
                ),
                CallEnding::Accepted(result),
            ),
            Err(error) => (
                self.report(
                    CallRecord::new(AttemptOutcome::InvalidOutput, AttemptEnding::Rejected)
                        .usage(Some(usage))
                        .error(error.clone())
                        .request_id(request_id),
                ),
                CallEnding::InvalidOutput(error),
            ),
        }
    }

    fn refused(&self, error: ProviderError) -> (AttemptReport, CallEnding) {
        let request_id = error.request_id().map(str::to_owned);
        let failed = |outcome, error: JobError, request_id| {
            self.report(
                CallRecord::new(outcome, AttemptEnding::NotBilled)
                    .error(error)
                    .request_id(request_id),
            )
        };
        match error {
            ProviderError::NotSent { message } => {
                let error = JobError::new(JobErrorCode::ProviderUnavailable, message);
                let mut report = failed(AttemptOutcome::RetryableError, error, None);
                report.wait = true;
                (report, CallEnding::NotSent)
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
                if !self.in_provider_batch && flow::pauses_model(status, retry_after) {
                    let until = flow::paused_until(self.ended_at, retry_after);
                    report.model_paused_until = Some(until);
                    report.wait = true;
                    (report, CallEnding::ModelPaused { retry_after, until })
                } else {
                    (report, CallEnding::Retryable { error, retry_after })
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
                    CallEnding::Rejected(error),
                )
            }
            ProviderError::OutcomeUnknown { message } => self.unknown_outcome(message),
        }
    }

    /// The request may have been billed: no usage, and the cost bound stands.
    fn unknown_outcome(&self, message: String) -> (AttemptReport, CallEnding) {
        let error = JobError::new(JobErrorCode::OutcomeUnknown, message);
        let record =
            CallRecord::new(AttemptOutcome::Unknown, AttemptEnding::Unknown).error(error.clone());
        let ending = if self.in_provider_batch {
            CallEnding::UnknownInProviderBatch(error)
        } else {
            CallEnding::Unknown(error)
        };
        (self.report(record), ending)
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
            CallRecord::new(AttemptOutcome::PermanentError, ending)
                .usage(refused.usage)
                .error(error.clone())
                .request_id(refused.provider_request_id),
        );
        (
            report,
            self.schedule().after_call(CallEnding::NotStored(error)),
        )
    }
}

/// Judges one request of a provider batch as a call of the worker is judged: `end` is
/// [`CallEnd::Answered`] with the completion or the provider's error its result line
/// carried — a request the provider never ran (expired, cancelled, missing from the
/// results) comes as [`ProviderError::NotSent`], a wait that spends no attempt — or
/// how it ended unsent. `latency`: from the upload to the batch's end.
#[allow(clippy::too_many_arguments)]
pub fn judge_batch_request(
    claim: &Claim,
    attempt: &attempts::Model,
    price: &ModelPrice,
    input: &JobInput,
    bound: CallBound,
    charging: ChargingPolicy,
    latency: Duration,
    ended_at: Timestamp,
    end: CallEnd,
) -> (AttemptReport, JobOutcome) {
    let chain = ModelChain::of_job(&claim.job);
    let facts = CallFacts {
        claim,
        attempt,
        price,
        input,
        bound,
        chain: &chain,
        pauses: &[],
        charging,
        latency,
        ended_at,
        streamed_bytes: 0,
        in_provider_batch: true,
    };
    facts.judge(end)
}

/// What the tenant reads of a call its budget refused.
fn refusal_message(refusal: Refusal) -> &'static str {
    match refusal {
        Refusal::NoPaidCallLeft => {
            "not sent: the job already made as many provider calls that may have been billed as it may pay for"
        }
        Refusal::HoldShort => {
            "not sent: what is left of the job's hold does not cover this call at the price it is charged at"
        }
    }
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

/// The job's result from a reply: its tool calls when it makes some (see
/// `jobs::tools`), else the parsed JSON when the job has a response schema, the text
/// otherwise.
fn accept(completion: &Completion, input: &JobInput) -> Result<serde_json::Value, JobError> {
    if !completion.tool_calls.is_empty() {
        return crate::jobs::tools::accept_tool_calls(
            &completion.tool_calls,
            &completion.text,
            &input.tools,
        );
    }
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn code_fences_around_json_are_ignored() {
        assert_eq!(strip_code_fence("```json\n{\"a\": 1}\n```"), "{\"a\": 1}");
        assert_eq!(strip_code_fence("  {\"a\": 1} "), "{\"a\": 1}");
        assert_eq!(strip_code_fence("```\n[1]\n```"), "[1]");
        assert_eq!(strip_code_fence("```json {\"a\": 1}```"), "{\"a\": 1}");
    }
}
