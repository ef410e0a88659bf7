//! Every table of the first release: tenants and keys, jobs and attempts, the credit
//! ledger, job events and model prices. Money is BIGINT nano-credits and time BIGINT
//! microseconds since the Unix epoch on both backends.

use crate::steps::{create_index, drop_table, foreign_key, index};
use sea_orm_migration::{prelude::*, schema::*};

#[derive(DeriveMigrationName)]
pub struct Migration;

#[async_trait::async_trait]
impl MigrationTrait for Migration {
    async fn up(&self, manager: &SchemaManager) -> Result<(), DbErr> {
        manager
            .create_table(
                Table::create()
                    .table(Tenants::Table)
                    .col(pk_uuid(Tenants::Id))
                    .col(string(Tenants::Name))
                    .col(big_integer(Tenants::GrantedNanos))
                    .col(big_integer(Tenants::HeldNanos))
                    .col(big_integer(Tenants::ChargedNanos))
                    .col(big_integer(Tenants::CreatedAt))
                    .to_owned(),
            )
            .await?;

        manager
            .create_table(
                Table::create()
                    .table(ApiKeys::Table)
                    .col(pk_uuid(ApiKeys::Id))
                    .col(uuid_null(ApiKeys::TenantId))
                    .col(string(ApiKeys::Role))
                    .col(string_uniq(ApiKeys::KeyHash))
                    .col(string(ApiKeys::KeyPrefix))
                    .col(big_integer(ApiKeys::CreatedAt))
                    .col(big_integer_null(ApiKeys::RevokedAt))
                    .foreign_key(&mut foreign_key(
                        (ApiKeys::Table, ApiKeys::TenantId),
                        (Tenants::Table, Tenants::Id),
                    ))
                    .to_owned(),
            )
            .await?;

        manager
            .create_table(
                Table::create()
                    .table(ModelPrices::Table)
                    .col(pk_uuid(ModelPrices::Id))
                    .col(string(ModelPrices::Model))
                    .col(integer(ModelPrices::Version))
                    .col(big_integer(ModelPrices::ProviderInputNanosPerMillion))
                    .col(big_integer(ModelPrices::ProviderCachedInputNanosPerMillion))
                    .col(big_integer(ModelPrices::ProviderOutputNanosPerMillion))
                    .col(big_integer(ModelPrices::CustomerInputNanosPerMillion))
                    .col(big_integer(ModelPrices::CustomerCachedInputNanosPerMillion))
                    .col(big_integer(ModelPrices::CustomerOutputNanosPerMillion))
                    .col(big_integer(ModelPrices::EffectiveFrom))
                    .col(string(ModelPrices::Source))
                    .col(big_integer(ModelPrices::CreatedAt))
                    .index(
                        Index::create()
                            .name("uq_model_prices_model_version")
                            .col(ModelPrices::Model)
                            .col(ModelPrices::Version)
                            .unique(),
                    )
                    .to_owned(),
            )
            .await?;

        manager
            .create_table(
                Table::create()
                    .table(Jobs::Table)
                    .col(pk_uuid(Jobs::Id))
                    .col(uuid(Jobs::TenantId))
                    .col(string(Jobs::IdempotencyKey))
                    .col(string(Jobs::RequestHash))
                    .col(string(Jobs::Status))
                    .col(boolean(Jobs::CancelRequested))
                    .col(string(Jobs::Model))
                    .col(json(Jobs::Input))
                    .col(boolean(Jobs::RetryUnknownOutcome))
                    .col(json_null(Jobs::Result))
                    .col(string_null(Jobs::ErrorCode))
                    .col(text_null(Jobs::ErrorMessage))
                    .col(integer(Jobs::AttemptCount))
                    .col(integer(Jobs::MaxAttempts))
                    .col(uuid_null(Jobs::RunToken))
                    .col(big_integer_null(Jobs::LeaseUntil))
                    .col(big_integer(Jobs::NextRunAt))
                    .col(integer(Jobs::LastEventSeq))
                    .col(big_integer(Jobs::CreatedAt))
                    .col(big_integer(Jobs::UpdatedAt))
                    .col(big_integer_null(Jobs::StartedAt))
                    .col(big_integer_null(Jobs::FinishedAt))
                    .foreign_key(&mut foreign_key(
                        (Jobs::Table, Jobs::TenantId),
                        (Tenants::Table, Tenants::Id),
                    ))
                    .index(
                        Index::create()
                            .name("uq_jobs_tenant_idempotency_key")
                            .col(Jobs::TenantId)
                            .col(Jobs::IdempotencyKey)
                            .unique(),
                    )
                    .to_owned(),
            )
            .await?;
        // The claim query scans queued jobs that are due and running jobs whose lease
        // passed; the listing pages through one tenant's jobs newest first.
        create_index(
            manager,
            &mut index(
                "ix_jobs_status_next_run_at",
                Jobs::Table,
                [Jobs::Status, Jobs::NextRunAt],
            ),
        )
        .await?;
        create_index(
            manager,
            &mut index(
                "ix_jobs_tenant_id_id",
                Jobs::Table,
                [Jobs::TenantId, Jobs::Id],
            ),
        )
        .await?;

        manager
            .create_table(
                Table::create()
                    .table(Attempts::Table)
                    .col(pk_uuid(Attempts::Id))
                    .col(uuid(Attempts::JobId))
                    .col(uuid(Attempts::TenantId))
                    .col(integer(Attempts::Number))
                    .col(uuid(Attempts::RunToken))
                    .col(string(Attempts::WorkerId))
                    .col(string(Attempts::Outcome))
                    .col(string_null(Attempts::ErrorCode))
                    .col(text_null(Attempts::ErrorMessage))
                    .col(string(Attempts::Provider))
                    .col(string(Attempts::Model))
                    .col(string_null(Attempts::ProviderRequestId))
                    .col(big_integer_null(Attempts::InputTokens))
                    .col(big_integer_null(Attempts::CachedInputTokens))
                    .col(big_integer_null(Attempts::OutputTokens))
                    .col(big_integer_null(Attempts::ProviderCostNanos))
                    .col(big_integer_null(Attempts::ProviderCostUpperBoundNanos))
                    .col(uuid(Attempts::ModelPriceId))
                    .col(big_integer_null(Attempts::LatencyMs))
                    .col(big_integer(Attempts::StartedAt))
                    .col(big_integer_null(Attempts::FinishedAt))
                    .foreign_key(&mut foreign_key(
                        (Attempts::Table, Attempts::JobId),
                        (Jobs::Table, Jobs::Id),
                    ))
                    .foreign_key(&mut foreign_key(
                        (Attempts::Table, Attempts::ModelPriceId),
                        (ModelPrices::Table, ModelPrices::Id),
                    ))
                    .index(
                        Index::create()
                            .name("uq_attempts_job_id_number")
                            .col(Attempts::JobId)
                            .col(Attempts::Number)
                            .unique(),
                    )
                    .to_owned(),
            )
            .await?;

        manager
            .create_table(
                Table::create()
                    .table(CreditGrants::Table)
                    .col(pk_uuid(CreditGrants::Id))
                    .col(uuid(CreditGrants::TenantId))
                    .col(big_integer(CreditGrants::AmountNanos))
                    .col(string(CreditGrants::IdempotencyKey))
                    .col(text_null(CreditGrants::Reason))
                    .col(big_integer(CreditGrants::CreatedAt))
                    .foreign_key(&mut foreign_key(
                        (CreditGrants::Table, CreditGrants::TenantId),
                        (Tenants::Table, Tenants::Id),
                    ))
                    .index(
                        Index::create()
                            .name("uq_credit_grants_tenant_idempotency_key")
                            .col(CreditGrants::TenantId)
                            .col(CreditGrants::IdempotencyKey)
                            .unique(),
                    )
                    .to_owned(),
            )
            .await?;

        manager
            .create_table(
                Table::create()
                    .table(CreditReservations::Table)
                    .col(pk_uuid(CreditReservations::Id))
                    .col(uuid_uniq(CreditReservations::JobId))
                    .col(uuid(CreditReservations::TenantId))
                    .col(big_integer(CreditReservations::AmountNanos))
                    .col(string(CreditReservations::Status))
                    .col(big_integer(CreditReservations::SettledAmountNanos))
                    .col(big_integer(CreditReservations::ReleasedAmountNanos))
                    .col(big_integer(CreditReservations::CreatedAt))
                    .col(big_integer_null(CreditReservations::ResolvedAt))
                    .foreign_key(&mut foreign_key(
                        (CreditReservations::Table, CreditReservations::JobId),
                        (Jobs::Table, Jobs::Id),
                    ))
                    .to_owned(),
            )
            .await?;

        manager
            .create_table(
                Table::create()
                    .table(Charges::Table)
                    .col(pk_uuid(Charges::Id))
                    .col(uuid_uniq(Charges::JobId))
                    .col(uuid(Charges::TenantId))
                    .col(uuid(Charges::AttemptId))
                    .col(big_integer(Charges::AmountNanos))
                    .col(big_integer(Charges::CreatedAt))
                    .foreign_key(&mut foreign_key(
                        (Charges::Table, Charges::JobId),
                        (Jobs::Table, Jobs::Id),
                    ))
                    .foreign_key(&mut foreign_key(
                        (Charges::Table, Charges::AttemptId),
                        (Attempts::Table, Attempts::Id),
                    ))
                    .to_owned(),
            )
            .await?;

        manager
            .create_table(
                Table::create()
                    .table(LedgerEntries::Table)
                    .col(pk_uuid(LedgerEntries::Id))
                    .col(uuid(LedgerEntries::TenantId))
                    .col(string(LedgerEntries::Kind))
                    .col(big_integer(LedgerEntries::AmountNanos))
                    .col(uuid_null(LedgerEntries::JobId))
                    .col(uuid_null(LedgerEntries::GrantId))
                    .col(big_integer(LedgerEntries::CreatedAt))
                    .foreign_key(&mut foreign_key(
                        (LedgerEntries::Table, LedgerEntries::TenantId),
                        (Tenants::Table, Tenants::Id),
                    ))
                    .to_owned(),
            )
            .await?;
        create_index(
            manager,
            &mut index(
                "ix_ledger_entries_tenant_id_id",
                LedgerEntries::Table,
                [LedgerEntries::TenantId, LedgerEntries::Id],
            ),
        )
        .await?;

        manager
            .create_table(
                Table::create()
                    .table(JobEvents::Table)
                    .col(uuid(JobEvents::JobId))
                    .col(integer(JobEvents::Seq))
                    .col(uuid(JobEvents::TenantId))
                    .col(string(JobEvents::Kind))
                    .col(string(JobEvents::Status))
                    .col(big_integer(JobEvents::At))
                    .col(json_null(JobEvents::Data))
                    .primary_key(Index::create().col(JobEvents::JobId).col(JobEvents::Seq))
                    .foreign_key(&mut foreign_key(
                        (JobEvents::Table, JobEvents::JobId),
                        (Jobs::Table, Jobs::Id),
                    ))
                    .to_owned(),
            )
            .await?;

        Ok(())
    }

