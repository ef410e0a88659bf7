//! The outbox: webhook deliveries written in the caller's transaction, one row per
//! event and subscribed endpoint, so a delivery exists exactly when the fact it reports
//! was committed. Whatever records a fact (a job's end, a balance alert, a batch's
//! end) writes here; the webhooks dispatcher sends what is here.

use entity::Credits;
use entity::{
    Timestamp, WebhookDeliveryStatus, WebhookEvent, job_labels, jobs, webhook_deliveries, webhooks,
};
use sea_orm::{ActiveValue::Set, ColumnTrait, ConnectionTrait, DbErr, EntityTrait, QueryFilter};
use serde_json::{Map, Value, json};
use std::collections::{HashMap, HashSet};
use uuid::Uuid;

/// The event types an endpoint receives.
pub fn events_of(webhook: &webhooks::Model) -> Vec<WebhookEvent> {
    webhook
        .events
        .split(',')
        .filter_map(WebhookEvent::parse)
        .collect()
}

/// Queues `event` with `data` for every live endpoint of the tenant that subscribed
/// to it. Run it in the transaction that records the fact.
pub async fn enqueue(
    db: &impl ConnectionTrait,
    tenant_id: Uuid,
    event: WebhookEvent,
    data: Value,
) -> Result<(), DbErr> {
    enqueue_many(db, vec![(tenant_id, event, data)]).await
}

/// Most deliveries one multi-row insert carries: far below SQLite's bound on
/// parameters.
const INSERT_CHUNK: usize = 500;

/// [`enqueue`] for several events, with one read of the endpoints of every tenant
/// concerned and one insert of the deliveries.
async fn enqueue_many(
    db: &impl ConnectionTrait,
    events: Vec<(Uuid, WebhookEvent, Value)>,
) -> Result<(), DbErr> {
    let endpoints = live_endpoints(db, events.iter().map(|(tenant_id, ..)| *tenant_id)).await?;
    insert_deliveries(db, &endpoints, events).await
}

/// The live endpoints of `tenants`, in one read.
async fn live_endpoints(
    db: &impl ConnectionTrait,
    tenants: impl Iterator<Item = Uuid>,
) -> Result<Vec<webhooks::Model>, DbErr> {
    let tenants: HashSet<Uuid> = tenants.collect();
    if tenants.is_empty() {
        return Ok(Vec::new());
    }
    webhooks::Entity::find()
        .filter(webhooks::Column::TenantId.is_in(tenants))
        .filter(webhooks::Column::DeletedAt.is_null())
        .all(db)
        .await
}

/// One delivery of each event to each of `endpoints` of its tenant that subscribed to
/// it, in one insert per chunk.
async fn insert_deliveries(
    db: &impl ConnectionTrait,
    endpoints: &[webhooks::Model],
    events: Vec<(Uuid, WebhookEvent, Value)>,
) -> Result<(), DbErr> {
    if endpoints.is_empty() || events.is_empty() {
        return Ok(());
    }
    let now = Timestamp::now();
    let mut rows = Vec::new();
    for (tenant_id, event, data) in events {
        let body = json!({
            "type": event.as_str(),
            "timestamp": now.to_datetime().to_rfc3339_opts(chrono::SecondsFormat::Millis, true),
            "data": data,
        })
        .to_string();
        rows.extend(
            endpoints
                .iter()
                .filter(|endpoint| {
                    endpoint.tenant_id == tenant_id && events_of(endpoint).contains(&event)
                })
                .map(|endpoint| webhook_deliveries::ActiveModel {
                    id: Set(Uuid::now_v7()),
                    tenant_id: Set(tenant_id),
                    webhook_id: Set(endpoint.id),
                    event_type: Set(event),
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
                }),
        );
    }
    for chunk in rows.chunks(INSERT_CHUNK) {
        webhook_deliveries::Entity::insert_many(chunk.to_vec())
            .exec(db)
            .await?;
    }
    Ok(())
}

/// Queues `job.succeeded`, `job.failed` or `job.cancelled` for each job that has just
/// become terminal, with what its customer was charged and what the client gave it to
/// recognise it by (idempotency key, labels, metadata). Each job is the row after its
/// terminal update; call it in that update's transaction. Jobs in any other status
/// queue nothing.
pub async fn enqueue_jobs_finished(
    db: &impl ConnectionTrait,
    finished: &[(&jobs::Model, Credits)],
) -> Result<(), DbErr> {
    // One read of the endpoints serves the deliveries too. Labels and metadata take
    // two more: skipped unless some endpoint of these tenants listens, as for most
    // finishes of most tenants.
    let endpoints = live_endpoints(db, finished.iter().map(|(job, _)| job.tenant_id)).await?;
    if endpoints.is_empty() {
        return Ok(());
    }
    let ids: Vec<Uuid> = finished.iter().map(|(job, _)| job.id).collect();
    // The rows of the terminal update: no tenant to scope them to.
    let mut metadata = crate::db::json::job_metadata(db, None, &ids).await?;
    let mut labels: HashMap<Uuid, Map<String, Value>> = HashMap::new();
    for label in job_labels::Entity::find()
        .filter(job_labels::Column::JobId.is_in(ids.iter().copied()))
        .all(db)
        .await?
    {
        labels
            .entry(label.job_id)
            .or_default()
            .insert(label.key, Value::String(label.value));
    }
    let events = finished
        .iter()
        .filter_map(|(job, customer_charge)| {
            let event = WebhookEvent::of_job_end(job.status)?;
            let status = job.status.api_name();
            let data = json!({
                "jobId": job.id,
                "status": status,
                "model": job.own_model(),
                "customerCharge": customer_charge.to_string(),
                "errorCode": job.error_code,
                "idempotencyKey": job.idempotency_key,
                "labels": labels.remove(&job.id).unwrap_or_default(),
                "metadata": metadata.remove(&job.id),
            });
            Some((job.tenant_id, event, data))
        })
        .collect();
    insert_deliveries(db, &endpoints, events).await
}

/// Queues `batch.finished` for a batch that has just finished, with its counts and
/// charge. `batch` is the row as its finishing update left it; call it in that
/// update's transaction.
pub async fn enqueue_batch_finished(
    db: &impl ConnectionTrait,
    batch: &entity::batches::Model,
) -> Result<(), DbErr> {
    let data = json!({
        "batchId": batch.id,
        "name": batch.name,
        "status": "FINISHED",
        "itemCount": batch.item_count,
        "counts": {
            "queued": 0,
            "running": 0,
            "succeeded": batch.succeeded,
            "failed": batch.failed,
            "cancelled": batch.cancelled,
        },
        "customerCharge": Credits::from_nanos(batch.customer_charge_nanos).to_string(),
    });
    enqueue(db, batch.tenant_id, WebhookEvent::BatchFinished, data).await
}
