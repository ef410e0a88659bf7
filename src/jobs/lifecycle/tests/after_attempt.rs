//! After an attempt: what the finish makes of the outcome, the event it writes and how
//! the hold resolves.

use super::*;

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
