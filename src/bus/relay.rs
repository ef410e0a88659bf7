//! Carries event notices between processes through PostgreSQL LISTEN/NOTIFY, so that
//! a job created by the API wakes a worker in another process at once, a cancel
//! reaches the worker running the job within milliseconds, and subscribers see events
//! written elsewhere without waiting for their poll.
//!
//! A notification is only a hint: it is sent inside the transaction that stores the
//! event (PostgreSQL delivers it on commit, never for a rolled-back one). Those lost
//! while the listener reconnects cost latency, not correctness: once listening again,
//! the relay tells every receiver that notices were missed, and each re-reads the
//! table.
//!
//! SQLite has no notifications; there one shared poll of the events table, past the
//! last row it saw, stands in for them — one query a second for the whole process,
//! however many subscribers it serves; its notices carry the events it read, so that
//! subscribers need not read them again.

use super::{EventBus, EventNotice, StoredEvent};
use entity::{EventKind, JobStatus, JsonText, Timestamp};
use sea_orm::sea_query::{
    Alias, CommonTableExpression, Expr, Func, InsertStatement, Query, WithClause,
};
use sea_orm::sqlx::postgres::PgListener;
use sea_orm::{ConnectionTrait, DatabaseConnection, DbBackend, DbErr, FromQueryResult, Statement};
use std::time::Duration;
use tokio_util::sync::CancellationToken;
use uuid::Uuid;

/// The channel stored events and deltas travel on.
const CHANNEL: &str = "jobledger_events";
/// The channel revoked API keys travel on: open connections using them are closed.
const REVOCATIONS: &str = "jobledger_key_revocations";
/// The pause before listening again after the connection failed.
const RECONNECT_DELAY: Duration = Duration::from_secs(1);
/// How often SQLite's shared poll looks for events stored by other processes.
const SQLITE_POLL_INTERVAL: Duration = Duration::from_secs(1);
/// Most events one SQLite poll reads; a longer backlog is read on the next turns.
const SQLITE_POLL_BATCH: u32 = 1_000;

/// Sends `notice` to every listening process when the caller's transaction commits.
/// Does nothing on SQLite, where the shared poll finds stored events.
pub async fn notify(db: &impl ConnectionTrait, notice: &EventNotice) -> Result<(), DbErr> {
    if db.get_database_backend() != DbBackend::Postgres {
        return Ok(());
    }
    let payload = serde_json::to_string(notice).expect("a notice serializes");
    db.execute_raw(Statement::from_sql_and_values(
        DbBackend::Postgres,
        "SELECT pg_notify($1, $2)",
        [CHANNEL.into(), payload.into()],
    ))
    .await?;
    Ok(())
}

/// Runs `insert` (event rows) and, on PostgreSQL, sends each of `notices` to every
/// listening process when the caller's transaction commits — all in one statement,
/// a round trip fewer for every batch of events.
pub async fn store_and_notify(
    db: &impl ConnectionTrait,
    insert: InsertStatement,
    notices: &[EventNotice],
) -> Result<(), DbErr> {
    if db.get_database_backend() != DbBackend::Postgres || notices.is_empty() {
        db.execute(&insert).await?;
        return Ok(());
    }
    let stored = Alias::new("stored");
    // A data-modifying WITH runs to completion whether or not the SELECT reads it.
    let mut statement = Query::select();
    for notice in notices {
        let payload = serde_json::to_string(notice).expect("a notice serializes");
        statement.expr(Func::cust("pg_notify").args([Expr::val(CHANNEL), Expr::val(payload)]));
    }
    let statement = statement.to_owned().with(
        WithClause::new()
            .cte(
                CommonTableExpression::new()
                    .query(insert)
                    .table_name(stored)
                    .to_owned(),
            )
            .to_owned(),
    );
    db.query_all(&statement).await?;
    Ok(())
}

