//! The job lifecycle through the contract's operations: creation, idempotency,
//! holds, running to a settled charge, failures, cancellation and listing.

use crate::helpers::{
    AppOptions, Backend, decimal, error_code, event_kinds, job_input, spawn_app, spawn_app_with,
};
use crate::invariants::assert_billing_invariants;
use entity::{credit_reservations, jobs, ledger_entries};
use jobledger::billing::prices;
use jobledger::llm::TokenUsage;
use rust_decimal::Decimal;
use sea_orm::{EntityTrait, PaginatorTrait};
use serde_json::json;
use std::time::Duration;

on_both_backends!(
    a_job_runs_to_success_with_one_charge_within_its_hold,
    a_repeated_key_replays_and_a_changed_request_conflicts,
    concurrent_creates_with_one_key_make_one_job_and_one_hold,
    insufficient_credits_refuse_and_write_nothing,
    invalid_input_is_refused_with_validation,
    a_permanent_provider_error_fails_the_job_and_releases_the_hold,
    a_transient_provider_error_is_retried,
    a_queued_job_is_cancelled_at_once,
    jobs_page_newest_first,
);

async fn a_job_runs_to_success_with_one_charge_within_its_hold(backend: Backend) {
    let app = spawn_app(backend).await;
    let tenant = app.funded_tenant("acme", "5").await;
    let created = app
        .create_job(
            &tenant,
            job_input("job-1", "Please summarise the quarterly report."),
        )
        .await;
    let payload = &created["data"]["createJob"];
    assert_eq!(payload["replayed"], false);
    assert_eq!(payload["job"]["status"], "QUEUED");
    assert_eq!(payload["job"]["idempotencyKey"], "job-1");
    assert_eq!(payload["job"]["reservation"]["status"], "HELD");
    let hold = decimal(&payload["job"]["reservation"]["amount"]);
    let id = payload["job"]["id"].as_str().unwrap().parse().unwrap();

    let job = app
        .wait_until_finished(&tenant, id, Duration::from_secs(20))
        .await;
    assert_eq!(job["status"], "SUCCEEDED", "{job}");
    assert_eq!(
        job["result"],
        "Summary: Please summarise the quarterly report."
    );
    assert_eq!(job["attemptCount"], 1);
    assert!(job["startedAt"].is_string() && job["finishedAt"].is_string());

    // The attempt carries the provider's usage and request id, as the simulator billed.
    let attempt = &job["attempts"][0];
    assert_eq!(attempt["outcome"], "SUCCEEDED");
    let calls = app.simulator.calls();
    assert_eq!(calls.len(), 1, "one provider call: {calls:?}");
    assert!(calls[0].billed);
    assert_eq!(attempt["providerRequestId"], calls[0].request_id.as_str());
    assert_eq!(attempt["inputTokens"], calls[0].input_tokens);
    assert_eq!(attempt["outputTokens"], calls[0].output_tokens);

    // Money, recomputed here from the stored price and the usage.
    let price = prices::price_at(&app.app.db, "gpt-4o-mini", entity::Timestamp::now())
        .await
        .unwrap()
        .unwrap();
    let usage = TokenUsage {
        input_tokens: calls[0].input_tokens,
        cached_input_tokens: 0,
        output_tokens: calls[0].output_tokens,
    };
    let provider_cost = price.provider_cost(&usage).to_decimal();
    let charge = price.customer_charge(&usage).to_decimal();
    assert_eq!(decimal(&attempt["providerCost"]), provider_cost);
    assert!(attempt["providerCostUpperBound"].is_null());
    assert_eq!(decimal(&job["charge"]["amount"]), charge);
    assert!(charge <= hold, "charge {charge} above hold {hold}");
    let reservation = &job["reservation"];
    assert_eq!(reservation["status"], "SETTLED");
    assert_eq!(decimal(&reservation["settledAmount"]), charge);
    assert_eq!(
        decimal(&reservation["settledAmount"]) + decimal(&reservation["releasedAmount"]),
        hold
    );
    assert_eq!(decimal(&job["cost"]["providerCost"]), provider_cost);
    assert_eq!(decimal(&job["cost"]["customerCharge"]), charge);
    assert_eq!(decimal(&job["cost"]["margin"]), charge - provider_cost);
    assert_eq!(job["cost"]["unknownAttempts"], 0);

    let kinds = event_kinds(&job);
    assert_eq!(kinds, ["CREATED", "ATTEMPT_STARTED", "SUCCEEDED"]);

    let balance = app.balance(&tenant).await;
    assert_eq!(decimal(&balance["granted"]), Decimal::from(5));
    assert_eq!(decimal(&balance["held"]), Decimal::ZERO);
    assert_eq!(decimal(&balance["charged"]), charge);
    assert_eq!(decimal(&balance["available"]), Decimal::from(5) - charge);
    assert_billing_invariants(&app.app.db).await;
}

