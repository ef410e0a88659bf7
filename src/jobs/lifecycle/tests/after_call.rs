//! How each way a call can end decides its job: `Schedule::after_call`, every row.

use super::*;
use crate::jobs::lifecycle::CallEnding;

/// A job's outcome as the table states it.
#[derive(Debug, PartialEq)]
enum Becomes {
    Succeeded(Value),
    Retry(Timestamp, Option<String>),
    Wait(Timestamp, Option<String>),
    Failed(JobErrorCode),
    Cancelled,
    HandBack,
}

fn becomes(outcome: JobOutcome) -> Becomes {
    match outcome {
        JobOutcome::Succeeded { result } => Becomes::Succeeded(result),
        JobOutcome::Retry { at, model } => Becomes::Retry(at, model),
        JobOutcome::Wait { at, model } => Becomes::Wait(at, model),
        JobOutcome::Failed(error) => Becomes::Failed(error.code),
        JobOutcome::Cancelled => Becomes::Cancelled,
        JobOutcome::HandBack => Becomes::HandBack,
    }
}

#[test]
fn every_way_a_call_ends_decides_its_job() {
    let alone = ModelChain::new("a".into(), Vec::new());
    let chain = ModelChain::new("a".into(), vec!["b".into()]);
    let job = job();
    let last = jobs::Model {
        attempt_count: 3,
        ..job.clone()
    };
    let no_unknowns = jobs::Model {
        retry_unknown_outcome: false,
        ..job.clone()
    };
    let schedule = |job, chain| Schedule {
        job,
        attempt_number: 1,
        chain,
        pauses: &[],
        ended_at: NOW,
        jitter: 1.0,
    };
    let e = error;
    let paused = CallEnding::ModelPaused {
        retry_after: Some(Duration::from_secs(20)),
        until: at(20),
    };
    let retryable = || CallEnding::Retryable {
        error: e(JobErrorCode::ProviderUnavailable),
        retry_after: None,
    };
    use Becomes::*;
    use JobErrorCode as Code;
    let cases: Vec<(&str, Schedule, CallEnding, Becomes)> = vec![
        (
            "an accepted reply is the result",
            schedule(&job, &alone),
            CallEnding::Accepted(json!({"ok": true})),
            Succeeded(json!({"ok": true})),
        ),
        (
            "an invalid reply is retried after the backoff",
            schedule(&job, &alone),
            CallEnding::InvalidOutput(e(Code::InvalidOutput)),
            Retry(at(2), None),
        ),
        (
            "an invalid reply on the last attempt fails",
            schedule(&last, &alone),
            CallEnding::InvalidOutput(e(Code::InvalidOutput)),
            Failed(Code::InvalidOutput),
        ),
        (
            "a request never sent waits, attempts spent or not",
            schedule(&last, &alone),
            CallEnding::NotSent,
            Wait(at(2), None),
        ),
        (
            "a paused model waits out its pause",
            schedule(&job, &alone),
            paused.clone(),
            Wait(at(20), None),
        ),
        (
            "a paused model moves the job to a free fallback at once",
            schedule(&job, &chain),
            paused,
            Wait(NOW, Some("b".into())),
        ),
        (
            "a retryable refusal spends an attempt",
            schedule(&job, &alone),
            retryable(),
            Retry(at(2), None),
        ),
        (
            "a retryable refusal on the last attempt fails",
            schedule(&last, &alone),
            retryable(),
            Failed(Code::ProviderUnavailable),
        ),
        (
            "a permanent refusal fails at once",
            schedule(&job, &alone),
            CallEnding::Rejected(e(Code::ProviderRejected)),
            Failed(Code::ProviderRejected),
        ),
        (
            "an unknown outcome is retried when the job allows it",
            schedule(&job, &alone),
            CallEnding::Unknown(e(Code::OutcomeUnknown)),
            Retry(at(2), None),
        ),
        (
            "an unknown outcome fails a job that does not retry them",
            schedule(&no_unknowns, &alone),
            CallEnding::Unknown(e(Code::OutcomeUnknown)),
            Failed(Code::OutcomeUnknown),
        ),
        (
            "an unknown outcome in a provider batch fails even a job that retries them",
            schedule(&job, &alone),
            CallEnding::UnknownInProviderBatch(e(Code::OutcomeUnknown)),
            Failed(Code::OutcomeUnknown),
        ),
        (
            "a call not made (no provider, no paid call left) fails",
            schedule(&job, &alone),
            CallEnding::NotMade(e(Code::PaidCallLimit)),
            Failed(Code::PaidCallLimit),
        ),
        (
            "a deadline that came fails the job",
            schedule(&job, &alone),
            CallEnding::PastDeadline(e(Code::DeadlineExceeded)),
            Failed(Code::DeadlineExceeded),
        ),
        (
            "an outcome the database refused fails the job",
            schedule(&job, &alone),
            CallEnding::NotStored(e(Code::ResultNotStored)),
            Failed(Code::ResultNotStored),
        ),
        (
            "a cancel cancels",
            schedule(&job, &alone),
            CallEnding::Cancelled,
            Cancelled,
        ),
        (
            "a shutdown before sending hands the job back, even a job that does not retry unknowns",
            schedule(&no_unknowns, &alone),
            CallEnding::ShutDownBeforeSending,
            HandBack,
        ),
        (
            "a shutdown in flight hands the job back",
            schedule(&job, &alone),
            CallEnding::ShutDownInFlight,
            HandBack,
        ),
        (
            "a shutdown in flight fails a job that does not retry unknown outcomes",
            schedule(&no_unknowns, &alone),
            CallEnding::ShutDownInFlight,
            Failed(Code::OutcomeUnknown),
        ),
    ];
    for (name, schedule, ending, expected) in cases {
        assert_eq!(becomes(schedule.after_call(ending)), expected, "{name}");
    }
}
