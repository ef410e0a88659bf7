//! The in-process event bus: tells worker loops that work was created, each running
//! attempt and each subscriber about its own job, each account stream about its
//! tenant's jobs, and open WebSocket connections about revoked keys.
//!
//! Notices are routed by topic, so a notice wakes only those who asked about it: ten
//! thousand idle subscriptions cost nothing while another job streams its output.
//! The table is the truth. A notice carries its stored event when the event is small
//! (they all are but for long error messages), so that a receiver which has read every
//! earlier event of the job delivers it without a query: the process reads each event
//! once (its writer had it; another process's listener receives it), however many
//! subscribers it has. A receiver that sees a gap, a notice without its event, or that
//! may have missed notices (it lagged, or the cross-process listener reconnected) is
//! told so and re-reads. No subscriber polls the database.
//!
//! The relay brings this process's own stored events round again (through NOTIFY on
//! PostgreSQL, through the shared poll on SQLite); the bus remembers the ones it
//! published and drops them the second time, since a burst heard twice fills the
//! receivers' queues twice as fast and makes every one of them lag and re-read. The
//! re-reads of one tenant's account streams are shared (see `rereads`).

pub mod relay;
pub(crate) mod rereads;

use crate::keyed_slots::{KeyedSlot, KeyedSlots};
use entity::{EventKind, JobStatus, JsonText, Timestamp, job_events};
use rereads::{SharedRereads, TenantRereads};
use serde::{Deserialize, Serialize};
use std::collections::{HashMap, HashSet, VecDeque};
use std::sync::{Arc, Mutex, PoisonError};
use tokio::sync::broadcast::{self, error::RecvError};
use tokio::sync::watch;
use uuid::Uuid;

/// How many notices about one job a receiver may fall behind before it must re-read.
const JOB_CAPACITY: usize = 256;
/// The same for a tenant's stream and for worker loops, which see more traffic.
const WIDE_CAPACITY: usize = 4096;
/// How many live subscriptions one tenant may hold in one process: each holds a
/// little memory and a database read per event, so a runaway client is stopped long
/// before it can slow other tenants.
pub const MAX_SUBSCRIPTIONS_PER_TENANT: usize = 2_000;
/// How many of its own stored events the bus remembers, to drop them when the relay
/// brings them round again: more than the relay reads in a few turns. One forgotten
/// early is delivered twice, which receivers tolerate.
const REMEMBERED_OWN_EVENTS: usize = 65_536;

/// A hint that an event was stored, published after its transaction committed.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct EventNotice {
    pub job_id: Uuid,
    pub tenant_id: Uuid,
    pub seq: i32,
    pub kind: EventKind,
    pub status: JobStatus,
    /// The text of an `OutputDelta`, which exists only as a notice.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub delta: Option<String>,
    /// What the stored event holds besides the fields above, when it is small enough
    /// to travel with its notice (see [`MAX_CARRIED_DATA_BYTES`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stored: Option<StoredEvent>,
    /// The process that sent a notice never stored, so that it does not receive its
    /// own notice twice (once locally, once through NOTIFY).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub origin: Option<Uuid>,
}

/// The largest event data a notice carries, as JSON: PostgreSQL refuses a NOTIFY
/// payload past 8,000 bytes, and the notice's own fields take a few hundred.
pub const MAX_CARRIED_DATA_BYTES: usize = 4_000;

/// The rest of a stored event, carried by its notice.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct StoredEvent {
    pub at: Timestamp,
    pub data: Option<serde_json::Value>,
}

impl StoredEvent {
    /// The rest of an event with `data` stored `at`, when `data` is small enough to
    /// travel.
    pub fn carried(at: Timestamp, data: Option<&serde_json::Value>) -> Option<Self> {
        let size = data.map_or(0, |data| data.to_string().len());
        (size <= MAX_CARRIED_DATA_BYTES).then(|| Self {
            at,
            data: data.cloned(),
        })
    }
}

impl EventNotice {
    /// The stored event this notice stands for, when it carries it.
    pub fn stored_event(&self) -> Option<job_events::Model> {
        let stored = self.stored.as_ref()?;
        (self.kind != EventKind::OutputDelta).then(|| job_events::Model {
            job_id: self.job_id,
            seq: self.seq,
            tenant_id: self.tenant_id,
            kind: self.kind,
            status: self.status,
            at: stored.at,
            data: stored.data.clone().map(JsonText),
        })
    }
}

/// What a receiver is told about.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
enum Topic {
    /// Jobs created: worker loops claim at once instead of at their next poll.
    Created,
    Job(Uuid),
    Tenant(Uuid),
}

/// Fans notices out to the receivers of this process. Cheap to clone.
#[derive(Clone, Debug)]
pub struct EventBus {
    hub: Arc<Hub>,
}

