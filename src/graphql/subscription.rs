//! Live job status.

use super::types::{BatchUpdate, JobEvent};
use super::{ApiErrorCode, app, principal};
use crate::accounts::access_tokens::AccessScope;
use crate::bus::{MAX_SUBSCRIPTIONS_PER_TENANT, SubscriptionSlot};
use crate::error::ServiceError;
use crate::jobs::events::cursor::Cursor;
use crate::jobs::{batches, events, service};
use async_graphql::{Context, Subscription};
use futures_util::{Stream, StreamExt};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};
use uuid::Uuid;

/// Live subscriptions one connection may hold at once.
pub const MAX_SUBSCRIPTIONS_PER_CONNECTION: usize = 100;

/// The root of every subscription.
pub struct SubscriptionRoot;

#[Subscription]
impl SubscriptionRoot {
    /// The job's events after `afterSeq` (all when omitted): the stored ones first,
    /// then new ones as they happen; completes after the terminal event.
    async fn job_updates(
        &self,
        context: &Context<'_>,
        job_id: Uuid,
        after_seq: Option<i32>,
    ) -> async_graphql::Result<impl Stream<Item = async_graphql::Result<JobEvent>> + use<>> {
        let (tenant_id, reach) = principal(context)?.job_access(AccessScope::ReadJobs)?;
        let app = app(context);
        let slots = admit(context, tenant_id)?;
        // Ownership is checked once, up front: events never change tenant, nor a job
        // its labels.
        service::find_job(&app.db, tenant_id, job_id).await?;
        reach.require(&app.db, tenant_id, job_id).await?;
        let updates = events::job_updates(app.db.clone(), &app.bus, job_id, after_seq.unwrap_or(0));
        Ok(served(updates, slots))
    }

    /// Every event of the caller's jobs from now on, live (output deltas excepted:
    /// follow one job's `jobUpdates` for those), each with its `cursor`. With `after`
    /// (a cursor of this account), first the stored events that cursor had not seen,
    /// then live ones: each event once, in order within each job. Never completes by
    /// itself.
    async fn account_job_updates(
        &self,
        context: &Context<'_>,
        after: Option<String>,
    ) -> async_graphql::Result<impl Stream<Item = async_graphql::Result<JobEvent>> + use<>> {
        let tenant_id = principal(context)?.tenant_id()?;
        let after = after
            .map(|text| Cursor::parse(&text, tenant_id))
            .transpose()?;
        let app = app(context);
        let slots = admit(context, tenant_id)?;
        let updates =
            events::account_updates(app.db.clone(), &app.bus, tenant_id, after).map(|update| {
                update.map(|(event, cursor)| JobEvent {
                    event,
                    cursor: Some(cursor),
                })
            });
        Ok(served(updates, slots))
    }

    /// A batch's progress: its state now, then its counts and charge as they change
    /// (at most a few updates a second, always the latest); completes after FINISHED.
    async fn batch_updates(
        &self,
        context: &Context<'_>,
        batch_id: Uuid,
    ) -> async_graphql::Result<impl Stream<Item = async_graphql::Result<BatchUpdate>> + use<>> {
        let tenant_id = principal(context)?.tenant_id()?;
        let app = app(context);
        let slots = admit(context, tenant_id)?;
        batches::find_batch(&app.db, tenant_id, batch_id).await?;
        let updates =
            batches::updates::batch_updates(app.db.clone(), &app.bus, tenant_id, batch_id);
        Ok(updates.map(move |update| {
            let _held = &slots;
            update.map(BatchUpdate::from).map_err(Into::into)
        }))
    }
}

/// The live subscriptions of one connection, counted against
/// [`MAX_SUBSCRIPTIONS_PER_CONNECTION`], and since when it has held none (a
/// connection holding none for long is closed); put in each connection's data.
#[derive(Clone, Debug, Default)]
pub struct ConnectionSubscriptions(Arc<Mutex<LiveCount>>);

#[derive(Debug)]
struct LiveCount {
    open: usize,
    /// When `open` last changed (or the connection opened).
    changed_at: Instant,
}

impl Default for LiveCount {
    fn default() -> Self {
        Self {
            open: 0,
            changed_at: Instant::now(),
        }
    }
}

impl ConnectionSubscriptions {
    fn admit(&self) -> Option<ConnectionSlot> {
        let mut count = self.lock();
        if count.open >= MAX_SUBSCRIPTIONS_PER_CONNECTION {
            return None;
        }
        count.open += 1;
        count.changed_at = Instant::now();
        Some(ConnectionSlot(self.clone()))
    }

    /// How long the connection has held no live subscription; `None` while it holds
    /// one.
    pub fn quiet_for(&self) -> Option<Duration> {
        let count = self.lock();
        (count.open == 0).then(|| count.changed_at.elapsed())
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, LiveCount> {
        self.0.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

/// One subscription counted against its connection's limit.
struct ConnectionSlot(ConnectionSubscriptions);

impl Drop for ConnectionSlot {
    fn drop(&mut self) {
        let mut count = self.0.lock();
        count.open -= 1;
        count.changed_at = Instant::now();
    }
}

/// What a live subscription holds until it ends: its places in the connection's and
/// the tenant's counts.
struct Slots {
    _connection: Option<ConnectionSlot>,
    _tenant: SubscriptionSlot,
}

/// Counts a new subscription against its connection and its tenant, or refuses it
/// with `SUBSCRIPTION_LIMIT`.
fn admit(context: &Context<'_>, tenant_id: Uuid) -> async_graphql::Result<Slots> {
    let connection = match context.data_opt::<ConnectionSubscriptions>() {
        Some(subscriptions) => Some(subscriptions.admit().ok_or_else(|| {
            ApiErrorCode::SubscriptionLimit.error(format!(
                "a connection may hold at most {MAX_SUBSCRIPTIONS_PER_CONNECTION} subscriptions"
            ))
        })?),
        None => None,
    };
    let tenant = app(context)
        .bus
        .admit_subscription(tenant_id)
        .ok_or_else(|| {
            ApiErrorCode::SubscriptionLimit.error(format!(
                "a tenant may hold at most {MAX_SUBSCRIPTIONS_PER_TENANT} subscriptions on one server"
            ))
        })?;
    Ok(Slots {
        _connection: connection,
        _tenant: tenant,
    })
}

/// The stream a client sees, holding its slots until it ends.
fn served(
    updates: impl Stream<Item = Result<impl Into<JobEvent>, sea_orm::DbErr>> + Send + 'static,
    slots: Slots,
) -> impl Stream<Item = async_graphql::Result<JobEvent>> {
    updates.map(move |event| {
        let _held = &slots;
        event
            .map(Into::into)
            .map_err(|error| ServiceError::from(error).into())
    })
}
