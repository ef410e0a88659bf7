//! Recording finished attempts in groups: attempts that end while the previous group
//! is being written are written together in the next transaction — one commit and a
//! few statements for all of them instead of a dozen statements each. A lone attempt
//! is written at once, so a quiet worker gains nothing and loses nothing.
//!
//! A group mixes tenants, and a finish writes its tenant's row, its job's and its
//! hold's. On PostgreSQL a tenant one of whose rows in the group another transaction
//! holds (a process frozen mid-transaction holds it until the idle timeout) is set
//! aside before the group is written: its attempts go to a lane of their own that
//! waits for the row, so one held row delays only its own tenant's finishes.

use crate::bus::EventNotice;
use crate::jobs::queue::{self, AttemptEnd};
use sea_orm::{ConnectionTrait, DatabaseConnection, DbBackend, DbErr, Statement};
use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex, PoisonError};
use tokio::sync::{mpsc, oneshot};
use uuid::Uuid;

/// Most attempts finished in one transaction.
const GROUP_LIMIT: usize = 64;

/// What became of an attempt handed to the finisher.
#[derive(Debug)]
pub(super) enum Finished {
    /// Recorded with its group (`None`: the claim no longer owned the job, and
    /// nothing was written for it).
    Recorded(Option<Vec<EventNotice>>),
    /// Its group could not be written: nothing of it was, and the attempt should be
    /// recorded alone, where an error concerns only itself.
    Alone(Box<AttemptEnd>),
    /// The finisher is gone (the process is stopping abnormally); lease expiry
    /// takes the job back.
    Stopped,
}

type Request = (AttemptEnd, oneshot::Sender<Finished>);

/// The handle of the task that writes finished attempts in groups.
#[derive(Debug)]
pub(super) struct Finisher {
    requests: mpsc::UnboundedSender<Request>,
}

impl Finisher {
    /// Starts the task; it ends when the handle is dropped.
    pub(super) fn spawn(db: DatabaseConnection) -> Self {
        let (requests, queue) = mpsc::unbounded_channel();
        tokio::spawn(write_groups(db, queue));
        Self { requests }
    }

    /// Records `end` with whatever other attempts end at about the same time.
    pub(super) async fn finish(&self, end: AttemptEnd) -> Finished {
        let (reply, answer) = oneshot::channel();
        if let Err(mpsc::error::SendError((end, _))) = self.requests.send((end, reply)) {
            return Finished::Alone(Box::new(end));
        }
        answer.await.unwrap_or(Finished::Stopped)
    }
}

async fn write_groups(db: DatabaseConnection, mut queue: mpsc::UnboundedReceiver<Request>) {
    let lanes = Lanes::default();
    while let Some(first) = queue.recv().await {
        let mut group = vec![first];
        while group.len() < GROUP_LIMIT {
            match queue.try_recv() {
                Ok(request) => group.push(request),
                Err(_) => break,
            }
        }
        let held = held_elsewhere(&db, &group).await;
        // A tenant with a lane goes on in its lane even when its rows look free: the
        // lane's transaction may take them right after the look (its tenant's row,
        // then the held job's), and a group holding one of that tenant's finishes
        // would wait behind it with every other tenant's.
        let (aside, group): (Vec<Request>, Vec<Request>) =
            group.into_iter().partition(|(end, _)| {
                let tenant_id = end.claim.job.tenant_id;
                held.contains(&tenant_id) || lanes.is_open(tenant_id)
            });
        for request in aside {
            lanes.send(&db, request);
        }
        write(&db, group).await;
    }
}

/// Writes one group in one transaction and answers each of its attempts.
async fn write(db: &DatabaseConnection, group: Vec<Request>) {
    if group.is_empty() {
        return;
    }
    let (ends, replies): (Vec<AttemptEnd>, Vec<_>) = group.into_iter().unzip();
    match queue::finish_attempts(db, &ends).await {
        Ok(finished) => {
            for (reply, finished) in replies.into_iter().zip(finished) {
                // The attempt's task may be gone (aborted at shutdown): its job is
                // recorded all the same.
                let _ = reply.send(Finished::Recorded(finished));
            }
        }
        Err(error) => {
            tracing::warn!(error = %error, attempts = ends.len(), "recording a group of finished attempts failed; recording them one by one");
            for (reply, end) in replies.into_iter().zip(ends) {
                let _ = reply.send(Finished::Alone(Box::new(end)));
            }
        }
    }
}

