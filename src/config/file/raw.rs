//! The config file as written: what serde reads from the TOML before any check. Every
//! table refuses keys it does not know, so that a typo is an error.

use serde::Deserialize;
use serde::de::{self, Visitor};
use std::collections::BTreeMap;
use std::fmt;

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawFile {
    pub(super) customer_markup: Option<RawNumber>,
    pub(super) default_deadline_seconds: Option<i64>,
    #[serde(default)]
    pub(super) providers: BTreeMap<String, RawProvider>,
    #[serde(default)]
    pub(super) routes: BTreeMap<String, String>,
    #[serde(default)]
    pub(super) models: BTreeMap<String, RawModel>,
    #[serde(default)]
    pub(super) charging: RawCharging,
}

#[derive(Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawCharging {
    pub(super) unknown_outcome: Option<String>,
    pub(super) cancelled_during_call: Option<String>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawProvider {
    pub(super) kind: String,
    pub(super) base_url: Option<String>,
    pub(super) api_key_env: Option<String>,
    /// Accepted by the parser only to refuse it without quoting the value.
    pub(super) api_key: Option<de::IgnoredAny>,
    pub(super) requests_per_minute: Option<i64>,
    pub(super) tokens_per_minute: Option<i64>,
    pub(super) tokens_counted: Option<String>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawModel {
    pub(super) provider: Option<String>,
    pub(super) price: Option<RawRates>,
    pub(super) customer_price: Option<RawRates>,
    pub(super) customer_markup: Option<RawNumber>,
    pub(super) batch_price: Option<RawBatchRates>,
    pub(super) customer_batch_price: Option<RawBatchRates>,
    pub(super) source: Option<String>,
    pub(super) requests_per_minute: Option<i64>,
    pub(super) tokens_per_minute: Option<i64>,
    pub(super) tokens_counted: Option<String>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawRates {
    pub(super) input: RawNumber,
    /// Defaults to `input`: no discount for cached tokens.
    pub(super) cached_input: Option<RawNumber>,
    pub(super) output: RawNumber,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawBatchRates {
    pub(super) input: RawNumber,
    pub(super) output: RawNumber,
}

/// A number as written: a decimal string, a TOML integer, or a TOML float (refused
/// with a hint, because a float cannot hold most decimal prices exactly).
pub(super) enum RawNumber {
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
