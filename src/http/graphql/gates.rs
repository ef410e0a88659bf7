//! The gates a request passes on its headers alone: the failed-authentication throttle
//! of its address, its credential (or, without one, the keyless rate of its address),
//! and a slot of its principal.

use super::responses::{coded_error, too_many_requests};
use crate::accounts::Principal;
use crate::accounts::api_keys::Identity;
use crate::graphql::ApiErrorCode;
use crate::http::HttpState;
use crate::http::auth::{AuthError, credential, identify};
use crate::http::client_limits::{ClientAddress, RequestOwner, RequestSlot, SLOT_WAIT};
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::response::Response;
use std::net::SocketAddr;
use std::time::{Duration, Instant};
use uuid::Uuid;

/// A request that passed authentication and holds one of its principal's slots.
pub(super) struct Admitted {
    pub(super) principal: Option<Principal>,
    /// The stored key presented, if one was.
    pub(super) key_id: Option<Uuid>,
    /// Held until the response is sent (or the client goes away).
    pub(super) slot: RequestSlot,
}

/// The gates that need only the headers: the address's failed authentications, the
/// credential, then a slot of the principal (or of the address, without a key).
pub(super) async fn admit(
    state: &HttpState,
    peer: SocketAddr,
    headers: &HeaderMap,
    media_type: &'static str,
) -> Result<Admitted, Response> {
    let client = ClientAddress::from(peer.ip());
    let identity = authenticate_client(state, client, headers, media_type).await?;
    let key_id = identity.as_ref().and_then(|identity| identity.key_id);
    let principal = identity.map(|identity| identity.principal);
    let owner = RequestOwner::of(principal.as_ref(), client);
    let Some(slot) = state.limits.slots.acquire(owner, SLOT_WAIT).await else {
        return Err(too_many_requests(
            media_type,
            Duration::from_secs(1),
            "too many requests in flight for this client",
        ));
    };
    Ok(Admitted {
        principal,
        key_id,
        slot,
    })
}

/// Who the request's `Authorization` stands for (`None`: no key), unless the address
/// has failed too often lately (429, decided without the database), the credential is
/// refused (401, counted against the address), or a keyless request finds its
/// address's bucket empty (429).
pub(in crate::http) async fn authenticate_client(
    state: &HttpState,
    client: ClientAddress,
    headers: &HeaderMap,
    media_type: &'static str,
) -> Result<Option<Identity>, Response> {
    let presented = headers.get(header::AUTHORIZATION);
    // The reservation is taken before the lookup, so that keys presented together
    // are not all looked up before the first refusals are counted.
    let attempt = match presented {
        Some(_) => match state.limits.auth_failures.reserve(client, SLOT_WAIT).await {
            Ok(attempt) => Some(attempt),
            Err(refusal) => {
                return Err(too_many_requests(
                    media_type,
                    refusal.retry_after(),
                    refusal.message(),
                ));
            }
        },
        None => None,
    };
    let principal = match credential(presented) {
        Ok(credential) => identify(&state.app, credential).await,
        Err(error) => Err(error),
    };
    match principal {
        Ok(None) => match state.limits.anonymous_rate.take(client, Instant::now()) {
            Ok(()) => Ok(None),
            Err(retry_after) => Err(too_many_requests(
                media_type,
                retry_after,
                "too many requests without a key from this address",
            )),
        },
        Ok(principal) => Ok(principal),
        Err(error @ (AuthError::Malformed | AuthError::UnknownKey | AuthError::Expired)) => {
            if let Some(attempt) = attempt
                && !matches!(error, AuthError::Expired)
            {
                attempt.failed();
            }
            let mut response = coded_error(
                media_type,
                StatusCode::UNAUTHORIZED,
                ApiErrorCode::Unauthenticated,
                &error.to_string(),
            );
            response
                .headers_mut()
                .insert(header::WWW_AUTHENTICATE, HeaderValue::from_static("Bearer"));
            Err(response)
        }
        Err(AuthError::Database(error)) => {
            tracing::error!(error = %error, "authenticating a request failed");
            Err(coded_error(
                media_type,
                StatusCode::INTERNAL_SERVER_ERROR,
                ApiErrorCode::Internal,
                "internal error",
            ))
        }
    }
}
