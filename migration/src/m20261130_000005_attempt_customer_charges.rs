//! What the customer pays for each attempt, and the output an attempt streamed.
//!
//! A job's charge is the sum of its attempts' customer charges (capped at its hold):
//! the accepted answer, and — by the charging policy — output already streamed to the
//! client by attempts that did not finish, or the bound of calls whose outcome is
//! unknown. Existing finished attempts are backfilled from the one charge their job
//! had, so the sum holds for old jobs too.

use sea_orm_migration::{prelude::*, schema::*};

#[derive(DeriveMigrationName)]
pub struct Migration;

#[async_trait::async_trait]
impl MigrationTrait for Migration {
    async fn up(&self, manager: &SchemaManager) -> Result<(), DbErr> {
        // One column per statement: SQLite alters one thing at a time.
        for column in [
            Attempts::CustomerChargeNanos,
            Attempts::DeliveredOutputTokens,
        ] {
            manager
                .alter_table(
                    Table::alter()
                        .table(Attempts::Table)
                        .add_column(big_integer_null(column))
                        .to_owned(),
                )
                .await?;
        }
        manager
            .get_connection()
            .execute_unprepared(
                "UPDATE attempts SET customer_charge_nanos = COALESCE(
                    (SELECT charges.amount_nanos FROM charges WHERE charges.attempt_id = attempts.id), 0)
                 WHERE outcome <> 'running'",
            )
            .await?;
        Ok(())
    }

    async fn down(&self, manager: &SchemaManager) -> Result<(), DbErr> {
        for column in [
            Attempts::CustomerChargeNanos,
            Attempts::DeliveredOutputTokens,
        ] {
            manager
                .alter_table(
                    Table::alter()
                        .table(Attempts::Table)
                        .drop_column(column)
                        .to_owned(),
                )
                .await?;
        }
        Ok(())
    }
}

#[derive(DeriveIden, Clone, Copy)]
enum Attempts {
    Table,
    CustomerChargeNanos,
    DeliveredOutputTokens,
}
