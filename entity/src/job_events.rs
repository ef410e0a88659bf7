//! A job's timeline and the source subscriptions replay from.

use crate::{EventKind, JobStatus, JsonText, Timestamp};
use sea_orm::entity::prelude::*;

#[derive(Clone, Debug, PartialEq, Eq, DeriveEntityModel)]
#[sea_orm(table_name = "job_events")]
pub struct Model {
    #[sea_orm(primary_key, auto_increment = false)]
    pub job_id: Uuid,
    /// 1, 2, 3 … within one job.
    #[sea_orm(primary_key, auto_increment = false)]
    pub seq: i32,
    pub tenant_id: Uuid,
    pub kind: EventKind,
    /// The job's status right after the event.
    pub status: JobStatus,
    pub at: Timestamp,
    pub data: Option<JsonText>,
}

#[derive(Copy, Clone, Debug, EnumIter, DeriveRelation)]
pub enum Relation {}

impl ActiveModelBehavior for ActiveModel {}
