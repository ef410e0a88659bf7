//! What a worker tells the flow control: a provider's 429 pauses the model for every
//! worker, and a finished call gives back the tokens it did not use.

use super::Worker;
use crate::jobs::flow::{self, BucketKey};
use crate::jobs::queue::{AttemptReport, Claim};
use entity::Timestamp;
use uuid::Uuid;

impl Worker {
    /// Holds off `model` for every worker until `until`, as its provider asked.
    pub(super) async fn pause_model(&self, model: &str, until: Timestamp) {
        tracing::warn!(model = %model, paused_until = %until.to_datetime().to_rfc3339(), "the provider rate-limited the model: pausing it for every worker");
        self.inner.metrics.model_paused(model);
        if let Err(error) =
            flow::storage::pause_model(&self.inner.db, model, until, Timestamp::now()).await
        {
            // The job's own retry still waits for the Retry-After.
            tracing::error!(model = %model, error = %error, "recording the model's pause failed");
        }
    }

    /// The buckets a finished call was admitted by that count tokens, each with what
    /// the call did not use of its bound.
    pub(super) fn unused_tokens(
        &self,
        claim: &Claim,
        report: &AttemptReport,
    ) -> Vec<(BucketKey, u64)> {
        let used = report
            .usage
            .map(|usage| usage.input_tokens.saturating_add(usage.output_tokens));
        let unused = flow::unused_tokens(claim.job.token_bound, used);
        if unused == 0 {
            return Vec::new();
        }
        let mut keys: Vec<BucketKey> = self
            .inner
            .settings
            .flow
            .buckets_of(&claim.job.model)
            .into_iter()
            .filter(|(_, limit)| limit.tokens_per_minute.is_some())
            .map(|(key, _)| key)
            .collect();
        if claim.tenant_rate.tokens_per_minute.is_some() {
            keys.push(BucketKey::tenant(claim.job.tenant_id));
        }
        keys.into_iter().map(|key| (key, unused)).collect()
    }

    /// Gives unused tokens back to their budgets. Best effort: a lost top-up only
    /// leaves a budget lower than it could be for a moment.
    pub(super) async fn give_back(&self, job_id: Uuid, unused: Vec<(BucketKey, u64)>) {
        for (key, tokens) in unused {
            if let Err(error) = flow::storage::give_back(&self.inner.db, &key, tokens).await {
                tracing::warn!(job.id = %job_id, bucket = %key.key, error = %error, "giving unused tokens back failed");
            }
        }
    }
}