    async fn down(&self, manager: &SchemaManager) -> Result<(), DbErr> {
        for table in [
            JobEvents::Table.into_iden(),
            LedgerEntries::Table.into_iden(),
            Charges::Table.into_iden(),
            CreditReservations::Table.into_iden(),
            CreditGrants::Table.into_iden(),
            Attempts::Table.into_iden(),
            Jobs::Table.into_iden(),
            ModelPrices::Table.into_iden(),
            ApiKeys::Table.into_iden(),
            Tenants::Table.into_iden(),
        ] {
            drop_table(manager, table).await?;
        }
        Ok(())
    }
}

#[derive(DeriveIden)]
enum Tenants {
    Table,
    Id,
    Name,
    GrantedNanos,
    HeldNanos,
    ChargedNanos,
    CreatedAt,
}

#[derive(DeriveIden)]
enum ApiKeys {
    Table,
    Id,
    TenantId,
    Role,
    KeyHash,
    KeyPrefix,
    CreatedAt,
    RevokedAt,
}

#[derive(DeriveIden)]
enum ModelPrices {
    Table,
    Id,
    Model,
    Version,
    ProviderInputNanosPerMillion,
    ProviderCachedInputNanosPerMillion,
    ProviderOutputNanosPerMillion,
    CustomerInputNanosPerMillion,
    CustomerCachedInputNanosPerMillion,
    CustomerOutputNanosPerMillion,
    EffectiveFrom,
    Source,
    CreatedAt,
}

