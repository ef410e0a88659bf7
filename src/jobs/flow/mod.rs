//! Flow control: per-minute budgets of requests and tokens for providers, models and
//! tenants, held across every process that shares the database.
//!
//! Each limited provider, model and tenant has a token bucket per resource in
//! `rate_limit_buckets`. A bucket holds one second's worth of its per-minute limit (at
//! least one request) and refills continuously, so a limit of 60 requests a minute
//! starts one call a second rather than 60 at once: providers enforce their minute
//! limits over shorter windows too. A job is admitted by one request and by its token
//! bound (prompt plus allowed output) while the token bucket is not in debt, whatever
//! the bound; the call may leave it in debt, which refill pays back before any other
//! call starts, so the average rate holds and a large job never waits for a full
//! bucket that small jobs keep from filling. The claim takes what it admits in the transaction that
//! claims the jobs ([`storage`]), and a finished call gives back the tokens it did not
//! use. A job waiting for budget stays queued: it is not an attempt and costs nothing.
//!
//! A provider that answers 429 pauses its model for every worker until its
//! `Retry-After` (or [`DEFAULT_PAUSE`]), and then lets its calls ramp back up over
//! [`RAMP`] ([`ramp_limit`]) instead of letting every worker call at once.

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
/// The shortest pause a 429 imposes on a model, whatever its `Retry-After` says (a
/// `Retry-After: 0` with a 429 is still a provider over its limit).
pub const SHORTEST_PAUSE: Duration = Duration::from_secs(1);
/// The longest pause a provider's `Retry-After` can impose on a model.
pub const LONGEST_PAUSE: Duration = Duration::from_secs(600);
/// How long a model's calls ramp back up after its pause ends.
pub const RAMP: Duration = Duration::from_secs(10);

/// What may start per minute; `None` is no limit.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct RateLimit {
    pub requests_per_minute: Option<NonZeroU32>,
    pub tokens_per_minute: Option<NonZeroU32>,
    /// How the provider counts a call's tokens; `None`: as the model's provider says,
    /// and [`TokenCounting::Used`] when nothing says.
    pub tokens_counted: Option<TokenCounting>,
}

/// How a provider counts a call against its tokens-per-minute limit, which decides
/// what a finished call gives back to its bucket.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum TokenCounting {
    /// By the tokens the call used (Anthropic counts output tokens as they are made):
    /// what the call did not use goes back, all of it when it cannot have been billed.
    #[default]
    Used,
    /// By what the request may use, counted when it arrives, answered or refused
    /// (OpenAI counts the prompt's estimate plus `max_tokens`, and counts refused
    /// requests too): a call that reached the provider gives nothing back, so the
    /// bucket never admits more than the provider's own count allows.
    Requested,
}

impl TokenCounting {
    /// The config file's spelling.
    pub fn parse(value: &str) -> Option<Self> {
        match value {
            "used" => Some(Self::Used),
            "requested" => Some(Self::Requested),
            _ => None,
        }
    }
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
            tokens_counted: None,
        }
    }

    /// Whether this limits anything.
    pub fn is_limited(&self) -> bool {
        self.requests_per_minute.is_some() || self.tokens_per_minute.is_some()
    }
}

pub use entity::BucketScope;

/// One bucket's identity: its scope and the provider's or model's name or tenant id.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct BucketKey {
    pub scope: BucketScope,
    pub key: String,
}

impl BucketKey {
    pub fn model(model: &str) -> Self {
        Self {
            scope: BucketScope::Model,
            key: model.to_owned(),
        }
    }

    pub fn provider(provider: &str) -> Self {
        Self {
            scope: BucketScope::Provider,
            key: provider.to_owned(),
        }
    }

