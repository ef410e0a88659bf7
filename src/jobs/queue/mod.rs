//! The job queue in the database: claiming, lease renewal, recording attempts and
//! finishing them.
//!
//! Every write an attempt makes is fenced: it matches the job only while the job is
//! `running` with the attempt's own `run_token`. A write that matches nothing means
//! the attempt lost the job (its lease expired and it was taken back), and the attempt
//! then writes nothing further.

use super::budget::{self, Spent};
use super::bus::EventNotice;
use super::events;
use crate::billing::{Credits, ModelPrice, TokenUsage};
use crate::db::begin_write;
use entity::{AttemptOutcome, EventKind, JobStatus, JsonText, Timestamp, attempts, jobs};
use sea_orm::sea_query::{Expr, ExprTrait, Query};
use sea_orm::{
    ActiveValue::Set, ColumnTrait, ConnectionTrait, DatabaseConnection, DbErr, EntityTrait,
    QueryFilter, QueryOrder, QuerySelect,
};
use serde_json::{Value, json};
use std::collections::HashMap;
use std::time::Duration;
use uuid::Uuid;

mod claim;

pub use claim::{Claim, ClaimRequest, TenantCursor, claim, claim_in_turn};

/// What a lease renewal learned.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Renewal {
    /// The lease was extended; the attempt goes on unless cancel was requested.
    Renewed { cancel_requested: bool },
    /// The job is no longer this attempt's: stop and write nothing.
    Lost,
}

/// Most jobs one renewal statement names: far below SQLite's bound on parameters.
const RENEWAL_CHUNK: usize = 500;

/// Extends to `lease` from now the lease of every listed `(job id, run token)` whose
/// attempt still owns its job, one statement per few hundred jobs, and tells for each
/// what it learned; a job missing from the answer was lost.
pub async fn renew_leases(
    db: &impl ConnectionTrait,
    owned: &[(Uuid, Uuid)],
    lease: Duration,
) -> Result<HashMap<Uuid, Renewal>, DbErr> {
    let lease_until =
        Timestamp::now().plus(chrono::Duration::from_std(lease).unwrap_or(chrono::Duration::MAX));
    let mut renewed = HashMap::with_capacity(owned.len());
    for chunk in owned.chunks(RENEWAL_CHUNK) {
        let statement = Query::update()
            .table(jobs::Entity)
            .value(jobs::Column::LeaseUntil, lease_until)
            .and_where(jobs::Column::Status.eq(JobStatus::Running))
            .and_where(
                Expr::tuple([
                    Expr::col(jobs::Column::Id),
                    Expr::col(jobs::Column::RunToken),
                ])
                .in_tuples(chunk.iter().copied()),
            )
            .returning(
                Query::returning().columns([jobs::Column::Id, jobs::Column::CancelRequested]),
            )
            .to_owned();
        for row in db.query_all(&statement).await? {
            let job_id: Uuid = row.try_get("", "id")?;
            let cancel_requested: bool = row.try_get("", "cancel_requested")?;
            renewed.insert(job_id, Renewal::Renewed { cancel_requested });
        }
    }
    Ok(renewed)
}

/// Extends one attempt's lease: [`renew_leases`] for a single claim.
pub async fn renew_lease(
    db: &impl ConnectionTrait,
    claim: &Claim,
    lease: Duration,
) -> Result<Renewal, DbErr> {
    let renewed = renew_leases(db, &[(claim.job.id, claim.run_token)], lease).await?;
    Ok(renewed.get(&claim.job.id).copied().unwrap_or(Renewal::Lost))
}

/// Locks the claimed job for the rest of `transaction` and returns it as it is now;
/// `None` when the claim no longer owns it.
async fn lock_claimed(
    transaction: &impl ConnectionTrait,
    claim: &Claim,
    now: Timestamp,
) -> Result<Option<jobs::Model>, DbErr> {
    Ok(fenced_update(claim)
        .col_expr(jobs::Column::UpdatedAt, Expr::value(now))
        .exec_with_returning(transaction)
        .await?
        .into_iter()
        .next())
}

