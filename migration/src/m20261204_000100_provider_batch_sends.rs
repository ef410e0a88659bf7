//! When a row's upload last sent a creating request (`sent_at`), and how many requests
//! its upload holds (`upload_requests`).
//!
//! After an ambiguous answer to a create, the provider may still be making the batch:
//! the row searches for it only once a grace period has passed since `sent_at`. The
//! search looks for a batch of `upload_requests` requests: an attempt of the row
//! settled while it was `uploading` (a cancel, a deadline) is still in the batch the
//! provider holds. Existing rows have neither; their searches use the attempts still
//! running, as before.

use crate::steps::{add_columns, drop_columns};
use sea_orm_migration::{prelude::*, schema::*};

#[derive(DeriveMigrationName)]
pub struct Migration;

#[async_trait::async_trait]
impl MigrationTrait for Migration {
    async fn up(&self, manager: &SchemaManager) -> Result<(), DbErr> {
        let columns = [
            big_integer_null(ProviderBatches::SentAt),
            big_integer_null(ProviderBatches::UploadRequests),
        ];
        add_columns(manager, ProviderBatches::Table, columns).await
    }

    async fn down(&self, manager: &SchemaManager) -> Result<(), DbErr> {
        let columns = [ProviderBatches::UploadRequests, ProviderBatches::SentAt];
        drop_columns(manager, ProviderBatches::Table, columns).await
    }
}

#[derive(Clone, Copy, DeriveIden)]
enum ProviderBatches {
    Table,
    SentAt,
    UploadRequests,
}
