//! The provider-batch submitter survives a real crash: the binary runs as separate
//! processes (simulator, API, one worker), the worker is SIGKILLed once its provider
//! batch is at the provider — or while its upload is in flight — and a new worker
//! takes over. The provider must hold one batch for the items (no item sent twice),
//! each item must be billed once, every hold resolved within what it held, and
//! `jobledger audit` clean.

use crate::helpers::{Backend, Client, Processes, TestDatabase};
use entity::{
    AttemptOutcome, ProviderBatchState, ReservationStatus, attempts, credit_reservations, jobs,
    provider_batches,
};
use sea_orm::{ColumnTrait, DatabaseConnection, EntityTrait, QueryFilter};
use serde_json::{Value, json};
use std::collections::{HashMap, HashSet};
use std::time::{Duration, Instant};
use uuid::Uuid;

on_both_backends!(
    a_killed_submitter_sends_no_item_twice_openai,
    a_killed_submitter_sends_no_item_twice_anthropic,
    a_submitter_killed_during_its_upload_sends_no_item_twice,
    a_submitter_paused_during_its_upload_sends_nothing_when_it_resumes,
);

const ADMIN_TOKEN: &str = "pbatch-crash-admin-token-of-32-chars-or-more";
const ITEMS: usize = 12;

#[derive(Clone, Copy, Debug)]
enum Shape {
    OpenAi,
    Anthropic,
}

impl Shape {
    /// A built-in model of the shape (every built-in model has a batch price).
    fn model(self) -> &'static str {
        match self {
            Self::OpenAi => "gpt-4o-mini",
            Self::Anthropic => "claude-haiku-4-5",
        }
    }

    fn api(self) -> &'static str {
        match self {
            Self::OpenAi => "openai",
            Self::Anthropic => "anthropic",
        }
    }
}

/// Where the kill lands.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Kill {
    /// The provider batch is at the provider and our row says `submitted`.
    AfterSubmission,
    /// Our row says `uploading` and the upload has not been answered: the simulator
    /// is stopped (SIGSTOP) until the worker is dead.
    DuringUpload,
    /// As `DuringUpload`, but the worker is stopped (SIGSTOP) instead of killed, and
    /// resumed once its replacement has settled the items: with OpenAI, the file it
    /// uploaded is found and the batch created from it by the replacement, and the
    /// resumed worker must not create a second batch from it.
    PausedDuringUpload,
}

async fn a_killed_submitter_sends_no_item_twice_openai(backend: Backend) {
    killed_submitter(backend, Shape::OpenAi, Kill::AfterSubmission).await;
}

async fn a_killed_submitter_sends_no_item_twice_anthropic(backend: Backend) {
    killed_submitter(backend, Shape::Anthropic, Kill::AfterSubmission).await;
}

async fn a_submitter_killed_during_its_upload_sends_no_item_twice(backend: Backend) {
    killed_submitter(backend, Shape::Anthropic, Kill::DuringUpload).await;
}

async fn a_submitter_paused_during_its_upload_sends_nothing_when_it_resumes(backend: Backend) {
    killed_submitter(backend, Shape::OpenAi, Kill::PausedDuringUpload).await;
}

