//! The GraphQL types of jobs, attempts, money and accounts.

use super::loader;
use super::loaders::{AttemptsOf, ChargeOf, CostOf, EventsOf, JobKey, ReservationOf, prefetch};
use super::scalars::Amount;
use crate::billing::{Credits, ledger::Balance, reports};
use crate::error::ServiceError;
use async_graphql::{ComplexObject, Context, Enum, Json, Lookahead, Object, SimpleObject};
use chrono::{DateTime, Utc};
use entity::{
    Timestamp, attempts, charges, credit_grants, credit_reservations, job_events, jobs, tenants,
};
use uuid::Uuid;

fn time(timestamp: Timestamp) -> DateTime<Utc> {
    timestamp.to_datetime()
}

fn money(nanos: i64) -> Amount {
    Amount::from(Credits::from_nanos(nanos))
}

/// Token counts fit GraphQL's 32-bit Int for any real call; saturate rather than fail.
fn token_count(count: Option<i64>) -> Option<i32> {
    count.map(|count| i32::try_from(count).unwrap_or(i32::MAX))
}

/// Where a job is in its lifecycle.
#[derive(Enum, Clone, Copy, Debug, PartialEq, Eq)]
#[graphql(remote = "entity::JobStatus")]
pub enum JobStatus {
    Queued,
    Running,
    Succeeded,
    Failed,
    Cancelled,
}

/// How an attempt ended.
#[derive(Enum, Clone, Copy, Debug, PartialEq, Eq)]
#[graphql(remote = "entity::AttemptOutcome")]
pub enum AttemptOutcome {
    Running,
    Succeeded,
    RetryableError,
    PermanentError,
    InvalidOutput,
    /// The request was sent and no answer came back: it may have been billed.
    Unknown,
    Cancelled,
    LeaseExpired,
}

/// The state of a job's credit hold.
#[derive(Enum, Clone, Copy, Debug, PartialEq, Eq)]
#[graphql(remote = "entity::ReservationStatus")]
pub enum ReservationStatus {
    Held,
    Settled,
    Released,
}

/// What happened to a job.
#[derive(Enum, Clone, Copy, Debug, PartialEq, Eq)]
#[graphql(remote = "entity::EventKind")]
pub enum EventKind {
    Created,
    AttemptStarted,
    RetryScheduled,
    CancelRequested,
    Succeeded,
    Failed,
    Cancelled,
    /// Live text of a streaming attempt; not stored, so not replayed.
    OutputDelta,
}

/// A durable LLM job. Read one at a time it comes with its payloads (input and
/// result); read in a page it comes without them, and they load when asked for.
pub struct Job(pub jobs::Model, Payloads);

/// A job's input and result, as read with it or left to load.
enum Payloads {
    Read,
    /// Loaded once, when a field asks, under the schema's [`PayloadGate`].
    Deferred(tokio::sync::OnceCell<crate::jobs::service::JobPayloads>),
}

impl From<jobs::Model> for Job {
    fn from(row: jobs::Model) -> Self {
        Self(row, Payloads::Read)
    }
}

/// Bounds how many job payloads (each up to megabytes) the whole process loads at once
/// for pages of jobs: with the response limit, which stops resolving once reached,
/// this bounds the memory a page of large jobs takes, whoever asks.
pub struct PayloadGate(tokio::sync::Semaphore);

/// Payloads one process loads at once for pages of jobs.
const CONCURRENT_PAYLOAD_LOADS: usize = 4;

impl Default for PayloadGate {
    fn default() -> Self {
        Self(tokio::sync::Semaphore::new(CONCURRENT_PAYLOAD_LOADS))
    }
}

impl Job {
    /// A job read in a page, without its payloads.
    pub fn without_payloads(row: jobs::Model) -> Self {
        Self(row, Payloads::Deferred(tokio::sync::OnceCell::new()))
    }

    async fn payloads(
        &self,
        context: &Context<'_>,
    ) -> async_graphql::Result<(entity::JsonText, Option<entity::JsonText>)> {
        let cell = match &self.1 {
            Payloads::Read => return Ok((self.0.input.clone(), self.0.result.clone())),
            Payloads::Deferred(cell) => cell,
        };
        let loaded = cell
            .get_or_try_init(|| async {
                let gate = context.data_unchecked::<PayloadGate>();
                let _permit = gate.0.acquire().await.expect("the gate is never closed");
                let db = &context.data_unchecked::<crate::startup::App>().db;
                crate::jobs::service::job_payloads(db, self.0.tenant_id, self.0.id).await
            })
            .await?;
        Ok((loaded.input.clone(), loaded.result.clone()))
    }
}

