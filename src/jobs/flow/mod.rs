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
//! claims the jobs ([`buckets`]), and a finished call gives back the tokens it did not
//! use. A job waiting for budget stays queued: it is not an attempt and costs nothing.
//!
//! A provider that answers 429 pauses its model for every worker until its
//! `Retry-After` (or [`DEFAULT_PAUSE`]).

pub mod buckets;

use crate::llm::ProviderRegistry;
use entity::{Timestamp, rate_limit_buckets};
use std::collections::{BTreeMap, HashMap};
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
}

impl DeferralReason {
    /// The metrics label.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Requests => "requests",
            Self::Tokens => "tokens",
            Self::Concurrency => "concurrency",
            Self::Paused => "paused",
        }
    }
}

/// One bucket's budgets at an instant.
#[derive(Clone, Debug, PartialEq)]
pub struct Bucket {
    limit: RateLimit,
    requests: f64,
    tokens: f64,
    refilled_at: Timestamp,
    /// Something was taken: the level must be written back.
    taken: bool,
}

fn per_second(per_minute: Option<NonZeroU32>) -> Option<f64> {
    per_minute.map(|count| f64::from(count.get()) / 60.0)
}

impl Bucket {
    /// The bucket `row` left (a full one when there is none), refilled up to `now`
    /// under `limit`.
    pub fn refilled(
        row: Option<&rate_limit_buckets::Model>,
        limit: RateLimit,
        now: Timestamp,
    ) -> Self {
        let full = Self::full(limit, now);
        let Some(row) = row else {
            return full;
        };
        // Another process's clock may run ahead: time never flows backwards here, and
        // the write keeps the later instant (see `refilled_at`).
        let elapsed = (now.micros() - row.refilled_at.micros()).max(0) as f64 / 1_000_000.0;
        let refill = |level: Option<f64>, rate: Option<f64>, capacity: f64| match (level, rate) {
            (Some(level), Some(rate)) if level.is_finite() => {
                (level + elapsed * rate).min(capacity)
            }
            _ => capacity,
        };
        Self {
            limit,
            requests: refill(
                row.requests,
                per_second(limit.requests_per_minute),
                full.requests,
            ),
            tokens: refill(row.tokens, per_second(limit.tokens_per_minute), full.tokens),
            refilled_at: Ord::max(now, row.refilled_at),
            taken: false,
        }
    }

    fn full(limit: RateLimit, now: Timestamp) -> Self {
        Self {
            limit,
            requests: request_capacity(limit),
            tokens: token_capacity(limit),
            refilled_at: now,
            taken: false,
        }
    }

    /// Why a call of `tokens` cannot start now, if it cannot.
    pub fn shortage(&self, tokens: u64) -> Option<DeferralReason> {
        if self.limit.requests_per_minute.is_some() && self.requests < 1.0 {
            return Some(DeferralReason::Requests);
        }
        if self.limit.tokens_per_minute.is_some()
            && self.tokens < tokens as f64
            && self.tokens < token_capacity(self.limit)
        {
            return Some(DeferralReason::Tokens);
        }
        None
    }

    /// Whether no call at all can start now.
    pub fn is_spent(&self) -> bool {
        self.shortage(1).is_some()
    }

    /// Takes one call of `tokens`.
    pub fn take(&mut self, tokens: u64) {
        if self.limit.requests_per_minute.is_some() {
            self.requests -= 1.0;
        }
        if self.limit.tokens_per_minute.is_some() {
            self.tokens -= tokens as f64;
        }
        self.taken = true;
    }

    /// Whether anything was taken since it was read.
    pub fn was_taken(&self) -> bool {
        self.taken
    }

    /// Requests left, `None` when requests are not limited.
    pub fn requests(&self) -> Option<f64> {
        self.limit.requests_per_minute.map(|_| self.requests)
    }

    /// Tokens left, `None` when tokens are not limited.
    pub fn tokens(&self) -> Option<f64> {
        self.limit.tokens_per_minute.map(|_| self.tokens)
    }

    /// The instant the levels are for.
    pub fn refilled_at(&self) -> Timestamp {
        self.refilled_at
    }
}

/// One second's worth of the request limit, and at least one request.
fn request_capacity(limit: RateLimit) -> f64 {
    per_second(limit.requests_per_minute).map_or(f64::INFINITY, |rate| rate.max(1.0))
}