/// Publishes a notice that is never stored (an output delta) once to every
/// subscriber: on the local bus at once — in order with this process's stored events —
/// and, on PostgreSQL, to the other processes through NOTIFY, marked with this
/// process's id so that its own listener skips it.
pub async fn broadcast(db: &DatabaseConnection, bus: &EventBus, notice: EventNotice) {
    bus.publish([notice.clone()]);
    let notice = EventNotice {
        origin: Some(bus.id()),
        ..notice
    };
    if let Err(error) = notify(db, &notice).await {
        tracing::warn!(job.id = %notice.job_id, error = %error, "an output delta did not reach other processes");
    }
}

/// Tells the other processes, when the caller's transaction commits, that `key_id`
/// was revoked. Does nothing on SQLite, where the API runs in one process.
pub async fn notify_revoked_key(db: &impl ConnectionTrait, key_id: Uuid) -> Result<(), DbErr> {
    if db.get_database_backend() == DbBackend::Postgres {
        db.execute_raw(Statement::from_sql_and_values(
            DbBackend::Postgres,
            "SELECT pg_notify($1, $2)",
            [REVOCATIONS.into(), key_id.to_string().into()],
        ))
        .await?;
    }
    Ok(())
}

/// Feeds what other processes stored into this process's bus: a LISTEN connection on
/// PostgreSQL, a shared poll of the events table on SQLite.
pub enum NotificationRelay {
    Postgres {
        listener: PgListener,
        /// Where the LISTEN connection goes: a direct URL when the pools go through a
        /// transaction-mode pooler (a pooler hands a session's server connection to
        /// other clients between transactions, and notifications with it); `None`:
        /// a connection like the pool's.
        url: Option<String>,
    },
    Sqlite {
        last_row: i64,
    },
}

impl NotificationRelay {
    /// Starts listening (PostgreSQL) or marks where the poll starts (SQLite). Either
    /// way nothing committed after this returns is missed.
    pub async fn listen(db: &DatabaseConnection, url: Option<String>) -> Result<Self, DbErr> {
        match db.get_database_backend() {
            DbBackend::Postgres => Ok(Self::Postgres {
                listener: listen(db, url.as_deref()).await?,
                url,
            }),
            _ => Ok(Self::Sqlite {
                last_row: latest_row(db).await?,
            }),
        }
    }

    /// Publishes what other processes stored on `bus` until `shutdown` is cancelled,
    /// reconnecting after a lost connection.
    pub async fn run(self, db: DatabaseConnection, bus: EventBus, shutdown: CancellationToken) {
        match self {
            Self::Postgres { listener, url } => {
                relay_notifications(db, url, listener, bus, shutdown).await
            }
            Self::Sqlite { last_row } => poll_sqlite(db, last_row, bus, shutdown).await,
        }
    }
}

async fn listen(db: &DatabaseConnection, url: Option<&str>) -> Result<PgListener, DbErr> {
    let listener = match url {
        Some(url) => PgListener::connect(url).await,
        None => PgListener::connect_with(db.get_postgres_connection_pool()).await,
    };
    let mut listener =
        listener.map_err(|error| DbErr::Custom(format!("LISTEN connection failed: {error}")))?;
    listener
        .listen_all([CHANNEL, REVOCATIONS])
        .await
        .map_err(|error| DbErr::Custom(format!("LISTEN {CHANNEL} failed: {error}")))?;
    Ok(listener)
}

