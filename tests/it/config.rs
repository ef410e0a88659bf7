//! The config file (`--config FILE`): parsing and validation errors that name the key,
//! exact prices, routing composed with the environment, and — through the real start
//! path — a custom model served by a configured provider at its configured price,
//! with price changes stored as new versions that never rewrite past attempts.

use crate::helpers::{AppOptions, Backend, TestApp, decimal, error_code, spawn_app_with};
use entity::{attempts, model_prices};
use jobledger::billing::prices::{ConfiguredPrice, PricePerMillion, Rates};
use jobledger::billing::{ChargingPolicy, Credits, UnfinishedCall};
use jobledger::config::file::{ConfigError, ConfigFile, CustomerPolicy, ProviderKind};
use jobledger::config::{ProviderEndpoint, ProviderSettings, Settings};
use jobledger::llm::TokenUsage;
use jobledger::llm::routing::ModelPattern;
use jobledger::llm::simulator::Simulator;
use jobledger::startup::{Application, StartupError, provider_registry};
use rust_decimal::Decimal;
use sea_orm::{ColumnTrait, EntityTrait, QueryFilter, QueryOrder};
use serde_json::json;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::str::FromStr;
use std::time::Duration;
use tokio_util::sync::CancellationToken;
use uuid::Uuid;

on_both_backends!(
    a_configured_model_runs_on_its_provider_at_its_price,
    a_model_without_a_price_is_refused_with_validation,
    an_unrouted_model_is_refused_once_a_provider_is_configured,
    a_worker_that_serves_no_provider_for_the_model_fails_the_job_unsent,
    a_worker_without_providers_does_not_simulate_a_job_routed_to_a_real_one,
    a_changed_price_is_a_new_version_and_the_past_keeps_its_cost,
);

const PATH: &str = "/etc/jobledger/test.toml";

fn parse(text: &str) -> Result<ConfigFile, ConfigError> {
    ConfigFile::parse(text, Path::new(PATH), |name| {
        (name == "PRESENT_KEY").then(|| "sk-present".to_owned())
    })
}

/// The error `text` makes, as an operator would read it; it must name the file.
fn error(text: &str) -> String {
    let message = parse(text)
        .expect_err("the config must be refused")
        .to_string();
    assert!(message.contains(PATH), "the file is not named: {message}");
    message
}

/// Asserts that `text` is refused with an error naming `key` and saying `problem`.
fn assert_refused(text: &str, key: &str, problem: &str) {
    let message = error(text);
    assert!(
        message.contains(&format!("`{key}`")),
        "the key {key} is not named: {message}"
    );
    assert!(
        message.contains(problem),
        "{problem:?} is not said: {message}"
    );
}

fn per_million(text: &str) -> PricePerMillion {
    PricePerMillion(Credits::from_decimal(Decimal::from_str(text).unwrap()).unwrap())
}

fn rates(input: &str, cached_input: &str, output: &str) -> Rates {
    Rates {
        input: per_million(input),
        cached_input: per_million(cached_input),
        output: per_million(output),
    }
}

fn price_of<'a>(prices: &'a [ConfiguredPrice], model: &str) -> &'a ConfiguredPrice {
    prices
        .iter()
        .find(|price| price.model == model)
        .unwrap_or_else(|| panic!("no price for {model}"))
}

fn example_path() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("jobledger.example.toml")
}

