//! What a job is held for, and on which model it starts: computed once for
//! `createJob` and for `quoteJob`, so a quote is the hold the create then takes.

use super::fallbacks::ModelChain;
use super::flow;
use super::input::{self, Deadline, NewJob};
use crate::billing::{Credits, prices};
use crate::error::ServiceError;
use crate::llm::ProviderRegistry;
use entity::Timestamp;
use sea_orm::DatabaseConnection;

/// A job's hold and call bound, before anything is written.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct JobQuote {
    /// What the create holds: the dearest model of the chain under the charging policy.
    pub hold: Credits,
    /// The model the job starts on: its own, or a fallback when its own is paused.
    pub model: String,
    /// The most input tokens one call may use, over the models of the chain.
    pub input_token_bound: u64,
    pub max_output_tokens: u32,
    /// Input and output tokens together, over the chain: what rate limits count.
    pub token_bound: i64,
    /// Whether the built-in simulator serves the chain.
    pub simulated: bool,
    /// The price version each model of the chain was quoted at: what the job's
    /// attempts charge the customer at, whatever the prices do before they run.
    pub held_prices: prices::HeldPrices,
}

/// The quote of `new` as a create at `now` would compute it, without writing
/// anything: the same refusals (a deadline already passed among them, as for a key
/// not used before), and no idempotency key consumed. Balance and spend caps are not
/// checked: they are the create's, under the tenant's lock.
pub async fn quote_job(
    db: &DatabaseConnection,
    providers: &ProviderRegistry,
    new: &NewJob,
    now: Timestamp,
) -> Result<JobQuote, ServiceError> {
    if let Deadline::At(deadline) = new.deadline
        && deadline <= now
    {
        return Err(input::past_deadline());
    }
    quote(db, providers, new, now).await
}

/// [`quote_job`] without the deadline check, which a create makes first (a replay
/// of a key used before passes it).
pub(super) async fn quote(
    db: &DatabaseConnection,
    providers: &ProviderRegistry,
    new: &NewJob,
    now: Timestamp,
) -> Result<JobQuote, ServiceError> {
    let chain = ModelChain::new(new.model.clone(), new.fallback_models.clone());
    let simulated = providers.simulates(&new.model);
    // Any model of the chain may make any of the paid calls: the hold is sized for
    // the dearest, and every model must be able to take the call at all. Each
    // model's prompt is counted by the rule of the provider serving it.
    let mut hold = Credits::ZERO;
    let mut token_bound: i64 = 0;
    let mut input_token_bound: u64 = 0;
    let mut held_prices = prices::HeldPrices::default();
    for model in chain.models() {
        let Some(provider) = providers.provider_for(model) else {
            return Err(ServiceError::validation(format!(
                "model {model:?} is not served: no configured provider routes it"
            )));
        };
        // Each model's provider must take the parameters as they are: a field it does
        // not know, or a value of another type or range, is a 400 on every attempt.
        super::parameters::check_parameters_for(
            model,
            provider.request_shape(),
            &new.input.parameters,
        )?;
        // A worker simulates a job only if the API admitted it for the simulator:
        // a chain that mixed the two would fail its real or its simulated models.
        if providers.simulates(model) != simulated {
            return Err(ServiceError::validation(format!(
                "fallback model {model:?} is served by the simulator and {:?} is not, or the reverse",
                new.model
            )));
        }
        let price = prices::price_at(db, model, now).await?.ok_or_else(|| {
            ServiceError::validation(format!("model {model:?} has no price and cannot be run"))
        })?;
        let bound = new
            .input
            .call_bound(super::tokens::counting_for(providers, model), model);
        price.limits.check_call(model, bound)?;
        token_bound = Ord::max(token_bound, bound.tokens());
        input_token_bound = Ord::max(input_token_bound, bound.input_tokens);
        hold = hold.max(new.charging.job_hold(
            bound,
            &price,
            new.max_attempts,
            new.input.stream_output,
        ));
        held_prices.hold(&price);
    }
    Ok(JobQuote {
        hold,
        model: first_free_model(db, &chain, now).await?,
        input_token_bound,
        max_output_tokens: new.input.max_output_tokens,
        token_bound,
        simulated,
        held_prices,
    })
}

/// The model a new job starts on: its own, unless the provider paused it and a
/// fallback is free, as for a job already queued when the pause came
/// (`queue::move_off_paused_model`).
async fn first_free_model(
    db: &DatabaseConnection,
    chain: &ModelChain,
    now: Timestamp,
) -> Result<String, ServiceError> {
    let own = chain.own();
    if chain.fallbacks().is_empty() {
        return Ok(own.to_owned());
    }
    let paused = flow::storage::paused_models(db, chain.models(), now).await?;
    if !paused.iter().any(|(model, _)| model == own) {
        return Ok(own.to_owned());
    }
    Ok(chain
        .next(own, &paused, now)
        .filter(|next| next.paused_until.is_none())
        .map_or_else(|| own.to_owned(), |next| next.model))
}
