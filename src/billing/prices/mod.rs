//! Model prices: what the provider bills us and what we bill the customer.
//!
//! Prices live in `model_prices` as versions. A price change inserts a new version; an
//! attempt stores the version it was priced with, so past rows never change. Prices
//! come from the built-in list ([`built_in`]), the config file, and price maps an
//! operator imports ([`import`]); [`store`] decides which of them a new version may
//! replace. A job keeps the versions its hold was sized with ([`held`]): its customer
//! pays what it was quoted, and the provider cost is what the provider bills.

mod built_in;
mod held;
pub mod import;
pub mod routes;
mod store;

pub use built_in::{
    BUILT_IN_BATCH_DISCOUNT, DEFAULT_CUSTOMER_MARKUP, built_in_batch, built_in_list,
    built_in_prices,
};
pub use held::{HeldPrices, attempt_price};
pub use store::{Stored, newest_versions, store_price, store_prices, sync_prices};

use super::{CallBound, Credits};
use crate::error::ServiceError;
use crate::llm::TokenUsage;
use entity::{PriceOrigin, ProviderFamily, Timestamp, model_prices};
use rust_decimal::Decimal;
use sea_orm::{ColumnTrait, ConnectionTrait, DbErr, EntityTrait, QueryFilter, QueryOrder};
use uuid::Uuid;

/// Credits per million tokens.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct PricePerMillion(pub Credits);

impl PricePerMillion {
    /// The price of `tokens` tokens, rounded up to the nano-credit.
    pub fn cost(self, tokens: u64) -> Credits {
        let total = i128::from(self.0.nanos()) * i128::from(tokens);
        let nanos = (total + 999_999).div_euclid(1_000_000);
        Credits::from_nanos(i64::try_from(nanos).unwrap_or(i64::MAX))
    }

    /// The price multiplied by `factor`, rounded up to the nano-credit; `None` when
    /// the result does not fit.
    fn scaled(self, factor: Decimal) -> Option<Self> {
        let nanos = Decimal::from(self.0.nanos()).checked_mul(factor)?.ceil();
        i64::try_from(nanos)
            .ok()
            .map(|nanos| Self(Credits::from_nanos(nanos)))
    }
}

/// The three rates a model is billed by.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Rates {
    pub input: PricePerMillion,
    /// Input tokens served from the provider's prompt cache.
    pub cached_input: PricePerMillion,
    pub output: PricePerMillion,
}

impl Rates {
    /// What `usage` costs at these rates. Cached tokens are part of `input_tokens` and
    /// are priced once, at the cached rate.
    pub fn cost(&self, usage: &TokenUsage) -> Credits {
        let cached = usage.cached_input_tokens.min(usage.input_tokens);
        self.input.cost(usage.input_tokens - cached)
            + self.cached_input.cost(cached)
            + self.output.cost(usage.output_tokens)
    }
}

/// The two rates a provider batch is billed by (per million input and output tokens).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct BatchRates {
    pub input: PricePerMillion,
    pub output: PricePerMillion,
}

impl BatchRates {
    /// `rates` at the batch discount `factor` (0.5: half price), rounded up; `None`
    /// when a rate does not fit.
    fn discounted(rates: &Rates, factor: Decimal) -> Option<Self> {
        Some(Self {
            input: rates.input.scaled(factor)?,
            output: rates.output.scaled(factor)?,
        })
    }

    /// These rates at `markup` times (saturating at the largest amount).
    pub fn marked_up(&self, markup: Decimal) -> Self {
        let max = PricePerMillion(Credits::from_nanos(i64::MAX));
        Self {
            input: self.input.scaled(markup).unwrap_or(max),
            output: self.output.scaled(markup).unwrap_or(max),
        }
    }

    /// These rates at `markup` times, or `None` when one does not fit.
    pub fn checked_marked_up(&self, markup: Decimal) -> Option<Self> {
        Some(Self {
            input: self.input.scaled(markup)?,
            output: self.output.scaled(markup)?,
        })
    }

