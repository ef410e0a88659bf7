//! The `jobledger` command line: `serve`, `worker`, `migrate` and `mock-llm`.

use crate::config::{DEFAULT_DATABASE_URL, ProviderSettings, Settings};
use crate::jobs::worker::WorkerSettings;
use crate::llm::simulator::Simulator;
use crate::startup::Application;
use clap::{Args, Parser, Subcommand};
use rust_decimal::Decimal;
use std::net::SocketAddr;
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
}

#[derive(Debug, Args)]
struct DatabaseArgs {
    /// `sqlite:FILE` or `postgres://…`.
    #[arg(long, env = "DATABASE_URL", default_value = DEFAULT_DATABASE_URL)]
    database_url: String,
}

#[derive(Debug, Args)]
struct WorkerArgs {
    #[command(flatten)]
    database: DatabaseArgs,
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
}

#[derive(Debug, Args)]
struct ServeArgs {
    /// Address of the GraphQL API.
    #[arg(long, env = "JOBLEDGER_LISTEN", default_value = "127.0.0.1:8080")]
    listen: SocketAddr,
    #[command(flatten)]
    worker: WorkerArgs,
}

#[derive(Debug, Args)]
struct MockLlmArgs {
    /// Address of the simulator.
    #[arg(long, env = "JOBLEDGER_LISTEN", default_value = "127.0.0.1:8090")]
    listen: SocketAddr,
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
            poll_interval: POLL_INTERVAL,
        })
    }

    fn into_settings(self, listen: Option<SocketAddr>) -> Settings {
        Settings {
            listen,
            worker: self.settings(),
            database_url: self.database.database_url,
            admin_token: std::env::var("JOBLEDGER_ADMIN_TOKEN").ok(),
            providers: ProviderSettings::from_env(),
            customer_markup: Decimal::from_str_exact(
                crate::billing::prices::DEFAULT_CUSTOMER_MARKUP,
            )
            .expect("the default markup is a decimal"),
        }
    }
}

impl Cli {
    /// Runs the chosen command to its end.
    pub async fn run(self) -> Result<(), Box<dyn std::error::Error>> {
        match self.command {
            Command::Serve(args) => {
                let application =
                    Application::build(args.worker.into_settings(Some(args.listen))).await?;
                let (token, generated) = application.admin_token();
                if generated {
                    // Printed, not logged: the one time an operator can copy it.
                    println!(
                        "admin token (shown once; set JOBLEDGER_ADMIN_TOKEN to choose your own): {token}"
                    );
                }
                application.run(shutdown_on_signal()).await?;
            }
            Command::Worker(args) => {
                if args.workers == 0 {
                    return Err("worker needs --workers of at least 1".into());
                }
                let application = Application::build(args.into_settings(None)).await?;
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
                    .serve(listener, shutdown.cancelled_owned())
                    .await?;
            }
        }
        Ok(())
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
