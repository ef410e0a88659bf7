//! Importing a price map in the JSON format LiteLLM publishes
//! (`model_prices_and_context_window.json`): an object of model name → entry, each
//! with per-token prices, limits, its `mode` and its `litellm_provider`.
//!
//! Only chat models of a provider jobledger can call are taken: `anthropic` is served
//! by Anthropic, `openai` and the providers whose API is OpenAI's by the
//! OpenAI-compatible provider. Each is stored as a new price version when it differs
//! from the model's newest ([`super::store_price`]: never over a config file's price,
//! and never rewriting a version an attempt used). Everything else is skipped with the
//! reason, and each entry's fate is reported. Prices are read exactly as written: a
//! JSON number is the shortest decimal that names it, per token, times a million.

use super::{
    BatchPrice, BatchRates, ConfiguredPrice, ModelLimits, ModelPrice, PricePerMillion, Rates,
    Stored, built_in_batch, checked_marked_up, newest_versions, store_prices,
};
use crate::billing::Credits;
use entity::model_prices;
use entity::{PriceOrigin, ProviderFamily, Timestamp};
use rust_decimal::{Decimal, RoundingStrategy};
use sea_orm::{ConnectionTrait, DbErr};
use serde_json::{Map, Value};
use std::collections::HashMap;
use std::fmt;
use std::str::FromStr;

/// The entry of LiteLLM's file that describes the format rather than a model.
const DESCRIPTION_ENTRY: &str = "sample_spec";

/// LiteLLM providers whose chat API is OpenAI's: the OpenAI-compatible provider (or a
/// config file route, such as `"groq/*"` to a named provider) serves their models.
const OPENAI_COMPATIBLE: &[&str] = &[
    "openai",
    "deepseek",
    "groq",
    "mistral",
    "together_ai",
    "fireworks_ai",
    "openrouter",
    "xai",
    "deepinfra",
    "perplexity",
    "cerebras",
];

/// Longest model name taken, in characters.
const MAX_NAME_LENGTH: usize = 200;

/// Why an entry was not imported.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Skip {
    /// `sample_spec`: the format's own description.
    Description,
    /// Its `mode` is not `chat` (embeddings, images, audio, …).
    NotChat(String),
    /// Its `litellm_provider` is not one jobledger can call.
    Unroutable(String),
    /// A field is missing, of the wrong type, negative, zero or too large.
    Malformed(String),
    /// The name is given this many times in the file: which to take is not known.
    Duplicate(usize),
}

impl fmt::Display for Skip {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Description => f.write_str("describes the format, not a model"),
            Self::NotChat(mode) => write!(f, "mode {mode:?} is not chat"),
            Self::Unroutable(provider) => {
                write!(f, "provider {provider:?} is not one jobledger can call")
            }
            Self::Malformed(why) => f.write_str(why),
            Self::Duplicate(times) => {
                write!(f, "the name is given {times} times; none of them is taken")
            }
        }
    }
}

/// What became of one entry.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Outcome {
    Stored(Stored),
    Skipped(Skip),
}

/// What an import did, entry by entry (in name order).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ImportReport {
    pub entries: Vec<(String, Outcome)>,
}

impl ImportReport {
    fn count(&self, matches: impl Fn(&Outcome) -> bool) -> usize {
        self.entries
            .iter()
            .filter(|(_, outcome)| matches(outcome))
            .count()
    }
}

