//! Retention: a job records when its payloads (input, result) and its events were
//! pruned, and finished jobs not yet pruned are found by finish time through a partial
//! index that holds only them — the sweep never scans the jobs it already pruned.

use sea_orm_migration::{prelude::*, schema::*};

#[derive(DeriveMigrationName)]
pub struct Migration;

#[async_trait::async_trait]
impl MigrationTrait for Migration {
    async fn up(&self, manager: &SchemaManager) -> Result<(), DbErr> {
        manager
            .alter_table(
                Table::alter()
                    .table(Jobs::Table)
                    .add_column(big_integer_null(Jobs::PayloadsPrunedAt))
                    .to_owned(),
            )
            .await?;
        manager
            .get_connection()
            .execute_unprepared(
                "CREATE INDEX ix_jobs_prunable ON jobs (finished_at) \
                 WHERE finished_at IS NOT NULL AND payloads_pruned_at IS NULL",
            )
            .await?;
        Ok(())
    }

    async fn down(&self, manager: &SchemaManager) -> Result<(), DbErr> {
        manager
            .get_connection()
            .execute_unprepared("DROP INDEX ix_jobs_prunable")
            .await?;
        manager
            .alter_table(
                Table::alter()
                    .table(Jobs::Table)
                    .drop_column(Jobs::PayloadsPrunedAt)
                    .to_owned(),
            )
            .await?;
        Ok(())
    }
}

#[derive(DeriveIden)]
enum Jobs {
    Table,
    PayloadsPrunedAt,
}
