//! The billing summary of a window: the per-job query grouped by model and status.

use super::Credits;
use super::job_costs::{count_where, jobs_in, per_job_costs, sum_bigint};
use super::{ReportScope, Window};
use crate::error::ServiceError;
use entity::JobStatus;
use rust_decimal::{Decimal, RoundingStrategy};
use sea_orm::sea_query::{Expr, ExprTrait, Query};
use sea_orm::{ConnectionTrait, FromQueryResult};

/// The figures of one model within a [`BillingSummary`].
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ModelBilling {
    pub model: String,
    /// Jobs created in the window.
    pub jobs: i64,
    pub provider_cost: Credits,
    pub unknown_bounds: Credits,
    pub customer_charges: Credits,
}

impl ModelBilling {
    /// Exact costs plus the bounds of attempts whose cost is unknown.
    pub fn provider_cost_upper_bound(&self) -> Credits {
        self.provider_cost + self.unknown_bounds
    }

    /// `customer_charges − provider_cost`.
    pub fn margin(&self) -> Credits {
        self.customer_charges - self.provider_cost
    }

    /// `customer_charges − provider_cost_upper_bound`: the margin if every unknown
    /// outcome was billed at its bound.
    pub fn margin_at_worst(&self) -> Credits {
        self.customer_charges - self.provider_cost_upper_bound()
    }
}

/// What the jobs created in a window did and cost. Attempts and charges count with
/// the job they belong to, whenever they happened.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct BillingSummary {
    pub jobs_created: i64,
    pub jobs_succeeded: i64,
    pub jobs_failed: i64,
    pub jobs_cancelled: i64,
    /// Attempt rows of those jobs.
    pub provider_attempts: i64,
    /// Attempts beyond each job's first.
    pub retries: i64,
    /// Attempts whose outcome is `unknown`.
    pub unknown_outcomes: i64,
    /// Attempts whose lease lapsed.
    pub lease_expirations: i64,
    /// Σ exact attempt costs.
    pub provider_cost: Credits,
    /// Σ bounds of attempts whose exact cost is unknown.
    pub unknown_bounds: Credits,
    pub customer_charges: Credits,
    /// Per model, sorted by model name (byte order, the same on every backend).
    pub by_model: Vec<ModelBilling>,
}

impl BillingSummary {
    /// `retries ÷ provider_attempts`, 0 without attempts.
    pub fn retry_rate(&self) -> f64 {
        if self.provider_attempts == 0 {
            0.0
        } else {
            self.retries as f64 / self.provider_attempts as f64
        }
    }

    /// Exact costs plus the bounds of attempts whose cost is unknown.
    pub fn provider_cost_upper_bound(&self) -> Credits {
        self.provider_cost + self.unknown_bounds
    }

    /// `customer_charges − provider_cost`.
    pub fn margin(&self) -> Credits {
        self.customer_charges - self.provider_cost
    }

    /// `customer_charges − provider_cost_upper_bound`: the margin if every unknown
    /// outcome was billed at its bound.
    pub fn margin_at_worst(&self) -> Credits {
        self.customer_charges - self.provider_cost_upper_bound()
    }

    /// `provider_cost ÷ jobs_succeeded` (the cost of every attempt, failed jobs'
    /// included, spread over the jobs that succeeded), rounded half away from zero to
    /// the nano-credit; `None` when no job succeeded.
    pub fn cost_per_succeeded_job(&self) -> Option<Decimal> {
        if self.jobs_succeeded <= 0 {
            return None;
        }
        let cost = Decimal::new(self.provider_cost.nanos(), 9);
        Some(
            (cost / Decimal::from(self.jobs_succeeded))
                .round_dp_with_strategy(9, RoundingStrategy::MidpointAwayFromZero)
                .normalize(),
        )
    }
}

/// The totals of one (model, status) group of jobs.
#[derive(FromQueryResult)]
struct GroupRow {
    model: String,
    status: JobStatus,
    jobs: i64,
    attempts: i64,
    jobs_with_attempts: i64,
    unknown_outcomes: i64,
    lease_expirations: i64,
    provider_cost_nanos: i64,
    unknown_bounds_nanos: i64,
    customer_charge_nanos: i64,
}

