//! The price list compiled into the binary: provider list prices of the current OpenAI
//! chat models (the GPT-4o and GPT-4.1 families, the o-series) and Anthropic's (Claude
//! 4.x, and 3.5 Haiku), each with where it comes from and as of when.

use super::{BatchRates, ConfiguredPrice, ListPrice, ModelLimits, PricePerMillion, Rates};
use crate::billing::Credits;
use entity::PriceOrigin;
use rust_decimal::Decimal;
use std::str::FromStr;

/// The factor the customer pays over the provider's price when no price says otherwise.
pub const DEFAULT_CUSTOMER_MARKUP: &str = "1.25";

/// Where the built-in OpenAI prices and limits come from.
const OPENAI_SOURCE: &str =
    "openai.com/api/pricing and the model pages, list prices as of 2026-12-02";
/// Where the prices and limits of the Anthropic models released after the pricing
/// page above was read come from: the price map LiteLLM publishes, which agrees with
/// that page on every model both list.
const ANTHROPIC_MAP_SOURCE: &str = "Anthropic list prices as LiteLLM's model_prices_and_context_window.json (litellm 1.110.2) gives them, as of 2026-12-02";
/// Where the built-in Anthropic prices and limits come from.
const ANTHROPIC_SOURCE: &str =
    "anthropic.com/pricing (cache reads at 0.1x input) and the models overview, as of 2026-12-02";

/// What a built-in model's batch price is of its list price: OpenAI's Batch API and
/// Anthropic's Message Batches both bill half the list price for input and output,
/// and every built-in model is one of theirs.
pub const BUILT_IN_BATCH_DISCOUNT: &str = "0.5";

/// Provider list prices in USD (one credit = one US dollar) per million tokens, and
/// limits in tokens: (model, input, cached input, output, context window, most output,
/// source).
const BUILT_IN_PRICES: &[(&str, &str, &str, &str, u32, u32, &str)] = &[
    (
        "gpt-4o-mini",
        "0.15",
        "0.075",
        "0.60",
        128_000,
        16_384,
        OPENAI_SOURCE,
    ),
    (
        "gpt-4o",
        "2.50",
        "1.25",
        "10.00",
        128_000,
        16_384,
        OPENAI_SOURCE,
    ),
    (
        "gpt-4.1",
        "2.00",
        "0.50",
        "8.00",
        1_047_576,
        32_768,
        OPENAI_SOURCE,
    ),
    (
        "gpt-4.1-mini",
        "0.40",
        "0.10",
        "1.60",
        1_047_576,
        32_768,
        OPENAI_SOURCE,
    ),
    (
        "gpt-4.1-nano",
        "0.10",
        "0.025",
        "0.40",
        1_047_576,
        32_768,
        OPENAI_SOURCE,
    ),
    (
        "o3",
        "2.00",
        "0.50",
        "8.00",
        200_000,
        100_000,
        OPENAI_SOURCE,
    ),
    (
        "o1",
        "15.00",
        "7.50",
        "60.00",
        200_000,
        100_000,
        OPENAI_SOURCE,
    ),
    (
        "o3-mini",
        "1.10",
        "0.55",
        "4.40",
        200_000,
        100_000,
        OPENAI_SOURCE,
    ),
    (
        "o4-mini",
        "1.10",
        "0.275",
        "4.40",
        200_000,
        100_000,
        OPENAI_SOURCE,
    ),
    (
        "claude-3-5-haiku-latest",
        "0.80",
        "0.08",
        "4.00",
        200_000,
        8_192,
        ANTHROPIC_SOURCE,
    ),
    (
        "claude-haiku-4-5",
        "1.00",
        "0.10",
        "5.00",
        200_000,
        64_000,
        ANTHROPIC_SOURCE,
    ),
    (
        "claude-sonnet-4-0",
        "3.00",
        "0.30",
        "15.00",
        200_000,
        64_000,
        ANTHROPIC_SOURCE,
    ),
    (
        "claude-sonnet-4-5",
        "3.00",
        "0.30",
        "15.00",
        200_000,
        64_000,
        ANTHROPIC_SOURCE,
    ),
    (
        "claude-opus-4-0",
        "15.00",
        "1.50",
        "75.00",
        200_000,
        32_000,
        ANTHROPIC_SOURCE,
    ),
    (
        "claude-opus-4-1",
        "15.00",
        "1.50",
        "75.00",
        200_000,
        32_000,
        ANTHROPIC_SOURCE,
    ),
    (
        "claude-opus-4-5",
        "5.00",
        "0.50",
        "25.00",
        200_000,
        64_000,
        ANTHROPIC_SOURCE,
    ),
    (
        "claude-opus-4-6",
        "5.00",
        "0.50",
        "25.00",
        1_000_000,
        128_000,
        ANTHROPIC_MAP_SOURCE,
    ),
    (
        "claude-opus-4-7",
        "5.00",
        "0.50",
        "25.00",
        1_000_000,
        128_000,
        ANTHROPIC_MAP_SOURCE,
    ),
    (
        "claude-opus-4-8",
        "5.00",
        "0.50",
        "25.00",
        1_000_000,
        128_000,
        ANTHROPIC_MAP_SOURCE,
    ),
    (
        "claude-sonnet-4-6",
        "3.00",
        "0.30",
        "15.00",
        1_000_000,
        128_000,
        ANTHROPIC_MAP_SOURCE,
    ),
];

