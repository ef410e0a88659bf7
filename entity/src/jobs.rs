//! A job: the business operation, independent of any request or attempt.

use crate::{JobErrorCode, JobStatus, JsonText, Timestamp};
use sea_orm::entity::prelude::*;

#[derive(Clone, Debug, PartialEq, DeriveEntityModel)]
#[sea_orm(table_name = "jobs")]
pub struct Model {
    #[sea_orm(primary_key, auto_increment = false)]
    pub id: Uuid,
    pub tenant_id: Uuid,
    pub idempotency_key: String,
    /// SHA-256 of the canonical input: a replay with another input is a conflict.
    pub request_hash: String,
    pub status: JobStatus,
    pub cancel_requested: bool,
    /// The model the job runs on now: its own model, until a fallback takes over.
    pub model: String,
    /// Messages, max output tokens, response schema and metadata, as submitted.
    pub input: JsonText,
    pub retry_unknown_outcome: bool,
    pub result: Option<JsonText>,
    pub error_code: Option<JobErrorCode>,
    pub error_message: Option<String>,
    pub attempt_count: i32,
    pub max_attempts: i32,
    /// The fence of the attempt that currently owns the job.
    pub run_token: Option<Uuid>,
    pub lease_until: Option<Timestamp>,
    /// When the job may next be claimed: its `run_at`, a retry's backoff, or now.
    pub next_run_at: Timestamp,
    /// 0 to 9; within one tenant a higher priority is claimed first.
    pub priority: i32,
    /// The start the client asked for (`runAt`); the job is not claimed before it.
    pub run_at: Option<Timestamp>,
    /// The API admitted the job for the built-in simulator (no provider configured):
    /// only then may a worker simulate it.
    pub simulated: bool,
    /// Most tokens one call of the job may use (prompt plus allowed output): what a
    /// tokens-per-minute limit admits it by. `None` for jobs created before limits.
    pub token_bound: Option<i64>,
    /// The seq of the job's newest event; bumping it in the same UPDATE that changes the
    /// job serialises event numbering with the job's row lock.
    pub last_event_seq: i32,
    pub created_at: Timestamp,
    pub updated_at: Timestamp,
    pub started_at: Option<Timestamp>,
    pub finished_at: Option<Timestamp>,
    /// When retention replaced the input and result with nothing and deleted the
    /// events before the terminal one; `None` while they are kept.
    pub payloads_pruned_at: Option<Timestamp>,
    /// The batch the job is an item of, if any.
    pub batch_id: Option<Uuid>,
    /// The item's name within its batch, unique there.
    pub custom_id: Option<String>,
    /// The finished job this one reruns (`rerunJob`), if any.
    pub rerun_of: Option<Uuid>,
    /// The job fails `DEADLINE_EXCEEDED` if it has not finished by then. Every job
    /// created since deadlines exist has one.
    pub deadline: Option<Timestamp>,
    /// The job's models in the order they are tried, its own first, as a JSON array;
    /// `None` for a job without fallback models (its `model` never changes).
    pub model_chain: Option<JsonText>,
    /// The price version the job's hold was sized with for each model of its chain, as
    /// a JSON object of model name to `model_prices.id`: its attempts charge the
    /// customer at these. `None` for a job created before holds recorded them, which
    /// is charged at the price in force when each attempt runs.
    pub held_prices: Option<JsonText>,
}

#[derive(Copy, Clone, Debug, EnumIter, DeriveRelation)]
pub enum Relation {}

impl ActiveModelBehavior for ActiveModel {}

impl Model {
    /// The model the job was created for: the first of its chain, or `model` when it
    /// has no fallbacks.
    pub fn own_model(&self) -> &str {
        self.model_chain
            .as_ref()
            .and_then(|chain| chain.0.get(0)?.as_str())
            .unwrap_or(&self.model)
    }
}
