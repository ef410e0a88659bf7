//! Webhooks: endpoints tenants register, and the dispatcher that delivers what the
//! outbox ([`crate::outbox`]) queued for them, signed.

pub mod address;
pub mod dispatch;
pub mod signature;

use crate::db::begin_write;
use crate::error::ServiceError;
use crate::page::{Page, PageRequest};
use entity::{
    Timestamp, WebhookDeliveryStatus, WebhookEvent, tenants, webhook_deliveries, webhooks,
};
use reqwest::Url;
use sea_orm::sea_query::{Expr, LockType};
use sea_orm::{
    ActiveValue::Set, ColumnTrait, ConnectionTrait, DatabaseConnection, EntityTrait,
    PaginatorTrait, QueryFilter, QueryOrder, QuerySelect,
};
use uuid::Uuid;

/// Longest endpoint URL accepted.
const MAX_URL_LENGTH: usize = 2048;
/// Most live endpoints one tenant may have.
pub const MAX_WEBHOOKS_PER_TENANT: u64 = 16;

/// A new endpoint and its signing secret, which is shown this once.
#[derive(Clone, Debug)]
pub struct CreatedWebhook {
    pub webhook: webhooks::Model,
    pub secret: String,
}

/// Registers an endpoint for a tenant's events. The URL must be http(s) and, unless
/// `allow_private`, resolve to public addresses only. The URL is checked (a name
/// lookup) before the write transaction, which locks the tenant's row before
/// counting its endpoints, so concurrent creates never pass the limit.
pub async fn create_webhook(
    db: &DatabaseConnection,
    tenant_id: Uuid,
    url: &str,
    events: &[WebhookEvent],
    allow_private: bool,
) -> Result<CreatedWebhook, ServiceError> {
    let url = url.trim();
    if url.len() > MAX_URL_LENGTH {
        return Err(ServiceError::validation(format!(
            "url must be at most {MAX_URL_LENGTH} bytes"
        )));
    }
    let parsed =
        Url::parse(url).map_err(|_| ServiceError::validation("url is not an absolute URL"))?;
    if !parsed.username().is_empty() || parsed.password().is_some() {
        return Err(ServiceError::validation("url must not carry credentials"));
    }
    address::resolve(&parsed, allow_private)
        .await
        .map_err(|error| ServiceError::validation(format!("url: {error}")))?;
    if events.is_empty() {
        return Err(ServiceError::validation(
            "events must name at least one event",
        ));
    }
    let transaction = begin_write(db).await?;
    // NO KEY UPDATE, as holds take it (see `billing::limits::admit_spend`); SQLite's
    // write transaction holds the whole database already.
    tenants::Entity::find_by_id(tenant_id)
        .lock(LockType::NoKeyUpdate)
        .one(&transaction)
        .await?
        .ok_or(ServiceError::NotFound)?;
    let live = webhooks::Entity::find()
        .filter(webhooks::Column::TenantId.eq(tenant_id))
        .filter(webhooks::Column::DeletedAt.is_null())
        .count(&transaction)
        .await?;
    if live >= MAX_WEBHOOKS_PER_TENANT {
        return Err(ServiceError::validation(format!(
            "a tenant has at most {MAX_WEBHOOKS_PER_TENANT} webhooks"
        )));
    }
    let mut names: Vec<&str> = Vec::new();
    for kind in WebhookEvent::ALL {
        if events.contains(&kind) {
            names.push(kind.as_str());
        }
    }
    let secret = signature::generate_secret();
    let row = webhooks::ActiveModel {
        id: Set(Uuid::now_v7()),
        tenant_id: Set(tenant_id),
        url: Set(parsed.to_string()),
        events: Set(names.join(",")),
        secret: Set(secret.clone()),
        created_at: Set(Timestamp::now()),
        deleted_at: Set(None),
    };
    let webhook = webhooks::Entity::insert(row)
        .exec_with_returning(&transaction)
        .await?;
    transaction.commit().await?;
    tracing::info!(tenant.id = %tenant_id, webhook.id = %webhook.id, "webhook created");
    Ok(CreatedWebhook { webhook, secret })
}

/// Deletes a tenant's endpoint: nothing more is delivered to it, and its pending
/// deliveries are given up. Another tenant's endpoint is `NotFound`.
pub async fn delete_webhook(
    db: &impl ConnectionTrait,
    tenant_id: Uuid,
    webhook_id: Uuid,
) -> Result<webhooks::Model, ServiceError> {
    let webhook = webhooks::Entity::update_many()
        .col_expr(webhooks::Column::DeletedAt, Expr::value(Timestamp::now()))
        .filter(webhooks::Column::Id.eq(webhook_id))
        .filter(webhooks::Column::TenantId.eq(tenant_id))
        .filter(webhooks::Column::DeletedAt.is_null())
        .exec_with_returning(db)
        .await?
        .into_iter()
        .next()
        .ok_or(ServiceError::NotFound)?;
    webhook_deliveries::Entity::update_many()
        .col_expr(
            webhook_deliveries::Column::Status,
            Expr::value(WebhookDeliveryStatus::Failed),
        )
        .filter(webhook_deliveries::Column::WebhookId.eq(webhook_id))
        .filter(webhook_deliveries::Column::Status.eq(WebhookDeliveryStatus::Pending))
        .exec(db)
        .await?;
    tracing::info!(tenant.id = %tenant_id, webhook.id = %webhook_id, "webhook deleted");
    Ok(webhook)
}

/// A tenant's live endpoints (at most [`MAX_WEBHOOKS_PER_TENANT`]), newest first.
pub async fn list_webhooks(
    db: &impl ConnectionTrait,
    tenant_id: Uuid,
) -> Result<Vec<webhooks::Model>, ServiceError> {
    Ok(webhooks::Entity::find()
        .filter(webhooks::Column::TenantId.eq(tenant_id))
        .filter(webhooks::Column::DeletedAt.is_null())
        // Version-7 ids: ordering by id is ordering by creation.
        .order_by_desc(webhooks::Column::Id)
        .all(db)
        .await?)
}

/// At most `first` of a tenant's deliveries older than the delivery `after`.
pub async fn list_deliveries(
    db: &impl ConnectionTrait,
    tenant_id: Uuid,
    page: PageRequest,
) -> Result<Page<webhook_deliveries::Model>, ServiceError> {
    let mut query = webhook_deliveries::Entity::find()
        .filter(webhook_deliveries::Column::TenantId.eq(tenant_id));
    if let Some(after) = page.after {
        // Version-7 ids: ordering by id is ordering by creation.
        query = query.filter(webhook_deliveries::Column::Id.lt(after));
    }
    let deliveries = query
        .order_by_desc(webhook_deliveries::Column::Id)
        .limit(page.first + 1)
        .all(db)
        .await?;
    Ok(Page::from_rows(deliveries, page.first))
}
