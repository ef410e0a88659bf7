//! Tenants, keys, grants and who may see what.

use crate::helpers::{
    ADMIN_TOKEN, AppOptions, Backend, decimal, error_code, job_input, spawn_app_with,
};
use crate::invariants::assert_billing_invariants;
use rust_decimal::Decimal;
use serde_json::json;
use std::str::FromStr;
use std::time::Duration;

on_both_backends!(
    a_tenant_sees_only_its_own_jobs,
    requests_without_a_valid_key_are_refused,
    grants_are_idempotent_and_exact_to_the_nano_credit,
);

async fn a_tenant_sees_only_its_own_jobs(backend: Backend) {
    let app = spawn_app_with(backend, AppOptions::no_workers()).await;
    let owner = app.funded_tenant("acme", "5").await;
    let stranger = app.funded_tenant("globex", "5").await;
    let id = app
        .create_job_ok(&owner, job_input("private", "hello"))
        .await;

    let read = app
        .operation(Some(&stranger.key), "Job", json!({"id": id}))
        .await;
    assert_eq!(error_code(&read), "NOT_FOUND");
    let cancel = app
        .operation(Some(&stranger.key), "CancelJob", json!({"id": id}))
        .await;
    assert_eq!(error_code(&cancel), "NOT_FOUND");
    assert_eq!(
        app.job(&owner, id).await["status"],
        "QUEUED",
        "the stranger's cancel changed nothing"
    );
    let listed = app.operation(Some(&stranger.key), "Jobs", json!({})).await;
    assert_eq!(listed["data"]["jobs"]["edges"], json!([]));
    let subscription = app
        .subscribe(
            &stranger.key,
            &crate::contract::operation("JobUpdates"),
            json!({"jobId": id}),
            Duration::from_secs(10),
        )
        .await;
    // The refusal arrives as the subscription's only result, carrying no event.
    let payloads = subscription.expect("the server answers the subscription");
    assert_eq!(payloads.len(), 1, "{payloads:?}");
    assert!(payloads[0]["data"].is_null());
    assert_eq!(error_code(&payloads[0]), "NOT_FOUND");
    // The stranger's own balance is untouched by the owner's hold.
    assert_eq!(
        decimal(&app.balance(&stranger).await["held"]),
        Decimal::ZERO
    );
}

async fn requests_without_a_valid_key_are_refused(backend: Backend) {
    let app = spawn_app_with(backend, AppOptions::no_workers()).await;
    let tenant = app.funded_tenant("acme", "5").await;
    let anonymous = app.operation(None, "Account", json!({})).await;
    assert_eq!(error_code(&anonymous), "UNAUTHENTICATED");

    let response = app
        .http
        .post(format!("http://{}/graphql", app.address))
        .bearer_auth("jl_not_a_key")
        .json(&json!({"query": "{ account { id } }"}))
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 401);
    let body: serde_json::Value = response.json().await.unwrap();
    assert_eq!(error_code(&body), "UNAUTHENTICATED");

    // Tenants cannot administer; the admin has no tenant account.
    let forbidden = app
        .operation(Some(&tenant.key), "CreateTenant", json!({"name": "x"}))
        .await;
    assert_eq!(error_code(&forbidden), "FORBIDDEN");
    let grant = app
        .operation(
            Some(&tenant.key),
            "GrantCredits",
            json!({"input": {"tenantId": tenant.id, "amount": "100", "idempotencyKey": "self"}}),
        )
        .await;
    assert_eq!(error_code(&grant), "FORBIDDEN");
    let admin_account = app.operation(Some(ADMIN_TOKEN), "Account", json!({})).await;
    assert_eq!(error_code(&admin_account), "FORBIDDEN");
    assert_eq!(
        decimal(&app.balance(&tenant).await["granted"]),
        Decimal::from(5)
    );
}

async fn grants_are_idempotent_and_exact_to_the_nano_credit(backend: Backend) {
    let app = spawn_app_with(backend, AppOptions::no_workers()).await;
    let tenant = app.create_tenant("acme").await;
    let grant = |amount: &str, key: &str| {
        app.operation(
            Some(ADMIN_TOKEN),
            "GrantCredits",
            json!({"input": {"tenantId": tenant.id, "amount": amount, "idempotencyKey": key}}),
        )
    };
    let first = grant("123456789.123456789", "topup-1").await;
    assert_eq!(
        first["data"]["grantCredits"]["amount"], "123456789.123456789",
        "{first}"
    );
    let again = grant("123456789.123456789", "topup-1").await;
    assert_eq!(
        again["data"]["grantCredits"]["id"],
        first["data"]["grantCredits"]["id"]
    );
    assert_eq!(
        error_code(&grant("5", "topup-1").await),
        "IDEMPOTENCY_CONFLICT"
    );
    assert_eq!(
        error_code(&grant("0.0000000001", "tiny").await),
        "VALIDATION"
    );
    assert_eq!(error_code(&grant("-1", "negative").await), "VALIDATION");
    assert!(grant("0.000000001", "one-nano").await["errors"].is_null());

    // A JSON number with a fraction would reach the server as a float: refused.
    let float = app
        .graphql(
            Some(ADMIN_TOKEN),
            "mutation($input: GrantCreditsInput!) { grantCredits(input: $input) { amount } }",
            json!({"input": {"tenantId": tenant.id, "amount": 12.5, "idempotencyKey": "float"}}),
        )
        .await;
    assert!(
        float["errors"][0]["message"]
            .as_str()
            .unwrap()
            .contains("as strings"),
        "{float}"
    );
    // A whole number is exact either way.
    let whole = app
        .graphql(
            Some(ADMIN_TOKEN),
            "mutation($input: GrantCreditsInput!) { grantCredits(input: $input) { amount } }",
            json!({"input": {"tenantId": tenant.id, "amount": 2, "idempotencyKey": "whole"}}),
        )
        .await;
    assert_eq!(whole["data"]["grantCredits"]["amount"], "2", "{whole}");

    let balance = app.balance(&tenant).await;
    let expected = Decimal::from_str("123456791.12345679").unwrap();
    assert_eq!(decimal(&balance["granted"]), expected);
    assert_eq!(balance["available"], "123456791.12345679");
    assert_billing_invariants(&app.app.db).await;
}
