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

use crate::steps::{add_columns, drop_columns, execute};
use sea_orm_migration::{prelude::*, schema::*};

#[derive(DeriveMigrationName)]
pub struct Migration;

#[async_trait::async_trait]
impl MigrationTrait for Migration {
    async fn up(&self, manager: &SchemaManager) -> Result<(), DbErr> {
        let grant_columns = [
            big_integer_null(CreditGrants::ExpiresAt),
            big_integer(CreditGrants::ConsumedNanos).default(0).take(),
            big_integer(CreditGrants::ExpiredNanos).default(0).take(),
        ];
        add_columns(manager, CreditGrants::Table, grant_columns).await?;
        let tenant_columns = [
            big_integer(Tenants::ExpiredNanos).default(0).take(),
            big_integer(Tenants::AttributedNanos).default(0).take(),
            big_integer_null(Tenants::NextExpiryAt),
        ];
        add_columns(manager, Tenants::Table, tenant_columns).await?;
        execute(
            manager,
            &[
                "CREATE INDEX ix_tenants_next_expiry ON tenants (next_expiry_at) \
               WHERE next_expiry_at IS NOT NULL",
            ],
        )
        .await
    }

    async fn down(&self, manager: &SchemaManager) -> Result<(), DbErr> {
        execute(manager, &["DROP INDEX ix_tenants_next_expiry"]).await?;
        let tenant_columns = [
            Tenants::NextExpiryAt,
            Tenants::AttributedNanos,
            Tenants::ExpiredNanos,
        ];
        drop_columns(manager, Tenants::Table, tenant_columns).await?;
        let grant_columns = [
            CreditGrants::ExpiredNanos,
            CreditGrants::ConsumedNanos,
            CreditGrants::ExpiresAt,
        ];
        drop_columns(manager, CreditGrants::Table, grant_columns).await
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
