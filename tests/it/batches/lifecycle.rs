//! A batch from its first chunk to its results: counts and money against the items
//! and the account, live progress, cancel mid-run, and what other tenants see.

use super::{add_items, all_items, batch, create_batch, items, results, wait_until_finished};
use crate::helpers::{
    AppOptions, Backend, decimal, error_code, spawn_app_with, test_worker_settings,
};
use crate::invariants::assert_billing_invariants;
use jobledger::jobs::queue::{self, ClaimRequest};
use jobledger::jobs::worker::WorkerSettings;
use rust_decimal::Decimal;
use sea_orm::{ColumnTrait, ConnectionTrait, EntityTrait, PaginatorTrait, QueryFilter};
use serde_json::{Value, json};
use std::time::Duration;

on_both_backends!(
    a_batch_of_2500_items_with_a_resent_chunk_adds_each_once_and_sums_exactly,
    batch_updates_end_at_finished_with_counts_that_never_go_back,
    cancelling_mid_run_resolves_every_hold,
    another_tenant_sees_no_batch_item_or_result,
    a_large_batch_never_starves_another_tenants_job,
    a_cancel_stopped_mid_way_is_finished_by_the_sweep,
    no_item_of_a_batch_being_cancelled_is_claimed,
    results_are_unavailable_not_missing_while_the_database_fails,
);

fn busy_workers() -> AppOptions {
    AppOptions::workers(WorkerSettings {
        concurrency: 32,
        ..test_worker_settings()
    })
}

async fn a_batch_of_2500_items_with_a_resent_chunk_adds_each_once_and_sums_exactly(
    backend: Backend,
) {
    let app = spawn_app_with(backend, busy_workers()).await;
    let tenant = app.funded_tenant("acme", "100").await;
    let id = create_batch(&app, &tenant, "contracts").await;
    let chunks = [
        items("doc-", 0, 1_000),
        items("doc-", 1_000, 1_000),
        items("doc-", 2_000, 500),
    ];
    for (index, chunk) in chunks.iter().enumerate() {
        let response = add_items(&app, &tenant, id, chunk).await;
        assert!(response["errors"].is_null(), "{response}");
        assert_eq!(response["data"]["addBatchItems"]["added"], chunk.len());
        if index == 1 {
            // A client that timed out sends the chunk again: nothing is added twice.
            let again = add_items(&app, &tenant, id, chunk).await;
            assert_eq!(again["data"]["addBatchItems"]["added"], 0, "{again}");
            assert_eq!(again["data"]["addBatchItems"]["replayed"], 1_000);
        }
    }
    let closed = app
        .operation(Some(&tenant.key), "CloseBatch", json!({"id": id}))
        .await;
    assert!(closed["errors"].is_null(), "{closed}");
    let finished = wait_until_finished(&app, &tenant, id, Duration::from_secs(240)).await;
    assert_eq!(finished["itemCount"], 2_500);
    assert_eq!(
        finished["counts"],
        json!({"queued": 0, "running": 0, "succeeded": 2_500, "failed": 0, "cancelled": 0})
    );
    assert_eq!(decimal(&finished["reserved"]), Decimal::ZERO);
    assert!(finished["finishedAt"].is_string());

    // The items, in the order they were added, each once.
    let listed = all_items(&app, &tenant, id).await;
    let expected: Vec<String> = (0..2_500).map(|n| format!("doc-{n}")).collect();
    let custom_ids: Vec<String> = listed
        .iter()
        .map(|item| item["customId"].as_str().unwrap().to_owned())
        .collect();
    assert_eq!(custom_ids, expected);
    let charges: Decimal = listed
        .iter()
        .map(|item| decimal(&item["charge"]["amount"]))
        .sum();
    assert_eq!(decimal(&finished["customerCharge"]), charges);
    assert!(charges > Decimal::ZERO);
    // The account paid exactly the batch's charge, and holds nothing more.
    let balance = app.balance(&tenant).await;
    assert_eq!(decimal(&balance["charged"]), charges);
    assert_eq!(decimal(&balance["held"]), Decimal::ZERO);
    // Every call the provider billed is an attempt on record (an overloaded machine may
    // lose a lease and run an item twice; both calls are then recorded and paid once).
    let attempts = entity::attempts::Entity::find()
        .filter(entity::attempts::Column::TenantId.eq(tenant.id))
        .count(&app.app.db)
        .await
        .unwrap();
    assert_eq!(app.billed_calls() as u64, attempts);
    assert!(attempts >= 2_500);

    let (status, lines) = results(&app, &tenant.key, id).await;
    assert_eq!(status, 200);
    let result_ids: Vec<&str> = lines
        .iter()
        .map(|line| line["customId"].as_str().unwrap())
        .collect();
    assert_eq!(
        result_ids,
        expected.iter().map(String::as_str).collect::<Vec<_>>()
    );
    let mut result_charges = Decimal::ZERO;
    for (line, item) in lines.iter().zip(&listed) {
        assert_eq!(line["jobId"], item["id"]);
        assert_eq!(line["status"], "SUCCEEDED");
        assert_eq!(line["result"], item["result"], "{line}");
        assert!(line["error"].is_null());
        result_charges += decimal(&line["customerCharge"]);
    }
    assert_eq!(result_charges, charges);
    assert_billing_invariants(&app.app.db).await;
}