    pub fn tenant(tenant_id: Uuid) -> Self {
        Self {
            scope: BucketScope::Tenant,
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
    /// How each provider that says so counts tokens, limited or not: its models'
    /// buckets count the same way unless a model says otherwise.
    provider_counting: BTreeMap<String, TokenCounting>,
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
            provider_counting: BTreeMap::new(),
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
        let provider_counting = providers
            .iter()
            .filter_map(|(name, limit)| Some((name.clone(), limit.tokens_counted?)))
            .collect();
        Self {
            models: limited(models),
            providers: limited(providers),
            provider_counting,
            routes: Some(routes),
        }
    }

    /// Whether any provider or model is limited.
    pub fn is_empty(&self) -> bool {
        self.models.is_empty() && self.providers.is_empty()
    }

    /// The limited buckets a call of `model` takes from: its provider's, then its own,
    /// each with how its tokens are counted settled.
    pub fn buckets_of(&self, model: &str) -> Vec<(BucketKey, RateLimit)> {
        let mut buckets = Vec::new();
        let provider = self
            .routes
            .as_ref()
            .and_then(|routes| routes.provider_for(model))
            .map(|provider| provider.name().to_owned());
        let provider = provider.as_deref();
        let provider_counting = provider
            .and_then(|name| self.provider_counting.get(name))
            .copied()
            .unwrap_or_default();
        if let Some(provider) = provider
            && let Some(limit) = self.providers.get(provider)
        {
            let limit = RateLimit {
                tokens_counted: Some(provider_counting),
                ..*limit
            };
            buckets.push((BucketKey::provider(provider), limit));
        }
        if let Some(limit) = self.models.get(model) {
            let limit = RateLimit {
                tokens_counted: Some(limit.tokens_counted.unwrap_or(provider_counting)),
                ..*limit
            };
            buckets.push((BucketKey::model(model), limit));
        }
        buckets
    }
}

impl FlowLimits {
    /// The buckets a call of `model` takes from while the model ramps back up after a
    /// pause, admitting at most `ramp` requests a minute ([`ramp_limit`]): its own
    /// bucket — one just for the ramp when the model has no limits — counts the lower
    /// of its requests limit and the ramp.
    pub fn ramping_buckets_of(
        &self,
        model: &str,
        ramp: Option<NonZeroU32>,
    ) -> Vec<(BucketKey, RateLimit)> {
        let mut buckets = self.buckets_of(model);
        let Some(ramp) = ramp else {
            return buckets;
        };
        match buckets
            .iter_mut()
            .find(|(key, _)| key.scope == BucketScope::Model)
        {
            Some((_, limit)) => {
                limit.requests_per_minute = Some(
                    limit
                        .requests_per_minute
                        .map_or(ramp, |configured| configured.min(ramp)),
                );
            }
            None => buckets.push((
                BucketKey::model(model),
                RateLimit {
                    requests_per_minute: Some(ramp),
                    ..RateLimit::default()
                },
            )),
        }
        buckets
    }
}

/// The requests a minute a model paused until `paused_until` may start at `now` while
/// it ramps back up: one call in the first second after the pause, twice as many in
/// each second after that (a slow start: a provider still over its limit answers the
/// first calls with another 429, not a burst from every worker), and no bound from
/// the ramp once [`RAMP`] is over. `None` while paused or after the ramp.
pub fn ramp_limit(paused_until: Timestamp, now: Timestamp) -> Option<NonZeroU32> {
    let since = now.micros() - paused_until.micros();
    let ramp = i64::try_from(RAMP.as_micros()).unwrap_or(i64::MAX);
    if !(0..ramp).contains(&since) {
        return None;
    }
    let second = u32::try_from(since / 1_000_000).unwrap_or(u32::MAX);
    NonZeroU32::new(60_u32.checked_shl(second).unwrap_or(u32::MAX))
}

/// What kept a job queued at a claim.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Deferral {
    pub scope: BucketScope,
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
/// How a finished call used the tokens its buckets counted.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CallUse {
    /// The request never reached the provider.
    NotSent,
    /// The provider refused it: it cannot have been billed.
    Refused,
    /// The provider reported this many tokens used.
    Used(u64),
    /// Sent, and what it used is not known.
    Unknown,
}

