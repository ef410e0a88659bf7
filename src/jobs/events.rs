//! Job events: the stored timeline of each job, and the live streams of them that
//! subscriptions serve.
//!
//! The table is the truth; a notice on the bus is a hint to re-read it, or carries
//! the next event itself (then nothing is read). A receiver that may have missed
//! notices is told so and re-reads, so a stream loses nothing and never polls; the
//! account streams of one tenant share their re-reads (see [`crate::bus::rereads`]).

pub mod cursor;

use crate::bus::{EventBus, EventNotice, StoredEvent, Wake};
use cursor::{Cursor, SeenJob};
use entity::{EventKind, JsonText, Timestamp, job_events, jobs};
use futures_util::Stream;
use sea_orm::{
    ActiveValue::Set, ColumnTrait, ConnectionTrait, DatabaseConnection, DbErr, EntityTrait,
    QueryFilter, QueryOrder, QueryTrait,
};
use serde_json::Value;
use std::collections::HashMap;
use std::time::{Duration, Instant};
use uuid::Uuid;

/// How far back an account stream re-reads after missing notices: events are stamped
/// by the clock of the process that wrote them, which may run a little behind.
const CLOCK_SKEW_MARGIN: Duration = Duration::from_secs(2);
/// How long an account stream remembers a finished job, to drop late duplicates of
/// its notices (one forgotten by the bus comes round again through the relay).
const FINISHED_MEMORY: Duration = Duration::from_secs(60);

/// Stores the event whose seq the caller just reserved by bumping the job's
/// `last_event_seq` in the same transaction.
pub async fn append(
    db: &impl ConnectionTrait,
    job: &jobs::Model,
    kind: EventKind,
    data: Option<Value>,
) -> Result<EventNotice, DbErr> {
    let mut notices = append_many(db, [(job, kind, data)]).await?;
    Ok(notices.remove(0))
}

/// [`append`] for several jobs' events, in one statement.
pub async fn append_many<'a>(
    db: &impl ConnectionTrait,
    events: impl IntoIterator<Item = (&'a jobs::Model, EventKind, Option<Value>)>,
) -> Result<Vec<EventNotice>, DbErr> {
    let mut rows = Vec::new();
    let mut notices = Vec::new();
    for (job, kind, data) in events {
        let stored = StoredEvent::carried(job.updated_at, data.as_ref());
        rows.push(job_events::ActiveModel {
            job_id: Set(job.id),
            seq: Set(job.last_event_seq),
            tenant_id: Set(job.tenant_id),
            kind: Set(kind),
            status: Set(job.status),
            at: Set(job.updated_at),
            data: Set(data.map(JsonText)),
        });
        notices.push(EventNotice {
            job_id: job.id,
            tenant_id: job.tenant_id,
            seq: job.last_event_seq,
            kind,
            status: job.status,
            delta: None,
            stored,
            origin: None,
        });
    }
    if rows.is_empty() {
        return Ok(notices);
    }
    if db.get_database_backend() == sea_orm::DbBackend::Postgres {
        // A notice is one entry of the statement's select list, of which PostgreSQL
        // takes at most 1,664.
        for (rows, notices) in rows.chunks(1_000).zip(notices.chunks(1_000)) {
            let insert = job_events::Entity::insert_many(rows.to_vec()).into_query();
            crate::bus::relay::store_and_notify(db, insert, notices).await?;
        }
    } else {
        // SQLite binds a long statement's parameters in quadratic time (see
        // `db::bulk`): a batch's chunk of 1,000 events goes in statements of ~1,000.
        let per_statement = crate::db::bulk::SQLITE_MAX_PLACEHOLDERS
            / <job_events::Column as sea_orm::Iterable>::iter().count();
        for some in rows.chunks(per_statement) {
            job_events::Entity::insert_many(some.to_vec())
                .exec(db)
                .await?;
        }
    }
    Ok(notices)
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
    // Watching before the first read means no event can slip between the replay and
    // the live part.
    let mut notices = bus.watch_job(job_id);
    async_stream::try_stream! {
        let mut last_seq = after_seq;
        // A delta that arrived before the stored event it follows was read.
        let mut pending_delta: Option<EventNotice> = None;
        let mut first_pass = true;
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
            // Asked for events after the terminal one: nothing more will come.
            if std::mem::take(&mut first_pass) {
                let job = jobs::Entity::find_by_id(job_id).one(&db).await?;
                if job.is_none_or(|job| job.status.is_terminal() && job.last_event_seq <= last_seq) {
                    return;
                }
            }
            loop {
                match notices.next().await {
                    Wake::Notice(notice) if notice.kind == EventKind::OutputDelta => {
                        if notice.seq > last_seq {
                            pending_delta = Some(notice);
                            break;
                        }
                        yield delta_event(&notice);
                    }
                    Wake::Notice(notice) if notice.seq > last_seq => match notice.stored_event() {
                        // The next event, carried: delivered without a read.
                        Some(event) if event.seq == last_seq + 1 => {
                            last_seq = event.seq;
                            let terminal = event.kind.is_terminal();
                            yield event;
                            if terminal {
                                return;
                            }
                        }
                        _ => break,
                    },
                    // A duplicate: every process hears its own events twice on PostgreSQL.
                    Wake::Notice(_) => {}
                    Wake::Missed => break,
                }
            }
        }
    }
}

