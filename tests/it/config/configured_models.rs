//! Through the real start path, on both databases: a custom model served by a
//! configured provider at its configured price, with price changes stored as new
//! versions that never rewrite past attempts.

use super::{LocalServer, TestConfig, attempts_of, llama_job, price_versions, run_llama_job};
use crate::helpers::{Backend, decimal, error_code, spawn_app_with};
use crate::invariants::assert_billing_invariants;
use serde_json::json;
use std::time::Duration;

on_both_backends!(
    a_configured_model_runs_on_its_provider_at_its_price,
    a_model_without_a_price_is_refused_with_validation,
    an_unrouted_model_is_refused_once_a_provider_is_configured,
    a_fallback_model_no_provider_serves_or_prices_is_refused,
    a_changed_price_is_a_new_version_and_the_past_keeps_its_cost,
);

async fn a_configured_model_runs_on_its_provider_at_its_price(backend: Backend) {
    let local = LocalServer::start().await;
    let config = TestConfig::new(&local);
    let app = spawn_app_with(backend, config.with_input_price("0.123456789")).await;

    run_llama_job(&app, &local, "llama-1", 123_456_789).await;
    assert_eq!(local.simulator.calls().len(), 1);
    assert!(
        app.simulator.calls().is_empty(),
        "the fallback simulator was called: {:?}",
        app.simulator.calls()
    );

    let [stored] = <[_; 1]>::try_from(price_versions(&app, "llama3-local").await).unwrap();
    assert_eq!(stored.version, 1);
    assert_eq!(stored.provider_input_nanos_per_million, 123_456_789);
    assert_eq!(stored.provider_cached_input_nanos_per_million, 50_000_000);
    assert_eq!(stored.customer_input_nanos_per_million, 246_913_578);
    assert_eq!(stored.source, "measured on our own GPUs");
    // Built-in models are still priced beside it.
    assert_eq!(price_versions(&app, "gpt-4o-mini").await.len(), 1);
}

async fn a_model_without_a_price_is_refused_with_validation(backend: Backend) {
    let local = LocalServer::start().await;
    let config = TestConfig::new(&local);
    let app = spawn_app_with(backend, config.with_input_price("0.5")).await;
    let tenant = app.funded_tenant("acme", "5").await;

    // Routed by the file to a provider, but priced nowhere.
    let mut input = llama_job("unpriced");
    input["model"] = json!("unpriced-model");
    let response = app.create_job(&tenant, input).await;
    assert_eq!(error_code(&response), "VALIDATION", "{response}");
    assert!(
        response["errors"][0]["message"]
            .as_str()
            .unwrap()
            .contains("has no price"),
        "{response}"
    );
    assert!(local.simulator.calls().is_empty());
}

/// With a real provider configured, the simulator no longer serves what no route
/// names: a built-in, priced model with no provider is refused, never simulated and
/// charged at real prices.
async fn an_unrouted_model_is_refused_once_a_provider_is_configured(backend: Backend) {
    let local = LocalServer::start().await;
    let config = TestConfig::new(&local);
    let app = spawn_app_with(backend, config.with_input_price("0.5")).await;
    let tenant = app.funded_tenant("acme", "5").await;
    for model in ["claude-sonnet-4-5", "gpt-4o-mini", "never-heard-of-it"] {
        let mut input = llama_job(model);
        input["model"] = json!(model);
        let response = app.create_job(&tenant, input).await;
        assert_eq!(error_code(&response), "VALIDATION", "{model}: {response}");
        assert!(
            response["errors"][0]["message"]
                .as_str()
                .unwrap()
                .contains("is not served"),
            "{response}"
        );
    }
    // The routed model still runs.
    let id = app.create_job_ok(&tenant, llama_job("routed")).await;
    let job = app
        .wait_until_finished(&tenant, id, Duration::from_secs(15))
        .await;
    assert_eq!(job["status"], "SUCCEEDED", "{job}");
    assert_eq!(local.simulator.calls().len(), 1);
    assert!(
        app.simulator.calls().is_empty(),
        "nothing reached the simulator"
    );
}

/// Every model of a job's chain must be routed and priced, as its own model must: a
/// fallback that is not is VALIDATION, and nothing is held.
async fn a_fallback_model_no_provider_serves_or_prices_is_refused(backend: Backend) {
    let local = LocalServer::start().await;
    let config = TestConfig::new(&local);
    let app = spawn_app_with(backend, config.with_input_price("0.5")).await;
    let tenant = app.funded_tenant("acme", "5").await;
    for (fallback, says) in [
        ("gpt-4o-mini", "is not served"),
        ("unpriced-model", "has no price"),
    ] {
        let mut input = llama_job(fallback);
        input["fallbackModels"] = json!([fallback]);
        let response = app.create_job(&tenant, input).await;
        assert_eq!(
            error_code(&response),
            "VALIDATION",
            "{fallback}: {response}"
        );
        let message = response["errors"][0]["message"].as_str().unwrap();
        assert!(
            message.contains(says) && message.contains(fallback),
            "{fallback}: {message:?} should say {says}"
        );
    }
    assert_eq!(
        decimal(&app.balance(&tenant).await["available"]),
        decimal(&json!("5"))
    );
    assert_billing_invariants(&app.app.db).await;
}

async fn a_changed_price_is_a_new_version_and_the_past_keeps_its_cost(backend: Backend) {
    let local = LocalServer::start().await;
    let config = TestConfig::new(&local);
    let app = spawn_app_with(backend, config.with_input_price("0.5")).await;
    let first = run_llama_job(&app, &local, "before", 500_000_000).await;
    let [v1] = <[_; 1]>::try_from(price_versions(&app, "llama3-local").await).unwrap();
    assert_eq!(first.model_price_id, v1.id);

    // A redeploy with the same file stores nothing new.
    let app = app.restart(config.with_input_price("0.5")).await;
    assert_eq!(
        price_versions(&app, "llama3-local").await,
        std::slice::from_ref(&v1)
    );

    // A redeploy with a new price stores version 2 and leaves version 1 alone.
    let app = app.restart(config.with_input_price("0.75")).await;
    let versions = price_versions(&app, "llama3-local").await;
    assert_eq!(versions.len(), 2, "{versions:?}");
    assert_eq!(versions[0], v1);
    assert_eq!(versions[1].version, 2);
    assert_eq!(versions[1].provider_input_nanos_per_million, 750_000_000);
    assert_eq!(versions[1].customer_input_nanos_per_million, 1_500_000_000);

    // The earlier attempt still points at version 1 with its cost unchanged.
    let [past] = <[_; 1]>::try_from(attempts_of(&app, first.job_id).await).unwrap();
    assert_eq!(past, first);
    assert_eq!(past.model_price_id, v1.id);

    // A new job runs at version 2.
    let second = run_llama_job(&app, &local, "after", 750_000_000).await;
    assert_eq!(second.model_price_id, versions[1].id);
}
