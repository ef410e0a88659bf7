//! Every row of the lifecycle's tables, each a case of what a job becomes.

use super::*;
use crate::billing::Credits;
use entity::JsonText;

const NOW: Timestamp = Timestamp(1_000_000_000_000);
const SECOND: i64 = 1_000_000;

fn at(seconds: i64) -> Timestamp {
    Timestamp(NOW.0 + seconds * SECOND)
}

/// A running job on attempt 1 of 3, due by an hour from now, retrying unknown outcomes.
fn job() -> jobs::Model {
    jobs::Model {
        id: Uuid::from_u128(1),
        tenant_id: Uuid::from_u128(2),
        idempotency_key: "key".into(),
        request_hash: "hash".into(),
        status: JobStatus::Running,
        cancel_requested: false,
        model: "a".into(),
        input: JsonText(json!({})),
        retry_unknown_outcome: true,
        result: None,
        error_code: None,
        error_message: None,
        attempt_count: 1,
        max_attempts: 3,
        run_token: Some(Uuid::from_u128(3)),
        lease_until: Some(at(30)),
        next_run_at: at(-60),
        priority: 0,
        run_at: None,
        simulated: true,
        token_bound: None,
        last_event_seq: 2,
        created_at: at(-60),
        updated_at: at(-60),
        started_at: Some(at(-10)),
        finished_at: None,
        payloads_pruned_at: None,
        batch_id: None,
        custom_id: None,
        rerun_of: None,
        deadline: Some(at(3600)),
        model_chain: None,
    }
}

const ATTEMPT: Uuid = Uuid::from_u128(10);
const EARLIER_ATTEMPT: Uuid = Uuid::from_u128(9);

/// One attempt that may have been billed, charging nothing.
fn spent() -> Spent {
    Spent {
        attempts: 1,
        paid_calls: 1,
        provider_exposure: Credits::from_nanos(300),
        ..Spent::default()
    }
}

fn report(outcome: AttemptOutcome, error: Option<JobErrorCode>) -> AttemptReport {
    AttemptReport {
        outcome,
        usage: None,
        not_billed: false,
        customer_charge: Credits::ZERO,
        delivered_output_tokens: None,
        error: error.map(|code| JobError::new(code, "why")),
        provider_request_id: None,
        latency: Duration::from_secs(1),
        ended_at: NOW,
        model_paused_until: None,
        wait: false,
    }
}

fn error(code: JobErrorCode) -> JobError {
    JobError::new(code, "judged")
}

/// What a case expects, the fields a row decides.
#[derive(Debug, PartialEq)]
struct Expected {
    status: JobStatus,
    event: EventKind,
    error: Option<&'static str>,
    next_run_at: Option<Timestamp>,
    model: Option<String>,
    gives_back_attempt: bool,
}

fn expect(status: JobStatus, event: EventKind) -> Expected {
    Expected {
        status,
        event,
        error: None,
        next_run_at: None,
        model: None,
        gives_back_attempt: false,
    }
}

fn seen(transition: &Transition) -> Expected {
    Expected {
        status: transition.status,
        event: transition.event,
        error: transition.error.as_ref().map(|error| error.code.as_str()),
        next_run_at: transition.next_run_at,
        model: transition.model.clone(),
        gives_back_attempt: transition.gives_back_attempt,
    }
}

fn queued_at(next_run_at: Timestamp) -> Expected {
    Expected {
        next_run_at: Some(next_run_at),
        ..expect(JobStatus::Queued, EventKind::RetryScheduled)
    }
}

fn failed(code: JobErrorCode) -> Expected {
    Expected {
        error: Some(code.as_str()),
        ..expect(JobStatus::Failed, EventKind::Failed)
    }
}

