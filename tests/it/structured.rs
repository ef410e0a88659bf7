//! Structured output: replies are validated against the job's JSON Schema, and
//! invalid ones are retried within their own small budget.

use crate::helpers::{Backend, TestApp, TestTenant, decimal, error_code, job_input, spawn_app};
use crate::invariants::assert_billing_invariants;
use rust_decimal::Decimal;
use serde_json::{Value, json};
use std::time::Duration;

on_both_backends!(
    a_reply_matching_the_schema_is_the_parsed_result,
    replies_off_schema_are_retried_within_their_own_budget,
    a_schema_that_does_not_compile_is_refused,
    an_off_schema_reply_is_not_given_away_in_the_error,
    schema_errors_tell_nothing_of_the_reply,
);

fn summary_schema() -> Value {
    json!({
        "type": "object",
        "properties": {"summary": {"type": "string"}, "score": {"type": "integer"}},
        "required": ["summary", "score"],
        "additionalProperties": false
    })
}

async fn run(
    app: &TestApp,
    tenant: &TestTenant,
    key: &str,
    content: &str,
    max_attempts: i64,
) -> Value {
    let mut input = job_input(key, content);
    input["responseSchema"] = summary_schema();
    input["maxAttempts"] = json!(max_attempts);
    let id = app.create_job_ok(tenant, input).await;
    app.wait_until_finished(tenant, id, Duration::from_secs(60))
        .await
}

async fn a_reply_matching_the_schema_is_the_parsed_result(backend: Backend) {
    let app = spawn_app(backend).await;
    let tenant = app.funded_tenant("acme", "5").await;
    let job = run(
        &app,
        &tenant,
        "fenced",
        r#"rate this [mock:reply=```json {"summary": "fine", "score": 7}```]"#,
        3,
    )
    .await;
    assert_eq!(job["status"], "SUCCEEDED", "{job}");
    assert_eq!(job["result"], json!({"summary": "fine", "score": 7}));
    assert_billing_invariants(&app.app.db).await;
}

async fn replies_off_schema_are_retried_within_their_own_budget(backend: Backend) {
    let app = spawn_app(backend).await;
    let tenant = app.funded_tenant("acme", "5").await;
    // Wrong type for score, on every call: the budget, not maxAttempts, ends it.
    let job = run(
        &app,
        &tenant,
        "off-schema",
        r#"rate this [mock:reply={"summary": "fine", "score": "seven"}]"#,
        10,
    )
    .await;
    assert_eq!(job["status"], "FAILED", "{job}");
    assert_eq!(job["error"]["code"], "INVALID_OUTPUT");
    assert_eq!(
        job["error"]["message"], "the reply does not match the response schema",
        "the error tells nothing of the reply: {job}"
    );
    let attempts = job["attempts"].as_array().unwrap();
    assert_eq!(
        attempts.len(),
        3,
        "one try and two retries for invalid output"
    );
    for attempt in attempts {
        assert_eq!(attempt["outcome"], "INVALID_OUTPUT");
        assert!(
            decimal(&attempt["providerCost"]) > Decimal::ZERO,
            "an off-schema reply is still paid for"
        );
    }
    assert!(
        job["charge"].is_null(),
        "the customer pays nothing for rejected output"
    );
    assert_eq!(job["reservation"]["status"], "RELEASED");

    // Not JSON at all counts the same way.
    let job = run(
        &app,
        &tenant,
        "not-json",
        "rate this [mock:invalid_json]",
        1,
    )
    .await;
    assert_eq!(job["status"], "FAILED");
    assert_eq!(job["attempts"][0]["outcome"], "INVALID_OUTPUT");
    assert_billing_invariants(&app.app.db).await;
}

async fn a_schema_that_does_not_compile_is_refused(backend: Backend) {
    let app = spawn_app(backend).await;
    let tenant = app.funded_tenant("acme", "5").await;
    let mut input = job_input("bad-schema", "hello");
    input["responseSchema"] = json!({"type": "object", "properties": {"a": {"type": 12}}});
    let response = app.create_job(&tenant, input).await;
    assert_eq!(error_code(&response), "VALIDATION", "{response}");
}

/// A reply that fails the schema is not charged (nothing was delivered): its text
/// must not reach the tenant through the error either.
async fn an_off_schema_reply_is_not_given_away_in_the_error(backend: Backend) {
    let app = spawn_app(backend).await;
    let tenant = app.funded_tenant("curious", "5").await;
    let mut input = job_input(
        "too-long",
        r#"[mock:reply={"answer":"THE PAID ANSWER step one"}] answer"#,
    );
    input["responseSchema"] = json!({
        "type": "object",
        "properties": {"answer": {"type": "string", "maxLength": 1}},
        "required": ["answer"],
    });
    input["maxAttempts"] = json!(1);
    let id = app.create_job_ok(&tenant, input).await;
    let job = app
        .wait_until_finished(&tenant, id, Duration::from_secs(20))
        .await;
    assert_eq!(job["error"]["code"], "INVALID_OUTPUT", "{job}");
    assert_eq!(
        job["error"]["message"],
        "the reply does not match the response schema"
    );
    let shown = job.to_string();
    assert!(!shown.contains("PAID ANSWER"), "the reply leaked: {shown}");
    assert!(job["charge"].is_null());
    assert_billing_invariants(&app.app.db).await;
}

