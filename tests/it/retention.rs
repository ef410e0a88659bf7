//! Retention: pruning removes the events and payloads of jobs finished before the
//! cutoff and nothing else — attempts, costs, charges and the ledger stay, the audit
//! stays clean and the dashboards' sums do not move — and `--retention-days` runs
//! the sweep by itself.

use crate::helpers::{AppOptions, Backend, TestApp, job_input, spawn_app};
use entity::{WebhookDeliveryStatus, attempts, job_events, webhook_deliveries, webhooks};
use jobledger::billing::audit;
use jobledger::jobs::retention::{self, Pruned};
use sea_orm::{ColumnTrait, ConnectionTrait, EntityTrait, PaginatorTrait, QueryFilter};
use serde_json::{Value, json};
use std::time::{Duration, Instant};
use uuid::Uuid;

on_both_backends!(pruning_keeps_the_books_and_drops_the_rest);

/// A webhook of the tenant with four deliveries: delivered and given up 30 days ago
/// (pruned at a 7-day retention), pending for 30 days and delivered today (kept).
/// Returns the ids of the two kept, oldest first.
async fn webhook_deliveries(app: &TestApp, tenant_id: Uuid) -> Vec<Uuid> {
    use sea_orm::ActiveValue::Set;
    let now = entity::Timestamp::now();
    let month_ago = now.plus(-chrono::Duration::days(30));
    let webhook = webhooks::ActiveModel {
        id: Set(Uuid::now_v7()),
        tenant_id: Set(tenant_id),
        url: Set("https://example.com/hook".into()),
        events: Set("job.succeeded".into()),
        secret: Set("whsec_c2VjcmV0".into()),
        created_at: Set(month_ago),
        deleted_at: Set(None),
    };
    let webhook = webhooks::Entity::insert(webhook)
        .exec_with_returning(&app.app.db)
        .await
        .unwrap();
    let mut kept = Vec::new();
    for (status, created_at) in [
        (WebhookDeliveryStatus::Delivered, month_ago),
        (WebhookDeliveryStatus::Failed, month_ago),
        (WebhookDeliveryStatus::Pending, month_ago),
        (WebhookDeliveryStatus::Delivered, now),
    ] {
        let id = Uuid::now_v7();
        if status == WebhookDeliveryStatus::Pending || created_at == now {
            kept.push(id);
        }
        let delivery = webhook_deliveries::ActiveModel {
            id: Set(id),
            tenant_id: Set(tenant_id),
            webhook_id: Set(webhook.id),
            event_type: Set(entity::WebhookEvent::JobSucceeded),
            payload: Set("{}".into()),
            status: Set(status),
            attempts: Set(1),
            next_attempt_at: Set(created_at),
            lease_until: Set(None),
            lease_token: Set(None),
            last_status_code: Set(None),
            last_error: Set(None),
            created_at: Set(created_at),
            delivered_at: Set(None),
        };
        webhook_deliveries::Entity::insert(delivery)
            .exec(&app.app.db)
            .await
            .unwrap();
    }
    kept
}

/// Moves a job's finish back by `age`, as if it had finished that long ago.
async fn age_finish(app: &TestApp, id: Uuid, age: Duration) {
    let backend = app.app.db.get_database_backend();
    let sql = if backend == sea_orm::DbBackend::Postgres {
        "UPDATE jobs SET finished_at = finished_at - $1 WHERE id = $2"
    } else {
        "UPDATE jobs SET finished_at = finished_at - ? WHERE id = ?"
    };
    app.app
        .db
        .execute_raw(sea_orm::Statement::from_sql_and_values(
            backend,
            sql,
            [(age.as_micros() as i64).into(), id.into()],
        ))
        .await
        .unwrap();
}

/// The job with the fields retention changes, and everything dashboards read.
async fn job(app: &TestApp, tenant_key: &str, id: Uuid) -> Value {
    let response = app
        .graphql(
            Some(tenant_key),
            "query($id: UUID!) { job(id: $id) { status input result payloadsPrunedAt
               attempts { number outcome inputTokens outputTokens providerCost }
               cost { providerCost customerCharge margin }
               charge { amount } reservation { amount status settledAmount releasedAmount }
               events { seq kind } } }",
            json!({"id": id}),
        )
        .await;
    assert!(response["errors"].is_null(), "{response}");
    response["data"]["job"].clone()
}

/// The dashboards' sums: the billing summary and the per-job costs.
async fn dashboards(app: &TestApp, tenant_key: &str) -> (Value, Value) {
    let window = json!({"from": "2000-01-01T00:00:00Z", "to": "2999-01-01T00:00:00Z"});
    let summary = app
        .operation(Some(tenant_key), "BillingSummary", window)
        .await;
    assert!(summary["errors"].is_null(), "{summary}");
    let costs = app
        .operation(Some(tenant_key), "JobCosts", json!({"first": 50}))
        .await;
    assert!(costs["errors"].is_null(), "{costs}");
    (summary["data"].clone(), costs["data"].clone())
}

