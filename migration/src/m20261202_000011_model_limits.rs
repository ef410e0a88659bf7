//! A model's limits beside its price: the context window (input and output tokens
//! together) and the most output tokens one call may ask for. They are versioned with
//! the price, since a provider changes both at once, and null where they are unknown.

use crate::steps::{add_columns, drop_columns};
use sea_orm_migration::{prelude::*, schema::*};

#[derive(DeriveMigrationName)]
pub struct Migration;

#[async_trait::async_trait]
impl MigrationTrait for Migration {
    async fn up(&self, manager: &SchemaManager) -> Result<(), DbErr> {
        // One column per statement: SQLite alters a table one column at a time.
        add_columns(
            manager,
            ModelPrices::Table,
            [ModelPrices::ContextWindow, ModelPrices::MaxOutputTokens].map(big_integer_null),
        )
        .await?;
        Ok(())
    }

    async fn down(&self, manager: &SchemaManager) -> Result<(), DbErr> {
        drop_columns(
            manager,
            ModelPrices::Table,
            [ModelPrices::ContextWindow, ModelPrices::MaxOutputTokens],
        )
        .await?;
        Ok(())
    }
}

#[derive(DeriveIden)]
enum ModelPrices {
    Table,
    ContextWindow,
    MaxOutputTokens,
}
