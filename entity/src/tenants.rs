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
    /// Credits that left the balance because their grant expired.
    pub expired_nanos: i64,
    /// How much of `charged_nanos` is already attributed to grants
    /// (`credit_grants.consumed_nanos`); the rest is attributed before an expiry.
    pub attributed_nanos: i64,
    /// The earliest `expires_at` among the tenant's grants that may have something
    /// left; `None` when none expires. Holds wait for an expiry due by then.
    pub next_expiry_at: Option<Timestamp>,
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