#[test]
fn the_example_config_parses() {
    let text = std::fs::read_to_string(example_path()).unwrap();
    // Its keys come from the environment; any value will do here.
    let config = ConfigFile::parse(&text, &example_path(), |_| Some("sk-test".to_owned()))
        .unwrap_or_else(|error| panic!("{error}"));

    assert_eq!(
        config.customer_markup,
        Some(Decimal::from_str("1.3").unwrap())
    );
    let kinds: Vec<_> = config
        .providers
        .iter()
        .map(|(name, provider)| (name.as_str(), provider.kind))
        .collect();
    assert_eq!(
        kinds,
        [
            ("claude", ProviderKind::Anthropic),
            ("ollama", ProviderKind::OpenAi),
            ("openrouter", ProviderKind::OpenAi),
            ("sim", ProviderKind::Simulator),
        ]
    );
    assert_eq!(config.providers["openrouter"].api_key(), Some("sk-test"));
    assert_eq!(config.providers["ollama"].api_key(), None);
    assert!(
        config.routes.contains(&(
            ModelPattern::Exact("llama3-local".to_owned()),
            "ollama".to_owned()
        )),
        "{:?}",
        config.routes
    );
    assert!(config.routes.contains(&(
        ModelPattern::Prefix("gpt-".to_owned()),
        "openrouter".to_owned()
    )));

    let prices = config.prices(Decimal::from_str("1.25").unwrap()).unwrap();
    // A custom model at its own markup; cached input defaults to input.
    let llama = price_of(&prices, "llama3-local");
    assert_eq!(llama.provider, rates("0.02", "0.02", "0.04"));
    assert_eq!(llama.customer, rates("0.06", "0.06", "0.12"));
    assert_eq!(llama.source, "our GPU hours per token, measured 2026-11");
    // A built-in model keeps its provider price and sells at the explicit rates.
    let mini = price_of(&prices, "gpt-4o-mini");
    assert_eq!(mini.provider, rates("0.15", "0.075", "0.60"));
    assert_eq!(mini.customer, rates("0.20", "0.10", "0.80"));
    // Other built-in models follow the file's global markup (1.3), not the default.
    let sonnet = price_of(&prices, "claude-sonnet-4-5");
    assert_eq!(sonnet.customer, rates("3.9", "0.39", "19.5"));
}

#[test]
fn the_example_config_needs_the_keys_it_names() {
    let text = std::fs::read_to_string(example_path()).unwrap();
    let message = ConfigFile::parse(&text, &example_path(), |_| None)
        .unwrap_err()
        .to_string();
    assert!(
        message.contains("`providers.claude.api_key_env`")
            && message.contains("ANTHROPIC_API_KEY")
            && message.contains("jobledger.example.toml"),
        "{message}"
    );
}

#[test]
fn no_file_content_means_the_built_in_prices() {
    let config = parse("").unwrap();
    assert!(config.providers.is_empty() && config.routes.is_empty());
    let markup = Decimal::from_str("1.25").unwrap();
    assert_eq!(
        config.prices(markup).unwrap(),
        jobledger::billing::prices::built_in_prices(markup)
    );
}

#[test]
fn each_invalid_config_is_refused_naming_its_key() {
    let provider = "[providers.local]\nkind = \"openai\"\nbase_url = \"http://127.0.0.1:1/v1\"\n";
    let with_provider = |rest: &str| format!("{provider}{rest}");

    // A model naming a provider that does not exist; a route likewise.
    assert_refused(
        &with_provider("[models.llama3-local]\nprovider = \"lokal\"\n"),
        "models.llama3-local.provider",
        "unknown provider \"lokal\" (defined in [providers]: \"local\")",
    );
    assert_refused(
        "[routes]\n\"gpt-*\" = \"openrouter\"\n",
        "routes.\"gpt-*\"",
        "unknown provider \"openrouter\"",
    );
    // A key variable that is not set (or empty).
    assert_refused(
        &with_provider("api_key_env = \"JOBLEDGER_TEST_SURELY_UNSET\"\n"),
        "providers.local.api_key_env",
        "JOBLEDGER_TEST_SURELY_UNSET is not set",
    );
    // An unknown kind.
    assert_refused(
        "[providers.local]\nkind = \"openia\"\nbase_url = \"http://x/v1\"\n",
        "providers.local.kind",
        "unknown kind \"openia\"",
    );
    // Prices: too precise, negative, a float, not a number.
    let model = |price: &str| {
        with_provider(&format!(
            "[models.m]\nprovider = \"local\"\nprice = {{ {price} }}\n"
        ))
    };
    assert_refused(
        &model("input = \"0.0000000001\", output = \"1\""),
        "models.m.price.input",
        "more than 9 decimals",
    );
    assert_refused(
        &model("input = \"1\", output = \"-0.5\""),
        "models.m.price.output",
        "-0.5 is negative",
    );
    assert_refused(
        &model("input = \"1\", cached_input = 0.1, output = \"1\""),
        "models.m.price.cached_input",
        "write it as a string",
    );
    assert_refused(
        &model("input = \"one\", output = \"1\""),
        "models.m.price.input",
        "\"one\" is not a decimal",
    );
    assert_refused(
        &with_provider(
            "[models.m]\nprice = { input = \"1\", output = \"1\" }\ncustomer_price = { input = \"1\", output = \"0.0000000005\" }\n",
        ),
        "models.m.customer_price.output",
        "more than 9 decimals",
    );
    // Markups above zero only.
    assert_refused(
        "customer_markup = \"0\"",
        "customer_markup",
        "not above zero",
    );
    assert_refused(
        &model("input = \"1\", output = \"1\"").replace(
            "provider = \"local\"\n",
            "provider = \"local\"\ncustomer_markup = \"-2\"\n",
        ),
        "models.m.customer_markup",
        "not above zero",
    );
    // A policy needs a price; one policy at a time.
    assert_refused(
        "[models.unknown-model]\ncustomer_markup = \"2\"\n",
        "models.unknown-model",
        "needs a provider price",
    );
    assert_refused(
        "[models.gpt-4o]\ncustomer_markup = \"2\"\ncustomer_price = { input = \"1\", output = \"1\" }\n",
        "models.gpt-4o",
        "not both",
    );
    // Prices are per exact name; `*` only ends a pattern.
    assert_refused(
        "[models.\"gpt-*\"]\nprice = { input = \"1\", output = \"1\" }\n",
        "models.\"gpt-*\"",
        "one exact model name",
    );
    assert_refused(
        &with_provider("[routes]\n\"g*t\" = \"local\"\n"),
        "routes.\"g*t\"",
        "`*` may only end a pattern",
    );
    // A model routed two ways.
    assert_refused(
        &with_provider(
            "[providers.other]\nkind = \"simulator\"\n[routes]\nllama = \"other\"\n[models.llama]\nprovider = \"local\"\n",
        ),
        "models.llama.provider",
        "but `routes.llama` says \"other\"",
    );
    // Providers: a missing or bad base URL, a simulator with one.
    assert_refused(
        "[providers.local]\nkind = \"openai\"\n",
        "providers.local.base_url",
        "is missing",
    );
    assert_refused(
        "[providers.local]\nkind = \"anthropic\"\nbase_url = \"api.anthropic.com\"\n",
        "providers.local.base_url",
        "not an http:// or https:// URL",
    );
    assert_refused(
        "[providers.sim]\nkind = \"simulator\"\nbase_url = \"http://x/v1\"\n",
        "providers.sim.base_url",
        "the simulator is built in",
    );
}