impl fmt::Display for ImportReport {
    /// One line per entry, `added NAME`, `new version NAME (version N)`, `unchanged
    /// NAME`, `kept NAME: …` or `skipped NAME: why`, then a summary line.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (name, outcome) in &self.entries {
            let name = name.escape_debug();
            match outcome {
                Outcome::Stored(Stored::Added) => writeln!(f, "added {name}")?,
                Outcome::Stored(Stored::NewVersion(version)) => {
                    writeln!(f, "new version {name} (version {version})")?;
                }
                Outcome::Stored(Stored::Unchanged) => writeln!(f, "unchanged {name}")?,
                Outcome::Stored(Stored::Kept(_)) => {
                    writeln!(f, "kept {name}: the config file prices it")?;
                }
                Outcome::Skipped(skip) => writeln!(f, "skipped {name}: {skip}")?,
            }
        }
        let skipped = |kind: fn(&Skip) -> bool| {
            self.count(|outcome| matches!(outcome, Outcome::Skipped(skip) if kind(skip)))
        };
        writeln!(
            f,
            "{} added, {} new versions, {} unchanged, {} kept for the config file, {} skipped ({} not chat, {} of a provider jobledger cannot call, {} malformed, {} given more than once)",
            self.count(|outcome| *outcome == Outcome::Stored(Stored::Added)),
            self.count(|outcome| matches!(outcome, Outcome::Stored(Stored::NewVersion(_)))),
            self.count(|outcome| *outcome == Outcome::Stored(Stored::Unchanged)),
            self.count(|outcome| matches!(outcome, Outcome::Stored(Stored::Kept(_)))),
            self.count(|outcome| matches!(outcome, Outcome::Skipped(_))),
            skipped(|skip| matches!(skip, Skip::NotChat(_))),
            skipped(|skip| matches!(skip, Skip::Unroutable(_))),
            skipped(|skip| matches!(skip, Skip::Malformed(_) | Skip::Description)),
            skipped(|skip| matches!(skip, Skip::Duplicate(_))),
        )
    }
}

/// One entry of a map: its model name, and its price or why it is skipped.
pub type Entry = (String, Result<Imported, Skip>);

/// An entry's price, with what the entry left out: those fields keep what the model's
/// newest version says, when it has one ([`import_prices`]).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Imported {
    pub price: ConfiguredPrice,
    pub given: Given,
    /// The customer price over the provider's, to price a field taken from the newest
    /// version.
    markup: Decimal,
}

/// Which of the fields an entry may leave out it gave.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Given {
    pub cached_input: bool,
    pub context_window: bool,
    pub max_output_tokens: bool,
}

/// Why a file cannot be imported at all (nothing was stored).
#[derive(Debug, thiserror::Error)]
pub enum MapError {
    #[error("not JSON: {0}")]
    Json(#[from] serde_json::Error),
    #[error("not a JSON object of model names")]
    NotAnObject,
}

/// The entries of a price map: each model's price, or why it is skipped. `markup` is
/// the customer price over the provider's; `source` names the file in each price.
/// Each entry is read on its own, so one that cannot be read (a number out of
/// range) is skipped, not the file; a name given twice is skipped every time.
pub fn parse_map(text: &str, markup: Decimal, source: &str) -> Result<Vec<Entry>, MapError> {
    let Ok(RawEntries(raw)) = serde_json::from_str::<RawEntries>(text) else {
        // Tell a file that is not JSON from JSON that is not an object.
        serde_json::from_str::<serde::de::IgnoredAny>(text)?;
        return Err(MapError::NotAnObject);
    };
    let mut times = std::collections::HashMap::<&str, usize>::new();
    for (name, _) in &raw {
        *times.entry(name.as_str()).or_default() += 1;
    }
    let mut entries: Vec<_> = raw
        .iter()
        .map(|(name, entry)| {
            let price = match times[name.as_str()] {
                1 => serde_json::from_str::<Value>(entry.get())
                    .map_err(|error| malformed(format!("the entry is not readable: {error}")))
                    .and_then(|entry| parse_entry(name, &entry, markup, source)),
                twice => Err(Skip::Duplicate(twice)),
            };
            (name.clone(), price)
        })
        .collect();
    // In name order, whatever order the file has: reports of one map compare.
    entries.sort_by(|(a, _), (b, _)| a.cmp(b));
    // A name given several times is reported once.
    entries.dedup_by(|(a, _), (b, _)| a == b);
    Ok(entries)
}

/// A map's entries in file order, every one kept, each still unread.
struct RawEntries(Vec<(String, Box<serde_json::value::RawValue>)>);

impl<'de> serde::Deserialize<'de> for RawEntries {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct Entries;
        impl<'de> serde::de::Visitor<'de> for Entries {
            type Value = RawEntries;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a JSON object of model names")
            }
            fn visit_map<A: serde::de::MapAccess<'de>>(
                self,
                mut map: A,
            ) -> Result<RawEntries, A::Error> {
                let mut entries = Vec::new();
                while let Some(entry) = map.next_entry()? {
                    entries.push(entry);
                }
                Ok(RawEntries(entries))
            }
        }
        deserializer.deserialize_map(Entries)
    }
}