/// What a tenant can read of a failed job: its error, each attempt's error and every
/// event's data.
const FAILURE_TEXTS: &str = "query Failure($id: UUID!) {
  job(id: $id) {
    status
    error { code message }
    attempts { errorMessage }
    events { data }
  }
}";

/// Runs one job whose reply fails `schema`, and returns everything the tenant can read
/// of its failure, with the error message alone.
async fn failure_of(
    app: &TestApp,
    tenant: &TestTenant,
    key: &str,
    reply: &str,
    schema: Value,
) -> (String, String) {
    let mut input = job_input(key, &format!("[mock:reply={reply}] answer"));
    input["responseSchema"] = schema;
    input["maxAttempts"] = json!(1);
    let id = app.create_job_ok(tenant, input).await;
    app.wait_until_finished(tenant, id, Duration::from_secs(20))
        .await;
    let response = app
        .graphql(Some(&tenant.key), FAILURE_TEXTS, json!({"id": id}))
        .await;
    let job = &response["data"]["job"];
    assert_eq!(job["error"]["code"], "INVALID_OUTPUT", "{response}");
    let message = job["error"]["message"].as_str().unwrap().to_owned();
    (job.to_string(), message)
}

/// A schema can make every key of a reply fail, pick array positions, test each key as
/// `propertyNames`, or hold one `not: {pattern}` branch per character and position so
/// that the branches that fail spell the reply: every detail of what failed depends on
/// the reply, so the tenant reads one fixed text whatever failed, and no answer word.
async fn schema_errors_tell_nothing_of_the_reply(backend: Backend) {
    let app = spawn_app(backend).await;
    let tenant = app.funded_tenant("curious", "5").await;
    let words = ["PAIDWORD", "SECRETKEY", "HIDDENTERM"];
    let spelling: Vec<Value> = (0..3)
        .flat_map(|position| {
            ('A'..='Z')
                .map(move |letter| json!({"not": {"pattern": format!("^.{{{position}}}{letter}")}}))
        })
        .collect();
    let tricks = [
        (
            "keys",
            r#"{"PAIDWORD": 1, "SECRETKEY": 2, "HIDDENTERM": 3}"#,
            json!({"type": "object", "additionalProperties": {"not": {}}}),
        ),
        (
            "one-key",
            r#"{"OTHER": 1}"#,
            json!({"type": "object", "additionalProperties": {"not": {}}}),
        ),
        (
            "positions",
            r#"[0, "PAIDWORD", 2, "SECRETKEY", "HIDDENTERM"]"#,
            json!({"type": "array", "items": {"type": "integer"}}),
        ),
        (
            "property-names",
            r#"{"PAIDWORD": 1, "SECRETKEY": 2, "HIDDENTERM": 3}"#,
            json!({
                "type": "object",
                "propertyNames": {"maxLength": 2},
                "patternProperties": {"^[A-Z]": {"type": "string"}},
            }),
        ),
        (
            "spelled-paid",
            r#"{"a": "PAIDWORD"}"#,
            json!({"type": "object", "properties": {"a": {"allOf": spelling.clone()}}}),
        ),
        (
            "spelled-secret",
            r#"{"a": "SECRETKEY"}"#,
            json!({"type": "object", "properties": {"a": {"allOf": spelling}}}),
        ),
    ];
    let mut messages = std::collections::BTreeSet::new();
    for (key, reply, schema) in tricks {
        let (shown, message) = failure_of(&app, &tenant, key, reply, schema).await;
        for word in words {
            assert!(!shown.contains(word), "{key}: {word} leaked: {shown}");
        }
        messages.insert(message);
    }
    assert_eq!(
        messages.into_iter().collect::<Vec<_>>(),
        ["the reply does not match the response schema"],
        "what failed is not told"
    );

    // Nor does a reply that is not JSON say where or how it broke.
    let (shown, early) = failure_of(
        &app,
        &tenant,
        "broken",
        r#"{"PAIDWORD": 1, SECRETKEY}"#,
        json!({"type": "object"}),
    )
    .await;
    assert!(!shown.contains("SECRETKEY"), "{shown}");
    let (_, late) = failure_of(
        &app,
        &tenant,
        "cut",
        r#"{"PAIDWORD": "#,
        json!({"type": "object"}),
    )
    .await;
    assert_eq!(
        (early.as_str(), late.as_str()),
        ("the reply is not JSON", "the reply is not JSON")
    );
    assert_billing_invariants(&app.app.db).await;
}
