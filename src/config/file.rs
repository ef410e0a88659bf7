//! The optional config file (`--config FILE`, `JOBLEDGER_CONFIG`): named providers,
//! which provider serves which model, model prices with the customer price policy, and
//! the requests and tokens per minute each provider and model allows.
//!
//! The file is TOML, read once at start and validated completely before anything runs:
//! unknown keys are errors (typos must not pass silently), every error names the file,
//! the key and the problem, and prices are decimal strings parsed exactly (never through
//! a float). `jobledger.example.toml` at the repository root shows every key.

use crate::billing::prices::{self, ConfiguredPrice, ListPrice, PricePerMillion, Rates};
use crate::billing::{ChargingPolicy, Credits, UnfinishedCall};
use crate::jobs::flow::{RateLimit, TokenCounting};
use crate::llm::routing::ModelPattern;
use rust_decimal::Decimal;
use serde::Deserialize;
use serde::de::{self, Visitor};
use std::collections::{BTreeMap, BTreeSet};
use std::fmt;
use std::num::NonZeroU32;
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

// ---- The file as written ----

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawFile {
    customer_markup: Option<RawNumber>,
    #[serde(default)]
    providers: BTreeMap<String, RawProvider>,
    #[serde(default)]
    routes: BTreeMap<String, String>,
    #[serde(default)]
    models: BTreeMap<String, RawModel>,
    #[serde(default)]
    charging: RawCharging,
}

#[derive(Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawCharging {
    unknown_outcome: Option<String>,
    cancelled_during_call: Option<String>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawProvider {
    kind: String,
    base_url: Option<String>,
    api_key_env: Option<String>,
    /// Accepted by the parser only to refuse it without quoting the value.
    api_key: Option<de::IgnoredAny>,
    requests_per_minute: Option<i64>,
    tokens_per_minute: Option<i64>,
    tokens_counted: Option<String>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawModel {
    provider: Option<String>,
    price: Option<RawRates>,
    customer_price: Option<RawRates>,
    customer_markup: Option<RawNumber>,
    source: Option<String>,
    requests_per_minute: Option<i64>,
    tokens_per_minute: Option<i64>,
    tokens_counted: Option<String>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawRates {
    input: RawNumber,
    /// Defaults to `input`: no discount for cached tokens.
    cached_input: Option<RawNumber>,
    output: RawNumber,
}

/// A number as written: a decimal string, a TOML integer, or a TOML float (refused
/// with a hint, because a float cannot hold most decimal prices exactly).
enum RawNumber {
    Text(String),
    Integer(i64),
    /// Kept only to quote it in the error.
    Float(f64),
}

impl<'de> Deserialize<'de> for RawNumber {
    fn deserialize<D: de::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct NumberVisitor;

        impl Visitor<'_> for NumberVisitor {
            type Value = RawNumber;

            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a decimal string such as \"0.15\"")
            }

            fn visit_str<E: de::Error>(self, value: &str) -> Result<RawNumber, E> {
                Ok(RawNumber::Text(value.to_owned()))
            }

            fn visit_i64<E: de::Error>(self, value: i64) -> Result<RawNumber, E> {
                Ok(RawNumber::Integer(value))
            }

            fn visit_u64<E: de::Error>(self, value: u64) -> Result<RawNumber, E> {
                i64::try_from(value)
                    .map(RawNumber::Integer)
                    .map_err(|_| E::custom("the number is too large"))
            }

            fn visit_f64<E: de::Error>(self, value: f64) -> Result<RawNumber, E> {
                Ok(RawNumber::Float(value))
            }
        }

        deserializer.deserialize_any(NumberVisitor)
    }
}

// ---- Reading and validating ----

impl ConfigFile {
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
                list.push(checker.customer_price(price, &CustomerPolicy::GlobalMarkup, global)?);
            }
        }
        let built_in: BTreeMap<&str, &ListPrice> = built_in_list
            .iter()
            .map(|price| (price.model.as_str(), price))
            .collect();
        for (model, config) in &self.models {
            let price = match (&config.price, built_in.get(model.as_str())) {
                (Some(rates), _) => ListPrice {
                    model: model.clone(),
                    provider: *rates,
                    source: config
                        .source
                        .clone()
                        .unwrap_or_else(|| format!("config file {}", self.path.display())),
                },
                (None, Some(built_in)) => (*built_in).clone(),
                // Routed only; refused at createJob unless a price exists in the database.
                (None, None) => continue,
            };
            list.push(checker.customer_price(&price, &config.customer, global)?);
        }
        Ok(list)
    }
}

/// Validation with errors that name the file and the key.
struct Checker<'a> {
    path: &'a Path,
}

const KINDS: &str = "\"openai\" (any OpenAI-compatible server), \"anthropic\" or \"simulator\"";

