//! The application under test: started on a random port on its own database, with the
//! simulator beside it; restarted, or joined by another process, as a deployment would.

use super::backends::{Backend, TestDatabase};
use jobledger::app::App;
use jobledger::billing::ChargingPolicy;
use jobledger::config::{OperationsSettings, ProviderEndpoint, ProviderSettings, Settings};
use jobledger::jobs::flow::FlowLimits;
use jobledger::jobs::worker::WorkerSettings;
use jobledger::llm::ProviderRegistry;
use jobledger::llm::openai::OpenAiClient;
use jobledger::llm::simulator::Simulator;
use jobledger::startup::Application;
use rust_decimal::Decimal;
use std::net::SocketAddr;
use std::str::FromStr;
use std::time::{Duration, Instant};
use tokio_util::sync::CancellationToken;

/// How a test wants its application.
#[derive(Clone)]
pub struct AppOptions {
    /// `None`: no workers; the test claims jobs itself.
    pub worker: Option<WorkerSettings>,
    /// A config file (`--config`); providers of `kind = "simulator"` in it reach the
    /// test's simulator.
    pub config_file: Option<std::path::PathBuf>,
    /// The metrics listener and retention.
    pub operations: OperationsSettings,
    /// `--allow-private-webhooks`: on, so that webhooks reach the tests' own servers.
    pub allow_private_webhooks: bool,
    /// `--cors-origin`: none.
    pub cors_origins: Vec<String>,
    /// `claude-*` models reach the simulator through the Anthropic client, in
    /// Anthropic's shape. Off: every model reaches it in OpenAI's shape. On, Anthropic
    /// is a configured provider, so models of no provider are not served.
    pub anthropic_shape: bool,
    /// `gpt-*`/`o*` models (and models imported as OpenAI's) reach the simulator
    /// through a configured OpenAI-compatible provider (`OPENAI_BASE_URL`). On, a real
    /// provider is configured, so models of no provider are not served.
    pub openai_endpoint: bool,
}

impl Default for AppOptions {
    fn default() -> Self {
        Self {
            worker: Some(test_worker_settings()),
            config_file: None,
            operations: OperationsSettings::default(),
            allow_private_webhooks: true,
            cors_origins: Vec::new(),
            anthropic_shape: false,
            openai_endpoint: false,
        }
    }
}

impl AppOptions {
    /// No workers: the test claims, runs or leaves jobs itself.
    pub fn no_workers() -> Self {
        Self {
            worker: None,
            ..Self::default()
        }
    }

    /// Workers with these settings.
    pub fn workers(settings: WorkerSettings) -> Self {
        Self {
            worker: Some(settings),
            ..Self::default()
        }
    }
}

/// Short leases and polls, so tests finish in seconds.
pub fn test_worker_settings() -> WorkerSettings {
    WorkerSettings {
        concurrency: 4,
        lease: Duration::from_secs(5),
        attempt_timeout: Duration::from_secs(10),
        shutdown_grace: Duration::from_secs(5),
        tenant_concurrency: None,
        poll_interval: Duration::from_millis(100),
        charging: ChargingPolicy::default(),
        flow: FlowLimits::default(),
    }
}

/// Routing with no provider configured: the simulator serves every model. For tests
/// that call the job services directly; nothing is ever sent to it.
pub fn simulated_models() -> ProviderRegistry {
    let simulator = OpenAiClient::new("simulator", "http://127.0.0.1:9/v1", None).simulator();
    ProviderRegistry::new(Some(std::sync::Arc::new(simulator)))
}

/// The admin token every test app uses.
pub const ADMIN_TOKEN: &str = "test-admin-token-at-least-32-characters";

/// A running application with its own database and simulator.
pub struct TestApp {
    pub address: SocketAddr,
    pub app: App,
    pub simulator: Simulator,
    simulator_address: SocketAddr,
    pub http: reqwest::Client,
    shutdown: CancellationToken,
    /// The simulator outlives the app's shutdown, as a real provider would.
    simulator_stop: CancellationToken,
    task: Option<tokio::task::JoinHandle<std::io::Result<()>>>,
    database: Option<TestDatabase>,
}

impl Drop for TestApp {
    fn drop(&mut self) {
        self.shutdown.cancel();
        self.simulator_stop.cancel();
    }
}

/// Starts the application on a random port with workers.
pub async fn spawn_app(backend: Backend) -> TestApp {
    spawn_app_with(backend, AppOptions::default()).await
}

/// Starts the application on a random port as `options` say.
pub async fn spawn_app_with(backend: Backend, options: AppOptions) -> TestApp {
    let database = TestDatabase::create(&backend).await;
    spawn_app_on(database, RunningSimulator::start().await, options).await
}

/// Starts the application with options made from its simulator's address, for a
/// config file whose real providers are the simulator (the OpenAI-compatible one at
/// `http://ADDRESS/v1`, the Anthropic one at `http://ADDRESS`).
pub async fn spawn_app_with_simulator(
    backend: Backend,
    options: impl FnOnce(SocketAddr) -> AppOptions,
) -> TestApp {
    let database = TestDatabase::create(&backend).await;
    let simulator = RunningSimulator::start().await;
    let options = options(simulator.address);
    spawn_app_on(database, simulator, options).await
}

/// Starts the application on a random port beside `simulator`, which a test started
/// first (to write its address into a config file, say).
pub async fn spawn_app_beside(
    backend: Backend,
    simulator: RunningSimulator,
    options: AppOptions,
) -> TestApp {
    let database = TestDatabase::create(&backend).await;
    spawn_app_on(database, simulator, options).await
}

