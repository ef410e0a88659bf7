//! GraphQL subscriptions over WebSocket, with the API key in `connection_init`.
//!
//! async-graphql speaks the protocols; this module owns the socket around them: it
//! caps message sizes before anyone is authenticated, counts the subscriptions a
//! client starts before async-graphql reads them (see `subscription_tally`), pings idle
//! connections and drops dead ones, gives a client a few seconds to authenticate,
//! closes an authenticated connection that held no subscription for a while (it
//! answers pings, so nothing else would ever close it; one holding a subscription is
//! never closed as idle), polls only the subscriptions something woke (see `woken`),
//! and closes a connection with 4401 when `connection_init` carries no key (an anonymous
//! connection has nothing to subscribe to) and with 4403 when its key is refused or
//! revoked.

mod subscription_tally;
mod woken;

use super::HttpState;
use super::auth::{AuthError, identify, time_until};
use super::client_limits::{ClientAddress, MAX_SOCKETS_PER_ADDRESS, SLOT_WAIT};
use super::live;
use super::live::LivePlaces;
use crate::accounts::api_keys;
use crate::graphql::ConnectionSubscriptions;
use crate::graphql::cost::StreamingTransport;
use async_graphql::Data;
use async_graphql::http::{ALL_WEBSOCKET_PROTOCOLS, WebSocketProtocols, WsMessage};
use axum::extract::ws::{CloseFrame, Message, WebSocket};
use axum::extract::{ConnectInfo, State, WebSocketUpgrade};
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::{IntoResponse, Response};
use entity::Timestamp;
use futures_util::{SinkExt, StreamExt};
use std::net::SocketAddr;
use std::str::FromStr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};
use subscription_tally::SubscriptionTally;
use uuid::Uuid;
use woken::WokenOnly;

/// Largest message or frame read, before and after authentication: a subscription
/// request is a few kilobytes, and nothing bigger is read into memory.
const MAX_MESSAGE_BYTES: usize = 64 * 1024;
/// How often the server pings: keeps idle subscriptions open through proxies, and
/// gives a dead peer a chance to show itself.
const PING_INTERVAL: Duration = Duration::from_secs(15);
/// A connection from which nothing, not even a pong, arrived for this long is closed.
const SILENCE_LIMIT: Duration = Duration::from_secs(45);
/// How long a client has to send `connection_init`.
const INIT_TIMEOUT: Duration = Duration::from_secs(10);
/// Messages a connection sends before it lets the other tasks of its worker thread
/// run: a socket that keeps taking writes never makes the loop wait, so a burst of
/// one tenant's events reaching its hundred streams held the thread while other
/// tenants' requests queued behind it.
const MESSAGES_PER_TURN: u32 = 16;

/// `connection_init` carried no key.
const CLOSE_UNAUTHORIZED: u16 = 4401;
/// graphql-transport-ws: the key was refused or revoked.
const CLOSE_FORBIDDEN: u16 = 4403;
/// Too many failed authentications from this address, too many subscriptions started
/// at once on this connection, or too many live connections of its tenant.
const CLOSE_TOO_MANY: u16 = 4429;
/// graphql-transport-ws: no `connection_init` in time.
const CLOSE_INIT_TIMEOUT: u16 = 4408;
/// The peer went silent.
const CLOSE_GOING_AWAY: u16 = 1001;
/// The connection held no subscription for the configured time.
const CLOSE_NORMAL: u16 = 1000;
/// The peer broke the WebSocket protocol.
const CLOSE_PROTOCOL_ERROR: u16 = 1002;
/// The peer sent a message above [`MAX_MESSAGE_BYTES`].
const CLOSE_TOO_BIG: u16 = 1009;

/// Accepts `graphql-transport-ws` and the legacy `graphql-ws` subprotocol.
pub async fn upgrade(
    State(state): State<HttpState>,
    ConnectInfo(peer): ConnectInfo<SocketAddr>,
    headers: HeaderMap,
    upgrade: WebSocketUpgrade,
) -> Response {
    // Before anything is counted: a page of another site never gets a socket.
    if !state.origins.may_open_socket(&headers) {
        return super::cors::socket_refused();
    }
    let client = ClientAddress::from(peer.ip());
    let Some(place) = state.limits.sockets.admit(client) else {
        return (
            StatusCode::TOO_MANY_REQUESTS,
            format!("at most {MAX_SOCKETS_PER_ADDRESS} WebSocket connections per client address"),
        )
            .into_response();
    };
    let Some(budget) = state.limits.live.open() else {
        return live::process_full();
    };
    let Some(protocol) = requested_protocol(&headers) else {
        return (
            StatusCode::BAD_REQUEST,
            "Sec-WebSocket-Protocol must name graphql-transport-ws or graphql-ws",
        )
            .into_response();
    };
    upgrade
        .protocols(ALL_WEBSOCKET_PROTOCOLS)
        .max_message_size(MAX_MESSAGE_BYTES)
        .max_frame_size(MAX_MESSAGE_BYTES)
        .on_upgrade(move |socket| async move {
            serve(state, client, protocol, socket).await;
            drop((place, budget));
        })
}

