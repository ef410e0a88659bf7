//! The `jobledger` command line: `serve`, `worker`, `migrate`, `mock-llm`, `audit`,
//! `prices import` and `bench`.

use crate::billing::ChargingPolicy;
use crate::config::{
    AdminTokenError, DEFAULT_DATABASE_URL, LiveConnectionSettings, OperationsSettings,
    ProviderSettings, Settings,
};
use crate::jobs::flow::FlowLimits;
use crate::jobs::worker::WorkerSettings;
use crate::llm::Timeouts;
use crate::llm::simulator::Simulator;
use crate::startup::Application;
use clap::{Args, Parser, Subcommand};
use rust_decimal::Decimal;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;
use tokio_util::sync::CancellationToken;

/// Durable, accountable LLM jobs.
#[derive(Debug, Parser)]
#[command(name = "jobledger", version, about)]
pub struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Apply migrations, then run the GraphQL API and the workers.
    Serve(ServeArgs),
    /// Run workers only.
    Worker(WorkerArgs),
    /// Apply migrations and exit.
    Migrate(DatabaseArgs),
    /// Run the OpenAI-compatible provider simulator.
    MockLlm(MockLlmArgs),
    /// Recompute every balance from the ledger and check the billing invariants; print
    /// one line per invariant. Exit code 0: all hold; 1: a violation was found; 2: the
    /// audit could not run (database unreachable, missing or not migrated).
    Audit(DatabaseArgs),
    /// Model prices.
    #[command(subcommand)]
    Prices(PricesCommand),
    /// Measure the queue: claim latency against backlog size, drain rate next to a
    /// bare-SQL queue, createJob latency. Prints a Markdown table; each scenario runs on
    /// a database of its own (a temporary SQLite file; on PostgreSQL, one created on
    /// the `--postgres` server and dropped after).
    Bench(BenchArgs),
}

#[derive(Debug, Args)]
struct BenchArgs {
    /// Also run every scenario on PostgreSQL: a server URL on which the benchmark may
    /// create and drop databases.
    #[arg(
        long,
        env = "JOBLEDGER_BENCH_POSTGRES",
        value_name = "URL",
        hide_env_values = true
    )]
    postgres: Option<String>,
    /// Skip SQLite.
    #[arg(long, env = "JOBLEDGER_BENCH_NO_SQLITE")]
    no_sqlite: bool,
    /// A few seconds with tiny counts: checks that every scenario runs, not speed.
    #[arg(long, env = "JOBLEDGER_BENCH_SMOKE")]
    smoke: bool,
    /// Also write the figures as JSON to this file.
    #[arg(long, env = "JOBLEDGER_BENCH_JSON", value_name = "FILE")]
    json: Option<PathBuf>,
    /// Run only these scenarios (repeatable, or comma-separated in the environment);
    /// all of them when none is named.
    #[arg(
        long = "scenario",
        env = "JOBLEDGER_BENCH_SCENARIOS",
        value_delimiter = ',',
        value_enum,
        value_name = "SCENARIO"
    )]
    scenarios: Vec<crate::bench::Scenario>,
    /// Items of the batch scenario's batch (default 200,000; 2,000 with --smoke).
    #[arg(long, env = "JOBLEDGER_BENCH_ITEMS", value_name = "N")]
    items: Option<u64>,
}

#[derive(Debug, Subcommand)]
enum PricesCommand {
    /// Add or version model prices from a price map in the JSON format LiteLLM
    /// publishes (`model_prices_and_context_window.json`). Chat models of `openai`,
    /// OpenAI-compatible providers and `anthropic` are stored as new price versions
    /// where they changed; a model the config file prices keeps its price, and a
    /// version an attempt used is never rewritten. Prints one line per entry (added,
    /// new version, unchanged, kept, skipped and why) and a summary. Exit code 0: the
    /// map was imported (skipped entries included); 1: the file cannot be read or is
    /// not a price map, and nothing was stored; 2: the database cannot be used.
    Import(ImportArgs),
}

#[derive(Debug, Args)]
struct ImportArgs {
    /// The price map (JSON).
    file: PathBuf,
    #[command(flatten)]
    database: DatabaseArgs,
    /// The config file whose `customer_markup` sets what tenants pay for the imported
    /// models (else 1.25 times the provider's price).
    #[arg(long, env = "JOBLEDGER_CONFIG", value_name = "FILE")]
    config: Option<PathBuf>,
}

