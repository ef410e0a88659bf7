//! Deadlines and waits: a provider refusal that did no work is a wait that spends
//! neither an attempt nor a paid call, and the job's deadline is what bounds waiting —
//! queued, between waits, or during a running call.

use crate::helpers::{
    AppOptions, Backend, TestApp, TestTenant, decimal, error_code, event_kinds, job_input,
    spawn_app, spawn_app_with,
};
use crate::invariants::assert_billing_invariants;
use chrono::{DateTime, Utc};
use rust_decimal::Decimal;
use serde_json::{Value, json};
use std::time::{Duration, Instant};
use uuid::Uuid;

on_both_backends!(
    a_one_attempt_job_waits_out_rate_limits_and_succeeds,
    a_job_that_is_always_rate_limited_ends_at_its_deadline_without_a_charge,
    a_deadline_cancels_a_running_call_within_a_second,
    a_deadline_must_be_in_the_future_and_after_run_at,
    a_queued_job_fails_when_its_deadline_passes_before_a_worker_takes_it,
    the_config_file_sets_the_default_deadline,
    a_batch_deadline_ends_its_unfinished_items_and_then_it_takes_no_more,
    batch_items_take_the_configured_default_deadline,
    a_create_sent_again_after_its_deadline_passed_replays,
);

const LIMIT: Duration = Duration::from_secs(30);

/// `now` moved by `millis`, as a GraphQL `DateTime`.
fn in_millis(millis: i64) -> String {
    // Milliseconds: the service keeps microseconds, so it reads back as sent.
    (Utc::now() + chrono::Duration::milliseconds(millis))
        .to_rfc3339_opts(chrono::SecondsFormat::Millis, true)
}

fn instant(value: &Value) -> DateTime<Utc> {
    value
        .as_str()
        .unwrap_or_else(|| panic!("not a DateTime: {value}"))
        .parse()
        .unwrap()
}

fn outcomes(job: &Value) -> Vec<String> {
    job["attempts"]
        .as_array()
        .unwrap()
        .iter()
        .map(|attempt| attempt["outcome"].as_str().unwrap().to_owned())
        .collect()
}

/// The job's `deadline` (the contract's `JobLifecycle` field).
async fn deadline_of(app: &TestApp, tenant: &TestTenant, id: Uuid) -> DateTime<Utc> {
    let response = app
        .graphql(
            Some(&tenant.key),
            "query($id: UUID!) { job(id: $id) { deadline } }",
            json!({"id": id}),
        )
        .await;
    instant(&response["data"]["job"]["deadline"])
}

/// The simulator's log of the calls it received, over its HTTP API.
async fn mock_calls(app: &TestApp) -> Vec<Value> {
    let base = app.simulator_url();
    let base = base.trim_end_matches("/v1");
    reqwest::get(format!("{base}/_mock/calls"))
        .await
        .unwrap()
        .json()
        .await
        .unwrap()
}

/// Nothing was charged: the hold went back whole and the balance is what was granted.
async fn assert_released_whole(app: &TestApp, tenant: &TestTenant, job: &Value, granted: u32) {
    assert_eq!(job["reservation"]["status"], "RELEASED", "{job}");
    assert_eq!(
        job["reservation"]["releasedAmount"], job["reservation"]["amount"],
        "{job}"
    );
    assert!(job["charge"].is_null(), "{job}");
    assert_eq!(
        decimal(&job["cost"]["providerCost"]),
        Decimal::ZERO,
        "{job}"
    );
    assert_eq!(
        decimal(&app.balance(tenant).await["available"]),
        Decimal::from(granted)
    );
    assert_billing_invariants(&app.app.db).await;
}

/// Three 429s are three waits: the one attempt the job may spend is still there for the
/// call that answers, and none of the refusals counts as a paid call.
async fn a_one_attempt_job_waits_out_rate_limits_and_succeeds(backend: Backend) {
    let app = spawn_app(backend).await;
    let tenant = app.funded_tenant("acme", "5").await;
    let mut input = job_input(
        "patient",
        "hi [mock:status=429][mock:retry_after=1][mock:fail_first=3]",
    );
    input["maxAttempts"] = json!(1);
    let id = app.create_job_ok(&tenant, input).await;
    let job = app.wait_until_finished(&tenant, id, LIMIT).await;
    assert_eq!(job["status"], "SUCCEEDED", "{job}");
    assert_eq!(
        outcomes(&job),
        [
            "RETRYABLE_ERROR",
            "RETRYABLE_ERROR",
            "RETRYABLE_ERROR",
            "SUCCEEDED"
        ],
        "{job}"
    );
    assert_eq!(
        job["attemptCount"], 1,
        "only the answered call counts: {job}"
    );
    for refused in &job["attempts"].as_array().unwrap()[..3] {
        assert_eq!(decimal(&refused["providerCost"]), Decimal::ZERO, "{job}");
    }
    assert_eq!(job["reservation"]["status"], "SETTLED", "{job}");
    let calls = mock_calls(&app).await;
    assert_eq!(calls.len(), 4, "{calls:?}");
    assert_eq!(
        calls.iter().filter(|call| call["billed"] == true).count(),
        1,
        "only the answer was billed: {calls:?}"
    );
    assert_billing_invariants(&app.app.db).await;
}

