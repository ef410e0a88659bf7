//! A batch: one handle for many jobs of one model, with its items' counts and money
//! kept on its row by the transactions that move the items.

use crate::{BatchMode, BatchStatus, JsonText, Timestamp};
use sea_orm::entity::prelude::*;

#[derive(Clone, Debug, PartialEq, DeriveEntityModel)]
#[sea_orm(table_name = "batches")]
pub struct Model {
    #[sea_orm(primary_key, auto_increment = false)]
    pub id: Uuid,
    pub tenant_id: Uuid,
    pub idempotency_key: String,
    /// SHA-256 of the canonical settings: a replay with other settings is a conflict.
    pub request_hash: String,
    pub name: Option<String>,
    pub mode: BatchMode,
    pub status: BatchStatus,
    pub cancel_requested: bool,
    pub model: String,
    /// The job settings every item shares (max output tokens, response schema,
    /// max attempts, priority, metadata).
    pub settings: JsonText,
    pub item_count: i64,
    pub succeeded: i64,
    pub failed: i64,
    pub cancelled: i64,
    /// Credit still held by the unfinished items.
    pub reserved_nanos: i64,
    /// Σ the exact provider costs of the items' attempts.
    pub provider_cost_nanos: i64,
    /// Σ the cost bounds of the items' attempts whose cost is not known (yet).
    pub unknown_bound_nanos: i64,
    /// Σ the items' charges.
    pub customer_charge_nanos: i64,
    pub created_at: Timestamp,
    pub updated_at: Timestamp,
    pub closed_at: Option<Timestamp>,
    pub finished_at: Option<Timestamp>,
}

#[derive(Copy, Clone, Debug, EnumIter, DeriveRelation)]
pub enum Relation {}

impl ActiveModelBehavior for ActiveModel {}
