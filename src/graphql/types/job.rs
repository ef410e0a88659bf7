//! A job, its timeline and pages of jobs.

use super::{Attempt, Charge, EventKind, JobCost, JobStatus, PageInfo, Reservation, edge, time};
use crate::accounts::Principal;
use crate::accounts::access_tokens::AccessScope;
use crate::error::ServiceError;
use crate::graphql::loader;
use crate::graphql::loaders::{
    AttemptsOf, ChargeOf, CostOf, EventsOf, JobKey, JobOf, LabelsOf, ReservationOf, prefetch,
};
use crate::jobs::fallbacks::ModelChain;
use async_graphql::{Context, Guard, Json, Lookahead, Object, SimpleObject};
use chrono::{DateTime, Utc};
use entity::{job_events, jobs};
use std::sync::Arc;
use uuid::Uuid;

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

/// Bounds how many job payloads (each up to megabytes) one tenant loads at once in
/// this process for pages of jobs: with the response limit, which stops resolving
/// once reached, this bounds the memory a page of large jobs takes, and one tenant
/// paging megabytes of inputs waits for its own loads, not another tenant's small
/// page. Tenants are few and made by the admin, so the map stays small.
#[derive(Default)]
pub struct PayloadGate(
    std::sync::Mutex<std::collections::HashMap<Uuid, Arc<tokio::sync::Semaphore>>>,
);

/// Payloads one tenant loads at once in one process for pages of jobs.
const CONCURRENT_PAYLOAD_LOADS: usize = 4;

impl PayloadGate {
    fn of(&self, tenant_id: Uuid) -> Arc<tokio::sync::Semaphore> {
        self.0
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .entry(tenant_id)
            .or_insert_with(|| Arc::new(tokio::sync::Semaphore::new(CONCURRENT_PAYLOAD_LOADS)))
            .clone()
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
                let gate = context.data_unchecked::<PayloadGate>().of(self.0.tenant_id);
                let _permit = gate.acquire().await.expect("the gate is never closed");
                let db = &context.data_unchecked::<crate::app::App>().db;
                crate::jobs::service::job_payloads(db, self.0.tenant_id, self.0.id).await
            })
            .await?;
        Ok((loaded.input.clone(), loaded.result.clone()))
    }
}

/// A `key=value` pair the client put on a job to find it again.
#[derive(SimpleObject)]
pub struct Label {
    pub key: String,
    pub value: String,
}

/// Why a job failed.
#[derive(SimpleObject)]
pub struct JobError {
    pub code: super::JobErrorCode,
    pub message: String,
}

/// Lets an access token read a job's contents only with `READ_JOBS`: the job
/// `createJob` and `cancelJob` answer with would otherwise hand a token that may only
/// create or cancel the input, result and history of any job within its reach. Its
/// id, status and hold stay readable, so the answer still says what was done.
struct ReadsJobs;

impl Guard for ReadsJobs {
    async fn check(&self, context: &Context<'_>) -> async_graphql::Result<()> {
        match context.data_opt::<Principal>() {
            Some(Principal::Token(grant)) => Ok(grant.require(AccessScope::ReadJobs)?),
            _ => Ok(()),
        }
    }
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

    /// The batch the job is an item of, if any.
    #[graphql(guard = "ReadsJobs")]
    async fn batch_id(&self) -> Option<Uuid> {
        self.0.batch_id
    }

    /// The item's name within its batch.
    #[graphql(guard = "ReadsJobs")]
    async fn custom_id(&self) -> Option<&str> {
        self.0.custom_id.as_deref()
    }

    /// The model the job was created for. With `fallbackModels` an attempt may call
    /// another: `Attempt.model` is the model each attempt called.
    async fn model(&self) -> &str {
        self.0.own_model()
    }

    /// The models tried in order after `model` when it is rate limited, paused or
    /// failing transiently; empty when the job named none.
    async fn fallback_models(&self) -> Vec<String> {
        ModelChain::of_job(&self.0).fallbacks().to_vec()
    }

    /// The labels the job was created with, in order of key.
    #[graphql(guard = "ReadsJobs")]
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

    /// The finished job this one reruns (`rerunJob`); null for a job created otherwise,
    /// and for an access token when that job is out of its reach.
    #[graphql(guard = "ReadsJobs")]
    async fn rerun_of(&self, context: &Context<'_>) -> async_graphql::Result<Option<Job>> {
        let Some(job_id) = self.0.rerun_of else {
            return Ok(None);
        };
        if let Some(Principal::Token(grant)) = context.data_opt::<Principal>() {
            let db = &context.data_unchecked::<crate::app::App>().db;
            if !grant
                .reach
                .admits(db, self.0.tenant_id, job_id)
                .await
                .map_err(ServiceError::from)?
            {
                return Ok(None);
            }
        }
        let key = JobKey {
            tenant_id: self.0.tenant_id,
            job_id,
        };
        let row = loader(context).load_one(JobOf(key)).await?;
        Ok(row.flatten().map(Job::without_payloads))
    }