/// A provider that never stops refusing holds the job only until its deadline: it then
/// fails DEADLINE_EXCEEDED, having spent no attempt, and its hold goes back whole.
async fn a_job_that_is_always_rate_limited_ends_at_its_deadline_without_a_charge(backend: Backend) {
    let app = spawn_app(backend).await;
    let tenant = app.funded_tenant("acme", "5").await;
    let mut input = job_input("hopeless", "hi [mock:status=429][mock:retry_after=1]");
    input["maxAttempts"] = json!(1);
    input["deadline"] = json!(in_millis(4_000));
    let created = Instant::now();
    let id = app.create_job_ok(&tenant, input).await;
    let job = app
        .wait_until_finished(&tenant, id, Duration::from_secs(10))
        .await;
    assert!(
        created.elapsed() < Duration::from_secs(6),
        "the job outlived its deadline by {:?}",
        created.elapsed()
    );
    assert_eq!(job["status"], "FAILED", "{job}");
    assert_eq!(job["error"]["code"], "DEADLINE_EXCEEDED", "{job}");
    // More refusals than its one attempt: the waits spent none of it. A wait that came
    // due just before the deadline may be claimed just after it: then nothing is sent.
    let mut outcomes = outcomes(&job);
    if outcomes.last().is_some_and(|last| last == "CANCELLED") {
        outcomes.pop();
    }
    assert!(
        outcomes.len() >= 2 && outcomes.iter().all(|outcome| outcome == "RETRYABLE_ERROR"),
        "more than one refusal, each recorded: {job}"
    );
    assert_eq!(mock_calls(&app).await.len(), outcomes.len());
    assert_released_whole(&app, &tenant, &job, 5).await;
}

/// A call still running at the deadline is cancelled as a tenant's cancel would be:
/// at once, recorded as CANCELLED with its cost bound, the job FAILED
/// DEADLINE_EXCEEDED, and the simulator saw exactly the call the attempt records.
async fn a_deadline_cancels_a_running_call_within_a_second(backend: Backend) {
    let app = spawn_app(backend).await;
    let tenant = app.funded_tenant("acme", "5").await;
    let mut input = job_input("slow", "hi [mock:delay_ms=20000]");
    input["deadline"] = json!(in_millis(2_000));
    let id = app.create_job_ok(&tenant, input).await;
    let job = app
        .wait_until_finished(&tenant, id, Duration::from_secs(6))
        .await;
    assert_eq!(job["status"], "FAILED", "{job}");
    assert_eq!(job["error"]["code"], "DEADLINE_EXCEEDED", "{job}");
    assert_eq!(outcomes(&job), ["CANCELLED"], "{job}");
    let attempt = &job["attempts"][0];
    assert_eq!(attempt["errorCode"], "DEADLINE_EXCEEDED", "{job}");
    assert!(
        attempt["providerCostUpperBound"].is_string(),
        "a call cancelled after it was sent may be billed: {job}"
    );
    let deadline = deadline_of(&app, &tenant, id).await;
    let late = instant(&attempt["finishedAt"]) - deadline;
    assert!(
        late >= chrono::Duration::zero() && late < chrono::Duration::milliseconds(1_000),
        "the call was cancelled {late} after the deadline"
    );
    let calls = mock_calls(&app).await;
    assert_eq!(calls.len(), 1, "one attempt, one call: {calls:?}");
    // The default policy charges the prompt of a call cancelled after it was sent.
    assert_eq!(job["reservation"]["status"], "SETTLED", "{job}");
    assert!(decimal(&job["charge"]["amount"]) > Decimal::ZERO, "{job}");
    assert_billing_invariants(&app.app.db).await;
}

