//! The config file (`--config FILE`): parsing and validation errors that name the key,
//! exact prices, routing composed with the environment, and — through the real start
//! path — a custom model served by a configured provider at its configured price,
//! with price changes stored as new versions that never rewrite past attempts.

mod admin_token;
mod configured_models;
mod parsing;
mod startup;

use crate::helpers::{AppOptions, RunningSimulator, TestApp, decimal};
use entity::{attempts, model_prices};
use jobledger::billing::Credits;
use jobledger::billing::prices::{ConfiguredPrice, PricePerMillion, Rates};
use jobledger::config::file::{ConfigError, ConfigFile};
use jobledger::config::{ProviderSettings, Settings};
use rust_decimal::Decimal;
use sea_orm::{ColumnTrait, EntityTrait, QueryFilter, QueryOrder};
use serde_json::json;
use std::path::{Path, PathBuf};
use std::str::FromStr;
use std::time::Duration;
use uuid::Uuid;

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

fn settings_without_database() -> Settings {
    Settings {
        listen: None,
        database_url: "sqlite:/nonexistent-folder/jobledger.db".to_owned(),
        listen_database_url: None,
        admin_token: None,
        worker: None,
        providers: ProviderSettings::default(),
        customer_markup: Decimal::from_str("1.25").unwrap(),
        config_file: None,
        operations: Default::default(),
        allow_private_webhooks: false,
        cors_origins: Vec::new(),
        default_deadline: None,
    }
}

/// A second simulator standing in for a self-hosted OpenAI-compatible server, stopped
/// when dropped.
struct LocalServer(RunningSimulator);

impl LocalServer {
    async fn start() -> Self {
        Self(RunningSimulator::start().await)
    }
}

impl std::ops::Deref for LocalServer {
    type Target = RunningSimulator;

    fn deref(&self) -> &RunningSimulator {
        &self.0
    }
}

impl Drop for LocalServer {
    fn drop(&mut self) {
        self.0.stop.cancel();
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