async fn killed_submitter(backend: Backend, shape: Shape, kill: Kill) {
    let began = Instant::now();
    let database = TestDatabase::create(&backend).await;
    // Declared after the database so that the processes die before it is dropped.
    let mut processes = Processes::new();
    let http = reqwest::Client::builder()
        .timeout(Duration::from_secs(10))
        .build()
        .unwrap();
    // The first process: SIGSTOPped to hold an upload in flight.
    let simulator = 0;
    let mock = processes
        .start_simulator_with(&http, &["--batch-delay-ms", "4000"])
        .await;
    let openai = format!("http://{mock}/v1");
    let anthropic = format!("http://{mock}");
    let env = [
        ("OPENAI_BASE_URL", openai.as_str()),
        ("ANTHROPIC_BASE_URL", anthropic.as_str()),
        ("JOBLEDGER_ADMIN_TOKEN", ADMIN_TOKEN),
    ];
    let api = processes.start_api(&http, &database.url, &env).await;
    let worker_args = [
        "worker",
        "--database-url",
        &database.url,
        "--workers",
        "2",
        "--provider-batch-poll-seconds",
        "1",
    ];
    let victim = processes.spawn("worker-1 (killed)", &worker_args, &env);
    processes
        .wait_for_log(victim, "provider-batch submitter started")
        .await;

    let client = Client {
        http: http.clone(),
        url: format!("http://{api}/graphql"),
    };
    let key = client
        .funded_tenant(ADMIN_TOKEN, "pbatch-crash", "100")
        .await;
    let batch = client
        .send(
            &key,
            "CreateBatch",
            json!({"input": {"idempotencyKey": "pbatch-crash", "mode": "PROVIDER_BATCH",
                "model": shape.model(), "maxOutputTokens": 50}}),
        )
        .await;
    let batch_id: Uuid = batch["createBatch"]["batch"]["id"]
        .as_str()
        .unwrap()
        .parse()
        .unwrap();
    let items: Vec<Value> = (0..ITEMS)
        .map(|n| {
            json!({"customId": format!("doc-{n}"),
                "messages": [{"role": "user", "content": format!("crash document {n}: summarise it")}]})
        })
        .collect();
    client
        .send(
            &key,
            "AddBatchItems",
            json!({"batchId": batch_id, "items": items}),
        )
        .await;
    let db = jobledger::db::connect(&database.url).await.unwrap();
    let during_upload = matches!(kill, Kill::DuringUpload | Kill::PausedDuringUpload);
    if during_upload {
        processes.signal(simulator, "STOP").await;
    }
    client
        .send(&key, "CloseBatch", json!({"id": batch_id}))
        .await;

    let awaited = match kill {
        Kill::AfterSubmission => ProviderBatchState::Submitted,
        Kill::DuringUpload | Kill::PausedDuringUpload => ProviderBatchState::Uploading,
    };
    wait_for_row(&db, batch_id, awaited).await;
    if kill == Kill::AfterSubmission {
        let listed = mock_batches(&http, mock).await;
        assert_eq!(listed.len(), 1, "{listed:?}");
        assert_eq!(listed[0]["status"], "in_progress", "{listed:?}");
    }
    if kill == Kill::PausedDuringUpload {
        // The upload's request is in the stopped simulator's socket by now; the
        // simulator answers it to a worker that cannot read the answer.
        tokio::time::sleep(Duration::from_millis(500)).await;
        processes.signal(victim, "STOP").await;
    } else {
        processes.kill(victim).await;
    }
    if during_upload {
        processes.signal(simulator, "CONT").await;
    }
    eprintln!(
        "provider-batch crash test: SIGKILLed the worker with its row {awaited:?} after {:?}",
        began.elapsed()
    );
    processes.spawn("worker-2 (replacement)", &worker_args, &env);

    // The dead worker's row lease (30 s) lapses before the replacement takes the row.
    let deadline = Instant::now() + Duration::from_secs(90);
    let items = loop {
        let items = jobs::Entity::find()
            .filter(jobs::Column::BatchId.eq(batch_id))
            .all(&db)
            .await
            .unwrap();
        if items.iter().all(|item| item.status.is_terminal()) {
            break items;
        }
        processes.assert_alive();
        assert!(
            Instant::now() < deadline,
            "items unfinished after 90 s: {:?}",
            items.iter().map(|item| item.status).collect::<Vec<_>>()
        );
        tokio::time::sleep(Duration::from_millis(250)).await;
    };
    // The row is settled just after its last item.
    wait_for_row(&db, batch_id, ProviderBatchState::Settled).await;
    eprintln!(
        "provider-batch crash test: every item terminal after {:?}",
        began.elapsed()
    );
    if kill == Kill::PausedDuringUpload {
        processes.signal(victim, "CONT").await;
        processes
            .wait_for_log(victim, "lost the provider batch during its upload")
            .await;
        // Whatever the resumed worker would still send has reached the simulator.
        tokio::time::sleep(Duration::from_secs(2)).await;
    }

    // One provider batch at the provider, holding every item once.
    let listed = mock_batches(&http, mock).await;
    assert_eq!(
        listed.len(),
        1,
        "one provider batch for the items: {listed:?}"
    );
    assert_eq!(listed[0]["provider"], shape.api(), "{listed:?}");
    assert_eq!(listed[0]["requests"], ITEMS, "{listed:?}");
    let rows = provider_batches::Entity::find()
        .filter(provider_batches::Column::BatchId.eq(batch_id))
        .all(&db)
        .await
        .unwrap();
    assert_eq!(rows.len(), 1, "{rows:?}");
    assert_eq!(rows[0].state, ProviderBatchState::Settled, "{rows:?}");
    assert_eq!(
        rows[0].provider_batch_id.as_deref(),
        listed[0]["id"].as_str()
    );
    let calls: Vec<Value> = http
        .get(format!("http://{mock}/_mock/calls"))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let mut sent: HashMap<usize, Vec<&str>> = HashMap::new();
    for call in calls.iter().filter(|call| !call["batch_id"].is_null()) {
        let body = call["request"].to_string();
        let item = (0..ITEMS)
            .find(|n| body.contains(&format!("crash document {n}:")))
            .unwrap_or_else(|| panic!("a batch request of no item: {body}"));
        sent.entry(item)
            .or_default()
            .push(call["batch_id"].as_str().unwrap());
    }
    assert_eq!(sent.len(), ITEMS, "{sent:?}");
    assert!(sent.values().all(|batches| batches.len() == 1), "{sent:?}");
    let billed: HashSet<&str> = calls
        .iter()
        .filter(|call| call["billed"] == json!(true) && !call["batch_id"].is_null())
        .map(|call| call["request_id"].as_str().unwrap())
        .collect();

    // Each item succeeded once, on its one billed request, within its hold.
    let ids: Vec<Uuid> = items.iter().map(|item| item.id).collect();
    let attempts = attempts::Entity::find()
        .filter(attempts::Column::JobId.is_in(ids.iter().copied()))
        .all(&db)
        .await
        .unwrap();
    assert_eq!(attempts.len(), ITEMS, "each item billed once: {attempts:?}");
    let charged: HashSet<&str> = attempts
        .iter()
        .filter(|attempt| attempt.provider_cost_nanos.unwrap_or(0) > 0)
        .filter_map(|attempt| attempt.provider_request_id.as_deref())
        .collect();
    assert_eq!(
        billed, charged,
        "billed requests against attempts with a cost"
    );
    for attempt in &attempts {
        assert_eq!(attempt.outcome, AttemptOutcome::Succeeded, "{attempt:?}");
        assert_eq!(attempt.provider_batch_id, Some(rows[0].id), "{attempt:?}");
    }
    let holds = credit_reservations::Entity::find()
        .filter(credit_reservations::Column::JobId.is_in(ids.iter().copied()))
        .all(&db)
        .await
        .unwrap();
    assert_eq!(holds.len(), ITEMS);
    for hold in &holds {
        assert_eq!(hold.status, ReservationStatus::Settled, "{hold:?}");
        assert!(hold.settled_amount_nanos <= hold.amount_nanos, "{hold:?}");
    }
    crate::invariants::assert_billing_invariants(&db).await;
    assert_audit_clean(&database.url).await;
    db.close().await.ok();
    processes.kill_all().await;
    eprintln!("provider-batch crash test: passed in {:?}", began.elapsed());
}

async fn mock_batches(http: &reqwest::Client, mock: std::net::SocketAddr) -> Vec<Value> {
    http.get(format!("http://{mock}/_mock/batches"))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap()
}

/// Waits until the batch's provider batch row is in `state` (bounded: 30 s).
async fn wait_for_row(db: &DatabaseConnection, batch: Uuid, state: ProviderBatchState) {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let rows = provider_batches::Entity::find()
            .filter(provider_batches::Column::BatchId.eq(batch))
            .all(db)
            .await
            .unwrap();
        if rows.iter().any(|row| row.state == state) {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "no row got to {state:?}: {rows:?}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// `jobledger audit` on the database exits 0.
async fn assert_audit_clean(url: &str) {
    let audit = tokio::process::Command::new(env!("CARGO_BIN_EXE_jobledger"))
        .args(["audit", "--database-url", url])
        .env_remove("DATABASE_URL")
        .output()
        .await
        .unwrap();
    assert!(
        audit.status.success(),
        "jobledger audit failed ({}):\n{}{}",
        audit.status,
        String::from_utf8_lossy(&audit.stdout),
        String::from_utf8_lossy(&audit.stderr)
    );
}
