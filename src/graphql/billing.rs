//! The billing dashboards: per-job costs, a summary over a time window and the credit
//! ledger, for tenants (their own figures) and admins (any tenant's, or all).

use super::loaders::{JobKey, JobOf, LabelsOf, MetadataOf};
use super::scalars::Amount;
use super::types::{JobStatus, Label, PageInfo, connect, edge};
use super::{app, loader, principal};
use crate::billing::Credits;
use crate::billing::reports::{self, PageRequest, Window};
use async_graphql::{ComplexObject, Context, Enum, Json, Object, SimpleObject};
use chrono::{DateTime, Utc};
use entity::{Timestamp, ledger_entries};
use uuid::Uuid;

fn money(amount: Credits) -> Amount {
    Amount::from(amount)
}

fn time(timestamp: Timestamp) -> DateTime<Utc> {
    timestamp.to_datetime()
}

/// The window of creation times `[from, to)`, at microsecond precision.
fn window(from: Option<DateTime<Utc>>, to: Option<DateTime<Utc>>) -> async_graphql::Result<Window> {
    Ok(Window::new(
        from.map(Timestamp::from),
        to.map(Timestamp::from),
    )?)
}

/// One job's economics, as the cost dashboard lists it. The figures are those of the
/// job's `cost` field; the idempotency key, labels and metadata attribute them to the
/// client's own users, documents and uploads.
#[derive(SimpleObject)]
#[graphql(complex)]
pub struct JobCostLine {
    pub job_id: Uuid,
    pub tenant_id: Uuid,
    pub model: String,
    pub status: JobStatus,
    /// Attempt rows, failures and unknown outcomes included.
    pub attempts: i64,
    /// Σ exact attempt costs.
    pub provider_cost: Amount,
    /// The most the job may have cost at the provider: the exact costs plus the bounds
    /// of attempts whose cost is unknown.
    pub provider_cost_upper_bound: Amount,
    /// Attempts whose cost is still a bound.
    pub unknown_attempts: i64,
    /// What the customer paid: the job's charge, 0 when it has none.
    pub customer_charge: Amount,
    /// `customerCharge − providerCost`: exact costs only, the margin at best while a
    /// cost is unknown.
    pub margin: Amount,
    /// `customerCharge − providerCostUpperBound`: the margin if every attempt whose
    /// cost is unknown was billed at its bound. `margin` counts exact costs only, so it
    /// can show a profit while this shows the loss it may be; they agree once no cost
    /// is unknown.
    pub margin_at_worst: Amount,
    pub created_at: DateTime<Utc>,
}

impl From<reports::JobCost> for JobCostLine {
    fn from(cost: reports::JobCost) -> Self {
        Self {
            job_id: cost.job_id,
            tenant_id: cost.tenant_id,
            status: cost.status.into(),
            attempts: cost.attempts,
            provider_cost: money(cost.provider_cost),
            provider_cost_upper_bound: money(cost.provider_cost_upper_bound()),
            unknown_attempts: cost.unknown_attempts,
            customer_charge: money(cost.customer_charge),
            margin: money(cost.margin()),
            margin_at_worst: money(cost.margin_at_worst()),
            created_at: time(cost.created_at),
            model: cost.model,
        }
    }
}

#[ComplexObject]
impl JobCostLine {
    /// The client's key for the job.
    async fn idempotency_key(&self, context: &Context<'_>) -> async_graphql::Result<String> {
        let job = loader(context).load_one(JobOf(self.key())).await?.flatten();
        Ok(job.map(|job| job.idempotency_key).unwrap_or_default())
    }

    /// The job's labels, in order of key.
    async fn labels(&self, context: &Context<'_>) -> async_graphql::Result<Vec<Label>> {
        let rows = loader(context).load_one(LabelsOf(self.key())).await?;
        Ok(rows
            .unwrap_or_default()
            .into_iter()
            .map(|row| Label {
                key: row.key,
                value: row.value,
            })
            .collect())
    }

