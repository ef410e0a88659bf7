//! Access tokens (`createAccessToken`): a browser's short-lived credential that reads,
//! creates or cancels only the jobs within its reach, holds no more than its
//! `maxSpend`, and stops working when it expires — over HTTP, WebSocket and SSE.

use crate::contract::operation;
use crate::helpers::{
    AppOptions, Backend, TestApp, TestTenant, decimal, error_code, job_input, spawn_app,
    spawn_app_with,
};
use crate::invariants::assert_billing_invariants;
use crate::socket::{GraphqlSocket, Received};
use rust_decimal::Decimal;
use serde_json::{Value, json};
use std::time::{Duration, Instant};
use uuid::Uuid;

mod lifetime;
mod minting;
mod reach;

/// Mints a token with `input` (scopes, labels, …) for `minter`; returns it as a
/// tenant of the same id whose key is the token, so the job helpers take it.
async fn mint(app: &TestApp, minter: &str, tenant: &TestTenant, input: Value) -> TestTenant {
    let response = app
        .operation(Some(minter), "CreateAccessToken", json!({"input": input}))
        .await;
    assert!(response["errors"].is_null(), "{response}");
    let token = response["data"]["createAccessToken"]["token"]
        .as_str()
        .unwrap()
        .to_owned();
    assert!(token.starts_with("jlt_"), "{token}");
    TestTenant {
        id: tenant.id,
        key: token,
    }
}

fn labelled(key: &str, labels: Value) -> Value {
    let mut input = job_input(key, "Summarise the document.");
    input["labels"] = labels;
    input
}

fn user(value: &str) -> Value {
    json!([{"key": "user", "value": value}])
}

async fn job_as(app: &TestApp, credential: &TestTenant, id: Uuid) -> Value {
    app.operation(Some(&credential.key), "Job", json!({"id": id}))
        .await
}

async fn listed_ids(app: &TestApp, credential: &TestTenant) -> Vec<String> {
    let response = app
        .operation(Some(&credential.key), "Jobs", json!({"first": 100}))
        .await;
    assert!(response["errors"].is_null(), "{response}");
    let mut ids: Vec<String> = response["data"]["jobs"]["edges"]
        .as_array()
        .unwrap()
        .iter()
        .map(|edge| edge["node"]["id"].as_str().unwrap().to_owned())
        .collect();
    ids.sort();
    ids
}

fn sorted(ids: &[Uuid]) -> Vec<String> {
    let mut ids: Vec<String> = ids.iter().map(Uuid::to_string).collect();
    ids.sort();
    ids
}
