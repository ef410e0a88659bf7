//! `reconcileAttempt`: an admin turns an unknown attempt's cost bound into its exact
//! cost, once, without changing what the customer was charged.

use super::{LIMIT, first_attempt, report};
use crate::helpers::{ADMIN_TOKEN, Backend, TestApp, decimal, error_code, job_input, spawn_app};
use crate::invariants::assert_billing_invariants;
use entity::{attempts, model_prices};
use jobledger::billing::audit::Invariant;
use rust_decimal::Decimal;
use sea_orm::{ColumnTrait, EntityTrait, QueryFilter, QueryOrder};
use serde_json::{Value, json};
use uuid::Uuid;

on_both_backends!(
    reconciling_a_dropped_attempt_makes_its_cost_exact,
    reconciling_never_changes_the_customer_charge,
);

const RECONCILE: &str = r#"
mutation Reconcile($input: ReconcileAttemptInput!) {
  reconcileAttempt(input: $input) {
    reconciliation {
      id attemptId jobId tenantId previousUpperBound providerCost
      inputTokens cachedInputTokens outputTokens providerRequestId note reconciledBy createdAt
    }
    attempt {
      number outcome providerCost providerCostUpperBound
      inputTokens cachedInputTokens outputTokens providerRequestId
    }
  }
}"#;

pub(super) async fn reconcile(
    app: &TestApp,
    key: &str,
    attempt_id: Uuid,
    input_tokens: i64,
    cached_input_tokens: i64,
    output_tokens: i64,
    note: &str,
) -> Value {
    app.graphql(
        Some(key),
        RECONCILE,
        json!({"input": {
            "attemptId": attempt_id,
            "inputTokens": input_tokens,
            "cachedInputTokens": cached_input_tokens,
            "outputTokens": output_tokens,
            "providerRequestId": "req-from-usage-report",
            "note": note,
        }}),
    )
    .await
}

/// The provider cost of `usage` at the attempt's stored price, computed here from the
/// price row: each part rounded up to the nano-credit.
async fn expected_cost(
    app: &TestApp,
    attempt: &attempts::Model,
    usage: (i64, i64, i64),
) -> Decimal {
    let price = model_prices::Entity::find_by_id(attempt.model_price_id)
        .one(&app.app.db)
        .await
        .unwrap()
        .unwrap();
    let part = |tokens: i64, nanos_per_million: i64| {
        (i128::from(tokens) * i128::from(nanos_per_million) + 999_999) / 1_000_000
    };
    let (input, cached, output) = usage;
    let nanos = part(input - cached, price.provider_input_nanos_per_million)
        + part(cached, price.provider_cached_input_nanos_per_million)
        + part(output, price.provider_output_nanos_per_million);
    Decimal::from_i128_with_scale(nanos, 9).normalize()
}

