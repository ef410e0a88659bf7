//! Adding items: all or nothing per chunk, idempotent by customId, refused once closed.

use super::{add_items, batch, create_batch, items};
use crate::helpers::{
    ADMIN_TOKEN, AppOptions, Backend, decimal, error_code, job_input, spawn_app_with,
};
use crate::invariants::assert_billing_invariants;
use serde_json::json;

on_both_backends!(
    a_chunk_that_does_not_fit_adds_nothing,
    a_changed_item_is_a_conflict_for_the_whole_call,
    a_closed_batch_refuses_items,
    a_spend_cap_refuses_the_whole_chunk,
    create_batch_is_idempotent_and_refuses_what_it_cannot_honour,
    overlapping_chunks_in_other_orders_all_land_once,
    a_job_cannot_take_the_key_of_an_item,
);

async fn a_chunk_that_does_not_fit_adds_nothing(backend: Backend) {
    let app = spawn_app_with(backend, AppOptions::no_workers()).await;
    // One item holds about 0.00015 (three calls at most): 10 fit, 1,000 do not.
    let tenant = app.funded_tenant("acme", "0.01").await;
    let id = create_batch(&app, &tenant, "b").await;
    let before = app.balance(&tenant).await;
    let response = add_items(&app, &tenant, id, &items("doc-", 0, 1_000)).await;
    assert_eq!(error_code(&response), "INSUFFICIENT_CREDITS", "{response}");
    assert_eq!(
        app.balance(&tenant).await,
        before,
        "a refused chunk holds nothing"
    );
    let read = batch(&app, &tenant, id).await;
    assert_eq!(read["itemCount"], 0);
    assert_eq!(decimal(&read["reserved"]), decimal(&json!("0")));
    let jobs = app
        .operation(Some(&tenant.key), "Jobs", json!({"first": 10}))
        .await;
    assert_eq!(jobs["data"]["jobs"]["edges"], json!([]), "{jobs}");
    // What fits is added whole.
    let response = add_items(&app, &tenant, id, &items("doc-", 0, 10)).await;
    assert!(response["errors"].is_null(), "{response}");
    assert_eq!(response["data"]["addBatchItems"]["added"], 10);
    assert_billing_invariants(&app.app.db).await;
}

async fn a_changed_item_is_a_conflict_for_the_whole_call(backend: Backend) {
    let app = spawn_app_with(backend, AppOptions::no_workers()).await;
    let tenant = app.funded_tenant("acme", "10").await;
    let id = create_batch(&app, &tenant, "b").await;
    let first = items("doc-", 0, 5);
    let response = add_items(&app, &tenant, id, &first).await;
    assert_eq!(response["data"]["addBatchItems"]["added"], 5, "{response}");
    // The same chunk again: nothing added, all replayed.
    let again = add_items(&app, &tenant, id, &first).await;
    assert_eq!(again["data"]["addBatchItems"]["added"], 0, "{again}");
    assert_eq!(again["data"]["addBatchItems"]["replayed"], 5);
    // Three new items and one changed one: the whole call is refused.
    let mut changed = items("doc-", 3, 4);
    changed[0]["messages"][0]["content"] = json!("another document");
    let balance = app.balance(&tenant).await;
    let response = add_items(&app, &tenant, id, &changed).await;
    assert_eq!(error_code(&response), "IDEMPOTENCY_CONFLICT", "{response}");
    assert_eq!(app.balance(&tenant).await, balance);
    assert_eq!(batch(&app, &tenant, id).await["itemCount"], 5);
    // One item twice in a call, with one input: added once, the repetition replayed.
    let mut doubled = items("pair-", 0, 1);
    doubled.push(doubled[0].clone());
    let response = add_items(&app, &tenant, id, &doubled).await;
    assert_eq!(response["data"]["addBatchItems"]["added"], 1, "{response}");
    assert_eq!(
        response["data"]["addBatchItems"]["replayed"], 1,
        "{response}"
    );
    // Within one call too: one customId with two inputs.
    let mut twice = items("new-", 0, 2);
    twice[1]["customId"] = json!("new-0");
    let response = add_items(&app, &tenant, id, &twice).await;
    assert_eq!(error_code(&response), "IDEMPOTENCY_CONFLICT", "{response}");
    assert_eq!(batch(&app, &tenant, id).await["itemCount"], 6);
    assert_billing_invariants(&app.app.db).await;
}

async fn a_closed_batch_refuses_items(backend: Backend) {
    let app = spawn_app_with(backend, AppOptions::no_workers()).await;
    let tenant = app.funded_tenant("acme", "10").await;
    let id = create_batch(&app, &tenant, "b").await;
    assert!(add_items(&app, &tenant, id, &items("a", 0, 3)).await["errors"].is_null());
    let closed = app
        .operation(Some(&tenant.key), "CloseBatch", json!({"id": id}))
        .await;
    assert_eq!(closed["data"]["closeBatch"]["status"], "CLOSED", "{closed}");
    let balance = app.balance(&tenant).await;
    let response = add_items(&app, &tenant, id, &items("b", 0, 3)).await;
    assert_eq!(error_code(&response), "VALIDATION", "{response}");
    assert_eq!(app.balance(&tenant).await, balance);
    assert_eq!(batch(&app, &tenant, id).await["itemCount"], 3);
    // An empty batch closes straight to FINISHED, with its webhook-worthy end.
    let empty = create_batch(&app, &tenant, "empty").await;
    let closed = app
        .operation(Some(&tenant.key), "CloseBatch", json!({"id": empty}))
        .await;
    assert_eq!(
        closed["data"]["closeBatch"]["status"], "FINISHED",
        "{closed}"
    );
    assert_billing_invariants(&app.app.db).await;
}

