//! Which provider batch rows take the provider's one upload slot
//! (`exclusive_upload`).
//!
//! Uploads of a provider are made one at a time so that a search after a lost answer
//! can tell which batch was whose by when it was made and how many requests it holds
//! — the only way for Anthropic's batches, which carry nothing of ours. OpenAI's carry
//! our id in their metadata, so a search finds exactly its own: such a row need not
//! wait for another upload, nor hold up the provider's others while its own answer is
//! searched for. Existing rows keep the slot, as before. The index that keeps the slot
//! (`ux_provider_batches_uploading` before) is `ux_provider_batches_exclusive_upload`.

use crate::steps::{add_columns, drop_columns};
use sea_orm_migration::{prelude::*, schema::*};

#[derive(DeriveMigrationName)]
pub struct Migration;

#[async_trait::async_trait]
impl MigrationTrait for Migration {
    async fn up(&self, manager: &SchemaManager) -> Result<(), DbErr> {
        add_columns(
            manager,
            ProviderBatches::Table,
            [boolean(ProviderBatches::ExclusiveUpload)
                .default(true)
                .take()],
        )
        .await?;
        let connection = manager.get_connection();
        for statement in [
            "CREATE UNIQUE INDEX ux_provider_batches_exclusive_upload ON provider_batches \
             (provider) WHERE state = 'uploading' AND exclusive_upload",
            "DROP INDEX ux_provider_batches_uploading",
        ] {
            connection.execute_unprepared(statement).await?;
        }
        Ok(())
    }

    async fn down(&self, manager: &SchemaManager) -> Result<(), DbErr> {
        let connection = manager.get_connection();
        for statement in [
            "CREATE UNIQUE INDEX ux_provider_batches_uploading ON provider_batches (provider) \
             WHERE state = 'uploading'",
            "DROP INDEX ux_provider_batches_exclusive_upload",
        ] {
            connection.execute_unprepared(statement).await?;
        }
        drop_columns(
            manager,
            ProviderBatches::Table,
            [ProviderBatches::ExclusiveUpload],
        )
        .await
    }
}

#[derive(Clone, Copy, DeriveIden)]
enum ProviderBatches {
    Table,
    ExclusiveUpload,
}