/// An UPDATE of the claimed job that matches only while the claim still owns it.
fn fenced_update(claim: &Claim) -> sea_orm::UpdateMany<jobs::Entity> {
    jobs::Entity::update_many()
        .filter(jobs::Column::Id.eq(claim.job.id))
        .filter(jobs::Column::RunToken.eq(claim.run_token))
        .filter(jobs::Column::Status.eq(JobStatus::Running))
}

/// A fenced UPDATE that comes with an event: it bumps the job's event sequence, which
/// the job's row lock serialises.
fn fenced_event_update(claim: &Claim, now: Timestamp) -> sea_orm::UpdateMany<jobs::Entity> {
    fenced_update(claim)
        .col_expr(jobs::Column::UpdatedAt, Expr::value(now))
        .col_expr(
            jobs::Column::LastEventSeq,
            Expr::col(jobs::Column::LastEventSeq).add(1),
        )
}

/// A fenced event UPDATE that ends the claim: the job is nobody's after it.
fn releasing_update(claim: &Claim, now: Timestamp) -> sea_orm::UpdateMany<jobs::Entity> {
    fenced_event_update(claim, now)
        .col_expr(jobs::Column::RunToken, Expr::value(Option::<Uuid>::None))
        .col_expr(
            jobs::Column::LeaseUntil,
            Expr::value(Option::<Timestamp>::None),
        )
}

/// The UPDATE also records the job's error.
fn with_error(
    update: sea_orm::UpdateMany<jobs::Entity>,
    error: &JobError,
) -> sea_orm::UpdateMany<jobs::Entity> {
    update
        .col_expr(jobs::Column::ErrorCode, Expr::value(error.code.clone()))
        .col_expr(
            jobs::Column::ErrorMessage,
            Expr::value(error.message.clone()),
        )
}

/// Details of an attempt known before the provider is called.
#[derive(Clone, Debug)]
pub struct AttemptStart {
    pub worker_id: String,
    /// The provider that serves the job's model; `None` when none does in this
    /// process, and no call will be made.
    pub provider: Option<String>,
    pub price: ModelPrice,
    /// What the call may cost at most, recorded now so that an attempt that never
    /// reports back still carries a bound.
    pub provider_cost_bound: Credits,
    /// The most the customer may be charged for the call.
    pub customer_charge_bound: Credits,
    /// What the charging policy charges the customer for the call if it is lost with
    /// its worker, recorded now for the same reason.
    pub customer_charge_if_lost: Credits,
}

/// An attempt on record, about to call the provider.
#[derive(Clone, Debug)]
pub struct StartedAttempt {
    pub attempt: attempts::Model,
    /// The `ATTEMPT_STARTED` event, to publish.
    pub notice: EventNotice,
    /// The tenant asked to cancel before the call was made: do not make it.
    pub cancel_requested: bool,
    /// The job has no paid call left in its budget (see [`budget`]): do not make it.
    pub budget_spent: bool,
}

/// The provider name recorded on an attempt whose model no provider serves.
pub const UNROUTED_PROVIDER: &str = "unrouted";