#[test]
fn after_an_attempt_every_row() {
    let retry = || JobOutcome::Retry {
        at: at(4),
        model: None,
    };
    let cancelled = || jobs::Model {
        cancel_requested: true,
        ..job()
    };
    let no_calls_left = || Spent {
        paid_calls: 3,
        ..spent()
    };
    let waited = || AttemptReport {
        wait: true,
        ..report(
            AttemptOutcome::RetryableError,
            Some(JobErrorCode::ProviderUnavailable),
        )
    };
    let retryable = || {
        report(
            AttemptOutcome::RetryableError,
            Some(JobErrorCode::ProviderUnavailable),
        )
    };
    let invalid = || {
        report(
            AttemptOutcome::InvalidOutput,
            Some(JobErrorCode::InvalidOutput),
        )
    };
    let cases: Vec<(
        &str,
        jobs::Model,
        Spent,
        AttemptReport,
        JobOutcome,
        Expected,
    )> = vec![
        (
            "an accepted answer succeeds",
            job(),
            spent(),
            report(AttemptOutcome::Succeeded, None),
            JobOutcome::Succeeded {
                result: json!("hi"),
            },
            expect(JobStatus::Succeeded, EventKind::Succeeded),
        ),
        (
            "a retry is queued when it said, on the model it said",
            job(),
            spent(),
            retryable(),
            JobOutcome::Retry {
                at: at(4),
                model: Some("b".into()),
            },
            Expected {
                model: Some("b".into()),
                ..queued_at(at(4))
            },
        ),
        (
            "a retry of a job cancelled meanwhile is a cancel",
            cancelled(),
            spent(),
            retryable(),
            retry(),
            expect(JobStatus::Cancelled, EventKind::Cancelled),
        ),
        (
            "a hand-back of a job cancelled meanwhile is a cancel, and spends the attempt",
            cancelled(),
            spent(),
            report(AttemptOutcome::Unknown, Some(JobErrorCode::WorkerShutdown)),
            JobOutcome::HandBack,
            expect(JobStatus::Cancelled, EventKind::Cancelled),
        ),
        (
            "a wait of a job cancelled meanwhile is a cancel, and gives its attempt back",
            cancelled(),
            spent(),
            waited(),
            JobOutcome::Wait {
                at: at(30),
                model: None,
            },
            Expected {
                gives_back_attempt: true,
                ..expect(JobStatus::Cancelled, EventKind::Cancelled)
            },
        ),
        (
            "an invalid output within its retries is retried",
            job(),
            Spent {
                invalid_outputs: INVALID_OUTPUT_RETRIES,
                ..spent()
            },
            invalid(),
            retry(),
            queued_at(at(4)),
        ),
        (
            "an invalid output past its retries fails with the reply's error",
            job(),
            Spent {
                invalid_outputs: INVALID_OUTPUT_RETRIES + 1,
                ..spent()
            },
            invalid(),
            retry(),
            failed(JobErrorCode::InvalidOutput),
        ),
        (
            "a retry without paid calls left fails PAID_CALL_LIMIT",
            job(),
            no_calls_left(),
            retryable(),
            retry(),
            failed(JobErrorCode::PaidCallLimit),
        ),
        (
            "a hand-back without paid calls left fails PAID_CALL_LIMIT",
            job(),
            no_calls_left(),
            report(AttemptOutcome::Unknown, Some(JobErrorCode::WorkerShutdown)),
            JobOutcome::HandBack,
            failed(JobErrorCode::PaidCallLimit),
        ),
        (
            "a wait without paid calls left fails PAID_CALL_LIMIT, its attempt given back",
            job(),
            no_calls_left(),
            waited(),
            JobOutcome::Wait {
                at: at(30),
                model: None,
            },
            Expected {
                gives_back_attempt: true,
                ..failed(JobErrorCode::PaidCallLimit)
            },
        ),
        (
            "a hand-back is queued at once and gives its attempt back",
            job(),
            spent(),
            report(AttemptOutcome::Unknown, Some(JobErrorCode::WorkerShutdown)),
            JobOutcome::HandBack,
            Expected {
                gives_back_attempt: true,
                ..queued_at(NOW)
            },
        ),
        (
            "a wait is queued when it said and gives its attempt back",
            job(),
            spent(),
            waited(),
            JobOutcome::Wait {
                at: at(30),
                model: Some("b".into()),
            },
            Expected {
                model: Some("b".into()),
                gives_back_attempt: true,
                ..queued_at(at(30))
            },
        ),
        (
            "a failure fails with the judged error",
            job(),
            spent(),
            report(
                AttemptOutcome::PermanentError,
                Some(JobErrorCode::ProviderRejected),
            ),
            JobOutcome::Failed(error(JobErrorCode::ProviderRejected)),
            failed(JobErrorCode::ProviderRejected),
        ),
        (
            "a cancel cancels",
            job(),
            spent(),
            report(AttemptOutcome::Cancelled, Some(JobErrorCode::Cancelled)),
            JobOutcome::Cancelled,
            expect(JobStatus::Cancelled, EventKind::Cancelled),
        ),
    ];
    for (name, job, spent, report, outcome, expected) in cases {
        let transition = after_attempt(&job, &spent, ATTEMPT, 1, &report, outcome, NOW);
        assert_eq!(seen(&transition), expected, "{name}");
        assert_eq!(transition.data["attempt"], json!(1), "{name}");
        assert_eq!(
            transition.result.is_some(),
            transition.status == JobStatus::Succeeded,
            "{name}"
        );
        assert_eq!(
            transition.hold(job.id, &spent).is_some(),
            transition.status.is_terminal(),
            "{name}: the hold is resolved exactly when the job ends"
        );
    }
}