/// One second's worth of the token limit, and at least one token.
pub fn token_capacity(limit: RateLimit) -> f64 {
    per_second(limit.tokens_per_minute).map_or(f64::INFINITY, |rate| rate.max(1.0))
}

/// A queued job as the claim weighs it.
#[derive(Clone, Debug)]
pub struct Weighed<'a> {
    pub tenant_id: Uuid,
    pub model: &'a str,
    pub tokens: u64,
}

/// The budgets one claim admits jobs against: the buckets it locked, refilled to the
/// claim's instant, and the running slots each tenant has left.
#[derive(Debug, Default)]
pub struct Admission {
    buckets: HashMap<BucketKey, Bucket>,
    /// Which buckets each model and tenant takes from.
    model_buckets: HashMap<String, Vec<BucketKey>>,
    tenant_buckets: HashMap<Uuid, BucketKey>,
    /// Jobs each tenant may still start, when its concurrency is bounded.
    tenant_slots: HashMap<Uuid, u32>,
    /// Buckets a job was refused by in this claim: no later job overtakes it there, or
    /// small calls would keep a large one from ever finding the bucket full.
    closed: HashMap<BucketKey, DeferralReason>,
}

impl Admission {
    /// Budgets for calls of `models` and jobs of the `tenants` with their limits.
    /// `rows` are the stored buckets (locked by the caller); `running` is how many jobs
    /// each tenant runs, when `tenant_concurrency` bounds it.
    pub fn new<'a>(
        flow: &FlowLimits,
        models: impl IntoIterator<Item = &'a str>,
        tenants: &[(Uuid, RateLimit)],
        rows: &[rate_limit_buckets::Model],
        tenant_concurrency: Option<u32>,
        running: &HashMap<Uuid, u32>,
        now: Timestamp,
    ) -> Self {
        let stored: HashMap<(&str, &str), &rate_limit_buckets::Model> = rows
            .iter()
            .map(|row| ((row.scope.as_str(), row.key.as_str()), row))
            .collect();
        let mut admission = Self::default();
        let add = |admission: &mut Self, key: &BucketKey, limit: RateLimit| {
            admission.buckets.entry(key.clone()).or_insert_with(|| {
                let row = stored.get(&(key.scope.as_str(), key.key.as_str())).copied();
                Bucket::refilled(row, limit, now)
            });
        };
        for model in models {
            if admission.model_buckets.contains_key(model) {
                continue;
            }
            let keys = flow
                .buckets_of(model)
                .into_iter()
                .map(|(key, limit)| {
                    add(&mut admission, &key, limit);
                    key
                })
                .collect();
            admission.model_buckets.insert(model.to_owned(), keys);
        }
        for (tenant_id, limit) in tenants {
            if limit.is_limited() {
                let key = BucketKey::tenant(*tenant_id);
                add(&mut admission, &key, *limit);
                admission.tenant_buckets.insert(*tenant_id, key);
            }
            if let Some(bound) = tenant_concurrency {
                let busy = running.get(tenant_id).copied().unwrap_or(0);
                admission
                    .tenant_slots
                    .insert(*tenant_id, bound.saturating_sub(busy));
            }
        }
        admission
    }

    /// Why no job of `model` can start now, if none can.
    pub fn model_blocked(&self, model: &str) -> Option<Deferral> {
        self.model_buckets
            .get(model)?
            .iter()
            .find(|key| self.buckets[*key].is_spent())
            .map(|key| Deferral {
                scope: key.scope,
                reason: self.buckets[key]
                    .shortage(1)
                    .unwrap_or(DeferralReason::Requests),
            })
    }

    /// Why no job of `tenant_id` can start now, if none can.
    pub fn tenant_blocked(&self, tenant_id: Uuid) -> Option<Deferral> {
        if self.tenant_slots.get(&tenant_id) == Some(&0) {
            return Some(Deferral {
                scope: Scope::Tenant,
                reason: DeferralReason::Concurrency,
            });
        }
        let bucket = &self.buckets[self.tenant_buckets.get(&tenant_id)?];
        bucket.shortage(1).map(|reason| Deferral {
            scope: Scope::Tenant,
            reason,
        })
    }

    /// Takes `job`'s call from every budget it counts against, or tells which one is
    /// short and takes nothing.
    pub fn admit(&mut self, job: &Weighed<'_>) -> Result<(), Deferral> {
        if self.tenant_slots.get(&job.tenant_id) == Some(&0) {
            return Err(Deferral {
                scope: Scope::Tenant,
                reason: DeferralReason::Concurrency,
            });
        }
        let keys: Vec<&BucketKey> = self
            .model_buckets
            .get(job.model)
            .into_iter()
            .flatten()
            .chain(self.tenant_buckets.get(&job.tenant_id))
            .collect();
        for key in &keys {
            let shortage = self
                .closed
                .get(*key)
                .copied()
                .or_else(|| self.buckets[*key].shortage(job.tokens));
            if let Some(reason) = shortage {
                self.closed.insert((*key).clone(), reason);
                return Err(Deferral {
                    scope: key.scope,
                    reason,
                });
            }
        }
        let keys: Vec<BucketKey> = keys.into_iter().cloned().collect();
        for key in keys {
            if let Some(bucket) = self.buckets.get_mut(&key) {
                bucket.take(job.tokens);
            }
        }
        if let Some(slots) = self.tenant_slots.get_mut(&job.tenant_id) {
            *slots -= 1;
        }
        Ok(())
    }

    /// The buckets something was taken from, to be written back.
    pub fn taken(&self) -> Vec<(&BucketKey, &Bucket)> {
        let mut taken: Vec<_> = self
            .buckets
            .iter()
            .filter(|(_, bucket)| bucket.was_taken())
            .collect();
        taken.sort_by(|a, b| a.0.cmp(b.0));
        taken
    }
}

