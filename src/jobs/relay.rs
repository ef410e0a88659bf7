//! Carries event notices between processes through PostgreSQL LISTEN/NOTIFY, so that
//! a job created by the API wakes a worker in another process at once, a cancel
//! reaches the worker running the job within milliseconds, and subscribers see events
//! written elsewhere without waiting for their poll.
//!
//! A notification is only a hint: it is sent inside the transaction that stores the
//! event (PostgreSQL delivers it on commit, never for a rolled-back one), and one lost
//! while the listener reconnects costs latency, not correctness — readers re-read the
//! table and poll as a fallback.

use super::events::{EventBus, EventNotice};
use sea_orm::sqlx::postgres::PgListener;
use sea_orm::{ConnectionTrait, DatabaseConnection, DbBackend, DbErr, Statement};
use std::time::Duration;
use tokio_util::sync::CancellationToken;

/// The channel every process listens on.
const CHANNEL: &str = "jobledger_events";
/// The pause before listening again after the connection failed.
const RECONNECT_DELAY: Duration = Duration::from_secs(1);

/// Sends `notice` to every listening process when the caller's transaction commits.
/// Does nothing on SQLite, where all workers share one process and its bus.
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

/// A LISTEN connection feeding notices from other processes into this one's bus.
pub struct NotificationRelay {
    listener: PgListener,
}

impl NotificationRelay {
    /// Starts listening; `None` on SQLite. Listening starts before this returns, so
    /// nothing committed afterwards is missed.
    pub async fn listen(db: &DatabaseConnection) -> Result<Option<Self>, DbErr> {
        if db.get_database_backend() != DbBackend::Postgres {
            return Ok(None);
        }
        let mut listener = PgListener::connect_with(db.get_postgres_connection_pool())
            .await
            .map_err(|error| DbErr::Custom(format!("LISTEN connection failed: {error}")))?;
        listener
            .listen(CHANNEL)
            .await
            .map_err(|error| DbErr::Custom(format!("LISTEN {CHANNEL} failed: {error}")))?;
        Ok(Some(Self { listener }))
    }

    /// Publishes every notification on `bus` until `shutdown` is cancelled. The
    /// listener reconnects by itself after a lost connection.
    pub async fn run(mut self, bus: EventBus, shutdown: CancellationToken) {
        loop {
            let received = tokio::select! {
                _ = shutdown.cancelled() => return,
                received = self.listener.recv() => received,
            };
            match received {
                Ok(notification) => {
                    match serde_json::from_str::<EventNotice>(notification.payload()) {
                        // Already published here when it was sent.
                        Ok(notice) if notice.origin == Some(bus.id()) => {}
                        Ok(notice) => bus.publish([notice]),
                        Err(error) => {
                            tracing::warn!(error = %error, "ignored an unreadable notification")
                        }
                    }
                }
                Err(error) => {
                    tracing::warn!(error = %error, "event notifications interrupted; readers fall back to polling");
                    tokio::select! {
                        _ = shutdown.cancelled() => return,
                        _ = tokio::time::sleep(RECONNECT_DELAY) => {}
                    }
                }
            }
        }
    }
}
