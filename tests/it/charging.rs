//! The charging policy and the paid-call ceiling: every call the provider may bill is
//! recorded, charged as the policy says, and bounded per job — checked against the
//! simulator's own log of what it billed.

use crate::contract::operation;
use crate::helpers::{
    AppOptions, Backend, TestApp, TestTenant, decimal, error_code, job_input, spawn_app_with,
    test_worker_settings,
};
use crate::invariants::assert_billing_invariants;
use jobledger::jobs::worker::WorkerSettings;
use rust_decimal::Decimal;
use sea_orm::{ConnectionTrait, DbBackend};
use serde_json::{Value, json};
use std::str::FromStr;
use std::time::{Duration, Instant};

on_both_backends!(
    a_cancelled_streamed_job_pays_for_the_output_it_delivered,
    a_job_that_keeps_timing_out_stops_paying_at_its_ceiling,
    deploys_during_a_long_call_do_not_spend_its_paid_calls,
    hand_backs_past_the_free_ones_count_against_the_paid_call_ceiling,
    the_call_bound_policy_passes_an_unknown_outcome_on,
    a_finish_the_database_refuses_records_the_call_and_fails_the_job,
    cancelling_a_retry_in_its_backoff_keeps_what_its_attempts_charged,
    create_and_cancel_charges_each_prompt,
);

/// gpt-4o-mini's customer price for output: 0.60 per million × the 1.25 markup.
const OUTPUT_NANOS_PER_TOKEN: i64 = 750;

/// Waits until the job's first attempt has been recorded.
async fn wait_until_started(app: &TestApp, tenant: &TestTenant, id: uuid::Uuid) {
    let deadline = Instant::now() + Duration::from_secs(15);
    while app.job(tenant, id).await["attempts"]
        .as_array()
        .unwrap()
        .is_empty()
    {
        assert!(Instant::now() < deadline, "the job never started");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// The job with what each attempt charged, beyond the contract's `Job` query.
async fn job_with_charges(app: &TestApp, tenant: &TestTenant, id: uuid::Uuid) -> Value {
    let response = app
        .graphql(
            Some(&tenant.key),
            "query($id: UUID!) { job(id: $id) { status error { code }
               attempts { outcome customerCharge deliveredOutputTokens providerCost providerCostUpperBound }
               reservation { amount status settledAmount } charge { amount } } }",
            json!({"id": id}),
        )
        .await;
    assert!(response["errors"].is_null(), "{response}");
    response["data"]["job"].clone()
}

fn credits(nanos: i64) -> Decimal {
    Decimal::new(nanos, 9)
}

/// The sum of one decimal field over a job's attempts (missing values count 0).
fn attempts_sum(job: &Value, field: &str) -> Decimal {
    job["attempts"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|attempt| !attempt[field].is_null())
        .map(|attempt| decimal(&attempt[field]))
        .sum()
}

