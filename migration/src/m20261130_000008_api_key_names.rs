//! API keys managed by their tenants: a name to tell them apart and when each was
//! last used; and the index account streams re-read a tenant's recent events by
//! after missing notices.

use sea_orm_migration::{prelude::*, schema::*};

#[derive(DeriveMigrationName)]
pub struct Migration;

#[async_trait::async_trait]
impl MigrationTrait for Migration {
    async fn up(&self, manager: &SchemaManager) -> Result<(), DbErr> {
        // One column per statement: SQLite alters one thing at a time.
        manager
            .alter_table(
                Table::alter()
                    .table(ApiKeys::Table)
                    .add_column(string(ApiKeys::Name).default(""))
                    .to_owned(),
            )
            .await?;
        manager
            .alter_table(
                Table::alter()
                    .table(ApiKeys::Table)
                    .add_column(big_integer_null(ApiKeys::LastUsedAt))
                    .to_owned(),
            )
            .await?;
        manager
            .create_index(
                Index::create()
                    .name("ix_job_events_tenant_at")
                    .table(JobEvents::Table)
                    .col(JobEvents::TenantId)
                    .col(JobEvents::At)
                    .to_owned(),
            )
            .await
    }

    async fn down(&self, manager: &SchemaManager) -> Result<(), DbErr> {
        manager
            .drop_index(
                Index::drop()
                    .name("ix_job_events_tenant_at")
                    .table(JobEvents::Table)
                    .to_owned(),
            )
            .await?;
        for column in [ApiKeys::LastUsedAt, ApiKeys::Name] {
            manager
                .alter_table(
                    Table::alter()
                        .table(ApiKeys::Table)
                        .drop_column(column)
                        .to_owned(),
                )
                .await?;
        }
        Ok(())
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
