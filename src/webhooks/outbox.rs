//! Writing deliveries: one row per event and subscribed endpoint, in the caller's
//! transaction, so a delivery exists exactly when the fact it reports was committed.

use super::EventType;
use crate::billing::Credits;
use entity::{JobStatus, Timestamp, WebhookDeliveryStatus, jobs, webhook_deliveries, webhooks};
use sea_orm::{ActiveValue::Set, ColumnTrait, ConnectionTrait, DbErr, EntityTrait, QueryFilter};
use serde_json::{Value, json};
use uuid::Uuid;

/// Queues `event` with `data` for every live endpoint of the tenant that subscribed
/// to it. Run it in the transaction that records the fact.
pub async fn enqueue(
    db: &impl ConnectionTrait,
    tenant_id: Uuid,
    event: EventType,
    data: Value,
) -> Result<(), DbErr> {
    let endpoints = webhooks::Entity::find()
        .filter(webhooks::Column::TenantId.eq(tenant_id))
        .filter(webhooks::Column::DeletedAt.is_null())
        .all(db)
        .await?;
    let now = Timestamp::now();
    let body = json!({
        "type": event.as_str(),
        "timestamp": now.to_datetime().to_rfc3339_opts(chrono::SecondsFormat::Millis, true),
        "data": data,
    })
    .to_string();
    let rows: Vec<_> = endpoints
        .iter()
        .filter(|endpoint| super::events_of(endpoint).contains(&event))
        .map(|endpoint| webhook_deliveries::ActiveModel {
            id: Set(Uuid::now_v7()),
            tenant_id: Set(tenant_id),
            webhook_id: Set(endpoint.id),
            event_type: Set(event.as_str().to_owned()),
            payload: Set(body.clone()),
            status: Set(WebhookDeliveryStatus::Pending),
            attempts: Set(0),
            next_attempt_at: Set(now),
            lease_until: Set(None),
            lease_token: Set(None),
            last_status_code: Set(None),
            last_error: Set(None),
            created_at: Set(now),
            delivered_at: Set(None),
        })
        .collect();
    if !rows.is_empty() {
        webhook_deliveries::Entity::insert_many(rows)
            .exec(db)
            .await?;
    }
    Ok(())
}

/// Queues `job.succeeded`, `job.failed` or `job.cancelled` for a job that has just
/// become terminal, with what its customer was charged. `job` is the row after its
/// terminal update; call it in that update's transaction. Jobs in any other status
/// queue nothing.
pub async fn enqueue_job_finished(
    db: &impl ConnectionTrait,
    job: &jobs::Model,
    customer_charge: Credits,
) -> Result<(), DbErr> {
    let (event, status) = match job.status {
        JobStatus::Succeeded => (EventType::JobSucceeded, "SUCCEEDED"),
        JobStatus::Failed => (EventType::JobFailed, "FAILED"),
        JobStatus::Cancelled => (EventType::JobCancelled, "CANCELLED"),
        JobStatus::Queued | JobStatus::Running => return Ok(()),
    };
    let data = json!({
        "jobId": job.id,
        "status": status,
        "model": job.model,
        "customerCharge": customer_charge.to_string(),
        "errorCode": job.error_code,
    });
    enqueue(db, job.tenant_id, event, data).await
}
