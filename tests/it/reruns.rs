//! `rerunJob`: a new job with a finished job's input, its own hold, attempts and charge,
//! linked by `rerunOf`; idempotent by its own key.

use crate::batches::{add_items, batch, create_batch, items};
use crate::helpers::{
    AppOptions, Backend, TestApp, TestTenant, decimal, error_code, job_input, spawn_app,
    spawn_app_with,
};
use crate::invariants::assert_billing_invariants;
use entity::{credit_reservations, jobs};
use rust_decimal::Decimal;
use sea_orm::{EntityTrait, PaginatorTrait};
use serde_json::{Value, json};
use std::time::Duration;
use uuid::Uuid;

on_both_backends!(
    a_rerun_is_a_new_job_with_the_same_input_and_its_own_hold_and_charge,
    a_rerun_key_used_for_anything_else_conflicts,
    an_unfinished_job_is_not_rerun_and_another_tenants_is_not_found,
    a_rerun_of_an_item_joins_its_open_batch_and_not_a_closed_one,
    concurrent_reruns_with_one_key_make_one_job_and_one_hold,
);

async fn rerun(app: &TestApp, tenant: &TestTenant, id: Uuid, key: &str) -> Value {
    app.operation(
        Some(&tenant.key),
        "RerunJob",
        json!({"id": id, "idempotencyKey": key}),
    )
    .await
}

/// `rerunJob` that must succeed: its payload.
async fn rerun_ok(app: &TestApp, tenant: &TestTenant, id: Uuid, key: &str) -> Value {
    let response = rerun(app, tenant, id, key).await;
    assert!(response["errors"].is_null(), "rerunJob failed: {response}");
    response["data"]["rerunJob"].clone()
}

fn id_of(job: &Value) -> Uuid {
    job["id"].as_str().unwrap().parse().unwrap()
}

/// What a rerun copies, and what the contract's operations leave out.
async fn details(app: &TestApp, tenant: &TestTenant, id: Uuid) -> Value {
    let response = app
        .graphql(
            Some(&tenant.key),
            "query($id: UUID!) { job(id: $id) { model input maxAttempts priority \
             retryUnknownOutcome batchId labels { key value } rerunOf { id status } } }",
            json!({"id": id}),
        )
        .await;
    assert!(response["errors"].is_null(), "{response}");
    response["data"]["job"].clone()
}

async fn a_rerun_is_a_new_job_with_the_same_input_and_its_own_hold_and_charge(backend: Backend) {
    let app = spawn_app(backend).await;
    let tenant = app.funded_tenant("acme", "5").await;
    let mut input = job_input("first", "Please summarise the quarterly report.");
    input["labels"] = json!([{"key": "doc", "value": "q3"}]);
    input["metadata"] = json!({"upload": 7});
    input["maxAttempts"] = json!(2);
    input["priority"] = json!(7);
    input["retryUnknownOutcome"] = json!(false);
    let created = app.create_job(&tenant, input).await;
    let first_hold = decimal(&created["data"]["createJob"]["job"]["reservation"]["amount"]);
    let first = id_of(&created["data"]["createJob"]["job"]);
    let finished = app
        .wait_until_finished(&tenant, first, Duration::from_secs(20))
        .await;
    assert_eq!(finished["status"], "SUCCEEDED", "{finished}");

    let payload = rerun_ok(&app, &tenant, first, "again").await;
    assert_eq!(payload["replayed"], false);
    let job = &payload["job"];
    let second = id_of(job);
    assert_ne!(second, first);
    assert_eq!(job["status"], "QUEUED");
    assert_eq!(job["rerunOf"]["id"], first.to_string());
    // Its own hold, taken as createJob takes one: the same input holds the same.
    assert_eq!(job["reservation"]["status"], "HELD");
    assert_eq!(decimal(&job["reservation"]["amount"]), first_hold);

    let original = details(&app, &tenant, first).await;
    let copy = details(&app, &tenant, second).await;
    for field in [
        "model",
        "input",
        "maxAttempts",
        "priority",
        "retryUnknownOutcome",
        "labels",
    ] {
        assert_eq!(copy[field], original[field], "{field}");
    }
    assert_eq!(copy["input"]["metadata"], json!({"upload": 7}));
    assert_eq!(copy["rerunOf"]["status"], "SUCCEEDED");
    assert!(original["rerunOf"].is_null());

    // It runs on its own: one more call, its own attempt and charge; the first job's
    // money is as it was.
    let rerun_finished = app
        .wait_until_finished(&tenant, second, Duration::from_secs(20))
        .await;
    assert_eq!(rerun_finished["status"], "SUCCEEDED", "{rerun_finished}");
    assert_eq!(rerun_finished["attempts"].as_array().unwrap().len(), 1);
    assert!(rerun_finished["charge"]["amount"].is_string());
    assert_ne!(rerun_finished["charge"]["id"], finished["charge"]["id"]);
    assert_eq!(app.job(&tenant, first).await["charge"], finished["charge"]);
    assert_eq!(app.simulator.calls().len(), 2);

    // The same key again is the same rerun, and takes nothing more.
    let balance = app.balance(&tenant).await;
    let replay = rerun_ok(&app, &tenant, first, "again").await;
    assert_eq!(replay["replayed"], true);
    assert_eq!(replay["job"]["id"], second.to_string());
    assert_eq!(app.balance(&tenant).await, balance);
    assert_eq!(app.simulator.calls().len(), 2);
    // A rerun of a rerun points at the rerun.
    let third = rerun_ok(&app, &tenant, second, "third").await;
    assert_eq!(third["job"]["rerunOf"]["id"], second.to_string());
    // The audit reads a ledger at rest: a job settling while it reads looks torn.
    app.wait_until_finished(&tenant, id_of(&third["job"]), Duration::from_secs(20))
        .await;
    assert_billing_invariants(&app.app.db).await;
}