async fn a_deadline_must_be_in_the_future_and_after_run_at(backend: Backend) {
    // No workers: nothing settles while the audit below reads the ledger.
    let app = spawn_app_with(backend, AppOptions::no_workers()).await;
    let tenant = app.funded_tenant("acme", "5").await;
    let with = |key: &str, run_at: Option<String>, deadline: String| {
        let mut input = job_input(key, "hi");
        if let Some(run_at) = run_at {
            input["runAt"] = json!(run_at);
        }
        input["deadline"] = json!(deadline);
        input
    };
    let run_at = in_millis(60_000);
    for (key, input) in [
        ("past", with("past", None, in_millis(-1_000))),
        (
            "before-run-at",
            with("before-run-at", Some(run_at.clone()), in_millis(30_000)),
        ),
        (
            "at-run-at",
            with("at-run-at", Some(run_at.clone()), run_at.clone()),
        ),
    ] {
        let response = app.create_job(&tenant, input).await;
        assert_eq!(error_code(&response), "VALIDATION", "{key}: {response}");
    }
    // A deadline is shown as asked, and is part of the request: the same deadline is a
    // replay, another one a conflict.
    let deadline = in_millis(3_600_000);
    let fine = with("fine", Some(run_at.clone()), deadline.clone());
    let id = app.create_job_ok(&tenant, fine.clone()).await;
    assert_eq!(
        deadline_of(&app, &tenant, id).await,
        instant(&json!(deadline))
    );
    let replay = app.create_job(&tenant, fine).await;
    assert_eq!(replay["data"]["createJob"]["replayed"], true, "{replay}");
    let other = with("fine", Some(run_at), in_millis(7_200_000));
    assert_eq!(
        error_code(&app.create_job(&tenant, other).await),
        "IDEMPOTENCY_CONFLICT"
    );
    // Without one, the job gets the default, 24 hours from when it may start, and a
    // replay later is still the same request.
    let id = app.create_job_ok(&tenant, job_input("default", "hi")).await;
    let span = deadline_of(&app, &tenant, id).await - Utc::now();
    assert!(
        span > chrono::Duration::hours(23) && span <= chrono::Duration::hours(24),
        "{span}"
    );
    let replay = app.create_job(&tenant, job_input("default", "hi")).await;
    assert_eq!(replay["data"]["createJob"]["replayed"], true, "{replay}");
    assert_billing_invariants(&app.app.db).await;
}

/// A queued job whose deadline passes before a worker takes it — due at its `runAt`,
/// with no worker running until after the deadline — is failed by the sweep the first
/// worker runs before it claims anything: no attempt, no call, the hold released.
async fn a_queued_job_fails_when_its_deadline_passes_before_a_worker_takes_it(backend: Backend) {
    let api = spawn_app_with(backend, AppOptions::no_workers()).await;
    let tenant = api.funded_tenant("acme", "5").await;
    let mut input = job_input("too-late", "hi");
    input["runAt"] = json!(in_millis(500));
    input["deadline"] = json!(in_millis(1_500));
    let id = api.create_job_ok(&tenant, input).await;
    tokio::time::sleep(Duration::from_millis(2_000)).await;
    assert_eq!(api.job(&tenant, id).await["status"], "QUEUED");
    let _workers = api.another_process(AppOptions::default()).await;
    let job = api
        .wait_until_finished(&tenant, id, Duration::from_secs(5))
        .await;
    assert_eq!(job["status"], "FAILED", "{job}");
    assert_eq!(job["error"]["code"], "DEADLINE_EXCEEDED", "{job}");
    assert!(job["attempts"].as_array().unwrap().is_empty(), "{job}");
    assert_eq!(event_kinds(&job), ["CREATED", "FAILED"]);
    assert!(mock_calls(&api).await.is_empty());
    assert_released_whole(&api, &tenant, &job, 5).await;
}

/// `default_deadline_seconds` in the config file is the deadline of a job that names
/// none, counted from when it may start.
async fn the_config_file_sets_the_default_deadline(backend: Backend) {
    let folder = tempfile::tempdir().unwrap();
    let path = folder.path().join("jobledger.toml");
    std::fs::write(&path, "default_deadline_seconds = 600\n").unwrap();
    let options = AppOptions {
        config_file: Some(path),
        ..AppOptions::no_workers()
    };
    let app = spawn_app_with(backend, options).await;
    let tenant = app.funded_tenant("acme", "5").await;
    let id = app.create_job_ok(&tenant, job_input("soon", "hi")).await;
    let span = deadline_of(&app, &tenant, id).await - Utc::now();
    assert!(
        span > chrono::Duration::seconds(590) && span <= chrono::Duration::seconds(600),
        "{span}"
    );
    let mut later = job_input("later", "hi");
    let run_at = in_millis(3_600_000);
    later["runAt"] = json!(run_at);
    let id = app.create_job_ok(&tenant, later).await;
    assert_eq!(
        deadline_of(&app, &tenant, id).await - instant(&json!(run_at)),
        chrono::Duration::seconds(600)
    );
}

