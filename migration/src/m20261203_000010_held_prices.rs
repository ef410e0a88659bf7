//! Held prices: a job keeps the price versions its hold was sized with, one per model
//! of its chain (`jobs.held_prices`, JSON text: model name to `model_prices.id`), and
//! an attempt the version its customer charge was priced with
//! (`attempts.customer_price_id`) beside the one its provider cost was
//! (`model_price_id`, the version in force when it ran). A price raised between a
//! job's create and its start so no longer outgrows the hold the customer was quoted.
//! Both are NULL for the rows written before: such a job is charged at the price in
//! force when each attempt runs, as it always was.

use crate::steps::{add_columns, drop_columns};
use sea_orm_migration::{prelude::*, schema::*};

#[derive(DeriveMigrationName)]
pub struct Migration;

#[async_trait::async_trait]
impl MigrationTrait for Migration {
    async fn up(&self, manager: &SchemaManager) -> Result<(), DbErr> {
        add_columns(manager, Jobs::Table, [text_null(Jobs::HeldPrices)]).await?;
        add_columns(
            manager,
            Attempts::Table,
            [uuid_null(Attempts::CustomerPriceId)],
        )
        .await
    }

    async fn down(&self, manager: &SchemaManager) -> Result<(), DbErr> {
        drop_columns(manager, Attempts::Table, [Attempts::CustomerPriceId]).await?;
        drop_columns(manager, Jobs::Table, [Jobs::HeldPrices]).await
    }
}

#[derive(DeriveIden)]
enum Jobs {
    Table,
    HeldPrices,
}

#[derive(DeriveIden)]
enum Attempts {
    Table,
    CustomerPriceId,
}