#[test]
fn an_attempt_events_data_tells_the_attempt_its_error_and_a_pause() {
    let refused = AttemptReport {
        model_paused_until: Some(at(30)),
        ..report(
            AttemptOutcome::RetryableError,
            Some(JobErrorCode::ProviderUnavailable),
        )
    };
    let outcome = JobOutcome::Wait {
        at: at(30),
        model: None,
    };
    let transition = after_attempt(&job(), &spent(), ATTEMPT, 2, &refused, outcome, NOW);
    assert_eq!(transition.data["attempt"], json!(2));
    assert_eq!(
        transition.data["outcome"],
        json!(AttemptOutcome::RetryableError)
    );
    assert_eq!(
        transition.data["error"]["code"],
        json!("PROVIDER_UNAVAILABLE")
    );
    assert_eq!(
        transition.data["modelPausedUntil"],
        json!(at(30).to_datetime().to_rfc3339())
    );
    // A failure the finish decided is the event's error, not the attempt's.
    let transition = after_attempt(
        &job(),
        &Spent {
            paid_calls: 3,
            ..spent()
        },
        ATTEMPT,
        2,
        &report(
            AttemptOutcome::RetryableError,
            Some(JobErrorCode::ProviderUnavailable),
        ),
        JobOutcome::Retry {
            at: at(4),
            model: None,
        },
        NOW,
    );
    assert_eq!(transition.data["error"]["code"], json!("PAID_CALL_LIMIT"));
    assert!(transition.data.get("modelPausedUntil").is_none());
}

#[test]
fn a_hold_is_settled_for_what_the_attempts_charged_and_released_otherwise() {
    let charged = Spent {
        customer_charges: Credits::from_nanos(100),
        last_charged_attempt: Some(EARLIER_ATTEMPT),
        ..spent()
    };
    let job_id = job().id;
    let cases = [
        (
            "a success is settled on its attempt, even for nothing",
            JobStatus::Succeeded,
            spent(),
            Some((ATTEMPT, Credits::ZERO)),
            Credits::from_nanos(300),
        ),
        (
            "a success is settled for every attempt's charges",
            JobStatus::Succeeded,
            charged.clone(),
            Some((ATTEMPT, Credits::from_nanos(100))),
            Credits::from_nanos(200),
        ),
        (
            "a failure that charged is settled on the last attempt that charged",
            JobStatus::Failed,
            charged.clone(),
            Some((EARLIER_ATTEMPT, Credits::from_nanos(100))),
            Credits::from_nanos(200),
        ),
        (
            "a cancel that charged nothing is released whole",
            JobStatus::Cancelled,
            spent(),
            None,
            Credits::from_nanos(300),
        ),
    ];
    for (name, status, spent, charge, absorbed) in cases {
        let resolution = resolution(job_id, status, Some(ATTEMPT), &spent);
        assert_eq!(resolution.job_id, job_id, "{name}");
        assert_eq!(resolution.charge, charge, "{name}");
        assert_eq!(resolution.absorbed, absorbed, "{name}");
    }
}

