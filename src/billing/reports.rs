//! The billing dashboards: what each job cost at the provider against what the
//! customer paid, a summary over a time window, and the credit ledger.
//!
//! Every figure is computed in the database with aggregate SQL (one grouped query per
//! report; a page of job costs picks its jobs first and adds up only theirs), never by
//! loading a tenant's rows into memory. Sums of BIGINT nano-credits are cast back to
//! BIGINT because PostgreSQL's `SUM(bigint)` is a `numeric`.
//!
//! One definition of a job's cost serves both the `cost` field of a job and the cost
//! dashboard: [`costs_of_jobs`] and [`job_costs`] run the same per-job query.

use super::Credits;
use crate::accounts::{Principal, tenants};
use crate::error::ServiceError;
use entity::{AttemptOutcome, JobStatus, Timestamp, attempts, charges, jobs, ledger_entries};
use rust_decimal::{Decimal, RoundingStrategy};
use sea_orm::sea_query::{Expr, ExprTrait, Order, Query, SelectStatement};
use sea_orm::{
    ColumnTrait, ConnectionTrait, EntityTrait, FromQueryResult, PaginatorTrait, QueryFilter,
    QueryOrder, QuerySelect,
};
use uuid::Uuid;

/// Rows per page when the client does not say.
pub const DEFAULT_PAGE_SIZE: u64 = 20;
/// The most rows one page may hold.
pub const MAX_PAGE_SIZE: u64 = 100;

/// Whose figures a report covers.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Scope {
    /// One tenant's jobs and ledger.
    Tenant(Uuid),
    /// Every tenant's (admins only).
    AllTenants,
}

impl Scope {
    /// The scope `principal` may see when it asks for `requested` (a tenant id or none).
    ///
    /// A tenant sees itself: naming no tenant or its own id is the same, naming another
    /// tenant is `Forbidden`. An admin sees the tenant it names (`NotFound` when there is
    /// no such tenant), or every tenant when it names none.
    pub async fn for_caller(
        db: &impl ConnectionTrait,
        principal: Principal,
        requested: Option<Uuid>,
    ) -> Result<Self, ServiceError> {
        match (principal, requested) {
            (Principal::Tenant { tenant_id }, None) => Ok(Self::Tenant(tenant_id)),
            (Principal::Tenant { tenant_id }, Some(requested)) if requested == tenant_id => {
                Ok(Self::Tenant(tenant_id))
            }
            (Principal::Tenant { .. }, Some(_)) => Err(ServiceError::Forbidden),
            (Principal::Admin, Some(requested)) => {
                tenants::find_tenant(db, requested).await?;
                Ok(Self::Tenant(requested))
            }
            (Principal::Admin, None) => Ok(Self::AllTenants),
        }
    }

    /// The one tenant whose figures `principal` may see, as [`Scope::for_caller`] says,
    /// for reports that cover a single tenant: an admin must name it.
    pub async fn single_tenant(
        db: &impl ConnectionTrait,
        principal: Principal,
        requested: Option<Uuid>,
    ) -> Result<Uuid, ServiceError> {
        match Self::for_caller(db, principal, requested).await? {
            Self::Tenant(tenant_id) => Ok(tenant_id),
            Self::AllTenants => Err(ServiceError::validation(
                "tenantId is required for an admin",
            )),
        }
    }

    fn tenant_id(self) -> Option<Uuid> {
        match self {
            Self::Tenant(tenant_id) => Some(tenant_id),
            Self::AllTenants => None,
        }
    }
}

/// Jobs created in `[from, to)`; either bound may be open.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Window {
    pub from: Option<Timestamp>,
    pub to: Option<Timestamp>,
}

impl Window {
    /// A window; `to` must come after `from` when both are given.
    pub fn new(from: Option<Timestamp>, to: Option<Timestamp>) -> Result<Self, ServiceError> {
        if let (Some(from), Some(to)) = (from, to)
            && to <= from
        {
            return Err(ServiceError::validation("to must be after from"));
        }
        Ok(Self { from, to })
    }
}

/// Which page of a newest-first list: `first` rows older than the row `after`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PageRequest {
    pub first: u64,
    pub after: Option<Uuid>,
}

