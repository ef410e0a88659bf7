//! A batch's progress, live: its counts and charge as they change, at most a few
//! times a second.
//!
//! The stream re-reads the batch row (one row, and an index range over the running
//! items) when its tenant's events say something moved, no sooner than
//! [`MIN_INTERVAL`] after the last read, so a burst of 1,000 finished items is one
//! read and one update, always of the latest state, never a backlog. The tenant's
//! notices come from every process (see `relay`), so progress made elsewhere shows.
//! Closing a batch whose items had all finished moves no item, so no event tells of
//! it: a read every [`QUIET_REREAD`] while nothing else wakes the stream covers that.

use super::{BatchView, read};
use crate::bus::EventBus;
use crate::error::ServiceError;
use entity::BatchStatus;
use futures_util::Stream;
use sea_orm::DatabaseConnection;
use std::time::Duration;
use uuid::Uuid;

/// Least time between two reads of the batch.
pub const MIN_INTERVAL: Duration = Duration::from_millis(250);
/// Longest time without a read while the batch is not finished.
const QUIET_REREAD: Duration = Duration::from_secs(2);

/// The batch's state now, then each change of its status, counts or charge; ends after
/// it is FINISHED.
pub fn batch_updates(
    db: DatabaseConnection,
    bus: &EventBus,
    tenant_id: Uuid,
    batch_id: Uuid,
) -> impl Stream<Item = Result<BatchView, ServiceError>> + Send + use<> {
    // Watching before the first read: nothing can move between it and the wait.
    let mut notices = bus.watch_tenant(tenant_id);
    async_stream::try_stream! {
        let mut last = None;
        loop {
            let read_at = tokio::time::Instant::now();
            notices.skip_queued();
            let current = read(&db, tenant_id, batch_id).await?;
            let finished = current.batch.status == BatchStatus::Finished;
            let state = Some(State::of(&current));
            if state != last {
                last = state;
                yield current;
            }
            if finished {
                return;
            }
            // Whatever wakes the stream, a read waits out the interval.
            let _ = tokio::time::timeout(QUIET_REREAD, notices.next()).await;
            tokio::time::sleep_until(read_at + MIN_INTERVAL).await;
        }
    }
}

/// What a subscriber sees change.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct State {
    status: BatchStatus,
    counts: [i64; 5],
    customer_charge: i64,
}

impl State {
    fn of(view: &BatchView) -> Self {
        Self {
            status: view.batch.status,
            counts: [
                view.queued,
                view.running,
                view.batch.succeeded,
                view.batch.failed,
                view.batch.cancelled,
            ],
            customer_charge: view.batch.customer_charge_nanos,
        }
    }
}
