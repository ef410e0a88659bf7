//! Fates decided without an attempt's outcome: a lapsed lease taken back, a claim that
//! cannot run, a queued job past its deadline, a tenant's cancel.

use super::*;

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

#[test]
fn a_cancel_ends_a_queued_job_asks_a_running_one_and_leaves_the_rest() {
    let cases = [
        (JobStatus::Queued, false, Cancel::Ends),
        // A queued job was asked before only if a cancel raced its retry: it ends now.
        (JobStatus::Queued, true, Cancel::Ends),
        (JobStatus::Running, false, Cancel::Asks),
        (JobStatus::Running, true, Cancel::Nothing),
        (JobStatus::Succeeded, false, Cancel::Nothing),
        (JobStatus::Failed, false, Cancel::Nothing),
        (JobStatus::Cancelled, true, Cancel::Nothing),
    ];
    for (status, asked_before, expected) in cases {
        let decided = cancel(status, asked_before);
        assert_eq!(
            decided, expected,
            "{status:?}, asked before: {asked_before}"
        );
        assert_eq!(
            decided != Cancel::Nothing,
            CANCELLABLE.contains(&status) && decided.event().is_some(),
            "{status:?}: the bulk cancel selects exactly the statuses a cancel changes"
        );
    }
    assert_eq!(Cancel::Ends.event(), Some(EventKind::Cancelled));
    assert_eq!(Cancel::Asks.event(), Some(EventKind::CancelRequested));
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
