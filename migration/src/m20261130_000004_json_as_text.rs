//! JSON columns become text holding serialized JSON.
//!
//! PostgreSQL's `jsonb` cannot hold the escape `\u0000`, and values reached the `json`
//! columns through a `jsonb` parameter, so a reply or a prompt with a NUL character
//! could not be stored at all. As text, every valid JSON value round-trips exactly.
//! SQLite already stores these columns as text: nothing changes there.

use crate::steps::execute;
use sea_orm_migration::prelude::*;

#[derive(DeriveMigrationName)]
pub struct Migration;

/// (table, column) of every JSON column.
const JSON_COLUMNS: &[(&str, &str)] = &[
    ("jobs", "input"),
    ("jobs", "result"),
    ("job_events", "data"),
];

#[async_trait::async_trait]
impl MigrationTrait for Migration {
    async fn up(&self, manager: &SchemaManager) -> Result<(), DbErr> {
        convert(manager, "text").await
    }

    async fn down(&self, manager: &SchemaManager) -> Result<(), DbErr> {
        convert(manager, "json").await
    }
}

async fn convert(manager: &SchemaManager<'_>, to: &str) -> Result<(), DbErr> {
    if manager.get_database_backend() != sea_orm::DbBackend::Postgres {
        return Ok(());
    }
    for (table, column) in JSON_COLUMNS {
        execute(
            manager,
            &[&format!(
                r#"ALTER TABLE "{table}" ALTER COLUMN "{column}" TYPE {to} USING "{column}"::{to}"#
            )],
        )
        .await?;
    }
    Ok(())
}
