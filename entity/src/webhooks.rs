//! An endpoint a tenant registered for webhook deliveries.

use crate::Timestamp;
use sea_orm::entity::prelude::*;

#[derive(Clone, Debug, PartialEq, Eq, DeriveEntityModel)]
#[sea_orm(table_name = "webhooks")]
pub struct Model {
    #[sea_orm(primary_key, auto_increment = false)]
    pub id: Uuid,
    pub tenant_id: Uuid,
    pub url: String,
    /// The event types delivered to it, comma-separated (`job.succeeded,balance.low`).
    pub events: String,
    /// The signing secret, `whsec_<base64 key>`: needed in the clear to sign.
    pub secret: String,
    pub created_at: Timestamp,
    /// Set when the tenant deleted it; its history of deliveries stays.
    pub deleted_at: Option<Timestamp>,
}

#[derive(Copy, Clone, Debug, EnumIter, DeriveRelation)]
pub enum Relation {}

impl ActiveModelBehavior for ActiveModel {}
