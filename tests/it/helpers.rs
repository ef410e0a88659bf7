//! What every test uses: a fresh database per test on each backend, the application
//! started on a random port with the simulator beside it, and GraphQL clients.

use futures_util::{SinkExt, StreamExt};
use jobledger::billing::ChargingPolicy;
use jobledger::config::{OperationsSettings, ProviderSettings, Settings};
use jobledger::jobs::flow::FlowLimits;
use jobledger::jobs::worker::WorkerSettings;
use jobledger::llm::ProviderRegistry;
use jobledger::llm::openai::OpenAiClient;
use jobledger::llm::simulator::Simulator;
use jobledger::startup::{App, Application};
use rust_decimal::Decimal;
use serde_json::{Value, json};
use std::io::Write;
use std::net::SocketAddr;
use std::str::FromStr;
use std::sync::Once;
use std::time::{Duration, Instant};
use tokio_tungstenite::tungstenite::Message;
use tokio_tungstenite::tungstenite::client::IntoClientRequest;
use tokio_util::sync::CancellationToken;
use uuid::Uuid;

/// Runs an `async fn(Backend)` as two tests, `sqlite` and `postgres`; the PostgreSQL
/// one passes without running (and says so loudly) when `TEST_DATABASE_URL` is unset.
macro_rules! on_both_backends {
    ($($name:ident),* $(,)?) => {
        $(
            mod $name {
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn sqlite() {
                    super::$name(crate::helpers::Backend::Sqlite).await;
                }

                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn postgres() {
                    if let Some(backend) = crate::helpers::Backend::postgres() {
                        super::$name(backend).await;
                    }
                }
            }
        )*
    };
}

/// The database engine a test runs against.
#[derive(Clone, Debug)]
pub enum Backend {
    Sqlite,
    /// The URL of a server on which each test creates its own database.
    Postgres(String),
}

static POSTGRES_SKIPPED: Once = Once::new();

impl Backend {
    /// PostgreSQL from `TEST_DATABASE_URL`, or `None` after a loud warning.
    pub fn postgres() -> Option<Self> {
        match std::env::var("TEST_DATABASE_URL") {
            Ok(url) if !url.trim().is_empty() => Some(Self::Postgres(url)),
            _ => {
                POSTGRES_SKIPPED.call_once(|| {
                    // Written straight to stderr: the test harness captures print macros.
                    let _ = writeln!(
                        std::io::stderr(),
                        "\n*** WARNING: TEST_DATABASE_URL is not set: every PostgreSQL test is SKIPPED (passes without running). ***\n"
                    );
                });
                None
            }
        }
    }
}

/// A database that exists for one test only.
pub struct TestDatabase {
    pub url: String,
    _directory: Option<tempfile::TempDir>,
    /// The server and database name to drop at the end, on PostgreSQL.
    postgres: Option<(String, String)>,
}

impl Drop for TestDatabase {
    fn drop(&mut self) {
        let Some((server_url, name)) = self.postgres.take() else {
            return;
        };
        // Drop cannot await; a short-lived runtime on its own thread does the work.
        let dropped = std::thread::spawn(move || {
            let runtime = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()?;
            runtime
                .block_on(async {
                    use sea_orm::ConnectionTrait;
                    let admin = sea_orm::Database::connect(&server_url).await?;
                    admin
                        .execute_unprepared(&format!("DROP DATABASE IF EXISTS {name} WITH (FORCE)"))
                        .await?;
                    admin.close().await
                })
                .map_err(std::io::Error::other)
        })
        .join();
        if !matches!(dropped, Ok(Ok(()))) {
            let _ = writeln!(
                std::io::stderr(),
                "could not drop a test database: {dropped:?}"
            );
        }
    }
}

impl TestDatabase {
    /// A new, empty database: a file in a temporary folder, or a PostgreSQL database
    /// with a unique name.
    pub async fn create(backend: &Backend) -> Self {
        match backend {
            Backend::Sqlite => {
                let directory = tempfile::tempdir().expect("a temporary folder");
                let url = format!("sqlite:{}", directory.path().join("test.db").display());
                Self {
                    url,
                    _directory: Some(directory),
                    postgres: None,
                }
            }
            Backend::Postgres(server_url) => {
                let name = format!("jobledger_test_{}", Uuid::new_v4().simple());
                let admin = sea_orm::Database::connect(server_url)
                    .await
                    .expect("TEST_DATABASE_URL must reach a PostgreSQL server");
                use sea_orm::ConnectionTrait;
                admin
                    .execute_unprepared(&format!("CREATE DATABASE {name}"))
                    .await
                    .expect("creating a test database");
                admin.close().await.ok();
                Self {
                    url: replace_database_name(server_url, &name),
                    _directory: None,
                    postgres: Some((server_url.clone(), name)),
                }
            }
        }
    }
}

