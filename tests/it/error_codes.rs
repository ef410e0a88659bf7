//! Every error carries an `extensions.code` that the schema declares, and
//! `docs/errors.md` documents every code the schema declares.

use crate::helpers::{AppOptions, Backend, TestApp, spawn_app_with};
use async_graphql::parser::types::{TypeKind, TypeSystemDefinition};
use futures_util::StreamExt;
use serde_json::{Value, json};
use std::collections::BTreeSet;
use std::time::Duration;
use tokio_tungstenite::tungstenite::Message;

/// The values of the enum `name` in the served schema.
fn schema_enum(name: &str) -> BTreeSet<String> {
    let document = async_graphql::parser::parse_schema(jobledger::graphql::sdl()).unwrap();
    document
        .definitions
        .iter()
        .find_map(|definition| match definition {
            TypeSystemDefinition::Type(definition) if definition.node.name.node == name => {
                match &definition.node.kind {
                    TypeKind::Enum(values) => Some(
                        values
                            .values
                            .iter()
                            .map(|value| value.node.value.node.to_string())
                            .collect(),
                    ),
                    _ => None,
                }
            }
            _ => None,
        })
        .unwrap_or_else(|| panic!("the schema has no enum {name}"))
}

/// The codes of the table under the heading that starts with `heading`, after
/// checking that its header names the columns every table must have.
fn documented_codes(heading: &str) -> BTreeSet<String> {
    let text = std::fs::read_to_string(
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("docs/errors.md"),
    )
    .unwrap();
    let section = text
        .split("\n## ")
        .find(|section| section.starts_with(heading))
        .unwrap_or_else(|| panic!("docs/errors.md has no section {heading}"));
    let mut rows = section.lines().filter(|line| line.starts_with('|'));
    let header = rows.next().expect("the section has a table");
    for column in ["code", "when it happens", "retried", "charged"] {
        assert!(
            header.split('|').any(|cell| cell.trim() == column),
            "the table of {heading} has no column {column}: {header}"
        );
    }
    rows.skip(1)
        .map(|row| {
            let cell = row.split('|').nth(1).unwrap().trim();
            cell.strip_prefix('`')
                .and_then(|cell| cell.strip_suffix('`'))
                .unwrap_or_else(|| panic!("not a code: {cell}"))
                .to_owned()
        })
        .collect()
}

#[test]
fn the_errors_table_lists_every_code_of_the_schema_and_no_other() {
    for (heading, name) in [
        ("API errors", "ApiErrorCode"),
        ("Job and attempt errors", "JobErrorCode"),
    ] {
        let schema = schema_enum(name);
        let documented = documented_codes(heading);
        let missing: Vec<_> = schema.difference(&documented).collect();
        let unknown: Vec<_> = documented.difference(&schema).collect();
        assert!(
            missing.is_empty() && unknown.is_empty(),
            "docs/errors.md, {heading}: missing {missing:?}, not in {name} {unknown:?}"
        );
    }
}

/// What a job or attempt row stores is what the schema's enum names.
#[test]
fn stored_job_error_codes_are_the_schema_names() {
    use entity::JobErrorCode;
    let stored: BTreeSet<String> = JobErrorCode::ALL
        .iter()
        .map(|code| code.as_str().to_owned())
        .collect();
    assert_eq!(stored, schema_enum("JobErrorCode"));
    for code in JobErrorCode::ALL {
        assert_eq!(JobErrorCode::parse(code.as_str()), Some(code));
    }
}

/// POSTs `query` with `variables` asking for `accept`; the status and the body.
async fn post(app: &TestApp, accept: &str, query: &str, variables: Value) -> (u16, Value) {
    let response = app
        .http
        .post(app.url())
        .header("accept", accept)
        .json(&json!({"query": query, "variables": variables}))
        .send()
        .await
        .unwrap();
    (response.status().as_u16(), response.json().await.unwrap())
}

fn codes(body: &Value) -> Vec<&str> {
    body["errors"]
        .as_array()
        .unwrap_or_else(|| panic!("no errors in {body}"))
        .iter()
        .map(|error| error["extensions"]["code"].as_str().unwrap_or("none"))
        .collect()
}

