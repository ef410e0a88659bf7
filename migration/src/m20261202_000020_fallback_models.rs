//! Fallback models: a job's chain of models (its own first, then the fallbacks its
//! `createJob` named), kept as JSON text; NULL for a job without fallbacks, whose
//! `model` column then never changes. With a chain, `model` is the model the job runs
//! on now: the queue groups queued jobs by it, so claims, pauses and rate limits count
//! the model actually called. A partial index finds the queued jobs with a chain on
//! a model, to move them off it when its provider pauses it.

use crate::steps::execute;
use crate::steps::{add_columns, drop_columns};
use sea_orm_migration::{prelude::*, schema::*};

#[derive(DeriveMigrationName)]
pub struct Migration;

/// Queued jobs with a chain, by model: what is moved off a model its provider paused.
const INDEX: &str = "ix_jobs_queued_chained";

#[async_trait::async_trait]
impl MigrationTrait for Migration {
    async fn up(&self, manager: &SchemaManager) -> Result<(), DbErr> {
        add_columns(manager, Jobs::Table, [text_null(Jobs::ModelChain)]).await?;
        // Both backends take a partial index in this SQL.
        execute(manager, &[&format!(
                "CREATE INDEX {INDEX} ON jobs (model, id) WHERE status = 'queued' AND model_chain IS NOT NULL"
            )]).await?;
        Ok(())
    }

    async fn down(&self, manager: &SchemaManager) -> Result<(), DbErr> {
        execute(manager, &[&format!("DROP INDEX {INDEX}")]).await?;
        drop_columns(manager, Jobs::Table, [Jobs::ModelChain]).await
    }
}

#[derive(DeriveIden)]
enum Jobs {
    Table,
    ModelChain,
}