/// Why a job failed.
#[derive(SimpleObject)]
pub struct JobError {
    pub code: String,
    pub message: String,
}

#[Object]
impl Job {
    async fn id(&self) -> Uuid {
        self.0.id
    }

    async fn status(&self) -> JobStatus {
        self.0.status.into()
    }

    /// Whether the tenant asked to cancel the job.
    async fn cancel_requested(&self) -> bool {
        self.0.cancel_requested
    }

    async fn idempotency_key(&self) -> &str {
        &self.0.idempotency_key
    }

    async fn model(&self) -> &str {
        &self.0.model
    }

    /// The messages, limits, response schema and metadata the job was created with;
    /// `{}` once retention pruned it (see `payloadsPrunedAt`).
    #[graphql(complexity = "super::cost::DOCUMENT_FIELD_COMPLEXITY")]
    async fn input(&self, context: &Context<'_>) -> async_graphql::Result<Json<serde_json::Value>> {
        Ok(Json(self.payloads(context).await?.0.0))
    }

    /// The accepted reply: parsed JSON when the job has a response schema, else text;
    /// null once retention pruned it (see `payloadsPrunedAt`).
    #[graphql(complexity = "super::cost::DOCUMENT_FIELD_COMPLEXITY")]
    async fn result(
        &self,
        context: &Context<'_>,
    ) -> async_graphql::Result<Option<Json<serde_json::Value>>> {
        Ok(self.payloads(context).await?.1.map(|result| Json(result.0)))
    }

    async fn error(&self) -> Option<JobError> {
        Some(JobError {
            code: self.0.error_code.clone()?,
            message: self.0.error_message.clone().unwrap_or_default(),
        })
    }

    async fn attempt_count(&self) -> i32 {
        self.0.attempt_count
    }

    async fn max_attempts(&self) -> i32 {
        self.0.max_attempts
    }

    /// 0 to 9: among the tenant's due jobs, a higher priority runs first.
    async fn priority(&self) -> i32 {
        self.0.priority
    }

    /// The start the client asked for; the job is not claimed before it.
    async fn run_at(&self) -> Option<DateTime<Utc>> {
        self.0.run_at.map(time)
    }

    /// Whether an attempt whose outcome is unknown may be retried (and paid twice).
    async fn retry_unknown_outcome(&self) -> bool {
        self.0.retry_unknown_outcome
    }

    async fn created_at(&self) -> DateTime<Utc> {
        time(self.0.created_at)
    }

    async fn started_at(&self) -> Option<DateTime<Utc>> {
        self.0.started_at.map(time)
    }

    async fn finished_at(&self) -> Option<DateTime<Utc>> {
        self.0.finished_at.map(time)
    }

    /// When retention pruned the job: its `input` is then `{}`, its `result` null, and
    /// of its events only the terminal one is left. Its attempts, usage, costs and
    /// charges are kept. Null while everything is kept.
    async fn payloads_pruned_at(&self) -> Option<DateTime<Utc>> {
        self.0.payloads_pruned_at.map(time)
    }

    /// Every attempt, oldest first, failures included.
    #[graphql(complexity = "child_complexity.saturating_mul(super::cost::LISTED_ATTEMPTS) + 1")]
    async fn attempts(&self, context: &Context<'_>) -> async_graphql::Result<Vec<Attempt>> {
        let attempts = loader(context).load_one(AttemptsOf(self.key())).await?;
        Ok(attempts
            .unwrap_or_default()
            .into_iter()
            .map(Attempt)
            .collect())
    }

    async fn reservation(
        &self,
        context: &Context<'_>,
    ) -> async_graphql::Result<Option<Reservation>> {
        let reservation = loader(context).load_one(ReservationOf(self.key())).await?;
        Ok(reservation.flatten().map(Reservation))
    }

    /// What the customer paid, once the job succeeded.
    async fn charge(&self, context: &Context<'_>) -> async_graphql::Result<Option<Charge>> {
        let charge = loader(context).load_one(ChargeOf(self.key())).await?;
        Ok(charge.flatten().map(Charge))
    }

    /// Provider cost over all attempts against what the customer paid.
    async fn cost(&self, context: &Context<'_>) -> async_graphql::Result<JobCost> {
        // The same per-job query as the `jobCosts` dashboard, so the two always agree.
        let cost = loader(context).load_one(CostOf(self.key())).await?;
        Ok(cost.flatten().ok_or(ServiceError::NotFound)?.into())
    }