fn requested_protocol(headers: &HeaderMap) -> Option<WebSocketProtocols> {
    headers
        .get(header::SEC_WEBSOCKET_PROTOCOL)?
        .to_str()
        .ok()?
        .split(',')
        .find_map(|protocol| WebSocketProtocols::from_str(protocol.trim()).ok())
}

/// What `connection_init` established, shared with the loop that watches the socket.
#[derive(Default)]
struct Handshake {
    /// The stored key the connection authenticated with, once it did (`None` inside:
    /// the admin token, which cannot be revoked).
    key: OnceLock<Option<Uuid>>,
    /// When the access token the connection authenticated with expires.
    expires_at: OnceLock<Timestamp>,
    /// The close code of a refused `connection_init`.
    refused: OnceLock<u16>,
    /// The connection's place among its tenant's live connections, once it holds one.
    live_places: OnceLock<LivePlaces>,
    /// Why the server stopped reading the socket, once it did: the close code and
    /// reason.
    read_error: OnceLock<(u16, &'static str)>,
}

async fn serve(
    state: HttpState,
    client: ClientAddress,
    protocol: WebSocketProtocols,
    socket: WebSocket,
) {
    let started = Instant::now();
    let heard_at_millis = Arc::new(AtomicU64::new(0));
    let handshake = Arc::new(Handshake::default());
    let (mut sink, stream) = socket.split();

    let heard = heard_at_millis.clone();
    let failed = handshake.clone();
    let overflowed = handshake.clone();
    let tally = Arc::new(SubscriptionTally::default());
    let counted = tally.clone();
    let input = stream
        .take_while(move |frame| {
            if let Err(error) = frame {
                // The error type is opaque; its text tells a size limit from the rest.
                let text = error.to_string();
                let code = if text.contains("too long") || text.contains("too big") {
                    CLOSE_TOO_BIG
                } else {
                    CLOSE_PROTOCOL_ERROR
                };
                let _ = failed
                    .read_error
                    .set((code, "the message could not be read"));
            }
            std::future::ready(frame.is_ok())
        })
        .filter_map(move |frame| {
            // Any frame, a pong included, shows the peer is alive.
            heard.store(started.elapsed().as_millis() as u64, Ordering::Relaxed);
            std::future::ready(match frame {
                Ok(message @ (Message::Text(_) | Message::Binary(_))) => Some(message.into_data()),
                _ => None,
            })
        })
        // Counted before async-graphql reads it: past the bounds the stream ends, and
        // the connection is closed, before anything more is read into memory.
        .take_while(move |message| {
            let admitted = counted.received(message);
            if let Err(overflow) = admitted {
                tracing::warn!(reason = overflow.reason(), "closing a WebSocket connection");
                let _ = overflowed
                    .read_error
                    .set((CLOSE_TOO_MANY, overflow.reason()));
            }
            std::future::ready(admitted.is_ok())
        });
    let subscriptions = ConnectionSubscriptions::default();
    let mut connection_data = Data::default();
    connection_data.insert(subscriptions.clone());
    connection_data.insert(StreamingTransport);
    let app = state.app.clone();
    let limits = state.limits.clone();
    let established = handshake.clone();
    let executor = WokenOnly(state.schema.clone());
    let mut graphql = async_graphql::http::WebSocket::new(executor, input, protocol)
        .connection_data(connection_data)
        .on_connection_init(move |payload| async move {
            let credential = payload
                .get("authorization")
                .or_else(|| payload.get("Authorization"))
                .and_then(|value| value.as_str())
                .filter(|credential| !credential.trim().is_empty());
            let mut data = Data::default();
            // An anonymous connection could subscribe to nothing: it is not kept.
            let Some(credential) = credential else {
                let _ = established.refused.set(CLOSE_UNAUTHORIZED);
                return Err(async_graphql::Error::new(
                    "connection_init must carry {\"authorization\": \"Bearer <key>\"}",
                ));
            };
            // The same throttle as HTTP: an address that keeps presenting bad keys is
            // turned away without a database query.
            let attempt = match limits.auth_failures.reserve(client, SLOT_WAIT).await {
                Ok(attempt) => attempt,
                Err(refusal) => {
                    let _ = established.refused.set(CLOSE_TOO_MANY);
                    return Err(async_graphql::Error::new(refusal.message()));
                }
            };
            match identify(&app, Some(credential)).await {
                Ok(Some(identity)) => {
                    match limits.live.admit(&identity.principal) {
                        Ok(places) => {
                            let _ = established.live_places.set(places);
                        }
                        Err(refusal) => {
                            let _ = established.refused.set(CLOSE_TOO_MANY);
                            return Err(async_graphql::Error::new(refusal));
                        }
                    }
                    let _ = established.key.set(identity.key_id);
                    if let Some(expires_at) = identity.expires_at {
                        let _ = established.expires_at.set(expires_at);
                    }
                    if let Some(key_id) = identity.key_id {
                        data.insert(api_keys::CallerKey(key_id));
                    }
                    data.insert(identity.principal);
                }
                // Not reached: the credential is not blank.
                Ok(None) => {
                    let _ = established.refused.set(CLOSE_UNAUTHORIZED);
                    return Err(async_graphql::Error::new("no key was presented"));
                }
                Err(error) => {
                    if !matches!(error, AuthError::Database(_) | AuthError::Expired) {
                        attempt.failed();
                    }
                    let _ = established.refused.set(CLOSE_FORBIDDEN);
                    return Err(async_graphql::Error::new(error.to_string()));
                }
            }
            Ok(data)
        });

    let mut revocations = state.app.bus.watch_revocations();
    let mut ping = tokio::time::interval(PING_INTERVAL);
    ping.tick().await;
    let init_deadline = tokio::time::sleep(INIT_TIMEOUT);
    tokio::pin!(init_deadline);
    let unsubscribed_limit = state.unsubscribed_socket_timeout;
    // Looked at often enough that a quiet connection is closed within a tenth of its
    // limit past it.
    let mut quiet_check = tokio::time::interval(
        (unsubscribed_limit / 10).clamp(Duration::from_millis(100), PING_INTERVAL),
    );
    let mut sent_this_turn = 0;
    // Armed once the handshake names a token's expiry; until then it never fires.
    let expiry = tokio::time::sleep(Duration::MAX);
    tokio::pin!(expiry);
    let mut expiry_armed = false;
    let close = loop {
        let key = handshake.key.get().copied();
        if !expiry_armed && let Some(&expires_at) = handshake.expires_at.get() {
            expiry_armed = true;
            expiry
                .as_mut()
                .reset(tokio::time::Instant::now() + time_until(expires_at));
        }
        tokio::select! {
            message = graphql.next() => match message {
                Some(WsMessage::Text(text)) => {
                    tally.sent(&text);
                    if sink.send(Message::Text(text.into())).await.is_err() {
                        return;
                    }
                    sent_this_turn += 1;
                    if sent_this_turn == MESSAGES_PER_TURN {
                        sent_this_turn = 0;
                        tokio::task::yield_now().await;
                    }
                }
                Some(WsMessage::Close(code, reason)) => {
                    // async-graphql closes a refused handshake with a generic 1002.
                    let code = handshake.refused.get().copied().unwrap_or(code);
                    break Some((code, reason));
                }
                // The legacy protocol refuses a handshake with a message, then ends.
                None => break handshake
                    .read_error
                    .get()
                    .map(|&(code, reason)| (code, reason.to_owned()))
                    .or_else(|| handshake.refused.get().map(|&code| (code, "connection_init was refused".to_owned()))),
            },
            () = &mut expiry, if expiry_armed => {
                break Some((CLOSE_FORBIDDEN, "the access token has expired".to_owned()));
            }
            _ = &mut init_deadline, if key.is_none() => {
                break Some((CLOSE_INIT_TIMEOUT, "Connection initialisation timeout".to_owned()));
            }
            _ = quiet_check.tick() => {
                if subscriptions.quiet_for().is_some_and(|quiet| quiet >= unsubscribed_limit) {
                    break Some((CLOSE_NORMAL, format!("no subscription for {} s", unsubscribed_limit.as_secs())));
                }
            }
            _ = ping.tick() => {
                let heard = Duration::from_millis(heard_at_millis.load(Ordering::Relaxed));
                if started.elapsed().saturating_sub(heard) > SILENCE_LIMIT {
                    break Some((CLOSE_GOING_AWAY, "no message or pong for too long".to_owned()));
                }
                if sink.send(Message::Ping(Default::default())).await.is_err() {
                    return;
                }
            }
            _ = revocations.revoked_or_missed(key.flatten().unwrap_or_default()), if key.flatten().is_some() => {
                let key_id = key.flatten().expect("guarded by the branch condition");
                match api_keys::is_active(&state.app.db, key_id).await {
                    Ok(true) => {}
                    Ok(false) => break Some((CLOSE_FORBIDDEN, "the API key was revoked".to_owned())),
                    // Checked again at the next announcement; HTTP requests are refused meanwhile.
                    Err(error) => tracing::warn!(key.id = %key_id, error = %error, "could not re-check a connection's key"),
                }
            }
        }
    };
    if let Some((code, reason)) = close {
        let _ = sink
            .send(Message::Close(Some(CloseFrame {
                code,
                reason: reason.into(),
            })))
            .await;
    }
    let _ = sink.close().await;
}
