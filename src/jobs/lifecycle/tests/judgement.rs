//! The worker's judgement of a call's end: retry, wait, fail or unknown.

use super::*;

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
