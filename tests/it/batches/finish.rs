//! A batch's end as others hear of it: one `batch.finished` webhook with its counts and
//! charge, and progress followed from another process than the one running its items.

use super::{add_items, batch, create_batch, items, wait_until_finished};
use crate::helpers::{AppOptions, Backend, decimal, spawn_app_with};
use crate::webhooks::{Receiver, create_webhook};
use rust_decimal::Decimal;
use serde_json::{Value, json};
use std::time::Duration;

on_both_backends!(
    a_finished_batch_sends_one_webhook_with_its_counts_and_charge,
    batch_updates_follow_items_run_by_another_process,
);

async fn a_finished_batch_sends_one_webhook_with_its_counts_and_charge(backend: Backend) {
    let app = spawn_app_with(backend, AppOptions::default()).await;
    let tenant = app.funded_tenant("acme", "10").await;
    let receiver = Receiver::start(0, 500).await;
    let created = create_webhook(&app, &tenant, &receiver.url(), json!(["BATCH_FINISHED"])).await;
    assert!(created["errors"].is_null(), "{created}");
    let id = create_batch(&app, &tenant, "b").await;
    let mut chunk = items("d", 0, 20);
    // Two items fail for good: the counts tell them apart.
    for item in &mut chunk[..2] {
        item["messages"][0]["content"] = json!("bad request [mock:status=400]");
    }
    assert!(add_items(&app, &tenant, id, &chunk).await["errors"].is_null());
    let closed = app
        .operation(Some(&tenant.key), "CloseBatch", json!({"id": id}))
        .await;
    assert!(closed["errors"].is_null(), "{closed}");
    let finished = wait_until_finished(&app, &tenant, id, Duration::from_secs(60)).await;
    let received = receiver.wait_for(1, Duration::from_secs(30)).await;
    // Nothing else comes: a batch finishes once.
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert_eq!(receiver.received().len(), 1);
    let body: Value = serde_json::from_str(&received[0].body).unwrap();
    assert_eq!(body["type"], "batch.finished");
    assert_eq!(body["data"]["batchId"], id.to_string());
    assert_eq!(
        body["data"]["counts"],
        json!({"queued": 0, "running": 0, "succeeded": 18, "failed": 2, "cancelled": 0})
    );
    assert_eq!(
        decimal(&body["data"]["customerCharge"]),
        decimal(&finished["customerCharge"])
    );
    assert!(decimal(&finished["customerCharge"]) > Decimal::ZERO);
}

async fn batch_updates_follow_items_run_by_another_process(backend: Backend) {
    // This process serves the subscription and runs nothing; the other runs the items.
    let app = spawn_app_with(backend, AppOptions::no_workers()).await;
    let runner = app.another_process(AppOptions::default()).await;
    let tenant = app.funded_tenant("acme", "10").await;
    let id = create_batch(&app, &tenant, "b").await;
    let query = crate::contract::operation("BatchUpdates");
    let watcher = app.subscribe(
        &tenant.key,
        &query,
        json!({"id": id}),
        Duration::from_secs(60),
    );
    let feeder = async {
        tokio::time::sleep(Duration::from_millis(300)).await;
        assert!(add_items(&app, &tenant, id, &items("d", 0, 50)).await["errors"].is_null());
        let closed = app
            .operation(Some(&tenant.key), "CloseBatch", json!({"id": id}))
            .await;
        assert!(closed["errors"].is_null(), "{closed}");
    };
    let (updates, ()) = tokio::join!(watcher, feeder);
    let updates = updates.expect("the subscription completes");
    let last = &updates.last().unwrap()["data"]["batchUpdates"];
    assert_eq!(last["status"], "FINISHED", "{updates:?}");
    assert_eq!(last["counts"]["succeeded"], 50);
    assert_eq!(
        decimal(&last["customerCharge"]),
        decimal(&batch(&app, &tenant, id).await["customerCharge"])
    );
    drop(runner);
}
