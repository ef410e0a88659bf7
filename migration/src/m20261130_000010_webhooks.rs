//! Webhooks: the endpoints tenants register, and the outbox of deliveries to them.
//!
//! A delivery row is written in the same transaction as the fact it reports; the
//! dispatcher claims due rows with a lease, so a crash neither loses nor invents one.

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
                    .table(Webhooks::Table)
                    .col(pk_uuid(Webhooks::Id))
                    .col(uuid(Webhooks::TenantId))
                    .col(text(Webhooks::Url))
                    .col(text(Webhooks::Events))
                    .col(text(Webhooks::Secret))
                    .col(big_integer(Webhooks::CreatedAt))
                    .col(big_integer_null(Webhooks::DeletedAt))
                    .foreign_key(&mut foreign_key(
                        (Webhooks::Table, Webhooks::TenantId),
                        (Tenants::Table, Tenants::Id),
                    ))
                    .to_owned(),
            )
            .await?;
        create_index(
            manager,
            &mut index("ix_webhooks_tenant", Webhooks::Table, [Webhooks::TenantId]),
        )
        .await?;
        manager
            .create_table(
                Table::create()
                    .table(WebhookDeliveries::Table)
                    .col(pk_uuid(WebhookDeliveries::Id))
                    .col(uuid(WebhookDeliveries::TenantId))
                    .col(uuid(WebhookDeliveries::WebhookId))
                    .col(string(WebhookDeliveries::EventType))
                    .col(text(WebhookDeliveries::Payload))
                    .col(string(WebhookDeliveries::Status))
                    .col(integer(WebhookDeliveries::Attempts))
                    .col(big_integer(WebhookDeliveries::NextAttemptAt))
                    .col(big_integer_null(WebhookDeliveries::LeaseUntil))
                    .col(uuid_null(WebhookDeliveries::LeaseToken))
                    .col(integer_null(WebhookDeliveries::LastStatusCode))
                    .col(text_null(WebhookDeliveries::LastError))
                    .col(big_integer(WebhookDeliveries::CreatedAt))
                    .col(big_integer_null(WebhookDeliveries::DeliveredAt))
                    .foreign_key(&mut foreign_key(
                        (WebhookDeliveries::Table, WebhookDeliveries::WebhookId),
                        (Webhooks::Table, Webhooks::Id),
                    ))
                    .to_owned(),
            )
            .await?;
        create_index(
            manager,
            &mut index(
                "ix_webhook_deliveries_tenant",
                WebhookDeliveries::Table,
                [WebhookDeliveries::TenantId, WebhookDeliveries::Id],
            ),
        )
        .await?;
        create_index(
            manager,
            &mut index(
                "ix_webhook_deliveries_due",
                WebhookDeliveries::Table,
                [WebhookDeliveries::Status, WebhookDeliveries::NextAttemptAt],
            ),
        )
        .await
    }

    async fn down(&self, manager: &SchemaManager) -> Result<(), DbErr> {
        drop_table(manager, WebhookDeliveries::Table).await?;
        drop_table(manager, Webhooks::Table).await
    }
}

#[derive(DeriveIden)]
enum Webhooks {
    Table,
    Id,
    TenantId,
    Url,
    Events,
    Secret,
    CreatedAt,
    DeletedAt,
}

#[derive(DeriveIden)]
enum WebhookDeliveries {
    Table,
    Id,
    TenantId,
    WebhookId,
    EventType,
    Payload,
    Status,
    Attempts,
    NextAttemptAt,
    LeaseUntil,
    LeaseToken,
    LastStatusCode,
    LastError,
    CreatedAt,
    DeliveredAt,
}

#[derive(DeriveIden)]
enum Tenants {
    Table,
    Id,
}