#[derive(DeriveIden)]
enum Jobs {
    Table,
    Id,
    TenantId,
    IdempotencyKey,
    RequestHash,
    Status,
    CancelRequested,
    Model,
    Input,
    RetryUnknownOutcome,
    Result,
    ErrorCode,
    ErrorMessage,
    AttemptCount,
    MaxAttempts,
    RunToken,
    LeaseUntil,
    NextRunAt,
    LastEventSeq,
    CreatedAt,
    UpdatedAt,
    StartedAt,
    FinishedAt,
}

#[derive(DeriveIden)]
enum Attempts {
    Table,
    Id,
    JobId,
    TenantId,
    Number,
    RunToken,
    WorkerId,
    Outcome,
    ErrorCode,
    ErrorMessage,
    Provider,
    Model,
    ProviderRequestId,
    InputTokens,
    CachedInputTokens,
    OutputTokens,
    ProviderCostNanos,
    ProviderCostUpperBoundNanos,
    ModelPriceId,
    LatencyMs,
    StartedAt,
    FinishedAt,
}

#[derive(DeriveIden)]
enum CreditGrants {
    Table,
    Id,
    TenantId,
    AmountNanos,
    IdempotencyKey,
    Reason,
    CreatedAt,
}

#[derive(DeriveIden)]
enum CreditReservations {
    Table,
    Id,
    JobId,
    TenantId,
    AmountNanos,
    Status,
    SettledAmountNanos,
    ReleasedAmountNanos,
    CreatedAt,
    ResolvedAt,
}

#[derive(DeriveIden)]
enum Charges {
    Table,
    Id,
    JobId,
    TenantId,
    AttemptId,
    AmountNanos,
    CreatedAt,
}

#[derive(DeriveIden)]
enum LedgerEntries {
    Table,
    Id,
    TenantId,
    Kind,
    AmountNanos,
    JobId,
    GrantId,
    CreatedAt,
}

#[derive(DeriveIden)]
enum JobEvents {
    Table,
    JobId,
    Seq,
    TenantId,
    Kind,
    Status,
    At,
    Data,
}