    /// The messages, limits, response schema and metadata the job was created with;
    /// `{}` once retention pruned it (see `payloadsPrunedAt`).
    #[graphql(
        guard = "ReadsJobs",
        complexity = "crate::graphql::cost::DOCUMENT_FIELD_COMPLEXITY"
    )]
    async fn input(&self, context: &Context<'_>) -> async_graphql::Result<Json<serde_json::Value>> {
        Ok(Json(self.payloads(context).await?.0.0))
    }

    /// The accepted reply: parsed JSON when the job has a response schema, else text;
    /// null once retention pruned it (see `payloadsPrunedAt`).
    #[graphql(
        guard = "ReadsJobs",
        complexity = "crate::graphql::cost::DOCUMENT_FIELD_COMPLEXITY"
    )]
    async fn result(
        &self,
        context: &Context<'_>,
    ) -> async_graphql::Result<Option<Json<serde_json::Value>>> {
        Ok(self.payloads(context).await?.1.map(|result| Json(result.0)))
    }

    #[graphql(guard = "ReadsJobs")]
    async fn error(&self) -> async_graphql::Result<Option<JobError>> {
        let Some(code) = self.0.error_code else {
            return Ok(None);
        };
        Ok(Some(JobError {
            code: code.into(),
            message: self.0.error_message.clone().unwrap_or_default(),
        }))
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

    /// By when the job must have finished: the one createJob named, else the default
    /// from when it could start. Unfinished by then, it fails `DEADLINE_EXCEEDED`.
    /// Null only for jobs that finished before deadlines were recorded.
    async fn deadline(&self) -> Option<DateTime<Utc>> {
        self.0.deadline.map(time)
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
    #[graphql(
        guard = "ReadsJobs",
        complexity = "child_complexity.saturating_mul(crate::graphql::cost::LISTED_ATTEMPTS) + 1"
    )]
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
    #[graphql(guard = "ReadsJobs")]
    async fn charge(&self, context: &Context<'_>) -> async_graphql::Result<Option<Charge>> {
        let charge = loader(context).load_one(ChargeOf(self.key())).await?;
        Ok(charge.flatten().map(Charge))
    }

    /// Provider cost over all attempts against what the customer paid.
    #[graphql(guard = "ReadsJobs")]
    async fn cost(&self, context: &Context<'_>) -> async_graphql::Result<JobCost> {
        // The same per-job query as the `jobCosts` dashboard, so the two always agree.
        let cost = loader(context).load_one(CostOf(self.key())).await?;
        Ok(cost.flatten().ok_or(ServiceError::NotFound)?.into())
    }

    /// The job's timeline, oldest first.
    #[graphql(
        guard = "ReadsJobs",
        complexity = "child_complexity.saturating_mul(crate::graphql::cost::LISTED_EVENTS) + 1"
    )]
    async fn events(&self, context: &Context<'_>) -> async_graphql::Result<Vec<JobEvent>> {
        let events = loader(context).load_one(EventsOf(self.key())).await?;
        Ok(events
            .unwrap_or_default()
            .into_iter()
            .map(JobEvent::from)
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
            prefetch(loader, wanted("labels"), keys().map(LabelsOf)),
        )?;
        Ok(())
    }
}

/// One entry of a job's timeline.
#[derive(Clone)]
pub struct JobEvent {
    pub event: job_events::Model,
    /// Where `accountJobUpdates` resumes right after this event.
    pub cursor: Option<String>,
}

impl From<job_events::Model> for JobEvent {
    fn from(event: job_events::Model) -> Self {
        Self {
            event,
            cursor: None,
        }
    }
}

#[Object]
impl JobEvent {
    /// Opaque; on the events of `accountJobUpdates` only: pass it as `after` to resume
    /// right after this event.
    async fn cursor(&self) -> Option<&str> {
        self.cursor.as_deref()
    }

    /// 1, 2, 3 … within the job; subscriptions resume after a seq.
    async fn seq(&self) -> i32 {
        self.event.seq
    }

    async fn job_id(&self) -> Uuid {
        self.event.job_id
    }

    async fn kind(&self) -> EventKind {
        self.event.kind.into()
    }

    /// The job's status right after the event.
    async fn status(&self) -> JobStatus {
        self.event.status.into()
    }

    async fn at(&self) -> DateTime<Utc> {
        time(self.event.at)
    }

    /// Details: the attempt number, its outcome and error; `modelPausedUntil` when the
    /// provider's 429 paused the job's model for every worker.
    async fn data(&self) -> Option<Json<serde_json::Value>> {
        self.event.data.clone().map(|data| Json(data.0))
    }

    /// The text an `OUTPUT_DELTA` event carries.
    async fn delta(&self) -> Option<&str> {
        self.event.data.as_ref()?.0.get("delta")?.as_str()
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

edge!(
    /// A job and the cursor to page on from it.
    JobEdge of Job
);
