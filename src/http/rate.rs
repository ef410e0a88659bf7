//! The rate of keyless requests per client address. Their concurrency is bounded (see
//! `client_limits::RequestSlots`), but a client that waits for each answer before sending
//! the next stays within those slots forever and keeps them busy for everyone else
//! without a key; each address gets a bucket of requests that refills slowly instead.
//! Per process; an address whose bucket is full again takes no memory.

use super::client_limits::ClientAddress;
use std::collections::HashMap;
use std::sync::{Mutex, PoisonError};
use std::time::{Duration, Instant};

/// Keyless requests one client address may send in a burst.
pub const ANONYMOUS_REQUEST_BURST: u32 = 60;

/// How fast an address's bucket refills: one keyless request a second, sustained.
const REFILL_EVERY: Duration = Duration::from_secs(1);

/// Addresses remembered at most; past it the fullest buckets are forgotten first.
const MAX_TRACKED_ADDRESSES: usize = 10_000;

/// A bucket of keyless requests per client address.
#[derive(Debug)]
pub struct AnonymousRate {
    burst: u32,
    refill_every: Duration,
    capacity: usize,
    buckets: Mutex<HashMap<ClientAddress, Bucket>>,
}

/// What an address has left, as of `at`.
#[derive(Debug, Clone, Copy)]
struct Bucket {
    /// Requests left, in units of `refill_every` (whole requests are `tokens >= 1`).
    tokens: f64,
    at: Instant,
}

impl Default for AnonymousRate {
    fn default() -> Self {
        Self::new(ANONYMOUS_REQUEST_BURST, REFILL_EVERY, MAX_TRACKED_ADDRESSES)
    }
}

impl AnonymousRate {
    /// `burst` requests at once per address, one more each `refill_every`, remembering
    /// at most `capacity` addresses.
    pub fn new(burst: u32, refill_every: Duration, capacity: usize) -> Self {
        Self {
            burst,
            refill_every,
            capacity,
            buckets: Mutex::default(),
        }
    }

    /// Takes one request from `client`'s bucket, or `Err(retry_after)` when it is empty.
    pub fn take(&self, client: ClientAddress, now: Instant) -> Result<(), Duration> {
        let mut buckets = self.buckets.lock().unwrap_or_else(PoisonError::into_inner);
        if buckets.len() >= self.capacity && !buckets.contains_key(&client) {
            self.forget_some(&mut buckets, now);
        }
        let full = Bucket {
            tokens: f64::from(self.burst),
            at: now,
        };
        let bucket = buckets.entry(client).or_insert(full);
        bucket.tokens = self.refilled(bucket, now);
        bucket.at = now;
        if bucket.tokens < 1.0 {
            let missing = 1.0 - bucket.tokens;
            return Err(self.refill_every.mul_f64(missing));
        }
        bucket.tokens -= 1.0;
        Ok(())
    }

    fn refilled(&self, bucket: &Bucket, now: Instant) -> f64 {
        let earned = now.saturating_duration_since(bucket.at).as_secs_f64()
            / self.refill_every.as_secs_f64();
        (bucket.tokens + earned).min(f64::from(self.burst))
    }

    /// Makes room for one more address: buckets full again first, then the fullest.
    fn forget_some(&self, buckets: &mut HashMap<ClientAddress, Bucket>, now: Instant) {
        let burst = f64::from(self.burst);
        buckets.retain(|_, bucket| self.refilled(bucket, now) < burst);
        if buckets.len() >= self.capacity
            && let Some(fullest) = buckets
                .iter()
                .max_by(|(_, one), (_, other)| {
                    self.refilled(one, now)
                        .total_cmp(&self.refilled(other, now))
                })
                .map(|(client, _)| *client)
        {
            buckets.remove(&fullest);
        }
    }

    #[cfg(test)]
    fn tracked(&self) -> usize {
        self.buckets
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::IpAddr;

    fn client(last: u8) -> ClientAddress {
        ClientAddress::from(IpAddr::from([10, 0, 0, last]))
    }

    #[test]
    fn an_address_spends_its_burst_then_one_request_per_refill() {
        let rate = AnonymousRate::new(3, Duration::from_secs(1), 100);
        let start = Instant::now();
        for _ in 0..3 {
            assert_eq!(rate.take(client(1), start), Ok(()));
        }
        assert_eq!(rate.take(client(1), start), Err(Duration::from_secs(1)));
        assert_eq!(rate.take(client(2), start), Ok(()), "others pass");
        let later = start + Duration::from_millis(1500);
        assert_eq!(rate.take(client(1), later), Ok(()));
        assert_eq!(rate.take(client(1), later), Err(Duration::from_millis(500)));
        // Quiet for long, the bucket is full again, never fuller.
        let much_later = start + Duration::from_secs(60);
        for _ in 0..3 {
            assert_eq!(rate.take(client(1), much_later), Ok(()));
        }
        assert!(rate.take(client(1), much_later).is_err());
    }

    #[test]
    fn full_buckets_are_forgotten_past_the_capacity() {
        let rate = AnonymousRate::new(2, Duration::from_secs(1), 10);
        let start = Instant::now();
        for last in 0..10 {
            rate.take(client(last), start).unwrap();
            rate.take(client(last), start).unwrap();
        }
        assert_eq!(rate.tracked(), 10);
        // A new address, while every other bucket is empty: the fullest goes.
        rate.take(client(100), start).unwrap();
        assert_eq!(rate.tracked(), 10);
        // A second later they have all refilled a little; none is full yet.
        let later = start + Duration::from_secs(1);
        rate.take(client(101), later).unwrap();
        assert_eq!(rate.tracked(), 10);
        // Once they are full they are all forgotten at the next new address.
        let much_later = start + Duration::from_secs(10);
        rate.take(client(102), much_later).unwrap();
        assert_eq!(rate.tracked(), 1);
    }
}