    /// The metadata the job was created with; null without any, or once retention
    /// pruned the job's payloads.
    async fn metadata(
        &self,
        context: &Context<'_>,
    ) -> async_graphql::Result<Option<Json<serde_json::Value>>> {
        let metadata = loader(context).load_one(MetadataOf(self.key())).await?;
        Ok(metadata.flatten().map(Json))
    }
}

impl JobCostLine {
    fn key(&self) -> JobKey {
        JobKey {
            tenant_id: self.tenant_id,
            job_id: self.job_id,
        }
    }
}

edge!(
    /// A job's cost line and the cursor to page on from it.
    JobCostEdge of JobCostLine
);

/// A page of job costs.
#[derive(SimpleObject)]
pub struct JobCostConnection {
    pub edges: Vec<JobCostEdge>,
    pub page_info: PageInfo,
}

/// One model's share of a billing summary.
#[derive(SimpleObject)]
pub struct ModelBilling {
    pub model: String,
    /// Jobs of this model created in the window.
    pub jobs: i64,
    /// Σ exact costs of those jobs' attempts.
    pub provider_cost: Amount,
    /// `providerCost` plus the bounds of attempts whose cost is unknown.
    pub provider_cost_upper_bound: Amount,
    /// Σ charges of those jobs.
    pub customer_charges: Amount,
    /// `customerCharges − providerCost`: exact costs only, the margin at best while a
    /// cost is unknown.
    pub margin: Amount,
    /// `customerCharges − providerCostUpperBound`: the margin if every attempt whose
    /// cost is unknown was billed at its bound. `margin` counts exact costs only, so it
    /// can show a profit while this shows the loss it may be; they agree once no cost
    /// is unknown.
    pub margin_at_worst: Amount,
}

/// What the jobs created in a window did and cost. Attempts and charges count with the
/// job they belong to, even when they happened after the window.
#[derive(SimpleObject)]
pub struct BillingSummary {
    /// Jobs created in the window, whatever their status.
    pub jobs_created: i64,
    pub jobs_succeeded: i64,
    pub jobs_failed: i64,
    pub jobs_cancelled: i64,
    /// Attempt rows of those jobs, failures and unknown outcomes included.
    pub provider_attempts: i64,
    /// Attempts beyond each job's first ÷ `providerAttempts`; 0 without attempts.
    pub retry_rate: f64,
    /// Attempts whose outcome is `UNKNOWN` (sent, no answer: possibly billed).
    pub unknown_outcomes: i64,
    /// Attempts whose worker's lease lapsed (`LEASE_EXPIRED`).
    pub lease_expirations: i64,
    /// Σ exact attempt costs.
    pub provider_cost: Amount,
    /// `providerCost` plus the bounds of attempts whose cost is unknown.
    pub provider_cost_upper_bound: Amount,
    /// Σ charges of those jobs.
    pub customer_charges: Amount,
    /// `customerCharges − providerCost`: exact costs only, the margin at best while a
    /// cost is unknown.
    pub margin: Amount,
    /// `customerCharges − providerCostUpperBound`: the margin if every attempt whose
    /// cost is unknown was billed at its bound. `margin` counts exact costs only, so it
    /// can show a profit while this shows the loss it may be; they agree once no cost
    /// is unknown.
    pub margin_at_worst: Amount,
    /// `providerCost ÷ jobsSucceeded` — what each success cost, failed jobs' attempts
    /// included — rounded half away from zero to 9 decimals; null when no job succeeded.
    pub cost_per_succeeded_job: Option<Amount>,
    /// Per model, sorted by model name.
    pub by_model: Vec<ModelBilling>,
}

