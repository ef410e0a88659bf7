//! Live job status.

use super::types::JobEvent;
use super::{app, principal};
use crate::error::ServiceError;
use crate::jobs::{events, service};
use async_graphql::{Context, Subscription};
use futures_util::{Stream, StreamExt};
use uuid::Uuid;

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
        let tenant_id = principal(context)?.tenant_id()?;
        let app = app(context);
        // Ownership is checked once, up front: events never change tenant.
        service::find_job(&app.db, tenant_id, job_id).await?;
        let updates = events::job_updates(app.db.clone(), &app.bus, job_id, after_seq.unwrap_or(0));
        Ok(updates.map(|event| {
            event
                .map(JobEvent)
                .map_err(|error| ServiceError::from(error).into())
        }))
    }
}
