//! A label of a job: a `key=value` pair the client put on it to find it again.

use sea_orm::entity::prelude::*;

#[derive(Clone, Debug, PartialEq, DeriveEntityModel)]
#[sea_orm(table_name = "job_labels")]
pub struct Model {
    #[sea_orm(primary_key, auto_increment = false)]
    pub job_id: Uuid,
    /// The job's tenant, so that the label index is searched per tenant.
    pub tenant_id: Uuid,
    #[sea_orm(primary_key, auto_increment = false)]
    pub key: String,
    pub value: String,
}

#[derive(Copy, Clone, Debug, EnumIter, DeriveRelation)]
pub enum Relation {
    #[sea_orm(
        belongs_to = "super::jobs::Entity",
        from = "Column::JobId",
        to = "super::jobs::Column::Id"
    )]
    Job,
}

impl ActiveModelBehavior for ActiveModel {}
