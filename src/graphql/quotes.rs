//! `quoteJob`: what `createJob` would hold for an input, asked before submitting it
//! (the console's new-job form shows it as the input changes).

use super::mutation::{CreateJobInput, new_job};
use super::scalars::Amount;
use super::{app, principal};
use crate::accounts::access_tokens::AccessScope;
use crate::jobs::quote;
use async_graphql::{Context, Object, SimpleObject};
use entity::Timestamp;

/// What a job of this input would be held for, computed as `createJob` computes it.
#[derive(SimpleObject)]
pub struct JobQuote {
    /// The credit `createJob` would hold now (prices change: a later create may
    /// hold another amount).
    pub hold: Amount,
    /// The model the job would start on: its own, or a fallback while its own is paused.
    pub model: String,
    /// The most input tokens one call may use, over the models of the chain.
    pub input_token_bound: i32,
    pub max_output_tokens: i32,
}

/// The quote of a job.
#[derive(Default)]
pub struct QuoteQuery;

#[Object]
impl QuoteQuery {
    /// What `createJob` would hold for `input`, with the same `VALIDATION` refusals,
    /// writing nothing: the idempotency key is checked but not used up, and neither
    /// the balance nor spend caps are checked. An access token needs `CREATE_JOBS`.
    async fn quote_job(
        &self,
        context: &Context<'_>,
        input: CreateJobInput,
    ) -> async_graphql::Result<JobQuote> {
        let (_, reach) = principal(context)?.job_access(AccessScope::CreateJobs)?;
        let new = new_job(context, &reach, input).await?;
        let app = app(context);
        let quote = quote::quote_job(&app.db, &app.providers, &new, Timestamp::now()).await?;
        let int = |value: u64| i32::try_from(value).unwrap_or(i32::MAX);
        Ok(JobQuote {
            hold: quote.hold.into(),
            model: quote.model,
            input_token_bound: int(quote.input_token_bound),
            max_output_tokens: int(u64::from(quote.max_output_tokens)),
        })
    }
}