#[test]
fn a_key_written_into_the_file_is_refused_without_being_repeated() {
    for text in [
        "[providers.p]\nkind = \"openai\"\nbase_url = \"http://x/v1\"\napi_key = \"sk-secret-123\"\n",
        "[providers.p]\nkind = \"openai\"\nbase_url = \"http://x/v1\"\napi_key_env = \"sk-secret-123\"\n",
    ] {
        let message = error(text);
        assert!(message.contains("`providers.p.api_key"), "{message}");
        assert!(
            !message.contains("sk-secret-123"),
            "the key leaked: {message}"
        );
    }
}

#[test]
fn the_charging_policy_is_read_from_the_file() {
    assert_eq!(parse("").unwrap().charging, ChargingPolicy::default());
    let both = parse(
        "[charging]\nunknown_outcome = \"call_bound\"\ncancelled_during_call = \"delivered_output\"\n",
    )
    .unwrap();
    assert_eq!(
        both.charging,
        ChargingPolicy {
            unknown_outcome: UnfinishedCall::CallBound,
            cancelled_during_call: UnfinishedCall::DeliveredOutput,
        }
    );
    assert_refused(
        "[charging]\ncancelled_during_call = \"everything\"\n",
        "charging.cancelled_during_call",
        "expected \"delivered_output\" or \"call_bound\"",
    );
}

#[test]
fn typos_and_wrong_types_are_errors_naming_the_key() {
    for (text, named) in [
        ("custmer_markup = \"1.5\"\n", "custmer_markup"),
        (
            "[providers.local]\nkind = \"openai\"\nbase_ur = \"http://x/v1\"\n",
            "base_ur",
        ),
        (
            "[models.m]\nprice = { input = \"1\", outptu = \"1\" }\n",
            "outptu",
        ),
        ("[models.m]\nprice = { input = \"1\" }\n", "output"),
        ("[models.m]\nsorce = \"x\"\n", "sorce"),
        ("[routes]\nllama = 3\n", "llama"),
        (
            "[charging]\nunknown_outcomes = \"call_bound\"\n",
            "unknown_outcomes",
        ),
        ("[providers.local]\nkind = \"openai\"\n[[broken\n", "line 3"),
    ] {
        let message = error(text);
        assert!(message.contains(named), "{named} not named: {message}");
    }
    let missing = Path::new("/nonexistent/jobledger.toml");
    let message = ConfigFile::load(missing).unwrap_err().to_string();
    assert!(
        message.contains("/nonexistent/jobledger.toml") && message.contains("cannot read"),
        "{message}"
    );
}

