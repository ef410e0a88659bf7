//! The batch scenario: a batch's items enqueued over GraphQL (`addBatchItems`, chunks
//! of 1,000, 4 concurrent clients, against the in-process API), next to two baselines
//! measured in the same run — `createJob` at concurrency 32, and a bare multi-row
//! `INSERT` of the same job rows (every column of `jobs`, chunks of 1,000 on 4
//! connections, nothing else written) — then the drain of that batch by one process
//! with the built-in simulator, until the batch is FINISHED. Then the same items as a
//! PROVIDER_BATCH batch through the simulator's batch API, from the first
//! `addBatchItems` to FINISHED in one process (API, workers and submitter), with what
//! the customer is charged per item against the realtime batch.

use super::scratch::{Engine, ScratchDatabase};
use super::{BenchError, Figure, Scale, audited, in_process_settings, seed};
use crate::db::Binds;
use crate::jobs::input::IdempotencyKey;
use crate::jobs::worker::WorkerSettings;
use crate::startup::Application;
use entity::{BatchStatus, JobStatus, JsonText, Timestamp, batches, jobs};
use sea_orm::{ActiveModelTrait, ActiveValue, EntityTrait, IntoActiveModel, Iterable};
use serde_json::{Value, json};
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};
use tokio_util::sync::CancellationToken;
use uuid::Uuid;

/// Items per `addBatchItems` call (the most one call takes) and per bare insert.
const CHUNK: u64 = 1_000;
/// Concurrent clients adding items, and connections of the bare insert.
const CLIENTS: u64 = 4;
/// Concurrency of the `createJob` baseline.
const CREATE_CONCURRENCY: u64 = 32;
/// Workers of the draining process.
const WORKERS: usize = 32;
/// Reads of the whole batch, timed one by one (the median is reported).
const READS: usize = 51;
/// How long the drain may make no progress before the benchmark gives up.
const STALL: Duration = Duration::from_secs(60);
/// How often the provider-batch run's submitter reads its provider batch (the
/// simulator's batches end a second after their creation).
const PROVIDER_BATCH_POLL: Duration = Duration::from_millis(500);
/// What every item asks (the benchmark's job prompt, so that holds are the seeded ones).
const CONTENT: &str = "Summarise: the quarter went well.";

fn failed(error: impl std::fmt::Display) -> BenchError {
    BenchError::Failed(error.to_string())
}

/// The API of a service in this process, on `database`, with no workers.
async fn serve_api(
    database: &ScratchDatabase,
) -> Result<(SocketAddr, CancellationToken, ServerTask), BenchError> {
    let listen = "127.0.0.1:0".parse().expect("a socket address");
    let application = Application::build(in_process_settings(database, Some(listen), None)).await?;
    let address = application
        .address()
        .ok_or_else(|| failed("the API did not bind"))?;
    let shutdown = CancellationToken::new();
    let running = tokio::spawn(application.run(shutdown.clone()));
    Ok((address, shutdown, running))
}

type ServerTask = tokio::task::JoinHandle<std::io::Result<()>>;

async fn stop(shutdown: CancellationToken, running: ServerTask) -> Result<(), BenchError> {
    shutdown.cancel();
    running.await.map_err(failed)?.map_err(failed)?;
    Ok(())
}

/// One GraphQL call; its `data`, or the call's errors as a failure.
async fn graphql(
    client: &reqwest::Client,
    address: SocketAddr,
    key: &str,
    query: &str,
    variables: Value,
) -> Result<Value, BenchError> {
    let response: Value = client
        .post(format!("http://{address}/graphql"))
        .bearer_auth(key)
        .json(&json!({ "query": query, "variables": variables }))
        .send()
        .await
        .map_err(failed)?
        .json()
        .await
        .map_err(failed)?;
    if !response["errors"].is_null() {
        return Err(failed(format!("GraphQL call failed: {response}")));
    }
    Ok(response["data"].clone())
}

