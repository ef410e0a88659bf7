//! A crash never loses a job or a cent: the real binary runs as separate processes
//! (simulator, API, two workers) on PostgreSQL, one worker is SIGKILLed while its
//! attempts are mid-call, and a replacement takes over. Every job must still succeed,
//! be charged exactly once, and leave the ledger consistent. Nor does a rolling
//! restart (SIGTERM after SIGTERM during one call) fail a job.

use crate::helpers::{Backend, Client, Processes, TestDatabase, free_address, wait_for_http};
use entity::{AttemptOutcome, attempts};
use sea_orm::{ColumnTrait, EntityTrait, PaginatorTrait, QueryFilter};
use serde_json::{Value, json};
use std::collections::HashSet;
use std::time::{Duration, Instant};
use uuid::Uuid;

const ADMIN_TOKEN: &str = "crash-test-admin-token-of-32-chars-or-more";
const JOBS: usize = 50;
const SHORTEST_DELAY_MS: u64 = 300;
const LONGEST_DELAY_MS: u64 = 2_500;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_worker_loses_no_job_and_no_cent() {
    let Some(backend) = Backend::postgres() else {
        return;
    };
    let began = Instant::now();
    let database = TestDatabase::create(&backend).await;
    // Declared after the database so that the processes die before it is dropped.
    let mut processes = Processes::new();
    let http = reqwest::Client::builder()
        .timeout(Duration::from_secs(10))
        .build()
        .unwrap();

    let mock = processes.start_simulator(&http).await;

    let openai_base_url = format!("http://{mock}/v1");
    let provider_env = [
        ("OPENAI_BASE_URL", openai_base_url.as_str()),
        ("JOBLEDGER_ADMIN_TOKEN", ADMIN_TOKEN),
    ];
    let api = processes
        .start_api(&http, &database.url, &provider_env)
        .await;
    let worker_args = [
        "worker",
        "--database-url",
        &database.url,
        "--workers",
        "8",
        "--lease-seconds",
        "3",
        "--attempt-timeout-seconds",
        "30",
    ];
    let victim = processes.spawn("worker-1 (killed)", &worker_args, &provider_env);
    let survivor = processes.spawn("worker-2", &worker_args, &provider_env);
    processes.wait_for_log(victim, "worker started").await;
    processes.wait_for_log(survivor, "worker started").await;
    eprintln!("crash test: processes up after {:?}", began.elapsed());

    let client = Client {
        http: http.clone(),
        url: format!("http://{api}/graphql"),
    };
    let key = client.funded_tenant(ADMIN_TOKEN, "crash-test", "100").await;
    let mut job_ids = Vec::with_capacity(JOBS);
    for index in 0..JOBS {
        // Long and short calls interleaved, so that whatever a worker holds at the
        // kill, several of its calls are still waiting for their answer.
        let step = (index * 17) % JOBS;
        let delay = SHORTEST_DELAY_MS
            + (LONGEST_DELAY_MS - SHORTEST_DELAY_MS) * step as u64 / (JOBS as u64 - 1);
        let input = json!({
            "idempotencyKey": format!("crash-{index}"),
            "model": "gpt-4o-mini",
            "messages": [{"role": "user", "content": format!("crash test job {index} [mock:delay_ms={delay}]")}],
            "maxOutputTokens": 100,
        });
        let data = client
            .send(&key, "CreateJob", json!({"input": input}))
            .await;
        let id: Uuid = data["createJob"]["job"]["id"]
            .as_str()
            .unwrap()
            .parse()
            .unwrap();
        job_ids.push(id);
    }
    eprintln!(
        "crash test: {JOBS} jobs created after {:?}",
        began.elapsed()
    );

    // Kill the victim once the workers are busy and it has calls in flight.
    let db = jobledger::db::connect(&database.url).await.unwrap();
    tokio::time::sleep(Duration::from_secs(1)).await;
    let running = client.running_jobs(&key).await;
    assert!(running > 0, "no job is RUNNING a second after creation");
    let victim_prefix = format!("{}-", processes.pid(victim));
    let deadline = Instant::now() + Duration::from_secs(10);
    let in_flight = loop {
        let in_flight = attempts::Entity::find()
            .filter(attempts::Column::WorkerId.starts_with(&victim_prefix))
            .filter(attempts::Column::Outcome.eq(AttemptOutcome::Running))
            .count(&db)
            .await
            .unwrap();
        if in_flight >= 3 {
            break in_flight;
        }
        assert!(
            Instant::now() < deadline,
            "the worker to kill never had 3 attempts in flight"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    processes.kill(victim).await;
    eprintln!(
        "crash test: SIGKILLed the worker with {in_flight} attempts in flight ({running} jobs RUNNING) after {:?}",
        began.elapsed()
    );
    let replacement = processes.spawn("worker-3 (replacement)", &worker_args, &provider_env);
    processes.wait_for_log(replacement, "worker started").await;

    let deadline = Instant::now() + Duration::from_secs(90);
    loop {
        let statuses = client.job_statuses(&key).await;
        let unfinished = statuses
            .values()
            .filter(|status| matches!(status.as_str(), "QUEUED" | "RUNNING"))
            .count();
        if statuses.len() == JOBS && unfinished == 0 {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "{unfinished} jobs still unfinished after 90 s: {statuses:?}"
        );
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    eprintln!("crash test: every job terminal after {:?}", began.elapsed());

    let calls: Vec<Value> = http
        .get(format!("http://{mock}/_mock/calls"))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let billed: HashSet<&str> = calls
        .iter()
        .filter(|call| call["billed"] == json!(true))
        .map(|call| call["request_id"].as_str().unwrap())
        .collect();

    let mut attempt_rows = 0;
    let mut lease_expired = 0;
    for id in &job_ids {
        let job = client.send(&key, "Job", json!({"id": id})).await["job"].clone();
        assert_eq!(
            job["status"], "SUCCEEDED",
            "job {id} did not succeed: {job}"
        );
        let reservation = &job["reservation"];
        assert_eq!(reservation["status"], "SETTLED", "job {id}: {job}");
        let amount = crate::helpers::decimal(&reservation["amount"]);
        let settled = crate::helpers::decimal(&reservation["settledAmount"]);
        let released = crate::helpers::decimal(&reservation["releasedAmount"]);
        assert_eq!(settled + released, amount, "job {id}: {job}");
        assert!(!job["charge"].is_null(), "job {id} was not charged: {job}");
        assert_eq!(
            crate::helpers::decimal(&job["charge"]["amount"]),
            settled,
            "job {id}: the charge is not what was settled: {job}"
        );

        let attempts = job["attempts"].as_array().unwrap();
        attempt_rows += attempts.len();
        let numbers: Vec<_> = attempts
            .iter()
            .map(|attempt| attempt["number"].as_i64().unwrap())
            .collect();
        let expected: Vec<_> = (1..=attempts.len() as i64).collect();
        assert_eq!(numbers, expected, "job {id}: attempt numbers: {job}");
        let succeeded: Vec<_> = attempts
            .iter()
            .filter(|attempt| attempt["outcome"] == "SUCCEEDED")
            .collect();
        assert_eq!(
            succeeded.len(),
            1,
            "job {id} must have exactly one succeeded attempt: {job}"
        );
        let request_id = succeeded[0]["providerRequestId"].as_str().unwrap_or("");
        assert!(
            billed.contains(request_id),
            "job {id}: its accepted call {request_id:?} is not a billed call of the simulator"
        );
        for attempt in attempts {
            assert_ne!(
                attempt["outcome"], "RUNNING",
                "job {id} finished with an attempt still running: {job}"
            );
            if attempt["outcome"] == "LEASE_EXPIRED" {
                lease_expired += 1;
                assert!(
                    !attempt["providerCostUpperBound"].is_null(),
                    "job {id}: a lapsed attempt carries no cost bound: {job}"
                );
            }
        }
    }
    eprintln!(
        "crash test: {attempt_rows} attempts, {} billed calls of {} received, {lease_expired} lease expired",
        billed.len(),
        calls.len()
    );
    assert!(
        attempt_rows >= billed.len(),
        "the simulator billed {} calls but only {attempt_rows} attempts were recorded",
        billed.len()
    );
    assert!(
        lease_expired >= 1,
        "no attempt was LEASE_EXPIRED: the kill hit no running attempt"
    );
    crate::invariants::assert_billing_invariants(&db).await;
    db.close().await.ok();
    processes.kill_all().await;
    eprintln!("crash test: passed in {:?}", began.elapsed());
}

/// A rolling restart alone never fails a job: three worker processes in turn get
/// SIGTERM during one long call (grace period 0, so each aborts it and hands the job
/// back), and the fourth gets the answer. The aborted calls may be billed and stay on
/// record with their bounds, but they are not the job's paid calls.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_sigterms_during_a_long_call_do_not_fail_the_job() {
    let Some(backend) = Backend::postgres() else {
        return;
    };
    let database = TestDatabase::create(&backend).await;
    let mut processes = Processes::new();
    let http = reqwest::Client::builder()
        .timeout(Duration::from_secs(10))
        .build()
        .unwrap();
    let mock = processes.start_simulator(&http).await;
    let openai_base_url = format!("http://{mock}/v1");
    let provider_env = [
        ("OPENAI_BASE_URL", openai_base_url.as_str()),
        ("JOBLEDGER_ADMIN_TOKEN", ADMIN_TOKEN),
    ];
    let api = free_address();
    let api_args = [
        "serve",
        "--workers",
        "0",
        "--listen",
        &api.to_string(),
        "--database-url",
        &database.url,
    ];
    processes.spawn("api", &api_args, &provider_env);
    wait_for_http(&http, &format!("http://{api}/readyz"), &mut processes).await;
    let client = Client {
        http: http.clone(),
        url: format!("http://{api}/graphql"),
    };
    let created = client
        .send(
            ADMIN_TOKEN,
            "CreateTenant",
            json!({"name": "rolling-restarts"}),
        )
        .await;
    let tenant_id = created["createTenant"]["tenant"]["id"].as_str().unwrap();
    let key = created["createTenant"]["apiKey"]
        .as_str()
        .unwrap()
        .to_owned();
    client
        .send(
            ADMIN_TOKEN,
            "GrantCredits",
            json!({"input": {"tenantId": tenant_id, "amount": "5", "idempotencyKey": "restarts-topup"}}),
        )
        .await;
    let input = json!({
        "idempotencyKey": "long-call",
        "model": "gpt-4o-mini",
        "messages": [{"role": "user", "content": "a long call [mock:delay_ms=8000]"}],
        "maxOutputTokens": 100,
    });
    let data = client
        .send(&key, "CreateJob", json!({"input": input}))
        .await;
    let id = data["createJob"]["job"]["id"].as_str().unwrap().to_owned();
    let job = || async { client.send(&key, "Job", json!({"id": id})).await["job"].clone() };

    let worker_args = [
        "worker",
        "--database-url",
        &database.url,
        "--workers",
        "2",
        "--lease-seconds",
        "3",
        "--attempt-timeout-seconds",
        "30",
        "--shutdown-grace-seconds",
        "0",
    ];
    for restart in 1..=3 {
        let worker = processes.spawn(&format!("worker {restart}"), &worker_args, &provider_env);
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            let attempts = job().await["attempts"].as_array().unwrap().clone();
            if attempts.len() == restart && attempts[restart - 1]["outcome"] == "RUNNING" {
                break;
            }
            assert!(
                Instant::now() < deadline,
                "call {restart} never started: {}",
                job().await
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        processes.terminate(worker).await;
    }
    processes.spawn("worker 4", &worker_args, &provider_env);
    let deadline = Instant::now() + Duration::from_secs(30);
    let finished = loop {
        let finished = job().await;
        if !matches!(finished["status"].as_str(), Some("QUEUED" | "RUNNING")) {
            break finished;
        }
        assert!(
            Instant::now() < deadline,
            "the job never finished: {finished}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    assert_eq!(finished["status"], "SUCCEEDED", "{finished}");
    let attempts = finished["attempts"].as_array().unwrap();
    assert_eq!(attempts.len(), 4, "{finished}");
    for attempt in &attempts[..3] {
        assert_eq!(attempt["outcome"], "UNKNOWN", "{finished}");
        assert_eq!(attempt["errorCode"], "WORKER_SHUTDOWN", "{finished}");
        assert!(!attempt["providerCostUpperBound"].is_null(), "{finished}");
    }
    assert_eq!(finished["attemptCount"], 1, "{finished}");
    let db = jobledger::db::connect(&database.url).await.unwrap();
    crate::invariants::assert_billing_invariants(&db).await;
    db.close().await.ok();
    processes.kill_all().await;
}
