//! Expired credit that still backs a hold, tied to that hold.
//!
//! When a grant's instant comes, the part of it that backs open holds cannot expire
//! yet. It is written down as rows of `hold_backings`, one per hold it backs, and the
//! grant is marked `lapsed`: from then on only the charges of those holds may consume
//! it, and what they leave expires when they resolve. A hold taken after the instant
//! is never backed by the grant, so it can never spend credit that had expired.
//! `credit_reservations.backed_nanos` caches a hold's backing, so that resolving it
//! knows, without a read, that an expiry is due.

use sea_orm_migration::{prelude::*, schema::*};

#[derive(DeriveMigrationName)]
pub struct Migration;

#[async_trait::async_trait]
impl MigrationTrait for Migration {
    async fn up(&self, manager: &SchemaManager) -> Result<(), DbErr> {
        manager
            .alter_table(
                Table::alter()
                    .table(CreditGrants::Table)
                    .add_column(boolean(CreditGrants::Lapsed).default(false))
                    .to_owned(),
            )
            .await?;
        manager
            .alter_table(
                Table::alter()
                    .table(CreditReservations::Table)
                    .add_column(big_integer(CreditReservations::BackedNanos).default(0))
                    .to_owned(),
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
                    .foreign_key(
                        ForeignKey::create()
                            .from(HoldBackings::Table, HoldBackings::GrantId)
                            .to(CreditGrants::Table, CreditGrants::Id),
                    )
                    .foreign_key(
                        ForeignKey::create()
                            .from(HoldBackings::Table, HoldBackings::ReservationId)
                            .to(CreditReservations::Table, CreditReservations::Id),
                    )
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
        manager
            .get_connection()
            .execute_unprepared("DROP INDEX ix_credit_reservations_held")
            .await?;
        manager
            .drop_table(Table::drop().table(HoldBackings::Table).to_owned())
            .await?;
        manager
            .alter_table(
                Table::alter()
                    .table(CreditReservations::Table)
                    .drop_column(CreditReservations::BackedNanos)
                    .to_owned(),
            )
            .await?;
        manager
            .alter_table(
                Table::alter()
                    .table(CreditGrants::Table)
                    .drop_column(CreditGrants::Lapsed)
                    .to_owned(),
            )
            .await?;
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
