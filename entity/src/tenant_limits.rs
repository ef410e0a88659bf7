//! The limits an admin set for a tenant; a missing row or a null column means no limit.

use crate::Timestamp;
use sea_orm::entity::prelude::*;

#[derive(Clone, Debug, PartialEq, Eq, DeriveEntityModel)]
#[sea_orm(table_name = "tenant_limits")]
pub struct Model {
    #[sea_orm(primary_key, auto_increment = false)]
    pub tenant_id: Uuid,
    /// Most the tenant may spend (charges plus open holds) on jobs created in one UTC day.
    pub daily_spend_limit_nanos: Option<i64>,
    /// The same for one UTC month.
    pub monthly_spend_limit_nanos: Option<i64>,
    /// Provider calls the tenant's jobs may start per minute (enforced by the claim).
    pub requests_per_minute: Option<i32>,
    /// Tokens the tenant's jobs may use per minute (enforced by the claim).
    pub tokens_per_minute: Option<i32>,
    /// Below this available balance the tenant is alerted (`balance.low`).
    pub low_balance_threshold_nanos: Option<i64>,
    pub updated_at: Timestamp,
    /// The tenant's granted total when `balance.low` last fired; `None` while the
    /// alert is armed. A grant since then re-arms it once the balance is back above.
    pub low_balance_alerted_granted_nanos: Option<i64>,
    /// The UTC day for which `spend_limit.reached` was sent (once per period).
    pub spend_limit_reached_day: Option<Timestamp>,
    /// The UTC month for which `spend_limit.reached` was sent.
    pub spend_limit_reached_month: Option<Timestamp>,
}

#[derive(Copy, Clone, Debug, EnumIter, DeriveRelation)]
pub enum Relation {}

impl ActiveModelBehavior for ActiveModel {}