async fn a_repeated_key_replays_and_a_changed_request_conflicts(backend: Backend) {
    let app = spawn_app_with(backend, AppOptions::no_workers()).await;
    let tenant = app.funded_tenant("acme", "5").await;
    let first = app
        .create_job(&tenant, job_input("same-key", "hello"))
        .await;
    let again = app
        .create_job(&tenant, job_input("same-key", "hello"))
        .await;
    assert_eq!(first["data"]["createJob"]["replayed"], false);
    assert_eq!(again["data"]["createJob"]["replayed"], true);
    assert_eq!(
        again["data"]["createJob"]["job"]["id"],
        first["data"]["createJob"]["job"]["id"]
    );
    assert_eq!(
        again["data"]["createJob"]["job"]["reservation"]["id"],
        first["data"]["createJob"]["job"]["reservation"]["id"]
    );

    let changed = app
        .create_job(&tenant, job_input("same-key", "hello, changed"))
        .await;
    assert_eq!(error_code(&changed), "IDEMPOTENCY_CONFLICT");
    let mut other_limit = job_input("same-key", "hello");
    other_limit["maxOutputTokens"] = json!(101);
    assert_eq!(
        error_code(&app.create_job(&tenant, other_limit).await),
        "IDEMPOTENCY_CONFLICT"
    );

    // Another tenant may use the same key for its own job.
    let other = app.funded_tenant("globex", "5").await;
    let theirs = app.create_job(&other, job_input("same-key", "hello")).await;
    assert_eq!(theirs["data"]["createJob"]["replayed"], false);
    assert_ne!(
        theirs["data"]["createJob"]["job"]["id"],
        first["data"]["createJob"]["job"]["id"]
    );

    assert_eq!(jobs::Entity::find().count(&app.app.db).await.unwrap(), 2);
    assert_eq!(
        credit_reservations::Entity::find()
            .count(&app.app.db)
            .await
            .unwrap(),
        2
    );
    assert_billing_invariants(&app.app.db).await;
}

async fn concurrent_creates_with_one_key_make_one_job_and_one_hold(backend: Backend) {
    let app = spawn_app_with(backend, AppOptions::no_workers()).await;
    let tenant = app.funded_tenant("acme", "5").await;
    let responses = futures_util::future::join_all(
        (0..16).map(|_| app.create_job(&tenant, job_input("race", "the same request"))),
    )
    .await;
    crate::helpers::one_job_made_once(&responses, "createJob");
    assert_eq!(jobs::Entity::find().count(&app.app.db).await.unwrap(), 1);
    assert_eq!(
        credit_reservations::Entity::find()
            .count(&app.app.db)
            .await
            .unwrap(),
        1
    );
    let hold = decimal(&responses[0]["data"]["createJob"]["job"]["reservation"]["amount"]);
    assert_eq!(decimal(&app.balance(&tenant).await["held"]), hold);
    assert_billing_invariants(&app.app.db).await;
}

async fn insufficient_credits_refuse_and_write_nothing(backend: Backend) {
    let app = spawn_app_with(backend, AppOptions::no_workers()).await;
    // o3 at 10 credits per million output tokens for the customer: 100,000 output
    // tokens need a hold of 1 credit a call, 3 for three, more than this tenant has.
    let tenant = app.funded_tenant("acme", "1").await;
    let before = app.balance(&tenant).await;
    let ledger_before = ledger_entries::Entity::find()
        .count(&app.app.db)
        .await
        .unwrap();
    let mut input = job_input("too-big", "hello");
    input["model"] = json!("o3");
    input["maxOutputTokens"] = json!(100_000);
    let response = app.create_job(&tenant, input).await;
    assert_eq!(error_code(&response), "INSUFFICIENT_CREDITS");
    assert!(response["data"].is_null() || response["data"]["createJob"].is_null());
    assert_eq!(jobs::Entity::find().count(&app.app.db).await.unwrap(), 0);
    assert_eq!(
        credit_reservations::Entity::find()
            .count(&app.app.db)
            .await
            .unwrap(),
        0
    );
    assert_eq!(
        ledger_entries::Entity::find()
            .count(&app.app.db)
            .await
            .unwrap(),
        ledger_before
    );
    assert_eq!(app.balance(&tenant).await, before);

    // A job that fits is still accepted, and the key stays usable after a refusal.
    let mut fits = job_input("too-big", "hello");
    fits["model"] = json!("gpt-4o");
    assert!(app.create_job(&tenant, fits).await["errors"].is_null());
    assert_billing_invariants(&app.app.db).await;
}