    /// The job's timeline, oldest first.
    #[graphql(complexity = "child_complexity.saturating_mul(super::cost::LISTED_EVENTS) + 1")]
    async fn events(&self, context: &Context<'_>) -> async_graphql::Result<Vec<JobEvent>> {
        let events = loader(context).load_one(EventsOf(self.key())).await?;
        Ok(events
            .unwrap_or_default()
            .into_iter()
            .map(JobEvent)
            .collect())
    }
}

impl Job {
    fn key(&self) -> JobKey {
        JobKey::from(&self.0)
    }

    /// Loads the relations that `node` (the selection on each job) asks for, for all
    /// of `jobs` at once: one query per relation, whose rows the request's loader keeps
    /// for each job's own field. Left to the fields alone, the jobs of a long page would
    /// join batches as they are reached, and a slow moment splits them into several.
    async fn prefetch_relations(
        context: &Context<'_>,
        jobs: impl Iterator<Item = &Job>,
        node: Lookahead<'_>,
    ) -> async_graphql::Result<()> {
        let keys: Vec<JobKey> = jobs.map(Job::key).collect();
        let loader = loader(context);
        let wanted = |field: &str| node.field(field).exists();
        let keys = || keys.iter().copied();
        // Each relation is a batch of its own; they run side by side.
        futures_util::try_join!(
            prefetch(loader, wanted("attempts"), keys().map(AttemptsOf)),
            prefetch(loader, wanted("events"), keys().map(EventsOf)),
            prefetch(loader, wanted("reservation"), keys().map(ReservationOf)),
            prefetch(loader, wanted("charge"), keys().map(ChargeOf)),
            prefetch(loader, wanted("cost"), keys().map(CostOf)),
        )?;
        Ok(())
    }
}

/// One try at a job, with what the provider reported and what it cost.
pub struct Attempt(pub attempts::Model);

#[Object]
impl Attempt {
    /// The attempt's id, as `reconcileAttempt` takes it.
    async fn id(&self) -> Uuid {
        self.0.id
    }

    async fn number(&self) -> i32 {
        self.0.number
    }

    async fn outcome(&self) -> AttemptOutcome {
        self.0.outcome.into()
    }

    async fn error_code(&self) -> Option<&str> {
        self.0.error_code.as_deref()
    }

    async fn error_message(&self) -> Option<&str> {
        self.0.error_message.as_deref()
    }

    async fn provider(&self) -> &str {
        &self.0.provider
    }

    async fn provider_request_id(&self) -> Option<&str> {
        self.0.provider_request_id.as_deref()
    }

    /// All input tokens, cached ones included.
    async fn input_tokens(&self) -> Option<i32> {
        token_count(self.0.input_tokens)
    }

    async fn cached_input_tokens(&self) -> Option<i32> {
        token_count(self.0.cached_input_tokens)
    }

    async fn output_tokens(&self) -> Option<i32> {
        token_count(self.0.output_tokens)
    }

    /// Exact provider cost; null while the outcome is unknown.
    async fn provider_cost(&self) -> Option<Amount> {
        self.0.provider_cost_nanos.map(money)
    }

    /// The most the attempt may have cost, while its exact cost is unknown.
    async fn provider_cost_upper_bound(&self) -> Option<Amount> {
        self.0.provider_cost_upper_bound_nanos.map(money)
    }

    /// What the customer pays for this attempt under the charging policy: the
    /// accepted answer's price, output already streamed, or — when the policy passes
    /// them on — the bound of a call whose outcome is unknown. While the attempt runs,
    /// what it would charge if it were lost. The job's charge is the sum, capped at its
    /// hold.
    async fn customer_charge(&self) -> Option<Amount> {
        self.0.customer_charge_nanos.map(money)
    }

    /// Output tokens streamed to the client before the call ended: exact when the
    /// provider reported usage, otherwise estimated as one per four bytes of text.
    async fn delivered_output_tokens(&self) -> Option<i32> {
        token_count(self.0.delivered_output_tokens)
    }

    async fn latency_ms(&self) -> Option<i64> {
        self.0.latency_ms
    }

    async fn started_at(&self) -> DateTime<Utc> {
        time(self.0.started_at)
    }

    async fn finished_at(&self) -> Option<DateTime<Utc>> {
        self.0.finished_at.map(time)
    }
}

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
    /// `customerCharge − providerCost`.
    pub margin: Amount,
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
            unknown_attempts: i32::try_from(cost.unknown_attempts).unwrap_or(i32::MAX),
        }
    }
}

/// One entry of a job's timeline.
#[derive(Clone)]
pub struct JobEvent(pub job_events::Model);

#[Object]
impl JobEvent {
    /// 1, 2, 3 … within the job; subscriptions resume after a seq.
    async fn seq(&self) -> i32 {
        self.0.seq
    }

