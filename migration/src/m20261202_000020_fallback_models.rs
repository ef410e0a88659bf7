//! Fallback models: a job's chain of models (its own first, then the fallbacks its
//! `createJob` named), kept as JSON text; NULL for a job without fallbacks, whose
//! `model` column then never changes. With a chain, `model` is the model the job runs
//! on now: the queue groups queued jobs by it, so claims, pauses and rate limits count
//! the model actually called. A partial index finds the queued jobs with a chain on
//! a model, to move them off it when its provider pauses it.

use sea_orm_migration::{prelude::*, schema::*};

#[derive(DeriveMigrationName)]
pub struct Migration;

/// Queued jobs with a chain, by model: what is moved off a model its provider paused.
const INDEX: &str = "ix_jobs_queued_chained";

#[async_trait::async_trait]
impl MigrationTrait for Migration {
    async fn up(&self, manager: &SchemaManager) -> Result<(), DbErr> {
        manager
            .alter_table(
                Table::alter()
                    .table(Jobs::Table)
                    .add_column(text_null(Jobs::ModelChain))
                    .to_owned(),
            )
            .await?;
        // Both backends take a partial index in this SQL.
        manager
            .get_connection()
            .execute_unprepared(&format!(
                "CREATE INDEX {INDEX} ON jobs (model, id) WHERE status = 'queued' AND model_chain IS NOT NULL"
            ))
            .await?;
        Ok(())
    }

    async fn down(&self, manager: &SchemaManager) -> Result<(), DbErr> {
        manager
            .get_connection()
            .execute_unprepared(&format!("DROP INDEX {INDEX}"))
            .await?;
        manager
            .alter_table(
                Table::alter()
                    .table(Jobs::Table)
                    .drop_column(Jobs::ModelChain)
                    .to_owned(),
            )
            .await
    }
}

#[derive(DeriveIden)]
enum Jobs {
    Table,
    ModelChain,
}