#[tokio::test]
async fn parse_and_validation_errors_carry_codes_over_http() {
    let app = spawn_app_with(Backend::Sqlite, AppOptions::no_workers()).await;
    let wrong_variable = "query ($first: Int) { tenants(first: $first) { edges { cursor } } }";
    for (query, variables, code) in [
        ("{ account { id ", json!({}), "GRAPHQL_PARSE_FAILED"),
        ("{ noSuchField }", json!({}), "GRAPHQL_VALIDATION_FAILED"),
        (
            wrong_variable,
            json!({"first": "ten"}),
            "GRAPHQL_VALIDATION_FAILED",
        ),
        (
            "query A { account { id } } query B { account { id } }",
            json!({}),
            "GRAPHQL_VALIDATION_FAILED",
        ),
    ] {
        for (accept, status) in [
            ("application/json", 200),
            ("application/graphql-response+json", 400),
        ] {
            let (got, body) = post(&app, accept, query, variables.clone()).await;
            assert_eq!(got, status, "{query} as {accept}: {body}");
            assert!(body.get("data").is_none(), "{query}: {body}");
            let codes = codes(&body);
            assert!(
                !codes.is_empty() && codes.iter().all(|got| *got == code),
                "{query} as {accept}: {body}"
            );
        }
    }
}

#[tokio::test]
async fn requests_that_are_not_graphql_requests_are_bad_requests() {
    let app = spawn_app_with(Backend::Sqlite, AppOptions::no_workers()).await;
    let no_query = app
        .http
        .post(app.url())
        .json(&json!({"variables": {}}))
        .send()
        .await
        .unwrap();
    assert_eq!(no_query.status(), 400);
    assert_eq!(codes(&no_query.json().await.unwrap()), ["BAD_REQUEST"]);
    let not_json = app
        .http
        .post(app.url())
        .header("content-type", "text/plain")
        .body("{ account { id } }")
        .send()
        .await
        .unwrap();
    assert_eq!(not_json.status(), 415);
    assert_eq!(codes(&not_json.json().await.unwrap()), ["BAD_REQUEST"]);
}

/// Subscribes over graphql-transport-ws and returns the errors the server answers
/// with: those of a `next` message (async-graphql sends a document it refused as a
/// result holding only errors) or of an `error` message.
async fn refused_subscription(app: &TestApp, key: &str, query: &str, variables: Value) -> Value {
    let mut socket = app.subscribed_socket(key, query, variables).await;
    let refusal = async {
        while let Some(message) = socket.next().await {
            let Message::Text(text) = message.unwrap() else {
                continue;
            };
            let message: Value = serde_json::from_str(&text).unwrap();
            match message["type"].as_str().unwrap() {
                "error" => return message["payload"].clone(),
                "next" => {
                    assert!(message["payload"]["data"].is_null(), "{message}");
                    return message["payload"]["errors"].clone();
                }
                _ => {}
            }
        }
        panic!("the socket closed without an answer");
    };
    tokio::time::timeout(Duration::from_secs(10), refusal)
        .await
        .expect("an answer in time")
}

#[tokio::test]
async fn parse_and_validation_errors_carry_codes_over_websocket() {
    let app = spawn_app_with(Backend::Sqlite, AppOptions::no_workers()).await;
    let tenant = app.funded_tenant("acme", "1").await;
    for (query, variables, code) in [
        (
            "subscription { accountJobUpdates { seq ",
            json!({}),
            "GRAPHQL_PARSE_FAILED",
        ),
        (
            "subscription { accountJobUpdates { noSuchField } }",
            json!({}),
            "GRAPHQL_VALIDATION_FAILED",
        ),
        (
            "subscription ($id: UUID!) { jobUpdates(jobId: $id) { seq } }",
            json!({"id": 5}),
            "GRAPHQL_VALIDATION_FAILED",
        ),
    ] {
        let errors = refused_subscription(&app, &tenant.key, query, variables).await;
        let codes: Vec<_> = errors
            .as_array()
            .unwrap_or_else(|| panic!("{errors}"))
            .iter()
            .map(|error| error["extensions"]["code"].as_str().unwrap_or("none"))
            .collect();
        assert!(
            !codes.is_empty() && codes.iter().all(|got| *got == code),
            "{query}: {errors}"
        );
    }
}
