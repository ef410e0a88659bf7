//! Retention: a job records when its payloads (input, result) and its events were
//! pruned, and finished jobs not yet pruned are found by finish time through a partial
//! index that holds only them — the sweep never scans the jobs it already pruned.

use crate::steps::{add_columns, drop_columns, execute};
use sea_orm_migration::{prelude::*, schema::*};

#[derive(DeriveMigrationName)]
pub struct Migration;

#[async_trait::async_trait]
impl MigrationTrait for Migration {
    async fn up(&self, manager: &SchemaManager) -> Result<(), DbErr> {
        add_columns(
            manager,
            Jobs::Table,
            [big_integer_null(Jobs::PayloadsPrunedAt)],
        )
        .await?;
        execute(
            manager,
            &["CREATE INDEX ix_jobs_prunable ON jobs (finished_at) \
               WHERE finished_at IS NOT NULL AND payloads_pruned_at IS NULL"],
        )
        .await
    }

    async fn down(&self, manager: &SchemaManager) -> Result<(), DbErr> {
        execute(manager, &["DROP INDEX ix_jobs_prunable"]).await?;
        drop_columns(manager, Jobs::Table, [Jobs::PayloadsPrunedAt]).await
    }
}

#[derive(DeriveIden)]
enum Jobs {
    Table,
    PayloadsPrunedAt,
}