#[test]
fn prices_are_exact_to_nine_decimals() {
    let config = parse(
        r#"
        customer_markup = "1.000000001"

        [models.exact]
        price = { input = "0.123456789", cached_input = "0.000000001", output = "123456.987654321" }
        customer_markup = "3"

        [models.explicit]
        price = { input = 2, output = "4.5" }
        customer_price = { input = "2.000000001", cached_input = "0.1", output = "9" }
        source = "a test"

        [models.global]
        price = { input = "0.3", output = "0.000000007" }
        "#,
    )
    .unwrap();
    let prices = config.prices(Decimal::from_str("1.25").unwrap()).unwrap();
    let nanos =
        |rates: &Rates| [rates.input, rates.cached_input, rates.output].map(|rate| rate.0.nanos());

    let exact = price_of(&prices, "exact");
    assert_eq!(
        nanos(&exact.provider),
        [123_456_789, 1, 123_456_987_654_321]
    );
    assert_eq!(
        nanos(&exact.customer),
        [370_370_367, 3, 370_370_962_962_963]
    );
    assert_eq!(exact.source, format!("config file {PATH}"));

    let explicit = price_of(&prices, "explicit");
    assert_eq!(
        nanos(&explicit.provider),
        [2_000_000_000, 2_000_000_000, 4_500_000_000]
    );
    assert_eq!(
        nanos(&explicit.customer),
        [2_000_000_001, 100_000_000, 9_000_000_000]
    );
    assert_eq!(explicit.source, "a test");

    // The file's global markup, rounded up to the nano-credit: 0.3 × 1.000000001 =
    // 0.3000000003 → 0.300000001; 0.000000007 × 1.000000001 → 0.000000008.
    let global = price_of(&prices, "global");
    assert_eq!(nanos(&global.customer), [300_000_001, 300_000_001, 8]);
    assert_eq!(
        config.models["global"].customer,
        CustomerPolicy::GlobalMarkup
    );

    // The cost of a call at such a price, to the nano-credit.
    let usage = TokenUsage {
        input_tokens: 1_000_001,
        cached_input_tokens: 1,
        output_tokens: 3,
    };
    // 1,000,000 × 0.123456789/M + 1 × 0.000000001/M (rounds up to a nano) + 3 ×
    // 123456.987654321/M = 0.123456789 + 0.000000001 + 0.370370963 (rounded up).
    assert_eq!(exact.provider.cost(&usage).to_string(), "0.493827753");
}

#[test]
fn the_file_routes_what_it_names_and_the_environment_the_rest() {
    let config = parse(
        r#"
        [providers.local]
        kind = "openai"
        base_url = "http://127.0.0.1:11434/v1"

        [providers.router]
        kind = "openai"
        base_url = "https://openrouter.ai/api/v1"
        api_key_env = "PRESENT_KEY"

        [providers.sim]
        kind = "simulator"

        [routes]
        "gpt-4o*" = "router"
        "test-*" = "sim"

        [models.llama3-local]
        provider = "local"
        price = { input = "0.1", output = "0.2" }
        "#,
    )
    .unwrap();
    let endpoint = |url: &str| ProviderEndpoint {
        base_url: url.to_owned(),
        api_key: Some("env-key".to_owned()),
    };
    let mut settings = settings_without_database();
    settings.providers.openai = Some(endpoint("https://api.openai.com/v1"));
    settings.providers.anthropic = Some(endpoint("https://api.anthropic.com"));

    let registry = provider_registry(&settings, Some(&config), "http://127.0.0.1:9/v1");
    let served_by = |model| {
        registry
            .provider_for(model)
            .map(|provider| provider.name().to_owned())
    };
    let served = |name: &str| Some(name.to_owned());
    assert_eq!(served_by("llama3-local"), served("local"));
    assert_eq!(served_by("gpt-4o-mini"), served("router"));
    assert_eq!(served_by("test-echo"), served("sim"));
    // Not named by the file: the environment's providers; with real providers
    // configured, nothing else (the simulator serves only what the file routes to it).
    assert_eq!(served_by("gpt-4.1-mini"), served("openai"));
    assert_eq!(served_by("o3-mini"), served("openai"));
    assert_eq!(served_by("claude-sonnet-4-5"), served("anthropic"));
    assert_eq!(served_by("mistral"), None);

    // Without a file, exactly the environment's routing.
    let registry = provider_registry(&settings, None, "http://127.0.0.1:9/v1");
    let served_by = |model| {
        registry
            .provider_for(model)
            .map(|provider| provider.name().to_owned())
    };
    assert_eq!(served_by("gpt-4o-mini"), served("openai"));
    assert_eq!(served_by("claude-sonnet-4-5"), served("anthropic"));
    assert_eq!(served_by("llama3-local"), None);

    // With no real provider at all, the simulator serves every model.
    let registry = provider_registry(&settings_without_database(), None, "http://127.0.0.1:9/v1");
    assert_eq!(
        registry
            .provider_for("llama3-local")
            .map(|provider| provider.name().to_owned()),
        served("simulator")
    );
}

