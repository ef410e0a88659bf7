//! Flow control: provider and model rate limits that hold across worker processes,
//! tenant limits, tokens admitted by a job's bound, and a 429 that pauses a model for
//! every worker. Each scenario ends with the billing audit.

use crate::helpers::{
    AppOptions, Backend, TestApp, TestTenant, job_input, spawn_app_with, test_worker_settings,
};
use crate::invariants::assert_billing_invariants;
use entity::{Timestamp, attempts, rate_limit_buckets};
use jobledger::config::file::ConfigFile;
use jobledger::jobs::flow::TokenCounting;
use jobledger::jobs::worker::WorkerSettings;
use sea_orm::{ColumnTrait, EntityTrait, QueryFilter, QueryOrder};
use serde_json::{Value, json};
use std::path::{Path, PathBuf};
use std::time::Duration;
use uuid::Uuid;

on_both_backends!(
    a_model_limit_holds_across_worker_processes,
    a_provider_limit_covers_every_model_it_serves,
    a_tokens_limit_admits_jobs_by_their_token_bound,
    a_finished_call_gives_back_the_tokens_it_did_not_use,
    a_provider_counting_requested_tokens_gets_nothing_back,
    a_large_job_is_not_starved_by_a_stream_of_small_ones,
    a_tenant_limit_paces_that_tenant_only,
    a_rate_limited_answer_pauses_the_model_for_every_worker,
);

/// A config file in a folder that lives as long as the returned guard.
fn config_file(text: &str) -> (tempfile::TempDir, PathBuf) {
    let folder = tempfile::tempdir().unwrap();
    let path = folder.path().join("jobledger.toml");
    std::fs::write(&path, text).unwrap();
    (folder, path)
}

fn with_config(path: &Path) -> AppOptions {
    AppOptions {
        config_file: Some(path.to_owned()),
        ..AppOptions::default()
    }
}

/// The API and one worker pool in one process, a second worker pool in another, both
/// reading `config`.
async fn two_worker_processes(backend: Backend, config: &Path) -> (TestApp, TestApp) {
    let first = spawn_app_with(backend, with_config(config)).await;
    let second = first.another_process(with_config(config)).await;
    (first, second)
}

/// Creates one job per input and waits until all are finished.
async fn run_all(app: &TestApp, tenant: &TestTenant, inputs: Vec<Value>) -> Vec<Uuid> {
    let mut ids = Vec::new();
    for input in inputs {
        ids.push(app.create_job_ok(tenant, input).await);
    }
    for id in &ids {
        let job = app
            .wait_until_finished(tenant, *id, Duration::from_secs(60))
            .await;
        assert_eq!(job["status"], "SUCCEEDED", "{job}");
    }
    ids
}

/// Every attempt of `jobs`, by start time.
async fn attempts_of(app: &TestApp, jobs: &[Uuid]) -> Vec<attempts::Model> {
    attempts::Entity::find()
        .filter(attempts::Column::JobId.is_in(jobs.iter().copied()))
        .order_by_asc(attempts::Column::StartedAt)
        .all(&app.app.db)
        .await
        .unwrap()
}

/// The largest total of `weight` over the starts in any window of `window` (starts
/// sorted): every window worth checking begins at a start.
fn busiest_window(starts: &[(Timestamp, f64)], window: Duration) -> f64 {
    let window = window.as_micros() as i64;
    starts
        .iter()
        .enumerate()
        .map(|(first, (from, _))| {
            starts[first..]
                .iter()
                .take_while(|(at, _)| at.micros() - from.micros() <= window)
                .map(|(_, weight)| weight)
                .sum()
        })
        .fold(0.0, f64::max)
}

/// `count` jobs of `tenant` at once, each with its own key.
fn inputs(prefix: &str, count: usize, content: &str) -> Vec<Value> {
    (0..count)
        .map(|index| job_input(&format!("{prefix}-{index}"), content))
        .collect()
}