/// The batch scenario (see the module).
pub async fn run(engine: &Engine, scale: Scale) -> Result<Vec<Figure>, BenchError> {
    let name = engine.name();
    let items = scale.batch_items.max(1);
    let bare = bare_insert(engine, items).await?;
    let creates = create_jobs(engine, scale.batch_creates.max(CREATE_CONCURRENCY)).await?;
    let (enqueued, read_ms, drained, realtime_charge) = enqueue_and_drain(engine, items).await?;
    let (through_provider, provider_charge) = provider_batch(engine, items).await?;
    let create_name = format!("createJob at concurrency {CREATE_CONCURRENCY} (batch baseline)");
    let bare_name = format!("bare SQL multi-row INSERT of {items} job rows");
    let drain_name = format!("drain of a batch of {items} items until FINISHED");
    let realtime_charge_name = format!("customer charge per item, realtime batch of {items}");
    Ok(vec![
        Figure {
            engine: name,
            name: bare_name.clone(),
            value: bare,
            unit: "rows/s",
            ratio: None,
        },
        Figure {
            engine: name,
            name: create_name.clone(),
            value: creates,
            unit: "jobs/s",
            ratio: None,
        },
        Figure {
            engine: name,
            name: format!("addBatchItems, {items} items, 4 clients"),
            value: enqueued,
            unit: "items/s",
            ratio: Some((enqueued / creates, create_name)),
        },
        Figure {
            engine: name,
            name: format!("addBatchItems, {items} items, vs bare SQL"),
            value: enqueued,
            unit: "items/s",
            ratio: Some((enqueued / bare, bare_name)),
        },
        Figure {
            engine: name,
            name: format!("reading the batch of {items} queued items (median of {READS})"),
            value: read_ms,
            unit: "ms",
            ratio: None,
        },
        Figure {
            engine: name,
            name: drain_name.clone(),
            value: drained,
            unit: "items/s",
            ratio: None,
        },
        Figure {
            engine: name,
            name: format!(
                "PROVIDER_BATCH of {items} items through the simulator's batch API, end to end"
            ),
            value: through_provider,
            unit: "items/s",
            ratio: Some((through_provider / drained, drain_name)),
        },
        Figure {
            engine: name,
            name: realtime_charge_name.clone(),
            value: realtime_charge,
            unit: "µcredits",
            ratio: None,
        },
        Figure {
            engine: name,
            name: format!("customer charge per item, PROVIDER_BATCH of {items}"),
            value: provider_charge,
            unit: "µcredits",
            ratio: Some((provider_charge / realtime_charge, realtime_charge_name)),
        },
    ])
}

/// Millionths of a credit per item of what `batch` charged.
fn charge_per_item(batch: &batches::Model, items: u64) -> f64 {
    batch.customer_charge_nanos as f64 / 1_000.0 / items as f64
}

/// The workers of a draining process.
fn drain_workers() -> WorkerSettings {
    WorkerSettings {
        concurrency: WORKERS,
        lease: Duration::from_secs(30),
        attempt_timeout: Duration::from_secs(60),
        shutdown_grace: Duration::from_secs(30),
        tenant_concurrency: None,
        poll_interval: Duration::from_millis(500),
        charging: crate::billing::ChargingPolicy::default(),
        flow: Default::default(),
    }
}

/// `addBatchItems` of `items` items to `batch_id`, in chunks of [`CHUNK`] from
/// [`CLIENTS`] concurrent clients.
async fn add_items(
    client: &reqwest::Client,
    address: SocketAddr,
    key: &str,
    batch_id: &str,
    items: u64,
) -> Result<(), BenchError> {
    let next = Arc::new(AtomicU64::new(0));
    let clients = (0..CLIENTS).map(|_| {
        let next = next.clone();
        async move {
            loop {
                let chunk = next.fetch_add(1, Ordering::Relaxed);
                let first = chunk * CHUNK;
                if first >= items {
                    return Ok::<(), BenchError>(());
                }
                let chunk_items: Vec<Value> = (first..(first + CHUNK).min(items))
                    .map(|item| {
                        json!({
                            "customId": format!("item-{item}"),
                            "messages": [{"role": "user", "content": CONTENT}],
                        })
                    })
                    .collect();
                let expected = chunk_items.len() as u64;
                let answer = graphql(
                    client,
                    address,
                    key,
                    "mutation($batchId: UUID!, $items: [BatchItemInput!]!) {
                        addBatchItems(batchId: $batchId, items: $items) { added }
                    }",
                    json!({"batchId": batch_id, "items": chunk_items}),
                )
                .await?;
                if answer["addBatchItems"]["added"].as_u64() != Some(expected) {
                    return Err(failed(format!("addBatchItems answered {answer}")));
                }
            }
        }
    });
    for result in futures_util::future::join_all(clients).await {
        result?;
    }
    Ok(())
}