/// Tokens a finished call gives back to the buckets it was admitted by: its bound less
/// what the provider reported using. A call whose usage is unknown gives nothing back.
pub fn unused_tokens(token_bound: Option<i64>, used: Option<u64>) -> u64 {
    match (token_bound, used) {
        (Some(bound), Some(used)) => u64::try_from(bound).unwrap_or(0).saturating_sub(used),
        _ => 0,
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

    fn limit(requests: Option<u32>, tokens: Option<u32>) -> RateLimit {
        RateLimit {
            requests_per_minute: requests.and_then(NonZeroU32::new),
            tokens_per_minute: tokens.and_then(NonZeroU32::new),
        }
    }

    fn at(seconds: f64) -> Timestamp {
        Timestamp((seconds * 1_000_000.0) as i64)
    }

    fn row(requests: Option<f64>, tokens: Option<f64>, seconds: f64) -> rate_limit_buckets::Model {
        rate_limit_buckets::Model {
            scope: "model".into(),
            key: "m".into(),
            requests,
            tokens,
            refilled_at: at(seconds),
            paused_until: None,
        }
    }

    #[test]
    fn sixty_requests_a_minute_start_one_call_a_second() {
        let limit = limit(Some(60), None);
        let mut bucket = Bucket::refilled(None, limit, at(100.0));
        assert_eq!(bucket.shortage(1), None);
        bucket.take(1);
        assert_eq!(bucket.shortage(1), Some(DeferralReason::Requests));
        let stored = row(bucket.requests(), bucket.tokens(), 100.0);
        let half = Bucket::refilled(Some(&stored), limit, at(100.5));
        assert_eq!(half.shortage(1), Some(DeferralReason::Requests));
        let second = Bucket::refilled(Some(&stored), limit, at(101.0));
        assert_eq!(second.shortage(1), None);
        // An idle minute does not save up sixty calls.
        let idle = Bucket::refilled(Some(&stored), limit, at(160.0));
        assert_eq!(idle.requests(), Some(1.0));
    }

    #[test]
    fn a_call_larger_than_the_bucket_waits_for_a_full_one_and_leaves_debt() {
        let limit = limit(None, Some(6_000)); // 100 tokens a second
        let mut bucket = Bucket::refilled(None, limit, at(0.0));
        assert_eq!(bucket.shortage(500), None, "a full bucket admits any call");
        bucket.take(500);
        assert_eq!(bucket.tokens(), Some(-400.0));
        let stored = row(None, bucket.tokens(), 0.0);
        assert_eq!(
            Bucket::refilled(Some(&stored), limit, at(4.9)).shortage(500),
            Some(DeferralReason::Tokens)
        );
        assert_eq!(
            Bucket::refilled(Some(&stored), limit, at(4.5)).shortage(50),
            None,
            "a small call fits in what refilled"
        );
        assert_eq!(
            Bucket::refilled(Some(&stored), limit, at(5.0)).shortage(500),
            None
        );
    }

    #[test]
    fn a_clock_behind_never_refills_and_never_moves_the_refill_back() {
        let limit = limit(Some(60), None);
        let stored = row(Some(0.0), None, 10.0);
        let behind = Bucket::refilled(Some(&stored), limit, at(9.0));
        assert_eq!(behind.requests(), Some(0.0));
        assert_eq!(behind.refilled_at(), at(10.0));
    }

    #[test]
    fn a_lowered_limit_caps_what_was_left() {
        let stored = row(Some(50.0), None, 0.0);
        let bucket = Bucket::refilled(Some(&stored), limit(Some(60), None), at(1.0));
        assert_eq!(bucket.requests(), Some(1.0));
    }

    #[test]
    fn admission_takes_from_model_and_tenant_and_counts_running_slots() {
        let mut models = BTreeMap::new();
        models.insert("m".to_owned(), limit(Some(120), None)); // two a second
        let flow = FlowLimits::new(models, BTreeMap::new(), ProviderRegistry::new(None));
        let busy_tenant = Uuid::from_u128(1);
        let limited_tenant = Uuid::from_u128(2);
        let running = HashMap::from([(busy_tenant, 2)]);
        let mut admission = Admission::new(
            &flow,
            ["m", "free"],
            &[
                (busy_tenant, RateLimit::default()),
                (limited_tenant, limit(Some(60), None)),
            ],
            &[],
            Some(3),
            &running,
            at(0.0),
        );
        let job = |tenant_id, model| Weighed {
            tenant_id,
            model,
            tokens: 10,
        };
        assert_eq!(admission.admit(&job(busy_tenant, "m")), Ok(()));
        let concurrency = Deferral {
            scope: Scope::Tenant,
            reason: DeferralReason::Concurrency,
        };
        assert_eq!(admission.admit(&job(busy_tenant, "free")), Err(concurrency));
        assert_eq!(admission.tenant_blocked(busy_tenant), Some(concurrency));
        assert_eq!(admission.admit(&job(limited_tenant, "m")), Ok(()));
        assert_eq!(
            admission.admit(&job(limited_tenant, "free")),
            Err(Deferral {
                scope: Scope::Tenant,
                reason: DeferralReason::Requests
            })
        );
        assert_eq!(
            admission.model_blocked("m"),
            Some(Deferral {
                scope: Scope::Model,
                reason: DeferralReason::Requests
            })
        );
        assert_eq!(admission.model_blocked("free"), None);
        // A refused job closes its bucket for the rest of the claim.
        let mut tokens = Admission::new(
            &FlowLimits::new(
                BTreeMap::from([("t".to_owned(), limit(None, Some(600)))]), // 10 a second
                BTreeMap::new(),
                ProviderRegistry::new(None),
            ),
            ["t"],
            &[],
            &[],
            None,
            &HashMap::new(),
            at(0.0),
        );
        let sized = |tokens| Weighed {
            tenant_id: busy_tenant,
            model: "t",
            tokens,
        };
        assert_eq!(tokens.admit(&sized(6)), Ok(()));
        assert!(tokens.admit(&sized(8)).is_err());
        assert!(
            tokens.admit(&sized(1)).is_err(),
            "a small call overtook a refused one"
        );
        let taken: Vec<_> = admission
            .taken()
            .into_iter()
            .map(|(key, _)| key.clone())
            .collect();
        assert_eq!(
            taken,
            [BucketKey::model("m"), BucketKey::tenant(limited_tenant)]
        );
    }

    #[test]
    fn unused_tokens_go_back_only_when_usage_is_known() {
        assert_eq!(unused_tokens(Some(1_000), Some(300)), 700);
        assert_eq!(unused_tokens(Some(1_000), None), 0);
        assert_eq!(unused_tokens(None, Some(300)), 0);
        assert_eq!(unused_tokens(Some(100), Some(300)), 0);
    }
}
