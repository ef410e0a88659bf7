//! Per-client limits kept in memory: failed authentications per address (with the
//! lookups in flight reserved against them), GraphQL requests in flight per principal
//! (and for all keyless requests together), and open connections per address (or per
//! tenant, see `live`). All are per process; all forget a client once it is quiet, so
//! their memory stays bounded.

use crate::accounts::Principal;
use std::collections::HashMap;
use std::collections::hash_map::Entry;
use std::hash::Hash;
use std::net::IpAddr;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};
use tokio::sync::{Notify, OwnedSemaphorePermit, Semaphore};
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

/// Counts failed authentications per client address in fixed windows. A lookup in
/// flight holds a reservation against its address's remaining failures, so that
/// requests arriving together cannot all be looked up before the first failures are
/// recorded: at most the failures left are being looked up at once, and the others
/// wait their turn (a valid key's lookup ends its reservation in a millisecond).
#[derive(Debug)]
pub struct AuthThrottle {
    max_failures: u32,
    window: Duration,
    capacity: usize,
    windows: Mutex<HashMap<ClientAddress, FailureWindow>>,
    /// Woken whenever a reservation ends.
    released: Notify,
}

#[derive(Debug, Clone, Copy)]
struct FailureWindow {
    started: Instant,
    failures: u32,
    /// Lookups in flight.
    reserved: u32,
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

/// Why a key presented by an address was not looked up.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum AuthRefusal {
    /// The address used up its failures: refused until its window ends.
    Failures { retry_after: Duration },
    /// Lookups of the address's other keys held every failure it has left for the
    /// whole wait: nothing failed, they were slow (many tenants behind one proxy,
    /// a loaded database). Said apart, so that a tenant is not told its key failed.
    Busy,
}

impl AuthRefusal {
    pub fn retry_after(self) -> Duration {
        match self {
            Self::Failures { retry_after } => retry_after,
            Self::Busy => Duration::from_secs(1),
        }
    }

    pub fn message(self) -> &'static str {
        match self {
            Self::Failures { .. } => "too many failed authentications from this address",
            Self::Busy => "too many keys of this address are being checked at once",
        }
    }
}

/// One key lookup's place in its address's failures; it counts as a failure only if
/// [`AuthAttempt::failed`] is called.
#[derive(Debug)]
pub struct AuthAttempt<'a> {
    throttle: &'a AuthThrottle,
    client: ClientAddress,
    failed: bool,
}

impl AuthAttempt<'_> {
    /// The presented key was refused: counts against the address.
    pub fn failed(mut self) {
        self.failed = true;
    }
}