impl From<reports::BillingSummary> for BillingSummary {
    fn from(summary: reports::BillingSummary) -> Self {
        Self {
            jobs_created: summary.jobs_created,
            jobs_succeeded: summary.jobs_succeeded,
            jobs_failed: summary.jobs_failed,
            jobs_cancelled: summary.jobs_cancelled,
            provider_attempts: summary.provider_attempts,
            retry_rate: summary.retry_rate(),
            unknown_outcomes: summary.unknown_outcomes,
            lease_expirations: summary.lease_expirations,
            provider_cost: money(summary.provider_cost),
            provider_cost_upper_bound: money(summary.provider_cost_upper_bound()),
            customer_charges: money(summary.customer_charges),
            margin: money(summary.margin()),
            margin_at_worst: money(summary.margin_at_worst()),
            cost_per_succeeded_job: summary.cost_per_succeeded_job().map(Amount),
            by_model: summary
                .by_model
                .into_iter()
                .map(|model| ModelBilling {
                    jobs: model.jobs,
                    provider_cost: money(model.provider_cost),
                    provider_cost_upper_bound: money(model.provider_cost_upper_bound()),
                    customer_charges: money(model.customer_charges),
                    margin: money(model.margin()),
                    margin_at_worst: money(model.margin_at_worst()),
                    model: model.model,
                })
                .collect(),
        }
    }
}

/// The length of one point of a `billingSeries`.
#[derive(Enum, Clone, Copy, Debug, PartialEq, Eq)]
#[graphql(remote = "reports::SeriesInterval")]
pub enum SeriesInterval {
    Hour,
    Day,
}

/// The jobs created in one interval of a `billingSeries`, with the figures of
/// `billingSummary` over that interval.
#[derive(SimpleObject)]
pub struct SeriesPoint {
    /// Where the interval starts; it ends at the next point's start (the last one at
    /// `to`).
    pub start: DateTime<Utc>,
    /// Jobs created in the interval, whatever their status.
    pub jobs_created: i64,
    pub jobs_succeeded: i64,
    pub jobs_failed: i64,
    /// Σ exact attempt costs of those jobs.
    pub provider_cost: Amount,
    /// Σ charges of those jobs.
    pub customer_charges: Amount,
    /// `customerCharges − providerCost`.
    pub margin: Amount,
    /// Attempt rows of those jobs, failures and unknown outcomes included.
    pub provider_attempts: i64,
    /// Attempts beyond each job's first ÷ `providerAttempts`; 0 without attempts.
    pub retry_rate: f64,
    /// Attempts of those jobs whose outcome is `UNKNOWN`.
    pub unknown_outcomes: i64,
    /// Attempts of those jobs whose worker's lease lapsed (`LEASE_EXPIRED`).
    pub lease_expirations: i64,
}

impl From<reports::SeriesPoint> for SeriesPoint {
    fn from(point: reports::SeriesPoint) -> Self {
        Self {
            start: time(point.start),
            jobs_created: point.jobs_created,
            jobs_succeeded: point.jobs_succeeded,
            jobs_failed: point.jobs_failed,
            provider_cost: money(point.provider_cost),
            customer_charges: money(point.customer_charges),
            margin: money(point.margin()),
            provider_attempts: point.provider_attempts,
            retry_rate: point.retry_rate(),
            unknown_outcomes: point.unknown_outcomes,
            lease_expirations: point.lease_expirations,
        }
    }
}

/// The jobs created in a window that carry one value of a label.
#[derive(SimpleObject)]
pub struct LabelBilling {
    /// The label's value.
    pub value: String,
    /// Jobs with `key=value` created in the window.
    pub jobs: i64,
    /// Σ exact attempt costs of those jobs.
    pub provider_cost: Amount,
    /// Σ charges of those jobs.
    pub customer_charges: Amount,
    /// `customerCharges − providerCost`.
    pub margin: Amount,
}

impl From<reports::LabelBilling> for LabelBilling {
    fn from(label: reports::LabelBilling) -> Self {
        Self {
            provider_cost: money(label.provider_cost),
            customer_charges: money(label.customer_charges),
            margin: money(label.margin()),
            jobs: label.jobs,
            value: label.value,
        }
    }
}

