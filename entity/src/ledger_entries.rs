//! The append-only ledger from which every balance can be recomputed.

use crate::{LedgerEntryKind, Timestamp};
use sea_orm::entity::prelude::*;

#[derive(Clone, Debug, PartialEq, Eq, DeriveEntityModel)]
#[sea_orm(table_name = "ledger_entries")]
pub struct Model {
    #[sea_orm(primary_key, auto_increment = false)]
    pub id: Uuid,
    pub tenant_id: Uuid,
    pub kind: LedgerEntryKind,
    /// Always positive; the kind gives the direction.
    pub amount_nanos: i64,
    pub job_id: Option<Uuid>,
    pub grant_id: Option<Uuid>,
    pub created_at: Timestamp,
}

#[derive(Copy, Clone, Debug, EnumIter, DeriveRelation)]
pub enum Relation {}

impl ActiveModelBehavior for ActiveModel {}