async fn invalid_input_is_refused_with_validation(backend: Backend) {
    let app = spawn_app_with(backend, AppOptions::no_workers()).await;
    let tenant = app.funded_tenant("acme", "5").await;
    let cases = [
        ("model", json!("no-such-model")),
        ("maxOutputTokens", json!(0)),
        ("messages", json!([])),
        ("messages", json!([{"role": "robot", "content": "hi"}])),
        ("idempotencyKey", json!("")),
        ("maxAttempts", json!(11)),
        ("responseSchema", json!("not an object")),
    ];
    for (field, value) in cases {
        let mut input = job_input("bad", "hello");
        input[field] = value.clone();
        let response = app.create_job(&tenant, input).await;
        assert_eq!(
            error_code(&response),
            "VALIDATION",
            "{field} = {value}: {response}"
        );
    }
    assert_eq!(jobs::Entity::find().count(&app.app.db).await.unwrap(), 0);
}

async fn a_permanent_provider_error_fails_the_job_and_releases_the_hold(backend: Backend) {
    let app = spawn_app(backend).await;
    let tenant = app.funded_tenant("acme", "5").await;
    let id = app
        .create_job_ok(&tenant, job_input("bad-request", "hello [mock:status=400]"))
        .await;
    let job = app
        .wait_until_finished(&tenant, id, Duration::from_secs(20))
        .await;
    assert_eq!(job["status"], "FAILED");
    assert_eq!(job["error"]["code"], "PROVIDER_REJECTED");
    assert_eq!(job["attemptCount"], 1, "a permanent error is not retried");
    assert_eq!(job["attempts"][0]["outcome"], "PERMANENT_ERROR");
    assert_eq!(decimal(&job["attempts"][0]["providerCost"]), Decimal::ZERO);
    assert!(job["charge"].is_null());
    assert_eq!(job["reservation"]["status"], "RELEASED");
    assert_eq!(
        job["reservation"]["releasedAmount"],
        job["reservation"]["amount"]
    );
    let balance = app.balance(&tenant).await;
    assert_eq!(decimal(&balance["available"]), Decimal::from(5));
    assert_billing_invariants(&app.app.db).await;
}

async fn a_transient_provider_error_is_retried(backend: Backend) {
    let app = spawn_app(backend).await;
    let tenant = app.funded_tenant("acme", "5").await;
    let id = app
        .create_job_ok(
            &tenant,
            job_input("flaky", "hello [mock:status=503][mock:fail_first=1]"),
        )
        .await;
    let job = app
        .wait_until_finished(&tenant, id, Duration::from_secs(30))
        .await;
    assert_eq!(job["status"], "SUCCEEDED", "{job}");
    assert_eq!(job["attemptCount"], 2);
    let outcomes: Vec<_> = job["attempts"]
        .as_array()
        .unwrap()
        .iter()
        .map(|a| a["outcome"].as_str().unwrap())
        .collect();
    assert_eq!(outcomes, ["RETRYABLE_ERROR", "SUCCEEDED"]);
    assert!(job["attempts"][0]["providerRequestId"].is_string());
    let calls = app.simulator.calls();
    assert_eq!(
        calls.iter().map(|call| call.status).collect::<Vec<_>>(),
        [503, 200]
    );
    assert!(
        job["charge"]["amount"].is_string(),
        "charged once, for the accepted attempt"
    );
    assert_billing_invariants(&app.app.db).await;
}

async fn a_queued_job_is_cancelled_at_once(backend: Backend) {
    let app = spawn_app_with(backend, AppOptions::no_workers()).await;
    let tenant = app.funded_tenant("acme", "5").await;
    let id = app
        .create_job_ok(&tenant, job_input("to-cancel", "hello"))
        .await;
    let response = app
        .operation(Some(&tenant.key), "CancelJob", json!({"id": id}))
        .await;
    assert_eq!(
        response["data"]["cancelJob"]["status"], "CANCELLED",
        "{response}"
    );
    assert_eq!(response["data"]["cancelJob"]["cancelRequested"], true);
    let job = app.job(&tenant, id).await;
    assert_eq!(job["reservation"]["status"], "RELEASED");
    let kinds = event_kinds(&job);
    assert_eq!(kinds, ["CREATED", "CANCELLED"]);
    // Cancelling again changes nothing.
    let again = app
        .operation(Some(&tenant.key), "CancelJob", json!({"id": id}))
        .await;
    assert_eq!(again["data"]["cancelJob"]["status"], "CANCELLED");
    assert_eq!(
        app.job(&tenant, id).await["events"]
            .as_array()
            .unwrap()
            .len(),
        2
    );
    assert_eq!(
        decimal(&app.balance(&tenant).await["available"]),
        Decimal::from(5)
    );
    assert_billing_invariants(&app.app.db).await;
}

