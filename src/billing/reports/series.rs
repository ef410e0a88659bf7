//! Chart series and per-label totals: the per-job query grouped by a time interval or
//! by the value of one label, each one grouped query.

use super::Credits;
use super::job_costs::{count_where, jobs_in, per_job_costs, sum_bigint};
use super::{ReportScope, Window};
use crate::error::ServiceError;
use entity::{JobStatus, Timestamp, job_labels};
use sea_orm::sea_query::{Expr, ExprTrait, Query};
use sea_orm::{ConnectionTrait, FromQueryResult};

/// The most points one series may have: a month of hours or years of days, never an
/// unbounded vector built from the client's window.
pub const MAX_SERIES_POINTS: i64 = 1_000;

/// The length of one point of a series.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SeriesInterval {
    Hour,
    Day,
}

impl SeriesInterval {
    fn micros(self) -> i64 {
        match self {
            Self::Hour => 3_600_000_000,
            Self::Day => 86_400_000_000,
        }
    }
}

/// The figures of the jobs created in one interval, as [`super::BillingSummary`]
/// defines them.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SeriesPoint {
    pub start: Timestamp,
    pub jobs_created: i64,
    pub jobs_succeeded: i64,
    pub jobs_failed: i64,
    pub provider_attempts: i64,
    /// Attempts beyond each job's first.
    pub retries: i64,
    pub unknown_outcomes: i64,
    pub lease_expirations: i64,
    /// Σ exact attempt costs.
    pub provider_cost: Credits,
    pub customer_charges: Credits,
}

impl SeriesPoint {
    fn empty(start: Timestamp) -> Self {
        Self {
            start,
            jobs_created: 0,
            jobs_succeeded: 0,
            jobs_failed: 0,
            provider_attempts: 0,
            retries: 0,
            unknown_outcomes: 0,
            lease_expirations: 0,
            provider_cost: Credits::ZERO,
            customer_charges: Credits::ZERO,
        }
    }

    /// `retries ÷ provider_attempts`, 0 without attempts.
    pub fn retry_rate(&self) -> f64 {
        if self.provider_attempts == 0 {
            0.0
        } else {
            self.retries as f64 / self.provider_attempts as f64
        }
    }

    /// `customer_charges − provider_cost`.
    pub fn margin(&self) -> Credits {
        self.customer_charges - self.provider_cost
    }
}

/// The totals of one (interval, status) group of jobs.
#[derive(FromQueryResult)]
struct PointRow {
    point: i64,
    status: JobStatus,
    jobs: i64,
    attempts: i64,
    jobs_with_attempts: i64,
    unknown_outcomes: i64,
    lease_expirations: i64,
    provider_cost_nanos: i64,
    customer_charge_nanos: i64,
}

/// One point per `interval` from `from` up to `to` (the last one cut at `to`), each
/// the figures of the jobs in `scope` created in it. The intervals start at `from`,
/// not at a UTC hour or midnight, so a client picks its own day boundaries; empty
/// intervals are points of zeros. Creation times are integer microseconds on both
/// backends, so the interval of a job is `(created_at − from) ÷ length` in SQL.
pub async fn billing_series(
    db: &impl ConnectionTrait,
    scope: ReportScope,
    from: Timestamp,
    to: Timestamp,
    interval: SeriesInterval,
) -> Result<Vec<SeriesPoint>, ServiceError> {
    let window = Window::new(Some(from), Some(to))?;
    let step = interval.micros();
    // `to` is after `from` (the window says so): a positive span, rounded up; it
    // saturates rather than wraps between the far ends of the calendar.
    let span = to.micros().saturating_sub(from.micros());
    let points = span / step + i64::from(span % step != 0);
    if points > MAX_SERIES_POINTS {
        return Err(ServiceError::validation(format!(
            "a series has at most {MAX_SERIES_POINTS} points; this window has {points}"
        )));
    }
    let per_job = "per_job";
    let column = |name: &'static str| Expr::col((per_job, name));
    let total = |name: &'static str| sum_bigint(column(name));
    // The bounds are written into the SQL as integers rather than bound, so that the
    // GROUP BY expression is the selected one word for word (PostgreSQL compares them
    // as text, and two placeholders would differ).
    let point = Expr::cust(format!(
        r#"CAST(("{per_job}"."created_at" - {}) / {step} AS BIGINT)"#,
        from.micros()
    ));
    let mut select = Query::select();
    select
        .expr_as(point.clone(), "point")
        .expr_as(column("status"), "status")
        .expr_as(Expr::cust("COUNT(*)").cast_as("BIGINT"), "jobs")
        .expr_as(total("attempts"), "attempts")
        .expr_as(count_where(column("attempts").gt(0)), "jobs_with_attempts")
        .expr_as(total("unknown_outcomes"), "unknown_outcomes")
        .expr_as(total("lease_expirations"), "lease_expirations")
        .expr_as(total("provider_cost_nanos"), "provider_cost_nanos")
        .expr_as(total("customer_charge_nanos"), "customer_charge_nanos")
        .from_subquery(per_job_costs(jobs_in(scope, window)), per_job)
        .add_group_by([point, column("status")]);
    let rows = PointRow::find_by_statement(db.get_database_backend().build(&select))
        .all(db)
        .await?;

    let mut series: Vec<SeriesPoint> = (0..points)
        .map(|index| SeriesPoint::empty(Timestamp(from.micros() + index * step)))
        .collect();
    for row in rows {
        let Some(point) = usize::try_from(row.point)
            .ok()
            .and_then(|index| series.get_mut(index))
        else {
            continue;
        };
        point.jobs_created += row.jobs;
        match row.status {
            JobStatus::Succeeded => point.jobs_succeeded += row.jobs,
            JobStatus::Failed => point.jobs_failed += row.jobs,
            JobStatus::Cancelled | JobStatus::Queued | JobStatus::Running => {}
        }
        point.provider_attempts += row.attempts;
        point.retries += row.attempts - row.jobs_with_attempts;
        point.unknown_outcomes += row.unknown_outcomes;
        point.lease_expirations += row.lease_expirations;
        point.provider_cost = point.provider_cost + Credits::from_nanos(row.provider_cost_nanos);
        point.customer_charges =
            point.customer_charges + Credits::from_nanos(row.customer_charge_nanos);
    }
    Ok(series)
}

