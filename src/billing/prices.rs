//! Model prices: what the provider bills us and what we bill the customer.
//!
//! Prices live in `model_prices` as versions. A price change inserts a new version; an
//! attempt stores the version it was priced with, so past rows never change.

use super::Credits;
use crate::llm::TokenUsage;
use entity::{Timestamp, model_prices};
use rust_decimal::Decimal;
use sea_orm::{
    ActiveValue::Set, ColumnTrait, ConnectionTrait, DbErr, EntityTrait, QueryFilter, QueryOrder,
};
use std::str::FromStr;
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

/// One version of one model's price, as stored.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ModelPrice {
    pub id: Uuid,
    pub model: String,
    pub version: i32,
    pub provider: Rates,
    pub customer: Rates,
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
}

impl From<model_prices::Model> for ModelPrice {
    fn from(row: model_prices::Model) -> Self {
        let rate = |nanos| PricePerMillion(Credits::from_nanos(nanos));
        Self {
            id: row.id,
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

/// A model's price as configured (built in or from a config file), before it is stored.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ConfiguredPrice {
    pub model: String,
    pub provider: Rates,
    pub customer: Rates,
    pub source: String,
}

/// The factor the customer pays over the provider's price when no price says otherwise.
pub const DEFAULT_CUSTOMER_MARKUP: &str = "1.25";

/// Provider list prices in USD (one credit = one US dollar) per million tokens:
/// (model, input, cached input, output, source).
const BUILT_IN_PRICES: &[(&str, &str, &str, &str, &str)] = &[
    (
        "gpt-4o-mini",
        "0.15",
        "0.075",
        "0.60",
        "openai.com/api/pricing, read 2026-11-30",
    ),
    (
        "gpt-4o",
        "2.50",
        "1.25",
        "10.00",
        "openai.com/api/pricing, read 2026-11-30",
    ),
    (
        "gpt-4.1-mini",
        "0.40",
        "0.10",
        "1.60",
        "openai.com/api/pricing, read 2026-11-30",
    ),
    (
        "claude-3-5-haiku-latest",
        "0.80",
        "0.08",
        "4.00",
        "anthropic.com/pricing (cache reads at 0.1x input), read 2026-11-30",
    ),
    (
        "claude-sonnet-4-5",
        "3.00",
        "0.30",
        "15.00",
        "anthropic.com/pricing (cache reads at 0.1x input), read 2026-11-30",
    ),
];

/// A provider's list price for one model, before a customer price policy applies.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ListPrice {
    pub model: String,
    pub provider: Rates,
    pub source: String,
}

impl ListPrice {
    /// The price with customer rates at `markup` times the provider's.
    pub fn marked_up(&self, markup: Decimal) -> ConfiguredPrice {
        ConfiguredPrice {
            model: self.model.clone(),
            provider: self.provider,
            customer: marked_up(&self.provider, markup),
            source: self.source.clone(),
        }
    }
}

/// The built-in provider list prices.
pub fn built_in_list() -> Vec<ListPrice> {
    BUILT_IN_PRICES
        .iter()
        .map(|(model, input, cached_input, output, source)| {
            let rate = |text: &str| {
                let value = Decimal::from_str(text).expect("built-in prices are decimals");
                PricePerMillion(Credits::from_decimal(value).expect("built-in prices fit"))
            };
            ListPrice {
                model: (*model).to_owned(),
                provider: Rates {
                    input: rate(input),
                    cached_input: rate(cached_input),
                    output: rate(output),
                },
                source: (*source).to_owned(),
            }
        })
        .collect()
}

/// The built-in price list, with customer prices at `markup` times the provider's.
pub fn built_in_prices(markup: Decimal) -> Vec<ConfiguredPrice> {
    built_in_list()
        .iter()
        .map(|price| price.marked_up(markup))
        .collect()
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

/// Stores each configured price as a new version when it differs from the model's
/// newest stored version. Several processes may do this at once: the unique
/// (model, version) index lets one of them win and the others skip.
pub async fn sync_prices(
    db: &impl ConnectionTrait,
    prices: &[ConfiguredPrice],
) -> Result<(), DbErr> {
    let now = Timestamp::now();
    for price in prices {
        let newest = model_prices::Entity::find()
            .filter(model_prices::Column::Model.eq(&price.model))
            .order_by_desc(model_prices::Column::Version)
            .one(db)
            .await?;
        if let Some(row) = &newest {
            let stored = ModelPrice::from(row.clone());
            if stored.provider == price.provider && stored.customer == price.customer {
                continue;
            }
        }
        let version = newest.map_or(1, |row| row.version + 1);
        let row = model_prices::ActiveModel {
            id: Set(Uuid::now_v7()),
            model: Set(price.model.clone()),
            version: Set(version),
            provider_input_nanos_per_million: Set(price.provider.input.0.nanos()),
            provider_cached_input_nanos_per_million: Set(price.provider.cached_input.0.nanos()),
            provider_output_nanos_per_million: Set(price.provider.output.0.nanos()),
            customer_input_nanos_per_million: Set(price.customer.input.0.nanos()),
            customer_cached_input_nanos_per_million: Set(price.customer.cached_input.0.nanos()),
            customer_output_nanos_per_million: Set(price.customer.output.0.nanos()),
            effective_from: Set(now),
            source: Set(price.source.clone()),
            created_at: Set(now),
        };
        match model_prices::Entity::insert(row).exec(db).await {
            Ok(_) => tracing::info!(model = %price.model, version, "stored a new price version"),
            Err(error) if crate::db::is_unique_violation(&error) => {}
            Err(error) => return Err(error),
        }
    }
    Ok(())
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

#[cfg(test)]
mod tests {
    use super::*;

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