/// Records the attempt row and its `ATTEMPT_STARTED` event before the provider is
/// called. `None` when the claim no longer owns the job.
pub async fn start_attempt(
    db: &DatabaseConnection,
    claim: &Claim,
    start: &AttemptStart,
) -> Result<Option<StartedAttempt>, DbErr> {
    let transaction = begin_write(db).await?;
    let now = Timestamp::now();
    let Some(job) = fenced_event_update(claim, now)
        .exec_with_returning(&transaction)
        .await?
        .into_iter()
        .next()
    else {
        transaction.rollback().await?;
        return Ok(None);
    };
    // Numbered by the rows already there, not by attempt_count: an attempt handed back
    // at shutdown does not count against maxAttempts but is still a row of its own.
    // The fenced UPDATE above holds the job's row lock, so numbering and the budget
    // check cannot race.
    let earlier = Spent::load(&transaction, job.id).await?;
    let hold = budget::open_hold(&transaction, job.id).await?;
    let budget_spent = !earlier.allows_call(
        &job,
        hold,
        start.provider_cost_bound,
        start.customer_charge_bound,
    );
    // A call that will not be made is recorded as not billed from the start, so that
    // losing the worker now cannot count it as paid.
    let will_call = start.provider.is_some() && !budget_spent && !job.cancel_requested;
    let (cost, cost_bound, customer_charge) = if will_call {
        (
            None,
            Some(start.provider_cost_bound.nanos()),
            start.customer_charge_if_lost.nanos(),
        )
    } else {
        (Some(0), None, 0)
    };
    let row = attempts::ActiveModel {
        id: Set(Uuid::now_v7()),
        job_id: Set(job.id),
        tenant_id: Set(job.tenant_id),
        number: Set(i32::try_from(earlier.attempts).unwrap_or(i32::MAX - 1) + 1),
        run_token: Set(claim.run_token),
        worker_id: Set(start.worker_id.clone()),
        outcome: Set(AttemptOutcome::Running),
        error_code: Set(None),
        error_message: Set(None),
        provider: Set(start
            .provider
            .clone()
            .unwrap_or_else(|| UNROUTED_PROVIDER.to_owned())),
        model: Set(job.model.clone()),
        provider_request_id: Set(None),
        input_tokens: Set(None),
        cached_input_tokens: Set(None),
        output_tokens: Set(None),
        provider_cost_nanos: Set(cost),
        provider_cost_upper_bound_nanos: Set(cost_bound),
        customer_charge_nanos: Set(Some(customer_charge)),
        delivered_output_tokens: Set(None),
        model_price_id: Set(start.price.id),
        latency_ms: Set(None),
        started_at: Set(now),
        finished_at: Set(None),
    };
    let attempt = attempts::Entity::insert(row)
        .exec_with_returning(&transaction)
        .await?;
    let notice = events::append(
        &transaction,
        &job,
        EventKind::AttemptStarted,
        Some(json!({"attempt": attempt.number})),
    )
    .await?;
    transaction.commit().await?;
    Ok(Some(StartedAttempt {
        attempt,
        notice,
        cancel_requested: job.cancel_requested,
        budget_spent,
    }))
}

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
}

/// A machine-readable code and a human message.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct JobError {
    pub code: String,
    pub message: String,
}

impl JobError {
    /// An error with one of the codes jobledger uses. The message may quote a
    /// provider, so a NUL character in it (which PostgreSQL text cannot hold) becomes
    /// U+FFFD.
    pub fn new(code: ErrorCode, message: impl Into<String>) -> Self {
        Self {
            code: code.as_str().to_owned(),
            message: storable_text(message.into()),
        }
    }
}

/// Text from outside (a provider's message or request id) as a text column can hold
/// it on both backends: NUL characters replaced by U+FFFD.
pub fn storable_text(text: String) -> String {
    if text.contains('\0') {
        text.replace('\0', "\u{FFFD}")
    } else {
        text
    }
}

/// The codes a failed job or attempt carries, as clients see them in `error.code`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ErrorCode {
    /// The provider refused the request (4xx); retrying cannot help.
    ProviderRejected,
    /// The provider was unreachable or answered with a retryable error.
    ProviderUnavailable,
    /// The request was sent and no answer came back.
    OutcomeUnknown,
    /// The reply did not satisfy the job's response schema.
    InvalidOutput,
    /// The worker running the attempt stopped renewing its lease.
    LeaseExpired,
    /// The attempt was aborted because the tenant cancelled the job.
    Cancelled,
    /// The worker shut down during the call and handed the job back.
    WorkerShutdown,
    /// The job made as many calls that may have been billed as it may pay for
    /// (`maxAttempts`, hand-backs and lost calls included), or their cost reached its hold.
    PaidCallLimit,
    /// No configured provider serves the job's model (the simulator only serves what
    /// it is allowed to).
    ModelNotServed,
    /// The answer came back and was paid for, but the database refused to store it.
    ResultNotStored,
    /// The job cannot be run at all (its stored input is unreadable, its model has no
    /// price); no call was made.
    NotRunnable,
}

