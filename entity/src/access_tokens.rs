//! Access tokens a tenant minted for browsers, stored only as SHA-256 hashes.

use crate::{JsonText, Timestamp};
use sea_orm::entity::prelude::*;

#[derive(Clone, Debug, PartialEq, Eq, DeriveEntityModel)]
#[sea_orm(table_name = "access_tokens")]
pub struct Model {
    #[sea_orm(primary_key, auto_increment = false)]
    pub id: Uuid,
    pub tenant_id: Uuid,
    /// The API key that minted it, which it does not outlive; `None`: the admin token.
    pub api_key_id: Option<Uuid>,
    #[sea_orm(unique)]
    pub token_hash: String,
    /// What it may do, comma-separated (`READ_JOBS,CREATE_JOBS`).
    pub scopes: String,
    /// The labels a job must carry for it to reach the job, `[[key, value], …]`; the
    /// jobs it creates are given them.
    pub labels: JsonText,
    /// The only jobs it reaches, when it was minted for listed jobs.
    pub job_ids: Option<JsonText>,
    /// The most its creates may hold in all; `None`: no cap of its own.
    pub max_spend_nanos: Option<i64>,
    /// What its creates have held so far.
    pub spent_nanos: i64,
    pub created_at: Timestamp,
    pub expires_at: Timestamp,
}

#[derive(Copy, Clone, Debug, EnumIter, DeriveRelation)]
pub enum Relation {}

impl ActiveModelBehavior for ActiveModel {}