async fn jobs_page_newest_first(backend: Backend) {
    let app = spawn_app_with(backend, AppOptions::no_workers()).await;
    let tenant = app.funded_tenant("acme", "5").await;
    let mut ids = Vec::new();
    for index in 0..3 {
        ids.push(
            app.create_job_ok(&tenant, job_input(&format!("page-{index}"), "hello"))
                .await,
        );
    }
    app.operation(Some(&tenant.key), "CancelJob", json!({"id": ids[0]}))
        .await;
    let page = |variables| app.operation(Some(&tenant.key), "Jobs", variables);
    let first = page(json!({"first": 2})).await;
    let connection = &first["data"]["jobs"];
    let listed: Vec<_> = connection["edges"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["node"]["id"].as_str().unwrap().to_owned())
        .collect();
    assert_eq!(listed, [ids[2].to_string(), ids[1].to_string()]);
    assert_eq!(connection["pageInfo"]["hasNextPage"], true);
    let cursor = connection["pageInfo"]["endCursor"].clone();
    let second = page(json!({"first": 2, "after": cursor})).await;
    let connection = &second["data"]["jobs"];
    assert_eq!(connection["edges"][0]["node"]["id"], ids[0].to_string());
    assert_eq!(connection["edges"].as_array().unwrap().len(), 1);
    assert_eq!(connection["pageInfo"]["hasNextPage"], false);
    let cancelled = page(json!({"status": "CANCELLED"})).await;
    assert_eq!(
        cancelled["data"]["jobs"]["edges"].as_array().unwrap().len(),
        1
    );
    assert_eq!(
        cancelled["data"]["jobs"]["edges"][0]["node"]["status"],
        "CANCELLED"
    );
    let too_many = page(json!({"first": 101})).await;
    assert_eq!(error_code(&too_many), "VALIDATION");
}

on_both_backends!(deeply_nested_json_input_is_refused_with_validation);

/// `{"a": {"a": … 1}}`, `levels` objects deep.
fn nested(levels: usize) -> serde_json::Value {
    (0..levels).fold(json!(1), |inner, _| json!({ "a": inner }))
}

/// The same value as a GraphQL input literal: `{a: {a: … 1}}`.
fn nested_literal(levels: usize) -> String {
    (0..levels).fold("1".to_owned(), |inner, _| format!("{{a: {inner}}}"))
}

/// Metadata and response schemas nest at most 32 levels. Deeper metadata used to be
/// stored and then fail as INTERNAL when the stored input (one level deeper still) was
/// read back past serde_json's 128-level limit. Inline literals are how a client gets
/// 200 levels this far: in variables, the HTTP layer's own JSON parse stops first.
async fn deeply_nested_json_input_is_refused_with_validation(backend: Backend) {
    let app = spawn_app_with(backend, AppOptions::no_workers()).await;
    let tenant = app.funded_tenant("acme", "5").await;

    let mut input = job_input("deep-32", "hello");
    input["metadata"] = nested(32);
    let id = app.create_job_ok(&tenant, input).await;
    let response = app
        .graphql(
            Some(&tenant.key),
            "query ($id: UUID!) { job(id: $id) { input } }",
            json!({"id": id}),
        )
        .await;
    assert_eq!(response["data"]["job"]["input"]["metadata"], nested(32));

    let mut input = job_input("deep-33", "hello");
    input["metadata"] = nested(33);
    let response = app.create_job(&tenant, input).await;
    assert_eq!(error_code(&response), "VALIDATION", "{response}");
    let message = response["errors"][0]["message"].as_str().unwrap();
    assert!(
        message.contains("metadata") && message.contains("32 levels"),
        "{message}"
    );

    for (field, levels) in [("metadata", 33), ("metadata", 200), ("responseSchema", 200)] {
        let value = nested_literal(levels);
        let query = format!(
            r#"mutation {{ createJob(input: {{idempotencyKey: "literal-{field}-{levels}", model: "gpt-4o-mini", maxOutputTokens: 10, messages: [{{role: "user", content: "hi"}}], {field}: {value}}}) {{ job {{ id }} }} }}"#
        );
        let response = app.graphql(Some(&tenant.key), &query, json!({})).await;
        assert_eq!(
            error_code(&response),
            "VALIDATION",
            "{field} {levels}: {response}"
        );
        let message = response["errors"][0]["message"].as_str().unwrap();
        assert!(message.contains(field), "{message}");
    }
    let stored = jobs::Entity::find().count(&app.app.db).await.unwrap();
    assert_eq!(stored, 1, "only the 32-level job was created");
    assert_billing_invariants(&app.app.db).await;
}