async fn relay_notifications(
    db: DatabaseConnection,
    url: Option<String>,
    mut listener: PgListener,
    bus: EventBus,
    shutdown: CancellationToken,
) {
    loop {
        let received = tokio::select! {
            _ = shutdown.cancelled() => return,
            // `try_recv` reports a lost connection instead of quietly reconnecting, so
            // the relay knows when notifications may have been lost.
            received = listener.try_recv() => received,
        };
        match received {
            Ok(Some(notification)) if notification.channel() == REVOCATIONS => {
                match notification.payload().parse() {
                    Ok(key_id) => bus.announce_revoked_key(key_id),
                    Err(error) => {
                        tracing::warn!(error = %error, "ignored an unreadable key revocation")
                    }
                }
            }
            Ok(Some(notification)) => {
                match serde_json::from_str::<EventNotice>(notification.payload()) {
                    // Already published here when it was sent.
                    Ok(notice) if notice.origin == Some(bus.id()) => {}
                    Ok(notice) => bus.publish_relayed([notice], true),
                    Err(error) => {
                        tracing::warn!(error = %error, "ignored an unreadable notification")
                    }
                }
            }
            lost => {
                if let Err(error) = lost {
                    tracing::warn!(error = %error, "event notifications interrupted");
                }
                listener = loop {
                    tokio::select! {
                        _ = shutdown.cancelled() => return,
                        _ = tokio::time::sleep(RECONNECT_DELAY) => {}
                    }
                    match listen(&db, url.as_deref()).await {
                        Ok(listener) => break listener,
                        Err(error) => {
                            tracing::warn!(error = %error, "listening again failed; retrying")
                        }
                    }
                };
                tracing::info!("event notifications resumed");
                bus.announce_missed_notices();
            }
        }
    }
}

/// One event as the SQLite poll reads it.
#[derive(FromQueryResult)]
struct PolledEvent {
    row: i64,
    job_id: Uuid,
    tenant_id: Uuid,
    seq: i32,
    kind: EventKind,
    status: JobStatus,
    at: Timestamp,
    data: Option<JsonText>,
}

async fn poll_sqlite(
    db: DatabaseConnection,
    mut last_row: i64,
    bus: EventBus,
    shutdown: CancellationToken,
) {
    let mut interval = tokio::time::interval(SQLITE_POLL_INTERVAL);
    loop {
        tokio::select! {
            _ = shutdown.cancelled() => return,
            _ = interval.tick() => {}
        }
        // Only subscribers need this: this process's workers poll for work anyway.
        if bus.watched_topics() == 0 {
            last_row = match latest_row(&db).await {
                Ok(row) => row,
                Err(error) => {
                    tracing::warn!(error = %error, "polling for events failed");
                    last_row
                }
            };
            continue;
        }
        let polled = PolledEvent::find_by_statement(Statement::from_sql_and_values(
            DbBackend::Sqlite,
            "SELECT rowid AS row, job_id, tenant_id, seq, kind, status, at, data FROM job_events \
             WHERE rowid > ? ORDER BY rowid LIMIT ?",
            [last_row.into(), SQLITE_POLL_BATCH.into()],
        ))
        .all(&db)
        .await;
        match polled {
            Ok(events) => {
                last_row = events.last().map_or(last_row, |event| event.row);
                // This process's own events come round again: the bus drops them.
                // Created notices are left out: every worker loop polls for work on
                // its own.
                bus.publish_relayed(
                    events.into_iter().map(|event| EventNotice {
                        job_id: event.job_id,
                        tenant_id: event.tenant_id,
                        seq: event.seq,
                        kind: event.kind,
                        status: event.status,
                        delta: None,
                        stored: StoredEvent::carried(
                            event.at,
                            event.data.as_ref().map(|data| &data.0),
                        ),
                        origin: None,
                    }),
                    false,
                );
            }
            Err(error) => tracing::warn!(error = %error, "polling for events failed"),
        }
    }
}

async fn latest_row(db: &DatabaseConnection) -> Result<i64, DbErr> {
    let row = db
        .query_one_raw(Statement::from_string(
            DbBackend::Sqlite,
            "SELECT COALESCE(MAX(rowid), 0) AS last_row FROM job_events",
        ))
        .await?
        .ok_or_else(|| DbErr::Custom("MAX(rowid) returned no row".into()))?;
    row.try_get("", "last_row")
}