impl Checker<'_> {
    fn invalid(&self, key: impl Into<String>, problem: impl Into<String>) -> ConfigError {
        ConfigError::Invalid {
            path: self.path.to_owned(),
            key: key.into(),
            problem: problem.into(),
        }
    }

    fn check(
        &self,
        raw: RawFile,
        env: &impl Fn(&str) -> Option<String>,
    ) -> Result<ConfigFile, ConfigError> {
        let customer_markup = raw
            .customer_markup
            .as_ref()
            .map(|markup| self.markup("customer_markup", markup))
            .transpose()?;

        let mut providers = BTreeMap::new();
        for (name, provider) in raw.providers {
            let config = self.provider(&name, provider, env)?;
            providers.insert(name, config);
        }
        let known = |name: &str, key: &str| {
            if providers.contains_key(name) {
                Ok(name.to_owned())
            } else {
                let defined: Vec<String> = providers.keys().map(|n| format!("{n:?}")).collect();
                Err(self.invalid(
                    key,
                    format!(
                        "unknown provider {name:?} (defined in [providers]: {})",
                        if defined.is_empty() {
                            "none".to_owned()
                        } else {
                            defined.join(", ")
                        }
                    ),
                ))
            }
        };

        let mut routes: BTreeMap<ModelPattern, String> = BTreeMap::new();
        for (text, provider) in &raw.routes {
            let key = format!("routes.{}", key_segment(text));
            let pattern =
                ModelPattern::parse(text).map_err(|e| self.invalid(&key, e.to_string()))?;
            routes.insert(pattern, known(provider, &key)?);
        }

        let built_in: BTreeSet<String> = prices::built_in_list()
            .into_iter()
            .map(|price| price.model)
            .collect();
        let mut models = BTreeMap::new();
        for (name, model) in raw.models {
            let key = format!("models.{}", key_segment(&name));
            match ModelPattern::parse(&name) {
                Ok(ModelPattern::Exact(_)) => {}
                Ok(ModelPattern::Prefix(_)) => {
                    return Err(self.invalid(
                        key,
                        "a price is for one exact model name; route patterns in [routes]",
                    ));
                }
                Err(error) => return Err(self.invalid(key, error.to_string())),
            }
            if let Some(provider) = &model.provider {
                let provider = known(provider, &format!("{key}.provider"))?;
                let pattern = ModelPattern::Exact(name.clone());
                if let Some(other) = routes.get(&pattern).filter(|other| **other != provider) {
                    return Err(self.invalid(
                        format!("{key}.provider"),
                        format!(
                            "says {provider:?} but `routes.{}` says {other:?}",
                            key_segment(&name)
                        ),
                    ));
                }
                routes.insert(pattern, provider);
            }
            let price = model
                .price
                .as_ref()
                .map(|rates| self.rates(&format!("{key}.price"), rates))
                .transpose()?;
            let customer = match (&model.customer_markup, &model.customer_price) {
                (Some(_), Some(_)) => {
                    return Err(
                        self.invalid(key, "set customer_markup or customer_price, not both")
                    );
                }
                (Some(markup), None) => {
                    CustomerPolicy::Markup(self.markup(&format!("{key}.customer_markup"), markup)?)
                }
                (None, Some(rates)) => {
                    CustomerPolicy::Price(self.rates(&format!("{key}.customer_price"), rates)?)
                }
                (None, None) => CustomerPolicy::GlobalMarkup,
            };
            if price.is_none()
                && !built_in.contains(&name)
                && customer != CustomerPolicy::GlobalMarkup
            {
                return Err(self.invalid(
                    key,
                    "a customer price policy needs a provider price: this model has no \
                     built-in price, so set `price = { input = \"…\", output = \"…\" }`",
                ));
            }
            if price.is_none() && model.source.is_some() {
                return Err(self.invalid(
                    format!("{key}.source"),
                    "describes the provider price: set `price` too (a built-in price keeps its \
                     own source)",
                ));
            }
            if let Some(source) = &model.source
                && source.trim().is_empty()
            {
                return Err(self.invalid(format!("{key}.source"), "is empty"));
            }
            let rate_limit = self.rate_limit(
                &key,
                model.requests_per_minute,
                model.tokens_per_minute,
                model.tokens_counted.as_deref(),
            )?;
            models.insert(
                name,
                ModelConfig {
                    price,
                    customer,
                    source: model.source,
                    rate_limit,
                },
            );
        }

        let charging = ChargingPolicy {
            unknown_outcome: self.unfinished_call(
                "charging.unknown_outcome",
                raw.charging.unknown_outcome.as_deref(),
            )?,
            cancelled_during_call: self.unfinished_call(
                "charging.cancelled_during_call",
                raw.charging.cancelled_during_call.as_deref(),
            )?,
        };

        Ok(ConfigFile {
            path: self.path.to_owned(),
            customer_markup,
            providers,
            routes: routes.into_iter().collect(),
            models,
            charging,
        })
    }

    fn unfinished_call(
        &self,
        key: &str,
        text: Option<&str>,
    ) -> Result<UnfinishedCall, ConfigError> {
        match text {
            None => Ok(UnfinishedCall::default()),
            Some("delivered_output") => Ok(UnfinishedCall::DeliveredOutput),
            Some("call_bound") => Ok(UnfinishedCall::CallBound),
            Some(other) => Err(self.invalid(
                key,
                format!("is {other:?}; expected \"delivered_output\" or \"call_bound\""),
            )),
        }
    }

    fn provider(
        &self,
        name: &str,
        raw: RawProvider,
        env: &impl Fn(&str) -> Option<String>,
    ) -> Result<ProviderConfig, ConfigError> {
        let key = format!("providers.{}", key_segment(name));
        if name.trim().is_empty() {
            return Err(self.invalid(key, "a provider needs a name"));
        }
        if raw.api_key.is_some() {
            return Err(self.invalid(
                format!("{key}.api_key"),
                "keys do not belong in the file: put the key in an environment variable and \
                 name that variable with `api_key_env`",
            ));
        }
        let rate_limit = self.rate_limit(
            &key,
            raw.requests_per_minute,
            raw.tokens_per_minute,
            raw.tokens_counted.as_deref(),
        )?;
        let kind = match raw.kind.as_str() {
            "openai" => ProviderKind::OpenAi,
            "anthropic" => ProviderKind::Anthropic,
            "simulator" => ProviderKind::Simulator,
            other => {
                return Err(self.invalid(
                    format!("{key}.kind"),
                    format!("unknown kind {other:?}: use {KINDS}"),
                ));
            }
        };
        if kind == ProviderKind::Simulator {
            for (field, set) in [
                ("base_url", raw.base_url.is_some()),
                ("api_key_env", raw.api_key_env.is_some()),
            ] {
                if set {
                    return Err(self.invalid(
                        format!("{key}.{field}"),
                        "the simulator is built in: it takes no base_url and no key",
                    ));
                }
            }
            return Ok(ProviderConfig {
                kind,
                base_url: None,
                api_key: None,
                rate_limit,
            });
        }
        let base_url = raw.base_url.ok_or_else(|| {
            self.invalid(
                format!("{key}.base_url"),
                "is missing (e.g. \"https://api.openai.com/v1\", \"http://127.0.0.1:11434/v1\" \
                 or \"https://api.anthropic.com\")",
            )
        })?;
        match reqwest::Url::parse(&base_url) {
            Ok(url) if matches!(url.scheme(), "http" | "https") && url.has_host() => {}
            _ => {
                return Err(self.invalid(
                    format!("{key}.base_url"),
                    format!("{base_url:?} is not an http:// or https:// URL"),
                ));
            }
        }
        let api_key = match raw.api_key_env {
            None => None,
            Some(variable) => {
                let env_key = format!("{key}.api_key_env");
                let is_name = !variable.is_empty()
                    && !variable.starts_with(|c: char| c.is_ascii_digit())
                    && variable
                        .chars()
                        .all(|c| c.is_ascii_alphanumeric() || c == '_');
                if !is_name {
                    // Not echoed: it may be a key pasted in the wrong place.
                    return Err(self.invalid(
                        env_key,
                        "must name an environment variable (letters, digits and `_`), not hold \
                         the key itself",
                    ));
                }
                match env(&variable).filter(|value| !value.trim().is_empty()) {
                    Some(value) => Some(value),
                    None => {
                        return Err(self.invalid(
                            env_key,
                            format!(
                                "the environment variable {variable} is not set or empty (it \
                                 should hold this provider's API key)"
                            ),
                        ));
                    }
                }
            }
        };
        Ok(ProviderConfig {
            kind,
            base_url: Some(base_url),
            api_key,
            rate_limit,
        })
    }

    /// `requests_per_minute` and `tokens_per_minute` under `key`: each a whole number
    /// from 1 up, or absent for no limit; and `tokens_counted`, how the provider counts
    /// a call's tokens.
    fn rate_limit(
        &self,
        key: &str,
        requests: Option<i64>,
        tokens: Option<i64>,
        tokens_counted: Option<&str>,
    ) -> Result<RateLimit, ConfigError> {
        let per_minute = |field: &str, value: Option<i64>| {
            value
                .map(|value| {
                    u32::try_from(value)
                        .ok()
                        .and_then(NonZeroU32::new)
                        .ok_or_else(|| {
                            self.invalid(
                                format!("{key}.{field}"),
                                format!(
                                    "is {value}; expected a whole number from 1 to {} (leave it \
                                     out for no limit)",
                                    u32::MAX
                                ),
                            )
                        })
                })
                .transpose()
        };
        let tokens_counted = tokens_counted
            .map(|value| {
                TokenCounting::parse(value).ok_or_else(|| {
                    self.invalid(
                        format!("{key}.tokens_counted"),
                        format!(
                            "is {value:?}; expected \"used\" (the provider counts the tokens a \
                             call used) or \"requested\" (it counts what a request may use, \
                             when it arrives)"
                        ),
                    )
                })
            })
            .transpose()?;
        Ok(RateLimit {
            requests_per_minute: per_minute("requests_per_minute", requests)?,
            tokens_per_minute: per_minute("tokens_per_minute", tokens)?,
            tokens_counted,
        })
    }

    fn rates(&self, key: &str, raw: &RawRates) -> Result<Rates, ConfigError> {
        let input = self.price(&format!("{key}.input"), &raw.input)?;
        let cached_input = match &raw.cached_input {
            Some(cached) => self.price(&format!("{key}.cached_input"), cached)?,
            None => input,
        };
        Ok(Rates {
            input,
            cached_input,
            output: self.price(&format!("{key}.output"), &raw.output)?,
        })
    }

    /// Credits per million tokens: not negative, at most 9 decimals.
    fn price(&self, key: &str, raw: &RawNumber) -> Result<PricePerMillion, ConfigError> {
        let value = self.decimal(key, raw)?;
        if value.is_sign_negative() && !value.is_zero() {
            return Err(self.invalid(key, format!("{value} is negative")));
        }
        Credits::from_decimal(value)
            .map(PricePerMillion)
            .map_err(|error| match error {
                crate::billing::CreditsError::TooPrecise => self.invalid(
                    key,
                    format!(
                        "{value} has more than 9 decimals (the smallest amount is one \
                         nano-credit, 0.000000001)"
                    ),
                ),
                crate::billing::CreditsError::TooLarge => {
                    self.invalid(key, format!("{value} is too large"))
                }
            })
    }

    /// A markup factor: above zero.
    fn markup(&self, key: &str, raw: &RawNumber) -> Result<Decimal, ConfigError> {
        let value = self.decimal(key, raw)?;
        if value <= Decimal::ZERO {
            return Err(self.invalid(
                key,
                format!("{value} is not above zero (1.25 means the customer pays 125%)"),
            ));
        }
        Ok(value)
    }

    fn decimal(&self, key: &str, raw: &RawNumber) -> Result<Decimal, ConfigError> {
        match raw {
            RawNumber::Text(text) => Decimal::from_str_exact(text.trim()).map_err(|_| {
                self.invalid(
                    key,
                    format!("{text:?} is not a decimal number like \"0.15\""),
                )
            }),
            RawNumber::Integer(value) => Ok(Decimal::from(*value)),
            RawNumber::Float(value) => Err(self.invalid(
                key,
                format!(
                    "write it as a string, \"{value}\" rather than {value}: a TOML float cannot \
                     hold most decimal amounts exactly"
                ),
            )),
        }
    }

    fn customer_price(
        &self,
        price: &ListPrice,
        policy: &CustomerPolicy,
        global: Decimal,
    ) -> Result<ConfiguredPrice, ConfigError> {
        let model_key = format!("models.{}", key_segment(&price.model));
        let customer = match policy {
            CustomerPolicy::Price(rates) => *rates,
            CustomerPolicy::Markup(markup) => prices::checked_marked_up(&price.provider, *markup)
                .ok_or_else(|| {
                self.invalid(
                    format!("{model_key}.customer_markup"),
                    "makes a customer price too large",
                )
            })?,
            CustomerPolicy::GlobalMarkup => prices::checked_marked_up(&price.provider, global)
                .ok_or_else(|| {
                    self.invalid(
                        "customer_markup",
                        format!("makes the customer price of {:?} too large", price.model),
                    )
                })?,
        };
        let below = |customer: PricePerMillion, provider: PricePerMillion| customer.0 < provider.0;
        if below(customer.input, price.provider.input)
            || below(customer.cached_input, price.provider.cached_input)
            || below(customer.output, price.provider.output)
        {
            tracing::warn!(
                model = %price.model,
                file = %self.path.display(),
                "the customer price is below the provider price: every job loses money"
            );
        }
        Ok(ConfiguredPrice {
            model: price.model.clone(),
            provider: price.provider,
            customer,
            source: price.source.clone(),
        })
    }
}

/// A key as written in TOML: bare when it can be, quoted otherwise.
fn key_segment(key: &str) -> String {
    let bare = !key.is_empty()
        && key
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-');
    if bare {
        key.to_owned()
    } else {
        format!("{key:?}")
    }
}