async fn a_model_limit_holds_across_worker_processes(backend: Backend) {
    // One request a second, at most one at once: any 1-second window holds at most
    // two starts (one at each end).
    let (_folder, config) = config_file("[models.\"gpt-4o-mini\"]\nrequests_per_minute = 60\n");
    // Three worker processes, one call at a time each, every call 2.5 s long: with
    // the budget each second's job must go to whichever process is free, so all three
    // take part; without it all three would start at once.
    let one_at_a_time = AppOptions {
        worker: Some(WorkerSettings {
            concurrency: 1,
            ..test_worker_settings()
        }),
        ..with_config(&config)
    };
    let api = spawn_app_with(
        backend,
        AppOptions {
            worker: None,
            ..with_config(&config)
        },
    )
    .await;
    let mut workers = Vec::new();
    for _ in 0..3 {
        workers.push(api.another_process(one_at_a_time.clone()).await);
    }
    let tenant = api.funded_tenant("paced", "20").await;
    let ids = run_all(
        &api,
        &tenant,
        inputs("paced", 6, "hello [mock:delay_ms=2500]"),
    )
    .await;
    let attempts = attempts_of(&api, &ids).await;
    assert_eq!(attempts.len(), 6, "one attempt each");
    let starts: Vec<(Timestamp, f64)> = attempts.iter().map(|a| (a.started_at, 1.0)).collect();
    assert!(
        busiest_window(&starts, Duration::from_secs(1)) <= 2.0,
        "more than the bucket allows in one second: {:?}",
        starts.iter().map(|(at, _)| at.micros()).collect::<Vec<_>>()
    );
    let worker_ids: std::collections::BTreeSet<&str> =
        attempts.iter().map(|a| a.worker_id.as_str()).collect();
    assert_eq!(
        worker_ids.len(),
        3,
        "every process ran jobs: {worker_ids:?}"
    );
    assert_billing_invariants(&api.app.db).await;
}

async fn a_provider_limit_covers_every_model_it_serves(backend: Backend) {
    let (_folder, config) = config_file(
        "[providers.sim]\nkind = \"simulator\"\nrequests_per_minute = 60\n\n\
         [routes]\n\"gpt-*\" = \"sim\"\n",
    );
    let (api, _other) = two_worker_processes(backend, &config).await;
    let tenant = api.funded_tenant("two-models", "20").await;
    let mut all = inputs("mini", 3, "hello");
    for (index, mut input) in inputs("full", 3, "hello").into_iter().enumerate() {
        input["model"] = json!("gpt-4o");
        input["idempotencyKey"] = json!(format!("full-{index}"));
        all.push(input);
    }
    let ids = run_all(&api, &tenant, all).await;
    let attempts = attempts_of(&api, &ids).await;
    let starts: Vec<(Timestamp, f64)> = attempts.iter().map(|a| (a.started_at, 1.0)).collect();
    assert!(
        busiest_window(&starts, Duration::from_secs(1)) <= 2.0,
        "two models together passed their provider's limit: {:?}",
        starts.iter().map(|(at, _)| at.micros()).collect::<Vec<_>>()
    );
    assert_billing_invariants(&api.app.db).await;
}

/// A job's token bound as the claim counts it.
async fn token_bounds(app: &TestApp, ids: &[Uuid]) -> std::collections::HashMap<Uuid, f64> {
    entity::jobs::Entity::find()
        .filter(entity::jobs::Column::Id.is_in(ids.iter().copied()))
        .all(&app.app.db)
        .await
        .unwrap()
        .into_iter()
        .map(|job| {
            (
                job.id,
                job.token_bound.expect("new jobs carry a bound") as f64,
            )
        })
        .collect()
}

async fn a_tokens_limit_admits_jobs_by_their_token_bound(backend: Backend) {
    // 12,000 tokens a minute: a bucket of 200, refilled at 200 a second. Each job's
    // bound is about 120 tokens (prompt and 100 of output), so the bucket admits one
    // job, then another after a moment: requests alone would let all start at once.
    // The calls last longer than it takes to start them all, so no finished call
    // gives unused tokens back in between: every start takes its whole bound.
    let (_folder, config) = config_file("[models.\"gpt-4o-mini\"]\ntokens_per_minute = 12000\n");
    let (api, _other) = two_worker_processes(backend, &config).await;
    let tenant = api.funded_tenant("tokens", "20").await;
    let ids = run_all(
        &api,
        &tenant,
        inputs("tokens", 6, "hi [mock:delay_ms=4000]"),
    )
    .await;
    let bounds = token_bounds(&api, &ids).await;
    let attempts = attempts_of(&api, &ids).await;
    let starts: Vec<(Timestamp, f64)> = attempts
        .iter()
        .map(|a| (a.started_at, bounds[&a.job_id]))
        .collect();
    assert!(
        bounds.values().all(|bound| *bound < 200.0),
        "each job fits the bucket: {bounds:?}"
    );
    // What one second can hold: the full bucket, one second of refill, and the call
    // that took the bucket into debt.
    let largest = bounds.values().copied().fold(0.0, f64::max);
    let busiest = busiest_window(&starts, Duration::from_secs(1));
    assert!(
        busiest <= 400.0 + largest,
        "{busiest} tokens started within one second: {starts:?}"
    );
    assert_billing_invariants(&api.app.db).await;
}