/// `postgres://user@host:port/old?params` with `name` as its database.
fn replace_database_name(url: &str, name: &str) -> String {
    let (base, query) = url
        .split_once('?')
        .map_or((url, None), |(b, q)| (b, Some(q)));
    let scheme_end = base.find("://").map_or(0, |index| index + 3);
    let path_start = base[scheme_end..]
        .find('/')
        .map_or(base.len(), |index| scheme_end + index);
    let mut result = format!("{}/{}", &base[..path_start], name);
    if let Some(query) = query {
        result.push('?');
        result.push_str(query);
    }
    result
}

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
}

impl Default for AppOptions {
    fn default() -> Self {
        Self {
            worker: Some(test_worker_settings()),
            config_file: None,
            operations: OperationsSettings::default(),
            allow_private_webhooks: true,
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
    let simulator = OpenAiClient::new("simulator", "http://127.0.0.1:9/v1", None);
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

/// A tenant and its API key.
#[derive(Clone, Debug)]
pub struct TestTenant {
    pub id: Uuid,
    pub key: String,
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
        let stop = CancellationToken::new();
        let simulator = Simulator::new();
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
        admin_token: Some(ADMIN_TOKEN.to_owned()),
        worker: options.worker,
        providers: ProviderSettings {
            simulator_url: Some(format!("http://{}/v1", simulator.address)),
            ..ProviderSettings::default()
        },
        customer_markup: Decimal::from_str("1.25").unwrap(),
        config_file: options.config_file,
        operations: options.operations,
        allow_private_webhooks: options.allow_private_webhooks,
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

    /// Sends one operation of the contract (`operations.graphql`) by name.
    pub async fn operation(&self, key: Option<&str>, name: &str, variables: Value) -> Value {
        self.graphql(key, &crate::contract::operation(name), variables)
            .await
    }

    /// Sends any GraphQL document over POST and returns the JSON body.
    pub async fn graphql(&self, key: Option<&str>, query: &str, variables: Value) -> Value {
        let mut request = self
            .http
            .post(format!("http://{}/graphql", self.address))
            .json(&json!({"query": query, "variables": variables}));
        if let Some(key) = key {
            request = request.bearer_auth(key);
        }
        request.send().await.unwrap().json().await.unwrap()
    }

    /// A tenant made through the contract's `CreateTenant`.
    pub async fn create_tenant(&self, name: &str) -> TestTenant {
        let response = self
            .operation(Some(ADMIN_TOKEN), "CreateTenant", json!({"name": name}))
            .await;
        let payload = &response["data"]["createTenant"];
        TestTenant {
            id: payload["tenant"]["id"].as_str().unwrap().parse().unwrap(),
            key: payload["apiKey"].as_str().expect("an API key").to_owned(),
        }
    }

    /// Grants credits through the contract's `GrantCredits`.
    pub async fn grant(&self, tenant: &TestTenant, amount: &str) -> Value {
        self.operation(
            Some(ADMIN_TOKEN),
            "GrantCredits",
            json!({"input": {
                "tenantId": tenant.id,
                "amount": amount,
                "idempotencyKey": Uuid::new_v4().to_string(),
            }}),
        )
        .await
    }

    /// A tenant with `amount` credits.
    pub async fn funded_tenant(&self, name: &str, amount: &str) -> TestTenant {
        let tenant = self.create_tenant(name).await;
        let granted = self.grant(&tenant, amount).await;
        assert!(granted["errors"].is_null(), "grant failed: {granted}");
        tenant
    }

    /// `CreateJob`, returning the whole response.
    pub async fn create_job(&self, tenant: &TestTenant, input: Value) -> Value {
        self.operation(Some(&tenant.key), "CreateJob", json!({"input": input}))
            .await
    }

    /// `CreateJob` that must succeed; returns the job's id.
    pub async fn create_job_ok(&self, tenant: &TestTenant, input: Value) -> Uuid {
        let response = self.create_job(tenant, input).await;
        assert!(response["errors"].is_null(), "createJob failed: {response}");
        response["data"]["createJob"]["job"]["id"]
            .as_str()
            .unwrap()
            .parse()
            .unwrap()
    }

    /// The contract's `Job` query, returning `data.job`.
    pub async fn job(&self, tenant: &TestTenant, id: Uuid) -> Value {
        let response = self
            .operation(Some(&tenant.key), "Job", json!({"id": id}))
            .await;
        assert!(response["errors"].is_null(), "job query failed: {response}");
        response["data"]["job"].clone()
    }

    /// Polls the job until its status is terminal (bounded by `limit`).
    pub async fn wait_until_finished(
        &self,
        tenant: &TestTenant,
        id: Uuid,
        limit: Duration,
    ) -> Value {
        let deadline = Instant::now() + limit;
        loop {
            let job = self.job(tenant, id).await;
            if ["SUCCEEDED", "FAILED", "CANCELLED"].contains(&job["status"].as_str().unwrap()) {
                return job;
            }
            assert!(Instant::now() < deadline, "job never finished: {job}");
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// `Account`, returning its balance.
    pub async fn balance(&self, tenant: &TestTenant) -> Value {
        let response = self
            .operation(Some(&tenant.key), "Account", json!({}))
            .await;
        assert!(response["errors"].is_null(), "account failed: {response}");
        response["data"]["account"]["balance"].clone()
    }

    /// Subscribes over `graphql-transport-ws` and collects every `next` payload until
    /// the server completes the subscription (bounded by `limit`).
    pub async fn subscribe(
        &self,
        key: &str,
        query: &str,
        variables: Value,
        limit: Duration,
    ) -> Result<Vec<Value>, Value> {
        let mut request = format!("ws://{}/graphql/ws", self.address)
            .into_client_request()
            .unwrap();
        request.headers_mut().insert(
            "sec-websocket-protocol",
            "graphql-transport-ws".parse().unwrap(),
        );
        let (mut socket, _) = tokio_tungstenite::connect_async(request).await.unwrap();
        let send = |value: Value| Message::Text(value.to_string().into());
        socket
            .send(send(json!({"type": "connection_init", "payload": {"authorization": format!("Bearer {key}")}})))
            .await
            .unwrap();
        socket
            .send(send(json!({"id": "1", "type": "subscribe", "payload": {"query": query, "variables": variables}})))
            .await
            .unwrap();
        let mut payloads = Vec::new();
        let collect = async {
            while let Some(message) = socket.next().await {
                let Message::Text(text) = message.unwrap() else {
                    continue;
                };
                let message: Value = serde_json::from_str(&text).unwrap();
                match message["type"].as_str().unwrap() {
                    "connection_ack" | "ping" | "pong" => {}
                    "next" => payloads.push(message["payload"].clone()),
                    "complete" => return Ok(()),
                    "error" => return Err(message["payload"].clone()),
                    other => panic!("unexpected message {other}: {message}"),
                }
            }
            panic!("the server closed the socket before completing");
        };
        tokio::time::timeout(limit, collect)
            .await
            .expect("the subscription did not complete in time")?;
        Ok(payloads)
    }
}

/// The kinds of a job's stored events, in order (from the contract's `Job` query).
pub fn event_kinds(job: &Value) -> Vec<String> {
    job["events"]
        .as_array()
        .unwrap_or_else(|| panic!("no events in {job}"))
        .iter()
        .map(|event| event["kind"].as_str().unwrap().to_owned())
        .collect()
}

/// A small valid job input.
pub fn job_input(idempotency_key: &str, content: &str) -> Value {
    json!({
        "idempotencyKey": idempotency_key,
        "model": "gpt-4o-mini",
        "messages": [{"role": "user", "content": content}],
        "maxOutputTokens": 100,
    })
}

/// A decimal from a GraphQL `Decimal` string.
pub fn decimal(value: &Value) -> Decimal {
    Decimal::from_str(
        value
            .as_str()
            .unwrap_or_else(|| panic!("not a decimal: {value}")),
    )
    .unwrap()
}

/// The `extensions.code` of the first error.
pub fn error_code(response: &Value) -> &str {
    response["errors"][0]["extensions"]["code"]
        .as_str()
        .unwrap_or_else(|| panic!("no error code in {response}"))
}