impl ErrorCode {
    /// The code's text.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::ProviderRejected => "PROVIDER_REJECTED",
            Self::ProviderUnavailable => "PROVIDER_UNAVAILABLE",
            Self::OutcomeUnknown => "OUTCOME_UNKNOWN",
            Self::InvalidOutput => "INVALID_OUTPUT",
            Self::LeaseExpired => "LEASE_EXPIRED",
            Self::Cancelled => "CANCELLED",
            Self::WorkerShutdown => "WORKER_SHUTDOWN",
            Self::PaidCallLimit => "PAID_CALL_LIMIT",
            Self::ModelNotServed => "MODEL_NOT_SERVED",
            Self::ResultNotStored => "RESULT_NOT_STORED",
            Self::NotRunnable => "NOT_RUNNABLE",
        }
    }
}

/// What becomes of the job after the attempt.
#[derive(Clone, Debug)]
pub enum JobOutcome {
    /// The result is accepted; the customer is charged what the attempts carry.
    Succeeded { result: Value },
    /// Queued again, to be claimed at `at`.
    Retry { at: Timestamp },
    /// Failed for good; the hold is settled for what the attempts charged, if
    /// anything, and released otherwise.
    Failed(JobError),
    /// Cancelled as the tenant asked; the hold is resolved as for `Failed`.
    Cancelled,
    /// Given back at once because the worker is shutting down: queued again, and the
    /// attempt does not count against `maxAttempts`.
    HandBack,
}

/// Finishes an attempt in one transaction fenced by its run token: the job's new
/// state, the attempt's outcome, cost and customer charge, the settlement or release
/// of the hold, and the event. `None` when the claim no longer owns the job; then
/// nothing is written.
pub async fn finish_attempt(
    db: &DatabaseConnection,
    claim: &Claim,
    attempt: &attempts::Model,
    price: &ModelPrice,
    report: AttemptReport,
    outcome: JobOutcome,
) -> Result<Option<Vec<EventNotice>>, DbErr> {
    let transaction = begin_write(db).await?;
    let now = Timestamp::now();
    let Some(current) = lock_claimed(&transaction, claim, now).await? else {
        transaction.rollback().await?;
        return Ok(None);
    };
    record_attempt(&transaction, attempt, price, &report, now).await?;
    let spent = Spent::load(&transaction, current.id).await?;
    // Decided on the locked row, with this attempt counted.
    let outcome = match outcome {
        // A cancel that landed while the call ran wins over going round again: a job
        // the tenant cancelled is never queued for another (paid) attempt.
        JobOutcome::Retry { .. } | JobOutcome::HandBack if current.cancel_requested => {
            JobOutcome::Cancelled
        }
        // A model that keeps answering off-schema is not paid for forever.
        JobOutcome::Retry { .. }
            if report.outcome == AttemptOutcome::InvalidOutput
                && spent.invalid_outputs > INVALID_OUTPUT_RETRIES =>
        {
            JobOutcome::Failed(report.error.clone().unwrap_or_else(|| {
                JobError::new(
                    ErrorCode::InvalidOutput,
                    "the reply failed the response schema",
                )
            }))
        }
        JobOutcome::Retry { .. } | JobOutcome::HandBack if !spent.calls_left(&current) => {
            JobOutcome::Failed(paid_call_limit(&spent))
        }
        other => other,
    };
    let update = releasing_update(claim, now);
    let (status, kind) = match &outcome {
        JobOutcome::Succeeded { .. } => (JobStatus::Succeeded, EventKind::Succeeded),
        JobOutcome::Retry { .. } => (JobStatus::Queued, EventKind::RetryScheduled),
        JobOutcome::Failed(_) => (JobStatus::Failed, EventKind::Failed),
        JobOutcome::Cancelled => (JobStatus::Cancelled, EventKind::Cancelled),
        JobOutcome::HandBack => (JobStatus::Queued, EventKind::RetryScheduled),
    };
    let update = update.col_expr(jobs::Column::Status, Expr::value(status));
    let update = match &outcome {
        JobOutcome::Succeeded { result } => update
            .col_expr(jobs::Column::Result, Expr::value(JsonText(result.clone())))
            .col_expr(jobs::Column::FinishedAt, Expr::value(now)),
        JobOutcome::Retry { at } => update.col_expr(jobs::Column::NextRunAt, Expr::value(*at)),
        JobOutcome::Failed(error) => {
            with_error(update, error).col_expr(jobs::Column::FinishedAt, Expr::value(now))
        }
        JobOutcome::Cancelled => update.col_expr(jobs::Column::FinishedAt, Expr::value(now)),
        JobOutcome::HandBack => update
            .col_expr(jobs::Column::NextRunAt, Expr::value(now))
            .col_expr(
                jobs::Column::AttemptCount,
                Expr::col(jobs::Column::AttemptCount).sub(1),
            ),
    };
    let Some(job) = update
        .exec_with_returning(&transaction)
        .await?
        .into_iter()
        .next()
    else {
        transaction.rollback().await?;
        return Ok(None);
    };
    let error = match &outcome {
        JobOutcome::Failed(error) => Some(error),
        _ => report.error.as_ref(),
    };
    let data = attempt_event_data(Some(attempt.number), report.outcome, error);
    let notice = events::append(&transaction, &job, kind, Some(data)).await?;
    // Last: it locks the tenant's row, which every job of the tenant needs.
    if status.is_terminal() {
        budget::resolve_hold(&transaction, &job, Some(attempt.id), &spent).await?;
    }
    transaction.commit().await?;
    Ok(Some(vec![notice]))
}

