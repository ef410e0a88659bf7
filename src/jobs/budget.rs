//! A job's budget of paid provider calls.
//!
//! Every call that may have been billed counts — answers, unknown outcomes, calls lost
//! with their worker, calls aborted at shutdown beyond the first few — whether or not
//! it counts against `maxAttempts`. A job makes at most `maxAttempts` such calls, each
//! within its call bound: that is the ceiling of what the provider may bill for it.
//! The customer charges its attempts carry never pass its hold, which the charging
//! policy sizes for what it may charge (`billing::ChargingPolicy::job_hold`): a call
//! whose whole customer bound does not fit in what is left of the hold is not made.
//! Attempts charge at the price versions the hold was sized with
//! (`billing::prices::HeldPrices`), so a price raised while a job waits does not make
//! its calls outgrow the hold; the check binds only for a job held before versions
//! were recorded, or whose held version is somehow not stored.
//!
//! The first [`FREE_HAND_BACKS`] calls a job has aborted at shutdown and handed back
//! are counted apart: a rolling restart is the operator's doing, and charging the job's
//! paid calls for it let a few deploys fail a job that never got an answer. Their cost
//! bounds are the operator's exposure beyond the hold, bounded per job by that count.

use crate::billing::Credits;
use entity::JobErrorCode;
use entity::{AttemptOutcome, attempts, jobs};
use sea_orm::{ColumnTrait, ConnectionTrait, DbErr, EntityTrait, QueryFilter, QueryOrder};
use std::collections::HashMap;
use uuid::Uuid;

/// What a job's attempts have used so far.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Spent {
    /// Attempt rows of the job, the running one included.
    pub attempts: u32,
    /// Calls that may have been billed, but the free hand-backs.
    pub paid_calls: u32,
    /// Calls aborted at shutdown and handed back that count apart from the paid calls
    /// (at most [`FREE_HAND_BACKS`]).
    pub free_hand_backs: u32,
    /// Replies that failed the job's response schema.
    pub invalid_outputs: u32,
    /// What the paid calls cost: exact where usage is known, the bound otherwise.
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

/// Calls a job may have aborted at shutdown and handed back without spending its paid
/// calls; later ones count as paid calls. Three covers a rolling restart of every
/// process during one long call a few times over.
pub const FREE_HAND_BACKS: u32 = 3;

/// Whether an attempt is a call aborted at shutdown after it was sent (recorded as
/// an unknown outcome, `WORKER_SHUTDOWN`).
fn is_shutdown_abort(attempt: &attempts::Model) -> bool {
    attempt.outcome == AttemptOutcome::Unknown
        && attempt.error_code == Some(JobErrorCode::WorkerShutdown)
}

impl Spent {
    /// Sums a job's attempt rows.
    pub fn of(rows: &[attempts::Model]) -> Self {
        let mut spent = Self::default();
        for attempt in rows {
            spent.attempts += 1;
            let exposure = Credits::from_nanos(
                attempt
                    .provider_cost_nanos
                    .or(attempt.provider_cost_upper_bound_nanos)
                    .unwrap_or(0),
            );
            if is_shutdown_abort(attempt) && spent.free_hand_backs < FREE_HAND_BACKS {
                // Its bound is the operator's, outside the hold's money checks.
                spent.free_hand_backs += 1;
            } else {
                if may_have_been_billed(attempt) {
                    spent.paid_calls += 1;
                }
                spent.provider_exposure = spent.provider_exposure + exposure;
            }
            if attempt.outcome == AttemptOutcome::InvalidOutput {
                spent.invalid_outputs += 1;
            }
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
        let mut spent = Self::load_many(db, &[job_id]).await?;
        Ok(spent.remove(&job_id).unwrap_or_default())
    }

    /// [`Spent::load`] for several jobs in one query; a job with no attempts yet has
    /// spent nothing.
    pub async fn load_many(
        db: &impl ConnectionTrait,
        job_ids: &[Uuid],
    ) -> Result<HashMap<Uuid, Self>, DbErr> {
        let rows = attempts::Entity::find()
            .filter(attempts::Column::JobId.is_in(job_ids.iter().copied()))
            .order_by_asc(attempts::Column::JobId)
            .order_by_asc(attempts::Column::Number)
            .all(db)
            .await?;
        let mut by_job: HashMap<Uuid, Vec<attempts::Model>> = HashMap::new();
        for row in rows {
            by_job.entry(row.job_id).or_default().push(row);
        }
        Ok(job_ids
            .iter()
            .map(|job_id| {
                let spent = by_job
                    .get(job_id)
                    .map_or_else(Self::default, |rows| Self::of(rows));
                (*job_id, spent)
            })
            .collect())
    }

    /// Whether the job may still pay for another call at all.
    pub fn calls_left(&self, job: &jobs::Model) -> bool {
        i64::from(self.paid_calls) < i64::from(job.max_attempts)
    }

    /// Why one more call, charging the customer at most `customer_bound`, may not be
    /// made: `None` when it stays within the count of paid calls and its charges
    /// within `hold`. What the call may cost at the provider is bounded by the count
    /// alone: the failed calls the customer does not pay for are the operator's, and
    /// the hold is not sized for them.
    pub fn refuses_call(
        &self,
        job: &jobs::Model,
        hold: Credits,
        customer_bound: Credits,
    ) -> Option<Refusal> {
        if !self.calls_left(job) {
            Some(Refusal::NoPaidCallLeft)
        } else if self.customer_charges + customer_bound > hold {
            Some(Refusal::HoldShort)
        } else {
            None
        }
    }
}

/// Why the budget refuses a job's next call; the attempt fails `PAID_CALL_LIMIT`
/// unsent, saying which.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Refusal {
    /// The job already made `maxAttempts` calls that may have been billed.
    NoPaidCallLeft,
    /// What is left of the hold does not cover the call's whole customer bound at the
    /// price the attempt charges at.
    HoldShort,
}