/// Polls the batch until it is FINISHED, failing when it makes no progress for
/// [`STALL`] or the process running it stopped.
async fn until_finished(
    database: &ScratchDatabase,
    batch_id: Uuid,
    items: u64,
    running: &ServerTask,
) -> Result<batches::Model, BenchError> {
    let (mut done, mut progress_at) = (0, Instant::now());
    loop {
        tokio::time::sleep(Duration::from_millis(100)).await;
        let batch = batches::Entity::find_by_id(batch_id)
            .one(&database.db)
            .await?
            .ok_or_else(|| failed("the batch is gone"))?;
        if batch.status == BatchStatus::Finished {
            if batch.succeeded != items as i64 {
                return Err(failed(format!(
                    "{} of {items} items succeeded (failed {}, cancelled {})",
                    batch.succeeded, batch.failed, batch.cancelled
                )));
            }
            return Ok(batch);
        }
        let now_done = batch.succeeded + batch.failed + batch.cancelled;
        if now_done > done {
            (done, progress_at) = (now_done, Instant::now());
        } else if progress_at.elapsed() > STALL {
            return Err(failed(format!(
                "the batch's drain stalled at {done} of {items} items"
            )));
        }
        if running.is_finished() {
            return Err(failed("the worker process stopped"));
        }
    }
}

/// Items per second of a PROVIDER_BATCH batch of `items` items from its first
/// `addBatchItems` to FINISHED, in one process with the API, the workers and the
/// submitter, its provider batches through the built-in simulator's batch API; and
/// the customer charge per item, in millionths of a credit.
async fn provider_batch(engine: &Engine, items: u64) -> Result<(f64, f64), BenchError> {
    let database = ScratchDatabase::create(engine).await?;
    let (_, key) = seed::funded_tenant(&database.db, "provider-batcher", items).await?;
    let listen = "127.0.0.1:0".parse().expect("a socket address");
    let mut settings = in_process_settings(&database, Some(listen), Some(drain_workers()));
    settings.operations.provider_batches.poll = PROVIDER_BATCH_POLL;
    let application = Application::build(settings).await?;
    let address = application
        .address()
        .ok_or_else(|| failed("the API did not bind"))?;
    let shutdown = CancellationToken::new();
    let running = tokio::spawn(application.run(shutdown.clone()));
    let client = reqwest::Client::new();
    let started = Instant::now();
    let created = graphql(
        &client,
        address,
        &key,
        "mutation($input: CreateBatchInput!) { createBatch(input: $input) { batch { id } } }",
        json!({"input": {
            "idempotencyKey": "bench-provider-batch",
            "mode": "PROVIDER_BATCH",
            "model": seed::MODEL,
            "maxOutputTokens": 64,
        }}),
    )
    .await?;
    let batch_id = created["createBatch"]["batch"]["id"]
        .as_str()
        .ok_or_else(|| failed(format!("createBatch answered {created}")))?
        .to_owned();
    add_items(&client, address, &key, &batch_id, items).await?;
    graphql(
        &client,
        address,
        &key,
        "mutation($id: UUID!) { closeBatch(id: $id) { status } }",
        json!({"id": batch_id}),
    )
    .await?;
    let batch_uuid = Uuid::parse_str(&batch_id).map_err(failed)?;
    let batch = until_finished(&database, batch_uuid, items, &running).await?;
    let rate = items as f64 / started.elapsed().as_secs_f64();
    stop(shutdown, running).await?;
    audited(database).await?;
    Ok((rate, charge_per_item(&batch, items)))
}

