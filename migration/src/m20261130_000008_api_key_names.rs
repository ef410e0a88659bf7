//! API keys managed by their tenants: a name to tell them apart and when each was
//! last used; and the index account streams re-read a tenant's recent events by
//! after missing notices.

use crate::steps::{add_columns, create_index, drop_columns, drop_index, index};
use sea_orm_migration::{prelude::*, schema::*};

#[derive(DeriveMigrationName)]
pub struct Migration;

const INDEX: &str = "ix_job_events_tenant_at";

#[async_trait::async_trait]
impl MigrationTrait for Migration {
    async fn up(&self, manager: &SchemaManager) -> Result<(), DbErr> {
        let columns = [
            string(ApiKeys::Name).default("").take(),
            big_integer_null(ApiKeys::LastUsedAt),
        ];
        add_columns(manager, ApiKeys::Table, columns).await?;
        let columns = [JobEvents::TenantId, JobEvents::At];
        create_index(manager, &mut index(INDEX, JobEvents::Table, columns)).await
    }

    async fn down(&self, manager: &SchemaManager) -> Result<(), DbErr> {
        drop_index(manager, INDEX, JobEvents::Table).await?;
        let columns = [ApiKeys::LastUsedAt, ApiKeys::Name];
        drop_columns(manager, ApiKeys::Table, columns).await
    }
}

#[derive(DeriveIden)]
enum ApiKeys {
    Table,
    Name,
    LastUsedAt,
}

#[derive(DeriveIden)]
enum JobEvents {
    Table,
    TenantId,
    At,
}