/// Stores every price of `entries` that is new or changed. A field an entry left out
/// keeps what the model's newest version says: an entry without limits or a cache
/// price does not erase a built-in's. The newest versions are read once and the new
/// ones written many to a statement, so a map of many thousand models imports in
/// seconds.
pub async fn import_prices(
    db: &impl ConnectionTrait,
    entries: Vec<Entry>,
) -> Result<ImportReport, DbErr> {
    let now = Timestamp::now();
    let newest = newest_versions(db).await?;
    let mut outcomes = Vec::with_capacity(entries.len());
    let mut prices = Vec::new();
    for (name, price) in entries {
        let outcome = match price.and_then(|imported| completed(&newest, imported)) {
            Ok(price) => {
                prices.push(price);
                None
            }
            Err(skip) => Some(Outcome::Skipped(skip)),
        };
        outcomes.push((name, outcome));
    }
    let mut stored = store_prices(db, &prices, &newest, now).await?.into_iter();
    let mut report = ImportReport::default();
    for (name, outcome) in outcomes {
        let outcome = match outcome {
            Some(skipped) => skipped,
            None => Outcome::Stored(stored.next().expect("one outcome per price stored")),
        };
        report.entries.push((name, outcome));
    }
    Ok(report)
}

/// `imported`'s price, the fields its entry left out taken from the model's newest
/// version (a cache price no dearer than the new input price).
fn completed(
    newest: &HashMap<String, model_prices::Model>,
    imported: Imported,
) -> Result<ConfiguredPrice, Skip> {
    let Imported {
        mut price,
        given,
        markup,
    } = imported;
    let Some(newest) = newest.get(&price.model) else {
        return Ok(price);
    };
    let newest = ModelPrice::from(newest.clone());
    if !given.context_window {
        price.limits.context_window = newest.limits.context_window;
    }
    if !given.max_output_tokens {
        price.limits.max_output_tokens = newest.limits.max_output_tokens;
    }
    if !given.cached_input {
        if newest.provider.cached_input.0.nanos() < price.provider.input.0.nanos() {
            price.provider.cached_input = newest.provider.cached_input;
        }
        price.customer = checked_marked_up(&price.provider, markup)
            .ok_or_else(|| malformed("a customer price at the markup does not fit"))?;
    }
    Ok(price)
}

fn malformed(why: impl Into<String>) -> Skip {
    Skip::Malformed(why.into())
}

