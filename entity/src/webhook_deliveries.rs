//! The webhook outbox: one row per event and endpoint, written in the transaction of
//! the fact it reports, delivered later with retries.

use crate::{Timestamp, WebhookDeliveryStatus, WebhookEvent};
use sea_orm::entity::prelude::*;

#[derive(Clone, Debug, PartialEq, Eq, DeriveEntityModel)]
#[sea_orm(table_name = "webhook_deliveries")]
pub struct Model {
    /// Also the `webhook-id` header, the same on every retry.
    #[sea_orm(primary_key, auto_increment = false)]
    pub id: Uuid,
    pub tenant_id: Uuid,
    pub webhook_id: Uuid,
    /// `job.succeeded`, `balance.low`, …
    pub event_type: WebhookEvent,
    /// The exact JSON body sent (and signed) on every try.
    pub payload: String,
    pub status: WebhookDeliveryStatus,
    /// Tries made so far.
    pub attempts: i32,
    pub next_attempt_at: Timestamp,
    /// While a dispatcher sends it: no other claims it before this instant.
    pub lease_until: Option<Timestamp>,
    /// Which claim holds the lease: only it may record the outcome.
    pub lease_token: Option<Uuid>,
    pub last_status_code: Option<i32>,
    /// A short excerpt of the last failure (response body or transport error).
    pub last_error: Option<String>,
    pub created_at: Timestamp,
    pub delivered_at: Option<Timestamp>,
}

#[derive(Copy, Clone, Debug, EnumIter, DeriveRelation)]
pub enum Relation {}

impl ActiveModelBehavior for ActiveModel {}
