//! Flow control: provider and tenant rate limits that hold across every process.
//!
//! - `rate_limit_buckets` holds one token bucket per limited provider, model or
//!   tenant (requests and tokens, each refilled continuously from `refilled_at`), and a
//!   model's pause after the provider answered 429. The limits themselves live in the
//!   config file and in `tenant_limits`: the row keeps only what was used.
//! - `jobs.token_bound` is what a job's call may use at most (prompt plus allowed
//!   output), the amount the claim takes from a tokens-per-minute budget.
//! - The queued-jobs index gains the model after the tenant, so the claim can visit a
//!   tenant's models one by one and pass over a paused or spent model's backlog with
//!   one index probe instead of reading it.

use crate::steps::drop_table;
use crate::steps::{add_columns, drop_columns};
use sea_orm_migration::{prelude::*, schema::*};

#[derive(DeriveMigrationName)]
pub struct Migration;

#[async_trait::async_trait]
impl MigrationTrait for Migration {
    async fn up(&self, manager: &SchemaManager) -> Result<(), DbErr> {
        manager
            .create_table(
                Table::create()
                    .table(RateLimitBuckets::Table)
                    .col(string(RateLimitBuckets::Scope))
                    .col(string(RateLimitBuckets::Key))
                    .col(double_null(RateLimitBuckets::Requests))
                    .col(double_null(RateLimitBuckets::Tokens))
                    .col(big_integer(RateLimitBuckets::RefilledAt))
                    .col(big_integer_null(RateLimitBuckets::PausedUntil))
                    .primary_key(
                        Index::create()
                            .col(RateLimitBuckets::Scope)
                            .col(RateLimitBuckets::Key),
                    )
                    .to_owned(),
            )
            .await?;
        add_columns(manager, Jobs::Table, [big_integer_null(Jobs::TokenBound)]).await?;
        let db = manager.get_connection();
        db.execute_unprepared(
            "CREATE INDEX ix_jobs_queued_by_model \
             ON jobs (tenant_id, model, priority, next_run_at, id) WHERE status = 'queued'",
        )
        .await?;
        db.execute_unprepared("DROP INDEX ix_jobs_queued").await?;
        Ok(())
    }

    async fn down(&self, manager: &SchemaManager) -> Result<(), DbErr> {
        let db = manager.get_connection();
        db.execute_unprepared(
            "CREATE INDEX ix_jobs_queued \
             ON jobs (tenant_id, priority, next_run_at, id) WHERE status = 'queued'",
        )
        .await?;
        db.execute_unprepared("DROP INDEX ix_jobs_queued_by_model")
            .await?;
        drop_columns(manager, Jobs::Table, [Jobs::TokenBound]).await?;
        drop_table(manager, RateLimitBuckets::Table).await?;
        Ok(())
    }
}

#[derive(DeriveIden)]
enum RateLimitBuckets {
    Table,
    Scope,
    Key,
    Requests,
    Tokens,
    RefilledAt,
    PausedUntil,
}

#[derive(DeriveIden)]
enum Jobs {
    Table,
    TokenBound,
}