/// The summary of the jobs in `scope` created in `window`: the per-job query as a
/// derived table, grouped by model and status — a handful of rows, folded here.
pub async fn billing_summary(
    db: &impl ConnectionTrait,
    scope: ReportScope,
    window: Window,
) -> Result<BillingSummary, ServiceError> {
    let per_job = "per_job";
    let column = |name: &'static str| Expr::col((per_job, name));
    let total = |name: &'static str| sum_bigint(column(name));
    let mut select = Query::select();
    select
        .expr_as(column("model"), "model")
        .expr_as(column("status"), "status")
        .expr_as(Expr::cust("COUNT(*)").cast_as("BIGINT"), "jobs")
        .expr_as(total("attempts"), "attempts")
        .expr_as(count_where(column("attempts").gt(0)), "jobs_with_attempts")
        .expr_as(total("unknown_outcomes"), "unknown_outcomes")
        .expr_as(total("lease_expirations"), "lease_expirations")
        .expr_as(total("provider_cost_nanos"), "provider_cost_nanos")
        .expr_as(total("unknown_bounds_nanos"), "unknown_bounds_nanos")
        .expr_as(total("customer_charge_nanos"), "customer_charge_nanos")
        .from_subquery(per_job_costs(jobs_in(scope, window)), per_job)
        .group_by_columns([(per_job, "model"), (per_job, "status")]);
    let groups = GroupRow::find_by_statement(db.get_database_backend().build(&select))
        .all(db)
        .await?;

    let mut summary = BillingSummary::default();
    for group in groups {
        summary.jobs_created += group.jobs;
        match group.status {
            JobStatus::Succeeded => summary.jobs_succeeded += group.jobs,
            JobStatus::Failed => summary.jobs_failed += group.jobs,
            JobStatus::Cancelled => summary.jobs_cancelled += group.jobs,
            JobStatus::Queued | JobStatus::Running => {}
        }
        summary.provider_attempts += group.attempts;
        summary.retries += group.attempts - group.jobs_with_attempts;
        summary.unknown_outcomes += group.unknown_outcomes;
        summary.lease_expirations += group.lease_expirations;
        let provider_cost = Credits::from_nanos(group.provider_cost_nanos);
        let unknown_bounds = Credits::from_nanos(group.unknown_bounds_nanos);
        let customer_charges = Credits::from_nanos(group.customer_charge_nanos);
        summary.provider_cost = summary.provider_cost + provider_cost;
        summary.unknown_bounds = summary.unknown_bounds + unknown_bounds;
        summary.customer_charges = summary.customer_charges + customer_charges;
        let index = match summary
            .by_model
            .binary_search_by(|model| model.model.as_str().cmp(&group.model))
        {
            Ok(index) => index,
            Err(index) => {
                summary.by_model.insert(
                    index,
                    ModelBilling {
                        model: group.model,
                        ..ModelBilling::default()
                    },
                );
                index
            }
        };
        let model = &mut summary.by_model[index];
        model.jobs += group.jobs;
        model.provider_cost = model.provider_cost + provider_cost;
        model.unknown_bounds = model.unknown_bounds + unknown_bounds;
        model.customer_charges = model.customer_charges + customer_charges;
    }
    Ok(summary)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cost_per_succeeded_job_rounds_to_the_nano_credit() {
        let summary = BillingSummary {
            jobs_succeeded: 3,
            provider_cost: Credits::from_nanos(2),
            ..BillingSummary::default()
        };
        assert_eq!(
            summary.cost_per_succeeded_job(),
            Some(Decimal::new(1, 9)),
            "2 nano-credits over 3 jobs is 0.67, rounded to 1"
        );
        let none = BillingSummary::default();
        assert_eq!(none.cost_per_succeeded_job(), None);
        assert_eq!(none.retry_rate(), 0.0);
    }
}