impl PageRequest {
    /// A page request from the client's `first` (default 20, 1 to 100) and `after`
    /// (the cursor of the previous page's last row).
    pub fn new(first: Option<i32>, after: Option<&str>) -> Result<Self, ServiceError> {
        let first = match first {
            None => DEFAULT_PAGE_SIZE,
            Some(first) => u64::try_from(first)
                .ok()
                .filter(|first| (1..=MAX_PAGE_SIZE).contains(first))
                .ok_or_else(|| {
                    ServiceError::validation(format!("first must be 1 to {MAX_PAGE_SIZE}"))
                })?,
        };
        let after = after
            .map(|cursor| Uuid::parse_str(cursor).map_err(|_| unknown_cursor()))
            .transpose()?;
        Ok(Self { first, after })
    }
}

fn unknown_cursor() -> ServiceError {
    ServiceError::validation("after is not a cursor from this list")
}

/// One page of a newest-first list.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Page<T> {
    pub items: Vec<T>,
    pub has_next_page: bool,
}

impl<T> Page<T> {
    /// The page from `first + 1` fetched rows: the extra row only says there is more.
    fn from_rows(mut items: Vec<T>, first: u64) -> Self {
        let has_next_page = items.len() as u64 > first;
        items.truncate(usize::try_from(first).unwrap_or(usize::MAX));
        Self {
            items,
            has_next_page,
        }
    }
}

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

fn job_column(column: jobs::Column) -> Expr {
    Expr::col((jobs::Entity, column))
}

fn attempt_column(column: attempts::Column) -> Expr {
    Expr::col((attempts::Entity, column))
}

/// `CAST(COALESCE(SUM(expr), 0) AS BIGINT)`: an exact integer sum on both backends.
fn sum_bigint(expr: Expr) -> Expr {
    expr.sum().if_null(0).cast_as("BIGINT")
}

/// `SUM(CASE WHEN condition THEN 1 ELSE 0 END)` as a BIGINT.
fn count_where(condition: Expr) -> Expr {
    sum_bigint(Expr::case(condition, 1).finally(0).into())
}

/// The jobs of `scope` created in `window` (their id, tenant, model, status and
/// creation time): the rows that [`per_job_costs`] adds the figures to.
fn jobs_in(scope: Scope, window: Window) -> SelectStatement {
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
fn per_job_costs(jobs: SelectStatement) -> SelectStatement {
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
    let mut jobs = jobs_in(Scope::Tenant(tenant_id), Window::default());
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
    scope: Scope,
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
    scope: Scope,
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

/// A tenant's ledger entries, newest first, a page at a time. `page.after` must be one
/// of the tenant's entries (else a validation error).
pub async fn credit_ledger(
    db: &impl ConnectionTrait,
    tenant_id: Uuid,
    page: PageRequest,
) -> Result<Page<ledger_entries::Model>, ServiceError> {
    let mut query =
        ledger_entries::Entity::find().filter(ledger_entries::Column::TenantId.eq(tenant_id));
    if let Some(after) = page.after {
        let known = ledger_entries::Entity::find()
            .filter(ledger_entries::Column::Id.eq(after))
            .filter(ledger_entries::Column::TenantId.eq(tenant_id))
            .count(db)
            .await?;
        if known == 0 {
            return Err(unknown_cursor());
        }
        query = query.filter(ledger_entries::Column::Id.lt(after));
    }
    let entries = query
        .order_by_desc(ledger_entries::Column::Id)
        .limit(page.first + 1)
        .all(db)
        .await?;
    Ok(Page::from_rows(entries, page.first))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn page_requests_default_to_twenty_and_refuse_bad_sizes_and_cursors() {
        assert_eq!(PageRequest::new(None, None).unwrap().first, 20);
        assert_eq!(PageRequest::new(Some(100), None).unwrap().first, 100);
        for first in [0, -1, 101] {
            assert!(matches!(
                PageRequest::new(Some(first), None),
                Err(ServiceError::Validation(_))
            ));
        }
        assert!(matches!(
            PageRequest::new(None, Some("not-a-cursor")),
            Err(ServiceError::Validation(_))
        ));
    }

    #[test]
    fn a_window_must_not_end_before_it_starts() {
        let at = Timestamp(1_000);
        assert!(Window::new(Some(at), Some(at)).is_err());
        assert!(Window::new(Some(at), Some(Timestamp(999))).is_err());
        assert!(Window::new(Some(at), Some(Timestamp(1_001))).is_ok());
        assert!(Window::new(None, Some(at)).is_ok());
    }

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
