//! Job events: the stored timeline of each job, and the in-process bus that tells
//! subscribers and workers something new was stored.
//!
//! The table is the truth; a notice on the bus is only a hint to re-read it. A lagging
//! receiver therefore loses nothing: it re-reads, and a slow poll covers notices that
//! never arrive (events written by another process).

use entity::{EventKind, JobStatus, JsonText, job_events, jobs};
use futures_util::Stream;
use sea_orm::{
    ActiveValue::Set, ColumnTrait, ConnectionTrait, DatabaseConnection, DbErr, EntityTrait,
    QueryFilter, QueryOrder,
};
use serde::{Deserialize, Serialize};
use serde_json::Value;
use std::time::Duration;
use tokio::sync::broadcast::{self, error::RecvError};
use uuid::Uuid;

/// How many notices a slow receiver may fall behind before it must re-read.
const BUS_CAPACITY: usize = 4096;
/// How often a subscription re-reads the table when no notice came.
const POLL_INTERVAL: Duration = Duration::from_secs(1);

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
    /// The process that sent a notice never stored, so that it does not receive its
    /// own notice twice (once locally, once through NOTIFY).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub origin: Option<Uuid>,
}

/// Fans event notices out to every subscriber and worker of this process.
#[derive(Clone, Debug)]
pub struct EventBus {
    sender: broadcast::Sender<EventNotice>,
    id: Uuid,
}

impl Default for EventBus {
    fn default() -> Self {
        Self {
            sender: broadcast::channel(BUS_CAPACITY).0,
            id: Uuid::new_v4(),
        }
    }
}

impl EventBus {
    /// Names this bus among the processes sharing a database, so that a notice it sent
    /// to the others is not delivered to it a second time.
    pub fn id(&self) -> Uuid {
        self.id
    }

    /// Tells every receiver about committed events.
    pub fn publish(&self, notices: impl IntoIterator<Item = EventNotice>) {
        for notice in notices {
            // No receiver is fine: nobody is watching.
            let _ = self.sender.send(notice);
        }
    }

    /// A receiver of every notice published from now on.
    pub fn subscribe(&self) -> broadcast::Receiver<EventNotice> {
        self.sender.subscribe()
    }
}

/// Stores the event whose seq the caller just reserved by bumping the job's
/// `last_event_seq` in the same transaction.
pub async fn append(
    db: &impl ConnectionTrait,
    job: &jobs::Model,
    kind: EventKind,
    data: Option<Value>,
) -> Result<EventNotice, DbErr> {
    let row = job_events::ActiveModel {
        job_id: Set(job.id),
        seq: Set(job.last_event_seq),
        tenant_id: Set(job.tenant_id),
        kind: Set(kind),
        status: Set(job.status),
        at: Set(job.updated_at),
        data: Set(data.map(JsonText)),
    };
    job_events::Entity::insert(row).exec(db).await?;
    let notice = EventNotice {
        job_id: job.id,
        tenant_id: job.tenant_id,
        seq: job.last_event_seq,
        kind,
        status: job.status,
        delta: None,
        origin: None,
    };
    super::relay::notify(db, &notice).await?;
    Ok(notice)
}

/// A job's events after `after_seq`, oldest first.
pub async fn events_after(
    db: &impl ConnectionTrait,
    job_id: Uuid,
    after_seq: i32,
) -> Result<Vec<job_events::Model>, DbErr> {
    job_events::Entity::find()
        .filter(job_events::Column::JobId.eq(job_id))
        .filter(job_events::Column::Seq.gt(after_seq))
        .order_by_asc(job_events::Column::Seq)
        .all(db)
        .await
}

/// A job's events after `after_seq`: first those stored, then new ones as they are
/// stored, with the live `OutputDelta`s of a streaming attempt in between; ends after
/// the terminal event (at once if it was already replayed).
pub fn job_updates(
    db: DatabaseConnection,
    bus: &EventBus,
    job_id: Uuid,
    after_seq: i32,
) -> impl Stream<Item = Result<job_events::Model, DbErr>> + use<> {
    // Subscribing before the first read means no event can slip between the replay
    // and the live part.
    let mut notices = bus.subscribe();
    async_stream::try_stream! {
        let mut last_seq = after_seq;
        let mut poll = tokio::time::interval(POLL_INTERVAL);
        // A delta that arrived before the stored event it follows was read.
        let mut pending_delta: Option<EventNotice> = None;
        loop {
            for event in events_after(&db, job_id, last_seq).await? {
                last_seq = event.seq;
                let terminal = event.kind.is_terminal();
                yield event;
                if terminal {
                    return;
                }
            }
            if let Some(delta) = pending_delta.take() {
                yield delta_event(&delta);
            }
            let job = jobs::Entity::find_by_id(job_id).one(&db).await?;
            if job.is_none_or(|job| job.status.is_terminal() && job.last_event_seq <= last_seq) {
                return;
            }
            loop {
                let wake = tokio::select! {
                    notice = notices.recv() => Wake::Notice(notice),
                    _ = poll.tick() => Wake::Poll,
                };
                match wake {
                    Wake::Notice(Ok(notice)) if notice.job_id != job_id => {}
                    Wake::Notice(Ok(notice)) if notice.kind == EventKind::OutputDelta => {
                        if notice.seq > last_seq {
                            pending_delta = Some(notice);
                            break;
                        }
                        yield delta_event(&notice);
                    }
                    Wake::Notice(Ok(notice)) if notice.seq > last_seq => break,
                    Wake::Notice(Ok(_)) => {}
                    // Missed notices: the table has whatever they said.
                    Wake::Notice(Err(RecvError::Lagged(_))) | Wake::Poll => break,
                    Wake::Notice(Err(RecvError::Closed)) => return,
                }
            }
        }
    }
}

/// Why a subscription looks again.
enum Wake {
    Notice(Result<EventNotice, RecvError>),
    Poll,
}

/// The event a subscriber sees for a live delta: it carries the seq of the stored
/// event it follows, so resuming after it replays nothing twice.
fn delta_event(notice: &EventNotice) -> job_events::Model {
    job_events::Model {
        job_id: notice.job_id,
        seq: notice.seq,
        tenant_id: notice.tenant_id,
        kind: EventKind::OutputDelta,
        status: notice.status,
        at: entity::Timestamp::now(),
        data: Some(JsonText(serde_json::json!({ "delta": notice.delta }))),
    }
}
