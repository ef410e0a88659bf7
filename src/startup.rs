//! Composing the application from its settings: database, providers, workers, the API and
//! the background tasks, and running them with one shutdown order.

use crate::accounts::AdminToken;
use crate::app::App;
use crate::billing::prices;
use crate::bus::EventBus;
use crate::bus::relay::NotificationRelay;
use crate::config::Settings;
use crate::config::file::{ConfigError, ConfigFile};
use crate::config::{merge, providers};
use crate::db::{BACKGROUND_POOL_SIZE, POOL_SIZE, Reach};
use crate::graphql;
use crate::http::{self, HttpState};
use crate::jobs::provider_batches::Submitter;
use crate::jobs::worker::Worker;
use crate::llm::simulator::Simulator;
use crate::metrics::Metrics;
use crate::webhooks::dispatch::Dispatcher;
use sea_orm::DbErr;
use std::net::SocketAddr;
use tokio::net::TcpListener;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

/// Why the application could not start.
#[derive(Debug, thiserror::Error)]
pub enum StartupError {
    #[error("database: {0}")]
    Database(#[from] DbErr),
    #[error("network: {0}")]
    Io(#[from] std::io::Error),
    #[error("{0}")]
    Config(#[from] ConfigError),
    #[error(
        "--listen-database-url is for PostgreSQL behind a pooler: both it and --database-url must be postgres:// URLs"
    )]
    ListenDatabaseUrl,
}

/// A built application, ready to run.
pub struct Application {
    app: App,
    listener: Option<TcpListener>,
    /// Where `/metrics`, `/healthz` and `/readyz` are served besides the API.
    metrics_listener: Option<TcpListener>,
    retention: Option<std::time::Duration>,
    live_connections: crate::config::LiveConnectionSettings,
    /// The origins whose pages may call the API.
    browser_origins: http::BrowserOrigins,
    worker: Option<Worker>,
    submitter: Option<Submitter>,
    simulator: Option<BuiltInSimulator>,
    relay: NotificationRelay,
    admin_token_generated: bool,
}

/// The simulator a process starts for itself when no provider is configured.
struct BuiltInSimulator {
    stop: CancellationToken,
    task: JoinHandle<std::io::Result<()>>,
}

impl Application {
    /// Reads and validates the config file (before touching anything), connects to
    /// the database, applies migrations, stores the prices that changed as new
    /// versions, starts the simulator if needed and binds the listener.
    pub async fn build(settings: Settings) -> Result<Self, StartupError> {
        let config = match &settings.config_file {
            Some(path) => {
                let config = ConfigFile::load(path)?;
                tracing::info!(file = %path.display(), "config file read");
                Some(config)
            }
            None => None,
        };
        let price_list = match &config {
            Some(config) => config.prices(settings.customer_markup)?,
            None => prices::built_in_prices(settings.customer_markup),
        };
        let reach = match &settings.listen_database_url {
            None => Reach::Direct,
            Some(url) if is_postgres(url) && is_postgres(&settings.database_url) => Reach::Pooler,
            Some(_) => return Err(StartupError::ListenDatabaseUrl),
        };
        let db = crate::db::connect_pool(&settings.database_url, POOL_SIZE, reach).await?;
        crate::db::migrate(&db).await?;
        prices::sync_prices(&db, &price_list).await?;

        let (admin_token, admin_token_generated) = match &settings.admin_token {
            Some(token) if !token.trim().is_empty() => (AdminToken::new(token.trim()), false),
            _ => (AdminToken::generate(), true),
        };
        let bus = EventBus::default();
        let relay = NotificationRelay::listen(&db, settings.listen_database_url.clone()).await?;
        // A process that calls real providers only has no simulator listening beside it.
        let (simulator_url, simulator) = match &settings.providers.simulator_url {
            Some(url) => (Some(url.clone()), None),
            None if providers::simulator_needed(&settings, config.as_ref()) => {
                let (address, simulator) = BuiltInSimulator::start().await?;
                (Some(format!("http://{address}/v1")), Some(simulator))
            }
            None => (None, None),
        };
        let providers =
            providers::provider_registry(&settings, config.as_ref(), simulator_url.as_deref());
        providers.set_imported_families(prices::routes::imported_families(&db).await?);
        // Workers get a pool of their own when the API shares the process: no burst of
        // API requests can then delay a lease renewal or an attempt's settlement.
        let own_worker_db = match (&settings.worker, &settings.listen) {
            (Some(_), Some(_)) => {
                Some(crate::db::connect_pool(&settings.database_url, POOL_SIZE, reach).await?)
            }
            _ => None,
        };
        let worker_db = own_worker_db.clone().unwrap_or_else(|| db.clone());
        // So do the background tasks (webhook dispatcher, sweeps, retention, gauges):
        // a burst of API requests must not make them fail, nor they slow the API.
        let own_background_db = match &settings.listen {
            Some(_) => Some(
                crate::db::connect_pool(&settings.database_url, BACKGROUND_POOL_SIZE, reach)
                    .await?,
            ),
            None => None,
        };
        let metrics = Metrics::default();
        let app = App {
            db: db.clone(),
            bus: bus.clone(),
            admin_token,
            providers: providers.clone(),
            metrics: metrics.clone(),
            worker_db: own_worker_db,
            background_db: own_background_db,
            allow_private_webhooks: settings.allow_private_webhooks,
            default_deadline: merge::default_deadline(&settings, config.as_ref()),
            charging: merge::charging(config.as_ref()),
            measuring: crate::jobs::measuring::Measuring::per_core(),
        };
        let worker =
            merge::worker_settings(&settings, config.as_ref(), &providers).map(|worker_settings| {
                let id = format!(
                    "{}-{}",
                    std::process::id(),
                    &uuid::Uuid::new_v4().simple().to_string()[..8]
                );
                // Every worker process submits provider batches too, each row owned by one
                // process at a time.
                let submitter = Submitter::new(
                    worker_db.clone(),
                    bus.clone(),
                    providers.clone(),
                    settings.operations.provider_batches,
                    worker_settings.charging,
                    id.clone(),
                );
                let worker = Worker::new(
                    id,
                    worker_db,
                    bus.clone(),
                    providers.clone(),
                    worker_settings,
                    metrics.clone(),
                );
                (worker, submitter)
            });
        let (worker, submitter) = worker.unzip();
        let listener = match settings.listen {
            Some(address) => Some(TcpListener::bind(address).await?),
            None => None,
        };
        let metrics_listener = match settings.operations.metrics_listen {
            Some(address) => Some(TcpListener::bind(address).await?),
            None => None,
        };
        Ok(Self {
            app,
            listener,
            metrics_listener,
            retention: settings.operations.retention,
            live_connections: settings.operations.live,
            browser_origins: http::BrowserOrigins::new(&settings.cors_origins),
            worker,
            submitter,
            simulator,
            relay,
            admin_token_generated,
        })
    }

