//! Fallback models: a job tries its `fallbackModels` in order when its model fails,
//! is rate limited or paused; each attempt records and is priced by the model it
//! called, and the hold covers the dearest model of the chain.

use crate::helpers::{
    AppOptions, Backend, TestApp, TestTenant, decimal, error_code, job_input, spawn_app,
    spawn_app_with,
};
use crate::invariants::assert_billing_invariants;
use entity::{attempts, model_prices};
use jobledger::billing::prices;
use jobledger::llm::TokenUsage;
use rust_decimal::Decimal;
use sea_orm::{ColumnTrait, EntityTrait, QueryFilter, QueryOrder};
use serde_json::{Value, json};
use std::time::{Duration, Instant};
use uuid::Uuid;

on_both_backends!(
    a_fallback_takes_over_from_a_failing_model_priced_as_the_model_that_answered,
    a_fallback_takes_over_from_a_paused_model_without_waiting_for_the_pause,
    jobs_queued_on_a_model_its_provider_pauses_take_their_fallback,
    the_hold_covers_the_dearest_model_of_the_chain,
    fallbacks_that_cannot_take_the_call_are_refused_before_any_hold,
    a_rerun_keeps_the_chain_and_the_chain_is_part_of_the_fingerprint,
);

const LIMIT: Duration = Duration::from_secs(30);

/// The contract's `JobLifecycle` answer, with what this module checks besides.
async fn lifecycle(app: &TestApp, tenant: &TestTenant, id: Uuid) -> Value {
    let response = app
        .operation(Some(&tenant.key), "JobLifecycle", json!({"id": id}))
        .await;
    assert!(response["errors"].is_null(), "{response}");
    response["data"]["job"].clone()
}

/// `(model, outcome)` of each attempt, as `Attempt.model` tells it.
fn attempt_models(job: &Value) -> Vec<(String, String)> {
    job["attempts"]
        .as_array()
        .unwrap()
        .iter()
        .map(|attempt| {
            (
                attempt["model"].as_str().unwrap().to_owned(),
                attempt["outcome"].as_str().unwrap().to_owned(),
            )
        })
        .collect()
}

/// The job's model and fallbacks as `Job` shows them.
async fn chain_of(app: &TestApp, tenant: &TestTenant, id: Uuid) -> Value {
    let response = app
        .graphql(
            Some(&tenant.key),
            "query($id: UUID!) { job(id: $id) { model fallbackModels reservation { amount } } }",
            json!({"id": id}),
        )
        .await;
    assert!(response["errors"].is_null(), "{response}");
    response["data"]["job"].clone()
}

async fn stored_attempts(app: &TestApp, job: Uuid) -> Vec<attempts::Model> {
    attempts::Entity::find()
        .filter(attempts::Column::JobId.eq(job))
        .order_by_asc(attempts::Column::Number)
        .all(&app.app.db)
        .await
        .unwrap()
}

/// The simulator's log of the models it was called for, in order.
fn called_models(app: &TestApp) -> Vec<String> {
    app.simulator
        .calls()
        .iter()
        .map(|call| call.model.clone())
        .collect()
}