/// `createBatch`, the whole response.
async fn create_batch(app: &TestApp, tenant: &TestTenant, input: Value) -> Value {
    app.operation(Some(&tenant.key), "CreateBatch", json!({"input": input}))
        .await
}

/// The id of the batch item `custom_id`, found by its key.
async fn item_id(app: &TestApp, tenant: &TestTenant, batch: &str, custom_id: &str) -> Uuid {
    let found = app
        .operation(
            Some(&tenant.key),
            "JobByKey",
            json!({"key": format!("batch/{batch}/{custom_id}")}),
        )
        .await;
    found["data"]["job"]["id"]
        .as_str()
        .unwrap_or_else(|| panic!("no item {custom_id}: {found}"))
        .parse()
        .unwrap()
}

/// A batch's deadline is every item's: the ones still waiting when it passes fail
/// DEADLINE_EXCEEDED with nothing charged, the others keep what they earned, and the
/// batch takes no more items. A deadline that has passed is refused at once.
async fn a_batch_deadline_ends_its_unfinished_items_and_then_it_takes_no_more(backend: Backend) {
    let app = spawn_app(backend).await;
    let tenant = app.funded_tenant("acme", "5").await;
    let past = create_batch(
        &app,
        &tenant,
        json!({"idempotencyKey": "late", "model": "gpt-4o-mini", "maxOutputTokens": 50,
               "deadline": in_millis(-1_000)}),
    )
    .await;
    assert_eq!(error_code(&past), "VALIDATION", "{past}");

    let deadline = in_millis(4_000);
    let created = create_batch(
        &app,
        &tenant,
        json!({"idempotencyKey": "docs", "model": "gpt-4o-mini", "maxOutputTokens": 50,
               "maxAttempts": 1, "deadline": deadline}),
    )
    .await;
    assert!(created["errors"].is_null(), "{created}");
    let batch = created["data"]["createBatch"]["batch"]["id"]
        .as_str()
        .unwrap()
        .to_owned();
    let items = json!([
        {"customId": "quick", "messages": [{"role": "user", "content": "summarise this"}]},
        {"customId": "stuck-1", "messages": [{"role": "user", "content": "one [mock:status=429][mock:retry_after=1]"}]},
        {"customId": "stuck-2", "messages": [{"role": "user", "content": "two [mock:status=429][mock:retry_after=1]"}]},
    ]);
    let added = app
        .operation(
            Some(&tenant.key),
            "AddBatchItems",
            json!({"batchId": batch, "items": items}),
        )
        .await;
    assert!(added["errors"].is_null(), "{added}");
    let shown = app
        .graphql(
            Some(&tenant.key),
            "query($id: UUID!) { batch(id: $id) { deadline } }",
            json!({"id": batch}),
        )
        .await;
    assert_eq!(
        instant(&shown["data"]["batch"]["deadline"]),
        instant(&json!(deadline)),
        "{shown}"
    );
    for custom_id in ["quick", "stuck-1", "stuck-2"] {
        let id = item_id(&app, &tenant, &batch, custom_id).await;
        assert_eq!(
            deadline_of(&app, &tenant, id).await,
            instant(&json!(deadline))
        );
    }
    let closed = app
        .operation(Some(&tenant.key), "CloseBatch", json!({"id": batch}))
        .await;
    assert!(closed["errors"].is_null(), "{closed}");
    let finished = crate::batches::wait_until_finished(
        &app,
        &tenant,
        batch.parse().unwrap(),
        Duration::from_secs(15),
    )
    .await;
    assert_eq!(finished["counts"]["succeeded"], json!(1), "{finished}");
    assert_eq!(finished["counts"]["failed"], json!(2), "{finished}");
    assert_eq!(decimal(&finished["reserved"]), Decimal::ZERO, "{finished}");
    for custom_id in ["stuck-1", "stuck-2"] {
        let id = item_id(&app, &tenant, &batch, custom_id).await;
        let job = app.wait_until_finished(&tenant, id, LIMIT).await;
        assert_eq!(job["error"]["code"], "DEADLINE_EXCEEDED", "{job}");
        assert_eq!(job["reservation"]["status"], "RELEASED", "{job}");
        assert!(job["charge"].is_null(), "{job}");
    }

    let late = app
        .operation(
            Some(&tenant.key),
            "AddBatchItems",
            json!({"batchId": batch, "items": [{"customId": "late", "messages": [{"role": "user", "content": "hi"}]}]}),
        )
        .await;
    assert_eq!(error_code(&late), "VALIDATION", "{late}");
    assert_billing_invariants(&app.app.db).await;
}