/// Rows per second of the bare insert: the batch's job rows, every column of `jobs`,
/// multi-row `VALUES` in chunks of 1,000 (one transaction each) on 4 connections — no
/// hold, ledger entry, event or counter.
async fn bare_insert(engine: &Engine, items: u64) -> Result<f64, BenchError> {
    let database = ScratchDatabase::create(engine).await?;
    let (tenant_id, _) = seed::funded_tenant(&database.db, "bare", 1).await?;
    let providers = super::seeding_providers();
    let batch = crate::jobs::batches::create_batch(
        &database.db,
        &providers,
        tenant_id,
        batch_request("bench-bare")?,
    )
    .await?
    .batch;
    let template = seed::job_saying(0, CONTENT);
    let hash = template.fingerprint();
    let input = JsonText(serde_json::to_value(&template.input).map_err(failed)?);
    let token_bound = template
        .input
        .call_bound(crate::llm::PromptCounting::QuarterBytes, &template.model)
        .tokens();
    let columns: Vec<jobs::Column> = jobs::Column::iter().collect();
    let names: Vec<String> = columns
        .iter()
        .map(|column| format!("\"{}\"", sea_orm::IdenStatic::as_str(column)))
        .collect();
    let head = format!("INSERT INTO jobs ({}) VALUES ", names.join(", "));
    // A statement of the whole chunk on PostgreSQL; on SQLite statements of the size
    // its binding is linear in (see `db::bulk`).
    let placeholders = match database.db.get_database_backend() {
        sea_orm::DbBackend::Postgres => 30_000,
        _ => crate::db::bulk::SQLITE_MAX_PLACEHOLDERS,
    };
    let per_statement = (placeholders / columns.len()).max(1) as u64;
    let next = Arc::new(AtomicU64::new(0));
    let started = Instant::now();
    let clients = (0..CLIENTS).map(|_| {
        let db = database.db.clone();
        let (next, head, columns, input, hash) = (
            next.clone(),
            head.clone(),
            columns.clone(),
            input.clone(),
            hash.clone(),
        );
        async move {
            loop {
                let chunk = next.fetch_add(1, Ordering::Relaxed);
                let first = chunk * CHUNK;
                if first >= items {
                    return Ok::<(), BenchError>(());
                }
                let last = (first + CHUNK).min(items);
                let now = Timestamp::now();
                let transaction = crate::db::begin_write(&db).await?;
                let mut index = first;
                while index < last {
                    let end = (index + per_statement).min(last);
                    let mut parameters = Binds::new(db.get_database_backend());
                    let rows: Vec<String> = (index..end)
                        .map(|item| {
                            let row = jobs::Model {
                                id: Uuid::now_v7(),
                                tenant_id,
                                idempotency_key: IdempotencyKey::of_item(
                                    batch.id,
                                    &format!("item-{item}"),
                                )
                                .as_str()
                                .to_owned(),
                                request_hash: hash.clone(),
                                status: JobStatus::Queued,
                                cancel_requested: false,
                                model: seed::MODEL.to_owned(),
                                input: input.clone(),
                                retry_unknown_outcome: true,
                                result: None,
                                error_code: None,
                                error_message: None,
                                attempt_count: 0,
                                max_attempts: 3,
                                run_token: None,
                                lease_until: None,
                                next_run_at: now,
                                priority: 5,
                                run_at: None,
                                simulated: true,
                                token_bound: Some(token_bound),
                                last_event_seq: 1,
                                created_at: now,
                                updated_at: now,
                                started_at: None,
                                finished_at: None,
                                payloads_pruned_at: None,
                                batch_id: Some(batch.id),
                                custom_id: Some(format!("item-{item}")),
                                rerun_of: None,
                                deadline: Some(now.plus(chrono::Duration::days(1))),
                                model_chain: None,
                                held_prices: None,
                            }
                            .into_active_model();
                            parameters.row(columns.iter().map(|column| match row.get(*column) {
                                ActiveValue::Set(value) | ActiveValue::Unchanged(value) => value,
                                ActiveValue::NotSet => unreachable!("every column is set"),
                            }))
                        })
                        .collect();
                    sea_orm::ConnectionTrait::execute_raw(
                        &transaction,
                        parameters.statement(format!("{head}{}", rows.join(", "))),
                    )
                    .await?;
                    index = end;
                }
                transaction.commit().await?;
            }
        }
    });
    for result in futures_util::future::join_all(clients).await {
        result?;
    }
    let rate = items as f64 / started.elapsed().as_secs_f64();
    // Rows with no hold: the audit would rightly object, so this database goes unaudited.
    database.remove().await?;
    Ok(rate)
}