    async fn job_id(&self) -> Uuid {
        self.0.job_id
    }

    async fn kind(&self) -> EventKind {
        self.0.kind.into()
    }

    /// The job's status right after the event.
    async fn status(&self) -> JobStatus {
        self.0.status.into()
    }

    async fn at(&self) -> DateTime<Utc> {
        time(self.0.at)
    }

    /// Details: the attempt number, its outcome and error; `modelPausedUntil` when the
    /// provider's 429 paused the job's model for every worker.
    async fn data(&self) -> Option<Json<serde_json::Value>> {
        self.0.data.clone().map(|data| Json(data.0))
    }

    /// The text an `OUTPUT_DELTA` event carries.
    async fn delta(&self) -> Option<&str> {
        self.0.data.as_ref()?.0.get("delta")?.as_str()
    }
}

/// A page of jobs.
pub struct JobConnection {
    pub edges: Vec<JobEdge>,
    pub page_info: PageInfo,
}

/// A page of jobs.
#[Object]
impl JobConnection {
    async fn edges(&self, context: &Context<'_>) -> async_graphql::Result<&[JobEdge]> {
        let node = context.look_ahead().field("node");
        Job::prefetch_relations(context, self.edges.iter().map(|edge| &edge.node), node).await?;
        Ok(&self.edges)
    }

    async fn page_info(&self) -> &PageInfo {
        &self.page_info
    }
}

/// A job and the cursor to page on from it.
#[derive(SimpleObject)]
pub struct JobEdge {
    pub cursor: String,
    pub node: Job,
}

/// Relay page information.
#[derive(SimpleObject)]
pub struct PageInfo {
    pub has_next_page: bool,
    pub end_cursor: Option<String>,
}

/// The tenant's own account.
#[derive(SimpleObject)]
#[graphql(complex)]
pub struct Account {
    pub id: Uuid,
    pub name: String,
    #[graphql(skip)]
    pub tenant: tenants::Model,
}

#[ComplexObject]
impl Account {
    async fn balance(&self) -> AccountBalance {
        AccountBalance::from(Balance::from(&self.tenant))
    }

    /// The limits an admin set for this account.
    async fn limits(
        &self,
        context: &Context<'_>,
    ) -> async_graphql::Result<super::limits::TenantLimits> {
        let limits = crate::billing::limits::limits_of(&super::app(context).db, self.id)
            .await
            .map_err(ServiceError::from)?;
        Ok(super::limits::TenantLimits::new(self.id, limits))
    }

    /// What this account spent in the current UTC day and month.
    async fn spend(&self) -> super::limits::AccountSpend {
        crate::billing::limits::Spend::of(&self.tenant, Timestamp::now()).into()
    }
}

/// A tenant's credits.
#[derive(SimpleObject)]
pub struct AccountBalance {
    /// Everything ever granted.
    pub granted: Amount,
    /// Reserved by jobs not yet finished.
    pub held: Amount,
    /// Paid for succeeded jobs.
    pub charged: Amount,
    /// `granted − charged − held`: what new jobs may reserve.
    pub available: Amount,
}

impl From<Balance> for AccountBalance {
    fn from(balance: Balance) -> Self {
        Self {
            granted: balance.granted.into(),
            held: balance.held.into(),
            charged: balance.charged.into(),
            available: balance.available().into(),
        }
    }
}

/// A tenant, as an admin sees it.
#[derive(SimpleObject)]
pub struct Tenant {
    pub id: Uuid,
    pub name: String,
    pub created_at: DateTime<Utc>,
    /// The tenant's credits, as its own `account { balance }` shows them.
    pub balance: AccountBalance,
}

impl From<tenants::Model> for Tenant {
    fn from(tenant: tenants::Model) -> Self {
        Self {
            balance: AccountBalance::from(Balance::from(&tenant)),
            id: tenant.id,
            name: tenant.name,
            created_at: time(tenant.created_at),
        }
    }
}

/// Credits granted to a tenant.
#[derive(SimpleObject)]
pub struct CreditGrant {
    pub id: Uuid,
    pub tenant_id: Uuid,
    pub amount: Amount,
    pub idempotency_key: String,
    pub reason: Option<String>,
    pub created_at: DateTime<Utc>,
}

impl From<credit_grants::Model> for CreditGrant {
    fn from(grant: credit_grants::Model) -> Self {
        Self {
            id: grant.id,
            tenant_id: grant.tenant_id,
            amount: money(grant.amount_nanos),
            idempotency_key: grant.idempotency_key,
            reason: grant.reason,
            created_at: time(grant.created_at),
        }
    }
}
