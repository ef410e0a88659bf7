//! Building and running the application: database, workers, providers and the API.

use crate::accounts::AdminToken;
use crate::billing::prices;
use crate::config::file::{ConfigError, ConfigFile, ProviderKind};
use crate::config::{ProviderEndpoint, Settings};
use crate::graphql;
use crate::http::{self, HttpState};
use crate::jobs::EventBus;
use crate::jobs::flow::FlowLimits;
use crate::jobs::relay::NotificationRelay;
use crate::jobs::worker::Worker;
use crate::llm::Provider;
use crate::llm::ProviderRegistry;
use crate::llm::anthropic::AnthropicClient;
use crate::llm::openai::OpenAiClient;
use crate::llm::routing::ModelFamily;
use crate::llm::simulator::Simulator;
use crate::metrics::Metrics;
use crate::webhooks::dispatch::Dispatcher;
use sea_orm::{DatabaseConnection, DbErr};
use std::net::SocketAddr;
use std::sync::Arc;
use tokio::net::TcpListener;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

/// What request handlers share: the database, the event bus, the admin token and
/// which models this deployment can serve.
#[derive(Clone, Debug)]
pub struct App {
    pub db: DatabaseConnection,
    pub bus: EventBus,
    pub admin_token: AdminToken,
    pub providers: ProviderRegistry,
    /// This process's metrics, served on `/metrics`.
    pub metrics: Metrics,
    /// The workers' own pool, when they have one, for the pool gauge.
    pub worker_db: Option<DatabaseConnection>,
    /// The background tasks' own pool, when they have one (`serve`), for the pool
    /// gauge.
    pub background_db: Option<DatabaseConnection>,
    /// Whether webhooks may reach loopback and private addresses.
    pub allow_private_webhooks: bool,
    /// The deadline of a job whose client names none, from when it may start: the
    /// flag's, else the config file's, else [`crate::jobs::input::DEFAULT_DEADLINE`].
    pub default_deadline: std::time::Duration,
}