/// The API process runs with no provider (the simulator serves every model), the
/// worker process with a real one: a job the API accepted for a model the worker
/// cannot route ends without any call.
async fn a_worker_that_serves_no_provider_for_the_model_fails_the_job_unsent(backend: Backend) {
    let local = LocalServer::start().await;
    let config = TestConfig::new(&local);
    let api = spawn_app_with(backend, AppOptions::no_workers()).await;
    let worker = api.another_process(config.with_input_price("0.5")).await;
    let tenant = api.funded_tenant("acme", "5").await;
    let id = api
        .create_job_ok(&tenant, crate::helpers::job_input("unrouted", "hello"))
        .await;
    let job = api
        .wait_until_finished(&tenant, id, Duration::from_secs(15))
        .await;
    assert_eq!(job["status"], "FAILED", "{job}");
    assert_eq!(job["error"]["code"], "MODEL_NOT_SERVED", "{job}");
    let attempt = &job["attempts"][0];
    assert_eq!(attempt["outcome"], "PERMANENT_ERROR", "{attempt}");
    assert_eq!(attempts_of(&api, id).await[0].provider, "unrouted");
    assert_eq!(decimal(&attempt["providerCost"]), Decimal::ZERO);
    assert_eq!(job["reservation"]["status"], "RELEASED");
    assert!(api.simulator.calls().is_empty() && local.simulator.calls().is_empty());
    crate::invariants::assert_billing_invariants(&api.app.db).await;
    drop(worker);
}

/// The API routes the model to a real provider; a worker process started without any
/// provider would fall back to the simulator: it must not simulate this job (a real
/// price for a simulated reply), nor call anything.
async fn a_worker_without_providers_does_not_simulate_a_job_routed_to_a_real_one(backend: Backend) {
    let local = LocalServer::start().await;
    let config = TestConfig::new(&local);
    let api = spawn_app_with(
        backend,
        AppOptions {
            worker: None,
            ..config.with_input_price("0.5")
        },
    )
    .await;
    let worker = api.another_process(AppOptions::default()).await;
    let tenant = api.funded_tenant("acme", "5").await;
    let id = api
        .create_job_ok(&tenant, llama_job("routed-for-real"))
        .await;
    let job = api
        .wait_until_finished(&tenant, id, Duration::from_secs(15))
        .await;
    assert_eq!(job["status"], "FAILED", "{job}");
    assert_eq!(job["error"]["code"], "MODEL_NOT_SERVED", "{job}");
    assert!(job["charge"].is_null());
    assert!(api.simulator.calls().is_empty() && local.simulator.calls().is_empty());
    crate::invariants::assert_billing_invariants(&api.app.db).await;
    drop(worker);
}

fn settings_without_database() -> Settings {
    Settings {
        listen: None,
        database_url: "sqlite:/nonexistent-folder/jobledger.db".to_owned(),
        admin_token: None,
        worker: None,
        providers: ProviderSettings::default(),
        customer_markup: Decimal::from_str("1.25").unwrap(),
        config_file: None,
        operations: Default::default(),
        allow_private_webhooks: false,
    }
}

