//! Credit of a lapsed grant that still backs one hold (see `billing::expiry`).

use sea_orm::entity::prelude::*;

#[derive(Clone, Debug, PartialEq, Eq, DeriveEntityModel)]
#[sea_orm(table_name = "hold_backings")]
pub struct Model {
    #[sea_orm(primary_key, auto_increment = false)]
    pub id: Uuid,
    pub tenant_id: Uuid,
    pub grant_id: Uuid,
    pub reservation_id: Uuid,
    /// The grant's credit set aside for the hold at the grant's instant.
    pub amount_nanos: i64,
    /// What the hold's charge consumed of it.
    pub consumed_nanos: i64,
    /// What expired of it once the hold resolved.
    pub expired_nanos: i64,
    /// The hold resolved and the backing was used up: consumed + expired = amount.
    pub resolved: bool,
}

#[derive(Copy, Clone, Debug, EnumIter, DeriveRelation)]
pub enum Relation {}

impl ActiveModelBehavior for ActiveModel {}