async fn a_rerun_key_used_for_anything_else_conflicts(backend: Backend) {
    let app = spawn_app_with(backend, AppOptions::no_workers()).await;
    let tenant = app.funded_tenant("acme", "5").await;
    let mut finished = Vec::new();
    for key in ["one", "two"] {
        let id = app
            .create_job_ok(&tenant, job_input(key, "The same words."))
            .await;
        let cancelled = app
            .operation(Some(&tenant.key), "CancelJob", json!({"id": id}))
            .await;
        assert_eq!(
            cancelled["data"]["cancelJob"]["status"], "CANCELLED",
            "{cancelled}"
        );
        finished.push(id);
    }
    rerun_ok(&app, &tenant, finished[0], "rerun-key").await;
    // Another job's rerun, or a createJob of the very same input, under the key.
    let other = rerun(&app, &tenant, finished[1], "rerun-key").await;
    assert_eq!(error_code(&other), "IDEMPOTENCY_CONFLICT", "{other}");
    let created = app
        .create_job(&tenant, job_input("rerun-key", "The same words."))
        .await;
    assert_eq!(error_code(&created), "IDEMPOTENCY_CONFLICT", "{created}");
    // A createJob's key is no rerun's either; a bad key is refused as createJob's is.
    let taken = rerun(&app, &tenant, finished[0], "two").await;
    assert_eq!(error_code(&taken), "IDEMPOTENCY_CONFLICT", "{taken}");
    for key in ["", "batch/mine"] {
        let bad = rerun(&app, &tenant, finished[0], key).await;
        assert_eq!(error_code(&bad), "VALIDATION", "{key:?}: {bad}");
    }
    assert_billing_invariants(&app.app.db).await;
}

async fn an_unfinished_job_is_not_rerun_and_another_tenants_is_not_found(backend: Backend) {
    let app = spawn_app_with(backend, AppOptions::no_workers()).await;
    let acme = app.funded_tenant("acme", "5").await;
    let globex = app.funded_tenant("globex", "5").await;
    let queued = app
        .create_job_ok(&acme, job_input("queued", "Not run yet."))
        .await;
    let balance = app.balance(&acme).await;
    let refused = rerun(&app, &acme, queued, "too-soon").await;
    assert_eq!(error_code(&refused), "VALIDATION", "{refused}");
    assert_eq!(app.balance(&acme).await, balance);

    app.operation(Some(&acme.key), "CancelJob", json!({"id": queued}))
        .await;
    let theirs = rerun(&app, &globex, queued, "steal").await;
    assert_eq!(error_code(&theirs), "NOT_FOUND", "{theirs}");
    let unknown = rerun(&app, &acme, Uuid::now_v7(), "nothing").await;
    assert_eq!(error_code(&unknown), "NOT_FOUND", "{unknown}");
    // The refused key is free: the job, now finished, reruns under it.
    let payload = rerun_ok(&app, &acme, queued, "too-soon").await;
    assert_eq!(payload["job"]["rerunOf"]["id"], queued.to_string());
    assert_billing_invariants(&app.app.db).await;
}

