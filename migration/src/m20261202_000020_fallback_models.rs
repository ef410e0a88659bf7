//! Fallback models: a job's chain of models (its own first, then the fallbacks its
//! `createJob` named), kept as JSON text; NULL for a job without fallbacks, whose
//! `model` column then never changes. With a chain, `model` is the model the job runs
//! on now: the queue groups queued jobs by it, so claims, pauses and rate limits count
//! the model actually called.

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
                    .add_column(text_null(Jobs::ModelChain))
                    .to_owned(),
            )
            .await
    }

    async fn down(&self, manager: &SchemaManager) -> Result<(), DbErr> {
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