/// A movement of credits; the amount is positive and the kind gives the direction.
#[derive(Enum, Clone, Copy, Debug, PartialEq, Eq)]
#[graphql(remote = "entity::LedgerEntryKind")]
pub enum LedgerEntryKind {
    /// Credits added by an admin: granted goes up.
    Grant,
    /// Credits held for a new job: available goes down.
    Hold,
    /// The unused part of a hold given back: available goes up.
    Release,
    /// What a succeeded job cost the customer, taken from its hold.
    Charge,
    /// What was left of a grant at its `expiresAt`, at most what was available (held
    /// credit never expires): available goes down. Dated at the expiry instant.
    Expiry,
}

/// One entry of a tenant's append-only credit ledger.
#[derive(SimpleObject)]
pub struct LedgerEntry {
    pub id: Uuid,
    pub kind: LedgerEntryKind,
    /// Always positive; `kind` gives the direction.
    pub amount: Amount,
    /// The job a hold, release or charge belongs to.
    pub job_id: Option<Uuid>,
    /// The grant a `GRANT` or `EXPIRY` entry is about.
    pub grant_id: Option<Uuid>,
    pub created_at: DateTime<Utc>,
}

impl From<ledger_entries::Model> for LedgerEntry {
    fn from(entry: ledger_entries::Model) -> Self {
        Self {
            id: entry.id,
            kind: entry.kind.into(),
            amount: money(Credits::from_nanos(entry.amount_nanos)),
            job_id: entry.job_id,
            grant_id: entry.grant_id,
            created_at: time(entry.created_at),
        }
    }
}

edge!(
    /// A ledger entry and the cursor to page on from it.
    LedgerEntryEdge of LedgerEntry
);

/// A page of ledger entries.
#[derive(SimpleObject)]
pub struct LedgerEntryConnection {
    pub edges: Vec<LedgerEntryEdge>,
    pub page_info: PageInfo,
}

/// The billing dashboards.
#[derive(Default)]
pub struct BillingQuery;

#[Object]
impl BillingQuery {
    /// One line per job created in `[from, to)` (either bound optional), newest first,
    /// `first` at a time (default 20, at most 100) after the cursor `after` (the
    /// `endCursor` of the previous page; an unknown cursor is a `VALIDATION` error).
    /// Each line agrees with the job's `cost` field: `attempts` counts attempt rows,
    /// `providerCost` sums exact attempt costs, `providerCostUpperBound` adds the bounds
    /// of attempts whose cost is unknown, `customerCharge` is the charge (0 without
    /// one) and `margin = customerCharge − providerCost`.
    ///
    /// A tenant sees its own jobs (naming another `tenantId` is `FORBIDDEN`); an admin
    /// sees the named tenant's jobs, or every tenant's when `tenantId` is omitted.
    #[graphql(complexity = "super::cost::page_complexity(first, child_complexity)")]
    async fn job_costs(
        &self,
        context: &Context<'_>,
        from: Option<DateTime<Utc>>,
        to: Option<DateTime<Utc>>,
        first: Option<i32>,
        after: Option<String>,
        tenant_id: Option<Uuid>,
    ) -> async_graphql::Result<JobCostConnection> {
        let db = &app(context).db;
        let scope = principal(context)?.report_scope(db, tenant_id).await?;
        let page = PageRequest::new(first, after.as_deref())?;
        let costs = reports::job_costs(db, scope, window(from, to)?, page).await?;
        let (edges, page_info) = connect(costs, |cost| (cost.job_id, cost.into()));
        Ok(JobCostConnection { edges, page_info })
    }

    /// Totals over the jobs created in `[from, to)`: job counts by outcome, their
    /// attempts (with the retry rate, unknown outcomes and lease expirations), provider
    /// cost (exact, and with the bounds of unknown outcomes), customer charges, margin
    /// and cost per succeeded job, overall and per model. Attempts and charges count
    /// with their job even when they happened after `to`.
    ///
    /// A tenant sees its own figures (naming another `tenantId` is `FORBIDDEN`); an
    /// admin sees the named tenant's, or every tenant's when `tenantId` is omitted.
    #[graphql(complexity = "super::cost::REPORT_COMPLEXITY + child_complexity")]
    async fn billing_summary(
        &self,
        context: &Context<'_>,
        from: DateTime<Utc>,
        to: DateTime<Utc>,
        tenant_id: Option<Uuid>,
    ) -> async_graphql::Result<BillingSummary> {
        let db = &app(context).db;
        let scope = principal(context)?.report_scope(db, tenant_id).await?;
        let summary = reports::billing_summary(db, scope, window(Some(from), Some(to))?).await?;
        Ok(summary.into())
    }