#[tokio::test]
async fn a_bad_config_file_stops_the_start_before_the_database_is_touched() {
    let folder = tempfile::tempdir().unwrap();
    let path = folder.path().join("jobledger.toml");
    std::fs::write(&path, "[models.m]\nprovider = \"nowhere\"\n").unwrap();
    let mut settings = settings_without_database();
    settings.config_file = Some(path.clone());
    let Err(error) = Application::build(settings).await else {
        panic!("the application started with a bad config file");
    };
    assert!(matches!(error, StartupError::Config(_)), "{error:?}");
    let message = error.to_string();
    assert!(
        message.contains(&path.display().to_string())
            && message.contains("`models.m.provider`")
            && message.contains("unknown provider \"nowhere\""),
        "{message}"
    );
}

// ---- Through the real start path, on both databases ----

/// A second simulator standing in for a self-hosted OpenAI-compatible server.
struct LocalServer {
    simulator: Simulator,
    address: SocketAddr,
    stop: CancellationToken,
}

impl LocalServer {
    async fn start() -> Self {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let address = listener.local_addr().unwrap();
        let simulator = Simulator::new();
        let stop = CancellationToken::new();
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

impl Drop for LocalServer {
    fn drop(&mut self) {
        self.stop.cancel();
    }
}

/// A config file routing `llama3-local` to the local server at `input` credits per
/// million input tokens (output at 2, cached at 0.05, the customer at twice that).
struct TestConfig {
    _folder: tempfile::TempDir,
    path: PathBuf,
    base_url: String,
}

impl TestConfig {
    fn new(local: &LocalServer) -> Self {
        let folder = tempfile::tempdir().unwrap();
        let path = folder.path().join("jobledger.toml");
        Self {
            _folder: folder,
            path,
            base_url: format!("http://{}/v1", local.address),
        }
    }

    /// Writes the file with this input price; returns the options that start on it.
    fn with_input_price(&self, input: &str) -> AppOptions {
        let text = format!(
            r#"
            [providers.local-llm]
            kind = "openai"
            base_url = "{}"

            [routes]
            "unpriced-*" = "local-llm"

            [models.llama3-local]
            provider = "local-llm"
            price = {{ input = "{input}", cached_input = "0.05", output = "2" }}
            source = "measured on our own GPUs"
            customer_markup = "2"
            "#,
            self.base_url
        );
        std::fs::write(&self.path, text).unwrap();
        AppOptions {
            config_file: Some(self.path.clone()),
            ..AppOptions::default()
        }
    }
}

fn llama_job(key: &str) -> serde_json::Value {
    json!({
        "idempotencyKey": key,
        "model": "llama3-local",
        "messages": [{"role": "user", "content": "Summarise the quarter for the board, please."}],
        "maxOutputTokens": 50,
    })
}

/// `nanos_per_million × tokens / 1e6`, rounded up: the cost computed independently.
fn cost_nanos(nanos_per_million: i64, tokens: u64) -> i64 {
    let total = i128::from(nanos_per_million) * i128::from(tokens);
    i64::try_from((total + 999_999) / 1_000_000).unwrap()
}

async fn attempts_of(app: &TestApp, job: Uuid) -> Vec<attempts::Model> {
    attempts::Entity::find()
        .filter(attempts::Column::JobId.eq(job))
        .order_by_asc(attempts::Column::Number)
        .all(&app.app.db)
        .await
        .unwrap()
}

async fn price_versions(app: &TestApp, model: &str) -> Vec<model_prices::Model> {
    model_prices::Entity::find()
        .filter(model_prices::Column::Model.eq(model))
        .order_by_asc(model_prices::Column::Version)
        .all(&app.app.db)
        .await
        .unwrap()
}

/// Runs one `llama3-local` job to success and returns its only attempt, checking that
/// the local server served it and that its cost is `input_nanos` per million input
/// tokens and 2 credits per million output tokens.
async fn run_llama_job(
    app: &TestApp,
    local: &LocalServer,
    key: &str,
    input_nanos: i64,
) -> attempts::Model {
    let tenant = app.funded_tenant(key, "5").await;
    let id = app.create_job_ok(&tenant, llama_job(key)).await;
    let job = app
        .wait_until_finished(&tenant, id, Duration::from_secs(20))
        .await;
    assert_eq!(job["status"], "SUCCEEDED", "{job}");

    let call = local
        .simulator
        .calls()
        .into_iter()
        .find(|call| call.request_id == job["attempts"][0]["providerRequestId"])
        .expect("the local server served the attempt");
    assert_eq!(call.model, "llama3-local");
    let [attempt] = <[_; 1]>::try_from(attempts_of(app, id).await).unwrap();
    assert_eq!(attempt.provider, "local-llm");
    let expected =
        cost_nanos(input_nanos, call.input_tokens) + cost_nanos(2_000_000_000, call.output_tokens);
    assert_eq!(attempt.provider_cost_nanos, Some(expected));
    assert_eq!(
        decimal(&job["attempts"][0]["providerCost"]),
        Credits::from_nanos(expected).to_decimal()
    );
    let charge = cost_nanos(2 * input_nanos, call.input_tokens)
        + cost_nanos(4_000_000_000, call.output_tokens);
    assert_eq!(
        decimal(&job["charge"]["amount"]),
        Credits::from_nanos(charge).to_decimal()
    );
    attempt
}

async fn a_configured_model_runs_on_its_provider_at_its_price(backend: Backend) {
    let local = LocalServer::start().await;
    let config = TestConfig::new(&local);
    let app = spawn_app_with(backend, config.with_input_price("0.123456789")).await;

    run_llama_job(&app, &local, "llama-1", 123_456_789).await;
    assert_eq!(local.simulator.calls().len(), 1);
    assert!(
        app.simulator.calls().is_empty(),
        "the fallback simulator was called: {:?}",
        app.simulator.calls()
    );

    let [stored] = <[_; 1]>::try_from(price_versions(&app, "llama3-local").await).unwrap();
    assert_eq!(stored.version, 1);
    assert_eq!(stored.provider_input_nanos_per_million, 123_456_789);
    assert_eq!(stored.provider_cached_input_nanos_per_million, 50_000_000);
    assert_eq!(stored.customer_input_nanos_per_million, 246_913_578);
    assert_eq!(stored.source, "measured on our own GPUs");
    // Built-in models are still priced beside it.
    assert_eq!(price_versions(&app, "gpt-4o-mini").await.len(), 1);
}

async fn a_model_without_a_price_is_refused_with_validation(backend: Backend) {
    let local = LocalServer::start().await;
    let config = TestConfig::new(&local);
    let app = spawn_app_with(backend, config.with_input_price("0.5")).await;
    let tenant = app.funded_tenant("acme", "5").await;

    // Routed by the file to a provider, but priced nowhere.
    let mut input = llama_job("unpriced");
    input["model"] = json!("unpriced-model");
    let response = app.create_job(&tenant, input).await;
    assert_eq!(error_code(&response), "VALIDATION", "{response}");
    assert!(
        response["errors"][0]["message"]
            .as_str()
            .unwrap()
            .contains("has no price"),
        "{response}"
    );
    assert!(local.simulator.calls().is_empty());
}

/// With a real provider configured, the simulator no longer serves what no route
/// names: a built-in, priced model with no provider is refused, never simulated and
/// charged at real prices.
async fn an_unrouted_model_is_refused_once_a_provider_is_configured(backend: Backend) {
    let local = LocalServer::start().await;
    let config = TestConfig::new(&local);
    let app = spawn_app_with(backend, config.with_input_price("0.5")).await;
    let tenant = app.funded_tenant("acme", "5").await;
    for model in ["claude-sonnet-4-5", "gpt-4o-mini", "never-heard-of-it"] {
        let mut input = llama_job(model);
        input["model"] = json!(model);
        let response = app.create_job(&tenant, input).await;
        assert_eq!(error_code(&response), "VALIDATION", "{model}: {response}");
        assert!(
            response["errors"][0]["message"]
                .as_str()
                .unwrap()
                .contains("is not served"),
            "{response}"
        );
    }
    // The routed model still runs.
    let id = app.create_job_ok(&tenant, llama_job("routed")).await;
    let job = app
        .wait_until_finished(&tenant, id, Duration::from_secs(15))
        .await;
    assert_eq!(job["status"], "SUCCEEDED", "{job}");
    assert_eq!(local.simulator.calls().len(), 1);
    assert!(
        app.simulator.calls().is_empty(),
        "nothing reached the simulator"
    );
}

async fn a_changed_price_is_a_new_version_and_the_past_keeps_its_cost(backend: Backend) {
    let local = LocalServer::start().await;
    let config = TestConfig::new(&local);
    let app = spawn_app_with(backend, config.with_input_price("0.5")).await;
    let first = run_llama_job(&app, &local, "before", 500_000_000).await;
    let [v1] = <[_; 1]>::try_from(price_versions(&app, "llama3-local").await).unwrap();
    assert_eq!(first.model_price_id, v1.id);

    // A redeploy with the same file stores nothing new.
    let app = app.restart(config.with_input_price("0.5")).await;
    assert_eq!(
        price_versions(&app, "llama3-local").await,
        std::slice::from_ref(&v1)
    );

    // A redeploy with a new price stores version 2 and leaves version 1 alone.
    let app = app.restart(config.with_input_price("0.75")).await;
    let versions = price_versions(&app, "llama3-local").await;
    assert_eq!(versions.len(), 2, "{versions:?}");
    assert_eq!(versions[0], v1);
    assert_eq!(versions[1].version, 2);
    assert_eq!(versions[1].provider_input_nanos_per_million, 750_000_000);
    assert_eq!(versions[1].customer_input_nanos_per_million, 1_500_000_000);

    // The earlier attempt still points at version 1 with its cost unchanged.
    let [past] = <[_; 1]>::try_from(attempts_of(&app, first.job_id).await).unwrap();
    assert_eq!(past, first);
    assert_eq!(past.model_price_id, v1.id);

    // A new job runs at version 2.
    let second = run_llama_job(&app, &local, "after", 750_000_000).await;
    assert_eq!(second.model_price_id, versions[1].id);
}

// ---- The admin token an operator chooses ----

/// `jobledger serve` on a fresh SQLite file with `JOBLEDGER_ADMIN_TOKEN=token`.
fn serve_with_admin_token(
    folder: &Path,
    listen: SocketAddr,
    token: &str,
) -> tokio::process::Command {
    let database_url = format!("sqlite:{}", folder.join("jobledger.db").display());
    let mut command = tokio::process::Command::new(env!("CARGO_BIN_EXE_jobledger"));
    command
        .args(["serve", "--workers", "0", "--listen", &listen.to_string()])
        .args(["--database-url", &database_url])
        .env("JOBLEDGER_ADMIN_TOKEN", token)
        .env_remove("JOBLEDGER_CONFIG")
        .kill_on_drop(true);
    command
}

#[tokio::test]
async fn an_admin_token_under_32_characters_or_with_whitespace_inside_stops_serve() {
    let folder = tempfile::tempdir().unwrap();
    let listen: SocketAddr = "127.0.0.1:9".parse().unwrap();
    for (token, problem) in [
        ("short-admin-token", "at least 32"),
        ("   thirty-one-characters-long-xx   ", "at least 32"),
        (
            "a-token-of-more-than-32-characters\nwith-a-line-break",
            "whitespace",
        ),
    ] {
        let output = tokio::time::timeout(
            Duration::from_secs(30),
            serve_with_admin_token(folder.path(), listen, token).output(),
        )
        .await
        .expect("serve exits at once")
        .expect("the binary runs");
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert!(!output.status.success(), "{token:?} was accepted: {stderr}");
        assert!(
            stderr.contains("JOBLEDGER_ADMIN_TOKEN") && stderr.contains(problem),
            "{token:?}: {stderr}"
        );
        assert!(
            !stderr.contains(token.trim()),
            "the refusal must not print the token: {stderr}"
        );
    }
    assert!(
        !folder.path().join("jobledger.db").exists(),
        "refused before the database is touched"
    );
}

#[tokio::test]
async fn an_admin_token_of_32_characters_serves_admins() {
    let folder = tempfile::tempdir().unwrap();
    let listen = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap();
    let token = "0123456789abcdef0123456789abcdef";
    assert_eq!(token.len(), 32);
    let mut serve = serve_with_admin_token(folder.path(), listen, &format!(" {token}\n"))
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let http = reqwest::Client::new();
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    let response: serde_json::Value = loop {
        let sent = http
            .post(format!("http://{listen}/graphql"))
            .bearer_auth(token)
            .json(
                &json!({"query": "mutation { createTenant(name: \"acme\") { tenant { name } } }"}),
            )
            .send()
            .await;
        if let Ok(answer) = sent {
            break answer.json().await.unwrap();
        }
        assert!(
            serve.try_wait().unwrap().is_none(),
            "serve exited with a 32-character token"
        );
        assert!(std::time::Instant::now() < deadline, "serve never listened");
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    assert_eq!(
        response["data"]["createTenant"]["tenant"]["name"], "acme",
        "{response}"
    );
    serve.kill().await.unwrap();
}
