//! Batch prices in the price map: what an item of a PROVIDER_BATCH batch costs through
//! the provider's batch API. Built-in models have half their list price; the config
//! file sets or sells them per model; they are versioned with the price; and
//! createBatch takes PROVIDER_BATCH only for a model with a batch price.

use crate::helpers::{
    ADMIN_TOKEN, AppOptions, Backend, TestApp, decimal, error_code, spawn_app_with,
};
use entity::model_prices;
use rust_decimal::Decimal;
use sea_orm::{ColumnTrait, EntityTrait, QueryFilter, QueryOrder};
use serde_json::{Value, json};
use std::str::FromStr;

on_both_backends!(
    built_in_models_have_half_price_batch_prices,
    configured_batch_prices_are_sold_by_the_policy_and_versioned,
);

const MODELS: &str = "{ models { name price { inputPerMillion outputPerMillion } \
     batchPrice { inputPerMillion outputPerMillion } customerPrice { inputPerMillion outputPerMillion } \
     customerBatchPrice { inputPerMillion outputPerMillion } } }";

fn d(text: &str) -> Decimal {
    Decimal::from_str(text).unwrap()
}

async fn models(app: &TestApp, key: &str) -> Vec<Value> {
    let response = app.graphql(Some(key), MODELS, json!({})).await;
    assert!(response["errors"].is_null(), "{response}");
    response["data"]["models"].as_array().unwrap().clone()
}

fn model<'a>(models: &'a [Value], name: &str) -> &'a Value {
    models
        .iter()
        .find(|model| model["name"] == name)
        .unwrap_or_else(|| panic!("no {name} in {models:?}"))
}

/// `(input, output)` per million of a rates object.
fn rates(value: &Value) -> (Decimal, Decimal) {
    assert!(value.is_object(), "no rates: {value}");
    (
        decimal(&value["inputPerMillion"]),
        decimal(&value["outputPerMillion"]),
    )
}

async fn create_provider_batch(app: &TestApp, key: &str, model: &str) -> Value {
    let input = json!({"idempotencyKey": format!("pb-{model}"), "mode": "PROVIDER_BATCH",
        "model": model, "maxOutputTokens": 50});
    app.operation(Some(key), "CreateBatch", json!({"input": input}))
        .await
}

fn message(response: &Value) -> &str {
    response["errors"][0]["message"]
        .as_str()
        .unwrap_or_else(|| panic!("{response}"))
}

async fn built_in_models_have_half_price_batch_prices(backend: Backend) {
    let app = spawn_app_with(backend, AppOptions::no_workers()).await;
    let tenant = app.funded_tenant("acme", "5").await;

    // The admin sees the provider's batch price: half the list price, every built-in.
    let as_admin = models(&app, ADMIN_TOKEN).await;
    for listed in &as_admin {
        let (input, output) = rates(&listed["price"]);
        let name = &listed["name"];
        assert_eq!(
            rates(&listed["batchPrice"]),
            (input / d("2"), output / d("2")),
            "{name}"
        );
        // Tenants pay the default 1.25 markup on it.
        let (batch_input, batch_output) = rates(&listed["batchPrice"]);
        let sold = (
            (batch_input * d("1.25") * d("1e9")).ceil() / d("1e9"),
            (batch_output * d("1.25") * d("1e9")).ceil() / d("1e9"),
        );
        assert_eq!(rates(&listed["customerBatchPrice"]), sold, "{name}");
    }
    let mini = model(&as_admin, "gpt-4o-mini");
    assert_eq!(rates(&mini["batchPrice"]), (d("0.075"), d("0.30")));
    let sonnet = model(&as_admin, "claude-sonnet-4-5");
    assert_eq!(rates(&sonnet["batchPrice"]), (d("1.5"), d("7.5")));

    // A tenant sees what it pays, as with `price`, and nothing of the provider's.
    let as_tenant = models(&app, &tenant.key).await;
    let mini = model(&as_tenant, "gpt-4o-mini");
    assert_eq!(rates(&mini["batchPrice"]), (d("0.09375"), d("0.375")));
    assert!(mini["customerBatchPrice"].is_null());

    // With a batch price and a provider whose batch API jobledger submits to (the
    // simulator serves OpenAI's), PROVIDER_BATCH is taken.
    let created = create_provider_batch(&app, &tenant.key, "gpt-4o-mini").await;
    assert!(created["errors"].is_null(), "{created}");
    assert_eq!(
        created["data"]["createBatch"]["batch"]["mode"],
        "PROVIDER_BATCH"
    );
}

