//! What the operator absorbs of a job's provider cost: the part of its paid calls'
//! cost (exact, or the bound of an unknown outcome) that the customer was not charged,
//! recorded when the hold resolves. It stays counted in the tenant's spend, so the
//! tenant's spend caps bound what it can make the operator absorb, not only what it
//! pays.

use crate::steps::{add_columns, drop_columns};
use sea_orm_migration::{prelude::*, schema::*};

#[derive(DeriveMigrationName)]
pub struct Migration;

#[async_trait::async_trait]
impl MigrationTrait for Migration {
    async fn up(&self, manager: &SchemaManager) -> Result<(), DbErr> {
        let absorbed = big_integer(CreditReservations::AbsorbedNanos)
            .default(0)
            .take();
        add_columns(manager, CreditReservations::Table, [absorbed]).await
    }

    async fn down(&self, manager: &SchemaManager) -> Result<(), DbErr> {
        let columns = [CreditReservations::AbsorbedNanos];
        drop_columns(manager, CreditReservations::Table, columns).await
    }
}

#[derive(DeriveIden)]
enum CreditReservations {
    Table,
    AbsorbedNanos,
}
