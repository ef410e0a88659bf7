//! Expired credit that still backs a hold, tied to that hold.
//!
//! When a grant's instant comes, the part of it that backs open holds cannot expire
//! yet. It is written down as rows of `hold_backings`, one per hold it backs, and the
//! grant is marked `lapsed`: from then on only the charges of those holds may consume
//! it, and what they leave expires when they resolve. A hold taken after the instant
//! is never backed by the grant, so it can never spend credit that had expired.
//! `credit_reservations.backed_nanos` caches a hold's backing, so that resolving it
//! knows, without a read, that an expiry is due.

use crate::steps::{add_columns, drop_columns, drop_table, execute, foreign_key};
use sea_orm_migration::{prelude::*, schema::*};

#[derive(DeriveMigrationName)]
pub struct Migration;

#[async_trait::async_trait]
impl MigrationTrait for Migration {
    async fn up(&self, manager: &SchemaManager) -> Result<(), DbErr> {
        add_columns(
            manager,
            CreditGrants::Table,
            [boolean(CreditGrants::Lapsed).default(false).take()],
        )
        .await?;
        add_columns(
            manager,
            CreditReservations::Table,
            [big_integer(CreditReservations::BackedNanos)
                .default(0)
                .take()],
        )
        .await?;
        manager
            .create_table(
                Table::create()
                    .table(HoldBackings::Table)
                    .col(pk_uuid(HoldBackings::Id))
                    .col(uuid(HoldBackings::TenantId))
                    .col(uuid(HoldBackings::GrantId))
                    .col(uuid(HoldBackings::ReservationId))
                    .col(big_integer(HoldBackings::AmountNanos))
                    .col(big_integer(HoldBackings::ConsumedNanos).default(0))
                    .col(big_integer(HoldBackings::ExpiredNanos).default(0))
                    .col(boolean(HoldBackings::Resolved).default(false))
                    .foreign_key(&mut foreign_key(
                        (HoldBackings::Table, HoldBackings::GrantId),
                        (CreditGrants::Table, CreditGrants::Id),
                    ))
                    .foreign_key(&mut foreign_key(
                        (HoldBackings::Table, HoldBackings::ReservationId),
                        (CreditReservations::Table, CreditReservations::Id),
                    ))
                    .to_owned(),
            )
            .await?;
        // Only open backings are looked up by tenant (at an expiry), and by grant in
        // the audit.
        let connection = manager.get_connection();
        connection
            .execute_unprepared(
                "CREATE INDEX ix_hold_backings_open ON hold_backings (tenant_id) \
                 WHERE NOT resolved",
            )
            .await?;
        connection
            .execute_unprepared("CREATE INDEX ix_hold_backings_grant ON hold_backings (grant_id)")
            .await?;
        // A lapsing grant backs its tenant's open holds: found without reading the
        // resolved ones, which are nearly all of them.
        connection
            .execute_unprepared(
                "CREATE INDEX ix_credit_reservations_held ON credit_reservations (tenant_id, id) \
                 WHERE status = 'held'",
            )
            .await?;
        Ok(())
    }

    async fn down(&self, manager: &SchemaManager) -> Result<(), DbErr> {
        execute(manager, &["DROP INDEX ix_credit_reservations_held"]).await?;
        drop_table(manager, HoldBackings::Table).await?;
        drop_columns(
            manager,
            CreditReservations::Table,
            [CreditReservations::BackedNanos],
        )
        .await?;
        drop_columns(manager, CreditGrants::Table, [CreditGrants::Lapsed]).await?;
        Ok(())
    }
}

#[derive(DeriveIden)]
enum CreditGrants {
    Table,
    Id,
    Lapsed,
}

#[derive(DeriveIden)]
enum CreditReservations {
    Table,
    Id,
    BackedNanos,
}

#[derive(DeriveIden)]
enum HoldBackings {
    Table,
    Id,
    TenantId,
    GrantId,
    ReservationId,
    AmountNanos,
    ConsumedNanos,
    ExpiredNanos,
    Resolved,
}