/// Every stored event of the tenant's jobs from now on, each once, in order within
/// each job, with the cursor that resumes right after it; live deltas are left to
/// `job_updates`. Resumed from `after`, it first delivers the stored events the cursor
/// had not seen, a page at a time (see [`cursor`]). Runs until dropped.
pub fn account_updates(
    db: DatabaseConnection,
    bus: &EventBus,
    tenant_id: Uuid,
    after: Option<Cursor>,
) -> impl Stream<Item = Result<(job_events::Model, String), DbErr>> + use<> {
    // Watching before the first read means no event stored meanwhile, by this process
    // or another, can slip between the catch-up and the live part: it is read, or
    // heard, or both (then the per-job seqs drop the second).
    let mut notices = bus.watch_tenant(tenant_id);
    let rereads = bus.tenant_rereads(tenant_id);
    let since = Timestamp::now();
    async_stream::try_stream! {
        let mut delivered = Delivered::new(tenant_id, after.as_ref().map_or(since, |cursor| cursor.from));
        if let Some(cursor) = after {
            delivered.seed(&cursor);
            let mut last = None;
            loop {
                let page = cursor::stored_page(&db, tenant_id, cursor.from, last.as_ref()).await?;
                let full = page.len() as u64 >= cursor::CATCH_UP_PAGE;
                for event in page {
                    // Stamped by different processes' clocks, a job's events may come
                    // out of `at` order: a gap is filled from the job's own timeline.
                    let events = match delivered.last_seq(event.job_id) {
                        Some(seq) if event.seq > seq + 1 => events_after(&db, event.job_id, seq).await?,
                        _ => vec![event.clone()],
                    };
                    for event in events {
                        if let Some(cursor) = delivered.deliver(&event) {
                            yield (event, cursor);
                        }
                    }
                    last = Some(event);
                }
                if !full {
                    break;
                }
            }
        }
        let mut caught_up_at = since;
        loop {
            let events = match notices.next().await {
                Wake::Notice(notice) if notice.kind == EventKind::OutputDelta => continue,
                Wake::Notice(notice) => {
                    // No notice was lost before this one: everything stored until about
                    // now was or is being delivered.
                    caught_up_at = Timestamp::now();
                    let after = delivered.last_seq(notice.job_id).unwrap_or(notice.seq - 1);
                    if notice.seq <= after {
                        continue;
                    }
                    // The next event of the job, carried: delivered without a read.
                    match notice.stored_event() {
                        Some(event) if notice.seq == after + 1 => vec![event],
                        _ => events_after(&db, notice.job_id, after).await?,
                    }
                }
                Wake::Missed => {
                    let reread_from = caught_up_at.plus(-margin());
                    let now = Timestamp::now();
                    let events = rereads.since(&db, reread_from.max(since), now).await?;
                    caught_up_at = now;
                    events
                }
            };
            for event in events {
                if let Some(cursor) = delivered.deliver(&event) {
                    yield (event, cursor);
                }
            }
        }
    }
}

fn margin() -> chrono::Duration {
    chrono::Duration::from_std(CLOCK_SKEW_MARGIN).expect("a small duration")
}

/// What an account stream already delivered: the last seq of each job it has seen,
/// forgetting finished jobs after a while so that the map stays small.
struct Delivered {
    tenant_id: Uuid,
    /// The earliest `from` its cursors may name: the stream owes nothing stamped
    /// before it started (or before the cursor it resumed from).
    floor: Timestamp,
    jobs: HashMap<Uuid, DeliveredJob>,
    last_pruned: Option<Instant>,
}

struct DeliveredJob {
    seq: i32,
    at: Timestamp,
    /// When the job may start to be forgotten: once finished, or once known from a
    /// cursor (whose own jobs the stream does not follow).
    finished_at: Option<Instant>,
}

impl Delivered {
    fn new(tenant_id: Uuid, floor: Timestamp) -> Self {
        Self {
            tenant_id,
            floor,
            jobs: HashMap::new(),
            last_pruned: None,
        }
    }

    fn seed(&mut self, cursor: &Cursor) {
        for job in &cursor.seen {
            self.jobs.insert(
                job.job_id,
                DeliveredJob {
                    seq: job.seq,
                    at: job.at,
                    finished_at: Some(Instant::now()),
                },
            );
        }
    }

    fn last_seq(&self, job_id: Uuid) -> Option<i32> {
        self.jobs.get(&job_id).map(|job| job.seq)
    }

    /// Records `event` and returns the cursor after it, unless it was delivered before.
    fn deliver(&mut self, event: &job_events::Model) -> Option<String> {
        if self
            .last_seq(event.job_id)
            .is_some_and(|seq| event.seq <= seq)
        {
            return None;
        }
        let finished_at = event.kind.is_terminal().then(Instant::now);
        self.jobs.insert(
            event.job_id,
            DeliveredJob {
                seq: event.seq,
                at: event.at,
                finished_at,
            },
        );
        if self
            .last_pruned
            .is_none_or(|at| at.elapsed() >= FINISHED_MEMORY)
        {
            self.last_pruned = Some(Instant::now());
            self.jobs.retain(|_, job| {
                job.finished_at
                    .is_none_or(|at| at.elapsed() < FINISHED_MEMORY)
            });
        }
        Some(self.cursor_after(event).encode())
    }

    fn cursor_after(&self, event: &job_events::Model) -> Cursor {
        let from = event.at.plus(-margin()).max(self.floor);
        let seen = self
            .jobs
            .iter()
            .filter(|(_, job)| job.at >= from)
            .map(|(&job_id, job)| SeenJob {
                job_id,
                seq: job.seq,
                at: job.at,
            })
            .collect();
        Cursor {
            tenant_id: self.tenant_id,
            from,
            seen,
        }
    }
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
        at: Timestamp::now(),
        data: Some(JsonText(serde_json::json!({ "delta": notice.delta }))),
    }
}
