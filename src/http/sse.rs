//! GraphQL over Server-Sent Events, "distinct connections" mode of the graphql-sse
//! protocol: one subscription per request, its results as `next` events, then
//! `complete`. Made for clients that cannot or will not hold a WebSocket (proxies
//! that only pass HTTP, serverless front ends, `curl`).
//!
//! The request is a GraphQL-over-HTTP request (POST with a JSON body, or GET with the
//! query in the URL) with the key in `Authorization`, passing the same gate and body
//! limits as `/graphql`. Only subscriptions run here (queries and mutations go to
//! `/graphql`, with its response limit). Errors found before execution arrive as a
//! `next` event holding them, as the protocol asks, since a client's event source
//! would otherwise see only a failed connection. A stream ends when the client closes
//! it, when it completes, or when its key is revoked. An authenticated caller's
//! stream is never shed as an idle connection while it lasts; it counts among the
//! live connections of its tenant and of the process (see `live`).

use super::HttpState;
use super::auth::time_until;
use super::client_limits::{ClientAddress, RequestOwner, SLOT_WAIT};
use super::graphql::body::{BodyLimit, read_body, retry_after};
use super::graphql::gates::authenticate_client;
use super::graphql::responses::{JSON, check_content_type};
use super::graphql::selected_operation;
use super::live;
use super::serve::LiveStreams;
use crate::accounts::api_keys::{self, CallerKey, Identity};
use crate::app::App;
use crate::graphql::ApiErrorCode;
use crate::graphql::cost::{self, QueryBudget, StreamingTransport};
use async_graphql::parser::types::OperationType;
use axum::body::Body;
use axum::extract::{ConnectInfo, Extension, RawQuery, State};
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::response::sse::{Event, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use entity::Timestamp;
use futures_util::{Stream, StreamExt, stream};
use serde_json::json;
use std::convert::Infallible;
use std::net::SocketAddr;
use std::time::Duration;
use uuid::Uuid;

/// How often an idle stream sends a comment, so that proxies keep it open and a
/// vanished client is noticed.
const KEEPALIVE: Duration = Duration::from_secs(15);

/// POST /graphql/sse: a JSON body `{query, variables, operationName}`.
pub async fn post(
    State(state): State<HttpState>,
    ConnectInfo(peer): ConnectInfo<SocketAddr>,
    live: Option<Extension<LiveStreams>>,
    headers: HeaderMap,
    body: Body,
) -> Response {
    if let Err(refusal) = check_content_type(&headers) {
        return (StatusCode::UNSUPPORTED_MEDIA_TYPE, refusal).into_response();
    }
    let identity = match gate(&state, peer, &headers).await {
        Ok(identity) => identity,
        Err(refusal) => return refusal,
    };
    let principal = identity.as_ref().map(|identity| &identity.principal);
    // A body still arriving holds one of its owner's request slots, as on /graphql:
    // otherwise one key could pin any number of 16 MiB bodies. The stream that
    // follows is bounded by the subscription caps instead.
    let owner = RequestOwner::of(principal, ClientAddress::from(peer.ip()));
    let Some(slot) = state.limits.slots.acquire(owner, SLOT_WAIT).await else {
        return (
            StatusCode::TOO_MANY_REQUESTS,
            [(header::RETRY_AFTER, "1")],
            "too many requests in flight for this client",
        )
            .into_response();
    };
    let large_bodies = &state.limits.large_bodies;
    let (body, reservation) =
        match read_body(&headers, body, BodyLimit::of(principal), large_bodies).await {
            Ok(read) => read,
            Err((status, message)) => {
                let mut response = (status, message).into_response();
                if let Some(retry_after) = retry_after(status) {
                    response
                        .headers_mut()
                        .insert(header::RETRY_AFTER, retry_after);
                }
                return response;
            }
        };
    drop(slot);
    let request = serde_json::from_slice::<async_graphql::Request>(&body)
        .map_err(|error| format!("the body is not a GraphQL request: {error}"));
    // The stream outlives its body: only the parse needed the room.
    drop((body, reservation));
    respond(&state, identity, request, false, live)
}

/// GET /graphql/sse: the request in the URL, as for GET /graphql; no mutations.
pub async fn get(
    State(state): State<HttpState>,
    ConnectInfo(peer): ConnectInfo<SocketAddr>,
    live: Option<Extension<LiveStreams>>,
    headers: HeaderMap,
    RawQuery(query): RawQuery,
) -> Response {
    let identity = match gate(&state, peer, &headers).await {
        Ok(identity) => identity,
        Err(refusal) => return refusal,
    };
    let request = async_graphql::http::parse_query_string(&query.unwrap_or_default())
        .map_err(|error| format!("the URL holds no GraphQL request: {error}"));
    respond(&state, identity, request, true, live)
}

/// The same gate as /graphql: an address that keeps presenting bad keys is turned
/// away without a database query.
async fn gate(
    state: &HttpState,
    peer: SocketAddr,
    headers: &HeaderMap,
) -> Result<Option<Identity>, Response> {
    authenticate_client(state, ClientAddress::from(peer.ip()), headers, JSON).await
}

fn respond(
    state: &HttpState,
    identity: Option<Identity>,
    request: Result<async_graphql::Request, String>,
    from_get: bool,
    live: Option<Extension<LiveStreams>>,
) -> Response {
    let (key_id, expires_at) = identity.as_ref().map_or((None, None), |identity| {
        (identity.key_id, identity.expires_at)
    });
    let principal = identity.map(|identity| identity.principal);
    let Some(budget) = state.limits.live.open() else {
        return live::process_full();
    };
    let live_places = match principal
        .as_ref()
        .map(|principal| state.limits.live.admit(principal))
    {
        Some(Ok(places)) => Some(places),
        Some(Err(refusal)) => {
            return (
                StatusCode::TOO_MANY_REQUESTS,
                [(header::RETRY_AFTER, "5")],
                refusal,
            )
                .into_response();
        }
        None => None,
    };
    // Held by the stream: the connection is not idle while a tenant's stream lasts.
    let held = principal
        .as_ref()
        .and(live)
        .map(|Extension(live)| live.hold());
    let places = (budget, live_places);
    let results = match request {
        Ok(mut request) => {
            // GET must not change anything. Its text is measured before it is parsed
            // here; the schema measures every request again before running it.
            let budget = match principal.as_ref() {
                Some(_) => QueryBudget::AUTHENTICATED,
                None => QueryBudget::ANONYMOUS,
            };
            if from_get && cost::check_text(&request.query, &budget).is_ok() {
                let operation_name = request.operation_name.clone();
                if let Ok(document) = request.parsed_query()
                    && selected_operation(document, operation_name.as_deref())
                        == Some(OperationType::Mutation)
                {
                    let mut response = (
                        StatusCode::METHOD_NOT_ALLOWED,
                        "mutations must be sent with POST",
                    )
                        .into_response();
                    response
                        .headers_mut()
                        .insert(header::ALLOW, HeaderValue::from_static("POST"));
                    return response;
                }
            }
            let request = match key_id {
                Some(key_id) => request.data(CallerKey(key_id)),
                None => request,
            };
            let request = match principal {
                Some(principal) => request.data(principal),
                None => request,
            }
            .data(StreamingTransport);
            state
                .schema
                .execute_stream(request)
                .map(|response| serde_json::to_string(&response))
                .boxed()
        }
        Err(message) => stream::once(async move {
            serde_json::to_string(&json!({"errors": [{
                "message": message,
                "extensions": {"code": ApiErrorCode::BadRequest.as_str()},
            }]}))
        })
        .boxed(),
    };
    let results =
        until_refused(state.app.clone(), key_id, expires_at, results).map(move |result| {
            let _held = (&held, &places);
            result
        });
    Sse::new(events(results))
        .keep_alive(KeepAlive::new().interval(KEEPALIVE))
        .into_response()
}

/// `results` until the key they were asked with is revoked, or the access token
/// expires; then one last result saying so.
fn until_refused(
    app: App,
    key_id: Option<Uuid>,
    expires_at: Option<Timestamp>,
    mut results: impl Stream<Item = serde_json::Result<String>> + Send + Unpin + 'static,
) -> impl Stream<Item = serde_json::Result<String>> + Send + 'static {
    async_stream::stream! {
        let revoked = async {
            let Some(key_id) = key_id else {
                return std::future::pending().await;
            };
            let mut revocations = app.bus.watch_revocations();
            loop {
                revocations.revoked_or_missed(key_id).await;
                match api_keys::is_active(&app.db, key_id).await {
                    Ok(false) => return,
                    Ok(true) => {}
                    // Checked again at the next announcement.
                    Err(error) => tracing::warn!(key.id = %key_id, error = %error, "could not re-check a stream's key"),
                }
            }
        };
        tokio::pin!(revoked);
        let expired = async {
            match expires_at {
                Some(expires_at) => tokio::time::sleep(time_until(expires_at)).await,
                None => std::future::pending().await,
            }
        };
        tokio::pin!(expired);
        loop {
            tokio::select! {
                result = results.next() => match result {
                    Some(result) => yield result,
                    None => return,
                },
                () = &mut revoked => {
                    yield serde_json::to_string(&json!({"errors": [{
                        "message": "the API key was revoked",
                        "extensions": {"code": ApiErrorCode::Unauthenticated.as_str()},
                    }]}));
                    return;
                }
                () = &mut expired => {
                    yield serde_json::to_string(&json!({"errors": [{
                        "message": "the access token has expired",
                        "extensions": {"code": ApiErrorCode::Unauthenticated.as_str()},
                    }]}));
                    return;
                }
            }
        }
    }
}

/// Each result as a `next` event, then `complete`.
fn events(
    results: impl Stream<Item = serde_json::Result<String>> + Send + 'static,
) -> impl Stream<Item = Result<Event, Infallible>> {
    results
        .map(|result| {
            let data = result.expect("a GraphQL response serializes");
            Ok(Event::default().event("next").data(data))
        })
        .chain(stream::once(async {
            Ok(Event::default().event("complete").data(""))
        }))
}
