//! Provider batches: one row per upload to a provider's batch API (OpenAI Batch,
//! Anthropic Message Batches), written before the upload so that a crash can never
//! leave a provider batch the database does not know about; and, on each attempt, the
//! provider batch it went out in.
//!
//! A row is owned by one submitter at a time, through `run_token` and `lease_until`
//! as a job claim is. A partial unique index lets at most one row of a provider be
//! `uploading` at once: a submitter that finds such a row after a crash knows that any
//! batch the provider lists from after its `uploading_at` that no row records is that
//! upload — the only way to find an Anthropic batch again, since it carries no
//! metadata.

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
                    .table(ProviderBatches::Table)
                    .col(pk_uuid(ProviderBatches::Id))
                    .col(uuid(ProviderBatches::BatchId))
                    .col(uuid(ProviderBatches::TenantId))
                    .col(string(ProviderBatches::Provider))
                    .col(string(ProviderBatches::Model))
                    .col(string(ProviderBatches::State))
                    .col(string_null(ProviderBatches::ProviderBatchId))
                    .col(string_null(ProviderBatches::InputFileId))
                    .col(big_integer(ProviderBatches::ItemCount))
                    .col(big_integer(ProviderBatches::CostBoundNanos))
                    .col(uuid_null(ProviderBatches::RunToken))
                    .col(big_integer_null(ProviderBatches::LeaseUntil))
                    .col(big_integer(ProviderBatches::NextPollAt))
                    .col(integer(ProviderBatches::Polls).default(0))
                    .col(boolean(ProviderBatches::CancelSent).default(false))
                    .col(big_integer(ProviderBatches::LastReadAt))
                    .col(text_null(ProviderBatches::LastError))
                    .col(big_integer(ProviderBatches::CreatedAt))
                    .col(big_integer_null(ProviderBatches::UploadingAt))
                    .col(big_integer_null(ProviderBatches::SubmittedAt))
                    .col(big_integer_null(ProviderBatches::EndedAt))
                    .foreign_key(&mut foreign_key(
                        (ProviderBatches::Table, ProviderBatches::BatchId),
                        (Batches::Table, Batches::Id),
                    ))
                    .to_owned(),
            )
            .await?;
        add_columns(
            manager,
            Attempts::Table,
            [uuid_null(Attempts::ProviderBatchId)],
        )
        .await?;
        let connection = manager.get_connection();
        for statement in [
            // A batch's provider batches, for the console and the batch's reads.
            "CREATE INDEX ix_provider_batches_batch ON provider_batches (batch_id, id)",
            // What the submitter has to look at: every row not settled yet.
            "CREATE INDEX ix_provider_batches_open ON provider_batches (state, next_poll_at) \
             WHERE state IN ('preparing', 'uploading', 'submitted', 'cancelling', 'ended')",
            // At most one upload of a provider in flight (see the module).
            "CREATE UNIQUE INDEX ux_provider_batches_uploading ON provider_batches (provider) \
             WHERE state = 'uploading'",
            // The provider's id names one row.
            "CREATE UNIQUE INDEX ux_provider_batches_remote ON provider_batches \
             (provider, provider_batch_id) WHERE provider_batch_id IS NOT NULL",
            // A provider batch's attempts, to settle them.
            "CREATE INDEX ix_attempts_provider_batch ON attempts (provider_batch_id) \
             WHERE provider_batch_id IS NOT NULL",
        ] {
            connection.execute_unprepared(statement).await?;
        }
        Ok(())
    }

    async fn down(&self, manager: &SchemaManager) -> Result<(), DbErr> {
        let connection = manager.get_connection();
        connection
            .execute_unprepared("DROP INDEX ix_attempts_provider_batch")
            .await?;
        drop_columns(manager, Attempts::Table, [Attempts::ProviderBatchId]).await?;
        drop_table(manager, ProviderBatches::Table).await
    }
}

#[derive(DeriveIden)]
enum ProviderBatches {
    Table,
    Id,
    BatchId,
    TenantId,
    Provider,
    Model,
    State,
    ProviderBatchId,
    InputFileId,
    ItemCount,
    CostBoundNanos,
    RunToken,
    LeaseUntil,
    NextPollAt,
    Polls,
    CancelSent,
    LastReadAt,
    LastError,
    CreatedAt,
    UploadingAt,
    SubmittedAt,
    EndedAt,
}

#[derive(DeriveIden)]
enum Batches {
    Table,
    Id,
}

#[derive(DeriveIden)]
enum Attempts {
    Table,
    ProviderBatchId,
}