    /// The address the API listens on, once bound (port 0 picks a free one).
    pub fn address(&self) -> Option<SocketAddr> {
        self.listener
            .as_ref()
            .and_then(|listener| listener.local_addr().ok())
    }

    /// The admin token, and whether it was generated for this run (to be shown once).
    pub fn admin_token(&self) -> (&str, bool) {
        (self.app.admin_token.expose(), self.admin_token_generated)
    }

    /// The address of the metrics listener, once bound.
    pub fn metrics_address(&self) -> Option<SocketAddr> {
        self.metrics_listener
            .as_ref()
            .and_then(|listener| listener.local_addr().ok())
    }

    /// The shared state, for tests and tools that call services directly.
    pub fn app(&self) -> &App {
        &self.app
    }

    /// Serves until `shutdown` is cancelled; then stops accepting, lets the workers
    /// finish within their grace period, and stops the built-in simulator last, since
    /// running attempts may still be talking to it.
    pub async fn run(self, shutdown: CancellationToken) -> std::io::Result<()> {
        // The relay outlives the shutdown signal: draining attempts still need cancels
        // from other processes. It stops after the workers have.
        let relay_stop = CancellationToken::new();
        let relay = tokio::spawn(self.relay.run(
            self.app.db.clone(),
            self.app.bus.clone(),
            relay_stop.clone(),
        ));
        let background_db = self
            .app
            .background_db
            .clone()
            .unwrap_or_else(|| self.app.db.clone());
        // Stopped by `shutdown`, and awaited in this order once the API has stopped:
        // the workers first (their attempts finish within the grace period), then the
        // sweeps and the dispatcher, which have nothing left to lose.
        let mut tasks = Tasks::default();
        if let Some(worker) = self.worker {
            tasks.spawn("the workers", worker.run(shutdown.child_token()));
        }
        if let Some(submitter) = self.submitter {
            tasks.spawn(
                "the provider-batch submitter",
                submitter.run(shutdown.child_token()),
            );
        }
        if let Some(retention) = self.retention {
            tasks.spawn(
                "the retention sweep",
                crate::jobs::retention::run(
                    background_db.clone(),
                    retention,
                    shutdown.child_token(),
                ),
            );
        }
        let metrics_elsewhere = self.metrics_listener.is_some();
        if let Some(listener) = self.metrics_listener {
            let address = listener.local_addr()?;
            tracing::info!(address = %address, "serving http://{address}/metrics, /healthz and /readyz");
            let router = http::operations_router(self.app.clone());
            tasks.spawn_fallible(
                "the metrics listener",
                http::serve(listener, router, shutdown.clone()),
            );
        }
        tasks.spawn(
            "the webhook dispatcher",
            Dispatcher::new(
                background_db.clone(),
                self.app.allow_private_webhooks,
                self.app.metrics.clone(),
            )
            .run(shutdown.child_token()),
        );
        tasks.spawn(
            "the batch cancel sweep",
            crate::jobs::batches::cancel::run(
                background_db.clone(),
                self.app.bus.clone(),
                self.app.metrics.clone(),
                shutdown.child_token(),
            ),
        );
        tasks.spawn(
            "the imported models' routes",
            prices::routes::run(
                background_db.clone(),
                self.app.providers.clone(),
                shutdown.child_token(),
            ),
        );
        tasks.spawn(
            "the credit expiry sweep",
            crate::billing::grant_expiry::run(background_db.clone(), shutdown.child_token()),
        );
        tasks.spawn(
            "the gauge refresher",
            crate::jobs::observe::refresh_gauges(
                background_db,
                self.app.metrics.clone(),
                shutdown.child_token(),
            ),
        );
        if let Some(listener) = self.listener {
            let address = listener.local_addr()?;
            let schema = graphql::build_schema(self.app.clone());
            let router = http::router(
                HttpState::new(
                    self.app.clone(),
                    schema,
                    self.live_connections,
                    self.browser_origins,
                ),
                metrics_elsewhere,
            );
            tracing::info!(address = %address, "listening on http://{address}/graphql");
            http::serve(listener, router, shutdown.clone()).await?;
        } else {
            shutdown.cancelled().await;
        }
        let stopped = tasks.join().await;
        relay_stop.cancel();
        if let Err(error) = relay.await {
            tracing::error!(error = %error, "the notification relay ended abnormally");
        }
        // Last: running attempts may have been talking to it until now.
        if let Some(simulator) = self.simulator {
            simulator.stop.cancel();
            simulator.task.await.map_err(std::io::Error::other)??;
        }
        stopped
    }
}

/// A process's tasks that stop on the shutdown signal, by name, so that they are
/// awaited in the order they were started and one that ended abnormally is named.
#[derive(Default)]
struct Tasks(Vec<(&'static str, JoinHandle<std::io::Result<()>>)>);

impl Tasks {
    fn spawn(&mut self, name: &'static str, task: impl Future<Output = ()> + Send + 'static) {
        self.spawn_fallible(name, async move {
            task.await;
            Ok(())
        });
    }

    fn spawn_fallible(
        &mut self,
        name: &'static str,
        task: impl Future<Output = std::io::Result<()>> + Send + 'static,
    ) {
        self.0.push((name, tokio::spawn(task)));
    }

    /// Awaits every task in order; the first error, once all have ended.
    async fn join(self) -> std::io::Result<()> {
        let mut first_error = None;
        for (name, task) in self.0 {
            let error = match task.await {
                Ok(Ok(())) => continue,
                Ok(Err(error)) => error,
                Err(error) => std::io::Error::other(error),
            };
            tracing::error!(task = name, error = %error, "a task ended abnormally");
            first_error.get_or_insert(error);
        }
        first_error.map_or(Ok(()), Err)
    }
}

impl BuiltInSimulator {
    async fn start() -> Result<(SocketAddr, Self), StartupError> {
        let listener = TcpListener::bind("127.0.0.1:0").await?;
        let address = listener.local_addr()?;
        let stop = CancellationToken::new();
        let task = tokio::spawn(Simulator::new().serve(listener, stop.clone().cancelled_owned()));
        tracing::info!(address = %address, "built-in LLM simulator started");
        Ok((address, Self { stop, task }))
    }
}

fn is_postgres(url: &str) -> bool {
    url.starts_with("postgres://") || url.starts_with("postgresql://")
}