/// The batch rates of a built-in model at `rates`, its list rates.
pub fn built_in_batch(rates: &Rates) -> BatchRates {
    let factor = Decimal::from_str(BUILT_IN_BATCH_DISCOUNT).expect("the discount is a decimal");
    BatchRates::discounted(rates, factor).expect("half a price fits")
}

/// The built-in provider list prices.
pub fn built_in_list() -> Vec<ListPrice> {
    BUILT_IN_PRICES
        .iter()
        .map(
            |(model, input, cached_input, output, context_window, max_output, source)| {
                let rate = |text: &str| {
                    let value = Decimal::from_str(text).expect("built-in prices are decimals");
                    PricePerMillion(Credits::from_decimal(value).expect("built-in prices fit"))
                };
                let provider = Rates {
                    input: rate(input),
                    cached_input: rate(cached_input),
                    output: rate(output),
                };
                ListPrice {
                    model: (*model).to_owned(),
                    provider,
                    batch: Some(built_in_batch(&provider)),
                    limits: ModelLimits {
                        context_window: Some(*context_window),
                        max_output_tokens: Some(*max_output),
                    },
                    source: (*source).to_owned(),
                    origin: PriceOrigin::BuiltIn,
                }
            },
        )
        .collect()
}

/// The built-in price list, with customer prices at `markup` times the provider's.
pub fn built_in_prices(markup: Decimal) -> Vec<ConfiguredPrice> {
    built_in_list()
        .iter()
        .map(|price| price.marked_up(markup))
        .collect()
}
#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_built_in_model_has_a_dated_source_and_a_batch_price() {
        let list = built_in_list();
        for model in [
            "gpt-4.1",
            "gpt-4.1-mini",
            "gpt-4.1-nano",
            "o1",
            "o3",
            "o3-mini",
            "o4-mini",
            "claude-opus-4-0",
            "claude-opus-4-1",
            "claude-opus-4-5",
            "claude-opus-4-6",
            "claude-opus-4-7",
            "claude-opus-4-8",
            "claude-sonnet-4-0",
            "claude-sonnet-4-5",
            "claude-sonnet-4-6",
            "claude-haiku-4-5",
        ] {
            assert!(
                list.iter().any(|price| price.model == model),
                "{model} is built in"
            );
        }
        for price in &list {
            assert!(
                price.source.contains("as of 2026-"),
                "{}: {}",
                price.model,
                price.source
            );
            assert!(price.batch.is_some(), "{}", price.model);
            assert!(
                price.provider.cached_input.0 <= price.provider.input.0,
                "{}",
                price.model
            );
        }
    }
}
