//! GraphQL over Server-Sent Events, "distinct connections" mode of the graphql-sse
//! protocol: one operation per request, its results as `next` events, then
//! `complete`. Made for clients that cannot or will not hold a WebSocket (proxies
//! that only pass HTTP, serverless front ends, `curl`).
//!
//! The request is a GraphQL-over-HTTP request (POST with a JSON body, or GET with the
//! query in the URL) with the key in `Authorization`. Errors found before execution
//! arrive as a `next` event holding them, as the protocol asks, since a client's
//! event source would otherwise see only a failed connection. A subscription ends
//! when the client closes the connection or the stream completes.

use super::HttpState;
use super::auth::{AuthError, authenticate};
use crate::graphql::ErrorCode;
use axum::body::Bytes;
use axum::extract::{RawQuery, State};
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::sse::{Event, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use futures_util::{Stream, StreamExt, stream};
use serde_json::json;
use std::convert::Infallible;
use std::time::Duration;

/// How often an idle stream sends a comment, so that proxies keep it open and a
/// vanished client is noticed.
const KEEPALIVE: Duration = Duration::from_secs(15);

/// POST /graphql/sse: a JSON body `{query, variables, operationName}`.
pub async fn post(State(state): State<HttpState>, headers: HeaderMap, body: Bytes) -> Response {
    let is_json = headers
        .get(header::CONTENT_TYPE)
        .and_then(|value| value.to_str().ok())
        .and_then(|value| value.split(';').next())
        .is_some_and(|media_type| media_type.trim().eq_ignore_ascii_case("application/json"));
    if !is_json {
        return (
            StatusCode::UNSUPPORTED_MEDIA_TYPE,
            "a GraphQL request over SSE is sent as application/json",
        )
            .into_response();
    }
    let request = serde_json::from_slice::<async_graphql::Request>(&body)
        .map_err(|error| format!("the body is not a GraphQL request: {error}"));
    respond(&state, &headers, request).await
}

/// GET /graphql/sse: the request in the URL, as for GET /graphql.
pub async fn get(
    State(state): State<HttpState>,
    headers: HeaderMap,
    RawQuery(query): RawQuery,
) -> Response {
    let request = async_graphql::http::parse_query_string(&query.unwrap_or_default())
        .map_err(|error| format!("the URL holds no GraphQL request: {error}"));
    respond(&state, &headers, request).await
}

async fn respond(
    state: &HttpState,
    headers: &HeaderMap,
    request: Result<async_graphql::Request, String>,
) -> Response {
    let credential = match headers.get(header::AUTHORIZATION) {
        None => None,
        Some(value) => match value.to_str() {
            Ok(text) => Some(text),
            Err(_) => return unauthenticated(&AuthError::Malformed.to_string()),
        },
    };
    let principal = match authenticate(&state.app, credential).await {
        Ok(principal) => principal,
        Err(error @ (AuthError::Malformed | AuthError::UnknownKey)) => {
            return unauthenticated(&error.to_string());
        }
        Err(AuthError::Database(error)) => {
            tracing::error!(error = %error, "authenticating a request failed");
            return (StatusCode::INTERNAL_SERVER_ERROR, "internal error").into_response();
        }
    };
    let results = match request {
        Ok(request) => {
            let request = match principal {
                Some(principal) => request.data(principal),
                None => request,
            };
            state
                .schema
                .execute_stream(request)
                .map(|response| serde_json::to_string(&response))
                .boxed()
        }
        Err(message) => stream::once(async move {
            serde_json::to_string(&json!({"errors": [{"message": message}]}))
        })
        .boxed(),
    };
    Sse::new(events(results))
        .keep_alive(KeepAlive::new().interval(KEEPALIVE))
        .into_response()
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

fn unauthenticated(message: &str) -> Response {
    let body = json!({"errors": [{"message": message, "extensions": {"code": ErrorCode::Unauthenticated.as_str()}}]});
    (
        StatusCode::UNAUTHORIZED,
        [(header::CONTENT_TYPE, "application/json")],
        body.to_string(),
    )
        .into_response()
}