/// The configured default deadline is each item's too, counted from when it is added,
/// for a batch that names none.
async fn batch_items_take_the_configured_default_deadline(backend: Backend) {
    let folder = tempfile::tempdir().unwrap();
    let path = folder.path().join("jobledger.toml");
    std::fs::write(&path, "default_deadline_seconds = 600\n").unwrap();
    let options = AppOptions {
        config_file: Some(path),
        ..AppOptions::no_workers()
    };
    let app = spawn_app_with(backend, options).await;
    let tenant = app.funded_tenant("acme", "5").await;
    let created = create_batch(
        &app,
        &tenant,
        json!({"idempotencyKey": "docs", "model": "gpt-4o-mini", "maxOutputTokens": 50}),
    )
    .await;
    let batch = created["data"]["createBatch"]["batch"]["id"]
        .as_str()
        .unwrap_or_else(|| panic!("{created}"))
        .to_owned();
    let added = app
        .operation(
            Some(&tenant.key),
            "AddBatchItems",
            json!({"batchId": batch, "items": [{"customId": "a", "messages": [{"role": "user", "content": "hi"}]}]}),
        )
        .await;
    assert!(added["errors"].is_null(), "{added}");
    let id = item_id(&app, &tenant, &batch, "a").await;
    let span = deadline_of(&app, &tenant, id).await - Utc::now();
    assert!(
        span > chrono::Duration::seconds(590) && span <= chrono::Duration::seconds(600),
        "{span}"
    );
}

/// A create sent again after its deadline passed — its first answer lost — finds the
/// job and the batch the first try made; only a new one is refused for the deadline.
async fn a_create_sent_again_after_its_deadline_passed_replays(backend: Backend) {
    let app = spawn_app_with(backend, AppOptions::no_workers()).await;
    let tenant = app.funded_tenant("acme", "5").await;
    let deadline = in_millis(1_500);
    let mut input = job_input("lost-answer", "hi");
    input["deadline"] = json!(deadline);
    let first = app.create_job_ok(&tenant, input.clone()).await;
    let batch_input = json!({"idempotencyKey": "lost-batch", "model": "gpt-4o-mini",
                             "maxOutputTokens": 50, "deadline": deadline});
    let batch = create_batch(&app, &tenant, batch_input.clone()).await;
    assert!(batch["errors"].is_null(), "{batch}");
    tokio::time::sleep(Duration::from_millis(2_000)).await;

    let again = app.create_job(&tenant, input.clone()).await;
    assert!(again["errors"].is_null(), "{again}");
    assert_eq!(again["data"]["createJob"]["replayed"], true, "{again}");
    assert_eq!(
        again["data"]["createJob"]["job"]["id"],
        json!(first.to_string())
    );
    let mut changed = input.clone();
    changed["messages"][0]["content"] = json!("something else");
    assert_eq!(
        error_code(&app.create_job(&tenant, changed).await),
        "IDEMPOTENCY_CONFLICT"
    );
    let mut fresh = input;
    fresh["idempotencyKey"] = json!("new-key");
    assert_eq!(
        error_code(&app.create_job(&tenant, fresh).await),
        "VALIDATION"
    );

    let batch_again = create_batch(&app, &tenant, batch_input.clone()).await;
    assert_eq!(
        batch_again["data"]["createBatch"]["replayed"], true,
        "{batch_again}"
    );
    assert_eq!(
        batch_again["data"]["createBatch"]["batch"]["id"],
        batch["data"]["createBatch"]["batch"]["id"]
    );
    let mut other_batch = batch_input;
    other_batch["idempotencyKey"] = json!("new-batch");
    assert_eq!(
        error_code(&create_batch(&app, &tenant, other_batch).await),
        "VALIDATION"
    );
}