/// A config file: gpt-4o-mini's batch price from the file, a model without a batch
/// price, one sold at an explicit customer price, one with explicit customer batch
/// rates.
fn write_config(path: &std::path::Path, mini_batch_input: &str) {
    let text = format!(
        r#"
        [providers.sim]
        kind = "simulator"

        [models."gpt-4o-mini"]
        batch_price = {{ input = "{mini_batch_input}", output = "0.2" }}

        [models."sim-batchless"]
        provider = "sim"
        price = {{ input = "1", output = "2" }}

        [models."sim-explicit"]
        provider = "sim"
        price = {{ input = "1", output = "2" }}
        batch_price = {{ input = "0.4", output = "0.8" }}
        customer_price = {{ input = "2", output = "4" }}

        [models."sim-sold"]
        provider = "sim"
        price = {{ input = "1", output = "2" }}
        batch_price = {{ input = "0.5", output = "1" }}
        customer_batch_price = {{ input = "0.7", output = "1.1" }}

        [models."gpt-4o"]
        price = {{ input = "3", cached_input = "1.5", output = "12" }}
        "#
    );
    std::fs::write(path, text).unwrap();
}

async fn versions(app: &TestApp, model: &str) -> Vec<model_prices::Model> {
    model_prices::Entity::find()
        .filter(model_prices::Column::Model.eq(model))
        .order_by_asc(model_prices::Column::Version)
        .all(&app.app.db)
        .await
        .unwrap()
}

async fn configured_batch_prices_are_sold_by_the_policy_and_versioned(backend: Backend) {
    let folder = tempfile::tempdir().unwrap();
    let path = folder.path().join("jobledger.toml");
    write_config(&path, "0.05");
    let options = || AppOptions {
        config_file: Some(path.clone()),
        ..AppOptions::no_workers()
    };
    let app = spawn_app_with(backend, options()).await;
    let tenant = app.funded_tenant("acme", "5").await;

    let as_tenant = models(&app, &tenant.key).await;
    // The file's batch price, at the global markup.
    assert_eq!(
        rates(&model(&as_tenant, "gpt-4o-mini")["batchPrice"]),
        (d("0.0625"), d("0.25"))
    );
    // A price without a batch price: none, and PROVIDER_BATCH is refused for it.
    assert!(model(&as_tenant, "sim-batchless")["batchPrice"].is_null());
    // An explicit customer price keeps its margin on the batch price: 2 × 0.4, 4 × 0.4.
    assert_eq!(
        rates(&model(&as_tenant, "sim-explicit")["batchPrice"]),
        (d("0.8"), d("1.6"))
    );
    assert_eq!(
        rates(&model(&as_tenant, "sim-sold")["batchPrice"]),
        (d("0.7"), d("1.1"))
    );
    // A new list price of a built-in model keeps the built-in discount: half of it.
    let as_admin = models(&app, ADMIN_TOKEN).await;
    assert_eq!(
        rates(&model(&as_admin, "gpt-4o")["batchPrice"]),
        (d("1.5"), d("6"))
    );
    assert_eq!(
        rates(&model(&as_admin, "sim-sold")["batchPrice"]),
        (d("0.5"), d("1"))
    );

    let refused = create_provider_batch(&app, &tenant.key, "sim-batchless").await;
    assert_eq!(error_code(&refused), "VALIDATION", "{refused}");
    assert!(message(&refused).contains("no batch price"), "{refused}");
    let created = create_provider_batch(&app, &tenant.key, "sim-sold").await;
    assert!(created["errors"].is_null(), "{created}");

    // The same file again stores nothing new; a new batch price is a new version, and
    // the old version keeps the batch price it had.
    let before = versions(&app, "gpt-4o-mini").await;
    let app = app.restart(options()).await;
    assert_eq!(versions(&app, "gpt-4o-mini").await, before);
    write_config(&path, "0.04");
    let app = app.restart(options()).await;
    let after = versions(&app, "gpt-4o-mini").await;
    assert_eq!(after.len(), before.len() + 1);
    let (old, new) = (&after[after.len() - 2], &after[after.len() - 1]);
    assert_eq!(
        old,
        before.last().unwrap(),
        "the old version is never rewritten"
    );
    assert_eq!(old.provider_batch_input_nanos_per_million, Some(50_000_000));
    assert_eq!(new.provider_batch_input_nanos_per_million, Some(40_000_000));
    assert_eq!(new.customer_batch_input_nanos_per_million, Some(50_000_000));
    assert_eq!(
        new.provider_batch_output_nanos_per_million,
        Some(200_000_000)
    );
    assert_eq!(
        new.provider_input_nanos_per_million,
        old.provider_input_nanos_per_million
    );
    let as_tenant = models(&app, &tenant.key).await;
    assert_eq!(
        rates(&model(&as_tenant, "gpt-4o-mini")["batchPrice"]),
        (d("0.05"), d("0.25"))
    );
    // A model without one stores null in every batch column.
    let batchless = versions(&app, "sim-batchless").await;
    assert!(
        batchless
            .iter()
            .all(|row| row.provider_batch_input_nanos_per_million.is_none()
                && row.customer_batch_output_nanos_per_million.is_none())
    );
}