/// A 500 from the job's own model spends an attempt and hands the next one to the
/// fallback, which answers: the answer is recorded as the fallback's, priced at the
/// fallback's (dearer) price, and that is what the job is charged.
async fn a_fallback_takes_over_from_a_failing_model_priced_as_the_model_that_answered(
    backend: Backend,
) {
    let app = spawn_app(backend).await;
    let tenant = app.funded_tenant("acme", "5").await;
    let mut input = job_input(
        "failing",
        "Summarise the quarter [mock:status=500][mock:fail_model=gpt-4o-mini]",
    );
    input["fallbackModels"] = json!(["gpt-4o"]);
    let id = app.create_job_ok(&tenant, input).await;
    let job = app.wait_until_finished(&tenant, id, LIMIT).await;
    assert_eq!(job["status"], "SUCCEEDED", "{job}");
    assert_eq!(
        job["attemptCount"], 2,
        "the failure spent an attempt: {job}"
    );
    let lifecycle = lifecycle(&app, &tenant, id).await;
    assert_eq!(
        attempt_models(&lifecycle),
        [
            ("gpt-4o-mini".to_owned(), "RETRYABLE_ERROR".to_owned()),
            ("gpt-4o".to_owned(), "SUCCEEDED".to_owned()),
        ],
        "{lifecycle}"
    );
    assert_eq!(called_models(&app), ["gpt-4o-mini", "gpt-4o"]);

    let rows = stored_attempts(&app, id).await;
    let price = prices::price_at(&app.app.db, "gpt-4o", entity::Timestamp::now())
        .await
        .unwrap()
        .unwrap();
    let answered = &rows[1];
    assert_eq!(answered.model_price_id, price.id, "priced as gpt-4o");
    let usage = TokenUsage {
        input_tokens: answered.input_tokens.unwrap() as u64,
        cached_input_tokens: answered.cached_input_tokens.unwrap_or(0) as u64,
        output_tokens: answered.output_tokens.unwrap() as u64,
    };
    assert_eq!(
        answered.provider_cost_nanos,
        Some(price.provider_cost(&usage).nanos())
    );
    assert_eq!(
        answered.customer_charge_nanos,
        Some(price.customer_charge(&usage).nanos())
    );
    let mini = model_prices::Entity::find()
        .filter(model_prices::Column::Model.eq("gpt-4o-mini"))
        .one(&app.app.db)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(
        rows[0].model_price_id, mini.id,
        "the refusal as gpt-4o-mini"
    );
    assert_eq!(
        decimal(&job["charge"]["amount"]),
        Decimal::new(answered.customer_charge_nanos.unwrap(), 9),
        "charged what the answer cost at gpt-4o's price: {job}"
    );
    // Still the job's own model, whichever answered.
    assert_eq!(chain_of(&app, &tenant, id).await["model"], "gpt-4o-mini");
    assert_billing_invariants(&app.app.db).await;
}

/// A 429 asking for ten minutes pauses gpt-4o-mini for every worker; a one-attempt job
/// moves to its fallback at once, without spending its attempt, and finishes there in
/// seconds.
async fn a_fallback_takes_over_from_a_paused_model_without_waiting_for_the_pause(backend: Backend) {
    let app = spawn_app(backend).await;
    let tenant = app.funded_tenant("acme", "5").await;
    let mut input = job_input(
        "paused",
        "hi [mock:status=429][mock:retry_after=600][mock:fail_model=gpt-4o-mini]",
    );
    input["maxAttempts"] = json!(1);
    input["fallbackModels"] = json!(["gpt-4o"]);
    let created = Instant::now();
    let id = app.create_job_ok(&tenant, input).await;
    let job = app.wait_until_finished(&tenant, id, LIMIT).await;
    assert!(
        created.elapsed() < Duration::from_secs(15),
        "the job waited {:?} for a pause of 600 s",
        created.elapsed()
    );
    assert_eq!(job["status"], "SUCCEEDED", "{job}");
    assert_eq!(job["attemptCount"], 1, "the wait spent nothing: {job}");
    let lifecycle = lifecycle(&app, &tenant, id).await;
    assert_eq!(
        attempt_models(&lifecycle),
        [
            ("gpt-4o-mini".to_owned(), "RETRYABLE_ERROR".to_owned()),
            ("gpt-4o".to_owned(), "SUCCEEDED".to_owned()),
        ],
        "{lifecycle}"
    );
    assert_eq!(decimal(&job["attempts"][0]["providerCost"]), Decimal::ZERO);
    assert_billing_invariants(&app.app.db).await;
}

