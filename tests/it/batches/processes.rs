//! Batches against the release-shaped binary: an API process killed between chunks
//! loses no acknowledged chunk, and the results stream of 100,000 items leaves the
//! server's memory flat.

use super::items;
use crate::helpers::{Backend, TestDatabase};
use crate::invariants::assert_billing_invariants;
use crate::processes::ServeProcess;
use futures_util::StreamExt;
use sea_orm::ConnectionTrait;
use serde_json::{Value, json};
use std::time::Duration;

on_both_backends!(
    a_sigkill_between_chunks_loses_no_acknowledged_chunk,
    streaming_100000_results_keeps_the_servers_memory_flat,
);

async fn serve(url: &str) -> ServeProcess {
    ServeProcess::start_with(url, &["--workers", "0"], &[]).await
}

async fn add(serve: &ServeProcess, key: &str, batch: &Value, chunk: &[Value]) -> Value {
    serve
        .graphql(
            key,
            &crate::contract::operation("AddBatchItems"),
            json!({"batchId": batch, "items": chunk}),
        )
        .await
}

async fn create(serve: &ServeProcess, key: &str) -> Value {
    let created = serve
        .graphql(
            key,
            &crate::contract::operation("CreateBatch"),
            json!({"input": {"idempotencyKey": "upload", "model": "gpt-4o-mini", "maxOutputTokens": 20}}),
        )
        .await;
    assert!(created["errors"].is_null(), "{created}");
    created["data"]["createBatch"]["batch"]["id"].clone()
}

async fn item_count(serve: &ServeProcess, key: &str, batch: &Value) -> i64 {
    let read = serve
        .graphql(
            key,
            &crate::contract::operation("Batch"),
            json!({"id": batch}),
        )
        .await;
    read["data"]["batch"]["itemCount"]
        .as_i64()
        .unwrap_or_else(|| panic!("{read}"))
}

async fn a_sigkill_between_chunks_loses_no_acknowledged_chunk(backend: Backend) {
    let database = TestDatabase::create(&backend).await;
    let first = serve(&database.url).await;
    let (_, key) = first.funded_tenant("100").await;
    let batch = create(&first, &key).await;
    let chunks = [items("a", 0, 500), items("b", 0, 500), items("c", 0, 1_000)];
    for chunk in &chunks[..2] {
        let response = add(&first, &key, &batch, chunk).await;
        assert_eq!(
            response["data"]["addBatchItems"]["added"], 500,
            "{response}"
        );
    }
    // The third chunk is in flight when the process dies: it lands whole or not at all.
    let in_flight = {
        let client = reqwest::Client::new();
        let address = first.address();
        let body = json!({
            "query": crate::contract::operation("AddBatchItems"),
            "variables": {"batchId": batch, "items": chunks[2]},
        });
        let key = key.clone();
        tokio::spawn(async move {
            client
                .post(format!("http://{address}/graphql"))
                .bearer_auth(key)
                .json(&body)
                .send()
                .await
        })
    };
    tokio::time::sleep(Duration::from_millis(30)).await;
    drop(first); // SIGKILL
    let _ = in_flight.await;
    let second = serve(&database.url).await;
    let count = item_count(&second, &key, &batch).await;
    assert!(
        count == 1_000 || count == 2_000,
        "a chunk landed in part: {count}"
    );
    // The client sends what it did not see acknowledged again, and everything again.
    for chunk in &chunks {
        let response = add(&second, &key, &batch, chunk).await;
        assert!(response["errors"].is_null(), "{response}");
    }
    assert_eq!(item_count(&second, &key, &batch).await, 2_000);
    let db = jobledger::db::connect(&database.url).await.unwrap();
    assert_billing_invariants(&db).await;
}

async fn streaming_100000_results_keeps_the_servers_memory_flat(backend: Backend) {
    let database = TestDatabase::create(&backend).await;
    let server = serve(&database.url).await;
    let (_, key) = server.funded_tenant("1000").await;
    let batch = create(&server, &key).await;
    let response = add(&server, &key, &batch, &items("d", 0, 1_000)).await;
    assert_eq!(
        response["data"]["addBatchItems"]["added"], 1_000,
        "{response}"
    );
    // 99 copies of those rows make 100,000 items, each with a result of 1 KB: 100 MB of
    // results, far more than a page. Only the jobs rows matter to the results, and
    // copying them costs a fraction of sending 99 more chunks through a debug build.
    // One connection: the copies' table is temporary, seen by its own session only.
    let db = jobledger::db::connect_sized(&database.url, 1)
        .await
        .unwrap();
    let result = serde_json::to_string(&"r".repeat(1_000)).unwrap();
    let new_id = match db.get_database_backend() {
        sea_orm::DbBackend::Postgres => "gen_random_uuid()",
        _ => "randomblob(16)",
    };
    db.execute_unprepared(&format!(
        "UPDATE jobs SET result = '{result}' WHERE batch_id IS NOT NULL"
    ))
    .await
    .unwrap();
    db.execute_unprepared(
        "CREATE TEMPORARY TABLE copies AS SELECT * FROM jobs WHERE batch_id IS NOT NULL",
    )
    .await
    .unwrap();
    for _ in 0..99 {
        for statement in [
            format!(
                "UPDATE copies SET id = {new_id}, custom_id = custom_id || '+', \
                 idempotency_key = idempotency_key || '+'"
            ),
            "INSERT INTO jobs SELECT * FROM copies".to_owned(),
        ] {
            db.execute_unprepared(&statement).await.unwrap();
        }
    }
    db.execute_unprepared("DROP TABLE copies").await.unwrap();
    let baseline = server.resident_bytes();
    let response = reqwest::Client::new()
        .get(format!(
            "http://{}/batches/{}/results",
            server.address(),
            batch.as_str().unwrap()
        ))
        .bearer_auth(&key)
        .send()
        .await
        .unwrap();
    assert_eq!(response.status().as_u16(), 200);
    let mut body = response.bytes_stream();
    let (mut bytes, mut lines, mut peak) = (0usize, 0usize, baseline);
    while let Some(chunk) = body.next().await {
        let chunk = chunk.unwrap();
        bytes += chunk.len();
        lines += chunk.iter().filter(|byte| **byte == b'\n').count();
        // Read slowly at times, so the server has to wait for this client.
        if lines % 20_000 < 50 {
            peak = peak.max(server.resident_bytes());
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
    peak = peak.max(server.resident_bytes());
    assert_eq!(lines, 100_000);
    assert!(bytes > 100_000_000, "{bytes} bytes");
    let grown = peak.saturating_sub(baseline);
    assert!(
        grown < 40 * 1024 * 1024,
        "the server grew by {} MB while streaming {} MB",
        grown / (1024 * 1024),
        bytes / (1024 * 1024)
    );
}