    /// Explicit customer `rates` carried over to a batch: each at the discount the
    /// provider's batch rate gives on its list rate (`list` → `self`), rounded up, so
    /// the customer keeps the margin the explicit price gives. A list rate of zero
    /// gives no discount to carry: the customer's rate stays as it is.
    pub fn carried_over(&self, list: &Rates, customer: &Rates) -> Option<Self> {
        let carry = |batch: PricePerMillion, list: PricePerMillion, customer: PricePerMillion| {
            if list.0.nanos() == 0 {
                return Some(customer);
            }
            let factor =
                Decimal::from(batch.0.nanos()).checked_div(Decimal::from(list.0.nanos()))?;
            customer.scaled(factor)
        };
        Some(Self {
            input: carry(self.input, list.input, customer.input)?,
            output: carry(self.output, list.output, customer.output)?,
        })
    }
}

/// A model's batch price: what the provider's batch API bills us, and what the
/// customer pays for a PROVIDER_BATCH item.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BatchPrice {
    pub provider: BatchRates,
    pub customer: BatchRates,
}

impl BatchPrice {
    fn from_columns(
        provider_input: Option<i64>,
        provider_output: Option<i64>,
        customer_input: Option<i64>,
        customer_output: Option<i64>,
    ) -> Option<Self> {
        let rate = |nanos| PricePerMillion(Credits::from_nanos(nanos));
        Some(Self {
            provider: BatchRates {
                input: rate(provider_input?),
                output: rate(provider_output?),
            },
            customer: BatchRates {
                input: rate(customer_input?),
                output: rate(customer_output?),
            },
        })
    }
}

/// What one call of a model may hold: known for the built-in models, unknown (no
/// check) for a model whose price says nothing of them.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ModelLimits {
    /// Input and output tokens together.
    pub context_window: Option<u32>,
    /// Output tokens one call may ask for.
    pub max_output_tokens: Option<u32>,
}

impl ModelLimits {
    /// `Validation` when the call `bound` cannot be made of the model: it asks for
    /// more output than the model writes, or its prompt and output do not fit in the
    /// context window. Checked before anything is held, since the provider would
    /// refuse every attempt. The prompt counts at its estimate: exactly its tokens
    /// where the model's tokenizer counted it; where only a bytes bound is known
    /// (several times a document's tokens, which would refuse documents that fit), a
    /// quarter of its bytes, a document's usual count.
    pub fn check_call(&self, model: &str, bound: CallBound) -> Result<(), ServiceError> {
        self.check_output(model, bound.max_output_tokens)?;
        if let Some(window) = self.context_window {
            let needed = bound.input_estimate.saturating_add(bound.max_output_tokens);
            if needed > u64::from(window) {
                return Err(ServiceError::validation(format!(
                    "the input counts {} tokens and maxOutputTokens is {}: {needed} in all, above the {window}-token context window of {model:?}",
                    bound.input_estimate, bound.max_output_tokens
                )));
            }
        }
        Ok(())
    }

    /// `Validation` when a call asking for `max_output_tokens` cannot be made of the
    /// model (a batch checks its settings' output before any item exists).
    pub fn check_output(&self, model: &str, max_output_tokens: u64) -> Result<(), ServiceError> {
        let refused = |limit: u32| {
            ServiceError::validation(format!(
                "maxOutputTokens is {max_output_tokens}, above the {limit} tokens {model:?} can write in one call"
            ))
        };
        if let Some(limit) = self.max_output_tokens
            && max_output_tokens > u64::from(limit)
        {
            return Err(refused(limit));
        }
        // Output counts against the window too: a window smaller than the output limit
        // (none of the built-ins) bounds the output alone.
        if let Some(window) = self.context_window
            && max_output_tokens >= u64::from(window)
        {
            return Err(refused(window));
        }
        Ok(())
    }

    fn from_columns(context_window: Option<i64>, max_output_tokens: Option<i64>) -> Self {
        let tokens = |column: Option<i64>| column.and_then(|value| u32::try_from(value).ok());
        Self {
            context_window: tokens(context_window),
            max_output_tokens: tokens(max_output_tokens),
        }
    }
}

/// One version of one model's price, as stored — or, for an attempt of a job held at an
/// older version, the version in force with the held one's customer rates
/// ([`ModelPrice::charged_at`]).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ModelPrice {
    pub id: Uuid,
    pub model: String,
    pub version: i32,
    pub provider: Rates,
    pub customer: Rates,
    /// `None`: the model has no batch price and refuses PROVIDER_BATCH.
    pub batch: Option<BatchPrice>,
    pub limits: ModelLimits,
    pub source: String,
    /// The version the customer rates (and customer batch rates) are of: `id` itself
    /// for a version as stored, the job's held version after [`Self::charged_at`].
    pub customer_version: Uuid,
}