#[derive(Debug, Args)]
struct DatabaseArgs {
    /// `sqlite:FILE` or `postgres://…`.
    // The URL may hold a password: --help must not print it from the environment.
    #[arg(long, env = "DATABASE_URL", default_value = DEFAULT_DATABASE_URL, hide_env_values = true)]
    database_url: String,
}

#[derive(Debug, Args)]
struct WorkerArgs {
    #[command(flatten)]
    database: DatabaseArgs,
    /// A direct PostgreSQL URL for the one session connection that LISTENs, when
    /// `--database-url` goes through a transaction-mode pooler (PgBouncer). Set, the
    /// pools send no startup options, which a pooler refuses. Unset: the same as
    /// `--database-url`.
    #[arg(
        long,
        env = "JOBLEDGER_LISTEN_DATABASE_URL",
        value_name = "URL",
        hide_env_values = true
    )]
    listen_database_url: Option<String>,
    /// Concurrent attempts in this process; 0 runs no workers.
    #[arg(long, env = "JOBLEDGER_WORKERS", default_value_t = 32)]
    workers: usize,
    /// How long a claim owns a job without renewal.
    #[arg(long, env = "JOBLEDGER_LEASE_SECONDS", default_value_t = 30, value_parser = clap::value_parser!(u64).range(1..))]
    lease_seconds: u64,
    /// Longest one provider call may take.
    #[arg(long, env = "JOBLEDGER_ATTEMPT_TIMEOUT_SECONDS", default_value_t = 120, value_parser = clap::value_parser!(u64).range(1..))]
    attempt_timeout_seconds: u64,
    /// How long running attempts may go on after SIGINT/SIGTERM.
    #[arg(long, env = "JOBLEDGER_SHUTDOWN_GRACE_SECONDS", default_value_t = 30)]
    shutdown_grace_seconds: u64,
    /// Most jobs of one tenant running at once across all workers; unbounded when
    /// unset (claims stay fair across tenants either way).
    #[arg(long, env = "JOBLEDGER_TENANT_CONCURRENCY", value_parser = clap::value_parser!(u32).range(1..))]
    tenant_concurrency: Option<u32>,
    /// How long connecting to a provider may take; past it the call counts as never
    /// sent, and retrying is safe.
    #[arg(long, env = "JOBLEDGER_CONNECT_TIMEOUT_SECONDS", default_value_t = 10, value_parser = clap::value_parser!(u64).range(1..))]
    connect_timeout_seconds: u64,
    /// How long a provider may take to start answering once the request is sent; past
    /// it the outcome is unknown. Unset: only the attempt timeout applies.
    #[arg(long, env = "JOBLEDGER_FIRST_BYTE_TIMEOUT_SECONDS", value_parser = clap::value_parser!(u64).range(1..))]
    first_byte_timeout_seconds: Option<u64>,
    /// TOML file of providers, model routes and prices (see jobledger.example.toml).
    #[arg(long, env = "JOBLEDGER_CONFIG", value_name = "FILE")]
    config: Option<PathBuf>,
    /// Where to serve /metrics, /healthz and /readyz besides the API (for `worker`,
    /// which has no API port; for `serve`, /metrics then leaves the API's port); unset:
    /// nowhere.
    #[arg(long, env = "JOBLEDGER_METRICS_LISTEN", value_name = "ADDR")]
    metrics_listen: Option<SocketAddr>,
    /// Prune the events and payloads (input, result) of jobs finished more than D days
    /// ago; ledger rows, attempts' usage and costs are kept. Unset: keep everything.
    /// At least 1 and at most 36500 (a century), so that a typo cannot prune everything.
    #[arg(long, env = "JOBLEDGER_RETENTION_DAYS", value_name = "D",
          value_parser = clap::value_parser!(u32).range(1..=36_500))]
    retention_days: Option<u32>,
    /// Close a WebSocket connection that held no subscription for S seconds (it
    /// answers pings, so nothing else would); one holding a subscription is never
    /// closed as idle.
    #[arg(long, env = "JOBLEDGER_UNSUBSCRIBED_SOCKET_TIMEOUT_SECONDS", value_name = "S",
          default_value_t = crate::config::DEFAULT_UNSUBSCRIBED_SOCKET_TIMEOUT.as_secs(),
          value_parser = clap::value_parser!(u64).range(1..))]
    unsubscribed_socket_timeout_seconds: u64,
    /// Read each submitted provider batch (PROVIDER_BATCH items at the provider's batch
    /// API) every S seconds until it ends.
    #[arg(long, env = "JOBLEDGER_PROVIDER_BATCH_POLL_SECONDS", value_name = "S",
          default_value_t = crate::jobs::provider_batches::DEFAULT_POLL.as_secs(),
          value_parser = clap::value_parser!(u64).range(1..))]
    provider_batch_poll_seconds: u64,
    /// A provider batch the provider cannot be read about for S seconds has an unknown
    /// fate: its items end with the cost bound of an unknown outcome (reconcilable).
    #[arg(long, env = "JOBLEDGER_PROVIDER_BATCH_UNKNOWN_AFTER_SECONDS", value_name = "S",
          default_value_t = crate::jobs::provider_batches::DEFAULT_UNKNOWN_AFTER.as_secs(),
          value_parser = clap::value_parser!(u64).range(1..))]
    provider_batch_unknown_after_seconds: u64,
    /// After an ambiguous answer to a provider batch's create (a timeout, a lost
    /// connection, a 429/529), wait S seconds from the last request before searching
    /// the provider for the batch, and before ever uploading it again.
    #[arg(long, env = "JOBLEDGER_PROVIDER_BATCH_CREATE_GRACE_SECONDS", value_name = "S",
          default_value_t = crate::jobs::provider_batches::DEFAULT_CREATE_GRACE.as_secs())]
    provider_batch_create_grace_seconds: u64,
    /// A request of a provider's batch API (a read, a cancel, a page of a search, a
    /// line of the results) unanswered for S seconds is given up as unanswered; an
    /// upload has twice this, and a second for each megabyte it sends.
    #[arg(long, env = "JOBLEDGER_PROVIDER_BATCH_CALL_TIMEOUT_SECONDS", value_name = "S",
          default_value_t = crate::jobs::provider_batches::DEFAULT_CALL_TIMEOUT.as_secs(),
          value_parser = clap::value_parser!(u64).range(1..))]
    provider_batch_call_timeout_seconds: u64,
    /// Live connections (WebSocket connections and SSE streams) the API holds open at
    /// once across all clients; past it a new one is refused with 503.
    #[arg(long, env = "JOBLEDGER_MAX_LIVE_CONNECTIONS", value_name = "N",
          default_value_t = crate::config::DEFAULT_MAX_LIVE_CONNECTIONS,
          value_parser = clap::builder::RangedU64ValueParser::<usize>::new().range(1..))]
    max_live_connections: usize,
    /// Let webhooks reach loopback, private and link-local addresses (development and
    /// tests); off, createWebhook refuses them and every delivery re-checks.
    #[arg(long, env = "JOBLEDGER_ALLOW_PRIVATE_WEBHOOKS")]
    allow_private_webhooks: bool,
}

