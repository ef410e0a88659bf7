//! The optional config file (`--config FILE`, `JOBLEDGER_CONFIG`): named providers,
//! which provider serves which model, model prices with the customer price policy, and
//! the requests and tokens per minute each provider and model allows.
//!
//! The file is TOML, read once at start and validated completely before anything runs:
//! unknown keys are errors (typos must not pass silently), every error names the file,
//! the key and the problem, and prices are decimal strings parsed exactly (never through
//! a float). `jobledger.example.toml` at the repository root shows every key.

mod check;
mod raw;

use crate::billing::ChargingPolicy;
use crate::billing::prices::{self, BatchRates, ConfiguredPrice, ListPrice, Rates};
use crate::jobs::flow::{FlowLimits, RateLimit};
use crate::llm::ProviderRegistry;
use crate::llm::routing::ModelPattern;
use check::Checker;
use entity::PriceOrigin;
use raw::RawFile;
use rust_decimal::Decimal;
use std::collections::BTreeMap;
use std::fmt;
use std::path::{Path, PathBuf};

/// Why the config file cannot be used; `serve` and `worker` refuse to start.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("config file {}: cannot read it: {source}", path.display())]
    Read {
        path: PathBuf,
        source: std::io::Error,
    },
    /// Not TOML, a key the format does not have, or a value of the wrong type (the
    /// message quotes the line and names the key).
    #[error("config file {}: {message}", path.display())]
    Syntax { path: PathBuf, message: String },
    #[error("config file {}: `{key}`: {problem}", path.display())]
    Invalid {
        path: PathBuf,
        key: String,
        problem: String,
    },
}

/// A validated config file.
#[derive(Clone, Debug)]
pub struct ConfigFile {
    pub path: PathBuf,
    /// The customer price over the provider price for every model without a policy
    /// of its own (built-in prices included); `None`: the default, 1.25.
    pub customer_markup: Option<Decimal>,
    pub providers: BTreeMap<String, ProviderConfig>,
    /// Model names and prefix patterns with the name of the provider serving them,
    /// from `[routes]` and from each model's `provider`.
    pub routes: Vec<(ModelPattern, String)>,
    pub models: BTreeMap<String, ModelConfig>,
    /// What the customer pays for calls that did not simply succeed (`[charging]`).
    pub charging: ChargingPolicy,
    /// The deadline of a job whose client names none, from when it may start
    /// (`default_deadline_seconds`); `None`: the flag's, else the built-in 24 hours.
    pub default_deadline: Option<std::time::Duration>,
}

/// What speaks to a named provider.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ProviderKind {
    /// Any OpenAI-compatible chat completions server.
    OpenAi,
    /// The Anthropic Messages API.
    Anthropic,
    /// The built-in simulator.
    Simulator,
}

/// A named provider; its key was read from the environment variable the file names.
#[derive(Clone, PartialEq, Eq)]
pub struct ProviderConfig {
    pub kind: ProviderKind,
    /// `None` for the simulator only.
    pub base_url: Option<String>,
    api_key: Option<String>,
    /// What the provider's account allows per minute, across all its models.
    pub rate_limit: RateLimit,
}

impl ProviderConfig {
    /// The API key, when the provider names a variable for it.
    pub fn api_key(&self) -> Option<&str> {
        self.api_key.as_deref()
    }
}

impl fmt::Debug for ProviderConfig {
    // Settings get logged; keys must not be.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ProviderConfig")
            .field("kind", &self.kind)
            .field("base_url", &self.base_url)
            .field("api_key", &self.api_key.as_ref().map(|_| "<redacted>"))
            .field("rate_limit", &self.rate_limit)
            .finish()
    }
}

/// A model's entry: its price and customer price policy (its provider is in `routes`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ModelConfig {
    /// The provider's price; `None` keeps the built-in one, if any.
    pub price: Option<Rates>,
    pub customer: CustomerPolicy,
    /// The provider's batch API price (`batch_price`); `None` keeps the built-in
    /// model's (half its list price), and a model without either has none.
    pub batch_price: Option<BatchRates>,
    /// Explicit customer batch rates (`customer_batch_price`); `None`: the customer
    /// price policy applied to the batch price.
    pub customer_batch_price: Option<BatchRates>,
    pub source: Option<String>,
    /// What the provider allows per minute for this model.
    pub rate_limit: RateLimit,
}

