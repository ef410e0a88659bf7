//! `jobledger bench`: the queue measured against itself and against a bare SQL queue
//! in one run, on the machine it runs on. Figures are printed as a Markdown table and
//! written as JSON; ratios against a baseline measured in the same run are what to
//! compare across machines. Every scenario runs on a database of its own and ends with
//! the billing audit, which must be clean.
//!
//! Scenarios (`--smoke` shrinks every count, for CI: it checks that the harness runs,
//! not how fast):
//! - claim latency: one claim of 32 with 2,000 jobs queued, then with 200,000;
//! - drain: 20,000 queued jobs run to the end by one process (32 workers, the built-in
//!   simulator answering at once, settlement included), next to the bare-SQL ceiling
//!   (one row and 50 rows per claim, as many connections as the pool) for as many jobs;
//! - drain under a backlog: 20,000 jobs run while 200,000 are queued;
//! - claim and drain again with rate limits configured on the model and on every
//!   tenant, far above what the run reaches: what admission by budget costs when it
//!   never says no — the drain by one process and by three sharing the budgets' rows,
//!   each against the same drain without limits;
//! - createJob over GraphQL at concurrency 1 and 32: latency p50/p99 and jobs/s;
//! - against a `serve` child process (`live`): pickup and subscription latency,
//!   1,000 attempts in flight, 10,000 idle subscriptions;
//! - a batch (`batch`, run only when named): 200,000 items enqueued by addBatchItems
//!   next to createJob at concurrency 32 and a bare multi-row INSERT of the same rows,
//!   then the batch's drain.

mod batch;
mod live;
mod naive;
pub mod scratch;
mod seed;

use crate::billing::audit;
use crate::config::{ProviderSettings, Settings};
use crate::jobs::flow::{FlowLimits, NO_LIMITS, RateLimit};
use crate::jobs::queue::{self, ClaimRequest, TenantCursor};
use crate::jobs::worker::WorkerSettings;
use crate::startup::Application;
use entity::{AttemptOutcome, JobStatus, attempts, jobs};
use scratch::{Engine, ScratchDatabase};
use sea_orm::{
    ColumnTrait, ConnectionTrait, DatabaseConnection, EntityTrait, PaginatorTrait, QueryFilter,
};
use serde_json::{Value, json};
use std::num::NonZeroU32;
use std::time::{Duration, Instant};
use tokio_util::sync::CancellationToken;

/// How much work each scenario does.
#[derive(Clone, Copy, Debug)]
pub struct Scale {
    /// Jobs drained (and naive jobs completed).
    pub drain: u64,
    /// Jobs queued in the large-backlog scenarios.
    pub backlog: u64,
    /// Jobs queued in the small-backlog claim measurement.
    pub small_backlog: u64,
    /// createJob requests per measurement.
    pub creates: u64,
    /// Items of the batch scenario's batch.
    pub batch_items: u64,
    /// createJob requests of the batch scenario's baseline.
    pub batch_creates: u64,
}

impl Scale {
    /// The figures `docs/performance.md` reports.
    pub const FULL: Self = Self {
        drain: 20_000,
        backlog: 200_000,
        small_backlog: 2_000,
        creates: 2_000,
        batch_items: 200_000,
        batch_creates: 5_000,
    };

    /// A run of a few seconds that exercises every scenario.
    pub const SMOKE: Self = Self {
        drain: 200,
        backlog: 2_000,
        // Room for every measured claim: 15 claims of 32.
        small_backlog: 600,
        creates: 64,
        batch_items: 2_000,
        batch_creates: 64,
    };
}

