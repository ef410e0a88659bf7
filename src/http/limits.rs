//! Per-client limits kept in memory: failed authentications per address, and GraphQL
//! requests in flight per principal. Both are per process; both forget a client once
//! it is quiet, so their memory stays bounded.

use crate::accounts::Principal;
use std::collections::HashMap;
use std::collections::hash_map::Entry;
use std::net::IpAddr;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};
use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use uuid::Uuid;

/// Failed authentications one client address may make within
/// [`AUTH_FAILURE_WINDOW`] before its attempts are refused.
pub const MAX_AUTH_FAILURES: u32 = 10;

/// The window failed authentications are counted in; an address that used up its
/// failures is refused until its window ends.
pub const AUTH_FAILURE_WINDOW: Duration = Duration::from_secs(60);

/// Addresses remembered at most; past it the oldest windows are forgotten first.
const MAX_TRACKED_ADDRESSES: usize = 10_000;

/// The client a limit applies to: an IPv4 address, or an IPv6 /64 (one subscriber's
/// usual allocation, so that rotating through it gains nothing).
#[derive(Clone, Copy, Debug, Hash, PartialEq, Eq)]
pub struct ClientAddress(u128);

impl From<IpAddr> for ClientAddress {
    fn from(address: IpAddr) -> Self {
        match address.to_canonical() {
            IpAddr::V4(v4) => Self(u128::from(u32::from(v4))),
            IpAddr::V6(v6) => Self(u128::from(v6) & !(u128::from(u64::MAX))),
        }
    }
}

/// Counts failed authentications per client address in fixed windows.
#[derive(Debug)]
pub struct AuthThrottle {
    max_failures: u32,
    window: Duration,
    capacity: usize,
    windows: Mutex<HashMap<ClientAddress, FailureWindow>>,
}

#[derive(Debug, Clone, Copy)]
struct FailureWindow {
    started: Instant,
    failures: u32,
}

impl Default for AuthThrottle {
    fn default() -> Self {
        Self::new(
            MAX_AUTH_FAILURES,
            AUTH_FAILURE_WINDOW,
            MAX_TRACKED_ADDRESSES,
        )
    }
}

impl AuthThrottle {
    /// At most `max_failures` per `window` per address, remembering at most
    /// `capacity` addresses.
    pub fn new(max_failures: u32, window: Duration, capacity: usize) -> Self {
        Self {
            max_failures,
            window,
            capacity,
            windows: Mutex::new(HashMap::new()),
        }
    }

    /// `Err(retry_after)` while `client` has used up its failures.
    pub fn check(&self, client: ClientAddress, now: Instant) -> Result<(), Duration> {
        let windows = self.windows.lock().unwrap_or_else(PoisonError::into_inner);
        match windows.get(&client) {
            Some(window) if window.failures >= self.max_failures => {
                let ends = window.started + self.window;
                if ends > now { Err(ends - now) } else { Ok(()) }
            }
            _ => Ok(()),
        }
    }

    /// Records one failed authentication from `client`.
    pub fn record_failure(&self, client: ClientAddress, now: Instant) {
        let mut windows = self.windows.lock().unwrap_or_else(PoisonError::into_inner);
        if windows.len() >= self.capacity && !windows.contains_key(&client) {
            windows.retain(|_, window| window.started + self.window > now);
            if windows.len() >= self.capacity
                && let Some(oldest) = windows
                    .iter()
                    .min_by_key(|(_, window)| window.started)
                    .map(|(client, _)| *client)
            {
                windows.remove(&oldest);
            }
        }
        match windows.entry(client) {
            Entry::Occupied(mut entry) => {
                let window = entry.get_mut();
                if window.started + self.window <= now {
                    *window = FailureWindow {
                        started: now,
                        failures: 1,
                    };
                } else {
                    window.failures = window.failures.saturating_add(1);
                }
            }
            Entry::Vacant(entry) => {
                entry.insert(FailureWindow {
                    started: now,
                    failures: 1,
                });
            }
        }
    }

