//! What each process serves: a worker started without the provider a job was routed
//! to fails it unsent, and a bad file stops the start before the database is touched.

use super::{LocalServer, TestConfig, attempts_of, llama_job, settings_without_database};
use crate::helpers::{AppOptions, Backend, decimal, spawn_app_with};
use jobledger::startup::{Application, StartupError};
use rust_decimal::Decimal;
use std::time::Duration;

on_both_backends!(
    a_worker_that_serves_no_provider_for_the_model_fails_the_job_unsent,
    a_worker_without_providers_does_not_simulate_a_job_routed_to_a_real_one,
);

/// The API process runs with no provider (the simulator serves every model), the
/// worker process with a real one: a job the API accepted for a model the worker
/// cannot route ends without any call.
async fn a_worker_that_serves_no_provider_for_the_model_fails_the_job_unsent(backend: Backend) {
    let local = LocalServer::start().await;
    let config = TestConfig::new(&local);
    let api = spawn_app_with(backend, AppOptions::no_workers()).await;
    let worker = api.another_process(config.with_input_price("0.5")).await;
    let tenant = api.funded_tenant("acme", "5").await;
    let id = api
        .create_job_ok(&tenant, crate::helpers::job_input("unrouted", "hello"))
        .await;
    let job = api
        .wait_until_finished(&tenant, id, Duration::from_secs(15))
        .await;
    assert_eq!(job["status"], "FAILED", "{job}");
    assert_eq!(job["error"]["code"], "MODEL_NOT_SERVED", "{job}");
    let attempt = &job["attempts"][0];
    assert_eq!(attempt["outcome"], "PERMANENT_ERROR", "{attempt}");
    assert_eq!(attempts_of(&api, id).await[0].provider, "unrouted");
    assert_eq!(decimal(&attempt["providerCost"]), Decimal::ZERO);
    assert_eq!(job["reservation"]["status"], "RELEASED");
    assert!(api.simulator.calls().is_empty() && local.simulator.calls().is_empty());
    crate::invariants::assert_billing_invariants(&api.app.db).await;
    drop(worker);
}

/// The API routes the model to a real provider; a worker process started without any
/// provider would fall back to the simulator: it must not simulate this job (a real
/// price for a simulated reply), nor call anything.
async fn a_worker_without_providers_does_not_simulate_a_job_routed_to_a_real_one(backend: Backend) {
    let local = LocalServer::start().await;
    let config = TestConfig::new(&local);
    let api = spawn_app_with(
        backend,
        AppOptions {
            worker: None,
            ..config.with_input_price("0.5")
        },
    )
    .await;
    let worker = api.another_process(AppOptions::default()).await;
    let tenant = api.funded_tenant("acme", "5").await;
    let id = api
        .create_job_ok(&tenant, llama_job("routed-for-real"))
        .await;
    let job = api
        .wait_until_finished(&tenant, id, Duration::from_secs(15))
        .await;
    assert_eq!(job["status"], "FAILED", "{job}");
    assert_eq!(job["error"]["code"], "MODEL_NOT_SERVED", "{job}");
    assert!(job["charge"].is_null());
    assert!(api.simulator.calls().is_empty() && local.simulator.calls().is_empty());
    crate::invariants::assert_billing_invariants(&api.app.db).await;
    drop(worker);
}

#[tokio::test]
async fn a_bad_config_file_stops_the_start_before_the_database_is_touched() {
    let folder = tempfile::tempdir().unwrap();
    let path = folder.path().join("jobledger.toml");
    std::fs::write(&path, "[models.m]\nprovider = \"nowhere\"\n").unwrap();
    let mut settings = settings_without_database();
    settings.config_file = Some(path.clone());
    let Err(error) = Application::build(settings).await else {
        panic!("the application started with a bad config file");
    };
    assert!(matches!(error, StartupError::Config(_)), "{error:?}");
    let message = error.to_string();
    assert!(
        message.contains(&path.display().to_string())
            && message.contains("`models.m.provider`")
            && message.contains("unknown provider \"nowhere\""),
        "{message}"
    );
}
