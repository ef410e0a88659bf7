//! The models a caller can run, with the caller's own prices: what a new-job form
//! offers, and what it may hold.

use super::scalars::Amount;
use super::{app, principal};
use crate::accounts::Principal;
use crate::billing::prices::BatchRates as BatchPriceRates;
use crate::billing::prices::{self, Rates};
use crate::error::ServiceError;
use async_graphql::{Context, Object, SimpleObject};
use entity::Timestamp;

/// Credits per million tokens.
#[derive(SimpleObject)]
pub struct ModelRates {
    pub input_per_million: Amount,
    /// Input tokens the provider served from its prompt cache.
    pub cached_input_per_million: Amount,
    pub output_per_million: Amount,
}

impl From<Rates> for ModelRates {
    fn from(rates: Rates) -> Self {
        Self {
            input_per_million: rates.input.0.into(),
            cached_input_per_million: rates.cached_input.0.into(),
            output_per_million: rates.output.0.into(),
        }
    }
}

/// Credits per million tokens of a provider batch.
#[derive(SimpleObject)]
pub struct BatchRates {
    pub input_per_million: Amount,
    pub output_per_million: Amount,
}

impl From<BatchPriceRates> for BatchRates {
    fn from(rates: BatchPriceRates) -> Self {
        Self {
            input_per_million: rates.input.0.into(),
            output_per_million: rates.output.0.into(),
        }
    }
}

/// A model the caller can run.
#[derive(SimpleObject)]
pub struct ModelInfo {
    pub name: String,
    /// Who answers its calls here (`openai`, `anthropic`, `simulator`, or a configured
    /// provider's name).
    pub provider: String,
    /// Input and output tokens one call may hold together; null when unknown.
    pub context_window: Option<i32>,
    /// The most `maxOutputTokens` a job of it may ask for; null when unknown.
    pub max_output_tokens: Option<i32>,
    /// The caller's price: what a tenant pays; for the admin, what the provider bills.
    pub price: ModelRates,
    /// The caller's price of an item of a PROVIDER_BATCH batch (the provider's batch
    /// API): what a tenant pays; for the admin, what the provider bills. Null when
    /// the model has no batch price (PROVIDER_BATCH is refused for it).
    pub batch_price: Option<BatchRates>,
    /// The admin only: what tenants pay for it.
    pub customer_price: Option<ModelRates>,
    /// The admin only: what tenants pay for a PROVIDER_BATCH item of it; null also
    /// when it has no batch price.
    pub customer_batch_price: Option<BatchRates>,
    /// Where its price and limits come from.
    pub source: String,
}

/// Reading the models.
#[derive(Default)]
pub struct ModelQuery;

#[Object]
impl ModelQuery {
    /// The models routed to a provider and priced now, by name. A tenant sees its own
    /// prices (what it pays); provider prices stay with the admin. Not an access
    /// token's (`FORBIDDEN`).
    async fn models(&self, context: &Context<'_>) -> async_graphql::Result<Vec<ModelInfo>> {
        let admin = match principal(context)? {
            Principal::Admin => true,
            Principal::Tenant { .. } => false,
            Principal::Token(_) => return Err(ServiceError::Forbidden.into()),
        };
        let app = app(context);
        let prices = prices::prices_at(&app.db, Timestamp::now())
            .await
            .map_err(ServiceError::from)?;
        Ok(prices
            .into_iter()
            .filter_map(|price| {
                let provider = app.providers.provider_for(&price.model)?;
                let tokens = |limit: Option<u32>| limit.and_then(|limit| i32::try_from(limit).ok());
                Some(ModelInfo {
                    provider: provider.name().to_owned(),
                    context_window: tokens(price.limits.context_window),
                    max_output_tokens: tokens(price.limits.max_output_tokens),
                    price: if admin {
                        price.provider
                    } else {
                        price.customer
                    }
                    .into(),
                    batch_price: price.batch.map(|batch| {
                        if admin {
                            batch.provider
                        } else {
                            batch.customer
                        }
                        .into()
                    }),
                    customer_price: admin.then(|| price.customer.into()),
                    customer_batch_price: price
                        .batch
                        .filter(|_| admin)
                        .map(|batch| batch.customer.into()),
                    source: price.source,
                    name: price.model,
                })
            })
            .collect())
    }
}
