//! One try at a job.

use super::{AttemptOutcome, money, time, token_count};
use crate::graphql::scalars::Amount;
use async_graphql::Object;
use chrono::{DateTime, Utc};
use entity::attempts;
use uuid::Uuid;

/// One try at a job, with what the provider reported and what it cost.
pub struct Attempt(pub attempts::Model);

#[Object]
impl Attempt {
    /// The attempt's id, as `reconcileAttempt` takes it.
    async fn id(&self) -> Uuid {
        self.0.id
    }

    async fn number(&self) -> i32 {
        self.0.number
    }

    async fn outcome(&self) -> AttemptOutcome {
        self.0.outcome.into()
    }

    async fn error_code(&self) -> Option<super::JobErrorCode> {
        self.0.error_code.map(Into::into)
    }

    async fn error_message(&self) -> Option<&str> {
        self.0.error_message.as_deref()
    }

    async fn provider(&self) -> &str {
        &self.0.provider
    }

    /// The model the attempt called: the job's own, or one of its fallback models.
    async fn model(&self) -> &str {
        &self.0.model
    }

    async fn provider_request_id(&self) -> Option<&str> {
        self.0.provider_request_id.as_deref()
    }

    /// All input tokens, cached ones included.
    async fn input_tokens(&self) -> Option<i32> {
        token_count(self.0.input_tokens)
    }

    async fn cached_input_tokens(&self) -> Option<i32> {
        token_count(self.0.cached_input_tokens)
    }

    async fn output_tokens(&self) -> Option<i32> {
        token_count(self.0.output_tokens)
    }

    /// Exact provider cost; null while the outcome is unknown.
    async fn provider_cost(&self) -> Option<Amount> {
        self.0.provider_cost_nanos.map(money)
    }

    /// The most the attempt may have cost, while its exact cost is unknown.
    async fn provider_cost_upper_bound(&self) -> Option<Amount> {
        self.0.provider_cost_upper_bound_nanos.map(money)
    }

    /// What the customer pays for this attempt under the charging policy: the
    /// accepted answer's price, output already streamed, or — when the policy passes
    /// them on — the bound of a call whose outcome is unknown. While the attempt runs,
    /// what it would charge if it were lost. The job's charge is the sum, capped at its
    /// hold.
    async fn customer_charge(&self) -> Option<Amount> {
        self.0.customer_charge_nanos.map(money)
    }

    /// Output tokens streamed to the client before the call ended: exact when the
    /// provider reported usage, otherwise estimated as one per four bytes of text.
    async fn delivered_output_tokens(&self) -> Option<i32> {
        token_count(self.0.delivered_output_tokens)
    }

    async fn latency_ms(&self) -> Option<i64> {
        self.0.latency_ms
    }

    async fn started_at(&self) -> DateTime<Utc> {
        time(self.0.started_at)
    }

    async fn finished_at(&self) -> Option<DateTime<Utc>> {
        self.0.finished_at.map(time)
    }
}
