//! Labels and reruns.
//!
//! A label is a `key=value` pair a client puts on a job to find it again. Labels live in
//! a table of their own, one row per label, so that finding a tenant's jobs by a label is
//! a range scan of one index in the jobs page's order (newest first, by id), never a scan
//! of JSON. The tenant is in every row so the index is the tenant's alone.
//!
//! A rerun is a new job with the input of a finished one; `jobs.rerun_of` names that
//! one.

use crate::steps::{add_columns, create_index, drop_columns, drop_table, foreign_key, index};
use sea_orm_migration::{prelude::*, schema::*};

#[derive(DeriveMigrationName)]
pub struct Migration;

const LABEL_INDEX: &str = "ix_job_labels_tenant_key_value_job";

#[async_trait::async_trait]
impl MigrationTrait for Migration {
    async fn up(&self, manager: &SchemaManager) -> Result<(), DbErr> {
        manager
            .create_table(
                Table::create()
                    .table(JobLabels::Table)
                    .col(uuid(JobLabels::JobId))
                    .col(uuid(JobLabels::TenantId))
                    .col(string(JobLabels::Key))
                    .col(string(JobLabels::Value))
                    // One value per key and job: a job's labels are a map.
                    .primary_key(Index::create().col(JobLabels::JobId).col(JobLabels::Key))
                    .foreign_key(&mut foreign_key(
                        (JobLabels::Table, JobLabels::JobId),
                        (Jobs::Table, Jobs::Id),
                    ))
                    .to_owned(),
            )
            .await?;
        add_columns(manager, Jobs::Table, [uuid_null(Jobs::RerunOf)]).await?;
        // jobs(label:) pages a tenant's jobs with one label newest first: equality on the
        // first three columns, then job ids in order. `rerun_of` is only read from the
        // rerun's own row, so it has no index.
        create_index(
            manager,
            &mut index(
                LABEL_INDEX,
                JobLabels::Table,
                [
                    JobLabels::TenantId,
                    JobLabels::Key,
                    JobLabels::Value,
                    JobLabels::JobId,
                ],
            ),
        )
        .await
    }

    async fn down(&self, manager: &SchemaManager) -> Result<(), DbErr> {
        drop_columns(manager, Jobs::Table, [Jobs::RerunOf]).await?;
        drop_table(manager, JobLabels::Table).await
    }
}

#[derive(DeriveIden)]
enum JobLabels {
    Table,
    JobId,
    TenantId,
    Key,
    Value,
}

#[derive(DeriveIden)]
enum Jobs {
    Table,
    Id,
    RerunOf,
}
