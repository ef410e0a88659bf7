//! What a job held, cost and charged.

use super::{ReservationStatus, money, time};
use crate::billing::reports;
use crate::graphql::scalars::Amount;
use async_graphql::{Object, SimpleObject};
use chrono::{DateTime, Utc};
use entity::{charges, credit_reservations};
use uuid::Uuid;

/// The credits held for a job.
pub struct Reservation(pub credit_reservations::Model);

#[Object]
impl Reservation {
    async fn id(&self) -> Uuid {
        self.0.id
    }

    /// The amount held when the job was created.
    async fn amount(&self) -> Amount {
        money(self.0.amount_nanos)
    }

    async fn status(&self) -> ReservationStatus {
        self.0.status.into()
    }

    /// The part of the hold that was charged.
    async fn settled_amount(&self) -> Amount {
        money(self.0.settled_amount_nanos)
    }

    /// The part of the hold given back.
    async fn released_amount(&self) -> Amount {
        money(self.0.released_amount_nanos)
    }
}

/// What the customer paid for a job.
pub struct Charge(pub charges::Model);

#[Object]
impl Charge {
    async fn id(&self) -> Uuid {
        self.0.id
    }

    async fn amount(&self) -> Amount {
        money(self.0.amount_nanos)
    }

    async fn created_at(&self) -> DateTime<Utc> {
        time(self.0.created_at)
    }
}

/// A job's economics.
#[derive(SimpleObject)]
pub struct JobCost {
    /// Exact provider cost, summed over every attempt whose cost is known.
    pub provider_cost: Amount,
    /// The most the job may have cost at the provider: the exact costs plus the bounds
    /// of attempts whose outcome is unknown.
    pub provider_cost_upper_bound: Amount,
    pub customer_charge: Amount,
    /// `customerCharge − providerCost`: exact costs only, the margin at best while a
    /// cost is unknown.
    pub margin: Amount,
    /// `customerCharge − providerCostUpperBound`: the margin if every attempt whose
    /// cost is unknown was billed at its bound. `margin` counts exact costs only, so it
    /// can show a profit while this shows the loss it may be; they agree once no cost
    /// is unknown.
    pub margin_at_worst: Amount,
    /// Attempts whose cost is still a bound.
    pub unknown_attempts: i32,
}

impl From<reports::JobCost> for JobCost {
    fn from(cost: reports::JobCost) -> Self {
        Self {
            provider_cost: cost.provider_cost.into(),
            provider_cost_upper_bound: cost.provider_cost_upper_bound().into(),
            customer_charge: cost.customer_charge.into(),
            margin: cost.margin().into(),
            margin_at_worst: cost.margin_at_worst().into(),
            unknown_attempts: i32::try_from(cost.unknown_attempts).unwrap_or(i32::MAX),
        }
    }
}