/// Why the benchmark could not finish.
#[derive(Debug, thiserror::Error)]
pub enum BenchError {
    #[error("database: {0}")]
    Database(#[from] sea_orm::DbErr),
    #[error("{0}")]
    Service(#[from] crate::error::ServiceError),
    #[error("startup: {0}")]
    Startup(#[from] crate::startup::StartupError),
    #[error("{0}")]
    Failed(String),
}

/// Tenants the backlogs are spread over.
const TENANTS: u64 = 4;
/// Jobs one measured claim asks for.
const CLAIM_SIZE: u32 = 32;
/// Claims measured per backlog size.
const CLAIM_SAMPLES: usize = 15;
/// Workers of the draining process.
const WORKERS: usize = 32;
/// How long a drain may make no progress before the benchmark gives up.
const STALL: Duration = Duration::from_secs(60);
/// Worker processes of the drain that shares the budgets' rows.
const DRAIN_PROCESSES: usize = 3;
/// Concurrent connections of the bare-SQL queue: jobledger's pool size.
const NAIVE_CONNECTIONS: usize = 16;

/// One measured figure.
#[derive(Clone, Debug)]
pub struct Figure {
    pub engine: &'static str,
    pub name: String,
    pub value: f64,
    pub unit: &'static str,
    /// The figure as a multiple of another one of this run, when that is the point.
    pub ratio: Option<(f64, String)>,
}

/// A group of measurements that can be run alone.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum Scenario {
    /// One claim's latency at a small and a large backlog.
    Claim,
    /// The drain next to the bare-SQL ceilings, and under a large backlog.
    Drain,
    /// createJob over GraphQL at concurrency 1 and 32.
    Create,
    /// Against a `serve` child process: pickup, delivery, in-flight attempts, idle
    /// subscriptions.
    Live,
    /// A batch's items enqueued by addBatchItems next to createJob and a bare
    /// multi-row INSERT, then its drain. Run only when named.
    Batch,
}

/// Runs `scenarios` on `engine` — every one when the list is empty.
pub async fn run(
    engine: &Engine,
    scale: Scale,
    scenarios: &[Scenario],
) -> Result<Vec<Figure>, BenchError> {
    tracing::info!(engine = engine.name(), "benchmarking");
    let wanted = |scenario| scenarios.is_empty() || scenarios.contains(&scenario);
    let mut figures = Vec::new();
    if wanted(Scenario::Claim) {
        figures.extend(claim_latency(engine, scale).await?);
    }
    if wanted(Scenario::Drain) {
        figures.extend(drain(engine, scale).await?);
    }
    if wanted(Scenario::Create) {
        figures.extend(create_latency(engine, scale).await?);
    }
    if wanted(Scenario::Live) {
        figures.extend(live::run(engine, scale).await?);
    }
    if scenarios.contains(&Scenario::Batch) {
        figures.extend(batch::run(engine, scale).await?);
    }
    Ok(figures)
}

/// The figures as a Markdown table.
pub fn markdown(figures: &[Figure]) -> String {
    let mut table = String::from("| engine | measure | value | vs |\n|---|---|---|---|\n");
    for figure in figures {
        let ratio = figure
            .ratio
            .as_ref()
            .map_or(String::new(), |(ratio, of)| format!("{ratio:.2}× {of}"));
        table.push_str(&format!(
            "| {} | {} | {:.1} {} | {} |\n",
            figure.engine, figure.name, figure.value, figure.unit, ratio
        ));
    }
    table
}

/// The figures as JSON.
pub fn to_json(figures: &[Figure], scale: Scale) -> Value {
    json!({
        "scale": {
            "drain": scale.drain, "backlog": scale.backlog,
            "small_backlog": scale.small_backlog, "creates": scale.creates,
            "batch_items": scale.batch_items, "batch_creates": scale.batch_creates,
        },
        "figures": figures.iter().map(|figure| json!({
            "engine": figure.engine,
            "measure": figure.name,
            "value": figure.value,
            "unit": figure.unit,
            "ratio": figure.ratio.as_ref().map(|(ratio, of)| json!({"value": ratio, "of": of})),
        })).collect::<Vec<_>>(),
    })
}

async fn audited(database: ScratchDatabase) -> Result<(), BenchError> {
    let report = audit::audit(&database.db).await?;
    if !report.is_clean() {
        return Err(BenchError::Failed(format!(
            "the audit found violations after a scenario:\n{report}"
        )));
    }
    database.remove().await?;
    Ok(())
}

/// What seeding admits jobs by: every model goes to a simulator (never called: the
/// seeded jobs are run by the benchmark's own worker processes and their simulators).
fn seeding_providers() -> crate::llm::ProviderRegistry {
    crate::llm::ProviderRegistry::new(Some(std::sync::Arc::new(
        crate::llm::openai::OpenAiClient::new("simulator", "http://127.0.0.1:9/v1", None)
            .simulator(),
    )))
}

async fn seeded(database: &ScratchDatabase, jobs: u64) -> Result<(), BenchError> {
    let providers = seeding_providers();
    for index in 0..TENANTS {
        let (tenant, _) =
            seed::funded_tenant(&database.db, &format!("bench-{index}"), jobs).await?;
        seed::queued_jobs(
            &database.db,
            &providers,
            tenant,
            jobs / TENANTS,
            seed::job(0),
        )
        .await?;
    }
    Ok(())
}

fn median(mut samples: Vec<f64>) -> f64 {
    samples.sort_by(f64::total_cmp);
    samples[samples.len() / 2]
}

fn percentile(sorted: &[f64], fraction: f64) -> f64 {
    let index = ((sorted.len() as f64 - 1.0) * fraction).round() as usize;
    sorted[index.min(sorted.len() - 1)]
}

/// Rate limits on the seeded model far above anything a run reaches: every claim takes
/// the budget path (buckets locked, read and written) and nothing is ever deferred.
fn limits_never_reached() -> FlowLimits {
    let limit = RateLimit {
        requests_per_minute: NonZeroU32::new(1_000_000_000),
        tokens_per_minute: NonZeroU32::new(4_000_000_000),
        tokens_counted: None,
    };
    FlowLimits::new(
        std::collections::BTreeMap::from([(seed::MODEL.to_owned(), limit)]),
        std::collections::BTreeMap::new(),
        seeding_providers(),
    )
}

/// Gives every tenant per-minute limits far above what a run reaches.
async fn limit_every_tenant(db: &DatabaseConnection) -> Result<(), BenchError> {
    db.execute_unprepared(
        "INSERT INTO tenant_limits (tenant_id, requests_per_minute, tokens_per_minute, updated_at)
         SELECT id, 1000000000, 2000000000, 0 FROM tenants",
    )
    .await?;
    Ok(())
}

/// Median time of one claim of 32 with few and with many jobs queued, and with many
/// queued and limits configured that never bind.
async fn claim_latency(engine: &Engine, scale: Scale) -> Result<Vec<Figure>, BenchError> {
    let database = ScratchDatabase::create(engine).await?;
    let mut cursor = TenantCursor::default();
    let mut measure =
        async |db: &DatabaseConnection, flow: &FlowLimits| -> Result<f64, BenchError> {
            let mut samples = Vec::new();
            for _ in 0..CLAIM_SAMPLES {
                let started = Instant::now();
                let claimed = queue::claim_in_turn(
                    db,
                    ClaimRequest {
                        flow,
                        ..ClaimRequest::new(CLAIM_SIZE, Duration::from_secs(3_600))
                    },
                    &mut cursor,
                )
                .await?
                .claims;
                samples.push(started.elapsed().as_secs_f64() * 1_000.0);
                if claimed.len() != CLAIM_SIZE as usize {
                    return Err(BenchError::Failed(format!(
                        "a claim of {CLAIM_SIZE} took {} jobs",
                        claimed.len()
                    )));
                }
            }
            Ok(median(samples))
        };
    seeded(&database, scale.small_backlog).await?;
    let small = measure(&database.db, &NO_LIMITS).await?;
    seeded(&database, scale.backlog - scale.small_backlog).await?;
    let large = measure(&database.db, &NO_LIMITS).await?;
    limit_every_tenant(&database.db).await?;
    let limited = measure(&database.db, &limits_never_reached()).await?;
    audited(database).await?;
    let name = engine.name();
    Ok(vec![
        Figure {
            engine: name,
            name: format!(
                "claim of {CLAIM_SIZE}, {} queued (median)",
                scale.small_backlog
            ),
            value: small,
            unit: "ms",
            ratio: None,
        },
        Figure {
            engine: name,
            name: format!("claim of {CLAIM_SIZE}, {} queued (median)", scale.backlog),
            value: large,
            unit: "ms",
            ratio: Some((
                large / small,
                format!("the claim at {}", scale.small_backlog),
            )),
        },
        Figure {
            engine: name,
            name: format!(
                "claim of {CLAIM_SIZE}, {} queued, limits not reached (median)",
                scale.backlog
            ),
            value: limited,
            unit: "ms",
            ratio: Some((
                limited / large,
                format!("the claim at {} without limits", scale.backlog),
            )),
        },
    ])
}

/// A service in this process on `database`, with the built-in simulator and default
/// prices: an API on `listen`, workers by `worker`.
fn in_process_settings(
    database: &ScratchDatabase,
    listen: Option<std::net::SocketAddr>,
    worker: Option<WorkerSettings>,
) -> Settings {
    Settings {
        listen,
        database_url: database.url.clone(),
        listen_database_url: None,
        admin_token: Some("benchmark-admin-token-with-32-characters".to_owned()),
        worker,
        providers: ProviderSettings::default(),
        customer_markup: rust_decimal::Decimal::from_str_exact(
            crate::billing::prices::DEFAULT_CUSTOMER_MARKUP,
        )
        .expect("the default markup is a decimal"),
        config_file: None,
        operations: Default::default(),
        allow_private_webhooks: false,
        cors_origins: Vec::new(),
        default_deadline: None,
    }
}

/// Runs `processes` worker processes (each its own pool, workers and simulator, the
/// benchmark's workers shared among them) on `database` until `jobs` jobs have ended;
/// jobs per second.
async fn drain_rate(
    database: &ScratchDatabase,
    jobs: u64,
    flow: FlowLimits,
    processes: usize,
) -> Result<f64, BenchError> {
    let mut applications = Vec::with_capacity(processes);
    for _ in 0..processes {
        let worker = WorkerSettings {
            concurrency: WORKERS.div_ceil(processes),
            lease: Duration::from_secs(30),
            attempt_timeout: Duration::from_secs(60),
            shutdown_grace: Duration::from_secs(30),
            tenant_concurrency: None,
            poll_interval: Duration::from_millis(500),
            charging: crate::billing::ChargingPolicy::default(),
            flow: flow.clone(),
        };
        let settings = in_process_settings(database, None, Some(worker));
        applications.push(Application::build(settings).await?);
    }
    let shutdown = CancellationToken::new();
    let started = Instant::now();
    let running: Vec<_> = applications
        .into_iter()
        .map(|application| tokio::spawn(application.run(shutdown.clone())))
        .collect();
    let (mut done, mut progress_at) = (0, Instant::now());
    loop {
        tokio::time::sleep(Duration::from_millis(100)).await;
        let now_done = succeeded_attempts(&database.db).await?;
        if now_done >= jobs {
            break;
        }
        if now_done > done {
            (done, progress_at) = (now_done, Instant::now());
        } else if progress_at.elapsed() > STALL {
            return Err(BenchError::Failed(format!(
                "the drain stalled at {done} of {jobs} jobs"
            )));
        }
        if running.iter().any(|process| process.is_finished()) {
            return Err(BenchError::Failed("a worker process stopped".into()));
        }
    }
    let elapsed = started.elapsed().as_secs_f64();
    shutdown.cancel();
    for process in running {
        process
            .await
            .map_err(|error| BenchError::Failed(error.to_string()))?
            .map_err(|error| BenchError::Failed(error.to_string()))?;
    }
    let failed = jobs::Entity::find()
        .filter(jobs::Column::Status.ne(JobStatus::Succeeded))
        .filter(jobs::Column::FinishedAt.is_not_null())
        .count(&database.db)
        .await?;
    if failed > 0 {
        return Err(BenchError::Failed(format!(
            "{failed} drained jobs did not succeed"
        )));
    }
    Ok(jobs as f64 / elapsed)
}

/// Jobs drained so far: one succeeded attempt each. Counted on `attempts`, which holds
/// only what ran, never by a scan of the backlog (which would slow the drain it
/// measures).
async fn succeeded_attempts(db: &DatabaseConnection) -> Result<u64, BenchError> {
    Ok(attempts::Entity::find()
        .filter(attempts::Column::Outcome.eq(AttemptOutcome::Succeeded))
        .count(db)
        .await?)
}

/// jobledger's drain next to the bare-SQL ceilings, and under a large backlog.
async fn drain(engine: &Engine, scale: Scale) -> Result<Vec<Figure>, BenchError> {
    let name = engine.name();
    let database = ScratchDatabase::create(engine).await?;
    let one_row = naive::ceiling(&database.db, scale.drain, 1, NAIVE_CONNECTIONS).await?;
    let batched = naive::ceiling(&database.db, scale.drain, 50, NAIVE_CONNECTIONS).await?;
    seeded(&database, scale.drain).await?;
    let drained = drain_rate(&database, scale.drain, FlowLimits::default(), 1).await?;
    audited(database).await?;

    // One process, then several sharing the budgets' rows: limits configured on the
    // model and every tenant, never reached.
    let mut limited = Vec::new();
    for processes in [1, DRAIN_PROCESSES] {
        let mut rates = Vec::new();
        for flow in [FlowLimits::default(), limits_never_reached()] {
            if processes == 1 && flow.is_empty() {
                rates.push(drained);
                continue;
            }
            let database = ScratchDatabase::create(engine).await?;
            seeded(&database, scale.drain).await?;
            if !flow.is_empty() {
                limit_every_tenant(&database.db).await?;
            }
            rates.push(drain_rate(&database, scale.drain, flow, processes).await?);
            audited(database).await?;
        }
        limited.push((processes, rates[0], rates[1]));
    }

    let database = ScratchDatabase::create(engine).await?;
    seeded(&database, scale.backlog).await?;
    let under_backlog = drain_rate(&database, scale.drain, FlowLimits::default(), 1).await?;
    audited(database).await?;
    let one_row_name = "bare SQL, one row per claim".to_owned();
    let mut figures = vec![
        Figure {
            engine: name,
            name: one_row_name.clone(),
            value: one_row,
            unit: "jobs/s",
            ratio: None,
        },
        Figure {
            engine: name,
            name: "bare SQL, 50 rows per claim".into(),
            value: batched,
            unit: "jobs/s",
            ratio: None,
        },
        Figure {
            engine: name,
            name: format!("drain of {} jobs, settled", scale.drain),
            value: drained,
            unit: "jobs/s",
            ratio: Some((drained / one_row, one_row_name)),
        },
        Figure {
            engine: name,
            name: format!(
                "drain of {} jobs with {} queued",
                scale.drain, scale.backlog
            ),
            value: under_backlog,
            unit: "jobs/s",
            ratio: Some((
                under_backlog / drained,
                format!("the drain of {}", scale.drain),
            )),
        },
    ];
    for (processes, unlimited, limited) in limited {
        let by = match processes {
            1 => String::new(),
            processes => format!(" by {processes} processes"),
        };
        if processes > 1 {
            figures.push(Figure {
                engine: name,
                name: format!("drain of {} jobs{by}", scale.drain),
                value: unlimited,
                unit: "jobs/s",
                ratio: Some((unlimited / drained, format!("the drain of {}", scale.drain))),
            });
        }
        figures.push(Figure {
            engine: name,
            name: format!("drain of {} jobs{by}, limits not reached", scale.drain),
            value: limited,
            unit: "jobs/s",
            ratio: Some((
                limited / unlimited,
                format!("the drain of {}{by} without limits", scale.drain),
            )),
        });
    }
    Ok(figures)
}

/// createJob over GraphQL (real HTTP to the in-process API) at concurrency 1 and 32.
async fn create_latency(engine: &Engine, scale: Scale) -> Result<Vec<Figure>, BenchError> {
    let database = ScratchDatabase::create(engine).await?;
    let (_, key) = seed::funded_tenant(&database.db, "creator", scale.creates * 2).await?;
    let listen = "127.0.0.1:0".parse().expect("a socket address");
    let settings = in_process_settings(&database, Some(listen), None);
    let application = Application::build(settings).await?;
    let address = application
        .address()
        .ok_or_else(|| BenchError::Failed("the API did not bind".into()))?;
    let shutdown = CancellationToken::new();
    let running = tokio::spawn(application.run(shutdown.clone()));
    let client = reqwest::Client::new();
    let mut figures = Vec::new();
    for concurrency in [1_u64, 32] {
        let per_client = scale.creates / concurrency.min(scale.creates);
        let started = Instant::now();
        let clients = (0..concurrency).map(|client_index| {
            let client = client.clone();
            let key = key.clone();
            async move {
                let mut latencies = Vec::new();
                for index in 0..per_client {
                    let body = json!({
                        "query": "mutation($input: CreateJobInput!) { createJob(input: $input) { job { id } } }",
                        "variables": {"input": {
                            "idempotencyKey": format!("bench-{concurrency}-{client_index}-{index}"),
                            "model": seed::MODEL,
                            "messages": [{"role": "user", "content": "Summarise: the quarter went well."}],
                            "maxOutputTokens": 64,
                        }},
                    });
                    let sent = Instant::now();
                    let response: Value = client
                        .post(format!("http://{address}/graphql"))
                        .bearer_auth(&key)
                        .json(&body)
                        .send()
                        .await
                        .map_err(|error| BenchError::Failed(error.to_string()))?
                        .json()
                        .await
                        .map_err(|error| BenchError::Failed(error.to_string()))?;
                    latencies.push(sent.elapsed().as_secs_f64() * 1_000.0);
                    if !response["errors"].is_null() {
                        return Err(BenchError::Failed(format!("createJob failed: {response}")));
                    }
                }
                Ok::<_, BenchError>(latencies)
            }
        });
        let mut latencies = Vec::new();
        for result in futures_util::future::join_all(clients).await {
            latencies.extend(result?);
        }
        let elapsed = started.elapsed().as_secs_f64();
        latencies.sort_by(f64::total_cmp);
        let name = engine.name();
        figures.push(Figure {
            engine: name,
            name: format!("createJob at concurrency {concurrency}"),
            value: latencies.len() as f64 / elapsed,
            unit: "jobs/s",
            ratio: None,
        });
        for (label, fraction) in [("p50", 0.5), ("p99", 0.99)] {
            figures.push(Figure {
                engine: name,
                name: format!("createJob at concurrency {concurrency}, {label}"),
                value: percentile(&latencies, fraction),
                unit: "ms",
                ratio: None,
            });
        }
    }
    shutdown.cancel();
    running
        .await
        .map_err(|error| BenchError::Failed(error.to_string()))?
        .map_err(|error| BenchError::Failed(error.to_string()))?;
    audited(database).await?;
    Ok(figures)
}