    /// One point per `interval` over `[from, to)`, each the `billingSummary` figures of
    /// the jobs created in it, so that the points add up to the summary of the window.
    /// The points start at `from` (not at a UTC hour or midnight: a client picks its own
    /// day boundaries) and every interval has one, zeros when no job was created in it;
    /// the last one is cut at `to`. At most 1000 points (`VALIDATION` beyond).
    ///
    /// A tenant sees its own figures (naming another `tenantId` is `FORBIDDEN`); an
    /// admin sees the named tenant's, or every tenant's when `tenantId` is omitted.
    #[graphql(complexity = "super::cost::REPORT_COMPLEXITY + child_complexity")]
    async fn billing_series(
        &self,
        context: &Context<'_>,
        from: DateTime<Utc>,
        to: DateTime<Utc>,
        interval: SeriesInterval,
        tenant_id: Option<Uuid>,
    ) -> async_graphql::Result<Vec<SeriesPoint>> {
        let db = &app(context).db;
        let scope = principal(context)?.report_scope(db, tenant_id).await?;
        let series =
            reports::billing_series(db, scope, from.into(), to.into(), interval.into()).await?;
        Ok(series.into_iter().map(SeriesPoint::from).collect())
    }

    /// One row per value of the label `key` among the jobs created in `[from, to)`,
    /// sorted by value: how many jobs carry it and what they cost and paid. Jobs
    /// without the label are in no row, so the rows add up to the labelled jobs only.
    ///
    /// A tenant sees its own figures (naming another `tenantId` is `FORBIDDEN`); an
    /// admin sees the named tenant's, or every tenant's when `tenantId` is omitted.
    #[graphql(complexity = "super::cost::REPORT_COMPLEXITY + child_complexity")]
    async fn billing_by_label(
        &self,
        context: &Context<'_>,
        from: DateTime<Utc>,
        to: DateTime<Utc>,
        key: String,
        tenant_id: Option<Uuid>,
    ) -> async_graphql::Result<Vec<LabelBilling>> {
        let db = &app(context).db;
        let scope = principal(context)?.report_scope(db, tenant_id).await?;
        let rows =
            reports::billing_by_label(db, scope, window(Some(from), Some(to))?, &key).await?;
        Ok(rows.into_iter().map(LabelBilling::from).collect())
    }

    /// The tenant's credit ledger, newest first, `first` at a time (default 20, at most
    /// 100) after the cursor `after` (an unknown cursor is a `VALIDATION` error): every
    /// grant, hold, release and charge, each a positive amount whose kind gives the
    /// direction.
    ///
    /// A tenant sees its own ledger (naming another `tenantId` is `FORBIDDEN`); an admin
    /// must name the tenant (`VALIDATION` otherwise).
    #[graphql(complexity = "super::cost::page_complexity(first, child_complexity)")]
    async fn credit_ledger(
        &self,
        context: &Context<'_>,
        first: Option<i32>,
        after: Option<String>,
        tenant_id: Option<Uuid>,
    ) -> async_graphql::Result<LedgerEntryConnection> {
        let db = &app(context).db;
        let tenant_id = principal(context)?.report_tenant(db, tenant_id).await?;
        let page = PageRequest::new(first, after.as_deref())?;
        let entries = reports::credit_ledger(db, tenant_id, page).await?;
        let (edges, page_info) = connect(entries, |entry| (entry.id, entry.into()));
        Ok(LedgerEntryConnection { edges, page_info })
    }
}