    #[cfg(test)]
    fn tracked(&self) -> usize {
        self.windows
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .len()
    }
}

/// GraphQL requests of one tenant (or the admin) that may be in flight at once.
pub const TENANT_CONCURRENT_REQUESTS: usize = 8;

/// GraphQL requests without a key that one client address may have in flight at once.
pub const ANONYMOUS_CONCURRENT_REQUESTS: usize = 4;

/// How long a request waits for one of its principal's slots before it is refused.
pub const SLOT_WAIT: Duration = Duration::from_secs(5);

/// Whose requests share a set of slots.
#[derive(Clone, Copy, Debug, Hash, PartialEq, Eq)]
pub enum RequestOwner {
    Admin,
    Tenant(Uuid),
    Anonymous(ClientAddress),
}

impl RequestOwner {
    /// The owner of a request made by `principal` (none: anonymous) from `client`.
    pub fn of(principal: Option<Principal>, client: ClientAddress) -> Self {
        match principal {
            Some(Principal::Admin) => Self::Admin,
            Some(Principal::Tenant { tenant_id }) => Self::Tenant(tenant_id),
            None => Self::Anonymous(client),
        }
    }

    fn slots(self) -> usize {
        match self {
            Self::Admin | Self::Tenant(_) => TENANT_CONCURRENT_REQUESTS,
            Self::Anonymous(_) => ANONYMOUS_CONCURRENT_REQUESTS,
        }
    }
}

/// A semaphore per request owner, made on first use and dropped when its owner has
/// nothing in flight and nobody waiting, so only active owners take memory.
#[derive(Debug, Default)]
pub struct RequestSlots {
    owners: Arc<Mutex<HashMap<RequestOwner, Arc<Semaphore>>>>,
}

/// A request's slot, given back when dropped.
#[derive(Debug)]
pub struct RequestSlot {
    owner: RequestOwner,
    semaphore: Arc<Semaphore>,
    permit: Option<OwnedSemaphorePermit>,
    owners: Arc<Mutex<HashMap<RequestOwner, Arc<Semaphore>>>>,
}

impl RequestSlots {
    /// A slot for `owner`, waiting at most `wait` for one; `None` when every slot stayed
    /// taken.
    pub async fn acquire(&self, owner: RequestOwner, wait: Duration) -> Option<RequestSlot> {
        let semaphore = self
            .owners
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .entry(owner)
            .or_insert_with(|| Arc::new(Semaphore::new(owner.slots())))
            .clone();
        let mut slot = RequestSlot {
            owner,
            semaphore,
            permit: None,
            owners: self.owners.clone(),
        };
        let acquired = tokio::time::timeout(wait, slot.semaphore.clone().acquire_owned()).await;
        slot.permit = acquired.ok().and_then(Result::ok);
        // Dropped without a permit, `slot` still forgets an owner left with nothing.
        slot.permit.is_some().then_some(slot)
    }

    #[cfg(test)]
    fn tracked(&self) -> usize {
        self.owners
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .len()
    }
}

impl Drop for RequestSlot {
    fn drop(&mut self) {
        let mut owners = self.owners.lock().unwrap_or_else(PoisonError::into_inner);
        drop(self.permit.take());
        // Two references: the map's and this slot's; anyone else holding one is
        // waiting for or holding a slot.
        if Arc::strong_count(&self.semaphore) == 2
            && self.semaphore.available_permits() == self.owner.slots()
        {
            owners.remove(&self.owner);
        }
    }
}

/// WebSocket connections one client address may hold open at once: each costs about
/// 150 KB and a file descriptor, however little it does.
pub const MAX_SOCKETS_PER_ADDRESS: usize = 256;

/// Counts the open WebSocket connections of each client address.
#[derive(Debug, Default)]
pub struct SocketCounts {
    open: Arc<Mutex<HashMap<ClientAddress, usize>>>,
}

