//! Deadlines: the instant by which a job must have finished (`createJob`'s `deadline`,
//! else the configured default). Queued jobs whose deadline passed are failed by a
//! sweep that reads them by a range of a partial index of queued jobs, so finished
//! jobs, however many, cost it nothing.
//!
//! Unfinished jobs created before deadlines existed get the built-in default, 24 hours
//! from when they could first start, so that every runnable job has one. Finished jobs
//! keep none: nothing reads it for them.

use crate::steps::execute;
use crate::steps::{add_columns, drop_columns};
use sea_orm_migration::{prelude::*, schema::*};

#[derive(DeriveMigrationName)]
pub struct Migration;

const INDEX: &str = "ix_jobs_queued_deadline";

/// 24 hours in microseconds, the unit of every timestamp column.
const DAY_MICROS: i64 = 24 * 60 * 60 * 1_000_000;

#[async_trait::async_trait]
impl MigrationTrait for Migration {
    async fn up(&self, manager: &SchemaManager) -> Result<(), DbErr> {
        add_columns(manager, Jobs::Table, [big_integer_null(Jobs::Deadline)]).await?;
        let db = manager.get_connection();
        db.execute_unprepared(&format!(
            "UPDATE jobs SET deadline = {DAY_MICROS} + CASE
                 WHEN run_at IS NOT NULL AND run_at > created_at THEN run_at ELSE created_at END
             WHERE status IN ('queued', 'running')"
        ))
        .await?;
        // Both backends take a partial index in this SQL.
        db.execute_unprepared(&format!(
            "CREATE INDEX {INDEX} ON jobs (deadline) WHERE status = 'queued' AND deadline IS NOT NULL"
        ))
        .await?;
        Ok(())
    }

    async fn down(&self, manager: &SchemaManager) -> Result<(), DbErr> {
        execute(manager, &[&format!("DROP INDEX {INDEX}")]).await?;
        drop_columns(manager, Jobs::Table, [Jobs::Deadline]).await?;
        Ok(())
    }
}

#[derive(DeriveIden)]
enum Jobs {
    Table,
    Deadline,
}