async fn a_spend_cap_refuses_the_whole_chunk(backend: Backend) {
    let app = spawn_app_with(backend, AppOptions::no_workers()).await;
    let tenant = app.funded_tenant("acme", "10").await;
    let set = app
        .operation(
            Some(ADMIN_TOKEN),
            "SetTenantLimits",
            json!({"input": {"tenantId": tenant.id, "dailySpendLimit": "0.0001"}}),
        )
        .await;
    assert!(set["errors"].is_null(), "{set}");
    let id = create_batch(&app, &tenant, "b").await;
    let before = app.balance(&tenant).await;
    let response = add_items(&app, &tenant, id, &items("doc-", 0, 1_000)).await;
    assert_eq!(error_code(&response), "SPEND_LIMIT_EXCEEDED", "{response}");
    assert_eq!(app.balance(&tenant).await, before);
    assert_eq!(batch(&app, &tenant, id).await["itemCount"], 0);
    assert_billing_invariants(&app.app.db).await;
}

async fn create_batch_is_idempotent_and_refuses_what_it_cannot_honour(backend: Backend) {
    let app = spawn_app_with(backend, AppOptions::no_workers()).await;
    let tenant = app.funded_tenant("acme", "10").await;
    let input =
        json!({"idempotencyKey": "k", "name": "n", "model": "gpt-4o-mini", "maxOutputTokens": 50});
    let create = |input: serde_json::Value| {
        let app = &app;
        let key = tenant.key.clone();
        async move {
            app.operation(Some(&key), "CreateBatch", json!({"input": input}))
                .await
        }
    };
    let first = create(input.clone()).await;
    assert_eq!(first["data"]["createBatch"]["replayed"], false, "{first}");
    let again = create(input.clone()).await;
    assert_eq!(again["data"]["createBatch"]["replayed"], true, "{again}");
    assert_eq!(
        again["data"]["createBatch"]["batch"]["id"],
        first["data"]["createBatch"]["batch"]["id"]
    );
    let mut other = input.clone();
    other["maxOutputTokens"] = json!(60);
    assert_eq!(error_code(&create(other).await), "IDEMPOTENCY_CONFLICT");
    for (field, value) in [
        ("deadline", json!("2020-01-01T00:00:00Z")),
        ("model", json!("no-such-model")),
        ("maxOutputTokens", json!(0)),
        ("responseSchema", json!({"type": 12})),
    ] {
        let mut refused = input.clone();
        refused["idempotencyKey"] = json!(format!("k-{field}"));
        refused[field] = value;
        assert_eq!(error_code(&create(refused).await), "VALIDATION", "{field}");
    }
    let listed = app
        .operation(Some(&tenant.key), "Batches", json!({"first": 10}))
        .await;
    assert_eq!(
        listed["data"]["batches"]["edges"].as_array().unwrap().len(),
        1,
        "{listed}"
    );
}

async fn overlapping_chunks_in_other_orders_all_land_once(backend: Backend) {
    let app = spawn_app_with(backend, AppOptions::no_workers()).await;
    let tenant = app.funded_tenant("acme", "100").await;
    for round in 0..3 {
        let id = create_batch(&app, &tenant, &format!("b{round}")).await;
        // A client re-sends a timed-out chunk with its items in another order, and one
        // more, while the first is still being written.
        let forward = items("d", 0, 1_000);
        let mut backward: Vec<_> = forward[1..].iter().rev().cloned().collect();
        backward.push(items("d", 5_000, 1).remove(0));
        let (first, second) = tokio::join!(
            add_items(&app, &tenant, id, &forward),
            add_items(&app, &tenant, id, &backward)
        );
        for response in [&first, &second] {
            assert!(response["errors"].is_null(), "{response}");
        }
        let added = first["data"]["addBatchItems"]["added"].as_i64().unwrap()
            + second["data"]["addBatchItems"]["added"].as_i64().unwrap();
        assert_eq!(added, 1_001);
        assert_eq!(batch(&app, &tenant, id).await["itemCount"], 1_001);
    }
    assert_billing_invariants(&app.app.db).await;
}

async fn a_job_cannot_take_the_key_of_an_item(backend: Backend) {
    // An item's job is keyed `batch/{batch}/{customId}`: were a client's createJob
    // allowed that key, it would take the item's place before the item arrived (or
    // be answered with the item's job after).
    let app = spawn_app_with(backend, AppOptions::no_workers()).await;
    let tenant = app.funded_tenant("acme", "10").await;
    let id = create_batch(&app, &tenant, "keys").await;
    let item_key = format!("batch/{id}/doc-0");
    let taken = app.create_job(&tenant, job_input(&item_key, "mine")).await;
    assert_eq!(error_code(&taken), "VALIDATION", "{taken}");
    let other = app
        .create_job(&tenant, job_input("batch/anything", "mine"))
        .await;
    assert_eq!(error_code(&other), "VALIDATION", "{other}");
    let added = add_items(&app, &tenant, id, &items("doc-", 0, 1)).await;
    assert!(added["errors"].is_null(), "{added}");
    assert_eq!(batch(&app, &tenant, id).await["itemCount"], 1);
    // Keys that merely contain the word are the client's own.
    let own = app
        .create_job(&tenant, job_input("my-batch/1", "mine"))
        .await;
    assert!(own["errors"].is_null(), "{own}");
    assert_billing_invariants(&app.app.db).await;
}