#[derive(Debug, Args)]
struct ServeArgs {
    /// Address of the GraphQL API.
    #[arg(long, env = "JOBLEDGER_LISTEN", default_value = "127.0.0.1:8080")]
    listen: SocketAddr,
    /// An origin (`https://app.example.com`) whose pages may call /graphql,
    /// /graphql/sse and batch results from a browser, and open WebSockets; repeat it,
    /// or list them comma-separated in the environment. Unset: no CORS headers, and
    /// any WebSocket.
    #[arg(long = "cors-origin", env = "JOBLEDGER_CORS_ORIGINS", value_name = "ORIGIN",
          value_delimiter = ',', value_parser = crate::config::cors_origin)]
    cors_origins: Vec<String>,
    /// How long a job whose createJob names no deadline has to finish, counted from
    /// when it may start; past it the job fails DEADLINE_EXCEEDED. Unset: the config
    /// file's `default_deadline_seconds`, else 86400 (24 hours).
    #[arg(long, env = "JOBLEDGER_DEFAULT_DEADLINE_SECONDS", value_name = "S",
          value_parser = clap::value_parser!(u64).range(1..))]
    default_deadline_seconds: Option<u64>,
    #[command(flatten)]
    worker: WorkerArgs,
}

#[derive(Debug, Args)]
struct MockLlmArgs {
    /// Address of the simulator.
    #[arg(long, env = "JOBLEDGER_LISTEN", default_value = "127.0.0.1:8090")]
    listen: SocketAddr,
    /// How long a batch takes: it ends this many milliseconds after its creation.
    #[arg(long, env = "JOBLEDGER_BATCH_DELAY_MS", value_name = "N",
          default_value_t = crate::llm::simulator::DEFAULT_BATCH_DELAY.as_millis() as u64)]
    batch_delay_ms: u64,
}

/// How often an idle worker looks for due jobs without being told.
const POLL_INTERVAL: Duration = Duration::from_millis(500);