/// Another job's 429 pauses gpt-4o-mini for ten minutes: a job queued on it then (it
/// waits for its `runAt`) and a job created during the pause run on their fallback at
/// once instead of waiting for the pause; the job that got the 429 and has no fallback
/// fails at its deadline.
async fn jobs_queued_on_a_model_its_provider_pauses_take_their_fallback(backend: Backend) {
    let app = spawn_app(backend).await;
    let tenant = app.funded_tenant("acme", "5").await;
    let mut waiting = job_input("waiting", "Summarise the quarter.");
    waiting["fallbackModels"] = json!(["gpt-4o"]);
    waiting["runAt"] = json!(
        (chrono::Utc::now() + chrono::Duration::seconds(3))
            .to_rfc3339_opts(chrono::SecondsFormat::Millis, true)
    );
    let waiting = app.create_job_ok(&tenant, waiting).await;
    let mut limited = job_input(
        "limited",
        "hi [mock:status=429][mock:retry_after=600][mock:fail_model=gpt-4o-mini]",
    );
    limited["deadline"] = json!(
        (chrono::Utc::now() + chrono::Duration::seconds(20))
            .to_rfc3339_opts(chrono::SecondsFormat::Millis, true)
    );
    let created = Instant::now();
    let limited = app.create_job_ok(&tenant, limited).await;
    let limited = app.wait_until_finished(&tenant, limited, LIMIT).await;
    assert_eq!(limited["error"]["code"], "DEADLINE_EXCEEDED", "{limited}");

    let mut later = job_input("later", "Summarise the year.");
    later["fallbackModels"] = json!(["gpt-4o"]);
    let later = app.create_job_ok(&tenant, later).await;
    for id in [waiting, later] {
        let job = app.wait_until_finished(&tenant, id, LIMIT).await;
        assert_eq!(job["status"], "SUCCEEDED", "{job}");
        let lifecycle = lifecycle(&app, &tenant, id).await;
        assert_eq!(
            attempt_models(&lifecycle),
            [("gpt-4o".to_owned(), "SUCCEEDED".to_owned())],
            "no call of the paused model: {lifecycle}"
        );
    }
    assert!(
        created.elapsed() < Duration::from_secs(20),
        "the jobs waited {:?} for a pause of 600 s",
        created.elapsed()
    );
    assert_eq!(called_models(&app), ["gpt-4o-mini", "gpt-4o", "gpt-4o"]);
    assert_billing_invariants(&app.app.db).await;
}

/// The hold of a chain is the hold of its dearest model, whichever model comes first.
async fn the_hold_covers_the_dearest_model_of_the_chain(backend: Backend) {
    let app = spawn_app_with(backend, AppOptions::no_workers()).await;
    let tenant = app.funded_tenant("acme", "50").await;
    let hold = |key: &str, model: &str, fallbacks: &[&str]| {
        let mut input = job_input(key, "Summarise the quarter.");
        input["model"] = json!(model);
        input["fallbackModels"] = json!(fallbacks);
        input
    };
    let mut holds = Vec::new();
    for (key, model, fallbacks) in [
        ("mini", "gpt-4o-mini", &[][..]),
        ("dear", "gpt-4o", &[][..]),
        ("mini-then-dear", "gpt-4o-mini", &["gpt-4o"][..]),
        ("dear-then-mini", "gpt-4o", &["gpt-4o-mini"][..]),
        ("three", "gpt-4o-mini", &["gpt-4.1-nano", "gpt-4o"][..]),
    ] {
        let id = app
            .create_job_ok(&tenant, hold(key, model, fallbacks))
            .await;
        let job = chain_of(&app, &tenant, id).await;
        assert_eq!(job["model"], model, "{job}");
        assert_eq!(job["fallbackModels"], json!(fallbacks), "{job}");
        holds.push(decimal(&job["reservation"]["amount"]));
    }
    assert!(holds[0] < holds[1], "{holds:?}");
    assert_eq!(holds[2], holds[1], "held for gpt-4o: {holds:?}");
    assert_eq!(holds[3], holds[1], "{holds:?}");
    assert_eq!(holds[4], holds[1], "{holds:?}");
    assert_billing_invariants(&app.app.db).await;
}

