//! Validation of the file as written into a [`ConfigFile`]: providers and their keys,
//! routes, models, prices, customer price policies, rate limits and charging, each
//! error naming the key it is about.

use super::raw::{RawBatchRates, RawFile, RawNumber, RawProvider, RawRates};
use super::{ConfigError, ConfigFile, CustomerPolicy, ModelConfig, ProviderConfig, ProviderKind};
use crate::billing::prices::{
    self, BatchPrice, BatchRates, ConfiguredPrice, ListPrice, PricePerMillion, Rates,
};
use crate::billing::{ChargingPolicy, Credits, UnfinishedCall};
use crate::jobs::flow::{RateLimit, TokenCounting};
use crate::llm::routing::ModelPattern;
use rust_decimal::Decimal;
use std::collections::{BTreeMap, BTreeSet};
use std::num::NonZeroU32;
use std::path::Path;

/// Validation with errors that name the file and the key.
pub(super) struct Checker<'a> {
    pub(super) path: &'a Path,
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

    pub(super) fn check(
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
            let batch_price = model
                .batch_price
                .as_ref()
                .map(|rates| self.batch_rates(&format!("{key}.batch_price"), rates))
                .transpose()?;
            let customer_batch_price = model
                .customer_batch_price
                .as_ref()
                .map(|rates| self.batch_rates(&format!("{key}.customer_batch_price"), rates))
                .transpose()?;
            if batch_price.is_some() && price.is_none() && !built_in.contains(&name) {
                return Err(self.invalid(
                    format!("{key}.batch_price"),
                    "a batch price needs a provider price: this model has no built-in price, \
                     so set `price` too",
                ));
            }
            if customer_batch_price.is_some() && batch_price.is_none() && !built_in.contains(&name)
            {
                return Err(self.invalid(
                    format!("{key}.customer_batch_price"),
                    "sells a batch price this model does not have: set `batch_price` (what the \
                     provider's batch API bills) too",
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
                    batch_price,
                    customer_batch_price,
                    source: model.source,
                    rate_limit,
                },
            );
        }

        let defaults = ChargingPolicy::default();
        let charging = ChargingPolicy {
            unknown_outcome: self.unfinished_call(
                "charging.unknown_outcome",
                raw.charging.unknown_outcome.as_deref(),
                defaults.unknown_outcome,
            )?,
            cancelled_during_call: self.unfinished_call(
                "charging.cancelled_during_call",
                raw.charging.cancelled_during_call.as_deref(),
                defaults.cancelled_during_call,
            )?,
        };

        let default_deadline = raw
            .default_deadline_seconds
            .map(|seconds| {
                u64::try_from(seconds)
                    .ok()
                    .filter(|seconds| *seconds > 0)
                    .map(std::time::Duration::from_secs)
                    .ok_or_else(|| {
                        self.invalid(
                            "default_deadline_seconds",
                            format!("must be a whole number of seconds above 0, not {seconds}"),
                        )
                    })
            })
            .transpose()?;

        Ok(ConfigFile {
            path: self.path.to_owned(),
            customer_markup,
            providers,
            routes: routes.into_iter().collect(),
            models,
            charging,
            default_deadline,
        })
    }

    fn unfinished_call(
        &self,
        key: &str,
        text: Option<&str>,
        default: UnfinishedCall,
    ) -> Result<UnfinishedCall, ConfigError> {
        match text {
            None => Ok(default),
            Some("delivered_output") => Ok(UnfinishedCall::DeliveredOutput),
            Some("prompt") => Ok(UnfinishedCall::Prompt),
            Some("call_bound") => Ok(UnfinishedCall::CallBound),
            Some(other) => Err(self.invalid(
                key,
                format!(
                    "is {other:?}; expected \"delivered_output\", \"prompt\" or \"call_bound\""
                ),
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

    fn batch_rates(&self, key: &str, raw: &RawBatchRates) -> Result<BatchRates, ConfigError> {
        Ok(BatchRates {
            input: self.price(&format!("{key}.input"), &raw.input)?,
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

    /// The price with its customer rates under `policy`; the batch price's customer
    /// rates are `customer_batch` when given, else `policy` applied to the batch price.
    pub(super) fn customer_price(
        &self,
        price: &ListPrice,
        policy: &CustomerPolicy,
        customer_batch: Option<BatchRates>,
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
        let batch = match price.batch {
            None => None,
            Some(provider) => {
                let customer = match (customer_batch, policy) {
                    (Some(rates), _) => Some(rates),
                    (None, CustomerPolicy::Price(rates)) => {
                        provider.carried_over(&price.provider, rates)
                    }
                    (None, CustomerPolicy::Markup(markup)) => provider.checked_marked_up(*markup),
                    (None, CustomerPolicy::GlobalMarkup) => provider.checked_marked_up(global),
                };
                let customer = customer.ok_or_else(|| {
                    self.invalid(
                        format!("{model_key}.customer_batch_price"),
                        "the customer price policy makes the batch price too large",
                    )
                })?;
                if customer.input.0 < provider.input.0 || customer.output.0 < provider.output.0 {
                    tracing::warn!(
                        model = %price.model,
                        file = %self.path.display(),
                        "the customer batch price is below the provider's: every batch item loses money"
                    );
                }
                Some(BatchPrice { provider, customer })
            }
        };
        Ok(ConfiguredPrice {
            model: price.model.clone(),
            provider: price.provider,
            customer,
            batch,
            limits: price.limits,
            source: price.source.clone(),
            origin: price.origin,
            family: None,
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