async fn reconciling_a_dropped_attempt_makes_its_cost_exact(backend: Backend) {
    let app = spawn_app(backend).await;
    let tenant = app.funded_tenant("acme", "5").await;
    let mut input = job_input("pay-once", "hi [mock:drop]");
    input["retryUnknownOutcome"] = json!(false);
    let id = app.create_job_ok(&tenant, input).await;
    let job = app.wait_until_finished(&tenant, id, LIMIT).await;
    assert_eq!(job["status"], "FAILED", "{job}");
    assert_eq!(job["cost"]["unknownAttempts"], 1);
    let bound = decimal(&job["attempts"][0]["providerCostUpperBound"]);
    let balance = app.balance(&tenant).await;
    let attempt = first_attempt(&app, id).await;

    // Only an admin may reconcile, and only an attempt that exists.
    let response = reconcile(&app, &tenant.key, attempt.id, 120, 20, 50, "report").await;
    assert_eq!(error_code(&response), "FORBIDDEN", "{response}");
    let response = reconcile(&app, ADMIN_TOKEN, Uuid::now_v7(), 120, 20, 50, "report").await;
    assert_eq!(error_code(&response), "NOT_FOUND", "{response}");
    // Usage that cannot be is refused, and nothing is written.
    for (input_tokens, cached, output, note) in [
        (10, 20, 5, "report"),
        (-1, 0, 5, "report"),
        (10, 0, 5, "  "),
    ] {
        let response = reconcile(
            &app,
            ADMIN_TOKEN,
            attempt.id,
            input_tokens,
            cached,
            output,
            note,
        )
        .await;
        assert_eq!(error_code(&response), "VALIDATION", "{response}");
    }
    assert_eq!(first_attempt(&app, id).await, attempt);

    let response = reconcile(
        &app,
        ADMIN_TOKEN,
        attempt.id,
        120,
        20,
        50,
        "provider usage report of 2026-12-01",
    )
    .await;
    assert!(response["errors"].is_null(), "{response}");
    let expected = expected_cost(&app, &attempt, (120, 20, 50)).await;
    assert!(expected > Decimal::ZERO && expected < bound);
    let payload = &response["data"]["reconcileAttempt"];
    let reconciliation = &payload["reconciliation"];
    assert_eq!(decimal(&reconciliation["providerCost"]), expected);
    assert_eq!(decimal(&reconciliation["previousUpperBound"]), bound);
    assert_eq!(reconciliation["attemptId"], json!(attempt.id));
    assert_eq!(reconciliation["jobId"], json!(id));
    assert_eq!(reconciliation["tenantId"], json!(tenant.id));
    assert_eq!(reconciliation["inputTokens"], 120);
    assert_eq!(reconciliation["cachedInputTokens"], 20);
    assert_eq!(reconciliation["outputTokens"], 50);
    assert_eq!(
        reconciliation["note"],
        "provider usage report of 2026-12-01"
    );
    assert_eq!(reconciliation["reconciledBy"], "admin");
    assert_eq!(payload["attempt"]["outcome"], "UNKNOWN");
    assert_eq!(decimal(&payload["attempt"]["providerCost"]), expected);

    // The tenant sees the exact cost; nothing about its credits changed.
    let job = app.job(&tenant, id).await;
    let cost = &job["cost"];
    assert_eq!(cost["unknownAttempts"], 0, "{job}");
    assert_eq!(decimal(&cost["providerCost"]), expected);
    assert_eq!(decimal(&cost["providerCostUpperBound"]), expected);
    assert_eq!(decimal(&cost["customerCharge"]), Decimal::ZERO);
    assert_eq!(decimal(&cost["margin"]), -expected);
    let attempt_seen = &job["attempts"][0];
    assert_eq!(decimal(&attempt_seen["providerCost"]), expected);
    assert!(attempt_seen["providerCostUpperBound"].is_null());
    assert_eq!(attempt_seen["inputTokens"], 120);
    assert_eq!(attempt_seen["cachedInputTokens"], 20);
    assert_eq!(attempt_seen["outputTokens"], 50);
    assert_eq!(attempt_seen["providerRequestId"], "req-from-usage-report");
    assert!(job["charge"].is_null());
    assert_eq!(app.balance(&tenant).await, balance);
    assert_billing_invariants(&app.app.db).await;
    assert_eq!(
        report(&app)
            .await
            .check(Invariant::ReconciliationMatchesAttempt)
            .checked,
        1
    );

    // Once exact, never again.
    let response = reconcile(&app, ADMIN_TOKEN, attempt.id, 1, 0, 1, "again").await;
    assert_eq!(error_code(&response), "VALIDATION", "{response}");
    assert_eq!(
        decimal(&app.job(&tenant, id).await["cost"]["providerCost"]),
        expected
    );
}

async fn reconciling_never_changes_the_customer_charge(backend: Backend) {
    let app = spawn_app(backend).await;
    let tenant = app.funded_tenant("acme", "5").await;
    let id = app
        .create_job_ok(
            &tenant,
            job_input("retried", "hi [mock:drop][mock:fail_first=1]"),
        )
        .await;
    let before = app.wait_until_finished(&tenant, id, LIMIT).await;
    assert_eq!(before["status"], "SUCCEEDED", "{before}");
    let balance = app.balance(&tenant).await;
    let attempts = attempts::Entity::find()
        .filter(attempts::Column::JobId.eq(id))
        .order_by_asc(attempts::Column::Number)
        .all(&app.app.db)
        .await
        .unwrap();
    let [lost, accepted] = attempts.as_slice() else {
        panic!("two attempts expected: {attempts:?}");
    };

    // The accepted attempt's cost is exact already.
    let response = reconcile(&app, ADMIN_TOKEN, accepted.id, 10, 0, 5, "report").await;
    assert_eq!(error_code(&response), "VALIDATION", "{response}");

    let response = reconcile(&app, ADMIN_TOKEN, lost.id, 40, 0, 30, "report").await;
    assert!(response["errors"].is_null(), "{response}");
    let lost_cost = expected_cost(&app, lost, (40, 0, 30)).await;
    let after = app.job(&tenant, id).await;
    assert_eq!(after["charge"], before["charge"]);
    assert_eq!(after["reservation"], before["reservation"]);
    assert_eq!(app.balance(&tenant).await, balance);
    let accepted_cost = decimal(&before["cost"]["providerCost"]);
    assert_eq!(after["cost"]["unknownAttempts"], 0);
    assert_eq!(
        decimal(&after["cost"]["providerCost"]),
        accepted_cost + lost_cost
    );
    assert_eq!(
        decimal(&after["cost"]["margin"]),
        decimal(&after["cost"]["customerCharge"]) - accepted_cost - lost_cost
    );
    assert_billing_invariants(&app.app.db).await;
}