/// What a finished call gives back to a bucket under `limit` that admitted it by its
/// `token_bound`: what the bucket counted less what the provider counts for the call.
/// A provider that counts used tokens counts none for a refused call; one that counts
/// requested tokens counts the whole bound of any call that reached it. A call whose
/// usage is unknown gives nothing back.
pub fn unused_tokens(limit: RateLimit, token_bound: Option<i64>, call: CallUse) -> f64 {
    let Some(bound) = token_bound else {
        return 0.0;
    };
    let counted = bucket::counted_tokens(limit, u64::try_from(bound).unwrap_or(0));
    let provider_counts = match (limit.tokens_counted.unwrap_or_default(), call) {
        (_, CallUse::NotSent) => 0,
        (TokenCounting::Used, CallUse::Refused) => 0,
        (TokenCounting::Used, CallUse::Used(used)) => used,
        (TokenCounting::Used, CallUse::Unknown) | (TokenCounting::Requested, _) => {
            return 0.0;
        }
    };
    (counted - provider_counts as f64).max(0.0)
}

/// Whether an error answer pauses its model for every worker: a rate limit always; an
/// overloaded provider (503, Anthropic's 529) when it says how long to wait, since it
/// would tell every worker the same. Without a `Retry-After` an overload may be one
/// busy replica, and the job's own backoff is enough.
pub fn pauses_model(status: u16, retry_after: Option<Duration>) -> bool {
    status == 429 || (matches!(status, 503 | 529) && retry_after.is_some())
}

