//! Credit grants that expire: a grant may carry `expires_at`; what is left of it then
//! leaves the available balance through `expiry` ledger entries.
//!
//! Which grant a charge consumed is recorded per grant (`consumed_nanos`), attributed
//! lazily: the tenant's row counts the charges already attributed
//! (`attributed_nanos`), and the rest is spread over the grants whenever the set of
//! grants or their remainders is about to change (a new grant, an expiry). The
//! tenant's row also caches the sum of expiries (`expired_nanos`) beside granted, held
//! and charged, and the earliest expiry among its grants with something left
//! (`next_expiry_at`): a hold checks it in the UPDATE that takes the hold, so credit
//! past its expiry is never held even before the sweep got to it, and the sweep finds
//! the tenants it has work for through a partial index that holds only them.

use sea_orm_migration::{prelude::*, schema::*};

#[derive(DeriveMigrationName)]
pub struct Migration;

#[async_trait::async_trait]
impl MigrationTrait for Migration {
    async fn up(&self, manager: &SchemaManager) -> Result<(), DbErr> {
        // One column per statement: SQLite alters one thing at a time.
        manager
            .alter_table(
                Table::alter()
                    .table(CreditGrants::Table)
                    .add_column(big_integer_null(CreditGrants::ExpiresAt))
                    .to_owned(),
            )
            .await?;
        for column in [CreditGrants::ConsumedNanos, CreditGrants::ExpiredNanos] {
            manager
                .alter_table(
                    Table::alter()
                        .table(CreditGrants::Table)
                        .add_column(big_integer(column).default(0))
                        .to_owned(),
                )
                .await?;
        }
        for column in [Tenants::ExpiredNanos, Tenants::AttributedNanos] {
            manager
                .alter_table(
                    Table::alter()
                        .table(Tenants::Table)
                        .add_column(big_integer(column).default(0))
                        .to_owned(),
                )
                .await?;
        }
        manager
            .alter_table(
                Table::alter()
                    .table(Tenants::Table)
                    .add_column(big_integer_null(Tenants::NextExpiryAt))
                    .to_owned(),
            )
            .await?;
        manager
            .get_connection()
            .execute_unprepared(
                "CREATE INDEX ix_tenants_next_expiry ON tenants (next_expiry_at) \
                 WHERE next_expiry_at IS NOT NULL",
            )
            .await?;
        Ok(())
    }

    async fn down(&self, manager: &SchemaManager) -> Result<(), DbErr> {
        manager
            .get_connection()
            .execute_unprepared("DROP INDEX ix_tenants_next_expiry")
            .await?;
        for column in [
            Tenants::NextExpiryAt,
            Tenants::AttributedNanos,
            Tenants::ExpiredNanos,
        ] {
            manager
                .alter_table(
                    Table::alter()
                        .table(Tenants::Table)
                        .drop_column(column)
                        .to_owned(),
                )
                .await?;
        }
        for column in [
            CreditGrants::ExpiredNanos,
            CreditGrants::ConsumedNanos,
            CreditGrants::ExpiresAt,
        ] {
            manager
                .alter_table(
                    Table::alter()
                        .table(CreditGrants::Table)
                        .drop_column(column)
                        .to_owned(),
                )
                .await?;
        }
        Ok(())
    }
}

#[derive(DeriveIden)]
enum CreditGrants {
    Table,
    ExpiresAt,
    ConsumedNanos,
    ExpiredNanos,
}

#[derive(DeriveIden)]
enum Tenants {
    Table,
    ExpiredNanos,
    AttributedNanos,
    NextExpiryAt,
}