async fn a_cancelled_streamed_job_pays_for_the_output_it_delivered(backend: Backend) {
    let app = spawn_app_with(backend, AppOptions::default()).await;
    let tenant = app.funded_tenant("reader", "5").await;
    let reply = "word ".repeat(80);
    // The stream opens after half a second (time to subscribe: deltas are never
    // replayed) and sends a chunk every 1.5 s: the role, then four pieces of text. The
    // first piece lands at about 3.5 s, the second at 5 s; the cancel in between.
    let mut input = job_input(
        "read-then-cancel",
        &format!("[mock:reply={reply}][mock:delay_ms=500][mock:chunk_delay_ms=1500]"),
    );
    input["streamOutput"] = json!(true);
    let id = app.create_job_ok(&tenant, input).await;
    let document = operation("JobUpdates").replace("at }", "at delta }");
    let subscription = app.subscribe(
        &tenant.key,
        &document,
        json!({"jobId": id}),
        Duration::from_secs(30),
    );
    let cancel_after_the_first_piece = async {
        wait_until_started(&app, &tenant, id).await;
        tokio::time::sleep(Duration::from_millis(4_200)).await;
        let cancel = app
            .operation(Some(&tenant.key), "CancelJob", json!({"id": id}))
            .await;
        assert!(cancel["errors"].is_null(), "{cancel}");
    };
    let (events, ()) = tokio::join!(subscription, cancel_after_the_first_piece);
    let events = events.unwrap();
    let delivered: String = events
        .iter()
        .map(|payload| &payload["data"]["jobUpdates"])
        .filter(|event| event["kind"] == "OUTPUT_DELTA")
        .map(|event| event["delta"].as_str().unwrap().to_owned())
        .collect();
    assert!(
        !delivered.is_empty() && delivered.len() < reply.len(),
        "part of the reply was delivered before the cancel: {delivered:?}"
    );

    let job = job_with_charges(&app, &tenant, id).await;
    assert_eq!(job["status"], "CANCELLED", "{job}");
    let attempt = &job["attempts"][0];
    assert_eq!(attempt["outcome"], "CANCELLED");
    let tokens = (delivered.len() as i64 + 3) / 4;
    assert_eq!(attempt["deliveredOutputTokens"], tokens, "{attempt}");
    // The prompt it answered is charged too, as the simulator counts it (one token
    // per four bytes of the content, rounded up), at 0.1875 per million.
    let content = format!("[mock:reply={reply}][mock:delay_ms=500][mock:chunk_delay_ms=1500]");
    let prompt_tokens = (content.len() as i64 + 3) / 4;
    let charge = credits((prompt_tokens * 187_500 + 999) / 1_000 + tokens * OUTPUT_NANOS_PER_TOKEN);
    assert_eq!(decimal(&attempt["customerCharge"]), charge);
    assert_eq!(decimal(&job["charge"]["amount"]), charge, "{job}");
    assert_eq!(decimal(&job["reservation"]["settledAmount"]), charge);
    assert_eq!(job["reservation"]["status"], "SETTLED");
    // The provider billed the call: the simulator says so, the attempt keeps a bound.
    let calls = app.simulator.calls();
    assert_eq!(calls.len(), 1);
    assert!(calls[0].billed);
    assert!(!attempt["providerCostUpperBound"].is_null(), "{attempt}");
    assert_billing_invariants(&app.app.db).await;
}

/// A worker whose calls time out after a second.
fn impatient_worker() -> WorkerSettings {
    WorkerSettings {
        attempt_timeout: Duration::from_secs(1),
        ..test_worker_settings()
    }
}

async fn a_job_that_keeps_timing_out_stops_paying_at_its_ceiling(backend: Backend) {
    let app = spawn_app_with(backend, AppOptions::workers(impatient_worker())).await;
    let input = |key: &str| {
        json!({
            "idempotencyKey": key,
            "model": "gpt-4o-mini",
            "messages": [{"role": "user", "content": "never on time [mock:delay_ms=5000]"}],
            "maxOutputTokens": 16_384,
            "maxAttempts": 3,
        })
    };
    // One call's bound is about 0.0123 credits at the customer price (16,384 output
    // tokens, gpt-4o-mini's most); under the default policy the hold covers that one
    // call, so a balance short of it is refused outright.
    let poor = app.funded_tenant("poor", "0.012").await;
    let refused = app.create_job(&poor, input("too-many-calls")).await;
    assert_eq!(error_code(&refused), "INSUFFICIENT_CREDITS", "{refused}");

    let tenant = app.funded_tenant("patient", "1").await;
    let id = app.create_job_ok(&tenant, input("slow")).await;
    let job = app
        .wait_until_finished(&tenant, id, Duration::from_secs(40))
        .await;
    assert_eq!(job["status"], "FAILED", "{job}");
    assert_eq!(job["error"]["code"], "OUTCOME_UNKNOWN", "{job}");
    let attempts = job["attempts"].as_array().unwrap();
    assert_eq!(attempts.len(), 3);
    assert!(
        attempts
            .iter()
            .all(|attempt| attempt["outcome"] == "UNKNOWN")
    );
    // Every billed call is recorded, and no more calls were made than the ceiling.
    let billed = app.billed_calls();
    assert_eq!(billed, attempts.len());
    // What those calls may have cost never passes the paid-call ceiling: three call
    // bounds. The hold covers one call, what the customer may pay; the rest is the
    // operator's.
    let exposure = attempts_sum(&job, "providerCostUpperBound");
    let one_call = decimal(&attempts[0]["providerCostUpperBound"]);
    assert!(
        exposure <= one_call * Decimal::from(3),
        "bounds {exposure} over three calls of {one_call}"
    );
    let hold = decimal(&job["reservation"]["amount"]);
    assert!(
        exposure > hold,
        "the failed calls are held for no more than one: {hold}"
    );
    assert!(
        job["charge"].is_null(),
        "the default policy absorbs unknown outcomes"
    );
    assert_billing_invariants(&app.app.db).await;
}

