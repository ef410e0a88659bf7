//! The cost of each job: its provider cost over all its attempts against its charge,
//! by one per-job query that the job's `cost` field and the cost dashboard share.

use super::Credits;
use super::{Page, PageRequest, ReportScope, Window, unknown_cursor};
use crate::error::ServiceError;
use entity::{AttemptOutcome, JobStatus, Timestamp, attempts, charges, jobs};
use sea_orm::sea_query::{Expr, ExprTrait, Order, Query, SelectStatement};
use sea_orm::{
    ColumnTrait, ConnectionTrait, EntityTrait, FromQueryResult, PaginatorTrait, QueryFilter,
};
use uuid::Uuid;

/// A job's economics: provider cost over all its attempts against the customer's charge.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct JobCost {
    pub job_id: Uuid,
    pub tenant_id: Uuid,
    pub model: String,
    pub status: JobStatus,
    pub created_at: Timestamp,
    /// Attempt rows, failures and unknown outcomes included.
    pub attempts: i64,
    /// Attempts whose cost is still a bound (no exact cost recorded).
    pub unknown_attempts: i64,
    /// Σ exact attempt costs.
    pub provider_cost: Credits,
    /// Σ upper bounds of the attempts whose exact cost is unknown.
    pub unknown_bounds: Credits,
    /// The job's charge, zero when it has none.
    pub customer_charge: Credits,
}

impl JobCost {
    /// The most the job may have cost at the provider: exact costs plus the bounds of
    /// attempts whose cost is unknown.
    pub fn provider_cost_upper_bound(&self) -> Credits {
        self.provider_cost + self.unknown_bounds
    }

    /// `customer_charge − provider_cost` (exact costs only); negative when the job lost
    /// money.
    pub fn margin(&self) -> Credits {
        self.customer_charge - self.provider_cost
    }

    /// `customer_charge − provider_cost_upper_bound`: the margin if every unknown
    /// outcome was billed at its bound; equal to the margin once no cost is unknown.
    pub fn margin_at_worst(&self) -> Credits {
        self.customer_charge - self.provider_cost_upper_bound()
    }
}

/// The columns of the per-job cost query.
#[derive(FromQueryResult)]
struct JobCostRow {
    job_id: Uuid,
    tenant_id: Uuid,
    model: String,
    status: JobStatus,
    created_at: Timestamp,
    attempts: i64,
    unknown_attempts: i64,
    provider_cost_nanos: i64,
    unknown_bounds_nanos: i64,
    customer_charge_nanos: i64,
}

impl From<JobCostRow> for JobCost {
    fn from(row: JobCostRow) -> Self {
        Self {
            job_id: row.job_id,
            tenant_id: row.tenant_id,
            model: row.model,
            status: row.status,
            created_at: row.created_at,
            attempts: row.attempts,
            unknown_attempts: row.unknown_attempts,
            provider_cost: Credits::from_nanos(row.provider_cost_nanos),
            unknown_bounds: Credits::from_nanos(row.unknown_bounds_nanos),
            customer_charge: Credits::from_nanos(row.customer_charge_nanos),
        }
    }
}

pub(super) fn job_column(column: jobs::Column) -> Expr {
    Expr::col((jobs::Entity, column))
}

pub(super) fn attempt_column(column: attempts::Column) -> Expr {
    Expr::col((attempts::Entity, column))
}

/// `CAST(COALESCE(SUM(expr), 0) AS BIGINT)`: an exact integer sum on both backends.
pub(super) fn sum_bigint(expr: Expr) -> Expr {
    expr.sum().if_null(0).cast_as("BIGINT")
}

/// `SUM(CASE WHEN condition THEN 1 ELSE 0 END)` as a BIGINT.
pub(super) fn count_where(condition: Expr) -> Expr {
    sum_bigint(Expr::case(condition, 1).finally(0).into())
}

/// The jobs of `scope` created in `window` (their id, tenant, model, status and
/// creation time): the rows that [`per_job_costs`] adds the figures to.
pub(super) fn jobs_in(scope: ReportScope, window: Window) -> SelectStatement {
    let mut select = Query::select();
    select
        .columns(
            [
                jobs::Column::Id,
                jobs::Column::TenantId,
                jobs::Column::Model,
                jobs::Column::Status,
                jobs::Column::CreatedAt,
            ]
            .map(|column| (jobs::Entity, column)),
        )
        .from(jobs::Entity);
    if let Some(tenant_id) = scope.tenant_id() {
        select.and_where(jobs::Column::TenantId.eq(tenant_id));
    }
    if let Some(from) = window.from {
        select.and_where(jobs::Column::CreatedAt.gte(from));
    }
    if let Some(to) = window.to {
        select.and_where(jobs::Column::CreatedAt.lt(to));
    }
    select
}