async fn batch_updates_end_at_finished_with_counts_that_never_go_back(backend: Backend) {
    let app = spawn_app_with(backend, busy_workers()).await;
    let tenant = app.funded_tenant("acme", "100").await;
    let id = create_batch(&app, &tenant, "b").await;
    let query = crate::contract::operation("BatchUpdates");
    let watcher = app.subscribe(
        &tenant.key,
        &query,
        json!({"id": id}),
        Duration::from_secs(120),
    );
    let feeder = async {
        for chunk in 0..4 {
            let response = add_items(&app, &tenant, id, &items("d", chunk * 150, 150)).await;
            assert!(response["errors"].is_null(), "{response}");
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
        let closed = app
            .operation(Some(&tenant.key), "CloseBatch", json!({"id": id}))
            .await;
        assert!(closed["errors"].is_null(), "{closed}");
    };
    let (updates, ()) = tokio::join!(watcher, feeder);
    let updates = updates.expect("the subscription completes");
    assert!(updates.len() >= 2, "{updates:?}");
    let mut finished_before = 0;
    let mut charge_before = Decimal::ZERO;
    for update in &updates {
        assert!(update["errors"].is_null(), "{update}");
        let update = &update["data"]["batchUpdates"];
        let counts = &update["counts"];
        let finished = ["succeeded", "failed", "cancelled"]
            .iter()
            .map(|name| counts[name].as_i64().unwrap())
            .sum::<i64>();
        assert!(finished >= finished_before, "counts went back: {updates:?}");
        finished_before = finished;
        let charge = decimal(&update["customerCharge"]);
        assert!(charge >= charge_before, "the charge went back: {updates:?}");
        charge_before = charge;
    }
    let last = &updates.last().unwrap()["data"]["batchUpdates"];
    assert_eq!(last["status"], "FINISHED", "{last}");
    assert_eq!(last["counts"]["succeeded"], 600);
    assert_eq!(
        decimal(&last["customerCharge"]),
        decimal(&batch(&app, &tenant, id).await["customerCharge"])
    );
    assert_billing_invariants(&app.app.db).await;
}

async fn cancelling_mid_run_resolves_every_hold(backend: Backend) {
    let app = spawn_app_with(backend, busy_workers()).await;
    let tenant = app.funded_tenant("acme", "100").await;
    let id = create_batch(&app, &tenant, "b").await;
    // Slow calls, so that the cancel finds items queued, running and finished.
    let slow: Vec<Value> = (0..400)
        .map(|n| {
            json!({
                "customId": format!("s{n}"),
                "messages": [{"role": "user", "content": format!("document {n} [mock:delay_ms=300]")}],
            })
        })
        .collect();
    let response = add_items(&app, &tenant, id, &slow).await;
    assert!(response["errors"].is_null(), "{response}");
    // Wait until some finished.
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    while batch(&app, &tenant, id).await["counts"]["succeeded"]
        .as_i64()
        .unwrap()
        < 5
    {
        assert!(std::time::Instant::now() < deadline);
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let cancelled = app
        .operation(Some(&tenant.key), "CancelBatch", json!({"id": id}))
        .await;
    assert!(cancelled["errors"].is_null(), "{cancelled}");
    assert_eq!(cancelled["data"]["cancelBatch"]["cancelRequested"], true);
    assert_ne!(cancelled["data"]["cancelBatch"]["status"], "OPEN");
    let finished = wait_until_finished(&app, &tenant, id, Duration::from_secs(60)).await;
    let counts = &finished["counts"];
    let succeeded = counts["succeeded"].as_i64().unwrap();
    let cancelled_count = counts["cancelled"].as_i64().unwrap();
    assert_eq!(
        succeeded + cancelled_count + counts["failed"].as_i64().unwrap(),
        400
    );
    assert!(cancelled_count > 0, "{finished}");
    assert!(succeeded >= 5, "{finished}");
    assert_eq!(decimal(&finished["reserved"]), Decimal::ZERO);
    let balance = app.balance(&tenant).await;
    assert_eq!(
        decimal(&balance["held"]),
        Decimal::ZERO,
        "every hold resolved"
    );
    assert_eq!(
        decimal(&balance["charged"]),
        decimal(&finished["customerCharge"])
    );
    // A cancelled batch refuses items.
    let response = add_items(&app, &tenant, id, &items("late", 0, 1)).await;
    assert_eq!(error_code(&response), "VALIDATION", "{response}");
    assert_billing_invariants(&app.app.db).await;
}

async fn another_tenant_sees_no_batch_item_or_result(backend: Backend) {
    let app = spawn_app_with(backend, AppOptions::no_workers()).await;
    let owner = app.funded_tenant("owner", "10").await;
    let other = app.funded_tenant("other", "10").await;
    let id = create_batch(&app, &owner, "private").await;
    assert!(add_items(&app, &owner, id, &items("x", 0, 3)).await["errors"].is_null());
    let item = all_items(&app, &owner, id).await[0]["id"].clone();

    for (name, variables) in [
        ("Batch", json!({"id": id})),
        ("BatchJobs", json!({"id": id})),
        ("CloseBatch", json!({"id": id})),
        ("CancelBatch", json!({"id": id})),
        (
            "AddBatchItems",
            json!({"batchId": id, "items": items("y", 0, 1)}),
        ),
        ("JobBatch", json!({"id": item})),
    ] {
        let response = app.operation(Some(&other.key), name, variables).await;
        assert_eq!(error_code(&response), "NOT_FOUND", "{name}: {response}");
    }
    let listed = app
        .operation(Some(&other.key), "Batches", json!({"first": 10}))
        .await;
    assert_eq!(listed["data"]["batches"]["edges"], json!([]), "{listed}");
    assert_eq!(results(&app, &other.key, id).await.0, 404);
    // No key at all: 401, not 404.
    let anonymous = app
        .http
        .get(format!("http://{}/batches/{id}/results", app.address))
        .send()
        .await
        .unwrap();
    assert_eq!(anonymous.status().as_u16(), 401);
    assert_eq!(results(&app, "not-a-key", id).await.0, 401);
    // The owner still has everything, untouched.
    let read = batch(&app, &owner, id).await;
    assert_eq!(read["status"], "OPEN");
    assert_eq!(read["itemCount"], 3);
    assert_eq!(results(&app, &owner.key, id).await.1.len(), 3);
    assert_eq!(decimal(&app.balance(&other).await["held"]), Decimal::ZERO);
    assert_billing_invariants(&app.app.db).await;
}

async fn a_large_batch_never_starves_another_tenants_job(backend: Backend) {
    let app = spawn_app_with(backend, AppOptions::default()).await;
    let bulk = app.funded_tenant("bulk", "100").await;
    let single = app.funded_tenant("single", "10").await;
    let id = create_batch(&app, &bulk, "big").await;
    for chunk in 0..5 {
        let response = add_items(&app, &bulk, id, &items("d", chunk * 1_000, 1_000)).await;
        assert!(response["errors"].is_null(), "{response}");
    }
    let done = |progress: &Value| {
        ["succeeded", "failed", "cancelled"]
            .iter()
            .map(|name| progress["counts"][name].as_i64().unwrap())
            .sum::<i64>()
    };
    let job = app
        .create_job_ok(
            &single,
            crate::helpers::job_input("one", "a single document"),
        )
        .await;
    let before = done(&batch(&app, &bulk, id).await);
    app.wait_until_finished(&single, job, Duration::from_secs(60))
        .await;
    // The other tenant's job ran among the next few claims, not after the backlog.
    let after = done(&batch(&app, &bulk, id).await);
    assert!(
        before < 4_000,
        "the batch drained before the test could look: {before}"
    );
    assert!(
        after - before < 200,
        "{} of the batch's items ran before the other tenant's job finished",
        after - before
    );
}

/// The batch as a cancelBatch leaves it after its first transaction: closed and
/// cancel-requested, its items untouched.
async fn cancel_asked_and_no_item_reached(app: &crate::helpers::TestApp, id: uuid::Uuid) {
    use sea_orm::sea_query::Expr;
    entity::batches::Entity::update_many()
        .col_expr(
            entity::batches::Column::Status,
            Expr::value(entity::BatchStatus::Closed),
        )
        .col_expr(entity::batches::Column::CancelRequested, Expr::value(true))
        .filter(entity::batches::Column::Id.eq(id))
        .exec(&app.app.db)
        .await
        .unwrap();
}

async fn a_cancel_stopped_mid_way_is_finished_by_the_sweep(backend: Backend) {
    let app = spawn_app_with(backend, AppOptions::no_workers()).await;
    let tenant = app.funded_tenant("acme", "10").await;
    let id = create_batch(&app, &tenant, "b").await;
    assert!(add_items(&app, &tenant, id, &items("d", 0, 30)).await["errors"].is_null());
    // What a cancelBatch leaves when its process dies after its first transaction.
    cancel_asked_and_no_item_reached(&app, id).await;
    let finished = wait_until_finished(&app, &tenant, id, Duration::from_secs(30)).await;
    assert_eq!(finished["counts"]["cancelled"], 30, "{finished}");
    assert_eq!(decimal(&finished["reserved"]), Decimal::ZERO);
    assert_eq!(decimal(&app.balance(&tenant).await["held"]), Decimal::ZERO);
    assert_billing_invariants(&app.app.db).await;
}

/// Between a cancel's close and its reaching an item, no worker starts the item: a
/// claim passes over the items of a batch whose cancel is asked (they used to be
/// claimed, and paid for, until the cancel's transactions got to them).
async fn no_item_of_a_batch_being_cancelled_is_claimed(backend: Backend) {
    let app = spawn_app_with(backend, AppOptions::no_workers()).await;
    let tenant = app.funded_tenant("acme", "10").await;
    let id = create_batch(&app, &tenant, "b").await;
    assert!(add_items(&app, &tenant, id, &items("d", 0, 30)).await["errors"].is_null());
    let alone = app
        .create_job_ok(&tenant, crate::helpers::job_input("alone", "hello"))
        .await;
    // The cancel's first transaction has committed; none of its item transactions has.
    cancel_asked_and_no_item_reached(&app, id).await;
    let claims = queue::claim(&app.app.db, ClaimRequest::new(100, Duration::from_secs(30)))
        .await
        .unwrap();
    let claimed: Vec<_> = claims.iter().map(|claim| claim.job.id).collect();
    assert_eq!(
        claimed,
        [alone],
        "only the job outside the batch is claimed"
    );
    let finished = wait_until_finished(&app, &tenant, id, Duration::from_secs(30)).await;
    assert_eq!(finished["counts"]["cancelled"], 30, "{finished}");
    assert_eq!(decimal(&finished["reserved"]), Decimal::ZERO);
    assert_billing_invariants(&app.app.db).await;
}

async fn results_are_unavailable_not_missing_while_the_database_fails(backend: Backend) {
    // A 404 tells a client the batch is gone and it should stop asking; a batch the
    // database could not read may well exist, so the answer is 503.
    let app = spawn_app_with(backend, AppOptions::no_workers()).await;
    let owner = app.funded_tenant("owner", "10").await;
    let id = create_batch(&app, &owner, "unreadable").await;
    assert!(add_items(&app, &owner, id, &items("x", 0, 2)).await["errors"].is_null());
    let db = &app.app.db;
    db.execute_unprepared("ALTER TABLE batches RENAME TO batches_away")
        .await
        .unwrap();
    let (status, _) = results(&app, &owner.key, id).await;
    db.execute_unprepared("ALTER TABLE batches_away RENAME TO batches")
        .await
        .unwrap();
    assert_eq!(status, 503);
    assert_eq!(results(&app, &owner.key, id).await.1.len(), 2);
}