#[derive(Debug)]
struct Hub {
    id: Uuid,
    topics: Mutex<HashMap<Topic, broadcast::Sender<EventNotice>>>,
    /// Bumped when notices may have been lost, so that every receiver re-reads.
    missed: watch::Sender<u64>,
    revoked_keys: broadcast::Sender<Uuid>,
    subscriptions_by_tenant: KeyedSlots<Uuid>,
    published_here: Mutex<OwnEvents>,
    rereads: SharedRereads,
}

/// The stored events this process published, newest last, so that the relay does not
/// publish them again.
#[derive(Debug, Default)]
struct OwnEvents {
    events: HashSet<(Uuid, i32)>,
    order: VecDeque<(Uuid, i32)>,
}

impl OwnEvents {
    fn remember(&mut self, event: (Uuid, i32)) {
        if self.events.insert(event) {
            self.order.push_back(event);
        }
        while self.order.len() > REMEMBERED_OWN_EVENTS {
            if let Some(oldest) = self.order.pop_front() {
                self.events.remove(&oldest);
            }
        }
    }

    /// Whether `event` was published here; it is forgotten then (each comes round
    /// once), though it stays in `order` until it ages out.
    fn take(&mut self, event: (Uuid, i32)) -> bool {
        self.events.remove(&event)
    }
}

impl Default for EventBus {
    fn default() -> Self {
        Self {
            hub: Arc::new(Hub {
                id: Uuid::new_v4(),
                topics: Mutex::default(),
                missed: watch::channel(0).0,
                revoked_keys: broadcast::channel(WIDE_CAPACITY).0,
                subscriptions_by_tenant: KeyedSlots::default(),
                published_here: Mutex::default(),
                rereads: SharedRereads::default(),
            }),
        }
    }
}

impl EventBus {
    /// Names this bus among the processes sharing a database, so that a notice it sent
    /// to the others is not delivered to it a second time.
    pub fn id(&self) -> Uuid {
        self.hub.id
    }

    /// Tells the receivers of each notice's topics about events this process committed.
    pub fn publish(&self, notices: impl IntoIterator<Item = EventNotice>) {
        let notices: Vec<_> = notices.into_iter().collect();
        let mut own = self.hub.own_events();
        for notice in notices.iter().filter(|notice| is_stored(notice)) {
            own.remember((notice.job_id, notice.seq));
        }
        drop(own);
        self.publish_to(notices, true);
    }

    /// Publishes what the relay heard, but for this process's own stored events,
    /// which [`publish`](Self::publish) delivered already; to worker loops too unless
    /// `to_workers` is false (for notices they find by polling anyway).
    pub fn publish_relayed(
        &self,
        notices: impl IntoIterator<Item = EventNotice>,
        to_workers: bool,
    ) {
        let mut own = self.hub.own_events();
        let heard: Vec<_> = notices
            .into_iter()
            .filter(|notice| !(is_stored(notice) && own.take((notice.job_id, notice.seq))))
            .collect();
        drop(own);
        self.publish_to(heard, to_workers);
    }

    fn publish_to(&self, notices: Vec<EventNotice>, to_workers: bool) {
        let topics = self.hub.topics();
        for notice in notices {
            let created =
                (to_workers && notice.kind == EventKind::Created).then_some(Topic::Created);
            for topic in [Topic::Job(notice.job_id), Topic::Tenant(notice.tenant_id)]
                .into_iter()
                .chain(created)
            {
                if let Some(sender) = topics.get(&topic) {
                    // No receiver left is fine: it is being dropped.
                    let _ = sender.send(notice.clone());
                }
            }
        }
    }

    /// Tells every receiver that notices may have been lost (the cross-process
    /// listener reconnected), so that each re-reads what it watches.
    pub fn announce_missed_notices(&self) {
        self.hub.missed.send_modify(|generation| *generation += 1);
    }

    /// Notices of jobs created from now on.
    pub fn watch_created(&self) -> TopicReceiver {
        self.watch(Topic::Created, WIDE_CAPACITY)
    }

    /// Notices of one job's events from now on.
    pub fn watch_job(&self, job_id: Uuid) -> TopicReceiver {
        self.watch(Topic::Job(job_id), JOB_CAPACITY)
    }

    /// Notices of every event of one tenant's jobs from now on.
    pub fn watch_tenant(&self, tenant_id: Uuid) -> TopicReceiver {
        self.watch(Topic::Tenant(tenant_id), WIDE_CAPACITY)
    }

    fn watch(&self, topic: Topic, capacity: usize) -> TopicReceiver {
        // Subscribing under the lock that `Registration::drop` takes keeps a topic
        // from being removed between the lookup and the subscription.
        let notices = self
            .hub
            .topics()
            .entry(topic)
            .or_insert_with(|| broadcast::channel(capacity).0)
            .subscribe();
        TopicReceiver {
            notices,
            missed: self.hub.missed.subscribe(),
            _registration: Registration {
                hub: self.hub.clone(),
                topic,
            },
        }
    }

