//! The billing dashboards select a tenant's jobs by creation time (`jobCosts`,
//! `billingSummary` windows); this index serves them without scanning every job of
//! the tenant.

use crate::steps::{create_index, drop_index, index};
use sea_orm_migration::prelude::*;

#[derive(DeriveMigrationName)]
pub struct Migration;

const INDEX: &str = "ix_jobs_tenant_id_created_at";

#[async_trait::async_trait]
impl MigrationTrait for Migration {
    async fn up(&self, manager: &SchemaManager) -> Result<(), DbErr> {
        let columns = [Jobs::TenantId, Jobs::CreatedAt];
        create_index(manager, &mut index(INDEX, Jobs::Table, columns)).await
    }

    async fn down(&self, manager: &SchemaManager) -> Result<(), DbErr> {
        drop_index(manager, INDEX, Jobs::Table).await
    }
}

#[derive(DeriveIden)]
enum Jobs {
    Table,
    TenantId,
    CreatedAt,
}