fn parse_entry(name: &str, entry: &Value, markup: Decimal, source: &str) -> Result<Imported, Skip> {
    if name == DESCRIPTION_ENTRY {
        return Err(Skip::Description);
    }
    let Value::Object(entry) = entry else {
        return Err(malformed("not a JSON object"));
    };
    if name.trim() != name
        || name.is_empty()
        || name.chars().count() > MAX_NAME_LENGTH
        || name.chars().any(char::is_control)
    {
        return Err(malformed(
            "the name is not a model name (empty, padded, too long or with control characters)",
        ));
    }
    match entry.get("mode") {
        Some(Value::String(mode)) if mode == "chat" => {}
        Some(Value::String(mode)) => return Err(Skip::NotChat(mode.clone())),
        Some(_) => return Err(malformed("mode is not a string")),
        None => return Err(Skip::NotChat("none given".to_owned())),
    }
    let provider = match entry.get("litellm_provider") {
        Some(Value::String(provider)) => provider.as_str(),
        Some(_) => return Err(malformed("litellm_provider is not a string")),
        None => return Err(malformed("litellm_provider is missing")),
    };
    let family = match provider {
        "anthropic" => ProviderFamily::Anthropic,
        provider if OPENAI_COMPATIBLE.contains(&provider) => ProviderFamily::OpenAi,
        provider => return Err(Skip::Unroutable(provider.to_owned())),
    };
    let rate = |field: &str| per_million(entry, field);
    let input = rate("input_cost_per_token")?
        .ok_or_else(|| malformed("input_cost_per_token is missing"))?;
    let output = rate("output_cost_per_token")?
        .ok_or_else(|| malformed("output_cost_per_token is missing"))?;
    for (field, rate) in [
        ("input_cost_per_token", input),
        ("output_cost_per_token", output),
    ] {
        if rate.0.nanos() == 0 {
            return Err(malformed(format!(
                "{field} is zero: a model that bills nothing is not priced here"
            )));
        }
    }
    let cached = rate("cache_read_input_token_cost")?;
    if cached.is_some_and(|cached| cached.0.nanos() > input.0.nanos()) {
        return Err(malformed(
            "cache_read_input_token_cost is above input_cost_per_token",
        ));
    }
    let provider_rates = Rates {
        input,
        // No cache price: the newest version's, or cached input billed as input,
        // never understated.
        cached_input: cached.unwrap_or(input),
        output,
    };
    let batch_rates = match (
        rate("input_cost_per_token_batches")?,
        rate("output_cost_per_token_batches")?,
    ) {
        (Some(input), Some(output)) => Some(BatchRates { input, output }),
        (None, None) => match provider {
            // Both batch APIs bill half the list price, as for the built-in models.
            "openai" | "anthropic" => Some(built_in_batch(&provider_rates)),
            _ => None,
        },
        _ => {
            return Err(malformed(
                "input_cost_per_token_batches and output_cost_per_token_batches come together",
            ));
        }
    };
    let too_large = || malformed("a customer price at the markup does not fit");
    let customer = checked_marked_up(&provider_rates, markup).ok_or_else(too_large)?;
    let batch = match batch_rates {
        Some(rates) => Some(BatchPrice {
            provider: rates,
            customer: rates.checked_marked_up(markup).ok_or_else(too_large)?,
        }),
        None => None,
    };
    let limits = ModelLimits {
        context_window: tokens(entry, "max_input_tokens")?,
        max_output_tokens: tokens(entry, "max_output_tokens")?,
    };
    let given = Given {
        cached_input: cached.is_some(),
        context_window: limits.context_window.is_some(),
        max_output_tokens: limits.max_output_tokens.is_some(),
    };
    let price = ConfiguredPrice {
        model: name.to_owned(),
        provider: provider_rates,
        customer,
        batch,
        limits,
        source: format!("LiteLLM price map {source} (litellm_provider {provider})"),
        origin: PriceOrigin::Import,
        family: Some(family),
    };
    Ok(Imported {
        price,
        given,
        markup,
    })
}