#[test]
fn after_a_lost_lease_every_row() {
    let cases: Vec<(&str, jobs::Model, Spent, Option<i32>, Expected)> = vec![
        (
            "a job cancelled meanwhile is cancelled",
            jobs::Model {
                cancel_requested: true,
                ..job()
            },
            spent(),
            Some(1),
            expect(JobStatus::Cancelled, EventKind::Cancelled),
        ),
        (
            "a job cancelled before its attempt was recorded is cancelled too",
            jobs::Model {
                cancel_requested: true,
                ..job()
            },
            Spent::default(),
            None,
            expect(JobStatus::Cancelled, EventKind::Cancelled),
        ),
        (
            "a claim lost before its attempt row is given back uncounted",
            jobs::Model {
                attempt_count: 3,
                retry_unknown_outcome: false,
                ..job()
            },
            Spent::default(),
            None,
            Expected {
                gives_back_attempt: true,
                ..expect(JobStatus::Queued, EventKind::RetryScheduled)
            },
        ),
        (
            "the last attempt lost fails LEASE_EXPIRED",
            jobs::Model {
                attempt_count: 3,
                ..job()
            },
            spent(),
            Some(3),
            failed(JobErrorCode::LeaseExpired),
        ),
        (
            "a lost call without paid calls left fails PAID_CALL_LIMIT",
            job(),
            Spent {
                paid_calls: 3,
                ..spent()
            },
            Some(1),
            failed(JobErrorCode::PaidCallLimit),
        ),
        (
            "a job that does not retry unknown outcomes fails OUTCOME_UNKNOWN",
            jobs::Model {
                retry_unknown_outcome: false,
                ..job()
            },
            spent(),
            Some(1),
            failed(JobErrorCode::OutcomeUnknown),
        ),
        (
            "otherwise the job is queued again, the attempt spent",
            job(),
            spent(),
            Some(1),
            expect(JobStatus::Queued, EventKind::RetryScheduled),
        ),
    ];
    for (name, job, spent, lost_attempt, expected) in cases {
        let transition = after_lost_lease(&job, &spent, lost_attempt, NOW);
        let expected = Expected {
            next_run_at: Some(NOW),
            ..expected
        };
        assert_eq!(seen(&transition), expected, "{name}");
        assert_eq!(transition.data["attempt"], json!(lost_attempt), "{name}");
        assert_eq!(
            transition.data["outcome"],
            json!(AttemptOutcome::LeaseExpired),
            "{name}"
        );
        assert_eq!(
            transition.data["error"]["code"],
            json!(expected.error),
            "{name}"
        );
        assert_eq!(
            transition.hold(job.id, &spent).is_some(),
            transition.status.is_terminal(),
            "{name}"
        );
    }
}

#[test]
fn an_abandoned_claim_and_a_missed_deadline_fail() {
    let abandoned = abandoned(JobError::new(JobErrorCode::NotRunnable, "no price"));
    assert_eq!(seen(&abandoned), failed(JobErrorCode::NotRunnable));
    assert_eq!(abandoned.data["error"]["message"], json!("no price"));
    let late = past_deadline();
    assert_eq!(seen(&late), failed(JobErrorCode::DeadlineExceeded));
    assert_eq!(late.data["error"]["code"], json!("DEADLINE_EXCEEDED"));
    // Neither names an attempt: a charge, if any, is the last attempt that charged.
    let charged = Spent {
        customer_charges: Credits::from_nanos(5),
        last_charged_attempt: Some(EARLIER_ATTEMPT),
        ..spent()
    };
    assert_eq!(
        late.hold(job().id, &charged).and_then(|hold| hold.charge),
        Some((EARLIER_ATTEMPT, Credits::from_nanos(5)))
    );
}

