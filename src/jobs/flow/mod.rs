//! Flow control: per-minute budgets of requests and tokens for providers, models and
//! tenants, held across every process that shares the database.
//!
//! Each limited provider, model and tenant has a token bucket per resource in
//! `rate_limit_buckets`. A bucket holds one second's worth of its per-minute limit (at
//! least one request) and refills continuously, so a limit of 60 requests a minute
//! starts one call a second rather than 60 at once: providers enforce their minute
//! limits over shorter windows too. A job is admitted by one request and by its token
//! bound (prompt plus allowed output); a job larger than a full token bucket is
//! admitted when the bucket is full and leaves it in debt, so the average rate holds
//! and no job waits for ever. The claim takes what it admits in the transaction that
//! claims the jobs ([`storage`]), and a finished call gives back the tokens it did not
//! use. A job waiting for budget stays queued: it is not an attempt and costs nothing.
//!
//! A provider that answers 429 pauses its model for every worker until its
//! `Retry-After` (or [`DEFAULT_PAUSE`]).

mod admission;
mod bucket;
pub mod storage;

pub use admission::{Admission, Weighed};
pub use bucket::Bucket;

use crate::llm::ProviderRegistry;
use entity::Timestamp;
use std::collections::BTreeMap;
use std::num::NonZeroU32;
use std::time::Duration;
use uuid::Uuid;

/// How long a 429 without a usable `Retry-After` pauses its model.
pub const DEFAULT_PAUSE: Duration = Duration::from_secs(5);
/// The longest pause a provider's `Retry-After` can impose on a model.
pub const LONGEST_PAUSE: Duration = Duration::from_secs(600);

/// What may start per minute; `None` is no limit.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct RateLimit {
    pub requests_per_minute: Option<NonZeroU32>,
    pub tokens_per_minute: Option<NonZeroU32>,
}

impl RateLimit {
    /// A limit from the two per-minute counts as stored; zero or negative is no limit.
    pub fn from_counts(requests: Option<i32>, tokens: Option<i32>) -> Self {
        let count = |value: Option<i32>| {
            value
                .and_then(|value| u32::try_from(value).ok())
                .and_then(NonZeroU32::new)
        };
        Self {
            requests_per_minute: count(requests),
            tokens_per_minute: count(tokens),
        }
    }

    /// Whether this limits anything.
    pub fn is_limited(&self) -> bool {
        self.requests_per_minute.is_some() || self.tokens_per_minute.is_some()
    }
}

/// Whose budget a bucket holds.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Scope {
    Provider,
    Model,
    Tenant,
}

impl Scope {
    /// The name stored in `rate_limit_buckets.scope` and used as a metrics label.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Provider => "provider",
            Self::Model => "model",
            Self::Tenant => "tenant",
        }
    }
}

/// One bucket's identity: its scope and the provider's or model's name or tenant id.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct BucketKey {
    pub scope: Scope,
    pub key: String,
}

impl BucketKey {
    pub fn model(model: &str) -> Self {
        Self {
            scope: Scope::Model,
            key: model.to_owned(),
        }
    }

    pub fn provider(provider: &str) -> Self {
        Self {
            scope: Scope::Provider,
            key: provider.to_owned(),
        }
    }

    pub fn tenant(tenant_id: Uuid) -> Self {
        Self {
            scope: Scope::Tenant,
            key: tenant_id.to_string(),
        }
    }
}

/// The per-minute limits this process enforces on providers and models (the config
/// file's `requests_per_minute` and `tokens_per_minute`). Every process sharing a
/// database should read the same file: each admits by the limits it knows.
#[derive(Clone, Debug, Default)]
pub struct FlowLimits {
    models: BTreeMap<String, RateLimit>,
    providers: BTreeMap<String, RateLimit>,
    /// Which provider serves a model, for its provider's limit.
    routes: Option<ProviderRegistry>,
}

/// No limits: what a claim without a config file enforces.
pub static NO_LIMITS: FlowLimits = FlowLimits::none();

