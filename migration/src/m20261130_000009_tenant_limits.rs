//! Spend control: the limits an admin sets per tenant, and the tenant's spend in the
//! current UTC day and month, cached on its row beside the balance.
//!
//! The spend counters live on `tenants` because every create and settlement already
//! locks that row: checking a cap there needs no lock of its own, so concurrent
//! creates cannot both pass it. Holds open when this migration runs are not counted.

use sea_orm_migration::{prelude::*, schema::*};

#[derive(DeriveMigrationName)]
pub struct Migration;

#[async_trait::async_trait]
impl MigrationTrait for Migration {
    async fn up(&self, manager: &SchemaManager) -> Result<(), DbErr> {
        manager
            .create_table(
                Table::create()
                    .table(TenantLimits::Table)
                    .col(pk_uuid(TenantLimits::TenantId))
                    .col(big_integer_null(TenantLimits::DailySpendLimitNanos))
                    .col(big_integer_null(TenantLimits::MonthlySpendLimitNanos))
                    .col(integer_null(TenantLimits::RequestsPerMinute))
                    .col(integer_null(TenantLimits::TokensPerMinute))
                    .col(big_integer_null(TenantLimits::LowBalanceThresholdNanos))
                    .col(big_integer(TenantLimits::UpdatedAt))
                    .col(big_integer_null(
                        TenantLimits::LowBalanceAlertedGrantedNanos,
                    ))
                    .col(big_integer_null(TenantLimits::SpendLimitReachedDay))
                    .col(big_integer_null(TenantLimits::SpendLimitReachedMonth))
                    .foreign_key(
                        ForeignKey::create()
                            .from(TenantLimits::Table, TenantLimits::TenantId)
                            .to(Tenants::Table, Tenants::Id),
                    )
                    .to_owned(),
            )
            .await?;
        // One column per statement: SQLite alters one thing at a time.
        for column in [
            Tenants::SpendDayStartsAt,
            Tenants::SpendDayNanos,
            Tenants::SpendMonthStartsAt,
            Tenants::SpendMonthNanos,
        ] {
            manager
                .alter_table(
                    Table::alter()
                        .table(Tenants::Table)
                        .add_column(big_integer(column).default(0))
                        .to_owned(),
                )
                .await?;
        }
        Ok(())
    }

    async fn down(&self, manager: &SchemaManager) -> Result<(), DbErr> {
        for column in [
            Tenants::SpendMonthNanos,
            Tenants::SpendMonthStartsAt,
            Tenants::SpendDayNanos,
            Tenants::SpendDayStartsAt,
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
        manager
            .drop_table(Table::drop().table(TenantLimits::Table).to_owned())
            .await
    }
}

#[derive(DeriveIden)]
enum TenantLimits {
    Table,
    TenantId,
    DailySpendLimitNanos,
    MonthlySpendLimitNanos,
    RequestsPerMinute,
    TokensPerMinute,
    LowBalanceThresholdNanos,
    UpdatedAt,
    LowBalanceAlertedGrantedNanos,
    SpendLimitReachedDay,
    SpendLimitReachedMonth,
}

#[derive(DeriveIden)]
enum Tenants {
    Table,
    Id,
    SpendDayStartsAt,
    SpendDayNanos,
    SpendMonthStartsAt,
    SpendMonthNanos,
}
