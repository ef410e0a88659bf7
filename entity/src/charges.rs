//! What a tenant paid for a job: at most one row per job.

use crate::Timestamp;
use sea_orm::entity::prelude::*;

#[derive(Clone, Debug, PartialEq, Eq, DeriveEntityModel)]
#[sea_orm(table_name = "charges")]
pub struct Model {
    #[sea_orm(primary_key, auto_increment = false)]
    pub id: Uuid,
    #[sea_orm(unique)]
    pub job_id: Uuid,
    pub tenant_id: Uuid,
    /// The accepted attempt whose usage was charged.
    pub attempt_id: Uuid,
    pub amount_nanos: i64,
    pub created_at: Timestamp,
}

#[derive(Copy, Clone, Debug, EnumIter, DeriveRelation)]
pub enum Relation {}

impl ActiveModelBehavior for ActiveModel {}