impl ModelPrice {
    /// What the provider bills for `usage`.
    pub fn provider_cost(&self, usage: &TokenUsage) -> Credits {
        self.provider.cost(usage)
    }

    /// What the customer pays for `usage`, before the cap at the job's hold.
    pub fn customer_charge(&self, usage: &TokenUsage) -> Credits {
        self.customer.cost(usage)
    }

    /// This version (the one in force, which the provider bills by) with the customer
    /// rates of `held`, the version a job's hold was sized with: the customer pays
    /// what it was quoted, whatever the price did since. A held version without a
    /// batch price leaves the batch's customer rates as they are (a PROVIDER_BATCH
    /// item is only ever held at a version with one).
    pub fn charged_at(self, held: &Self) -> Self {
        let batch = self.batch.map(|batch| BatchPrice {
            customer: held.batch.map_or(batch.customer, |held| held.customer),
            ..batch
        });
        Self {
            customer: held.customer,
            batch,
            customer_version: held.id,
            ..self
        }
    }

    /// This version as a PROVIDER_BATCH item is billed by: the batch rates on both
    /// sides, in place of the list and customer rates (same id: an attempt still
    /// names the version it was priced with, and `attempts.provider_batch_id` tells
    /// that it went through the batch API). Cached input tokens are priced as input:
    /// batch prices carry no cached rate, so the cost is never understated. `None`
    /// when the model has no batch price.
    pub fn batch_view(&self) -> Option<Self> {
        let batch = self.batch?;
        let rates = |rates: BatchRates| Rates {
            input: rates.input,
            cached_input: rates.input,
            output: rates.output,
        };
        Some(Self {
            provider: rates(batch.provider),
            customer: rates(batch.customer),
            ..self.clone()
        })
    }
}

impl From<model_prices::Model> for ModelPrice {
    fn from(row: model_prices::Model) -> Self {
        let rate = |nanos| PricePerMillion(Credits::from_nanos(nanos));
        Self {
            id: row.id,
            customer_version: row.id,
            limits: ModelLimits::from_columns(row.context_window, row.max_output_tokens),
            batch: BatchPrice::from_columns(
                row.provider_batch_input_nanos_per_million,
                row.provider_batch_output_nanos_per_million,
                row.customer_batch_input_nanos_per_million,
                row.customer_batch_output_nanos_per_million,
            ),
            source: row.source,
            model: row.model,
            version: row.version,
            provider: Rates {
                input: rate(row.provider_input_nanos_per_million),
                cached_input: rate(row.provider_cached_input_nanos_per_million),
                output: rate(row.provider_output_nanos_per_million),
            },
            customer: Rates {
                input: rate(row.customer_input_nanos_per_million),
                cached_input: rate(row.customer_cached_input_nanos_per_million),
                output: rate(row.customer_output_nanos_per_million),
            },
        }
    }
}

/// A model's price as configured (built in, from a config file or from an imported
/// price map), before it is stored.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ConfiguredPrice {
    pub model: String,
    pub provider: Rates,
    pub customer: Rates,
    pub batch: Option<BatchPrice>,
    pub limits: ModelLimits,
    pub source: String,
    pub origin: PriceOrigin,
    /// The family serving the model, when its name does not tell (an imported model);
    /// `None`: by its name.
    pub family: Option<ProviderFamily>,
}

/// A provider's list price for one model, before a customer price policy applies.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ListPrice {
    pub model: String,
    pub provider: Rates,
    /// What the provider's batch API bills; `None`: it has none for this model.
    pub batch: Option<BatchRates>,
    pub limits: ModelLimits,
    pub source: String,
    pub origin: PriceOrigin,
}

impl ListPrice {
    /// The price with customer rates (batch rates too) at `markup` times the
    /// provider's.
    pub fn marked_up(&self, markup: Decimal) -> ConfiguredPrice {
        ConfiguredPrice {
            model: self.model.clone(),
            provider: self.provider,
            customer: marked_up(&self.provider, markup),
            batch: self.batch.map(|batch| BatchPrice {
                provider: batch,
                customer: batch.marked_up(markup),
            }),
            limits: self.limits,
            source: self.source.clone(),
            origin: self.origin,
            family: None,
        }
    }
}