async fn a_finished_call_gives_back_the_tokens_it_did_not_use(backend: Backend) {
    // A bucket of 1,000 tokens; the job may use 4,000 (its bound) and uses a few.
    let (_folder, config) = config_file("[models.\"gpt-4o-mini\"]\ntokens_per_minute = 60000\n");
    let app = spawn_app_with(backend, with_config(&config)).await;
    let tenant = app.funded_tenant("gives-back", "20").await;
    let mut input = job_input("large-bound", "short answer please");
    input["maxOutputTokens"] = json!(4_000);
    let ids = run_all(&app, &tenant, vec![input]).await;
    let attempt = attempts_of(&app, &ids).await.remove(0);
    let used = attempt.input_tokens.unwrap() + attempt.output_tokens.unwrap();
    // Admitted by a full bucket (1,000) at its bound, then given back all it did not
    // use (written back within a moment): what stays taken is exactly what it used.
    wait_for_model_tokens(&app, 1_000.0 - used as f64).await;
    // A call the provider refuses cannot have been billed: it gives its whole bound
    // back, and the bucket (full again when this claim read it) stays full.
    run_refused(&app, &tenant).await;
    wait_for_model_tokens(&app, 1_000.0).await;
    assert_billing_invariants(&app.app.db).await;
}

async fn a_provider_counting_requested_tokens_gets_nothing_back(backend: Backend) {
    // The provider says it counts what a request may use, answered or refused (as
    // OpenAI does): the model's bucket, which counts as its provider does, keeps every
    // call's whole bound.
    let (_folder, config) = config_file(
        "[providers.sim]\nkind = \"simulator\"\ntokens_counted = \"requested\"\n\n\
         [routes]\n\"gpt-*\" = \"sim\"\n\n\
         [models.\"gpt-4o-mini\"]\ntokens_per_minute = 60000\n",
    );
    let app = spawn_app_with(backend, with_config(&config)).await;
    let tenant = app.funded_tenant("requested", "20").await;
    let mut input = job_input("large-bound", "short answer please");
    input["maxOutputTokens"] = json!(4_000);
    let answered = run_all(&app, &tenant, vec![input]).await;
    let bound = token_bounds(&app, &answered).await[&answered[0]];
    let attempt = attempts_of(&app, &answered).await.remove(0);
    assert!(
        attempt.input_tokens.unwrap() + attempt.output_tokens.unwrap() < 100,
        "the call used a few tokens of its bound: {attempt:?}"
    );
    // A bucket of 1,000 admitted the call by its bound; returns are written every
    // 250 ms, so after a second one would be on record.
    tokio::time::sleep(Duration::from_secs(1)).await;
    wait_for_model_tokens(&app, 1_000.0 - bound).await;
    // Refill (1,000 tokens a second) pays the debt back and fills the bucket again
    // within five seconds, so the refused job is admitted from a full bucket.
    tokio::time::sleep(Duration::from_secs(5)).await;
    let refused = run_refused(&app, &tenant).await;
    let refused_bound = token_bounds(&app, &[refused]).await[&refused];
    tokio::time::sleep(Duration::from_secs(1)).await;
    wait_for_model_tokens(&app, 1_000.0 - refused_bound).await;
    assert_billing_invariants(&app.app.db).await;
}