fn batch_request(key: &str) -> Result<crate::jobs::batches::NewBatch, BenchError> {
    Ok(crate::jobs::batches::NewBatch::parse(
        crate::jobs::batches::BatchRequest {
            idempotency_key: key.to_owned(),
            name: Some("benchmark".to_owned()),
            mode: entity::BatchMode::Realtime,
            model: seed::MODEL.to_owned(),
            max_output_tokens: 64,
            response_schema: None,
            max_attempts: None,
            priority: None,
            deadline: None,
            metadata: None,
            tools: Default::default(),
        },
    )?)
}

/// Jobs per second of `count` createJob calls at concurrency 32 over GraphQL.
async fn create_jobs(engine: &Engine, count: u64) -> Result<f64, BenchError> {
    let database = ScratchDatabase::create(engine).await?;
    let (_, key) = seed::funded_tenant(&database.db, "creator", count).await?;
    let (address, shutdown, running) = serve_api(&database).await?;
    let client = reqwest::Client::new();
    let next = Arc::new(AtomicU64::new(0));
    let started = Instant::now();
    let clients = (0..CREATE_CONCURRENCY).map(|_| {
        let (client, key, next) = (client.clone(), key.clone(), next.clone());
        async move {
            loop {
                let index = next.fetch_add(1, Ordering::Relaxed);
                if index >= count {
                    return Ok::<(), BenchError>(());
                }
                graphql(
                    &client,
                    address,
                    &key,
                    "mutation($input: CreateJobInput!) { createJob(input: $input) { job { id } } }",
                    json!({"input": {
                        "idempotencyKey": format!("bench-batch-baseline-{index}"),
                        "model": seed::MODEL,
                        "messages": [{"role": "user", "content": CONTENT}],
                        "maxOutputTokens": 64,
                    }}),
                )
                .await?;
            }
        }
    });
    for result in futures_util::future::join_all(clients).await {
        result?;
    }
    let rate = count as f64 / started.elapsed().as_secs_f64();
    stop(shutdown, running).await?;
    audited(database).await?;
    Ok(rate)
}

/// Items per second of enqueueing `items` over GraphQL, the milliseconds of one read
/// of the full batch (what `batch(id)` runs), items per second of the drain, and the
/// customer charge per item, in millionths of a credit.
async fn enqueue_and_drain(
    engine: &Engine,
    items: u64,
) -> Result<(f64, f64, f64, f64), BenchError> {
    let database = ScratchDatabase::create(engine).await?;
    let (tenant_id, key) = seed::funded_tenant(&database.db, "batcher", items).await?;
    let (address, shutdown, running) = serve_api(&database).await?;
    let client = reqwest::Client::new();
    let created = graphql(
        &client,
        address,
        &key,
        "mutation($input: CreateBatchInput!) { createBatch(input: $input) { batch { id } } }",
        json!({"input": {
            "idempotencyKey": "bench-batch",
            "name": "benchmark",
            "model": seed::MODEL,
            "maxOutputTokens": 64,
        }}),
    )
    .await?;
    let batch_id = created["createBatch"]["batch"]["id"]
        .as_str()
        .ok_or_else(|| failed(format!("createBatch answered {created}")))?
        .to_owned();
    let started = Instant::now();
    add_items(&client, address, &key, &batch_id, items).await?;
    let enqueued = items as f64 / started.elapsed().as_secs_f64();
    let batch_uuid = Uuid::parse_str(&batch_id).map_err(failed)?;
    let mut reads = Vec::with_capacity(READS);
    for _ in 0..READS {
        let started = Instant::now();
        crate::jobs::batches::read(&database.db, tenant_id, batch_uuid).await?;
        reads.push(started.elapsed().as_secs_f64() * 1_000.0);
    }
    reads.sort_by(f64::total_cmp);
    let read_ms = reads[READS / 2];
    graphql(
        &client,
        address,
        &key,
        "mutation($id: UUID!) { closeBatch(id: $id) { status } }",
        json!({"id": batch_id}),
    )
    .await?;
    stop(shutdown, running).await?;

    let application =
        Application::build(in_process_settings(&database, None, Some(drain_workers()))).await?;
    let shutdown = CancellationToken::new();
    let started = Instant::now();
    let running = tokio::spawn(application.run(shutdown.clone()));
    let batch = until_finished(&database, batch_uuid, items, &running).await?;
    let drained = items as f64 / started.elapsed().as_secs_f64();
    stop(shutdown, running).await?;
    audited(database).await?;
    Ok((enqueued, read_ms, drained, charge_per_item(&batch, items)))
}