impl WorkerArgs {
    fn settings(&self) -> Option<WorkerSettings> {
        (self.workers > 0).then(|| WorkerSettings {
            concurrency: self.workers,
            lease: Duration::from_secs(self.lease_seconds),
            attempt_timeout: Duration::from_secs(self.attempt_timeout_seconds),
            shutdown_grace: Duration::from_secs(self.shutdown_grace_seconds),
            tenant_concurrency: self.tenant_concurrency,
            poll_interval: POLL_INTERVAL,
            // The config file's `[charging]` replaces it when the application is built.
            charging: ChargingPolicy::default(),
            // So do the config file's rate limits.
            flow: FlowLimits::default(),
        })
    }

    /// The settings these flags and the environment give; an admin token the operator
    /// chose must pass [`crate::config::admin_token`].
    fn into_settings(
        self,
        listen: Option<SocketAddr>,
        cors_origins: Vec<String>,
    ) -> Result<Settings, AdminTokenError> {
        Ok(Settings {
            listen,
            cors_origins,
            worker: self.settings(),
            database_url: self.database.database_url,
            listen_database_url: self.listen_database_url,
            admin_token: crate::config::admin_token_from_env()?,
            providers: ProviderSettings {
                timeouts: Timeouts {
                    connect: Duration::from_secs(self.connect_timeout_seconds),
                    first_byte: self.first_byte_timeout_seconds.map(Duration::from_secs),
                },
                ..ProviderSettings::from_env()
            },
            customer_markup: Decimal::from_str_exact(
                crate::billing::prices::DEFAULT_CUSTOMER_MARKUP,
            )
            .expect("the default markup is a decimal"),
            config_file: self.config,
            operations: OperationsSettings {
                metrics_listen: self.metrics_listen,
                retention: self
                    .retention_days
                    .map(|days| Duration::from_secs(u64::from(days) * 24 * 60 * 60)),
                live: LiveConnectionSettings {
                    max_open: self.max_live_connections,
                    unsubscribed_socket_timeout: Duration::from_secs(
                        self.unsubscribed_socket_timeout_seconds,
                    ),
                },
                provider_batches: crate::jobs::provider_batches::ProviderBatchSettings {
                    poll: Duration::from_secs(self.provider_batch_poll_seconds),
                    unknown_after: Duration::from_secs(self.provider_batch_unknown_after_seconds),
                    create_grace: Duration::from_secs(self.provider_batch_create_grace_seconds),
                    call_timeout: Duration::from_secs(self.provider_batch_call_timeout_seconds),
                },
            },
            allow_private_webhooks: self.allow_private_webhooks,
            default_deadline: None,
        })
    }
}