/// Restarts the application `deploys` times, each while the job's next call runs (a
/// shutdown as SIGTERM does it, with a grace period shorter than the call).
async fn deploy_during_calls(
    mut app: TestApp,
    tenant: &TestTenant,
    id: uuid::Uuid,
    deploys: usize,
) -> TestApp {
    for deploy in 1..=deploys {
        let deadline = Instant::now() + Duration::from_secs(15);
        while app.job(tenant, id).await["attempts"]
            .as_array()
            .unwrap()
            .len()
            < deploy
        {
            assert!(Instant::now() < deadline, "call {deploy} never started");
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        app = app.restart(AppOptions::workers(quick_shutdown())).await;
    }
    app
}

/// Workers whose grace period at shutdown is shorter than the calls they run.
fn quick_shutdown() -> WorkerSettings {
    WorkerSettings {
        shutdown_grace: Duration::from_millis(300),
        ..test_worker_settings()
    }
}

/// A rolling restart is the operator's doing: three deploys during a long call hand
/// the job back three times without spending its paid calls, and it then succeeds.
async fn deploys_during_a_long_call_do_not_spend_its_paid_calls(backend: Backend) {
    let app = spawn_app_with(backend, AppOptions::workers(quick_shutdown())).await;
    let tenant = app.funded_tenant("deploys-a-lot", "5").await;
    let input = job_input("long-call", "take your time [mock:delay_ms=8000]");
    let id = app.create_job_ok(&tenant, input).await;
    let app = deploy_during_calls(app, &tenant, id, 3).await;
    let job = app
        .wait_until_finished(&tenant, id, Duration::from_secs(20))
        .await;
    assert_eq!(job["status"], "SUCCEEDED", "{job}");
    let outcomes: Vec<_> = job["attempts"]
        .as_array()
        .unwrap()
        .iter()
        .map(|attempt| attempt["outcome"].as_str().unwrap())
        .collect();
    assert_eq!(
        outcomes,
        ["UNKNOWN", "UNKNOWN", "UNKNOWN", "SUCCEEDED"],
        "{job}"
    );
    for attempt in &job["attempts"].as_array().unwrap()[..3] {
        assert_eq!(attempt["errorCode"], "WORKER_SHUTDOWN", "{job}");
        assert!(
            attempt["providerCostUpperBound"].is_string(),
            "may be billed: {job}"
        );
    }
    assert_eq!(job["attemptCount"], 1, "hand-backs spend no attempt: {job}");
    let billed = app.billed_calls();
    assert_eq!(billed, 4, "every call is on record: {job}");
    // The customer pays the answer; the aborted calls are the operator's.
    let charged = job_with_charges(&app, &tenant, id).await;
    for attempt in &charged["attempts"].as_array().unwrap()[..3] {
        assert_eq!(
            decimal(&attempt["customerCharge"]),
            Decimal::ZERO,
            "{charged}"
        );
    }
    assert_eq!(
        decimal(&charged["charge"]["amount"]),
        decimal(&charged["attempts"][3]["customerCharge"]),
        "{charged}"
    );
    assert_billing_invariants(&app.app.db).await;
}

/// Hand-backs past the free ones are paid calls again: the operator's exposure per job
/// stays bounded however often it restarts.
async fn hand_backs_past_the_free_ones_count_against_the_paid_call_ceiling(backend: Backend) {
    let app = spawn_app_with(backend, AppOptions::workers(quick_shutdown())).await;
    let tenant = app.funded_tenant("deploys-all-day", "5").await;
    let mut input = job_input("longer-call", "take your time [mock:delay_ms=20000]");
    input["maxAttempts"] = json!(1);
    let id = app.create_job_ok(&tenant, input).await;
    let app = deploy_during_calls(app, &tenant, id, 4).await;
    let job = app
        .wait_until_finished(&tenant, id, Duration::from_secs(10))
        .await;
    assert_eq!(job["status"], "FAILED", "{job}");
    assert_eq!(job["error"]["code"], "PAID_CALL_LIMIT", "{job}");
    let attempts = job["attempts"].as_array().unwrap();
    assert_eq!(
        attempts.len(),
        4,
        "three free hand-backs and one paid call: {job}"
    );
    assert!(
        attempts
            .iter()
            .all(|attempt| attempt["errorCode"] == "WORKER_SHUTDOWN"),
        "{job}"
    );
    let billed = app.billed_calls();
    assert_eq!(billed, 4, "four calls, then no more");
    assert!(job["charge"].is_null(), "the default policy absorbs them");
    assert_billing_invariants(&app.app.db).await;
}

async fn the_call_bound_policy_passes_an_unknown_outcome_on(backend: Backend) {
    let folder = tempfile::tempdir().unwrap();
    let config = folder.path().join("jobledger.toml");
    std::fs::write(
        &config,
        "[charging]\nunknown_outcome = \"call_bound\"\ncancelled_during_call = \"delivered_output\"\n",
    )
    .unwrap();
    let options = AppOptions {
        worker: Some(impatient_worker()),
        config_file: Some(config),
        ..AppOptions::default()
    };
    let app = spawn_app_with(backend, options).await;
    let tenant = app.funded_tenant("pays-for-risk", "5").await;
    let content = "late [mock:delay_ms=5000]";
    let mut input = job_input("unknown-once", content);
    input["retryUnknownOutcome"] = json!(false);
    let id = app.create_job_ok(&tenant, input).await;
    app.wait_until_finished(&tenant, id, Duration::from_secs(20))
        .await;
    let job = job_with_charges(&app, &tenant, id).await;
    assert_eq!(job["status"], "FAILED", "{job}");
    assert_eq!(job["attempts"][0]["outcome"], "UNKNOWN");
    // The bound at the customer price: the simulator's count of the prompt (a
    // quarter of its bytes, rounded up) at 0.1875 per million and 100 output tokens
    // at 0.75 per million, each rounded up.
    let input_tokens = (content.len() as i64 + 3) / 4;
    let bound = (input_tokens * 187_500 + 999) / 1_000 + 100 * OUTPUT_NANOS_PER_TOKEN;
    assert_eq!(
        decimal(&job["attempts"][0]["customerCharge"]),
        credits(bound)
    );
    assert_eq!(decimal(&job["charge"]["amount"]), credits(bound), "{job}");
    assert_eq!(job["reservation"]["status"], "SETTLED");
    let balance = app.balance(&tenant).await;
    assert_eq!(
        decimal(&balance["charged"]),
        credits(bound),
        "the customer paid the bound: {balance}"
    );
    assert_billing_invariants(&app.app.db).await;
}

async fn a_finish_the_database_refuses_records_the_call_and_fails_the_job(backend: Backend) {
    let app = spawn_app_with(backend, AppOptions::default()).await;
    // A trigger stands for any refusal that trying again cannot cure.
    let db = &app.app.db;
    let refuse = match db.get_database_backend() {
        DbBackend::Postgres => vec![
            "CREATE FUNCTION refuse_unstorable() RETURNS trigger AS $$ BEGIN \
             RAISE EXCEPTION 'refused' USING ERRCODE = '22000'; END $$ LANGUAGE plpgsql",
            "CREATE TRIGGER refuse_unstorable BEFORE UPDATE ON jobs FOR EACH ROW \
             WHEN (NEW.result LIKE '%unstorable%') EXECUTE FUNCTION refuse_unstorable()",
        ],
        _ => vec![
            "CREATE TRIGGER refuse_unstorable BEFORE UPDATE OF result ON jobs \
             WHEN NEW.result LIKE '%unstorable%' BEGIN SELECT RAISE(ABORT, 'refused'); END",
        ],
    };
    for statement in refuse {
        db.execute_unprepared(statement).await.unwrap();
    }
    let tenant = app.funded_tenant("unlucky", "5").await;
    let id = app
        .create_job_ok(
            &tenant,
            job_input("refused", "[mock:reply=an unstorable answer]"),
        )
        .await;
    let job = app
        .wait_until_finished(&tenant, id, Duration::from_secs(20))
        .await;
    assert_eq!(job["status"], "FAILED", "{job}");
    assert_eq!(job["error"]["code"], "RESULT_NOT_STORED", "{job}");
    let calls = app.simulator.calls();
    assert_eq!(calls.len(), 1, "not retried: the answer was paid for once");
    let attempt = &job["attempts"][0];
    assert_eq!(attempt["outcome"], "PERMANENT_ERROR");
    assert_eq!(
        attempt["outputTokens"], calls[0].output_tokens,
        "exact usage kept"
    );
    assert!(!attempt["providerCost"].is_null(), "exact cost: {attempt}");
    assert!(
        job["charge"].is_null(),
        "the customer got nothing and pays nothing"
    );
    assert_billing_invariants(db).await;
}

/// A streamed attempt that timed out charged its delivered output; the job then waits
/// for its retry. A cancel in that wait ends the job: the charge stays.
async fn cancelling_a_retry_in_its_backoff_keeps_what_its_attempts_charged(backend: Backend) {
    let worker = WorkerSettings {
        attempt_timeout: Duration::from_secs(3),
        ..test_worker_settings()
    };
    let app = spawn_app_with(backend, AppOptions::workers(worker)).await;
    let tenant = app.funded_tenant("reads-then-cancels", "5").await;
    let reply = "word ".repeat(80);
    // Chunks every 1.2 s: the role, then the first piece at 2.4 s; the timeout at 3 s.
    let mut input = job_input(
        "stream-timeout-cancel",
        &format!("[mock:reply={reply}][mock:chunk_delay_ms=1200]"),
    );
    input["streamOutput"] = json!(true);
    let id = app.create_job_ok(&tenant, input).await;
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let job = app.job(&tenant, id).await;
        if job["status"] == "QUEUED" && job["attempts"][0]["outcome"] == "UNKNOWN" {
            break;
        }
        assert!(Instant::now() < deadline, "never waited for a retry: {job}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let cancel = app
        .operation(Some(&tenant.key), "CancelJob", json!({"id": id}))
        .await;
    assert_eq!(
        cancel["data"]["cancelJob"]["status"], "CANCELLED",
        "{cancel}"
    );
    let job = job_with_charges(&app, &tenant, id).await;
    let attempt_charge = decimal(&job["attempts"][0]["customerCharge"]);
    assert!(attempt_charge > Decimal::ZERO, "{job}");
    assert_eq!(decimal(&job["charge"]["amount"]), attempt_charge, "{job}");
    assert_eq!(job["reservation"]["status"], "SETTLED");
    assert_billing_invariants(&app.app.db).await;
}

#[test]
fn output_nanos_per_token_is_the_marked_up_list_price() {
    let per_million = Decimal::from_str("0.60").unwrap() * Decimal::from_str("1.25").unwrap();
    assert_eq!(
        per_million * Decimal::from(1_000),
        Decimal::from(OUTPUT_NANOS_PER_TOKEN)
    );
}

/// A provider bills a prompt once it has started on it: under the default policy a
/// call the tenant cancels after it was sent charges the prompt, so a loop of create
/// and cancel is not free, and it fills the spend counters as it goes.
async fn create_and_cancel_charges_each_prompt(backend: Backend) {
    let worker = WorkerSettings {
        concurrency: 10,
        ..test_worker_settings()
    };
    let app = spawn_app_with(backend, AppOptions::workers(worker)).await;
    let tenant = app.funded_tenant("cancels", "5").await;
    let content = "answer at length [mock:delay_ms=20000]";
    let mut ids = Vec::new();
    for number in 0..10 {
        let key = format!("cancelled-{number}");
        ids.push(app.create_job_ok(&tenant, job_input(&key, content)).await);
    }
    for id in &ids {
        wait_until_started(&app, &tenant, *id).await;
    }
    for id in &ids {
        let cancel = app
            .operation(Some(&tenant.key), "CancelJob", json!({"id": id}))
            .await;
        assert_eq!(
            cancel["data"]["cancelJob"]["cancelRequested"], true,
            "{cancel}"
        );
    }
    // The prompt as the simulator counts it, which its estimate is: bytes / 4 tokens,
    // rounded up, at 0.1875 per million, rounded up to the nano-credit.
    let prompt_tokens = (content.len() as i64 + 3) / 4;
    let prompt = credits((prompt_tokens * 187_500 + 999) / 1_000);
    for id in &ids {
        app.wait_until_finished(&tenant, *id, Duration::from_secs(10))
            .await;
        let job = job_with_charges(&app, &tenant, *id).await;
        assert_eq!(job["status"], "CANCELLED", "{job}");
        assert_eq!(job["attempts"][0]["outcome"], "CANCELLED", "{job}");
        assert_eq!(decimal(&job["attempts"][0]["customerCharge"]), prompt);
        assert_eq!(decimal(&job["charge"]["amount"]), prompt, "{job}");
        assert_eq!(job["reservation"]["status"], "SETTLED");
    }
    let total = prompt * Decimal::from(ids.len());
    let balance = app.balance(&tenant).await;
    assert_eq!(decimal(&balance["charged"]), total, "{balance}");
    // The spend counts the prompts charged, and what the operator absorbs of each
    // call's cost bound beyond its prompt (the provider may have answered in full),
    // within what the hold released.
    let mut spent = Decimal::ZERO;
    for id in &ids {
        let job = app.job(&tenant, *id).await;
        let exposure =
            decimal(&job["cost"]["providerCost"]) + decimal(&job["cost"]["providerCostUpperBound"]);
        let released = decimal(&job["reservation"]["releasedAmount"]);
        let absorbed = (exposure - prompt).max(Decimal::ZERO).min(released);
        assert!(absorbed > Decimal::ZERO, "{job}");
        spent += prompt + absorbed;
    }
    let account = app
        .operation(Some(&tenant.key), "AccountLimits", json!({}))
        .await;
    assert_eq!(
        decimal(&account["data"]["account"]["spend"]["today"]),
        spent,
        "the prompts and the absorbed bounds count against the spend caps: {account}"
    );
    let billed = app.billed_calls();
    assert_eq!(
        billed,
        ids.len(),
        "the provider billed every cancelled call"
    );
    assert_billing_invariants(&app.app.db).await;
}