impl FlowLimits {
    /// No provider or model is limited.
    pub const fn none() -> Self {
        Self {
            models: BTreeMap::new(),
            providers: BTreeMap::new(),
            routes: None,
        }
    }

    /// Limits per model name and per provider name; `routes` tells which provider
    /// serves a model.
    pub fn new(
        models: BTreeMap<String, RateLimit>,
        providers: BTreeMap<String, RateLimit>,
        routes: ProviderRegistry,
    ) -> Self {
        let limited = |limits: BTreeMap<String, RateLimit>| {
            limits
                .into_iter()
                .filter(|(_, limit)| limit.is_limited())
                .collect()
        };
        Self {
            models: limited(models),
            providers: limited(providers),
            routes: Some(routes),
        }
    }

    /// Whether any provider or model is limited.
    pub fn is_empty(&self) -> bool {
        self.models.is_empty() && self.providers.is_empty()
    }

    /// The limited buckets a call of `model` takes from: its provider's, then its own.
    pub fn buckets_of(&self, model: &str) -> Vec<(BucketKey, RateLimit)> {
        let mut buckets = Vec::new();
        if !self.providers.is_empty()
            && let Some(provider) = self
                .routes
                .as_ref()
                .and_then(|routes| routes.provider_for(model))
            && let Some(limit) = self.providers.get(provider.name())
        {
            buckets.push((BucketKey::provider(provider.name()), *limit));
        }
        if let Some(limit) = self.models.get(model) {
            buckets.push((BucketKey::model(model), *limit));
        }
        buckets
    }
}

/// What kept a job queued at a claim.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Deferral {
    pub scope: Scope,
    pub reason: DeferralReason,
}

/// Which budget was short.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum DeferralReason {
    Requests,
    Tokens,
    /// The tenant already runs as many jobs as it may.
    Concurrency,
    /// The provider answered 429 for the model a moment ago.
    Paused,
    /// Another claim holds the budget's row right now (a claim never waits for one).
    Busy,
}

impl DeferralReason {
    /// The metrics label.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Requests => "requests",
            Self::Tokens => "tokens",
            Self::Concurrency => "concurrency",
            Self::Paused => "paused",
            Self::Busy => "busy",
        }
    }
}
/// What a finished call gives back to a bucket under `limit` that admitted it by its
/// `token_bound`: what the bucket counted less what the provider reported using (none
/// when the call cannot have been billed). A call whose usage is unknown gives nothing
/// back.
pub fn unused_tokens(limit: RateLimit, token_bound: Option<i64>, used: Option<u64>) -> f64 {
    match (token_bound, used) {
        (Some(bound), Some(used)) => {
            let counted = bucket::counted_tokens(limit, u64::try_from(bound).unwrap_or(0));
            (counted - used as f64).max(0.0)
        }
        _ => 0.0,
    }
}

/// The instant a model paused by a 429 may be called again: `Retry-After` if the
/// provider sent one (at most [`LONGEST_PAUSE`]), [`DEFAULT_PAUSE`] otherwise.
pub fn paused_until(now: Timestamp, retry_after: Option<Duration>) -> Timestamp {
    let pause = retry_after.unwrap_or(DEFAULT_PAUSE).min(LONGEST_PAUSE);
    now.plus(chrono::Duration::from_std(pause).unwrap_or(chrono::Duration::zero()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unused_tokens_go_back_only_when_usage_is_known() {
        let limit = RateLimit {
            requests_per_minute: None,
            tokens_per_minute: NonZeroU32::new(6_000),
        };
        assert_eq!(unused_tokens(limit, Some(1_000), Some(300)), 700.0);
        assert_eq!(unused_tokens(limit, Some(1_000), Some(0)), 1_000.0);
        assert_eq!(unused_tokens(limit, Some(1_000), None), 0.0);
        assert_eq!(unused_tokens(limit, None, Some(300)), 0.0);
        assert_eq!(unused_tokens(limit, Some(100), Some(300)), 0.0);
        // A bound above a minute's worth was counted as a minute's worth.
        assert_eq!(unused_tokens(limit, Some(240_000), Some(1_000)), 5_000.0);
    }
}
