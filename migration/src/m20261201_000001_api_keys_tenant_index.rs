//! A tenant's keys are listed and counted (the cap on live keys checks it at every
//! `createApiKey`) by `tenant_id`; this index serves both without scanning every key.

use crate::steps::{create_index, drop_index, index};
use sea_orm_migration::prelude::*;

#[derive(DeriveMigrationName)]
pub struct Migration;

const INDEX: &str = "ix_api_keys_tenant_id";

#[async_trait::async_trait]
impl MigrationTrait for Migration {
    async fn up(&self, manager: &SchemaManager) -> Result<(), DbErr> {
        let columns = [ApiKeys::TenantId, ApiKeys::CreatedAt];
        create_index(manager, &mut index(INDEX, ApiKeys::Table, columns)).await
    }

    async fn down(&self, manager: &SchemaManager) -> Result<(), DbErr> {
        drop_index(manager, INDEX, ApiKeys::Table).await
    }
}

#[derive(DeriveIden)]
enum ApiKeys {
    Table,
    TenantId,
    CreatedAt,
}
