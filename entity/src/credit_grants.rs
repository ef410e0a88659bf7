//! Credits an admin added to a tenant's account, possibly expiring.

use crate::Timestamp;
use sea_orm::entity::prelude::*;

#[derive(Clone, Debug, PartialEq, Eq, DeriveEntityModel)]
#[sea_orm(table_name = "credit_grants")]
pub struct Model {
    #[sea_orm(primary_key, auto_increment = false)]
    pub id: Uuid,
    pub tenant_id: Uuid,
    pub amount_nanos: i64,
    pub idempotency_key: String,
    pub reason: Option<String>,
    pub created_at: Timestamp,
    /// When what is left of the grant expires; `None` never.
    pub expires_at: Option<Timestamp>,
    /// Charges attributed to this grant (see `billing::expiry` for the order).
    pub consumed_nanos: i64,
    /// What expired of it, the sum of its `expiry` ledger entries.
    pub expired_nanos: i64,
    /// Its instant has come and been carried out: what is left of it only backs the
    /// holds listed in `hold_backings`, and no other charge consumes it.
    pub lapsed: bool,
}

#[derive(Copy, Clone, Debug, EnumIter, DeriveRelation)]
pub enum Relation {}

impl ActiveModelBehavior for ActiveModel {}