/// One row per job of `jobs` (a [`jobs_in`] query, aliased `jobs`) with its attempt
/// and charge totals: jobs LEFT JOIN attempts LEFT JOIN charges, grouped by job. A job
/// has at most one charge, so the join never counts an attempt twice. Taking the jobs
/// as a subquery lets a page pick its jobs first and add up only theirs.
pub(super) fn per_job_costs(jobs: SelectStatement) -> SelectStatement {
    let mut select = Query::select();
    select
        .expr_as(job_column(jobs::Column::Id), "job_id")
        .expr_as(job_column(jobs::Column::TenantId), "tenant_id")
        .expr_as(job_column(jobs::Column::Model), "model")
        .expr_as(job_column(jobs::Column::Status), "status")
        .expr_as(job_column(jobs::Column::CreatedAt), "created_at")
        .expr_as(
            attempt_column(attempts::Column::Id)
                .count()
                .cast_as("BIGINT"),
            "attempts",
        )
        .expr_as(
            attempt_column(attempts::Column::Id)
                .count()
                .sub(attempt_column(attempts::Column::ProviderCostNanos).count())
                .cast_as("BIGINT"),
            "unknown_attempts",
        )
        .expr_as(
            count_where(attempts::Column::Outcome.eq(AttemptOutcome::Unknown)),
            "unknown_outcomes",
        )
        .expr_as(
            count_where(attempts::Column::Outcome.eq(AttemptOutcome::LeaseExpired)),
            "lease_expirations",
        )
        .expr_as(
            sum_bigint(attempt_column(attempts::Column::ProviderCostNanos)),
            "provider_cost_nanos",
        )
        .expr_as(
            sum_bigint(
                Expr::case(
                    attempts::Column::ProviderCostNanos.is_null(),
                    attempt_column(attempts::Column::ProviderCostUpperBoundNanos),
                )
                .finally(0)
                .into(),
            ),
            "unknown_bounds_nanos",
        )
        .expr_as(
            Expr::col((charges::Entity, charges::Column::AmountNanos))
                .max()
                .if_null(0)
                .cast_as("BIGINT"),
            "customer_charge_nanos",
        )
        .from_subquery(jobs, jobs::Entity)
        .left_join(
            attempts::Entity,
            attempt_column(attempts::Column::JobId).equals((jobs::Entity, jobs::Column::Id)),
        )
        .left_join(
            charges::Entity,
            Expr::col((charges::Entity, charges::Column::JobId))
                .equals((jobs::Entity, jobs::Column::Id)),
        )
        .group_by_columns([
            (jobs::Entity, jobs::Column::Id),
            (jobs::Entity, jobs::Column::TenantId),
            (jobs::Entity, jobs::Column::Model),
            (jobs::Entity, jobs::Column::Status),
            (jobs::Entity, jobs::Column::CreatedAt),
        ]);
    select
}

/// The cost of each of a tenant's jobs among `job_ids`, in no particular order. The
/// tenant is part of the query, so another tenant's job id finds nothing.
pub async fn costs_of_jobs(
    db: &impl ConnectionTrait,
    tenant_id: Uuid,
    job_ids: &[Uuid],
) -> Result<Vec<JobCost>, ServiceError> {
    let mut jobs = jobs_in(ReportScope::Tenant(tenant_id), Window::default());
    jobs.and_where(jobs::Column::Id.is_in(job_ids.iter().copied()));
    let select = per_job_costs(jobs);
    let rows = JobCostRow::find_by_statement(db.get_database_backend().build(&select))
        .all(db)
        .await?;
    Ok(rows.into_iter().map(JobCost::from).collect())
}

/// The cost of each job in `scope` created in `window`, newest first, a page at a time.
///
/// `page.after` must be a job the scope can see (else a validation error); the page
/// holds the jobs created before it.
pub async fn job_costs(
    db: &impl ConnectionTrait,
    scope: ReportScope,
    window: Window,
    page: PageRequest,
) -> Result<Page<JobCost>, ServiceError> {
    let mut page_jobs = jobs_in(scope, window);
    if let Some(after) = page.after {
        let mut cursor = jobs::Entity::find().filter(jobs::Column::Id.eq(after));
        if let Some(tenant_id) = scope.tenant_id() {
            cursor = cursor.filter(jobs::Column::TenantId.eq(tenant_id));
        }
        if cursor.count(db).await? == 0 {
            return Err(unknown_cursor());
        }
        // Ids are version-7 UUIDs: ordering by id is ordering by creation.
        page_jobs.and_where(jobs::Column::Id.lt(after));
    }
    page_jobs
        .order_by((jobs::Entity, jobs::Column::Id), Order::Desc)
        .limit(page.first + 1);
    let mut select = per_job_costs(page_jobs);
    select.order_by((jobs::Entity, jobs::Column::Id), Order::Desc);
    let rows = JobCostRow::find_by_statement(db.get_database_backend().build(&select))
        .all(db)
        .await?;
    Ok(Page::from_rows(
        rows.into_iter().map(JobCost::from).collect(),
        page.first,
    ))
}
