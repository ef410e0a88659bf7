//! Every row of the lifecycle's tables, each a case of what a job becomes: the shared
//! fixtures here, one file a table.

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
        held_prices: None,
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

mod after_attempt;
mod after_call;
mod judgement;
mod without_an_attempt;
