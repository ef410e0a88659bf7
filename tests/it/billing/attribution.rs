//! Attributing costs: each `jobCosts` line carries what the client gave the job to
//! recognise it by — its idempotency key, labels and metadata — so a bill can be split
//! by end user, document or upload without a second query per job.

use super::no_workers;
use crate::helpers::{Backend, job_input, spawn_app_with};
use serde_json::{Value, json};

on_both_backends!(cost_lines_carry_the_jobs_key_labels_and_metadata);

const ATTRIBUTED: &str = "query { jobCosts(first: 100) { edges { node {
    jobId idempotencyKey labels { key value } metadata providerCost customerCharge } } } }";

async fn cost_lines_carry_the_jobs_key_labels_and_metadata(backend: Backend) {
    let app = spawn_app_with(backend, no_workers()).await;
    let acme = app.funded_tenant("acme", "5").await;
    let globex = app.funded_tenant("globex", "5").await;
    let mut input = job_input("doc-1", "Summarise it.");
    input["labels"] = json!([{"key": "user", "value": "u-42"}, {"key": "upload", "value": "up-9"}]);
    input["metadata"] = json!({"document": {"pages": 12}, "tags": ["a", "b"]});
    let labelled = app.create_job_ok(&acme, input).await;
    let plain = app
        .create_job_ok(&acme, job_input("doc-2", "Summarise it."))
        .await;
    let mut foreign = job_input("doc-1", "Summarise it.");
    foreign["metadata"] = json!({"secret": "globex"});
    app.create_job_ok(&globex, foreign).await;

    let response = app.graphql(Some(&acme.key), ATTRIBUTED, json!({})).await;
    assert!(response["errors"].is_null(), "{response}");
    let lines: Vec<&Value> = response["data"]["jobCosts"]["edges"]
        .as_array()
        .unwrap()
        .iter()
        .map(|edge| &edge["node"])
        .collect();
    assert_eq!(lines.len(), 2, "only the tenant's own jobs: {response}");
    let line = |id: uuid::Uuid| {
        *lines
            .iter()
            .find(|line| line["jobId"] == id.to_string())
            .unwrap_or_else(|| panic!("no line for {id}: {response}"))
    };
    let first = line(labelled);
    assert_eq!(first["idempotencyKey"], "doc-1");
    assert_eq!(
        first["labels"],
        json!([{"key": "upload", "value": "up-9"}, {"key": "user", "value": "u-42"}])
    );
    assert_eq!(
        first["metadata"],
        json!({"document": {"pages": 12}, "tags": ["a", "b"]})
    );
    let second = line(plain);
    assert_eq!(second["idempotencyKey"], "doc-2");
    assert_eq!(second["labels"], json!([]));
    assert!(second["metadata"].is_null(), "{second}");
    assert!(!response.to_string().contains("globex"), "{response}");
}