/// A per-token price as credits per million tokens, rounded up to the nano-credit
/// (never understated); `None` when absent or null.
fn per_million(entry: &Map<String, Value>, field: &str) -> Result<Option<PricePerMillion>, Skip> {
    let value = match entry.get(field) {
        None | Some(Value::Null) => return Ok(None),
        Some(Value::Number(number)) => number,
        Some(_) => return Err(malformed(format!("{field} is not a number"))),
    };
    let not_a_price = || malformed(format!("{field} is not a price: {value}"));
    let per_token = match value.as_i64() {
        Some(whole) => Decimal::from(whole),
        // f64's Display is the shortest decimal that reads back as the same number
        // (2.5e-06 → "0.0000025"), never in exponent notation.
        None => {
            let float = value.as_f64().ok_or_else(not_a_price)?;
            if !float.is_finite() {
                return Err(not_a_price());
            }
            Decimal::from_str(&float.to_string()).map_err(|_| not_a_price())?
        }
    };
    if per_token.is_sign_negative() && !per_token.is_zero() {
        return Err(malformed(format!("{field} is negative")));
    }
    let million = per_token
        .checked_mul(Decimal::from(1_000_000))
        .ok_or_else(not_a_price)?
        .round_dp_with_strategy(9, RoundingStrategy::AwayFromZero);
    Credits::from_decimal(million)
        .map(|credits| Some(PricePerMillion(credits)))
        .map_err(|_| not_a_price())
}