/// Ends a claimed job that cannot be run at all — its stored input is unreadable, its
/// model has no price, or the database refuses to record its attempt — before any
/// call: FAILED with `error`, its hold resolved. Without this, lease expiry would hand
/// such a job back for ever, uncounted. `None` when the claim no longer owns the job.
pub async fn abandon_claim(
    db: &DatabaseConnection,
    claim: &Claim,
    error: &JobError,
) -> Result<Option<EventNotice>, DbErr> {
    let transaction = begin_write(db).await?;
    let now = Timestamp::now();
    let Some(job) = with_error(releasing_update(claim, now), error)
        .col_expr(jobs::Column::Status, Expr::value(JobStatus::Failed))
        .col_expr(jobs::Column::FinishedAt, Expr::value(now))
        .exec_with_returning(&transaction)
        .await?
        .into_iter()
        .next()
    else {
        transaction.rollback().await?;
        return Ok(None);
    };
    let spent = Spent::load(&transaction, job.id).await?;
    let data = json!({"error": {"code": error.code, "message": error.message}});
    let notice = events::append(&transaction, &job, EventKind::Failed, Some(data)).await?;
    // Last: it locks the tenant's row, which every job of the tenant needs.
    budget::resolve_hold(&transaction, &job, None, &spent).await?;
    transaction.commit().await?;
    Ok(Some(notice))
}

/// Replies that may fail a job's response schema before it fails for good: the first
/// try and two retries, within `maxAttempts`.
pub const INVALID_OUTPUT_RETRIES: u32 = 2;

/// The error of a job whose budget of paid calls is spent.
fn paid_call_limit(spent: &Spent) -> JobError {
    JobError::new(
        ErrorCode::PaidCallLimit,
        format!(
            "the job made {} provider calls that may have been billed, as many as it may pay for",
            spent.paid_calls
        ),
    )
}