    /// Tells open connections authenticated with `key_id` that it was revoked.
    pub fn announce_revoked_key(&self, key_id: Uuid) {
        let _ = self.hub.revoked_keys.send(key_id);
    }

    /// Revocations announced from now on, and word of missed ones.
    pub fn watch_revocations(&self) -> RevocationReceiver {
        RevocationReceiver {
            revoked: self.hub.revoked_keys.subscribe(),
            missed: self.hub.missed.subscribe(),
        }
    }

    /// Counts one more live subscription of `tenant_id`, or refuses it when the
    /// tenant holds [`MAX_SUBSCRIPTIONS_PER_TENANT`] already. The count drops with
    /// the returned slot.
    pub fn admit_subscription(&self, tenant_id: Uuid) -> Option<SubscriptionSlot> {
        self.hub
            .subscriptions_by_tenant
            .try_take(&tenant_id, MAX_SUBSCRIPTIONS_PER_TENANT)
            .map(|slot| SubscriptionSlot { _slot: slot })
    }

    /// Live subscriptions of every tenant in this process.
    pub fn open_subscriptions(&self) -> usize {
        self.hub.subscriptions_by_tenant.total()
    }

    /// The shared re-reads of `tenant_id`'s account streams.
    pub(crate) fn tenant_rereads(&self, tenant_id: Uuid) -> std::sync::Arc<TenantRereads> {
        self.hub.rereads.tenant(tenant_id)
    }

    /// How many topics have receivers: a leak shows here first.
    pub fn watched_topics(&self) -> usize {
        self.hub.topics().len()
    }
}

impl Hub {
    fn topics(&self) -> std::sync::MutexGuard<'_, HashMap<Topic, broadcast::Sender<EventNotice>>> {
        // The maps stay consistent whatever panicked while holding them.
        self.topics.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn own_events(&self) -> std::sync::MutexGuard<'_, OwnEvents> {
        self.published_here
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
    }
}

/// Whether `notice` stands for a stored event (an output delta is never stored, and
/// carries the seq of the event it follows).
fn is_stored(notice: &EventNotice) -> bool {
    notice.kind != EventKind::OutputDelta
}

/// Why a receiver wakes.
#[derive(Debug)]
pub enum Wake {
    Notice(EventNotice),
    /// Notices may have been lost: re-read the table.
    Missed,
}

/// The notices of one topic. Dropping the last receiver of a topic removes it.
pub struct TopicReceiver {
    // Declared before the registration: it must be dropped first, so that the
    // registration sees the receiver count without it.
    notices: broadcast::Receiver<EventNotice>,
    missed: watch::Receiver<u64>,
    _registration: Registration,
}

impl TopicReceiver {
    /// The next notice, or word that some may have been missed.
    pub async fn next(&mut self) -> Wake {
        tokio::select! {
            notice = self.notices.recv() => match notice {
                Ok(notice) => Wake::Notice(notice),
                Err(RecvError::Lagged(_)) => Wake::Missed,
                // The sender lives in the hub, which this receiver keeps alive.
                Err(RecvError::Closed) => unreachable!("a topic outlives its receivers"),
            },
            _ = self.missed.changed() => Wake::Missed,
        }
    }

    /// Drops the notices queued so far: for a receiver that re-reads state whatever
    /// woke it, they are all news of the read it is about to make.
    pub fn skip_queued(&mut self) {
        self.notices = self.notices.resubscribe();
    }
}

/// Removes its topic from the hub when the topic's last receiver is gone.
struct Registration {
    hub: Arc<Hub>,
    topic: Topic,
}

impl Drop for Registration {
    fn drop(&mut self) {
        let mut topics = self.hub.topics();
        if topics
            .get(&self.topic)
            .is_some_and(|sender| sender.receiver_count() == 0)
        {
            topics.remove(&self.topic);
        }
    }
}

/// Announced key revocations.
pub struct RevocationReceiver {
    revoked: broadcast::Receiver<Uuid>,
    missed: watch::Receiver<u64>,
}

impl RevocationReceiver {
    /// Waits until `key_id` is announced revoked, or until announcements may have
    /// been missed (then the caller must ask the database).
    pub async fn revoked_or_missed(&mut self, key_id: Uuid) {
        loop {
            tokio::select! {
                revoked = self.revoked.recv() => match revoked {
                    Ok(revoked) if revoked == key_id => return,
                    Ok(_) => {}
                    Err(RecvError::Lagged(_)) => return,
                    Err(RecvError::Closed) => unreachable!("the hub outlives its receivers"),
                },
                _ = self.missed.changed() => return,
            }
        }
    }
}

/// One live subscription counted against its tenant's limit.
#[derive(Debug)]
pub struct SubscriptionSlot {
    _slot: KeyedSlot<Uuid>,
}