/// While its batch is OPEN a rerun of an item is one more item of it (counted, held and
/// charged with the batch, which finishes only after it); once the batch is closed a
/// rerun is a job of its own.
async fn a_rerun_of_an_item_joins_its_open_batch_and_not_a_closed_one(backend: Backend) {
    let app = spawn_app(backend).await;
    let tenant = app.funded_tenant("acme", "5").await;
    let batch_id = create_batch(&app, &tenant, "docs").await;
    let added = add_items(&app, &tenant, batch_id, &items("doc-", 0, 2)).await;
    assert!(added["errors"].is_null(), "{added}");
    let mut originals = Vec::new();
    for custom_id in ["doc-0", "doc-1"] {
        // An item is found by its own key, `batch/{batch}/{customId}`.
        let found = app
            .operation(
                Some(&tenant.key),
                "JobByKey",
                json!({"key": format!("batch/{batch_id}/{custom_id}")}),
            )
            .await;
        let item = id_of(&found["data"]["job"]);
        let finished = app
            .wait_until_finished(&tenant, item, Duration::from_secs(20))
            .await;
        assert_eq!(finished["status"], "SUCCEEDED", "{finished}");
        originals.push(item);
    }

    let before = batch(&app, &tenant, batch_id).await;
    assert_eq!(before["status"], "OPEN");
    let payload = rerun_ok(&app, &tenant, originals[0], "doc-0-again").await;
    assert_eq!(payload["replayed"], false);
    let joined = id_of(&payload["job"]);
    let copy = details(&app, &tenant, joined).await;
    assert_eq!(copy["batchId"], json!(batch_id.to_string()), "{copy}");
    assert_eq!(copy["rerunOf"]["id"], json!(originals[0].to_string()));
    assert_eq!(
        copy["input"],
        details(&app, &tenant, originals[0]).await["input"]
    );
    let after = batch(&app, &tenant, batch_id).await;
    assert_eq!(after["itemCount"], json!(3), "{after}");
    // Sent again, the key answers the same rerun and adds nothing.
    let again = rerun_ok(&app, &tenant, originals[0], "doc-0-again").await;
    assert_eq!(again["replayed"], true);
    assert_eq!(id_of(&again["job"]), joined);
    assert_eq!(batch(&app, &tenant, batch_id).await["itemCount"], json!(3));

    let closed = app
        .operation(Some(&tenant.key), "CloseBatch", json!({"id": batch_id}))
        .await;
    assert!(closed["errors"].is_null(), "{closed}");
    let finished =
        crate::batches::wait_until_finished(&app, &tenant, batch_id, Duration::from_secs(30)).await;
    assert_eq!(finished["counts"]["succeeded"], json!(3), "{finished}");
    let charges: Decimal = crate::batches::all_items(&app, &tenant, batch_id)
        .await
        .iter()
        .map(|item| decimal(&item["charge"]["amount"]))
        .sum();
    assert_eq!(decimal(&finished["customerCharge"]), charges, "{finished}");

    // The batch is closed: a rerun of its other item stays outside it.
    let payload = rerun_ok(&app, &tenant, originals[1], "doc-1-again").await;
    let alone = id_of(&payload["job"]);
    let copy = details(&app, &tenant, alone).await;
    assert!(copy["batchId"].is_null(), "{copy}");
    let rerun_finished = app
        .wait_until_finished(&tenant, alone, Duration::from_secs(20))
        .await;
    assert_eq!(rerun_finished["status"], "SUCCEEDED", "{rerun_finished}");
    let last = batch(&app, &tenant, batch_id).await;
    assert_eq!(last["itemCount"], json!(3));
    assert_eq!(
        last["counts"], finished["counts"],
        "the rerun is not counted in the batch"
    );
    assert_eq!(last["customerCharge"], finished["customerCharge"]);
    assert_billing_invariants(&app.app.db).await;
}

async fn concurrent_reruns_with_one_key_make_one_job_and_one_hold(backend: Backend) {
    let app = spawn_app_with(backend, AppOptions::no_workers()).await;
    let tenant = app.funded_tenant("acme", "5").await;
    let mut input = job_input("original", "Run me twice.");
    input["labels"] = json!([{"key": "doc", "value": "d1"}]);
    let original = app.create_job_ok(&tenant, input).await;
    app.operation(Some(&tenant.key), "CancelJob", json!({"id": original}))
        .await;
    // Every one may pass the key check before any has inserted: the service's own
    // replay, by fingerprint, settles the race.
    let responses =
        futures_util::future::join_all((0..8).map(|_| rerun(&app, &tenant, original, "one-rerun")))
            .await;
    crate::helpers::one_job_made_once(&responses, "rerunJob");
    let db = &app.app.db;
    assert_eq!(jobs::Entity::find().count(db).await.unwrap(), 2);
    assert_eq!(
        credit_reservations::Entity::find().count(db).await.unwrap(),
        2
    );
    assert_eq!(
        entity::job_labels::Entity::find().count(db).await.unwrap(),
        2
    );
    assert_billing_invariants(db).await;
}
