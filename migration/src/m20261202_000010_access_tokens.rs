//! Access tokens: short-lived credentials a tenant's backend mints for a browser.
//!
//! A token is stored as the SHA-256 hash of its secret, like an API key. Its row also
//! carries what it may do (scopes, the labels or job ids it is limited to) and the
//! running sum of the holds its creates took, which `max_spend_nanos` caps: the sum is
//! raised by a conditional update in the transaction that creates the job, so creates
//! made together cannot pass the cap. A token minted with an API key names it, and
//! dies with it: revoking a leaked key must not leave a day of tokens it minted.

use crate::steps::{create_index, drop_table, foreign_key, index};
use sea_orm_migration::{prelude::*, schema::*};

#[derive(DeriveMigrationName)]
pub struct Migration;

const EXPIRY_INDEX: &str = "ix_access_tokens_tenant_expires_at";

#[async_trait::async_trait]
impl MigrationTrait for Migration {
    async fn up(&self, manager: &SchemaManager) -> Result<(), DbErr> {
        manager
            .create_table(
                Table::create()
                    .table(AccessTokens::Table)
                    .col(uuid(AccessTokens::Id).primary_key())
                    .col(uuid(AccessTokens::TenantId))
                    .col(uuid_null(AccessTokens::ApiKeyId))
                    .col(string_uniq(AccessTokens::TokenHash))
                    .col(text(AccessTokens::Scopes))
                    .col(text(AccessTokens::Labels))
                    .col(text_null(AccessTokens::JobIds))
                    .col(big_integer_null(AccessTokens::MaxSpendNanos))
                    .col(big_integer(AccessTokens::SpentNanos).default(0))
                    .col(big_integer(AccessTokens::CreatedAt))
                    .col(big_integer(AccessTokens::ExpiresAt))
                    .foreign_key(&mut foreign_key(
                        (AccessTokens::Table, AccessTokens::TenantId),
                        (Tenants::Table, Tenants::Id),
                    ))
                    .to_owned(),
            )
            .await?;
        // Each mint deletes its tenant's expired tokens: a range of this index.
        create_index(
            manager,
            &mut index(
                EXPIRY_INDEX,
                AccessTokens::Table,
                [AccessTokens::TenantId, AccessTokens::ExpiresAt],
            ),
        )
        .await
    }

    async fn down(&self, manager: &SchemaManager) -> Result<(), DbErr> {
        drop_table(manager, AccessTokens::Table).await
    }
}

#[derive(DeriveIden)]
enum AccessTokens {
    Table,
    Id,
    TenantId,
    ApiKeyId,
    TokenHash,
    Scopes,
    Labels,
    JobIds,
    MaxSpendNanos,
    SpentNanos,
    CreatedAt,
    ExpiresAt,
}

#[derive(DeriveIden)]
enum Tenants {
    Table,
    Id,
}
