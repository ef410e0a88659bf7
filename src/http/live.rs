//! The live connections of the API, WebSocket connections and SSE streams, bounded per
//! tenant and for the whole process. Per address they are bounded already (see
//! `limits`), but one tenant's keys used from many addresses, or many addresses
//! together, could hold any number of them, each with its memory, its descriptor and
//! its share of every event of its tenant, until the process ran out of them.

use super::limits::{OpenCounts, Place};
use crate::config::LiveConnectionSettings;
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use std::sync::Arc;
use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use uuid::Uuid;

/// Live connections (WebSocket connections and SSE streams) one tenant may hold open
/// at once in one process: its subscriptions (2,000) fit in 20 connections of 100.
pub const MAX_LIVE_CONNECTIONS_PER_TENANT: usize = 256;

/// The live connections of one process.
#[derive(Debug)]
pub struct LiveConnections {
    per_tenant: OpenCounts<Uuid>,
    budget: Arc<Semaphore>,
}

impl LiveConnections {
    /// At most `settings.max_open` live connections in all, and
    /// [`MAX_LIVE_CONNECTIONS_PER_TENANT`] per tenant.
    pub fn new(settings: &LiveConnectionSettings) -> Self {
        Self {
            per_tenant: OpenCounts::new(MAX_LIVE_CONNECTIONS_PER_TENANT),
            budget: Arc::new(Semaphore::new(settings.max_open)),
        }
    }

    /// A place in the process's budget for one more live connection, or `None` when
    /// it is spent; given back when dropped.
    pub fn open(&self) -> Option<OwnedSemaphorePermit> {
        self.budget.clone().try_acquire_owned().ok()
    }

    /// A place among `tenant_id`'s live connections, or `None` when it holds its cap.
    pub fn admit_tenant(&self, tenant_id: Uuid) -> Option<Place<Uuid>> {
        self.per_tenant.admit(tenant_id)
    }
}

/// Why a tenant gets no more live connections, in words for its client.
pub fn tenant_full() -> String {
    format!(
        "a tenant may hold at most {MAX_LIVE_CONNECTIONS_PER_TENANT} live connections on one server"
    )
}

/// The answer when the process's budget of live connections is spent: another server
/// may have room, or this one shortly.
pub fn process_full() -> Response {
    (
        StatusCode::SERVICE_UNAVAILABLE,
        [(header::RETRY_AFTER, "5")],
        "the server holds as many live connections as it may",
    )
        .into_response()
}
