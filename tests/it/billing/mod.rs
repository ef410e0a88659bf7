//! The billing dashboards (`JobCosts`, `BillingSummary`, `CreditLedger`) against sums
//! computed here from the rows: figures, time windows, paging, tenant isolation and
//! the admin variants.

mod attribution;
mod dashboards;
mod figures;
mod paging;
mod series;

use crate::helpers::{AppOptions, TestApp, decimal};
use chrono::{DateTime, SecondsFormat, Utc};
use entity::{JobStatus, Timestamp, ledger_entries};
use rust_decimal::Decimal;
use serde_json::{Value, json};
use std::time::Duration;
use uuid::Uuid;

const LIMIT: Duration = Duration::from_secs(60);

fn no_workers() -> AppOptions {
    AppOptions::no_workers()
}

/// An amount of nano-credits as the API shows it.
fn credits(nanos: i64) -> Decimal {
    Decimal::new(nanos, 9)
}

fn rfc3339(at: DateTime<Utc>) -> String {
    at.to_rfc3339_opts(SecondsFormat::Micros, true)
}

fn at(timestamp: Timestamp) -> String {
    rfc3339(timestamp.to_datetime())
}

/// A contract operation with an extra `tenantId` argument, as an admin (or a curious
/// tenant) sends it: the same selection set as the contract.
fn with_tenant_id(name: &str) -> String {
    let mut text = crate::contract::operation(name);
    let header_end = text.find(')').expect("the operation has variables");
    text.insert_str(header_end, ", $tenantId: UUID");
    let body = text.find('{').unwrap();
    let arguments_end = body + text[body..].find(')').expect("the field has arguments");
    text.insert_str(arguments_end, ", tenantId: $tenantId");
    text
}

/// A contract operation asking for the fields the schema offers beyond the contract.
fn with_extra_fields(name: &str) -> String {
    let text = crate::contract::operation(name);
    let extended = match name {
        "JobCosts" => text.replacen("jobId", "jobId tenantId unknownAttempts marginAtWorst", 1),
        "BillingSummary" => text
            .replacen("margin", "margin providerCostUpperBound marginAtWorst", 1)
            .replacen(
                "customerCharges }",
                "customerCharges providerCostUpperBound margin marginAtWorst }",
                1,
            ),
        _ => panic!("no extra fields for {name}"),
    };
    assert_ne!(extended, text, "the contract's {name} changed");
    extended
}

async fn as_tenant_of(
    app: &TestApp,
    key: &str,
    name: &str,
    tenant_id: Uuid,
    mut variables: Value,
) -> Value {
    variables["tenantId"] = json!(tenant_id);
    app.graphql(Some(key), &with_tenant_id(name), variables)
        .await
}

/// `data.<field>` of a response that must have no errors.
fn data<'a>(response: &'a Value, field: &str) -> &'a Value {
    assert!(response["errors"].is_null(), "{field} failed: {response}");
    &response["data"][field]
}

fn status_name(status: JobStatus) -> String {
    format!("{status:?}").to_uppercase()
}

/// One page of a connection: its nodes and its `pageInfo`.
struct ConnectionPage {
    nodes: Vec<Value>,
    page_info: Value,
}

/// Every page of the connection `field` that `operation` answers (as `key` sees it),
/// walking the cursors from the first page; `variables` minus `after`.
async fn pages(
    app: &TestApp,
    key: &str,
    operation: &str,
    field: &str,
    variables: Value,
) -> Vec<ConnectionPage> {
    let mut pages = Vec::new();
    let mut after = Value::Null;
    loop {
        let mut page_variables = variables.clone();
        page_variables["after"] = after.clone();
        let response = app.operation(Some(key), operation, page_variables).await;
        let connection = data(&response, field);
        let nodes: Vec<_> = connection["edges"]
            .as_array()
            .unwrap()
            .iter()
            .map(|edge| edge["node"].clone())
            .collect();
        let page_info = connection["pageInfo"].clone();
        let last = page_info["hasNextPage"] == false;
        assert!(
            last || !nodes.is_empty(),
            "a page with more after it is not empty"
        );
        after = page_info["endCursor"].clone();
        pages.push(ConnectionPage { nodes, page_info });
        if last {
            return pages;
        }
    }
}

/// The jobs of every page of `JobCosts` (as `key` sees it), walking the cursors.
async fn all_job_cost_pages(app: &TestApp, key: &str, variables: Value) -> Vec<Value> {
    pages(app, key, "JobCosts", "jobCosts", variables)
        .await
        .into_iter()
        .flat_map(|page| page.nodes)
        .collect()
}

fn job_ids(nodes: &[Value]) -> Vec<Uuid> {
    nodes
        .iter()
        .map(|node| node["jobId"].as_str().unwrap().parse().unwrap())
        .collect()
}

fn assert_ledger_entry(node: &Value, entry: &ledger_entries::Model) {
    assert_eq!(node["id"], entry.id.to_string(), "{node}");
    assert_eq!(
        node["kind"],
        format!("{:?}", entry.kind).to_uppercase(),
        "{node}"
    );
    assert_eq!(
        decimal(&node["amount"]),
        credits(entry.amount_nanos),
        "{node}"
    );
    assert!(decimal(&node["amount"]) > Decimal::ZERO);
    assert_eq!(node["jobId"], json!(entry.job_id), "{node}");
    let created: DateTime<Utc> = node["createdAt"].as_str().unwrap().parse().unwrap();
    assert_eq!(created, entry.created_at.to_datetime());
}
