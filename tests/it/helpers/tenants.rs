//! Tenants as the admin makes them through the contract, with their keys and credits.

use super::app::{ADMIN_TOKEN, TestApp};
use serde_json::{Value, json};
use uuid::Uuid;

/// A tenant and its API key.
#[derive(Clone, Debug)]
pub struct TestTenant {
    pub id: Uuid,
    pub key: String,
}

impl TestApp {
    /// A tenant made through the contract's `CreateTenant`.
    pub async fn create_tenant(&self, name: &str) -> TestTenant {
        let response = self
            .operation(Some(ADMIN_TOKEN), "CreateTenant", json!({"name": name}))
            .await;
        let payload = &response["data"]["createTenant"];
        TestTenant {
            id: payload["tenant"]["id"].as_str().unwrap().parse().unwrap(),
            key: payload["apiKey"].as_str().expect("an API key").to_owned(),
        }
    }

    /// Grants credits through the contract's `GrantCredits`.
    pub async fn grant(&self, tenant: &TestTenant, amount: &str) -> Value {
        self.operation(
            Some(ADMIN_TOKEN),
            "GrantCredits",
            json!({"input": {
                "tenantId": tenant.id,
                "amount": amount,
                "idempotencyKey": Uuid::new_v4().to_string(),
            }}),
        )
        .await
    }

    /// A tenant with `amount` credits.
    pub async fn funded_tenant(&self, name: &str, amount: &str) -> TestTenant {
        let tenant = self.create_tenant(name).await;
        let granted = self.grant(&tenant, amount).await;
        assert!(granted["errors"].is_null(), "grant failed: {granted}");
        tenant
    }

    /// `Account`, returning its balance.
    pub async fn balance(&self, tenant: &TestTenant) -> Value {
        let response = self
            .operation(Some(&tenant.key), "Account", json!({}))
            .await;
        assert!(response["errors"].is_null(), "account failed: {response}");
        response["data"]["account"]["balance"].clone()
    }
}
