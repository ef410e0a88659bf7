//! The frontend's contract (`operations.graphql`, copied from the shared folder) is
//! served unchanged: each operation is valid against the schema.

use futures_util::StreamExt;
use jobledger::accounts::AdminToken;
use jobledger::app::App;
use jobledger::bus::EventBus;
use jobledger::graphql::build_schema;
use serde_json::{Value, json};

/// The contract as the frontend and dashboards send it.
const OPERATIONS: &str = include_str!("contract/operations.graphql");

/// Operations that open issues deliver, each removed from here when its issue lands.
const NOT_YET_SERVED: &[&str] = &[];

/// The text of one named operation of the contract, comments removed.
pub fn operation(name: &str) -> String {
    operation_in(OPERATIONS, name)
}

/// The text of one named operation of a GraphQL document, comments removed.
pub fn operation_in(document: &str, name: &str) -> String {
    let text: String = document
        .lines()
        .map(|line| line.split('#').next().unwrap_or_default())
        .collect::<Vec<_>>()
        .join("\n");
    let start = ["query", "mutation", "subscription"]
        .iter()
        .find_map(|keyword| {
            let header = format!("{keyword} {name}");
            text.match_indices(&header)
                .find(|(index, _)| {
                    let after = text[index + header.len()..].chars().next();
                    matches!(after, Some('(' | ' ' | '{'))
                })
                .map(|(index, _)| index)
        })
        .unwrap_or_else(|| panic!("operation {name} is not in the document"));
    let mut depth = 0;
    for (offset, character) in text[start..].char_indices() {
        match character {
            '{' => depth += 1,
            '}' => {
                depth -= 1;
                if depth == 0 {
                    return text[start..=start + offset].to_owned();
                }
            }
            _ => {}
        }
    }
    panic!("operation {name} never closes");
}

/// Every operation name of the contract, in order.
fn operation_names() -> Vec<String> {
    operation_names_in(OPERATIONS)
}

/// Every operation name of a GraphQL document, in order.
pub fn operation_names_in(document: &str) -> Vec<String> {
    document
        .lines()
        .filter_map(|line| {
            let mut words = line.split_whitespace();
            let keyword = words.next()?;
            ["query", "mutation", "subscription"]
                .contains(&keyword)
                .then(|| words.next())?
                .map(|name| name.split('(').next().unwrap_or(name).to_owned())
        })
        .collect()
}

/// Plausible variables for each operation, so that validation sees real values.
fn variables(name: &str) -> Value {
    let id = "0193b5c0-0000-7000-8000-000000000000";
    match name {
        "CreateJob" => json!({"input": {
            "idempotencyKey": "k", "model": "gpt-4o-mini",
            "messages": [{"role": "user", "content": "hi"}], "maxOutputTokens": 10,
            "responseSchema": {"type": "object"}, "maxAttempts": 2,
            "retryUnknownOutcome": false, "metadata": {"a": 1}, "fallbackModels": ["gpt-4o"]
        }}),
        "CancelJob" | "Job" | "JobSchedule" | "JobLifecycle" => json!({"id": id}),
        "Jobs" => json!({"first": 5, "after": null, "status": "QUEUED"}),
        "JobByKey" => json!({"key": "k"}),
        "RerunJob" => json!({"id": id, "idempotencyKey": "k"}),
        "JobsByLabel" => json!({"key": "doc", "value": "d1", "first": 5, "after": id}),
        "JobUpdates" => json!({"jobId": id, "afterSeq": 1}),
        "JobOutput" => json!({"jobId": id}),
        "JobCosts" => json!({
            "from": "2026-01-01T00:00:00Z", "to": "2026-02-01T00:00:00.5Z", "first": 5, "after": id
        }),
        "BillingSummary" => json!({"from": "2026-01-01T00:00:00Z", "to": "2026-02-01T00:00:00Z"}),
        "BillingSeries" => json!({
            "from": "2026-01-01T00:00:00Z", "to": "2026-02-01T00:00:00Z", "interval": "DAY"
        }),
        "BillingByLabel" => json!({
            "from": "2026-01-01T00:00:00Z", "to": "2026-02-01T00:00:00Z", "key": "customer"
        }),
        "CreditLedger" => json!({"first": 5, "after": id}),
        "CreateTenant" => json!({"name": "acme"}),
        "CreateApiKey" => json!({"name": "ci", "tenantId": id}),
        "RevokeApiKey" => json!({"id": id}),
        "ApiKeys" => json!({"tenantId": id}),
        "GrantCredits" => {
            json!({"input": {"tenantId": id, "amount": "1.5", "idempotencyKey": "g", "reason": "r"}})
        }
        "CreateWebhook" => json!({"input": {
            "url": "https://example.com/hook", "events": ["JOB_SUCCEEDED", "BALANCE_LOW"]
        }}),
        "DeleteWebhook" => json!({"id": id}),
        "WebhookDeliveries" => json!({"first": 5, "after": id}),
        "CreateBatch" => json!({"input": {
            "idempotencyKey": "b", "name": "contracts", "mode": "REALTIME", "model": "gpt-4o-mini",
            "maxOutputTokens": 10, "responseSchema": {"type": "object"}, "maxAttempts": 2,
            "priority": 3, "deadline": null, "metadata": {"a": 1}
        }}),
        "AddBatchItems" => json!({"batchId": id, "items": [{
            "customId": "doc-1", "messages": [{"role": "user", "content": "hi"}],
            "maxOutputTokens": 5, "metadata": {"page": 1}
        }]}),
        "CloseBatch" | "CancelBatch" | "Batch" | "JobBatch" => json!({"id": id}),
        "Batches" => json!({"first": 5, "after": id}),
        "BatchJobs" => json!({"id": id, "first": 5, "after": id, "status": "SUCCEEDED"}),
        "BatchUpdates" => json!({"id": id}),
        "CreateAccessToken" => json!({"input": {
            "scopes": ["READ_JOBS", "CREATE_JOBS"], "labels": [{"key": "user", "value": "u1"}],
            "jobIds": null, "ttlSeconds": 900, "maxSpend": "2.5", "tenantId": null
        }}),
        "SetTenantLimits" => json!({"input": {
            "tenantId": id, "dailySpendLimit": "10", "monthlySpendLimit": null,
            "requestsPerMinute": 60, "tokensPerMinute": 100000, "lowBalanceThreshold": "2.5"
        }}),
        _ => json!({}),
    }
}

