//! The credits held for one job until its outcome settles or releases them.

use crate::{ReservationStatus, Timestamp};
use sea_orm::entity::prelude::*;

#[derive(Clone, Debug, PartialEq, Eq, DeriveEntityModel)]
#[sea_orm(table_name = "credit_reservations")]
pub struct Model {
    #[sea_orm(primary_key, auto_increment = false)]
    pub id: Uuid,
    #[sea_orm(unique)]
    pub job_id: Uuid,
    pub tenant_id: Uuid,
    pub amount_nanos: i64,
    pub status: ReservationStatus,
    pub settled_amount_nanos: i64,
    pub released_amount_nanos: i64,
    pub created_at: Timestamp,
    pub resolved_at: Option<Timestamp>,
    /// The part of the hold backed by lapsed grants (the sum of its `hold_backings`).
    pub backed_nanos: i64,
    /// Of what the hold released, the provider cost of the job's paid calls that the
    /// customer was not charged: still counted in the tenant's spend.
    pub absorbed_nanos: i64,
}

#[derive(Copy, Clone, Debug, EnumIter, DeriveRelation)]
pub enum Relation {}

impl ActiveModelBehavior for ActiveModel {}
