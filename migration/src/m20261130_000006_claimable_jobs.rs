//! Claims that cost the same at 200 jobs queued as at 200,000: jobs get a priority and
//! a requested start (`run_at`), and the indexes the claim and the lease sweep read
//! hold only runnable rows — queued jobs by (tenant, priority, due time) and running
//! jobs by tenant and by lease — so finished jobs, however many, cost them nothing.
//! The full (status, next_run_at) index they replace covered every job ever run.

use crate::steps::{add_columns, drop_columns};
use sea_orm_migration::{prelude::*, schema::*};

#[derive(DeriveMigrationName)]
pub struct Migration;

/// Partial indexes, in the SQL both backends share.
const INDEXES: &[(&str, &str)] = &[
    (
        "ix_jobs_queued",
        "ON jobs (tenant_id, priority, next_run_at, id) WHERE status = 'queued'",
    ),
    (
        "ix_jobs_running_tenant",
        "ON jobs (tenant_id) WHERE status = 'running'",
    ),
    (
        "ix_jobs_running_lease",
        "ON jobs (lease_until) WHERE status = 'running'",
    ),
];

#[async_trait::async_trait]
impl MigrationTrait for Migration {
    async fn up(&self, manager: &SchemaManager) -> Result<(), DbErr> {
        // One column per statement: SQLite alters one thing at a time.
        add_columns(
            manager,
            Jobs::Table,
            [integer(Jobs::Priority).default(5).take()],
        )
        .await?;
        add_columns(manager, Jobs::Table, [big_integer_null(Jobs::RunAt)]).await?;
        let db = manager.get_connection();
        for (name, definition) in INDEXES {
            db.execute_unprepared(&format!("CREATE INDEX {name} {definition}"))
                .await?;
        }
        db.execute_unprepared("DROP INDEX ix_jobs_status_next_run_at")
            .await?;
        Ok(())
    }

    async fn down(&self, manager: &SchemaManager) -> Result<(), DbErr> {
        let db = manager.get_connection();
        db.execute_unprepared(
            "CREATE INDEX ix_jobs_status_next_run_at ON jobs (status, next_run_at)",
        )
        .await?;
        for (name, _) in INDEXES {
            db.execute_unprepared(&format!("DROP INDEX {name}")).await?;
        }
        drop_columns(manager, Jobs::Table, [Jobs::RunAt, Jobs::Priority]).await?;
        Ok(())
    }
}

#[derive(DeriveIden, Clone, Copy)]
enum Jobs {
    Table,
    Priority,
    RunAt,
}
