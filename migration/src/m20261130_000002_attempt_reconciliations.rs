//! The audit trail of reconciled attempts: an admin recorded the real usage of an
//! attempt whose outcome was unknown, and its cost bound became an exact cost. One row
//! per attempt at most. Money is BIGINT nano-credits and time BIGINT microseconds
//! since the Unix epoch, as in the first migration.

use crate::steps::{create_index, foreign_key, index};
use sea_orm_migration::{prelude::*, schema::*};

#[derive(DeriveMigrationName)]
pub struct Migration;

#[async_trait::async_trait]
impl MigrationTrait for Migration {
    async fn up(&self, manager: &SchemaManager) -> Result<(), DbErr> {
        manager
            .create_table(
                Table::create()
                    .table(AttemptReconciliations::Table)
                    .col(pk_uuid(AttemptReconciliations::Id))
                    .col(uuid_uniq(AttemptReconciliations::AttemptId))
                    .col(uuid(AttemptReconciliations::JobId))
                    .col(uuid(AttemptReconciliations::TenantId))
                    .col(big_integer_null(
                        AttemptReconciliations::PreviousUpperBoundNanos,
                    ))
                    .col(big_integer(AttemptReconciliations::ProviderCostNanos))
                    .col(uuid(AttemptReconciliations::ModelPriceId))
                    .col(big_integer(AttemptReconciliations::InputTokens))
                    .col(big_integer(AttemptReconciliations::CachedInputTokens))
                    .col(big_integer(AttemptReconciliations::OutputTokens))
                    .col(string_null(AttemptReconciliations::ProviderRequestId))
                    .col(text(AttemptReconciliations::Note))
                    .col(string(AttemptReconciliations::ReconciledBy))
                    .col(big_integer(AttemptReconciliations::CreatedAt))
                    .foreign_key(
                        ForeignKey::create()
                            .from(
                                AttemptReconciliations::Table,
                                AttemptReconciliations::AttemptId,
                            )
                            .to(Attempts::Table, Attempts::Id),
                    )
                    .foreign_key(&mut foreign_key(
                        (AttemptReconciliations::Table, AttemptReconciliations::JobId),
                        (Jobs::Table, Jobs::Id),
                    ))
                    .foreign_key(
                        ForeignKey::create()
                            .from(
                                AttemptReconciliations::Table,
                                AttemptReconciliations::TenantId,
                            )
                            .to(Tenants::Table, Tenants::Id),
                    )
                    .foreign_key(
                        ForeignKey::create()
                            .from(
                                AttemptReconciliations::Table,
                                AttemptReconciliations::ModelPriceId,
                            )
                            .to(ModelPrices::Table, ModelPrices::Id),
                    )
                    .to_owned(),
            )
            .await?;
        // Finance reads a tenant's reconciliations newest first.
        create_index(
            manager,
            &mut index(
                "ix_attempt_reconciliations_tenant_id_id",
                AttemptReconciliations::Table,
                [AttemptReconciliations::TenantId, AttemptReconciliations::Id],
            ),
        )
        .await
    }

    async fn down(&self, manager: &SchemaManager) -> Result<(), DbErr> {
        manager
            .drop_table(
                Table::drop()
                    .table(AttemptReconciliations::Table)
                    .to_owned(),
            )
            .await
    }
}

#[derive(DeriveIden)]
enum AttemptReconciliations {
    Table,
    Id,
    AttemptId,
    JobId,
    TenantId,
    PreviousUpperBoundNanos,
    ProviderCostNanos,
    ModelPriceId,
    InputTokens,
    CachedInputTokens,
    OutputTokens,
    ProviderRequestId,
    Note,
    ReconciledBy,
    CreatedAt,
}

#[derive(DeriveIden)]
enum Attempts {
    Table,
    Id,
}

#[derive(DeriveIden)]
enum Jobs {
    Table,
    Id,
}

#[derive(DeriveIden)]
enum Tenants {
    Table,
    Id,
}

#[derive(DeriveIden)]
enum ModelPrices {
    Table,
    Id,
}