/// Each served operation passes validation and reaches its resolver, which refuses
/// the anonymous caller with UNAUTHENTICATED; each not-yet-served one fails
/// validation. When a pending operation starts to validate, this test asks for
/// `NOT_YET_SERVED` to shrink.
#[tokio::test]
async fn every_contract_operation_is_served_or_listed_as_pending() {
    let directory = tempfile::tempdir().unwrap();
    let db = jobledger::db::connect(&format!(
        "sqlite:{}",
        directory.path().join("c.db").display()
    ))
    .await
    .unwrap();
    jobledger::db::migrate(&db).await.unwrap();
    let schema = build_schema(App {
        db,
        bus: EventBus::default(),
        admin_token: AdminToken::new("admin"),
        providers: crate::helpers::simulated_models(),
        metrics: Default::default(),
        worker_db: None,
        background_db: None,
        allow_private_webhooks: false,
        default_deadline: jobledger::jobs::input::DEFAULT_DEADLINE,
        charging: Default::default(),
        measuring: jobledger::jobs::measuring::Measuring::per_core(),
    });
    let names = operation_names();
    assert!(names.len() >= 12, "the contract lost operations: {names:?}");
    for name in names {
        let document = operation(&name);
        let request = async_graphql::Request::new(document.clone())
            .variables(async_graphql::Variables::from_json(variables(&name)));
        let response = if document.starts_with("subscription") {
            schema.execute_stream(request).next().await.unwrap()
        } else {
            schema.execute(request).await
        };
        let errors = serde_json::to_value(&response.errors).unwrap();
        let codes: Vec<_> = errors
            .as_array()
            .unwrap()
            .iter()
            .map(|error| {
                error["extensions"]["code"]
                    .as_str()
                    .unwrap_or("none")
                    .to_owned()
            })
            .collect();
        let reached_resolvers =
            !codes.is_empty() && codes.iter().all(|code| code == "UNAUTHENTICATED");
        if NOT_YET_SERVED.contains(&name.as_str()) {
            assert!(
                !reached_resolvers,
                "{name} is served now: remove it from NOT_YET_SERVED"
            );
        } else {
            assert!(
                reached_resolvers,
                "{name} is not served as the contract sends it: {errors}"
            );
        }
    }
}

/// The copy under tests/ is the shared contract, when the shared folder is beside
/// the checkout (as in CI and on developer machines).
#[test]
fn the_copied_contract_matches_the_shared_one() {
    let shared = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../shared/contract/operations.graphql");
    match std::fs::read_to_string(&shared) {
        Ok(text) => assert_eq!(
            text,
            OPERATIONS,
            "tests/it/contract/operations.graphql is stale: copy {}",
            shared.display()
        ),
        Err(_) => eprintln!("{} not found: the copy was not compared", shared.display()),
    }
}