async fn record_attempt(
    db: &impl ConnectionTrait,
    attempt: &attempts::Model,
    price: &ModelPrice,
    report: &AttemptReport,
    now: Timestamp,
) -> Result<(), DbErr> {
    // Exact cost when usage is known or nothing can have been billed; otherwise the
    // bound stored at the start stands.
    let exact_cost = match (&report.usage, report.not_billed) {
        (Some(usage), _) => Some(price.provider_cost(usage)),
        (None, true) => Some(Credits::ZERO),
        (None, false) => None,
    };
    let mut update = attempts::Entity::update_many()
        .col_expr(attempts::Column::Outcome, Expr::value(report.outcome))
        .col_expr(attempts::Column::FinishedAt, Expr::value(now))
        .col_expr(
            attempts::Column::LatencyMs,
            Expr::value(i64::try_from(report.latency.as_millis()).unwrap_or(i64::MAX)),
        )
        .col_expr(
            attempts::Column::ProviderRequestId,
            Expr::value(report.provider_request_id.clone().map(storable_text)),
        )
        .col_expr(
            attempts::Column::CustomerChargeNanos,
            Expr::value(report.customer_charge.nanos()),
        )
        .col_expr(
            attempts::Column::DeliveredOutputTokens,
            Expr::value(report.delivered_output_tokens.map(tokens)),
        )
        .col_expr(
            attempts::Column::ErrorCode,
            Expr::value(report.error.as_ref().map(|error| error.code.clone())),
        )
        .col_expr(
            attempts::Column::ErrorMessage,
            Expr::value(report.error.as_ref().map(|error| error.message.clone())),
        );
    if let Some(usage) = &report.usage {
        update = update
            .col_expr(
                attempts::Column::InputTokens,
                Expr::value(tokens(usage.input_tokens)),
            )
            .col_expr(
                attempts::Column::CachedInputTokens,
                Expr::value(tokens(usage.cached_input_tokens)),
            )
            .col_expr(
                attempts::Column::OutputTokens,
                Expr::value(tokens(usage.output_tokens)),
            );
    }
    if let Some(cost) = exact_cost {
        update = update
            .col_expr(
                attempts::Column::ProviderCostNanos,
                Expr::value(cost.nanos()),
            )
            .col_expr(
                attempts::Column::ProviderCostUpperBoundNanos,
                Expr::value(Option::<i64>::None),
            );
    }
    update
        .filter(attempts::Column::Id.eq(attempt.id))
        .filter(attempts::Column::RunToken.eq(attempt.run_token))
        .exec(db)
        .await?;
    Ok(())
}

