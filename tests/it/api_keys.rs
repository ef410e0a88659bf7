//! API keys managed through the API: a tenant creates, lists and revokes its own; an
//! admin names the tenant; a revoked key is refused from the next request on.

use crate::helpers::{ADMIN_TOKEN, AppOptions, Backend, error_code, spawn_app_with};
use serde_json::{Value, json};

on_both_backends!(
    a_tenant_manages_its_own_keys,
    keys_are_managed_only_within_their_tenant,
);

fn keys(listed: &Value) -> &Vec<Value> {
    listed["data"]["apiKeys"]
        .as_array()
        .unwrap_or_else(|| panic!("no keys in {listed}"))
}

async fn a_tenant_manages_its_own_keys(backend: Backend) {
    let app = spawn_app_with(backend, AppOptions::no_workers()).await;
    let tenant = app.funded_tenant("acme", "5").await;

    let created = app
        .operation(Some(&tenant.key), "CreateApiKey", json!({"name": "ci"}))
        .await;
    assert!(created["errors"].is_null(), "{created}");
    let secret = created["data"]["createApiKey"]["apiKey"]
        .as_str()
        .unwrap()
        .to_owned();
    let key = &created["data"]["createApiKey"]["key"];
    assert_eq!(key["name"], "ci");
    assert!(secret.starts_with(key["prefix"].as_str().unwrap()));
    let key_id = key["id"].as_str().unwrap().to_owned();

    // The new key works, and its use is recorded.
    let account = app
        .graphql(Some(&secret), "{ account { id } }", json!({}))
        .await;
    assert_eq!(account["data"]["account"]["id"], tenant.id.to_string());
    let listed = app.operation(Some(&tenant.key), "ApiKeys", json!({})).await;
    assert_eq!(
        keys(&listed).len(),
        2,
        "the first key and the new one: {listed}"
    );
    let listed_key = &keys(&listed)[0];
    assert_eq!(listed_key["id"], key_id, "newest first");
    assert!(listed_key["lastUsedAt"].is_string(), "{listed_key}");
    assert!(listed_key["revokedAt"].is_null());
    assert!(
        !listed.to_string().contains(&secret),
        "a listing never shows a secret"
    );

    let revoked = app
        .operation(Some(&tenant.key), "RevokeApiKey", json!({"id": key_id}))
        .await;
    let revoked_at = revoked["data"]["revokeApiKey"]["revokedAt"].clone();
    assert!(revoked_at.is_string(), "{revoked}");
    let refused = app
        .graphql(Some(&secret), "{ account { id } }", json!({}))
        .await;
    assert_eq!(error_code(&refused), "UNAUTHENTICATED");
    // Revoking again changes nothing.
    let again = app
        .operation(Some(&tenant.key), "RevokeApiKey", json!({"id": key_id}))
        .await;
    assert_eq!(again["data"]["revokeApiKey"]["revokedAt"], revoked_at);
    // The tenant's first key is untouched.
    let account = app
        .graphql(Some(&tenant.key), "{ account { id } }", json!({}))
        .await;
    assert!(account["errors"].is_null(), "{account}");

    let control = app
        .operation(
            Some(&tenant.key),
            "CreateApiKey",
            json!({"name": "bad\u{0}name"}),
        )
        .await;
    assert_eq!(error_code(&control), "VALIDATION");
    let spoof = app
        .operation(
            Some(&tenant.key),
            "CreateApiKey",
            json!({"name": "ci\u{202E}gnp.exe"}),
        )
        .await;
    assert_eq!(error_code(&spoof), "VALIDATION");
    let long = app
        .operation(
            Some(&tenant.key),
            "CreateApiKey",
            json!({"name": "n".repeat(101)}),
        )
        .await;
    assert_eq!(error_code(&long), "VALIDATION");
}

async fn keys_are_managed_only_within_their_tenant(backend: Backend) {
    let app = spawn_app_with(backend, AppOptions::no_workers()).await;
    let acme = app.funded_tenant("acme", "5").await;
    let globex = app.funded_tenant("globex", "5").await;
    let listed = app.operation(Some(&acme.key), "ApiKeys", json!({})).await;
    let acme_key = keys(&listed)[0]["id"].as_str().unwrap().to_owned();

    let revoke = app
        .operation(Some(&globex.key), "RevokeApiKey", json!({"id": acme_key}))
        .await;
    assert_eq!(error_code(&revoke), "NOT_FOUND");
    let peek = app
        .operation(Some(&globex.key), "ApiKeys", json!({"tenantId": acme.id}))
        .await;
    assert_eq!(error_code(&peek), "FORBIDDEN");
    let plant = app
        .operation(
            Some(&globex.key),
            "CreateApiKey",
            json!({"name": "x", "tenantId": acme.id}),
        )
        .await;
    assert_eq!(error_code(&plant), "FORBIDDEN");
    let still = app
        .graphql(Some(&acme.key), "{ account { id } }", json!({}))
        .await;
    assert!(
        still["errors"].is_null(),
        "the stranger's revoke changed nothing"
    );

    // An admin names the tenant.
    let unnamed = app
        .operation(Some(ADMIN_TOKEN), "CreateApiKey", json!({"name": "x"}))
        .await;
    assert_eq!(error_code(&unnamed), "VALIDATION");
    let unknown = app
        .operation(
            Some(ADMIN_TOKEN),
            "CreateApiKey",
            json!({"name": "x", "tenantId": uuid::Uuid::new_v4()}),
        )
        .await;
    assert_eq!(error_code(&unknown), "NOT_FOUND");
    let made = app
        .operation(
            Some(ADMIN_TOKEN),
            "CreateApiKey",
            json!({"name": "support", "tenantId": acme.id}),
        )
        .await;
    assert!(made["errors"].is_null(), "{made}");
    let listed = app
        .operation(Some(ADMIN_TOKEN), "ApiKeys", json!({"tenantId": acme.id}))
        .await;
    assert_eq!(keys(&listed).len(), 2);
    let revoked = app
        .operation(Some(ADMIN_TOKEN), "RevokeApiKey", json!({"id": acme_key}))
        .await;
    assert!(revoked["errors"].is_null(), "{revoked}");
    let refused = app
        .graphql(Some(&acme.key), "{ account { id } }", json!({}))
        .await;
    assert_eq!(error_code(&refused), "UNAUTHENTICATED");
}
