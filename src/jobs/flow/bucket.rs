//! One bucket's arithmetic: refilling, admitting a call, taking it.

use super::{DeferralReason, RateLimit};
use entity::{Timestamp, rate_limit_buckets};
use std::num::NonZeroU32;

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

    /// Why a call cannot start now, if it cannot: no request left, or tokens in debt.
    ///
    /// Any call starts while the token level is above zero, whatever its size, and may
    /// leave the bucket in debt; none starts until refill has paid the debt back. So
    /// the average rate holds, and a large call competes with small ones on equal
    /// terms: were it to wait until the level covered it, small calls admitted
    /// whenever the level covers them would keep it waiting for as long as they keep
    /// coming, in every process.
    pub fn shortage(&self) -> Option<DeferralReason> {
        if self.limit.requests_per_minute.is_some() && self.requests < 1.0 {
            return Some(DeferralReason::Requests);
        }
        if self.limit.tokens_per_minute.is_some() && self.tokens <= 0.0 {
            return Some(DeferralReason::Tokens);
        }
        None
    }

    /// Takes one call of `tokens`.
    pub fn take(&mut self, tokens: u64) {
        if self.limit.requests_per_minute.is_some() {
            self.requests -= 1.0;
        }
        if self.limit.tokens_per_minute.is_some() {
            self.tokens -= counted_tokens(self.limit, tokens);
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

/// What a call of `tokens` takes from a bucket under `limit`: its tokens, but at most a
/// minute's worth. A provider refuses a call larger than its per-minute limit anyway,
/// and counting more would leave the bucket in debt — the model idle for every tenant
/// — for longer than a minute because of one job.
pub fn counted_tokens(limit: RateLimit, tokens: u64) -> f64 {
    match limit.tokens_per_minute {
        Some(per_minute) => (tokens as f64).min(f64::from(per_minute.get())),
        None => 0.0,
    }
}

/// One second's worth of the request limit, and at least one request.
fn request_capacity(limit: RateLimit) -> f64 {
    per_second(limit.requests_per_minute).map_or(f64::INFINITY, |rate| rate.max(1.0))
}

/// One second's worth of the token limit, and at least one token.
fn token_capacity(limit: RateLimit) -> f64 {
    per_second(limit.tokens_per_minute).map_or(f64::INFINITY, |rate| rate.max(1.0))
}

#[cfg(test)]
pub(super) mod tests {
    use super::*;

    pub(in crate::jobs::flow) fn limit(requests: Option<u32>, tokens: Option<u32>) -> RateLimit {
        RateLimit {
            requests_per_minute: requests.and_then(NonZeroU32::new),
            tokens_per_minute: tokens.and_then(NonZeroU32::new),
            tokens_counted: None,
        }
    }

    pub(in crate::jobs::flow) fn at(seconds: f64) -> Timestamp {
        Timestamp((seconds * 1_000_000.0) as i64)
    }

    fn row(requests: Option<f64>, tokens: Option<f64>, seconds: f64) -> rate_limit_buckets::Model {
        rate_limit_buckets::Model {
            scope: entity::BucketScope::Model,
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
        assert_eq!(bucket.shortage(), None);
        bucket.take(1);
        assert_eq!(bucket.shortage(), Some(DeferralReason::Requests));
        let stored = row(bucket.requests(), bucket.tokens(), 100.0);
        let half = Bucket::refilled(Some(&stored), limit, at(100.5));
        assert_eq!(half.shortage(), Some(DeferralReason::Requests));
        let second = Bucket::refilled(Some(&stored), limit, at(101.0));
        assert_eq!(second.shortage(), None);
        // An idle minute does not save up sixty calls.
        let idle = Bucket::refilled(Some(&stored), limit, at(160.0));
        assert_eq!(idle.requests(), Some(1.0));
    }

    #[test]
    fn any_call_starts_while_tokens_are_left_and_none_while_in_debt() {
        let limit = limit(None, Some(6_000)); // 100 tokens a second
        let mut bucket = Bucket::refilled(None, limit, at(0.0));
        assert_eq!(bucket.shortage(), None, "a full bucket admits any call");
        bucket.take(500);
        assert_eq!(bucket.tokens(), Some(-400.0));
        assert_eq!(bucket.shortage(), Some(DeferralReason::Tokens));
        let stored = row(None, bucket.tokens(), 0.0);
        assert_eq!(
            Bucket::refilled(Some(&stored), limit, at(4.0)).shortage(),
            Some(DeferralReason::Tokens),
            "the debt is paid back first"
        );
        // A little left: a call of any size starts, a large one as soon as a small one.
        let mut paid = Bucket::refilled(Some(&stored), limit, at(4.1));
        assert_eq!(paid.shortage(), None);
        paid.take(5_000);
        let debt = paid.tokens().unwrap();
        assert!((debt - (10.0 - 5_000.0)).abs() < 1e-3, "{debt}");
        assert_eq!(paid.shortage(), Some(DeferralReason::Tokens));
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
}
