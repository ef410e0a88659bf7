//! Batches: one handle for many jobs of one model.
//!
//! The batch row carries its items' counts and money, moved by the same transactions
//! that move the items (an added chunk, a finished group, a started or reconciled
//! attempt), so reading a batch's progress is one row whatever its size. Its items are
//! ordinary jobs that name their batch and their `custom_id`, unique within it, which
//! makes a re-sent chunk harmless.

use crate::steps::{add_columns, drop_columns, drop_table, foreign_key};
use sea_orm_migration::{prelude::*, schema::*};

#[derive(DeriveMigrationName)]
pub struct Migration;

#[async_trait::async_trait]
impl MigrationTrait for Migration {
    async fn up(&self, manager: &SchemaManager) -> Result<(), DbErr> {
        manager
            .create_table(
                Table::create()
                    .table(Batches::Table)
                    .col(pk_uuid(Batches::Id))
                    .col(uuid(Batches::TenantId))
                    .col(string(Batches::IdempotencyKey))
                    .col(string(Batches::RequestHash))
                    .col(text_null(Batches::Name))
                    .col(string(Batches::Mode))
                    .col(string(Batches::Status))
                    .col(boolean(Batches::CancelRequested).default(false))
                    .col(string(Batches::Model))
                    .col(text(Batches::Settings))
                    .col(big_integer(Batches::ItemCount).default(0))
                    .col(big_integer(Batches::Succeeded).default(0))
                    .col(big_integer(Batches::Failed).default(0))
                    .col(big_integer(Batches::Cancelled).default(0))
                    .col(big_integer(Batches::ReservedNanos).default(0))
                    .col(big_integer(Batches::ProviderCostNanos).default(0))
                    .col(big_integer(Batches::UnknownBoundNanos).default(0))
                    .col(big_integer(Batches::CustomerChargeNanos).default(0))
                    .col(big_integer(Batches::CreatedAt))
                    .col(big_integer(Batches::UpdatedAt))
                    .col(big_integer_null(Batches::ClosedAt))
                    .col(big_integer_null(Batches::FinishedAt))
                    .foreign_key(&mut foreign_key(
                        (Batches::Table, Batches::TenantId),
                        (Tenants::Table, Tenants::Id),
                    ))
                    .to_owned(),
            )
            .await?;
        add_columns(manager, Jobs::Table, [uuid_null(Jobs::BatchId)]).await?;
        add_columns(manager, Jobs::Table, [string_null(Jobs::CustomId)]).await?;
        let connection = manager.get_connection();
        for statement in [
            // A key names one batch of a tenant; a batches page lists them newest first.
            "CREATE UNIQUE INDEX ux_batches_tenant_key ON batches (tenant_id, idempotency_key)",
            "CREATE INDEX ix_batches_tenant_id ON batches (tenant_id, id)",
            // A customId names one item of a batch: a re-sent chunk inserts nothing.
            "CREATE UNIQUE INDEX ux_jobs_batch_custom_id ON jobs (batch_id, custom_id) \
             WHERE batch_id IS NOT NULL",
            // A batch's items in the order they were added, all or of one status (the
            // running ones are counted through it too).
            "CREATE INDEX ix_jobs_batch_order ON jobs (batch_id, id) WHERE batch_id IS NOT NULL",
            "CREATE INDEX ix_jobs_batch_status ON jobs (batch_id, status, id) \
             WHERE batch_id IS NOT NULL",
        ] {
            connection.execute_unprepared(statement).await?;
        }
        Ok(())
    }

    async fn down(&self, manager: &SchemaManager) -> Result<(), DbErr> {
        let connection = manager.get_connection();
        for statement in [
            "DROP INDEX ix_jobs_batch_status",
            "DROP INDEX ix_jobs_batch_order",
            "DROP INDEX ux_jobs_batch_custom_id",
        ] {
            connection.execute_unprepared(statement).await?;
        }
        drop_columns(manager, Jobs::Table, [Jobs::CustomId, Jobs::BatchId]).await?;
        drop_table(manager, Batches::Table).await
    }
}

#[derive(DeriveIden)]
enum Batches {
    Table,
    Id,
    TenantId,
    IdempotencyKey,
    RequestHash,
    Name,
    Mode,
    Status,
    CancelRequested,
    Model,
    Settings,
    ItemCount,
    Succeeded,
    Failed,
    Cancelled,
    ReservedNanos,
    ProviderCostNanos,
    UnknownBoundNanos,
    CustomerChargeNanos,
    CreatedAt,
    UpdatedAt,
    ClosedAt,
    FinishedAt,
}

#[derive(DeriveIden)]
enum Jobs {
    Table,
    BatchId,
    CustomId,
}

#[derive(DeriveIden)]
enum Tenants {
    Table,
    Id,
}
