//! A model's batch price beside its list price: what the provider's batch API bills
//! and what the customer pays for a PROVIDER_BATCH item, per million input and output
//! tokens. Versioned with the price; null where the model has no batch price (its
//! provider has no batch API, or none is known), which refuses PROVIDER_BATCH.

use crate::steps::{add_columns, drop_columns};
use sea_orm_migration::{prelude::*, schema::*};

#[derive(DeriveMigrationName)]
pub struct Migration;

const COLUMNS: [ModelPrices; 4] = [
    ModelPrices::ProviderBatchInputNanosPerMillion,
    ModelPrices::ProviderBatchOutputNanosPerMillion,
    ModelPrices::CustomerBatchInputNanosPerMillion,
    ModelPrices::CustomerBatchOutputNanosPerMillion,
];

#[async_trait::async_trait]
impl MigrationTrait for Migration {
    async fn up(&self, manager: &SchemaManager) -> Result<(), DbErr> {
        // One column per statement: SQLite alters a table one column at a time.
        add_columns(manager, ModelPrices::Table, COLUMNS.map(big_integer_null)).await?;
        Ok(())
    }

    async fn down(&self, manager: &SchemaManager) -> Result<(), DbErr> {
        drop_columns(manager, ModelPrices::Table, COLUMNS).await?;
        Ok(())
    }
}

#[derive(Clone, Copy, DeriveIden)]
enum ModelPrices {
    Table,
    ProviderBatchInputNanosPerMillion,
    ProviderBatchOutputNanosPerMillion,
    CustomerBatchInputNanosPerMillion,
    CustomerBatchOutputNanosPerMillion,
}
