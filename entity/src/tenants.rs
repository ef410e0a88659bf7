//! A customer account. The balance columns cache what a replay of the ledger gives;
//! they change only in the same transaction as the ledger entries that explain them.

use crate::Timestamp;
use sea_orm::entity::prelude::*;

#[derive(Clone, Debug, PartialEq, Eq, DeriveEntityModel)]
#[sea_orm(table_name = "tenants")]
pub struct Model {
    #[sea_orm(primary_key, auto_increment = false)]
    pub id: Uuid,
    pub name: String,
    pub granted_nanos: i64,
    pub held_nanos: i64,
    pub charged_nanos: i64,
    pub created_at: Timestamp,
    /// The UTC day `spend_day_nanos` counts; the counter starts over when a job is
    /// created in a later day.
    pub spend_day_starts_at: Timestamp,
    /// Charges plus open holds of the jobs created in that day.
    pub spend_day_nanos: i64,
    /// The UTC month `spend_month_nanos` counts.
    pub spend_month_starts_at: Timestamp,
    /// Charges plus open holds of the jobs created in that month.
    pub spend_month_nanos: i64,
}

#[derive(Copy, Clone, Debug, EnumIter, DeriveRelation)]
pub enum Relation {}

impl ActiveModelBehavior for ActiveModel {}