/// The figures of the jobs that carry one value of a label.
#[derive(Clone, Debug, PartialEq, Eq, FromQueryResult)]
struct LabelRow {
    value: String,
    jobs: i64,
    provider_cost_nanos: i64,
    customer_charge_nanos: i64,
}

/// The jobs created in a window that carry `key=value`, and what they cost.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LabelBilling {
    pub value: String,
    pub jobs: i64,
    /// Σ exact attempt costs of those jobs.
    pub provider_cost: Credits,
    /// Σ charges of those jobs.
    pub customer_charges: Credits,
}

impl LabelBilling {
    /// `customer_charges − provider_cost`.
    pub fn margin(&self) -> Credits {
        self.customer_charges - self.provider_cost
    }
}

/// One row per value of the label `key` among the jobs in `scope` created in `window`,
/// sorted by value (byte order, the same on every backend). A job without the label is
/// in no row: the rows add up to the labelled jobs, not to the window.
pub async fn billing_by_label(
    db: &impl ConnectionTrait,
    scope: ReportScope,
    window: Window,
    key: &str,
) -> Result<Vec<LabelBilling>, ServiceError> {
    let per_job = "per_job";
    let label = |column: job_labels::Column| Expr::col((job_labels::Entity, column));
    let mut select = Query::select();
    select
        .expr_as(label(job_labels::Column::Value), "value")
        .expr_as(Expr::cust("COUNT(*)").cast_as("BIGINT"), "jobs")
        .expr_as(
            sum_bigint(Expr::col((per_job, "provider_cost_nanos"))),
            "provider_cost_nanos",
        )
        .expr_as(
            sum_bigint(Expr::col((per_job, "customer_charge_nanos"))),
            "customer_charge_nanos",
        )
        .from_subquery(per_job_costs(jobs_in(scope, window)), per_job)
        .inner_join(
            job_labels::Entity,
            label(job_labels::Column::JobId)
                .equals((per_job, "job_id"))
                .and(label(job_labels::Column::Key).eq(key)),
        )
        .group_by_col((job_labels::Entity, job_labels::Column::Value));
    if let ReportScope::Tenant(tenant_id) = scope {
        // Redundant with the job's tenant, but it lets the label index be searched by
        // (tenant, key) first.
        select.and_where(label(job_labels::Column::TenantId).eq(tenant_id));
    }
    let mut rows = LabelRow::find_by_statement(db.get_database_backend().build(&select))
        .all(db)
        .await?;
    rows.sort_by(|a, b| a.value.cmp(&b.value));
    Ok(rows
        .into_iter()
        .map(|row| LabelBilling {
            value: row.value,
            jobs: row.jobs,
            provider_cost: Credits::from_nanos(row.provider_cost_nanos),
            customer_charges: Credits::from_nanos(row.customer_charge_nanos),
        })
        .collect())
}
