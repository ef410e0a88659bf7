//! Spend control: the limits an admin sets per tenant, and the tenant's spend in the
//! current UTC day and month, cached on its row beside the balance.
//!
//! The spend counters live on `tenants` because every create and settlement already
//! locks that row: checking a cap there needs no lock of its own, so concurrent
//! creates cannot both pass it. Holds open when this migration runs are not counted.

use crate::steps::{add_columns, drop_columns, drop_table, foreign_key};
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
                    .foreign_key(&mut foreign_key(
                        (TenantLimits::Table, TenantLimits::TenantId),
                        (Tenants::Table, Tenants::Id),
                    ))
                    .to_owned(),
            )
            .await?;
        // One column per statement: SQLite alters one thing at a time.
        add_columns(
            manager,
            Tenants::Table,
            [
                Tenants::SpendDayStartsAt,
                Tenants::SpendDayNanos,
                Tenants::SpendMonthStartsAt,
                Tenants::SpendMonthNanos,
            ]
            .map(|column| big_integer(column).default(0).take()),
        )
        .await?;
        Ok(())
    }

    async fn down(&self, manager: &SchemaManager) -> Result<(), DbErr> {
        drop_columns(
            manager,
            Tenants::Table,
            [
                Tenants::SpendMonthNanos,
                Tenants::SpendMonthStartsAt,
                Tenants::SpendDayNanos,
                Tenants::SpendDayStartsAt,
            ],
        )
        .await?;
        drop_table(manager, TenantLimits::Table).await
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
