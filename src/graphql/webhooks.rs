//! Webhooks over GraphQL: a tenant registers and deletes endpoints and reads its
//! deliveries.

use super::types::{PageInfo, connect, edge};
use super::{app, principal};
use crate::outbox;
use crate::page::PageRequest;
use crate::webhooks;
use async_graphql::{Context, Enum, InputObject, Object, SimpleObject};
use chrono::{DateTime, Utc};
use entity::{WebhookEvent, webhook_deliveries, webhooks as rows};
use uuid::Uuid;

/// What a webhook reports.
#[derive(Enum, Clone, Copy, Debug, PartialEq, Eq)]
#[graphql(remote = "entity::WebhookEvent")]
pub enum WebhookEventType {
    JobSucceeded,
    JobFailed,
    JobCancelled,
    BalanceLow,
    SpendLimitReached,
    /// A batch finished: every item ended.
    BatchFinished,
}

/// Where a delivery is.
#[derive(Enum, Clone, Copy, Debug, PartialEq, Eq)]
#[graphql(remote = "entity::WebhookDeliveryStatus")]
pub enum WebhookDeliveryStatus {
    /// Not yet accepted; retried with backoff for a day.
    Pending,
    /// The endpoint answered 2xx.
    Delivered,
    /// Given up.
    Failed,
}

/// An endpoint to register.
#[derive(InputObject)]
pub struct CreateWebhookInput {
    /// http(s) URL; it must resolve to public addresses.
    pub url: String,
    pub events: Vec<WebhookEventType>,
}

/// A registered endpoint.
#[derive(SimpleObject)]
pub struct Webhook {
    pub id: Uuid,
    pub url: String,
    pub events: Vec<WebhookEventType>,
    pub created_at: DateTime<Utc>,
}

impl From<rows::Model> for Webhook {
    fn from(row: rows::Model) -> Self {
        Self {
            id: row.id,
            events: outbox::events_of(&row)
                .into_iter()
                .map(Into::into)
                .collect(),
            url: row.url,
            created_at: row.created_at.to_datetime(),
        }
    }
}

/// The new endpoint and its signing secret, shown this once.
#[derive(SimpleObject)]
pub struct CreateWebhookPayload {
    /// `whsec_<base64 key>`: verifies the `webhook-signature` header.
    pub secret: String,
    pub webhook: Webhook,
}

/// One event sent (or being sent) to one endpoint.
#[derive(SimpleObject)]
pub struct WebhookDelivery {
    /// Also the `webhook-id` header, the same on every retry.
    pub id: Uuid,
    pub webhook_id: Uuid,
    pub event_type: WebhookEventType,
    pub status: WebhookDeliveryStatus,
    /// Tries so far.
    pub attempts: i32,
    pub last_status_code: Option<i32>,
    pub created_at: DateTime<Utc>,
    pub delivered_at: Option<DateTime<Utc>>,
}

impl WebhookDelivery {
    fn new(row: webhook_deliveries::Model) -> Self {
        Self {
            id: row.id,
            webhook_id: row.webhook_id,
            event_type: row.event_type.into(),
            status: row.status.into(),
            attempts: row.attempts,
            last_status_code: row.last_status_code,
            created_at: row.created_at.to_datetime(),
            delivered_at: row.delivered_at.map(|at| at.to_datetime()),
        }
    }
}

edge!(
    /// An edge of a page of deliveries.
    WebhookDeliveryEdge of WebhookDelivery
);

/// A page of deliveries, newest first.
#[derive(SimpleObject)]
pub struct WebhookDeliveryConnection {
    pub edges: Vec<WebhookDeliveryEdge>,
    pub page_info: PageInfo,
}

/// The webhook query.
#[derive(Default)]
pub struct WebhookQuery;

#[Object]
impl WebhookQuery {
    /// The caller's endpoints that are not deleted, newest first (a tenant has at
    /// most 16). Their signing secrets were shown once, at `createWebhook`.
    #[graphql(complexity = "webhooks::MAX_WEBHOOKS_PER_TENANT as usize * child_complexity")]
    async fn webhooks(&self, context: &Context<'_>) -> async_graphql::Result<Vec<Webhook>> {
        let tenant_id = principal(context)?.tenant_id()?;
        let webhooks = webhooks::list_webhooks(&app(context).db, tenant_id).await?;
        Ok(webhooks.into_iter().map(Webhook::from).collect())
    }

    /// The caller's webhook deliveries, newest first, `first` at a time (at most 100).
    #[graphql(complexity = "super::cost::page_complexity(first, child_complexity)")]
    async fn webhook_deliveries(
        &self,
        context: &Context<'_>,
        first: Option<i32>,
        after: Option<String>,
    ) -> async_graphql::Result<WebhookDeliveryConnection> {
        let tenant_id = principal(context)?.tenant_id()?;
        let page = PageRequest::new(first, after.as_deref())?;
        let page = webhooks::list_deliveries(&app(context).db, tenant_id, page).await?;
        let (edges, page_info) = connect(page, |delivery| {
            (delivery.id, WebhookDelivery::new(delivery))
        });
        Ok(WebhookDeliveryConnection { edges, page_info })
    }
}

/// The webhook mutations.
#[derive(Default)]
pub struct WebhookMutation;

#[Object]
impl WebhookMutation {
    /// Registers an endpoint for the caller's events; the signing secret is returned
    /// this once.
    async fn create_webhook(
        &self,
        context: &Context<'_>,
        input: CreateWebhookInput,
    ) -> async_graphql::Result<CreateWebhookPayload> {
        let tenant_id = principal(context)?.tenant_id()?;
        let app = app(context);
        let events: Vec<WebhookEvent> = input.events.into_iter().map(Into::into).collect();
        let created = webhooks::create_webhook(
            &app.db,
            tenant_id,
            &input.url,
            &events,
            app.allow_private_webhooks,
        )
        .await?;
        Ok(CreateWebhookPayload {
            secret: created.secret,
            webhook: created.webhook.into(),
        })
    }

    /// Deletes one of the caller's endpoints; its pending deliveries are given up.
    async fn delete_webhook(
        &self,
        context: &Context<'_>,
        id: Uuid,
    ) -> async_graphql::Result<Webhook> {
        let tenant_id = principal(context)?.tenant_id()?;
        let transaction = crate::db::begin_write(&app(context).db)
            .await
            .map_err(crate::error::ServiceError::from)?;
        let webhook = webhooks::delete_webhook(&transaction, tenant_id, id).await?;
        transaction
            .commit()
            .await
            .map_err(crate::error::ServiceError::from)?;
        Ok(webhook.into())
    }
}