/// The tenants of the group to set aside: those whose own row, or the row of one of
/// their jobs or holds in the group, another transaction holds right now (PostgreSQL;
/// SQLite has one writer at a time and nothing to skip). Asking is one statement that
/// locks nothing beyond itself; if it fails, nothing is set aside.
async fn held_elsewhere(db: &DatabaseConnection, group: &[Request]) -> HashSet<Uuid> {
    if db.get_database_backend() != DbBackend::Postgres {
        return HashSet::new();
    }
    match free_rows(db, group).await {
        Ok(free) => group
            .iter()
            .map(|(end, _)| &end.claim.job)
            .filter(|job| {
                !free.contains(&(RowKind::Tenant, job.tenant_id))
                    || !free.contains(&(RowKind::Job, job.id))
                    || !free.contains(&(RowKind::Hold, job.id))
            })
            .map(|job| job.tenant_id)
            .collect(),
        Err(error) => {
            tracing::warn!(error = %error, "could not tell which rows are held; writing the group as it is");
            HashSet::new()
        }
    }
}

/// The rows a finish writes that may be held by another transaction.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
enum RowKind {
    Tenant,
    Job,
    /// A job's hold (`credit_reservations`, by job id).
    Hold,
}

/// The group's tenant, job and hold rows that nobody holds, locked for the statement
/// only.
async fn free_rows(
    db: &DatabaseConnection,
    group: &[Request],
) -> Result<HashSet<(RowKind, Uuid)>, DbErr> {
    let array = |ids: Vec<Uuid>| {
        sea_orm::Value::Array(
            sea_orm::sea_query::ArrayType::String,
            Some(Box::new(
                ids.iter().map(|id| id.to_string().into()).collect(),
            )),
        )
    };
    let tenants: HashSet<Uuid> = group
        .iter()
        .map(|(end, _)| end.claim.job.tenant_id)
        .collect();
    let jobs: Vec<Uuid> = group.iter().map(|(end, _)| end.claim.job.id).collect();
    let statement = Statement::from_sql_and_values(
        DbBackend::Postgres,
        "WITH t AS (SELECT id FROM tenants WHERE id = ANY($1::uuid[])
                    FOR NO KEY UPDATE SKIP LOCKED),
              j AS (SELECT id FROM jobs WHERE id = ANY($2::uuid[])
                    FOR NO KEY UPDATE SKIP LOCKED),
              h AS (SELECT job_id AS id FROM credit_reservations WHERE job_id = ANY($2::uuid[])
                    FOR NO KEY UPDATE SKIP LOCKED)
         SELECT 0 AS kind, id FROM t
         UNION ALL SELECT 1, id FROM j
         UNION ALL SELECT 2, id FROM h",
        [array(tenants.into_iter().collect()), array(jobs)],
    );
    let mut free = HashSet::new();
    for row in db.query_all_raw(statement).await? {
        let kind = match row.try_get_by_index::<i32>(0)? {
            0 => RowKind::Tenant,
            1 => RowKind::Job,
            _ => RowKind::Hold,
        };
        free.insert((kind, row.try_get_by_index::<Uuid>(1)?));
    }
    Ok(free)
}

/// One task per tenant set aside, writing that tenant's attempts in groups while it
/// waits for the row; a lane ends when it has nothing left.
#[derive(Default)]
struct Lanes {
    open: Arc<Mutex<HashMap<Uuid, mpsc::UnboundedSender<Request>>>>,
}

impl Lanes {
    /// Whether `tenant_id` has a lane still writing or waiting.
    fn is_open(&self, tenant_id: Uuid) -> bool {
        self.open
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .contains_key(&tenant_id)
    }

    fn send(&self, db: &DatabaseConnection, request: Request) {
        let tenant_id = request.0.claim.job.tenant_id;
        let mut open = self.open.lock().unwrap_or_else(PoisonError::into_inner);
        let request = match open.get(&tenant_id) {
            Some(lane) => match lane.send(request) {
                Ok(()) => return,
                Err(mpsc::error::SendError(request)) => request,
            },
            None => request,
        };
        let (lane, queue) = mpsc::unbounded_channel();
        // Just made: its receiver is alive.
        let _ = lane.send(request);
        open.insert(tenant_id, lane);
        tokio::spawn(write_lane(
            db.clone(),
            tenant_id,
            queue,
            Arc::clone(&self.open),
        ));
    }
}

async fn write_lane(
    db: DatabaseConnection,
    tenant_id: Uuid,
    mut queue: mpsc::UnboundedReceiver<Request>,
    open: Arc<Mutex<HashMap<Uuid, mpsc::UnboundedSender<Request>>>>,
) {
    loop {
        let mut group = Vec::new();
        while group.len() < GROUP_LIMIT {
            match queue.try_recv() {
                Ok(request) => group.push(request),
                Err(_) => break,
            }
        }
        if group.is_empty() {
            // Senders look the lane up under the same lock: once it is gone from the
            // map nothing more arrives, and what arrived before is read here.
            let mut lanes = open.lock().unwrap_or_else(PoisonError::into_inner);
            match queue.try_recv() {
                Ok(request) => group.push(request),
                Err(_) => {
                    lanes.remove(&tenant_id);
                    return;
                }
            }
        }
        write(&db, group).await;
    }
}