/// How the customer price follows from the provider price.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum CustomerPolicy {
    /// The file's `customer_markup` (or the default 1.25).
    GlobalMarkup,
    /// This model's own markup.
    Markup(Decimal),
    /// Explicit customer rates.
    Price(Rates),
}

impl ModelConfig {
    /// Whether the entry says anything of what the model costs or sells for.
    fn sets_prices(&self) -> bool {
        self.price.is_some()
            || self.batch_price.is_some()
            || self.customer_batch_price.is_some()
            || self.customer != CustomerPolicy::GlobalMarkup
    }
}

impl ConfigFile {
    /// The file's per-minute limits of providers and models; `routes` tells which
    /// provider serves a model.
    pub fn flow_limits(&self, routes: &ProviderRegistry) -> FlowLimits {
        FlowLimits::new(
            self.models
                .iter()
                .map(|(model, entry)| (model.clone(), entry.rate_limit))
                .collect(),
            self.providers
                .iter()
                .map(|(name, provider)| (name.clone(), provider.rate_limit))
                .collect(),
            routes.clone(),
        )
    }

    /// Reads and validates `path`; API keys come from the process environment.
    pub fn load(path: &Path) -> Result<Self, ConfigError> {
        let text = std::fs::read_to_string(path).map_err(|source| ConfigError::Read {
            path: path.to_owned(),
            source,
        })?;
        Self::parse(&text, path, |name| std::env::var(name).ok())
    }

    /// Validates `text`, the content of `path`, reading environment variables through
    /// `env` (so tests need not change the process environment).
    pub fn parse(
        text: &str,
        path: &Path,
        env: impl Fn(&str) -> Option<String>,
    ) -> Result<Self, ConfigError> {
        let raw: RawFile = toml::from_str(text).map_err(|error| ConfigError::Syntax {
            path: path.to_owned(),
            message: error.to_string().trim_end().to_owned(),
        })?;
        Checker { path }.check(raw, &env)
    }

    /// Every price to store at start: the built-in ones and the file's, each with its
    /// customer rates under its policy. `default_markup` applies when the file sets no
    /// global `customer_markup`.
    pub fn prices(&self, default_markup: Decimal) -> Result<Vec<ConfiguredPrice>, ConfigError> {
        let checker = Checker { path: &self.path };
        let global = self.customer_markup.unwrap_or(default_markup);
        let built_in_list = prices::built_in_list();
        let mut list = Vec::new();
        for price in &built_in_list {
            if !self.models.contains_key(&price.model) {
                list.push(checker.customer_price(
                    price,
                    &CustomerPolicy::GlobalMarkup,
                    None,
                    global,
                )?);
            }
        }
        let built_in: BTreeMap<&str, &ListPrice> = built_in_list
            .iter()
            .map(|price| (price.model.as_str(), price))
            .collect();
        for (model, config) in &self.models {
            let price = match (&config.price, built_in.get(model.as_str())) {
                (Some(rates), built_in) => ListPrice {
                    model: model.clone(),
                    provider: *rates,
                    // A built-in model's provider still bills its batches at the
                    // built-in discount of whatever the list price now is.
                    batch: config
                        .batch_price
                        .or_else(|| built_in.map(|_| prices::built_in_batch(rates))),
                    // A new price of a built-in model keeps what the model can hold.
                    limits: built_in.map(|price| price.limits).unwrap_or_default(),
                    source: config
                        .source
                        .clone()
                        .unwrap_or_else(|| format!("config file {}", self.path.display())),
                    origin: PriceOrigin::Config,
                },
                // A built-in price the file sells its own way is the file's; one it
                // only routes or rate-limits stays built in (an import may replace it).
                (None, Some(built_in)) => ListPrice {
                    batch: config.batch_price.or(built_in.batch),
                    origin: if config.sets_prices() {
                        PriceOrigin::Config
                    } else {
                        PriceOrigin::BuiltIn
                    },
                    ..(*built_in).clone()
                },
                // Routed only; refused at createJob unless a price exists in the database.
                (None, None) => continue,
            };
            list.push(checker.customer_price(
                &price,
                &config.customer,
                config.customer_batch_price,
                global,
            )?);
        }
        Ok(list)
    }
}