/// A token limit; `None` when absent or null. A whole float (8192.0) is taken.
fn tokens(entry: &Map<String, Value>, field: &str) -> Result<Option<u32>, Skip> {
    let value = match entry.get(field) {
        None | Some(Value::Null) => return Ok(None),
        Some(value) => value,
    };
    let whole = value.as_u64().or_else(|| {
        value
            .as_f64()
            .filter(|float| float.fract() == 0.0 && *float >= 1.0 && *float <= f64::from(u32::MAX))
            .map(|float| float as u64)
    });
    match whole.and_then(|tokens| u32::try_from(tokens).ok()) {
        Some(tokens) if tokens > 0 => Ok(Some(tokens)),
        _ => Err(malformed(format!(
            "{field} is not a positive whole number of tokens: {value}"
        ))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn parse(entry: Value) -> Result<ConfiguredPrice, Skip> {
        parse_entry("m", &entry, Decimal::from_str("1.25").unwrap(), "test.json")
            .map(|imported| imported.price)
    }

    fn chat(extra: Value) -> Value {
        let mut entry = json!({
            "mode": "chat", "litellm_provider": "openai",
            "input_cost_per_token": 2.5e-06, "output_cost_per_token": 1e-05,
        });
        entry
            .as_object_mut()
            .unwrap()
            .extend(extra.as_object().unwrap().clone());
        entry
    }

    fn nanos(rate: PricePerMillion) -> i64 {
        rate.0.nanos()
    }

    #[test]
    fn per_token_prices_are_read_exactly_per_million() {
        let price = parse(chat(json!({
            "cache_read_input_token_cost": 1.25e-06,
            "input_cost_per_token_batches": 1.25e-06, "output_cost_per_token_batches": 5e-06,
            "max_input_tokens": 128000, "max_output_tokens": 16384.0,
        })))
        .unwrap();
        assert_eq!(nanos(price.provider.input), 2_500_000_000);
        assert_eq!(nanos(price.provider.cached_input), 1_250_000_000);
        assert_eq!(nanos(price.provider.output), 10_000_000_000);
        assert_eq!(nanos(price.customer.input), 3_125_000_000);
        let batch = price.batch.unwrap();
        assert_eq!(nanos(batch.provider.output), 5_000_000_000);
        assert_eq!(nanos(batch.customer.output), 6_250_000_000);
        assert_eq!(price.limits.context_window, Some(128_000));
        assert_eq!(price.limits.max_output_tokens, Some(16_384));
        assert_eq!(price.family, Some(ProviderFamily::OpenAi));
        // A price finer than a nano-credit per million is rounded up.
        let fine = parse(chat(json!({"input_cost_per_token": 1.0000000001e-07}))).unwrap();
        assert_eq!(nanos(fine.provider.input), 100_000_001);
    }

    #[test]
    fn without_a_cache_or_batch_price_nothing_is_understated() {
        let price = parse(chat(json!({}))).unwrap();
        assert_eq!(price.provider.cached_input, price.provider.input);
        // OpenAI's and Anthropic's batch APIs bill half the list price.
        assert_eq!(nanos(price.batch.unwrap().provider.input), 1_250_000_000);
        let other = parse(chat(json!({"litellm_provider": "groq"}))).unwrap();
        assert_eq!(other.batch, None);
        assert_eq!(other.family, Some(ProviderFamily::OpenAi));
        let claude = parse(chat(json!({"litellm_provider": "anthropic"}))).unwrap();
        assert_eq!(claude.family, Some(ProviderFamily::Anthropic));
    }

    #[test]
    fn entries_that_cannot_run_are_skipped_saying_why() {
        let skip = |entry| parse(entry).unwrap_err();
        assert_eq!(
            skip(chat(json!({"mode": "embedding"}))),
            Skip::NotChat("embedding".into())
        );
        assert_eq!(
            skip(chat(json!({"litellm_provider": "bedrock"}))),
            Skip::Unroutable("bedrock".into())
        );
        for (extra, says) in [
            (json!({"input_cost_per_token": -1e-06}), "negative"),
            (json!({"output_cost_per_token": "0.00001"}), "not a number"),
            (json!({"input_cost_per_token": null}), "missing"),
            (json!({"input_cost_per_token": 1e300}), "not a price"),
            (json!({"max_output_tokens": 0}), "positive whole number"),
            (json!({"max_input_tokens": 1.5}), "positive whole number"),
            (
                json!({"input_cost_per_token_batches": 1e-06}),
                "come together",
            ),
            (json!({"litellm_provider": 7}), "not a string"),
        ] {
            match skip(chat(extra.clone())) {
                Skip::Malformed(why) => assert!(why.contains(says), "{extra}: {why}"),
                other => panic!("{extra}: {other:?}"),
            }
        }
        assert_eq!(
            parse_entry(DESCRIPTION_ENTRY, &chat(json!({})), Decimal::ONE, "f").map(|_| ()),
            Err(Skip::Description)
        );
        assert!(matches!(
            parse_entry(" padded", &chat(json!({})), Decimal::ONE, "f"),
            Err(Skip::Malformed(_))
        ));
        for (extra, says) in [
            (json!({"input_cost_per_token": 0}), "zero"),
            (json!({"output_cost_per_token": 0.0}), "zero"),
            (json!({"cache_read_input_token_cost": 1e-05}), "above"),
        ] {
            match skip(chat(extra.clone())) {
                Skip::Malformed(why) => assert!(why.contains(says), "{extra}: {why}"),
                other => panic!("{extra}: {other:?}"),
            }
        }
        assert!(matches!(
            parse_map("[1, 2]", Decimal::ONE, "f"),
            Err(MapError::NotAnObject)
        ));
    }

    #[test]
    fn one_unreadable_or_repeated_entry_is_skipped_not_the_file() {
        let entry = r#"{"mode": "chat", "litellm_provider": "openai", "input_cost_per_token": 1e-06, "output_cost_per_token": 2e-06}"#;
        let text = format!(
            r#"{{"good": {entry}, "huge": {{"input_cost_per_token": 1e400}}, "twice": {entry}, "twice": {entry}}}"#
        );
        let entries = parse_map(&text, Decimal::ONE, "f").unwrap();
        let names: Vec<_> = entries.iter().map(|(name, _)| name.as_str()).collect();
        assert_eq!(names, ["good", "huge", "twice"]);
        assert!(entries[0].1.is_ok());
        assert!(
            matches!(&entries[1].1, Err(Skip::Malformed(why)) if why.contains("not readable")),
            "{:?}",
            entries[1].1
        );
        assert_eq!(entries[2].1, Err(Skip::Duplicate(2)));
        assert!(matches!(
            parse_map("{", Decimal::ONE, "f"),
            Err(MapError::Json(_))
        ));
    }
}
