//! A job's budget of paid provider calls.
//!
//! Every call that may have been billed counts — answers, unknown outcomes, calls
//! aborted at shutdown and handed back, calls lost with their worker — whether or not
//! it counts against `maxAttempts`. A job makes at most `maxAttempts` such calls, and
//! what they may cost (exact costs, and bounds where the outcome is unknown) never
//! passes its hold; neither do the customer charges its attempts carry. The hold is
//! sized for that many calls (`billing::CallBound::job_hold`), so the money limits
//! only bind when prices change while a job runs.

use crate::billing::{Credits, ledger, limits};
use entity::{AttemptOutcome, JobStatus, ReservationStatus, attempts, credit_reservations, jobs};
use sea_orm::{ColumnTrait, ConnectionTrait, DbErr, EntityTrait, QueryFilter, QueryOrder};
use uuid::Uuid;

/// What a job's attempts have used so far.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Spent {
    /// Attempt rows of the job, the running one included.
    pub attempts: u32,
    /// Calls that may have been billed.
    pub paid_calls: u32,
    /// Replies that failed the job's response schema.
    pub invalid_outputs: u32,
    /// What those calls cost: exact where usage is known, the bound otherwise.
    pub provider_exposure: Credits,
    /// The customer charges the attempts carry.
    pub customer_charges: Credits,
    /// The newest attempt with a customer charge, which a charge row names.
    pub last_charged_attempt: Option<Uuid>,
}

/// Whether an attempt may have cost money at the provider: anything but a call known
/// not to have been billed (never sent, refused with an error status, cancelled before
/// sending), which is recorded with an exact cost of zero and no usage. A running or
/// lost attempt counts.
pub fn may_have_been_billed(attempt: &attempts::Model) -> bool {
    attempt.provider_cost_nanos != Some(0) || attempt.input_tokens.is_some()
}

impl Spent {
    /// Sums a job's attempt rows.
    pub fn of(rows: &[attempts::Model]) -> Self {
        let mut spent = Self::default();
        for attempt in rows {
            spent.attempts += 1;
            if may_have_been_billed(attempt) {
                spent.paid_calls += 1;
            }
            if attempt.outcome == AttemptOutcome::InvalidOutput {
                spent.invalid_outputs += 1;
            }
            spent.provider_exposure = spent.provider_exposure
                + Credits::from_nanos(
                    attempt
                        .provider_cost_nanos
                        .or(attempt.provider_cost_upper_bound_nanos)
                        .unwrap_or(0),
                );
            let charge = Credits::from_nanos(attempt.customer_charge_nanos.unwrap_or(0));
            spent.customer_charges = spent.customer_charges + charge;
            if charge.is_positive() {
                spent.last_charged_attempt = Some(attempt.id);
            }
        }
        spent
    }

    /// Reads and sums a job's attempts, in the caller's transaction.
    pub async fn load(db: &impl ConnectionTrait, job_id: Uuid) -> Result<Self, DbErr> {
        let rows = attempts::Entity::find()
            .filter(attempts::Column::JobId.eq(job_id))
            .order_by_asc(attempts::Column::Number)
            .all(db)
            .await?;
        Ok(Self::of(&rows))
    }

    /// Whether the job may still pay for another call at all.
    pub fn calls_left(&self, job: &jobs::Model) -> bool {
        i64::from(self.paid_calls) < i64::from(job.max_attempts)
    }

    /// Whether one more call, costing at most `provider_bound` and charging the
    /// customer at most `customer_bound`, stays within the count and within `hold`.
    pub fn allows_call(
        &self,
        job: &jobs::Model,
        hold: Credits,
        provider_bound: Credits,
        customer_bound: Credits,
    ) -> bool {
        self.calls_left(job)
            && self.provider_exposure + provider_bound <= hold
            && self.customer_charges + customer_bound <= hold
    }
}

/// Resolves a terminal job's hold: charges the sum of its attempts' customer charges
/// (the settlement caps it at the hold) and releases the rest. A succeeded job is
/// always settled, even for nothing; any other job only when an attempt charged.
pub async fn resolve_hold(
    transaction: &impl ConnectionTrait,
    job: &jobs::Model,
    final_attempt: Option<Uuid>,
    spent: &Spent,
) -> Result<(), DbErr> {
    let charged_attempt = match job.status {
        JobStatus::Succeeded => final_attempt,
        _ if spent.customer_charges.is_positive() => spent.last_charged_attempt,
        _ => None,
    };
    let settlement = match charged_attempt {
        Some(attempt_id) => {
            ledger::settle(transaction, job.id, attempt_id, spent.customer_charges).await?
        }
        None => ledger::release(transaction, job.id).await?,
    };
    if let Some(settlement) = &settlement {
        limits::release_spend(
            transaction,
            job.tenant_id,
            job.created_at,
            settlement.released,
        )
        .await?;
    }
    // Every terminal transition resolves the hold here, in its own transaction: the
    // webhook outbox row commits with it, or not at all.
    let charged = settlement.map_or(Credits::ZERO, |settlement| settlement.charged);
    crate::webhooks::outbox::enqueue_job_finished(transaction, job, charged).await?;
    Ok(())
}

/// The credits held for a job while its hold is open; zero once resolved.
pub async fn open_hold(db: &impl ConnectionTrait, job_id: Uuid) -> Result<Credits, DbErr> {
    Ok(credit_reservations::Entity::find()
        .filter(credit_reservations::Column::JobId.eq(job_id))
        .filter(credit_reservations::Column::Status.eq(ReservationStatus::Held))
        .one(db)
        .await?
        .map_or(Credits::ZERO, |reservation| {
            Credits::from_nanos(reservation.amount_nanos)
        }))
}
