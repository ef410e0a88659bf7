//! The re-reads of a tenant's account streams after they missed notices, shared.
//!
//! A burst of one tenant's events overflows the queue of every account stream of that
//! tenant at about the same moment, and each must then re-read what it missed. Read
//! one by one, that was a thousand reads of up to [`MAX_REREAD`] rows on the API's
//! pool at once, and every other tenant's request waited for a connection until it
//! timed out. Here a tenant's streams share their re-reads: one at a time per tenant
//! (the others of that tenant wait for it and take its rows), and a few at a time in
//! the whole process, so that re-reads never hold more than [`MAX_CONCURRENT_REREADS`]
//! of the pool's connections whatever the number of streams.

use entity::{Timestamp, job_events};
use sea_orm::{
    ColumnTrait, ConnectionTrait, DbErr, EntityTrait, QueryFilter, QueryOrder, QuerySelect,
};
use std::collections::HashMap;
use std::sync::{Arc, Mutex, PoisonError, Weak};
use tokio::sync::Semaphore;
use uuid::Uuid;

/// Most events an account stream re-reads at once after missing notices.
pub const MAX_REREAD: u64 = 10_000;
/// Re-reads the process runs at once, across tenants: a small part of the pool
/// (`db::POOL_SIZE`), so that requests keep getting connections.
pub const MAX_CONCURRENT_REREADS: usize = 2;

/// Every tenant's shared re-reads; one per process, in the event bus.
#[derive(Debug)]
pub(crate) struct SharedRereads {
    tenants: Mutex<HashMap<Uuid, Weak<TenantRereads>>>,
    permits: Arc<Semaphore>,
}

impl Default for SharedRereads {
    fn default() -> Self {
        Self {
            tenants: Mutex::default(),
            permits: Arc::new(Semaphore::new(MAX_CONCURRENT_REREADS)),
        }
    }
}

impl SharedRereads {
    /// The re-reads of `tenant_id`, kept while one of its streams holds them.
    pub(crate) fn tenant(&self, tenant_id: Uuid) -> Arc<TenantRereads> {
        let mut tenants = self.tenants.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(rereads) = tenants.get(&tenant_id).and_then(Weak::upgrade) {
            return rereads;
        }
        // Tenants whose streams all ended take no memory.
        tenants.retain(|_, rereads| rereads.strong_count() > 0);
        let rereads = Arc::new(TenantRereads {
            tenant_id,
            last: tokio::sync::Mutex::default(),
            wanted_from: Mutex::default(),
            permits: self.permits.clone(),
        });
        tenants.insert(tenant_id, Arc::downgrade(&rereads));
        rereads
    }
}

/// One tenant's re-reads: the last one made, which later-waking streams share when it
/// covers what they missed.
#[derive(Debug)]
pub(crate) struct TenantRereads {
    tenant_id: Uuid,
    /// Held while a re-read runs, so that the tenant's other streams wait for it.
    last: tokio::sync::Mutex<Option<Reread>>,
    /// The earliest point the streams waiting for the next re-read need.
    wanted_from: Mutex<Option<Timestamp>>,
    permits: Arc<Semaphore>,
}

#[derive(Debug)]
struct Reread {
    from: Timestamp,
    /// Taken before the query ran: it saw every event committed before.
    started: Timestamp,
    events: Arc<Vec<job_events::Model>>,
}

impl Reread {
    /// Whether this read holds every event a stream needs that missed notices at
    /// `missed_at` and must re-read from `from`: what it missed was committed before it
    /// missed it, so a read started later, from no later, saw all of it (unless the
    /// read was cut at [`MAX_REREAD`] rows, then only one from the same point will do).
    fn covers(&self, from: Timestamp, missed_at: Timestamp) -> bool {
        let cut = self.events.len() as u64 >= MAX_REREAD;
        self.started >= missed_at && (self.from == from || (self.from < from && !cut))
    }
}

impl TenantRereads {
    /// The tenant's events stamped at or after `from`, oldest first, for a stream that
    /// missed notices at `missed_at`: from the last shared re-read when it covers them,
    /// else from a new one (which the streams waiting meanwhile share).
    pub(crate) async fn since(
        &self,
        db: &impl ConnectionTrait,
        from: Timestamp,
        missed_at: Timestamp,
    ) -> Result<Vec<job_events::Model>, DbErr> {
        self.want(from);
        let mut last = self.last.lock().await;
        let events = match last
            .as_ref()
            .filter(|reread| reread.covers(from, missed_at))
        {
            Some(reread) => reread.events.clone(),
            None => {
                let read_from = self.take_wanted().map_or(from, |wanted| wanted.min(from));
                let started = Timestamp::now();
                let events = {
                    let _permit = self.permits.acquire().await.expect("never closed");
                    Arc::new(tenant_events_since(db, self.tenant_id, read_from).await?)
                };
                if events.len() as u64 >= MAX_REREAD {
                    tracing::warn!(tenant.id = %self.tenant_id, "account streams fell so far behind that they re-read only the first {MAX_REREAD} missed events");
                }
                *last = Some(Reread {
                    from: read_from,
                    started,
                    events: events.clone(),
                });
                events
            }
        };
        drop(last);
        Ok(events
            .iter()
            .filter(|event| event.at >= from)
            .cloned()
            .collect())
    }

    fn want(&self, from: Timestamp) {
        let mut wanted = self
            .wanted_from
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        *wanted = Some(wanted.map_or(from, |wanted| wanted.min(from)));
    }

    fn take_wanted(&self) -> Option<Timestamp> {
        self.wanted_from
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .take()
    }
}

/// The tenant's events stamped at or after `from`, oldest first.
async fn tenant_events_since(
    db: &impl ConnectionTrait,
    tenant_id: Uuid,
    from: Timestamp,
) -> Result<Vec<job_events::Model>, DbErr> {
    job_events::Entity::find()
        .filter(job_events::Column::TenantId.eq(tenant_id))
        .filter(job_events::Column::At.gte(from))
        .order_by_asc(job_events::Column::At)
        .order_by_asc(job_events::Column::JobId)
        .order_by_asc(job_events::Column::Seq)
        .limit(MAX_REREAD)
        .all(db)
        .await
}