/// Why the application could not start.
#[derive(Debug, thiserror::Error)]
pub enum StartupError {
    #[error("database: {0}")]
    Database(#[from] DbErr),
    #[error("network: {0}")]
    Io(#[from] std::io::Error),
    #[error("{0}")]
    Config(#[from] ConfigError),
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
        let db = crate::db::connect(&settings.database_url).await?;
        crate::db::migrate(&db).await?;
        prices::sync_prices(&db, &price_list).await?;

        let (admin_token, admin_token_generated) = match &settings.admin_token {
            Some(token) if !token.trim().is_empty() => (AdminToken::new(token.trim()), false),
            _ => (AdminToken::generate(), true),
        };
        let bus = EventBus::default();
        let relay = NotificationRelay::listen(&db).await?;
        // A process that calls real providers only has no simulator listening beside it.
        let (simulator_url, simulator) = match &settings.providers.simulator_url {
            Some(url) => (Some(url.clone()), None),
            None if simulator_needed(&settings, config.as_ref()) => {
                let (address, simulator) = BuiltInSimulator::start().await?;
                (Some(format!("http://{address}/v1")), Some(simulator))
            }
            None => (None, None),
        };
        let providers = provider_registry(&settings, config.as_ref(), simulator_url.as_deref());
        // Workers get a pool of their own when the API shares the process: no burst of
        // API requests can then delay a lease renewal or an attempt's settlement.
        let own_worker_db = match (&settings.worker, &settings.listen) {
            (Some(_), Some(_)) => Some(crate::db::connect(&settings.database_url).await?),
            _ => None,
        };
        let worker_db = own_worker_db.clone().unwrap_or_else(|| db.clone());
        // So do the background tasks (webhook dispatcher, sweeps, retention, gauges):
        // a burst of API requests must not make them fail, nor they slow the API.
        let own_background_db = match &settings.listen {
            Some(_) => Some(
                crate::db::connect_sized(&settings.database_url, crate::db::BACKGROUND_POOL_SIZE)
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
            default_deadline: settings
                .default_deadline
                .or(config.as_ref().and_then(|config| config.default_deadline))
                .unwrap_or(crate::jobs::input::DEFAULT_DEADLINE),
        };
        let worker = settings.worker.clone().map(|mut worker_settings| {
            if let Some(config) = &config {
                worker_settings.charging = config.charging;
                worker_settings.flow = flow_limits(config, &providers);
            }
            let id = format!(
                "{}-{}",
                std::process::id(),
                &uuid::Uuid::new_v4().simple().to_string()[..8]
            );
            Worker::new(
                id,
                worker_db,
                bus.clone(),
                providers.clone(),
                worker_settings,
                metrics.clone(),
            )
        });
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
        let worker = self
            .worker
            .map(|worker| tokio::spawn(worker.run(shutdown.child_token())));
        let background_db = self
            .app
            .background_db
            .clone()
            .unwrap_or_else(|| self.app.db.clone());
        let gauges = tokio::spawn(crate::jobs::observe::refresh_gauges(
            background_db.clone(),
            self.app.metrics.clone(),
            shutdown.child_token(),
        ));
        let retention = self.retention.map(|retention| {
            tokio::spawn(crate::jobs::retention::run(
                background_db.clone(),
                retention,
                shutdown.child_token(),
            ))
        });
        let metrics_elsewhere = self.metrics_listener.is_some();
        let operations = match self.metrics_listener {
            Some(listener) => {
                let address = listener.local_addr()?;
                tracing::info!(address = %address, "serving http://{address}/metrics, /healthz and /readyz");
                let router = http::operations_router(self.app.clone());
                Some(tokio::spawn(http::serve(
                    listener,
                    router,
                    shutdown.clone(),
                )))
            }
            None => None,
        };
        let dispatcher = tokio::spawn(
            Dispatcher::new(
                background_db.clone(),
                self.app.allow_private_webhooks,
                self.app.metrics.clone(),
            )
            .run(shutdown.child_token()),
        );
        let batch_cancels = tokio::spawn(crate::jobs::batches::cancel::run(
            background_db.clone(),
            self.app.bus.clone(),
            self.app.metrics.clone(),
            shutdown.child_token(),
        ));
        let expiry = tokio::spawn(crate::billing::grant_expiry::run(
            background_db,
            shutdown.child_token(),
        ));
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
        if let Some(worker) = worker
            && let Err(error) = worker.await
        {
            tracing::error!(error = %error, "the worker task ended abnormally");
        }
        if let Some(retention) = retention
            && let Err(error) = retention.await
        {
            tracing::error!(error = %error, "the retention sweep ended abnormally");
        }
        if let Some(operations) = operations {
            operations.await.map_err(std::io::Error::other)??;
        }
        if let Err(error) = dispatcher.await {
            tracing::error!(error = %error, "the webhook dispatcher ended abnormally");
        }
        if let Err(error) = batch_cancels.await {
            tracing::error!(error = %error, "the batch cancel sweep ended abnormally");
        }
        if let Err(error) = expiry.await {
            tracing::error!(error = %error, "the credit expiry sweep ended abnormally");
        }
        if let Err(error) = gauges.await {
            tracing::error!(error = %error, "the gauge refresher ended abnormally");
        }
        relay_stop.cancel();
        if let Err(error) = relay.await {
            tracing::error!(error = %error, "the notification relay ended abnormally");
        }
        if let Some(simulator) = self.simulator {
            simulator.stop.cancel();
            simulator.task.await.map_err(std::io::Error::other)??;
        }
        Ok(())
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

/// The config file's per-minute limits of providers and models; `routes` tells which
/// provider serves a model.
fn flow_limits(config: &ConfigFile, routes: &ProviderRegistry) -> FlowLimits {
    FlowLimits::new(
        config
            .models
            .iter()
            .map(|(model, entry)| (model.clone(), entry.rate_limit))
            .collect(),
        config
            .providers
            .iter()
            .map(|(name, provider)| (name.clone(), provider.rate_limit))
            .collect(),
        routes.clone(),
    )
}

/// Whether a real provider is configured (flags, environment or config file): then the
/// simulator serves only models the config file routes to it by name.
fn real_provider_configured(settings: &Settings, config: Option<&ConfigFile>) -> bool {
    settings.providers.openai.is_some()
        || settings.providers.anthropic.is_some()
        || config.is_some_and(|config| {
            config
                .providers
                .values()
                .any(|provider| provider.kind != ProviderKind::Simulator)
        })
}

/// Whether any model may be answered by the simulator: every model when no real
/// provider is configured, else those the config file routes to a simulator provider.
fn simulator_needed(settings: &Settings, config: Option<&ConfigFile>) -> bool {
    !real_provider_configured(settings, config)
        || config.is_some_and(|config| {
            config
                .providers
                .values()
                .any(|provider| provider.kind == ProviderKind::Simulator)
        })
}

/// Routes each model, first match wins: an exact name from the config file, then the
/// longest prefix pattern from the config file, then `gpt-*`/`o*` to the
/// OpenAI-compatible provider and `claude-*` to Anthropic when the environment
/// configures them. Everything else goes to the simulator (at `simulator_url`, which
/// `kind = "simulator"` providers of the file reach as well; started only when
/// [`simulator_needed`]) while no real provider is configured, and is served by
/// nobody once one is.
pub fn provider_registry(
    settings: &Settings,
    config: Option<&ConfigFile>,
    simulator_url: Option<&str>,
) -> ProviderRegistry {
    let timeouts = settings.providers.timeouts;
    let openai = |name: &str, base_url: &str, key: Option<String>| -> Arc<dyn Provider> {
        Arc::new(OpenAiClient::new(name, base_url, key).with_timeouts(timeouts))
    };
    let anthropic = |name: &str, base_url: &str, key: Option<String>| -> Arc<dyn Provider> {
        Arc::new(AnthropicClient::new(name, base_url, key).with_timeouts(timeouts))
    };
    let fallback = if real_provider_configured(settings, config) {
        tracing::info!(
            "a real provider is configured: models no route names are refused, not simulated"
        );
        None
    } else {
        // Loud: a production process that lost its provider settings would otherwise
        // answer every job with simulated text, and charge for it.
        tracing::warn!(
            "no provider is configured: the built-in simulator answers every model (set OPENAI_API_KEY or ANTHROPIC_API_KEY, or a config file, for real answers)"
        );
        simulator_url.map(|url| openai("simulator", url, None))
    };
    let mut registry = ProviderRegistry::new(fallback);
    if let Some(ProviderEndpoint { base_url, api_key }) = &settings.providers.openai {
        registry = registry.route(
            ModelFamily::OpenAi,
            openai("openai", base_url, api_key.clone()),
        );
    }
    if let Some(ProviderEndpoint { base_url, api_key }) = &settings.providers.anthropic {
        registry = registry.route(
            ModelFamily::Anthropic,
            anthropic("anthropic", base_url, api_key.clone()),
        );
    }
    let Some(config) = config else {
        return registry;
    };
    let named: std::collections::BTreeMap<&str, Arc<dyn Provider>> = config
        .providers
        .iter()
        .filter_map(|(name, provider)| {
            let key = provider.api_key().map(str::to_owned);
            // Checked when the file was read: every real provider has its base URL.
            let base_url = provider.base_url.as_deref().unwrap_or_default();
            let client = match provider.kind {
                ProviderKind::OpenAi => openai(name, base_url, key),
                ProviderKind::Anthropic => anthropic(name, base_url, key),
                ProviderKind::Simulator => openai(name, simulator_url?, None),
            };
            Some((name.as_str(), client))
        })
        .collect();
    for (pattern, provider) in &config.routes {
        // Validated when the file was read: every route names a defined provider.
        if let Some(client) = named.get(provider.as_str()) {
            tracing::info!(model = %pattern, provider = %provider, "model route from the config file");
            registry = registry.route_pattern(pattern, client.clone());
        }
    }
    for (model, entry) in &config.models {
        if entry.price.is_some() && registry.is_unrouted(model) {
            if registry.serves(model) {
                tracing::warn!(
                    model = %model,
                    "the config file prices this model but routes it to no provider: the built-in simulator serves it"
                );
            } else {
                tracing::warn!(
                    model = %model,
                    "the config file prices this model but routes it to no provider: createJob refuses it"
                );
            }
        }
    }
    registry
}
