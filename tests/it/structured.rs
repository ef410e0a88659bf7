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
    let message = job["error"]["message"].as_str().unwrap();
    assert!(
        message.contains("/score"),
        "the error names the offending field: {message}"
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
    let message = job["error"]["message"].as_str().unwrap();
    assert!(
        message.contains("/answer") && message.contains("maxLength"),
        "{message}"
    );
    let shown = job.to_string();
    assert!(!shown.contains("PAID ANSWER"), "the reply leaked: {shown}");
    assert!(job["charge"].is_null());
    assert_billing_invariants(&app.app.db).await;
}