impl Drop for AuthAttempt<'_> {
    fn drop(&mut self) {
        self.throttle
            .release(self.client, self.failed, Instant::now());
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
            released: Notify::new(),
        }
    }

    /// A reservation for one lookup of a key presented by `client`, waiting at most
    /// `wait` while the address's other lookups hold its remaining failures.
    pub async fn reserve(
        &self,
        client: ClientAddress,
        wait: Duration,
    ) -> Result<AuthAttempt<'_>, AuthRefusal> {
        let deadline = tokio::time::Instant::now() + wait;
        loop {
            let released = self.released.notified();
            tokio::pin!(released);
            released.as_mut().enable();
            match self.try_reserve(client, Instant::now()) {
                Ok(true) => {
                    return Ok(AuthAttempt {
                        throttle: self,
                        client,
                        failed: false,
                    });
                }
                Ok(false) => {}
                Err(retry_after) => return Err(AuthRefusal::Failures { retry_after }),
            }
            if tokio::time::timeout_at(deadline, released).await.is_err() {
                return Err(AuthRefusal::Busy);
            }
        }
    }

    /// `Ok(true)`: reserved; `Ok(false)`: every failure left is reserved already.
    fn try_reserve(&self, client: ClientAddress, now: Instant) -> Result<bool, Duration> {
        let mut windows = self.windows.lock().unwrap_or_else(PoisonError::into_inner);
        if windows.len() >= self.capacity && !windows.contains_key(&client) {
            self.forget_some(&mut windows, now);
        }
        let window = windows.entry(client).or_insert(FailureWindow {
            started: now,
            failures: 0,
            reserved: 0,
        });
        if window.started + self.window <= now {
            window.started = now;
            window.failures = 0;
        }
        if window.failures >= self.max_failures {
            return Err(window.started + self.window - now);
        }
        if window.failures + window.reserved >= self.max_failures {
            return Ok(false);
        }
        window.reserved += 1;
        Ok(true)
    }

    fn release(&self, client: ClientAddress, failed: bool, now: Instant) {
        let mut windows = self.windows.lock().unwrap_or_else(PoisonError::into_inner);
        if let Entry::Occupied(mut entry) = windows.entry(client) {
            let window = entry.get_mut();
            window.reserved = window.reserved.saturating_sub(1);
            if failed {
                if window.started + self.window <= now {
                    window.started = now;
                    window.failures = 0;
                }
                window.failures = window.failures.saturating_add(1);
            }
            // An address with nothing against it takes no memory.
            if window.failures == 0 && window.reserved == 0 {
                entry.remove();
            }
        }
        drop(windows);
        self.released.notify_waiters();
    }

    /// Makes room for one more address: windows that ended first, then the oldest
    /// without a lookup in flight.
    fn forget_some(&self, windows: &mut HashMap<ClientAddress, FailureWindow>, now: Instant) {
        windows.retain(|_, window| window.reserved > 0 || window.started + self.window > now);
        if windows.len() >= self.capacity
            && let Some(oldest) = windows
                .iter()
                .filter(|(_, window)| window.reserved == 0)
                .min_by_key(|(_, window)| window.started)
                .map(|(client, _)| *client)
        {
            windows.remove(&oldest);
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

/// GraphQL requests of one access token that may be in flight at once: its own, not
/// its tenant's, so that one browser cannot take the slots its tenant's backend needs.
pub const TOKEN_CONCURRENT_REQUESTS: usize = 2;

/// GraphQL requests without a key that one client address may have in flight at once.
pub const ANONYMOUS_CONCURRENT_REQUESTS: usize = 4;

/// GraphQL requests without a key that the whole process runs at once, whatever their
/// addresses: they read only the schema, and a few dozen addresses must not be able
/// to keep every core busy with introspection while tenants and probes wait.
pub const ANONYMOUS_CONCURRENT_REQUESTS_TOTAL: usize = 2;

/// How long a request waits for one of its principal's slots before it is refused.
pub const SLOT_WAIT: Duration = Duration::from_secs(5);

/// Whose requests share a set of slots.
#[derive(Clone, Copy, Debug, Hash, PartialEq, Eq)]
pub enum RequestOwner {
    Admin,
    Tenant(Uuid),
    /// An access token, by its id.
    Token(Uuid),
    Anonymous(ClientAddress),
}

impl RequestOwner {
    /// The owner of a request made by `principal` (none: anonymous) from `client`.
    pub fn of(principal: Option<&Principal>, client: ClientAddress) -> Self {
        match principal {
            Some(Principal::Admin) => Self::Admin,
            Some(Principal::Tenant { tenant_id }) => Self::Tenant(*tenant_id),
            Some(Principal::Token(grant)) => Self::Token(grant.token_id),
            None => Self::Anonymous(client),
        }
    }

    fn slots(self) -> usize {
        match self {
            Self::Admin | Self::Tenant(_) => TENANT_CONCURRENT_REQUESTS,
            Self::Token(_) => TOKEN_CONCURRENT_REQUESTS,
            Self::Anonymous(_) => ANONYMOUS_CONCURRENT_REQUESTS,
        }
    }
}

/// A semaphore per request owner, made on first use and dropped when its owner has
/// nothing in flight and nobody waiting, so only active owners take memory; and one
/// that every anonymous request takes as well.
#[derive(Debug)]
pub struct RequestSlots {
    owners: Arc<Mutex<HashMap<RequestOwner, Arc<Semaphore>>>>,
    anonymous: Arc<Semaphore>,
}

impl Default for RequestSlots {
    fn default() -> Self {
        Self {
            owners: Arc::default(),
            anonymous: Arc::new(Semaphore::new(ANONYMOUS_CONCURRENT_REQUESTS_TOTAL)),
        }
    }
}

/// A request's slot, given back when dropped.
#[derive(Debug)]
pub struct RequestSlot {
    owner: RequestOwner,
    semaphore: Arc<Semaphore>,
    permit: Option<OwnedSemaphorePermit>,
    /// The process-wide anonymous permit, for a request without a key.
    _anonymous: Option<OwnedSemaphorePermit>,
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
            _anonymous: None,
            owners: self.owners.clone(),
        };
        let deadline = tokio::time::Instant::now() + wait;
        let acquired =
            tokio::time::timeout_at(deadline, slot.semaphore.clone().acquire_owned()).await;
        slot.permit = acquired.ok().and_then(Result::ok);
        // Dropped without a permit, `slot` still forgets an owner left with nothing.
        slot.permit.as_ref()?;
        if let RequestOwner::Anonymous(_) = owner {
            let shared =
                tokio::time::timeout_at(deadline, self.anonymous.clone().acquire_owned()).await;
            slot._anonymous = Some(shared.ok()?.ok()?);
        }
        Some(slot)
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

/// HTTP connections one client address may hold open at once (upgraded WebSockets
/// are counted apart): past it a new connection is closed as soon as it is accepted,
/// so that a few addresses cannot take every descriptor of the process.
pub const MAX_CONNECTIONS_PER_ADDRESS: usize = 256;

/// Counts the open connections of each client address (or of each tenant), up to a
/// cap.
#[derive(Debug)]
pub struct OpenCounts<K> {
    cap: usize,
    open: Arc<Mutex<HashMap<K, usize>>>,
}

/// Open connections per client address.
pub type AddressCounts = OpenCounts<ClientAddress>;

impl<K: Copy + Eq + Hash> OpenCounts<K> {
    /// At most `cap` connections per key.
    pub fn new(cap: usize) -> Self {
        Self {
            cap,
            open: Arc::default(),
        }
    }

    /// One more connection of `key`, or `None` when it holds its cap already. The
    /// count drops with the returned place.
    pub fn admit(&self, key: K) -> Option<Place<K>> {
        let mut open = self.open.lock().unwrap_or_else(PoisonError::into_inner);
        let count = open.entry(key).or_default();
        if *count >= self.cap {
            return None;
        }
        *count += 1;
        Some(Place {
            open: self.open.clone(),
            key,
        })
    }
}

/// One open connection, counted against its address (or tenant).
#[derive(Debug)]
pub struct Place<K: Copy + Eq + Hash> {
    open: Arc<Mutex<HashMap<K, usize>>>,
    key: K,
}

impl<K: Copy + Eq + Hash> Drop for Place<K> {
    fn drop(&mut self) {
        let mut open = self.open.lock().unwrap_or_else(PoisonError::into_inner);
        if let Entry::Occupied(mut count) = open.entry(self.key) {
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

    #[tokio::test]
    async fn an_address_is_refused_after_its_failures_until_its_window_ends() {
        let throttle = AuthThrottle::new(3, Duration::from_secs(60), 100);
        let start = Instant::now();
        for _ in 0..3 {
            assert_eq!(throttle.try_reserve(client(1), start), Ok(true));
            throttle.release(client(1), true, start);
        }
        let later = start + Duration::from_secs(20);
        assert_eq!(
            throttle.try_reserve(client(1), later),
            Err(Duration::from_secs(40))
        );
        assert_eq!(
            throttle.try_reserve(client(2), later),
            Ok(true),
            "others pass"
        );
        assert_eq!(
            throttle.try_reserve(client(1), start + Duration::from_secs(60)),
            Ok(true)
        );
    }

    #[tokio::test]
    async fn lookups_in_flight_hold_the_failures_left() {
        let throttle = AuthThrottle::new(3, Duration::from_secs(60), 100);
        let wait = Duration::from_millis(50);
        let first = throttle.reserve(client(1), wait).await.unwrap();
        let second = throttle.reserve(client(1), wait).await.unwrap();
        let third = throttle.reserve(client(1), wait).await.unwrap();
        // A fourth waits for one of them, and gives up after its wait: nothing failed.
        assert_eq!(
            throttle.reserve(client(1), wait).await.unwrap_err(),
            AuthRefusal::Busy
        );
        // A valid key gives its place back; a refused one spends it.
        drop(first);
        second.failed();
        let fourth = throttle.reserve(client(1), wait).await.unwrap();
        third.failed();
        fourth.failed();
        let refusal = throttle.reserve(client(1), wait).await.unwrap_err();
        assert!(
            matches!(refusal, AuthRefusal::Failures { .. })
                && refusal.retry_after() > Duration::from_secs(50),
            "used up: refused until the window ends, not {refusal:?}"
        );
    }

    #[tokio::test]
    async fn a_waiting_lookup_goes_ahead_when_a_place_is_given_back() {
        let throttle = Arc::new(AuthThrottle::new(1, Duration::from_secs(60), 100));
        let held = throttle.reserve(client(1), Duration::ZERO).await.unwrap();
        let waiting = {
            let throttle = throttle.clone();
            tokio::spawn(async move {
                throttle
                    .reserve(client(1), Duration::from_secs(5))
                    .await
                    .is_ok()
            })
        };
        tokio::time::sleep(Duration::from_millis(20)).await;
        drop(held);
        assert!(waiting.await.unwrap());
        assert_eq!(
            throttle.tracked(),
            0,
            "an address with nothing against it is forgotten"
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
            let at = start + Duration::from_millis(u64::from(last));
            assert_eq!(throttle.try_reserve(client(last), at), Ok(true));
            throttle.release(client(last), true, at);
        }
        assert_eq!(throttle.tracked(), 10);
        let now = start + Duration::from_secs(1);
        assert_eq!(throttle.try_reserve(client(0), now), Ok(true), "forgotten");
        assert!(throttle.try_reserve(client(49), now).is_err(), "remembered");
    }

    #[tokio::test]
    async fn an_owner_gets_its_slots_then_waits_and_is_refused() {
        let slots = RequestSlots::default();
        let owner = RequestOwner::Tenant(Uuid::from_u128(1));
        let mut held = Vec::new();
        for _ in 0..TENANT_CONCURRENT_REQUESTS {
            held.push(slots.acquire(owner, Duration::ZERO).await.unwrap());
        }
        assert!(
            slots
                .acquire(owner, Duration::from_millis(20))
                .await
                .is_none()
        );
        let other = RequestOwner::Tenant(Uuid::from_u128(2));
        assert!(slots.acquire(other, Duration::ZERO).await.is_some());
        held.pop();
        assert!(slots.acquire(owner, Duration::ZERO).await.is_some());
        drop(held);
        assert_eq!(slots.tracked(), 0, "idle owners are forgotten");
    }

    #[tokio::test]
    async fn anonymous_requests_share_a_few_slots_across_addresses() {
        let slots = RequestSlots::default();
        let mut held = Vec::new();
        for last in 0..ANONYMOUS_CONCURRENT_REQUESTS_TOTAL {
            let owner = RequestOwner::Anonymous(client(last as u8));
            held.push(slots.acquire(owner, Duration::ZERO).await.unwrap());
        }
        let another = RequestOwner::Anonymous(client(200));
        assert!(
            slots
                .acquire(another, Duration::from_millis(20))
                .await
                .is_none()
        );
        let tenant = RequestOwner::Tenant(Uuid::nil());
        assert!(slots.acquire(tenant, Duration::ZERO).await.is_some());
        held.pop();
        assert!(slots.acquire(another, Duration::ZERO).await.is_some());
    }
}