impl SocketCounts {
    /// One more connection of `client`, or `None` when it holds
    /// [`MAX_SOCKETS_PER_ADDRESS`] already. The count drops with the returned place.
    pub fn admit(&self, client: ClientAddress) -> Option<SocketPlace> {
        let mut open = self.open.lock().unwrap_or_else(PoisonError::into_inner);
        let count = open.entry(client).or_default();
        if *count >= MAX_SOCKETS_PER_ADDRESS {
            return None;
        }
        *count += 1;
        Some(SocketPlace {
            open: self.open.clone(),
            client,
        })
    }
}

/// One open WebSocket connection, counted against its address.
#[derive(Debug)]
pub struct SocketPlace {
    open: Arc<Mutex<HashMap<ClientAddress, usize>>>,
    client: ClientAddress,
}

impl Drop for SocketPlace {
    fn drop(&mut self) {
        let mut open = self.open.lock().unwrap_or_else(PoisonError::into_inner);
        if let Entry::Occupied(mut count) = open.entry(self.client) {
            *count.get_mut() -= 1;
            if *count.get() == 0 {
                count.remove();
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn client(last: u8) -> ClientAddress {
        ClientAddress::from(IpAddr::from([10, 0, 0, last]))
    }

    #[test]
    fn an_address_is_refused_after_its_failures_until_its_window_ends() {
        let throttle = AuthThrottle::new(3, Duration::from_secs(60), 100);
        let start = Instant::now();
        for _ in 0..3 {
            assert_eq!(throttle.check(client(1), start), Ok(()));
            throttle.record_failure(client(1), start);
        }
        let later = start + Duration::from_secs(20);
        assert_eq!(
            throttle.check(client(1), later),
            Err(Duration::from_secs(40))
        );
        assert_eq!(throttle.check(client(2), later), Ok(()), "others pass");
        assert_eq!(
            throttle.check(client(1), start + Duration::from_secs(60)),
            Ok(())
        );
    }

    #[test]
    fn ipv6_clients_are_grouped_by_their_64_prefix() {
        let one: IpAddr = "2001:db8:1:2::1".parse().unwrap();
        let other: IpAddr = "2001:db8:1:2:ffff::9".parse().unwrap();
        let elsewhere: IpAddr = "2001:db8:1:3::1".parse().unwrap();
        assert_eq!(ClientAddress::from(one), ClientAddress::from(other));
        assert_ne!(ClientAddress::from(one), ClientAddress::from(elsewhere));
        let mapped: IpAddr = "::ffff:10.0.0.1".parse().unwrap();
        assert_eq!(ClientAddress::from(mapped), client(1));
    }

    #[test]
    fn the_throttle_forgets_the_oldest_addresses_past_its_capacity() {
        let throttle = AuthThrottle::new(1, Duration::from_secs(60), 10);
        let start = Instant::now();
        for last in 0..50 {
            throttle.record_failure(client(last), start + Duration::from_millis(u64::from(last)));
        }
        assert_eq!(throttle.tracked(), 10);
        let now = start + Duration::from_secs(1);
        assert_eq!(throttle.check(client(0), now), Ok(()), "forgotten");
        assert!(throttle.check(client(49), now).is_err(), "remembered");
    }

    #[tokio::test]
    async fn an_owner_gets_its_slots_then_waits_and_is_refused() {
        let slots = RequestSlots::default();
        let owner = RequestOwner::Anonymous(client(1));
        let mut held = Vec::new();
        for _ in 0..ANONYMOUS_CONCURRENT_REQUESTS {
            held.push(slots.acquire(owner, Duration::ZERO).await.unwrap());
        }
        assert!(
            slots
                .acquire(owner, Duration::from_millis(20))
                .await
                .is_none()
        );
        let other = RequestOwner::Anonymous(client(2));
        assert!(slots.acquire(other, Duration::ZERO).await.is_some());
        held.pop();
        assert!(slots.acquire(owner, Duration::ZERO).await.is_some());
        drop(held);
        assert_eq!(slots.tracked(), 0, "idle owners are forgotten");
    }
}