/// A fallback the service cannot run, or names twice, or whose output limit the job
/// exceeds, is VALIDATION before anything is held.
async fn fallbacks_that_cannot_take_the_call_are_refused_before_any_hold(backend: Backend) {
    let app = spawn_app_with(backend, AppOptions::no_workers()).await;
    let tenant = app.funded_tenant("acme", "5").await;
    let cases: &[(Value, i32, &str)] = &[
        (json!(["never-heard-of-it"]), 100, "has no price"),
        (json!(["gpt-4o", "gpt-4o"]), 100, "twice"),
        (json!(["gpt-4o-mini"]), 100, "own model"),
        (
            json!(["gpt-4o", "gpt-4.1", "gpt-4.1-mini", "gpt-4.1-nano", "o3"]),
            100,
            "at most 4",
        ),
        (json!([" "]), 100, "model names"),
        // gpt-4o-mini writes 16,384 tokens a call, claude-3-5-haiku-latest 8,192.
        (
            json!(["claude-3-5-haiku-latest"]),
            10_000,
            "claude-3-5-haiku-latest",
        ),
    ];
    for (index, (fallbacks, max_output_tokens, says)) in cases.iter().enumerate() {
        let mut input = job_input(&format!("bad-{index}"), "hi");
        input["fallbackModels"] = fallbacks.clone();
        input["maxOutputTokens"] = json!(max_output_tokens);
        let response = app.create_job(&tenant, input).await;
        assert_eq!(
            error_code(&response),
            "VALIDATION",
            "{fallbacks}: {response}"
        );
        let message = response["errors"][0]["message"].as_str().unwrap();
        assert!(
            message.contains(says),
            "{fallbacks}: {message:?} should say {says}"
        );
    }
    // The same output on gpt-4o-mini alone is fine: the fallback's limit refused it.
    let mut alone = job_input("alone", "hi");
    alone["maxOutputTokens"] = json!(10_000);
    app.create_job_ok(&tenant, alone).await;
    let reservations = entity::credit_reservations::Entity::find()
        .all(&app.app.db)
        .await
        .unwrap();
    assert_eq!(reservations.len(), 1, "only the valid job holds credits");
    assert_billing_invariants(&app.app.db).await;
}

/// A rerun has the original's model and fallbacks (not the model it ended on), and
/// one idempotency key with another chain is another request.
async fn a_rerun_keeps_the_chain_and_the_chain_is_part_of_the_fingerprint(backend: Backend) {
    let app = spawn_app(backend).await;
    let tenant = app.funded_tenant("acme", "5").await;
    let mut input = job_input(
        "original",
        "hi [mock:status=500][mock:fail_model=gpt-4o-mini]",
    );
    input["fallbackModels"] = json!(["gpt-4o", "gpt-4.1-nano"]);
    let id = app.create_job_ok(&tenant, input.clone()).await;
    let job = app.wait_until_finished(&tenant, id, LIMIT).await;
    assert_eq!(job["status"], "SUCCEEDED", "{job}");

    let mut other_chain = input.clone();
    other_chain["fallbackModels"] = json!(["gpt-4.1-nano", "gpt-4o"]);
    let response = app.create_job(&tenant, other_chain).await;
    assert_eq!(error_code(&response), "IDEMPOTENCY_CONFLICT", "{response}");
    let mut no_chain = input.clone();
    no_chain.as_object_mut().unwrap().remove("fallbackModels");
    let response = app.create_job(&tenant, no_chain).await;
    assert_eq!(error_code(&response), "IDEMPOTENCY_CONFLICT", "{response}");
    let replay = app.create_job(&tenant, input).await;
    assert_eq!(replay["data"]["createJob"]["replayed"], true, "{replay}");

    let rerun = app
        .operation(
            Some(&tenant.key),
            "RerunJob",
            json!({"id": id, "idempotencyKey": "again"}),
        )
        .await;
    assert!(rerun["errors"].is_null(), "{rerun}");
    let rerun_id: Uuid = rerun["data"]["rerunJob"]["job"]["id"]
        .as_str()
        .unwrap()
        .parse()
        .unwrap();
    let chain = chain_of(&app, &tenant, rerun_id).await;
    assert_eq!(chain["model"], "gpt-4o-mini", "{chain}");
    assert_eq!(
        chain["fallbackModels"],
        json!(["gpt-4o", "gpt-4.1-nano"]),
        "{chain}"
    );
    let rerun = app.wait_until_finished(&tenant, rerun_id, LIMIT).await;
    assert_eq!(rerun["status"], "SUCCEEDED", "{rerun}");
    let lifecycle = lifecycle(&app, &tenant, rerun_id).await;
    assert_eq!(lifecycle["rerunOf"]["id"], json!(id.to_string()));
    assert_eq!(
        attempt_models(&lifecycle),
        [
            ("gpt-4o-mini".to_owned(), "RETRYABLE_ERROR".to_owned()),
            ("gpt-4o".to_owned(), "SUCCEEDED".to_owned()),
        ],
        "the rerun went down the same chain: {lifecycle}"
    );
    assert_billing_invariants(&app.app.db).await;
}