async fn a_large_job_is_not_starved_by_a_stream_of_small_ones(backend: Backend) {
    // 100 tokens a second, nothing given back: the small jobs (a bound of a few dozen
    // tokens) keep the bucket from ever filling while they last. A job of several
    // hundred tokens, created after them, must still start before they are all done.
    let (_folder, config) = config_file(
        "[models.\"gpt-4o-mini\"]\ntokens_per_minute = 6000\ntokens_counted = \"requested\"\n",
    );
    // The small jobs are queued before the workers start, so the stream is there from
    // the first claim.
    let api = spawn_app_with(
        backend,
        AppOptions {
            config_file: Some(config.clone()),
            ..AppOptions::no_workers()
        },
    )
    .await;
    let mut small = Vec::new();
    let mut waits = Vec::new();
    for tenant_index in 0..3 {
        let tenant = api
            .funded_tenant(&format!("small-{tenant_index}"), "20")
            .await;
        for index in 0..10 {
            let mut input = job_input(&format!("small-{index}"), "hi");
            input["maxOutputTokens"] = json!(1);
            let id = api.create_job_ok(&tenant, input).await;
            small.push(id);
            waits.push((tenant.clone(), id));
        }
    }
    let large_tenant = api.funded_tenant("large", "20").await;
    let _workers = [
        api.another_process(with_config(&config)).await,
        api.another_process(with_config(&config)).await,
    ];
    // The large job arrives once the stream runs, when the bucket is no longer full.
    while attempts_of(&api, &small).await.len() < 5 {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let mut input = job_input("large", "hi");
    input["maxOutputTokens"] = json!(400);
    let large = api.create_job_ok(&large_tenant, input).await;
    waits.push((large_tenant, large));
    for (tenant, id) in &waits {
        let job = api
            .wait_until_finished(tenant, *id, Duration::from_secs(90))
            .await;
        assert_eq!(job["status"], "SUCCEEDED", "{job}");
    }
    let large_started = attempts_of(&api, &[large]).await.remove(0).started_at;
    let small_after = attempts_of(&api, &small)
        .await
        .iter()
        .filter(|attempt| attempt.started_at > large_started)
        .count();
    // Waiting for a full bucket, it would start after every small job.
    assert!(
        small_after >= 5,
        "the large job started after {} of 30 small jobs",
        30 - small_after
    );
    assert_billing_invariants(&api.app.db).await;
}

/// Runs a job with a bound of over 4,000 tokens that the provider refuses (400).
async fn run_refused(app: &TestApp, tenant: &TestTenant) -> Uuid {
    let mut refused = job_input("refused", "no [mock:status=400]");
    refused["maxOutputTokens"] = json!(4_000);
    refused["maxAttempts"] = json!(1);
    let refused = app.create_job_ok(tenant, refused).await;
    let job = app
        .wait_until_finished(tenant, refused, Duration::from_secs(30))
        .await;
    assert_eq!(job["status"], "FAILED", "{job}");
    refused
}

/// Waits until the stored token level of gpt-4o-mini's bucket is `expected`.
async fn wait_for_model_tokens(app: &TestApp, expected: f64) {
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    loop {
        let bucket = rate_limit_buckets::Entity::find_by_id((
            entity::BucketScope::Model,
            "gpt-4o-mini".to_owned(),
        ))
        .one(&app.app.db)
        .await
        .unwrap()
        .expect("the claim wrote the model's bucket");
        if bucket.tokens == Some(expected) {
            return;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "{bucket:?}, expected {expected}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

async fn a_tenant_limit_paces_that_tenant_only(backend: Backend) {
    let options = AppOptions::workers(test_worker_settings());
    let api = spawn_app_with(backend, options).await;
    let _other = api
        .another_process(AppOptions::workers(test_worker_settings()))
        .await;
    let paced = api.funded_tenant("paced", "20").await;
    let free = api.funded_tenant("free", "20").await;
    let limits = api
        .operation(
            Some(crate::helpers::ADMIN_TOKEN),
            "SetTenantLimits",
            json!({"input": {"tenantId": paced.id, "requestsPerMinute": 60}}),
        )
        .await;
    assert!(limits["errors"].is_null(), "{limits}");
    let mut paced_ids = Vec::new();
    let mut free_ids = Vec::new();
    for index in 0..5 {
        paced_ids.push(
            api.create_job_ok(&paced, job_input(&format!("paced-{index}"), "hello"))
                .await,
        );
        free_ids.push(
            api.create_job_ok(&free, job_input(&format!("free-{index}"), "hello"))
                .await,
        );
    }
    for (tenant, ids) in [(&paced, &paced_ids), (&free, &free_ids)] {
        for id in ids {
            let job = api
                .wait_until_finished(tenant, *id, Duration::from_secs(60))
                .await;
            assert_eq!(job["status"], "SUCCEEDED", "{job}");
        }
    }
    let paced_attempts = attempts_of(&api, &paced_ids).await;
    let starts: Vec<(Timestamp, f64)> =
        paced_attempts.iter().map(|a| (a.started_at, 1.0)).collect();
    assert!(
        busiest_window(&starts, Duration::from_secs(1)) <= 2.0,
        "the tenant's limit did not hold: {starts:?}"
    );
    // The other tenant is not held back by it: all its jobs started before the paced
    // tenant's last one.
    let free_attempts = attempts_of(&api, &free_ids).await;
    let last_paced = paced_attempts.last().unwrap().started_at;
    assert!(
        free_attempts.iter().all(|a| a.started_at < last_paced),
        "the free tenant waited for the paced one"
    );
    assert_billing_invariants(&api.app.db).await;
}

async fn a_rate_limited_answer_pauses_the_model_for_every_worker(backend: Backend) {
    let api = spawn_app_with(backend, AppOptions::default()).await;
    let _other = api.another_process(AppOptions::default()).await;
    let tenant = api.funded_tenant("throttled", "20").await;
    let first = api
        .create_job_ok(
            &tenant,
            job_input(
                "first",
                "hello [mock:status=429][mock:retry_after=4][mock:fail_first=1]",
            ),
        )
        .await;
    // Wait for the 429 to be recorded: its retry event says until when the model waits.
    let paused_until = loop {
        let response = api
            .graphql(
                Some(&tenant.key),
                "query($id: UUID!) { job(id: $id) { events { kind data } } }",
                json!({"id": first}),
            )
            .await;
        let retry = response["data"]["job"]["events"]
            .as_array()
            .unwrap_or_else(|| panic!("{response}"))
            .iter()
            .find(|event| event["kind"] == "RETRY_SCHEDULED")
            .cloned();
        if let Some(retry) = retry {
            let until = retry["data"]["modelPausedUntil"]
                .as_str()
                .unwrap_or_else(|| panic!("no pause in {retry}"));
            break Timestamp::from(
                chrono::DateTime::parse_from_rfc3339(until)
                    .unwrap()
                    .to_utc(),
            );
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    // The same model waits on every worker; another model does not.
    let mut other = job_input("other-model", "hello");
    other["model"] = json!("gpt-4o");
    let mut all = inputs("same-model", 6, "hello");
    all.push(other);
    let mut same_model = run_all(&api, &tenant, all).await;
    let other_model = vec![same_model.pop().unwrap()];
    for attempt in attempts_of(&api, &same_model).await {
        assert!(
            attempt.started_at >= paused_until,
            "a job of the paused model started at {:?}, before {paused_until:?}",
            attempt.started_at
        );
    }
    // Then the model ramps back up from one call a second: the eight free slots of
    // the two processes do not all call the provider the moment the pause ends.
    same_model.push(first);
    let first_second = attempts_of(&api, &same_model)
        .await
        .iter()
        .filter(|attempt| {
            attempt.started_at >= paused_until
                && attempt.started_at.micros() < paused_until.micros() + 1_000_000
        })
        .count();
    assert!(
        first_second <= 1,
        "{first_second} calls started in the first second after the pause"
    );
    let other_attempt = attempts_of(&api, &other_model).await.remove(0);
    assert!(
        other_attempt.started_at < paused_until,
        "another model was held back too"
    );
    let job = api
        .wait_until_finished(&tenant, first, Duration::from_secs(30))
        .await;
    assert_eq!(job["status"], "SUCCEEDED", "{job}");
    let pauses: f64 = [&api, &_other]
        .iter()
        .map(|app| {
            app.app
                .metrics
                .render()
                .lines()
                .filter(|line| {
                    line.starts_with("jobledger_model_pauses_total{model=\"gpt-4o-mini\"}")
                })
                .filter_map(|line| line.rsplit(' ').next()?.parse::<f64>().ok())
                .sum::<f64>()
        })
        .sum();
    assert_eq!(pauses, 1.0, "one 429, one pause");
    assert_billing_invariants(&api.app.db).await;
}

#[test]
fn rate_limits_in_the_config_file_are_whole_positive_numbers() {
    let parse = |text: &str| ConfigFile::parse(text, Path::new("limits.toml"), |_| None);
    let config = parse(
        "[providers.sim]\nkind = \"simulator\"\ntokens_per_minute = 90000\n\n\
         [models.\"gpt-4o-mini\"]\nrequests_per_minute = 500\n",
    )
    .unwrap();
    assert_eq!(
        config.models["gpt-4o-mini"]
            .rate_limit
            .requests_per_minute
            .map(|count| count.get()),
        Some(500)
    );
    assert_eq!(
        config.providers["sim"]
            .rate_limit
            .tokens_per_minute
            .map(|count| count.get()),
        Some(90_000)
    );
    let counted = parse(
        "[providers.sim]\nkind = \"simulator\"\ntokens_counted = \"requested\"\n\n\
         [models.m]\ntokens_counted = \"used\"\n",
    )
    .unwrap();
    assert_eq!(
        counted.providers["sim"].rate_limit.tokens_counted,
        Some(TokenCounting::Requested)
    );
    assert_eq!(
        counted.models["m"].rate_limit.tokens_counted,
        Some(TokenCounting::Used)
    );
    for (text, key) in [
        (
            "[models.\"gpt-4o-mini\"]\nrequests_per_minute = 0\n",
            "models.gpt-4o-mini.requests_per_minute",
        ),
        (
            "[providers.sim]\nkind = \"simulator\"\ntokens_per_minute = -5\n",
            "providers.sim.tokens_per_minute",
        ),
        (
            "[models.\"gpt-4o-mini\"]\nrequests_per_minute = 99999999999\n",
            "models.gpt-4o-mini.requests_per_minute",
        ),
        (
            "[providers.sim]\nkind = \"simulator\"\ntokens_counted = \"billed\"\n",
            "providers.sim.tokens_counted",
        ),
    ] {
        let error = parse(text).unwrap_err().to_string();
        assert!(error.contains(key), "{error}");
    }
}

/// gpt-4o-mini's bucket, held as by a claim of a stalled process until the returned
/// transaction ends.
async fn hold_model_bucket(db: &sea_orm::DatabaseConnection) -> sea_orm::DatabaseTransaction {
    use sea_orm::{ConnectionTrait, TransactionTrait};
    db.execute_unprepared(
        "INSERT INTO rate_limit_buckets (scope, key, refilled_at) VALUES ('model', 'gpt-4o-mini', 0)",
    )
    .await
    .unwrap();
    let stalled = db.begin().await.unwrap();
    stalled
        .execute_unprepared("SELECT * FROM rate_limit_buckets FOR UPDATE")
        .await
        .unwrap();
    stalled
}

/// A claim never waits for a bucket another transaction holds (a stalled process
/// mid-claim): it takes what needs no such bucket and leaves the rest for later.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_held_bucket_defers_its_jobs_without_stalling_the_claim() {
    use jobledger::jobs::flow::{FlowLimits, RateLimit};
    use jobledger::jobs::queue::{self, ClaimRequest};
    let Some(backend @ Backend::Postgres(_)) = Backend::postgres() else {
        return;
    };
    let app = spawn_app_with(backend, AppOptions::no_workers()).await;
    let tenant = app.funded_tenant("held", "20").await;
    let limited = app.create_job_ok(&tenant, job_input("limited", "hi")).await;
    let mut free = job_input("free", "hi");
    free["model"] = json!("gpt-4o");
    let free = app.create_job_ok(&tenant, free).await;
    let flow = FlowLimits::new(
        std::collections::BTreeMap::from([(
            "gpt-4o-mini".to_owned(),
            RateLimit {
                requests_per_minute: std::num::NonZeroU32::new(6_000),
                ..RateLimit::default()
            },
        )]),
        std::collections::BTreeMap::new(),
        crate::helpers::simulated_models(),
    );
    let db = &app.app.db;
    let stalled = hold_model_bucket(db).await;
    let request = ClaimRequest {
        flow: &flow,
        ..ClaimRequest::new(10, Duration::from_secs(60))
    };
    // A deadline only to fail rather than hang: the claim waits for nothing.
    let claimed = tokio::time::timeout(Duration::from_secs(30), queue::claim(db, request))
        .await
        .expect("the claim waited for the held bucket")
        .unwrap();
    let ids: Vec<Uuid> = claimed.iter().map(|claim| claim.job.id).collect();
    assert_eq!(ids, [free]);
    stalled.rollback().await.unwrap();
    let claimed = queue::claim(db, request).await.unwrap();
    let ids: Vec<Uuid> = claimed.iter().map(|claim| claim.job.id).collect();
    assert_eq!(ids, [limited], "once the bucket is free its job is claimed");
}

/// A claim's transaction never holds a bucket row it created: an insert of a key that
/// another transaction inserted waits for that transaction to end (`SKIP LOCKED` does
/// not apply), so a claim stalled after creating a bucket would stop every claim that
/// wants it. Buckets are created, committed, before the claim's transaction.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_claim_creates_its_buckets_before_its_transaction() {
    use jobledger::jobs::flow::{BucketKey, storage};
    use sea_orm::{ConnectionTrait, TransactionTrait};
    let Some(backend @ Backend::Postgres(_)) = Backend::postgres() else {
        return;
    };
    let app = spawn_app_with(backend, AppOptions::no_workers()).await;
    let db = &app.app.db;
    let keys = [BucketKey::model("gpt-4o-mini")];
    let stalled = db.begin().await.unwrap();
    let held = storage::lock(&stalled, &keys, Timestamp::now())
        .await
        .unwrap();
    assert!(
        held.is_empty(),
        "the claim's lock created the bucket: {held:?}"
    );
    // Another process creating the bucket meanwhile waits for nothing.
    tokio::time::timeout(
        Duration::from_secs(10),
        storage::create_missing(db, &keys, Timestamp::now()),
    )
    .await
    .expect("creating the bucket waited for the stalled claim")
    .unwrap();
    let held = storage::lock(&stalled, &keys, Timestamp::now())
        .await
        .unwrap();
    assert_eq!(held.len(), 1, "the committed bucket is locked");
    // A claim stalled after writing its levels back holds an updated row: the next
    // claims, which make sure their buckets exist, do not wait for it either.
    stalled
        .execute_unprepared("UPDATE rate_limit_buckets SET requests = 0")
        .await
        .unwrap();
    let wanted = [BucketKey::model("gpt-4o"), BucketKey::model("gpt-4o-mini")];
    tokio::time::timeout(
        Duration::from_secs(10),
        storage::create_missing(db, &wanted, Timestamp::now()),
    )
    .await
    .expect("making sure the buckets exist waited for the stalled claim's update")
    .unwrap();
    stalled.rollback().await.unwrap();
    assert_eq!(
        rate_limit_buckets::Entity::find()
            .all(db)
            .await
            .unwrap()
            .len(),
        2
    );
}

/// A 429's pause is written beside the attempt's finish: a claim of a stalled process
/// holding the model's bucket row does not hold up recording the attempt — nor, when
/// more 429s arrive at once than the pool has connections, the rest of the process.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_held_bucket_does_not_delay_recording_a_rate_limited_attempt() {
    let Some(backend @ Backend::Postgres(_)) = Backend::postgres() else {
        return;
    };
    let workers = WorkerSettings {
        concurrency: 24,
        ..test_worker_settings()
    };
    let app = spawn_app_with(backend, AppOptions::workers(workers)).await;
    let tenant = app.funded_tenant("held-pause", "20").await;
    let db = &app.app.db;
    let stalled = hold_model_bucket(db).await;
    let mut limited = Vec::new();
    // More at once than the pool's 16 connections.
    for index in 0..20 {
        let mut input = job_input(
            &format!("limited-while-held-{index}"),
            "hello [mock:status=429][mock:retry_after=1][mock:fail_first=1000]",
        );
        input["maxAttempts"] = json!(1);
        // A 429 is a wait, not an attempt: the deadline is what ends the job.
        input["deadline"] = json!((chrono::Utc::now() + chrono::Duration::seconds(3)).to_rfc3339());
        limited.push(app.create_job_ok(&tenant, input).await);
    }
    let mut other = job_input("other-model-while-held", "hello");
    other["model"] = json!("gpt-4o");
    let other = app.create_job_ok(&tenant, other).await;
    // Recording waits at most a second for the pause to be written, not for the row,
    // and the other model's job runs meanwhile.
    for id in limited.iter().chain([&other]) {
        let job = app
            .wait_until_finished(&tenant, *id, Duration::from_secs(8))
            .await;
        let expected = if *id == other { "SUCCEEDED" } else { "FAILED" };
        assert_eq!(job["status"], expected, "{job}");
        if *id != other {
            // The 429 was recorded before the deadline ended the job.
            assert_eq!(job["attempts"][0]["outcome"], "RETRYABLE_ERROR", "{job}");
            assert_eq!(job["error"]["code"], "DEADLINE_EXCEEDED", "{job}");
        }
    }
    stalled.rollback().await.unwrap();
    assert_billing_invariants(db).await;
}