fn tokens(count: u64) -> i64 {
    i64::try_from(count).unwrap_or(i64::MAX)
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

/// Most expired leases handled in one sweep.
const EXPIRY_BATCH: u64 = 100;

/// Takes back jobs whose attempt stopped renewing its lease (its worker crashed,
/// froze or lost the database). The lost attempt becomes `lease_expired`, keeping its
/// cost bound; the job is queued again, or ends when it was cancelled, has no
/// attempts left, or forbids retrying an unknown outcome.
pub async fn expire_leases(db: &DatabaseConnection) -> Result<Vec<EventNotice>, DbErr> {
    let now = Timestamp::now();
    let expired = jobs::Entity::find()
        .filter(jobs::Column::Status.eq(JobStatus::Running))
        .filter(jobs::Column::LeaseUntil.lt(now))
        .order_by_asc(jobs::Column::LeaseUntil)
        .limit(EXPIRY_BATCH)
        .all(db)
        .await?;
    let mut notices = Vec::new();
    for job in expired {
        let Some(run_token) = job.run_token else {
            continue;
        };
        let claim = Claim { job, run_token };
        if let Some(notice) = expire_lease(db, &claim, now).await? {
            notices.push(notice);
        }
    }
    Ok(notices)
}

async fn expire_lease(
    db: &DatabaseConnection,
    claim: &Claim,
    now: Timestamp,
) -> Result<Option<EventNotice>, DbErr> {
    let transaction = begin_write(db).await?;
    // Decide from the row as it is now, locked, not from the copy read before: a
    // cancel may have landed in between.
    let Some(job) = lock_claimed(&transaction, claim, now)
        .await?
        .filter(|job| job.lease_until.is_some_and(|lease| lease < now))
    else {
        // Renewed or finished in the meantime: the lease was not lost after all.
        transaction.rollback().await?;
        return Ok(None);
    };
    // A worker that died between its claim and its attempt row sent nothing: the
    // claim is given back without counting, whatever the retry policy says.
    let lost_attempt = attempts::Entity::find()
        .filter(attempts::Column::JobId.eq(job.id))
        .filter(attempts::Column::RunToken.eq(claim.run_token))
        .one(&transaction)
        .await?;
    // The lost attempt keeps the cost bound and the customer charge recorded when it
    // started: its call may have been billed.
    attempts::Entity::update_many()
        .col_expr(
            attempts::Column::Outcome,
            Expr::value(AttemptOutcome::LeaseExpired),
        )
        .col_expr(attempts::Column::FinishedAt, Expr::value(now))
        .col_expr(
            attempts::Column::ErrorCode,
            Expr::value(ErrorCode::LeaseExpired.as_str()),
        )
        .filter(attempts::Column::JobId.eq(job.id))
        .filter(attempts::Column::RunToken.eq(claim.run_token))
        .filter(attempts::Column::Outcome.eq(AttemptOutcome::Running))
        .exec(&transaction)
        .await?;
    let spent = Spent::load(&transaction, job.id).await?;
    let (status, kind, error) = if job.cancel_requested {
        (JobStatus::Cancelled, EventKind::Cancelled, None)
    } else if lost_attempt.is_none() {
        (JobStatus::Queued, EventKind::RetryScheduled, None)
    } else if job.attempt_count >= job.max_attempts {
        let error = JobError::new(
            ErrorCode::LeaseExpired,
            format!(
                "attempt {} stopped renewing its lease and no attempts are left",
                job.attempt_count
            ),
        );
        (JobStatus::Failed, EventKind::Failed, Some(error))
    } else if !spent.calls_left(&job) {
        (
            JobStatus::Failed,
            EventKind::Failed,
            Some(paid_call_limit(&spent)),
        )
    } else if !job.retry_unknown_outcome {
        let error = JobError::new(
            ErrorCode::OutcomeUnknown,
            "the attempt stopped renewing its lease after its request may have been sent, and the job does not retry unknown outcomes",
        );
        (JobStatus::Failed, EventKind::Failed, Some(error))
    } else {
        (JobStatus::Queued, EventKind::RetryScheduled, None)
    };
    let mut update = releasing_update(claim, now)
        .filter(jobs::Column::LeaseUntil.lt(now))
        .col_expr(jobs::Column::Status, Expr::value(status))
        .col_expr(jobs::Column::NextRunAt, Expr::value(now));
    if status.is_terminal() {
        update = update.col_expr(jobs::Column::FinishedAt, Expr::value(now));
    } else if lost_attempt.is_none() {
        update = update.col_expr(
            jobs::Column::AttemptCount,
            Expr::col(jobs::Column::AttemptCount).sub(1),
        );
    }
    if let Some(error) = &error {
        update = with_error(update, error);
    }
    let Some(job) = update
        .exec_with_returning(&transaction)
        .await?
        .into_iter()
        .next()
    else {
        // Renewed or finished in the meantime: the lease was not lost after all.
        transaction.rollback().await?;
        return Ok(None);
    };
    let data = attempt_event_data(
        lost_attempt.map(|attempt| attempt.number),
        AttemptOutcome::LeaseExpired,
        error.as_ref(),
    );
    let notice = events::append(&transaction, &job, kind, Some(data)).await?;
    // Last: it locks the tenant's row, which every job of the tenant needs.
    if status.is_terminal() {
        budget::resolve_hold(&transaction, &job, None, &spent).await?;
    }
    transaction.commit().await?;
    tracing::warn!(job.id = %job.id, status = ?job.status, "took back a job whose lease expired");
    Ok(Some(notice))
}
