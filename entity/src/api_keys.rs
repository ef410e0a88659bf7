//! API keys, stored only as SHA-256 hashes.

use crate::{ApiKeyRole, Timestamp};
use sea_orm::entity::prelude::*;

#[derive(Clone, Debug, PartialEq, Eq, DeriveEntityModel)]
#[sea_orm(table_name = "api_keys")]
pub struct Model {
    #[sea_orm(primary_key, auto_increment = false)]
    pub id: Uuid,
    /// None for admin keys.
    pub tenant_id: Option<Uuid>,
    pub role: ApiKeyRole,
    #[sea_orm(unique)]
    pub key_hash: String,
    /// The first characters of the key, to tell keys apart in listings.
    pub key_prefix: String,
    /// The tenant's name for the key ("ci", "frontend"); empty for keys made with a
    /// tenant.
    pub name: String,
    pub created_at: Timestamp,
    /// Written at most about once a minute, not on every request.
    pub last_used_at: Option<Timestamp>,
    pub revoked_at: Option<Timestamp>,
}

#[derive(Copy, Clone, Debug, EnumIter, DeriveRelation)]
pub enum Relation {}

impl ActiveModelBehavior for ActiveModel {}
