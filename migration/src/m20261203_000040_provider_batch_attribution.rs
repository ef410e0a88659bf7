//! Whether a provider batch a row records is known to be its own (`attributed`), and
//! the batches a row's search found and its results showed to be someone else's
//! (`ruled_out`, a JSON array of provider ids).
//!
//! An Anthropic message batch carries nothing of ours that can be read before it
//! ends: one found after a lost upload answer is a candidate until its results name
//! the row's attempts. Existing rows recorded what their uploads' answers named, so
//! they are attributed.

use crate::steps::{add_columns, drop_columns};
use sea_orm_migration::{prelude::*, schema::*};

#[derive(DeriveMigrationName)]
pub struct Migration;

#[async_trait::async_trait]
impl MigrationTrait for Migration {
    async fn up(&self, manager: &SchemaManager) -> Result<(), DbErr> {
        let columns = [
            boolean(ProviderBatches::Attributed).default(true).take(),
            text_null(ProviderBatches::RuledOut),
        ];
        add_columns(manager, ProviderBatches::Table, columns).await
    }

    async fn down(&self, manager: &SchemaManager) -> Result<(), DbErr> {
        let columns = [ProviderBatches::RuledOut, ProviderBatches::Attributed];
        drop_columns(manager, ProviderBatches::Table, columns).await
    }
}

#[derive(Clone, Copy, DeriveIden)]
enum ProviderBatches {
    Table,
    Attributed,
    RuledOut,
}