/// Polls `/healthz` of a `jobledger serve` child listening on `address` until it
/// answers (bounded: 30 s).
pub async fn wait_until_serving(address: SocketAddr) {
    let client = reqwest::Client::new();
    let deadline = Instant::now() + Duration::from_secs(30);
    while !client
        .get(format!("http://{address}/healthz"))
        .send()
        .await
        .is_ok_and(|response| response.status().is_success())
    {
        assert!(Instant::now() < deadline, "serve did not start");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// A simulator serving on a random port until `stop` is cancelled.
pub struct RunningSimulator {
    pub simulator: Simulator,
    pub address: SocketAddr,
    pub stop: CancellationToken,
}

impl RunningSimulator {
    /// A new simulator on 127.0.0.1 and a free port.
    pub async fn start() -> Self {
        Self::start_with(Simulator::new()).await
    }

    /// `simulator` on 127.0.0.1 and a free port (one with its own batch delay, say).
    pub async fn start_with(simulator: Simulator) -> Self {
        let stop = CancellationToken::new();
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let address = listener.local_addr().unwrap();
        tokio::spawn(
            simulator
                .clone()
                .serve(listener, stop.clone().cancelled_owned()),
        );
        Self {
            simulator,
            address,
            stop,
        }
    }
}

async fn spawn_app_on(
    database: TestDatabase,
    simulator: RunningSimulator,
    options: AppOptions,
) -> TestApp {
    let url = database.url.clone();
    spawn_app_at(&url, Some(database), simulator, options).await
}

/// Starts an app on the database at `url`; it drops the database at the end only if
/// it owns it.
async fn spawn_app_at(
    url: &str,
    database: Option<TestDatabase>,
    simulator: RunningSimulator,
    options: AppOptions,
) -> TestApp {
    let shutdown = CancellationToken::new();
    let settings = Settings {
        listen: Some("127.0.0.1:0".parse().unwrap()),
        database_url: url.to_owned(),
        listen_database_url: None,
        admin_token: Some(ADMIN_TOKEN.to_owned()),
        worker: options.worker,
        providers: ProviderSettings {
            simulator_url: Some(format!("http://{}/v1", simulator.address)),
            anthropic: options.anthropic_shape.then(|| ProviderEndpoint {
                base_url: format!("http://{}", simulator.address),
                api_key: Some("sk-ant-test".to_owned()),
            }),
            openai: options.openai_endpoint.then(|| ProviderEndpoint {
                base_url: format!("http://{}/v1", simulator.address),
                api_key: Some("sk-test".to_owned()),
            }),
            ..ProviderSettings::default()
        },
        customer_markup: Decimal::from_str("1.25").unwrap(),
        config_file: options.config_file,
        operations: options.operations,
        allow_private_webhooks: options.allow_private_webhooks,
        cors_origins: options.cors_origins,
        default_deadline: None,
    };
    let application = Application::build(settings).await.expect("the app builds");
    let address = application.address().unwrap();
    let app = application.app().clone();
    let task = tokio::spawn(application.run(shutdown.clone()));
    TestApp {
        address,
        app,
        simulator: simulator.simulator,
        simulator_address: simulator.address,
        http: reqwest::Client::new(),
        shutdown,
        simulator_stop: simulator.stop,
        task: Some(task),
        database,
    }
}

impl TestApp {
    /// The address of `/graphql`.
    pub fn url(&self) -> String {
        format!("http://{}/graphql", self.address)
    }

    /// Shuts the application down as SIGTERM would, waits until it has stopped, and
    /// starts a new one on the same database and simulator, as a redeploy would.
    pub async fn restart(self, options: AppOptions) -> TestApp {
        self.restart_after(options, std::future::ready(())).await
    }

    /// [`Self::restart`] with no process running until `down` completes: whatever
    /// was due meanwhile waits for the new process.
    pub async fn restart_after(
        mut self,
        options: AppOptions,
        down: impl std::future::Future<Output = ()>,
    ) -> TestApp {
        self.shutdown.cancel();
        let task = self.task.take().expect("the app runs");
        tokio::time::timeout(Duration::from_secs(30), task)
            .await
            .expect("the app stops within 30 s")
            .expect("the app task does not panic")
            .expect("the app stops cleanly");
        down.await;
        let simulator = RunningSimulator {
            simulator: self.simulator.clone(),
            address: self.simulator_address,
            // The new app owns the simulator now: this one must not stop it when dropped.
            stop: std::mem::take(&mut self.simulator_stop),
        };
        let database = self.database.take().expect("the app owns its database");
        spawn_app_on(database, simulator, options).await
    }

    /// A second application on the same database and simulator, as another process
    /// of a deployment would be. It neither drops the database nor stops the simulator.
    pub async fn another_process(&self, options: AppOptions) -> TestApp {
        let url = &self
            .database
            .as_ref()
            .expect("the app owns its database")
            .url;
        let simulator = RunningSimulator {
            simulator: self.simulator.clone(),
            address: self.simulator_address,
            stop: CancellationToken::new(),
        };
        spawn_app_at(url, None, simulator, options).await
    }

    /// How many calls the app's simulator billed (as a real provider would).
    pub fn billed_calls(&self) -> usize {
        self.simulator
            .calls()
            .iter()
            .filter(|call| call.billed)
            .count()
    }

    /// The base URL of the app's simulator (`http://…/v1`), for processes a test
    /// starts itself.
    pub fn simulator_url(&self) -> String {
        format!("http://{}/v1", self.simulator_address)
    }

    /// The URL of the app's database, for connections of a test's own.
    pub fn database_url(&self) -> String {
        self.database
            .as_ref()
            .expect("the app owns its database")
            .url
            .clone()
    }
}
