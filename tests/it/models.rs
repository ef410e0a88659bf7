//! The price map as callers see it: `models` lists what can run with the caller's own
//! prices and the model's limits, and a job asking for more output than its model
//! writes is refused before anything is held.

use crate::helpers::{
    ADMIN_TOKEN, AppOptions, Backend, decimal, error_code, job_input, spawn_app_with,
};
use entity::jobs;
use rust_decimal::Decimal;
use sea_orm::{EntityTrait, PaginatorTrait};
use serde_json::{Value, json};
use std::str::FromStr;

on_both_backends!(
    models_lists_the_built_ins_with_the_callers_prices_and_limits,
    output_beyond_the_models_limit_is_refused_before_any_hold,
);

fn model<'a>(response: &'a Value, name: &str) -> &'a Value {
    response["data"]["models"]
        .as_array()
        .unwrap_or_else(|| panic!("{response}"))
        .iter()
        .find(|model| model["name"] == name)
        .unwrap_or_else(|| panic!("no {name} in {response}"))
}

fn rate(value: &Value) -> Decimal {
    decimal(value)
}

async fn models_lists_the_built_ins_with_the_callers_prices_and_limits(backend: Backend) {
    let app = spawn_app_with(backend, AppOptions::no_workers()).await;
    let tenant = app.funded_tenant("acme", "5").await;
    let as_tenant = app.operation(Some(&tenant.key), "Models", json!({})).await;
    assert!(as_tenant["errors"].is_null(), "{as_tenant}");
    let names: Vec<&str> = as_tenant["data"]["models"]
        .as_array()
        .unwrap()
        .iter()
        .map(|model| model["name"].as_str().unwrap())
        .collect();
    for built_in in [
        "gpt-4o-mini",
        "gpt-4o",
        "gpt-4.1",
        "gpt-4.1-mini",
        "gpt-4.1-nano",
        "o3",
        "o3-mini",
        "o4-mini",
        "claude-3-5-haiku-latest",
        "claude-haiku-4-5",
        "claude-sonnet-4-0",
        "claude-sonnet-4-5",
        "claude-opus-4-1",
    ] {
        assert!(
            names.contains(&built_in),
            "{built_in} missing from {names:?}"
        );
    }
    let mut sorted = names.clone();
    sorted.sort();
    assert_eq!(names, sorted, "by name");

    // A tenant sees what it pays: the provider's 0.15 / 0.075 / 0.60 at the default
    // 1.25 markup, and nothing of the provider's price.
    let mini = model(&as_tenant, "gpt-4o-mini");
    assert_eq!(
        rate(&mini["price"]["inputPerMillion"]),
        Decimal::from_str("0.1875").unwrap()
    );
    assert_eq!(
        rate(&mini["price"]["cachedInputPerMillion"]),
        Decimal::from_str("0.09375").unwrap()
    );
    assert_eq!(
        rate(&mini["price"]["outputPerMillion"]),
        Decimal::from_str("0.75").unwrap()
    );
    assert_eq!(mini["contextWindow"], 128_000);
    assert_eq!(mini["maxOutputTokens"], 16_384);
    assert!(!mini["provider"].as_str().unwrap().is_empty());
    let with_customer = app
        .graphql(
            Some(&tenant.key),
            "{ models { name customerPrice { inputPerMillion } } }",
            json!({}),
        )
        .await;
    assert!(model(&with_customer, "gpt-4o-mini")["customerPrice"].is_null());

    // The admin sees the provider's price, and the customer's beside it.
    let as_admin = app
        .graphql(
            Some(ADMIN_TOKEN),
            "{ models { name price { inputPerMillion outputPerMillion } customerPrice { inputPerMillion } source } }",
            json!({}),
        )
        .await;
    let mini = model(&as_admin, "gpt-4o-mini");
    assert_eq!(
        rate(&mini["price"]["inputPerMillion"]),
        Decimal::from_str("0.15").unwrap()
    );
    assert_eq!(
        rate(&mini["price"]["outputPerMillion"]),
        Decimal::from_str("0.60").unwrap()
    );
    assert_eq!(
        rate(&mini["customerPrice"]["inputPerMillion"]),
        Decimal::from_str("0.1875").unwrap()
    );
    assert!(mini["source"].as_str().unwrap().contains("2026"), "{mini}");
    let opus = model(&as_admin, "claude-opus-4-1");
    assert_eq!(rate(&opus["price"]["outputPerMillion"]), Decimal::from(75));

    // Not a browser token's, and not an anonymous caller's.
    let anonymous = app.operation(None, "Models", json!({})).await;
    assert_eq!(error_code(&anonymous), "UNAUTHENTICATED");
    let token = app
        .operation(
            Some(&tenant.key),
            "CreateAccessToken",
            json!({"input": {"scopes": ["READ_JOBS", "CREATE_JOBS"]}}),
        )
        .await;
    let token = token["data"]["createAccessToken"]["token"]
        .as_str()
        .unwrap();
    let refused = app.operation(Some(token), "Models", json!({})).await;
    assert_eq!(error_code(&refused), "FORBIDDEN");
}

async fn output_beyond_the_models_limit_is_refused_before_any_hold(backend: Backend) {
    let app = spawn_app_with(backend, AppOptions::no_workers()).await;
    let tenant = app.funded_tenant("acme", "1000").await;
    let balance = app.balance(&tenant).await;
    let mut input = job_input("too-long", "Write a book.");
    input["model"] = json!("gpt-4o-mini");
    input["maxOutputTokens"] = json!(16_385);
    let refused = app.create_job(&tenant, input.clone()).await;
    assert_eq!(error_code(&refused), "VALIDATION", "{refused}");
    let message = refused["errors"][0]["message"].as_str().unwrap();
    assert!(message.contains("16384"), "{message}");
    assert_eq!(app.balance(&tenant).await, balance, "nothing held");
    assert_eq!(jobs::Entity::find().count(&app.app.db).await.unwrap(), 0);
    // A model that writes more takes it; the limit itself is accepted.
    input["model"] = json!("gpt-4.1-mini");
    app.create_job_ok(&tenant, input.clone()).await;
    input["idempotencyKey"] = json!("at-the-limit");
    input["model"] = json!("gpt-4o-mini");
    input["maxOutputTokens"] = json!(16_384);
    app.create_job_ok(&tenant, input).await;

    // A batch whose items would ask for too much is refused at create, too.
    let batch = app
        .operation(
            Some(&tenant.key),
            "CreateBatch",
            json!({"input": {"idempotencyKey": "b", "model": "claude-3-5-haiku-latest", "maxOutputTokens": 9_000}}),
        )
        .await;
    assert_eq!(error_code(&batch), "VALIDATION", "{batch}");
}