async fn non_terminal_events(app: &TestApp, ids: &[Uuid]) -> u64 {
    job_events::Entity::find()
        .filter(job_events::Column::JobId.is_in(ids.iter().copied()))
        .filter(job_events::Column::Kind.is_not_in([
            entity::EventKind::Succeeded,
            entity::EventKind::Failed,
            entity::EventKind::Cancelled,
        ]))
        .count(&app.app.db)
        .await
        .unwrap()
}

const DAY: Duration = Duration::from_secs(24 * 60 * 60);

async fn pruning_keeps_the_books_and_drops_the_rest(backend: Backend) {
    let app = spawn_app(backend).await;
    let tenant = app.funded_tenant("keeps-books", "10").await;
    let old_success = app
        .create_job_ok(&tenant, job_input("old-success", "long ago"))
        .await;
    let old_failure = app
        .create_job_ok(&tenant, job_input("old-failure", "nope [mock:status=400]"))
        .await;
    let recent = app
        .create_job_ok(&tenant, job_input("recent", "just now"))
        .await;
    for id in [old_success, old_failure, recent] {
        app.wait_until_finished(&tenant, id, Duration::from_secs(20))
            .await;
    }
    for id in [old_success, old_failure] {
        age_finish(&app, id, 10 * DAY).await;
    }
    let recent_before = job(&app, &tenant.key, recent).await;
    let old_before = job(&app, &tenant.key, old_success).await;
    assert_eq!(old_before["input"]["messages"][0]["content"], "long ago");
    assert!(old_before["result"].is_string());
    let dashboards_before = dashboards(&app, &tenant.key).await;
    let attempts_before = attempts::Entity::find().all(&app.app.db).await.unwrap();
    let events_to_prune = non_terminal_events(&app, &[old_success, old_failure]).await;
    assert!(events_to_prune >= 4, "created and started, for each");

    let cutoff = entity::Timestamp::now().plus(-chrono::Duration::days(7));
    let kept_deliveries = webhook_deliveries(&app, tenant.id).await;
    let pruned = retention::prune(&app.app.db, cutoff).await.unwrap();
    assert_eq!(
        pruned,
        Pruned {
            jobs: 2,
            events: events_to_prune,
            deliveries: 2,
        }
    );
    let mut left: Vec<Uuid> = webhook_deliveries::Entity::find()
        .all(&app.app.db)
        .await
        .unwrap()
        .into_iter()
        .map(|delivery| delivery.id)
        .collect();
    left.sort();
    assert_eq!(left, kept_deliveries, "pending and recent deliveries stay");
    assert_eq!(
        retention::prune(&app.app.db, cutoff).await.unwrap(),
        Pruned::default(),
        "a second sweep finds nothing"
    );

    for (id, terminal) in [(old_success, "SUCCEEDED"), (old_failure, "FAILED")] {
        let after = job(&app, &tenant.key, id).await;
        assert_eq!(after["input"], json!({}), "{after}");
        assert!(after["result"].is_null(), "{after}");
        assert!(after["payloadsPrunedAt"].is_string(), "{after}");
        assert_eq!(after["status"], terminal);
        let kinds: Vec<&str> = after["events"]
            .as_array()
            .unwrap()
            .iter()
            .map(|event| event["kind"].as_str().unwrap())
            .collect();
        assert_eq!(kinds, [terminal], "only the terminal event is kept");
    }
    let old_after = job(&app, &tenant.key, old_success).await;
    for field in ["attempts", "cost", "charge", "reservation", "status"] {
        assert_eq!(old_after[field], old_before[field], "{field}");
    }
    // The recent job keeps everything.
    assert_eq!(job(&app, &tenant.key, recent).await, recent_before);
    // The books: attempts untouched, dashboards' sums unchanged, audit clean.
    assert_eq!(
        attempts::Entity::find().all(&app.app.db).await.unwrap(),
        attempts_before
    );
    assert_eq!(dashboards(&app, &tenant.key).await, dashboards_before);
    let report = audit::audit_snapshot(&app.app.db).await.unwrap();
    assert!(report.is_clean(), "{report}");

    // Subscribing to a pruned job replays its terminal event and ends.
    let updates = app
        .subscribe(
            &tenant.key,
            "subscription($jobId: UUID!) { jobUpdates(jobId: $jobId) { kind } }",
            json!({"jobId": old_success}),
            Duration::from_secs(5),
        )
        .await
        .unwrap();
    assert_eq!(
        updates,
        [json!({"data": {"jobUpdates": {"kind": "SUCCEEDED"}}})]
    );

    // With `--retention-days 1`, a sweep soon after start prunes a job finished two
    // days ago by itself.
    age_finish(&app, recent, 2 * DAY).await;
    let mut options = AppOptions::default();
    options.operations.retention = Some(DAY);
    let app = app.restart(options).await;
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let now = job(&app, &tenant.key, recent).await;
        if now["payloadsPrunedAt"].is_string() {
            assert_eq!(now["input"], json!({}));
            assert_eq!(now["cost"], recent_before["cost"]);
            break;
        }
        assert!(Instant::now() < deadline, "the sweep never pruned: {now}");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    assert_eq!(dashboards(&app, &tenant.key).await, dashboards_before);
    let report = audit::audit_snapshot(&app.app.db).await.unwrap();
    assert!(report.is_clean(), "{report}");
}
