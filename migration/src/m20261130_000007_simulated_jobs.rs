//! Whether the API admitted a job for the built-in simulator. A worker process whose
//! own configuration has no provider for a job's model would otherwise simulate it —
//! and charge real prices for a simulated reply — when the API had routed it to a real
//! provider. Jobs from before default to `false`: a worker never simulates them.

use crate::steps::{add_columns, drop_columns};
use sea_orm_migration::{prelude::*, schema::*};

#[derive(DeriveMigrationName)]
pub struct Migration;

#[async_trait::async_trait]
impl MigrationTrait for Migration {
    async fn up(&self, manager: &SchemaManager) -> Result<(), DbErr> {
        let simulated = boolean(Jobs::Simulated).default(false).take();
        add_columns(manager, Jobs::Table, [simulated]).await
    }

    async fn down(&self, manager: &SchemaManager) -> Result<(), DbErr> {
        drop_columns(manager, Jobs::Table, [Jobs::Simulated]).await
    }
}

#[derive(DeriveIden)]
enum Jobs {
    Table,
    Simulated,
}
