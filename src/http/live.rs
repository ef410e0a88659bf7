//! The live connections of the API, WebSocket connections and SSE streams, bounded per
//! tenant and for the whole process. Per address they are bounded already (see
//! `limits`), but one tenant's keys used from many addresses, or many addresses
//! together, could hold any number of them, each with its memory, its descriptor and
//! its share of every event of its tenant, until the process ran out of them.

use super::client_limits::{OpenCounts, Place};
use crate::accounts::Principal;
use crate::config::LiveConnectionSettings;
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use std::sync::Arc;
use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use uuid::Uuid;

/// Live connections (WebSocket connections and SSE streams) one tenant may hold open
/// at once in one process: its subscriptions (2,000) fit in 20 connections of 100.
pub const MAX_LIVE_CONNECTIONS_PER_TENANT: usize = 256;

/// Live connections one access token may hold at once in one process: a browser tab
/// needs one or two, and a token must not fill its tenant's
/// [`MAX_LIVE_CONNECTIONS_PER_TENANT`] and so deny its backend and its other users.
pub const MAX_LIVE_CONNECTIONS_PER_TOKEN: usize = 16;

/// The live connections of one process.
#[derive(Debug)]
pub struct LiveConnections {
    per_tenant: OpenCounts<Uuid>,
    per_token: OpenCounts<Uuid>,
    budget: Arc<Semaphore>,
}

/// The places one live connection holds among its tenant's and its token's; given
/// back when dropped.
#[derive(Debug)]
pub struct LivePlaces {
    _tenant: Option<Place<Uuid>>,
    _token: Option<Place<Uuid>>,
}

impl LiveConnections {
    /// At most `settings.max_open` live connections in all, and
    /// [`MAX_LIVE_CONNECTIONS_PER_TENANT`] per tenant.
    pub fn new(settings: &LiveConnectionSettings) -> Self {
        Self {
            per_tenant: OpenCounts::new(MAX_LIVE_CONNECTIONS_PER_TENANT),
            per_token: OpenCounts::new(MAX_LIVE_CONNECTIONS_PER_TOKEN),
            budget: Arc::new(Semaphore::new(settings.max_open)),
        }
    }

    /// A place in the process's budget for one more live connection, or `None` when
    /// it is spent; given back when dropped.
    pub fn open(&self) -> Option<OwnedSemaphorePermit> {
        self.budget.clone().try_acquire_owned().ok()
    }

    /// The places of one more live connection of `principal`: among its tenant's, and
    /// for an access token among the token's too; the words of the refusal when one is
    /// full. The admin counts against neither.
    pub fn admit(&self, principal: &Principal) -> Result<LivePlaces, String> {
        let token = match principal {
            Principal::Token(grant) => Some(
                self.per_token
                    .admit(grant.token_id)
                    .ok_or_else(token_full)?,
            ),
            Principal::Admin | Principal::Tenant { .. } => None,
        };
        let tenant = match principal.counted_tenant() {
            Some(tenant_id) => Some(self.per_tenant.admit(tenant_id).ok_or_else(tenant_full)?),
            None => None,
        };
        Ok(LivePlaces {
            _tenant: tenant,
            _token: token,
        })
    }
}

fn token_full() -> String {
    format!(
        "an access token may hold at most {MAX_LIVE_CONNECTIONS_PER_TOKEN} live connections on one server"
    )
}

/// Why a tenant gets no more live connections, in words for its client.
fn tenant_full() -> String {
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
