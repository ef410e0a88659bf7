//! What the customer pays for each attempt, and the output an attempt streamed.
//!
//! A job's charge is the sum of its attempts' customer charges (capped at its hold):
//! the accepted answer, and — by the charging policy — output already streamed to the
//! client by attempts that did not finish, or the bound of calls whose outcome is
//! unknown. Existing finished attempts are backfilled from the one charge their job
//! had, so the sum holds for old jobs too.

use crate::steps::execute;
use crate::steps::{add_columns, drop_columns};
use sea_orm_migration::{prelude::*, schema::*};

#[derive(DeriveMigrationName)]
pub struct Migration;

#[async_trait::async_trait]
impl MigrationTrait for Migration {
    async fn up(&self, manager: &SchemaManager) -> Result<(), DbErr> {
        // One column per statement: SQLite alters one thing at a time.
        add_columns(
            manager,
            Attempts::Table,
            [
                Attempts::CustomerChargeNanos,
                Attempts::DeliveredOutputTokens,
            ]
            .map(big_integer_null),
        )
        .await?;
        execute(manager, &["UPDATE attempts SET customer_charge_nanos = COALESCE(
                    (SELECT charges.amount_nanos FROM charges WHERE charges.attempt_id = attempts.id), 0)
                 WHERE outcome <> 'running'"]).await?;
        Ok(())
    }

    async fn down(&self, manager: &SchemaManager) -> Result<(), DbErr> {
        drop_columns(
            manager,
            Attempts::Table,
            [
                Attempts::CustomerChargeNanos,
                Attempts::DeliveredOutputTokens,
            ],
        )
        .await?;
        Ok(())
    }
}

#[derive(DeriveIden, Clone, Copy)]
enum Attempts {
    Table,
    CustomerChargeNanos,
    DeliveredOutputTokens,
}