/// A schedule of `job`'s attempt 1 that ended now, its jitter at `jitter`.
fn schedule<'a>(
    job: &'a jobs::Model,
    chain: &'a ModelChain,
    pauses: &'a [(String, Timestamp)],
    jitter: f64,
) -> Schedule<'a> {
    Schedule {
        job,
        attempt_number: 1,
        chain,
        pauses,
        ended_at: NOW,
        jitter,
    }
}

fn retried(at: Timestamp, model: Option<&str>) -> String {
    format!(
        "{:?}",
        JobOutcome::Retry {
            at,
            model: model.map(str::to_owned)
        }
    )
}

fn waits(at: Timestamp, model: Option<&str>) -> String {
    format!(
        "{:?}",
        JobOutcome::Wait {
            at,
            model: model.map(str::to_owned)
        }
    )
}

fn fails(code: JobErrorCode) -> String {
    code.as_str().to_owned()
}

/// An outcome as the table compares it: a failure by its code.
fn shown(outcome: JobOutcome) -> String {
    match outcome {
        JobOutcome::Failed(error) => error.code.as_str().to_owned(),
        other => format!("{other:?}"),
    }
}

#[test]
fn the_worker_judgement_every_row() {
    let alone = ModelChain::new("a".into(), Vec::new());
    let chain = ModelChain::new("a".into(), vec!["b".into()]);
    let b_paused = [("b".to_owned(), at(90))];
    let both_paused = [("a".to_owned(), at(120)), ("b".to_owned(), at(90))];
    let last = jobs::Model {
        attempt_count: 3,
        ..job()
    };
    let soon = jobs::Model {
        deadline: Some(at(3)),
        ..job()
    };
    let no_unknowns = jobs::Model {
        retry_unknown_outcome: false,
        ..job()
    };
    let error = || error(JobErrorCode::ProviderUnavailable);
    let unknown = || JobError::new(JobErrorCode::OutcomeUnknown, "lost");
    let job = job();
    let none: &[(String, Timestamp)] = &[];
    let cases: Vec<(&str, JobOutcome, String)> = vec![
        (
            "a retry waits the shortest backoff at jitter 0",
            schedule(&job, &alone, none, 0.0).retry_or_fail(error(), None),
            retried(at(1), None),
        ),
        (
            "a retry waits the whole backoff at jitter 1",
            schedule(&job, &alone, none, 1.0).retry_or_fail(error(), None),
            retried(at(2), None),
        ),
        (
            "a longer Retry-After wins",
            schedule(&job, &alone, none, 1.0).retry_or_fail(error(), Some(Duration::from_secs(30))),
            retried(at(30), None),
        ),
        (
            "a Retry-After is capped at ten minutes",
            schedule(&job, &alone, none, 1.0)
                .retry_or_fail(error(), Some(Duration::from_secs(86_400))),
            retried(at(600), None),
        ),
        (
            "without attempts left the error fails the job",
            schedule(&last, &alone, none, 0.0).retry_or_fail(error(), None),
            fails(JobErrorCode::ProviderUnavailable),
        ),
        (
            "a retry past the deadline fails DEADLINE_EXCEEDED",
            schedule(&soon, &alone, none, 1.0).retry_or_fail(error(), Some(Duration::from_secs(3))),
            fails(JobErrorCode::DeadlineExceeded),
        ),
        (
            "a retry before the deadline is queued",
            schedule(&soon, &alone, none, 1.0).retry_or_fail(error(), None),
            retried(at(2), None),
        ),
        (
            "with a fallback the retry is on the next model at once",
            schedule(&job, &chain, none, 1.0).retry_or_fail(error(), Some(Duration::from_secs(30))),
            retried(NOW, Some("b")),
        ),
        (
            "a paused fallback leaves the job on its own model, which is free",
            schedule(&job, &chain, &b_paused, 1.0).retry_or_fail(error(), None),
            retried(at(2), None),
        ),
        (
            "every model paused: the retry waits for the first pause to end",
            schedule(&job, &chain, &both_paused, 0.0).retry_or_fail(error(), None),
            retried(at(90), Some("b")),
        ),
        (
            "a wait waits the Retry-After, attempts spent or not",
            schedule(&last, &alone, none, 0.0).wait(Some(Duration::from_secs(20)), None),
            waits(at(20), None),
        ),
        (
            "a wait with a fallback moves to it at once",
            schedule(&job, &chain, none, 0.0).wait(Some(Duration::from_secs(20)), Some(at(20))),
            waits(NOW, Some("b")),
        ),
        (
            "a wait past the deadline fails DEADLINE_EXCEEDED",
            schedule(&soon, &alone, none, 0.0).wait(Some(Duration::from_secs(20)), None),
            fails(JobErrorCode::DeadlineExceeded),
        ),
        (
            "an unknown outcome is retried when the job allows it",
            schedule(&job, &alone, none, 0.0).unknown_outcome(unknown()),
            retried(at(1), None),
        ),
        (
            "an unknown outcome fails a job that does not retry them",
            schedule(&no_unknowns, &alone, none, 0.0).unknown_outcome(unknown()),
            fails(JobErrorCode::OutcomeUnknown),
        ),
        (
            "an unknown outcome without attempts left fails",
            schedule(&last, &alone, none, 0.0).unknown_outcome(unknown()),
            fails(JobErrorCode::OutcomeUnknown),
        ),
        (
            "a call aborted in flight is handed back",
            schedule(&job, &alone, none, 0.0).aborted_in_flight(),
            format!("{:?}", JobOutcome::HandBack),
        ),
        (
            "a call aborted in flight fails a job that does not retry unknown outcomes",
            schedule(&no_unknowns, &alone, none, 0.0).aborted_in_flight(),
            fails(JobErrorCode::OutcomeUnknown),
        ),
    ];
    for (name, outcome, expected) in cases {
        assert_eq!(shown(outcome), expected, "{name}");
    }
}