/// The instant a model paused by a 429 may be called again: `Retry-After` if the
/// provider sent one (from [`SHORTEST_PAUSE`] to [`LONGEST_PAUSE`]), [`DEFAULT_PAUSE`]
/// otherwise.
pub fn paused_until(now: Timestamp, retry_after: Option<Duration>) -> Timestamp {
    let pause = retry_after
        .unwrap_or(DEFAULT_PAUSE)
        .clamp(SHORTEST_PAUSE, LONGEST_PAUSE);
    now.plus(chrono::Duration::from_std(pause).unwrap_or(chrono::Duration::zero()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unused_tokens_go_back_only_when_usage_is_known() {
        let limit = RateLimit {
            tokens_per_minute: NonZeroU32::new(6_000),
            ..RateLimit::default()
        };
        assert_eq!(unused_tokens(limit, Some(1_000), CallUse::Used(300)), 700.0);
        assert_eq!(unused_tokens(limit, Some(1_000), CallUse::Refused), 1_000.0);
        assert_eq!(unused_tokens(limit, Some(1_000), CallUse::NotSent), 1_000.0);
        assert_eq!(unused_tokens(limit, Some(1_000), CallUse::Unknown), 0.0);
        assert_eq!(unused_tokens(limit, None, CallUse::Used(300)), 0.0);
        assert_eq!(unused_tokens(limit, Some(100), CallUse::Used(300)), 0.0);
        // A bound above a minute's worth was counted as a minute's worth.
        assert_eq!(
            unused_tokens(limit, Some(240_000), CallUse::Used(1_000)),
            5_000.0
        );
    }

    #[test]
    fn a_provider_counting_requested_tokens_keeps_the_bound_of_every_call_it_saw() {
        let limit = RateLimit {
            tokens_per_minute: NonZeroU32::new(6_000),
            tokens_counted: Some(TokenCounting::Requested),
            ..RateLimit::default()
        };
        assert_eq!(unused_tokens(limit, Some(1_000), CallUse::Used(300)), 0.0);
        assert_eq!(unused_tokens(limit, Some(1_000), CallUse::Refused), 0.0);
        assert_eq!(unused_tokens(limit, Some(1_000), CallUse::Unknown), 0.0);
        assert_eq!(unused_tokens(limit, Some(1_000), CallUse::NotSent), 1_000.0);
    }

    #[test]
    fn a_pause_lasts_from_one_second_to_ten_minutes() {
        let now = Timestamp(1_000_000_000);
        let pause = |retry_after: Option<u64>| {
            (paused_until(now, retry_after.map(Duration::from_secs)).0 - now.0) / 1_000_000
        };
        assert_eq!(pause(None), 5);
        assert_eq!(pause(Some(0)), 1, "a zero Retry-After still pauses");
        assert_eq!(pause(Some(30)), 30);
        assert_eq!(pause(Some(86_400)), 600);
    }

    #[test]
    fn a_rate_limit_or_an_overload_with_a_retry_after_pauses_the_model() {
        let wait = Some(Duration::from_secs(3));
        assert!(pauses_model(429, None));
        assert!(pauses_model(429, wait));
        assert!(pauses_model(503, wait));
        assert!(pauses_model(529, wait));
        assert!(!pauses_model(503, None));
        assert!(!pauses_model(529, None));
        assert!(!pauses_model(500, wait));
        assert!(!pauses_model(502, wait));
    }

    #[test]
    fn a_paused_model_ramps_up_from_one_call_a_second() {
        let end = Timestamp(100_000_000);
        let at = |seconds: f64| Timestamp(end.0 + (seconds * 1_000_000.0) as i64);
        let ramp = |seconds| ramp_limit(end, at(seconds)).map(NonZeroU32::get);
        assert_eq!(ramp(-0.5), None, "still paused");
        assert_eq!(ramp(0.0), Some(60));
        assert_eq!(ramp(0.9), Some(60));
        assert_eq!(ramp(1.0), Some(120));
        assert_eq!(ramp(9.5), Some(60 << 9));
        assert_eq!(ramp(10.0), None, "ramped up");
    }

    #[test]
    fn a_ramp_lowers_a_models_requests_limit_or_gives_it_one() {
        let limits = FlowLimits::new(
            BTreeMap::from([(
                "limited".to_owned(),
                RateLimit {
                    requests_per_minute: NonZeroU32::new(90),
                    tokens_per_minute: NonZeroU32::new(6_000),
                    tokens_counted: None,
                },
            )]),
            BTreeMap::new(),
            ProviderRegistry::new(None),
        );
        let requests = |model: &str, ramp: u32| {
            limits
                .ramping_buckets_of(model, NonZeroU32::new(ramp))
                .into_iter()
                .map(|(key, limit)| {
                    (
                        key.key,
                        limit.requests_per_minute.map(NonZeroU32::get),
                        limit.tokens_per_minute.map(NonZeroU32::get),
                    )
                })
                .collect::<Vec<_>>()
        };
        assert_eq!(
            requests("limited", 60),
            [("limited".to_owned(), Some(60), Some(6_000))]
        );
        assert_eq!(
            requests("limited", 120),
            [("limited".to_owned(), Some(90), Some(6_000))]
        );
        assert_eq!(requests("free", 60), [("free".to_owned(), Some(60), None)]);
        assert!(limits.ramping_buckets_of("free", None).is_empty());
    }

    #[test]
    fn a_model_counts_tokens_as_its_provider_unless_it_says_otherwise() {
        use crate::llm::openai::OpenAiClient;
        use crate::llm::routing::ModelPattern;
        let limited = RateLimit {
            tokens_per_minute: NonZeroU32::new(6_000),
            ..RateLimit::default()
        };
        let openai = OpenAiClient::new("openai", "http://127.0.0.1:9/v1", None);
        let routes = ProviderRegistry::new(None).route_pattern(
            &ModelPattern::Prefix("gpt-".to_owned()),
            std::sync::Arc::new(openai),
        );
        let limits = FlowLimits::new(
            BTreeMap::from([
                ("gpt-a".to_owned(), limited),
                (
                    "gpt-b".to_owned(),
                    RateLimit {
                        tokens_counted: Some(TokenCounting::Used),
                        ..limited
                    },
                ),
                ("other".to_owned(), limited),
            ]),
            // The provider limits nothing itself; its way of counting still applies.
            BTreeMap::from([(
                "openai".to_owned(),
                RateLimit {
                    tokens_counted: Some(TokenCounting::Requested),
                    ..RateLimit::default()
                },
            )]),
            routes,
        );
        let counting = |model: &str| {
            limits
                .buckets_of(model)
                .into_iter()
                .map(|(key, limit)| (key.scope, limit.tokens_counted))
                .collect::<Vec<_>>()
        };
        assert_eq!(
            counting("gpt-a"),
            [(BucketScope::Model, Some(TokenCounting::Requested))]
        );
        assert_eq!(
            counting("gpt-b"),
            [(BucketScope::Model, Some(TokenCounting::Used))]
        );
        // No provider serves it: counted as used.
        assert_eq!(
            counting("other"),
            [(BucketScope::Model, Some(TokenCounting::Used))]
        );
    }
}
