//! Batches: one handle for many jobs — items in chunks, all or nothing, idempotent by
//! customId; counts and money on the batch row equal to its items at every moment;
//! progress, results, cancel and isolation between tenants.

mod audit;
mod chunks;
mod finish;
mod lifecycle;
mod processes;

use crate::helpers::{TestApp, TestTenant};
use serde_json::{Value, json};
use std::time::{Duration, Instant};
use uuid::Uuid;

/// `CreateBatch` of the simulator's model that must succeed; returns the batch id.
pub async fn create_batch(app: &TestApp, tenant: &TestTenant, key: &str) -> Uuid {
    let response = app
        .operation(
            Some(&tenant.key),
            "CreateBatch",
            json!({"input": {"idempotencyKey": key, "name": key, "model": "gpt-4o-mini", "maxOutputTokens": 50}}),
        )
        .await;
    assert!(response["errors"].is_null(), "{response}");
    response["data"]["createBatch"]["batch"]["id"]
        .as_str()
        .unwrap()
        .parse()
        .unwrap()
}

/// `count` items named `{prefix}{n}` from `start`, each with its own document.
pub fn items(prefix: &str, start: usize, count: usize) -> Vec<Value> {
    (start..start + count)
        .map(|n| {
            json!({
                "customId": format!("{prefix}{n}"),
                "messages": [{"role": "user", "content": format!("document {prefix}{n}: summarise it")}],
            })
        })
        .collect()
}

/// `AddBatchItems`, the whole response.
pub async fn add_items(app: &TestApp, tenant: &TestTenant, batch: Uuid, items: &[Value]) -> Value {
    app.operation(
        Some(&tenant.key),
        "AddBatchItems",
        json!({"batchId": batch, "items": items}),
    )
    .await
}

/// The contract's `Batch` query, `data.batch`.
pub async fn batch(app: &TestApp, tenant: &TestTenant, id: Uuid) -> Value {
    let response = app
        .operation(Some(&tenant.key), "Batch", json!({"id": id}))
        .await;
    assert!(response["errors"].is_null(), "{response}");
    response["data"]["batch"].clone()
}

/// Polls the batch until it is FINISHED (bounded by `limit`).
pub async fn wait_until_finished(
    app: &TestApp,
    tenant: &TestTenant,
    id: Uuid,
    limit: Duration,
) -> Value {
    let deadline = Instant::now() + limit;
    loop {
        let batch = batch(app, tenant, id).await;
        if batch["status"] == "FINISHED" {
            return batch;
        }
        assert!(Instant::now() < deadline, "batch never finished: {batch}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Every item of the batch through `BatchJobs`, in order.
pub async fn all_items(app: &TestApp, tenant: &TestTenant, id: Uuid) -> Vec<Value> {
    let mut items = Vec::new();
    let mut after: Option<String> = None;
    loop {
        let response = app
            .operation(
                Some(&tenant.key),
                "BatchJobs",
                json!({"id": id, "first": 100, "after": after}),
            )
            .await;
        assert!(response["errors"].is_null(), "{response}");
        let page = &response["data"]["batch"]["jobs"];
        items.extend(
            page["edges"]
                .as_array()
                .unwrap()
                .iter()
                .map(|edge| edge["node"].clone()),
        );
        if page["pageInfo"]["hasNextPage"] != true {
            return items;
        }
        after = page["pageInfo"]["endCursor"].as_str().map(str::to_owned);
    }
}

/// The results file, parsed line by line.
pub async fn results(app: &TestApp, key: &str, id: Uuid) -> (u16, Vec<Value>) {
    let response = app
        .http
        .get(format!("http://{}/batches/{id}/results", app.address))
        .bearer_auth(key)
        .send()
        .await
        .unwrap();
    let status = response.status().as_u16();
    let body = response.text().await.unwrap();
    if status != 200 {
        return (status, Vec::new());
    }
    let lines = body
        .lines()
        .map(|line| serde_json::from_str(line).unwrap())
        .collect();
    (status, lines)
}
