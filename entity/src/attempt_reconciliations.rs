//! The audit trail of reconciliations: an admin recorded the real usage of an attempt
//! whose outcome was unknown, turning its cost bound into an exact cost. At most one
//! row per attempt.

use crate::Timestamp;
use sea_orm::entity::prelude::*;

#[derive(Clone, Debug, PartialEq, Eq, DeriveEntityModel)]
#[sea_orm(table_name = "attempt_reconciliations")]
pub struct Model {
    #[sea_orm(primary_key, auto_increment = false)]
    pub id: Uuid,
    #[sea_orm(unique)]
    pub attempt_id: Uuid,
    pub job_id: Uuid,
    pub tenant_id: Uuid,
    /// The bound the attempt carried before; `None` only if it carried none.
    pub previous_upper_bound_nanos: Option<i64>,
    /// The exact cost computed from the usage, at the attempt's own price version.
    pub provider_cost_nanos: i64,
    /// The price version the cost was computed with (the attempt's).
    pub model_price_id: Uuid,
    pub input_tokens: i64,
    pub cached_input_tokens: i64,
    pub output_tokens: i64,
    pub provider_request_id: Option<String>,
    /// Why, and from which source (e.g. the provider's usage report).
    pub note: String,
    /// Who recorded it.
    pub reconciled_by: String,
    pub created_at: Timestamp,
}

#[derive(Copy, Clone, Debug, EnumIter, DeriveRelation)]
pub enum Relation {
    #[sea_orm(
        belongs_to = "super::attempts::Entity",
        from = "Column::AttemptId",
        to = "super::attempts::Column::Id"
    )]
    Attempt,
}

impl Related<super::attempts::Entity> for Entity {
    fn to() -> RelationDef {
        Relation::Attempt.def()
    }
}

impl ActiveModelBehavior for ActiveModel {}