impl Cli {
    /// Runs the chosen command to its end.
    pub async fn run(self) -> Result<(), Box<dyn std::error::Error>> {
        match self.command {
            Command::Serve(args) => {
                let application = Application::build(Settings {
                    default_deadline: args.default_deadline_seconds.map(Duration::from_secs),
                    ..args
                        .worker
                        .into_settings(Some(args.listen), args.cors_origins)?
                })
                .await?;
                let (token, generated) = application.admin_token();
                if generated {
                    // Printed, not logged: the one time an operator can copy it.
                    println!(
                        "admin token (shown once, and a new one at every start; set JOBLEDGER_ADMIN_TOKEN to keep one): {token}"
                    );
                }
                if let Some(address) = application.address() {
                    println!(
                        "web console: http://{address}/ (sign in with a tenant API key or the admin token)"
                    );
                }
                application.run(shutdown_on_signal()).await?;
            }
            Command::Worker(args) => {
                if args.workers == 0 {
                    return Err("worker needs --workers of at least 1".into());
                }
                if args.database.database_url.starts_with("sqlite:") {
                    // Notices cross processes only through PostgreSQL.
                    tracing::warn!(
                        "a separate worker process on SQLite learns of new jobs by polling and of cancels at lease renewal, and its live output never reaches the API process; run `serve` alone on SQLite, or use PostgreSQL"
                    );
                }
                // No API: no browser calls it.
                let application = Application::build(args.into_settings(None, Vec::new())?).await?;
                application.run(shutdown_on_signal()).await?;
            }
            Command::Migrate(args) => {
                let db = crate::db::connect(&args.database_url).await?;
                crate::db::migrate(&db).await?;
                tracing::info!("migrations applied");
            }
            Command::MockLlm(args) => {
                let listener = tokio::net::TcpListener::bind(args.listen).await?;
                tracing::info!(address = %listener.local_addr()?, "LLM simulator listening");
                let shutdown = shutdown_on_signal();
                Simulator::new()
                    .with_batch_delay(Duration::from_millis(args.batch_delay_ms))
                    .serve(listener, shutdown.cancelled_owned())
                    .await?;
            }
            Command::Bench(args) => {
                use crate::bench::{self, Scale, scratch::Engine};
                let mut scale = if args.smoke {
                    Scale::SMOKE
                } else {
                    Scale::FULL
                };
                if let Some(items) = args.items {
                    scale.batch_items = items;
                }
                let mut engines = Vec::new();
                if !args.no_sqlite {
                    engines.push(Engine::Sqlite);
                }
                engines.extend(args.postgres.map(Engine::Postgres));
                // One table per engine, printed as soon as it is measured.
                let mut figures = Vec::new();
                for engine in &engines {
                    let measured = bench::run(engine, scale, &args.scenarios).await?;
                    print!("{}", bench::markdown(&measured));
                    std::io::Write::flush(&mut std::io::stdout())?;
                    figures.extend(measured);
                }
                if let Some(path) = args.json {
                    std::fs::write(&path, bench::to_json(&figures, scale).to_string())?;
                }
            }
            Command::Prices(PricesCommand::Import(args)) => std::process::exit(import(args).await),
            Command::Audit(args) => {
                use crate::billing::audit;
                // One read-only snapshot; the exit code tells "the books are wrong" (1)
                // apart from "could not look" (2), as diff and cmp do.
                let report = async {
                    let db = audit::connect(&args.database_url).await?;
                    let report = audit::audit_snapshot(&db).await;
                    db.close().await.ok();
                    report
                }
                .await;
                match report {
                    Ok(report) => {
                        print!("{report}");
                        std::io::Write::flush(&mut std::io::stdout())?;
                        if !report.is_clean() {
                            std::process::exit(1);
                        }
                    }
                    Err(error) => {
                        eprintln!(
                            "error: the audit could not run (is the database reachable and migrated?): {error}"
                        );
                        std::process::exit(2);
                    }
                }
            }
        }
        Ok(())
    }
}

/// `prices import`: prints the report, and returns the exit code.
async fn import(args: ImportArgs) -> i32 {
    use crate::billing::prices::import;
    let markup = match &args.config {
        Some(path) => match crate::config::file::ConfigFile::load(path) {
            Ok(config) => config.customer_markup,
            Err(error) => {
                eprintln!("error: {error}");
                return 1;
            }
        },
        None => None,
    }
    .unwrap_or_else(|| {
        Decimal::from_str_exact(crate::billing::prices::DEFAULT_CUSTOMER_MARKUP)
            .expect("the default markup is a decimal")
    });
    let file = args.file.display().to_string();
    let entries = match std::fs::read_to_string(&args.file)
        .map_err(|error| error.to_string())
        .and_then(|text| import::parse_map(&text, markup, &file).map_err(|error| error.to_string()))
    {
        Ok(entries) => entries,
        Err(error) => {
            eprintln!("error: {file}: {error}; nothing was imported");
            return 1;
        }
    };
    let report = async {
        let db = crate::db::connect(&args.database.database_url).await?;
        crate::db::migrate(&db).await?;
        let report = import::import_prices(&db, entries).await;
        db.close().await.ok();
        report
    }
    .await;
    match report {
        Ok(report) => {
            print!("{report}");
            match std::io::Write::flush(&mut std::io::stdout()) {
                Ok(()) => 0,
                Err(_) => 1,
            }
        }
        Err(error) => {
            // Whatever was stored before the error stays: importing again completes it.
            eprintln!("error: the database cannot be used: {error}");
            2
        }
    }
}

/// A token cancelled on SIGINT or SIGTERM.
fn shutdown_on_signal() -> CancellationToken {
    let token = CancellationToken::new();
    let cancel = token.clone();
    tokio::spawn(async move {
        let interrupt = tokio::signal::ctrl_c();
        #[cfg(unix)]
        let terminate = async {
            match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
                Ok(mut signal) => {
                    signal.recv().await;
                }
                Err(error) => {
                    tracing::error!(error = %error, "cannot listen for SIGTERM");
                    std::future::pending::<()>().await;
                }
            }
        };
        #[cfg(not(unix))]
        let terminate = std::future::pending::<()>();
        tokio::select! {
            _ = interrupt => {}
            _ = terminate => {}
        }
        tracing::info!("shutdown requested");
        cancel.cancel();
    });
    token
}