/// Customer rates at `markup` times the provider's rates (saturating at the largest
/// amount; `checked_marked_up` says when that would happen).
pub fn marked_up(provider: &Rates, markup: Decimal) -> Rates {
    let max = PricePerMillion(Credits::from_nanos(i64::MAX));
    Rates {
        input: provider.input.scaled(markup).unwrap_or(max),
        cached_input: provider.cached_input.scaled(markup).unwrap_or(max),
        output: provider.output.scaled(markup).unwrap_or(max),
    }
}

/// Customer rates at `markup` times the provider's rates, or `None` when one does not
/// fit in an amount of credits.
pub fn checked_marked_up(provider: &Rates, markup: Decimal) -> Option<Rates> {
    Some(Rates {
        input: provider.input.scaled(markup)?,
        cached_input: provider.cached_input.scaled(markup)?,
        output: provider.output.scaled(markup)?,
    })
}

/// The price in force for `model` at `at`: the newest version already effective.
pub async fn price_at(
    db: &impl ConnectionTrait,
    model: &str,
    at: Timestamp,
) -> Result<Option<ModelPrice>, DbErr> {
    Ok(model_prices::Entity::find()
        .filter(model_prices::Column::Model.eq(model))
        .filter(model_prices::Column::EffectiveFrom.lte(at))
        .order_by_desc(model_prices::Column::Version)
        .one(db)
        .await?
        .map(ModelPrice::from))
}

/// The stored versions among `ids`, by id; an id no version has is missing.
pub async fn versions(
    db: &impl ConnectionTrait,
    ids: impl IntoIterator<Item = Uuid>,
) -> Result<std::collections::HashMap<Uuid, ModelPrice>, DbErr> {
    Ok(model_prices::Entity::find()
        .filter(model_prices::Column::Id.is_in(ids))
        .all(db)
        .await?
        .into_iter()
        .map(|row| (row.id, ModelPrice::from(row)))
        .collect())
}

/// The price in force at `at` of every model that has one, by model name. The table
/// holds a few versions per model, so it is read whole.
pub async fn prices_at(db: &impl ConnectionTrait, at: Timestamp) -> Result<Vec<ModelPrice>, DbErr> {
    let rows = model_prices::Entity::find()
        .filter(model_prices::Column::EffectiveFrom.lte(at))
        .order_by_asc(model_prices::Column::Model)
        .order_by_desc(model_prices::Column::Version)
        .all(db)
        .await?;
    let mut newest: Vec<ModelPrice> = Vec::new();
    for row in rows {
        if newest.last().is_none_or(|price| price.model != row.model) {
            newest.push(ModelPrice::from(row));
        }
    }
    Ok(newest)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::str::FromStr;

    fn per_million(text: &str) -> PricePerMillion {
        PricePerMillion(Credits::from_decimal(Decimal::from_str(text).unwrap()).unwrap())
    }

    #[test]
    fn a_cost_rounds_up_to_the_nano_credit() {
        // 0.15 per million is 150 nano-credits a token.
        assert_eq!(per_million("0.15").cost(1).nanos(), 150);
        assert_eq!(per_million("0.15").cost(1_000_000).nanos(), 150_000_000);
        assert_eq!(per_million("0.15").cost(0).nanos(), 0);
        // 0.000001 per million is a thousandth of a nano a token: any use costs a whole nano.
        assert_eq!(per_million("0.000001").cost(1).nanos(), 1);
        assert_eq!(per_million("0.000001").cost(1_001).nanos(), 2);
    }

    #[test]
    fn cached_tokens_are_priced_once_at_the_cached_rate() {
        let rates = Rates {
            input: per_million("1"),
            cached_input: per_million("0.1"),
            output: per_million("2"),
        };
        let usage = TokenUsage {
            input_tokens: 1_000_000,
            cached_input_tokens: 400_000,
            output_tokens: 500_000,
        };
        // 600k uncached at 1, 400k cached at 0.1, 500k output at 2.
        assert_eq!(rates.cost(&usage).to_string(), "1.64");
    }

    #[test]
    fn the_markup_rounds_customer_rates_up() {
        let customer = marked_up(
            &Rates {
                input: per_million("0.15"),
                cached_input: per_million("0.075"),
                output: per_million("0.6"),
            },
            Decimal::from_str("1.25").unwrap(),
        );
        assert_eq!(customer.input, per_million("0.1875"));
        assert_eq!(customer.cached_input, per_million("0.09375"));
        assert_eq!(customer.output, per_million("0.75"));
    }
}