#[test]
fn the_backoff_doubles_per_attempt_and_stops_at_the_cap() {
    assert_eq!(retry_delay(1, None, 1.0), Duration::from_secs(2));
    assert_eq!(retry_delay(3, None, 0.0), Duration::from_secs(4));
    assert_eq!(retry_delay(3, None, 1.0), Duration::from_secs(8));
    assert_eq!(retry_delay(30, None, 1.0), Duration::from_secs(60));
    assert_eq!(retry_delay(0, None, 1.0), Duration::from_secs(2));
}

#[test]
fn a_job_without_a_deadline_gets_the_default_from_its_creation() {
    let old = jobs::Model {
        deadline: None,
        ..job()
    };
    assert_eq!(
        deadline_of(&old),
        old.created_at
            .plus(chrono::Duration::from_std(DEFAULT_DEADLINE).unwrap())
    );
    assert_eq!(deadline_of(&job()), at(3600));
}

#[test]
fn a_lapsed_lease_of_an_item_in_a_live_provider_batch_is_not_lost() {
    use entity::ProviderBatchState::*;
    assert!(lease_is_lost(None), "a realtime attempt");
    for live in [Preparing, Uploading, Submitted, Cancelling, Ended] {
        assert!(!lease_is_lost(Some(live)), "{live:?}");
    }
    for ended in [Settled, Abandoned, Unknown] {
        assert!(lease_is_lost(Some(ended)), "{ended:?}");
    }
}
