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
use super::graphql::{JSON, authenticate_client, check_content_type, selected_operation};
use super::limits::ClientAddress;
use crate::graphql::cost::{self, QueryBudget};
use async_graphql::parser::types::OperationType;
use axum::body::Bytes;
use axum::extract::{ConnectInfo, RawQuery, State};
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::response::sse::{Event, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use futures_util::{Stream, StreamExt, stream};
use serde_json::json;
use std::convert::Infallible;
use std::net::SocketAddr;
use std::time::Duration;

/// How often an idle stream sends a comment, so that proxies keep it open and a
/// vanished client is noticed.
const KEEPALIVE: Duration = Duration::from_secs(15);

/// POST /graphql/sse: a JSON body `{query, variables, operationName}`.
pub async fn post(
    State(state): State<HttpState>,
    ConnectInfo(peer): ConnectInfo<SocketAddr>,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    if let Err(refusal) = check_content_type(&headers) {
        return (StatusCode::UNSUPPORTED_MEDIA_TYPE, refusal).into_response();
    }
    let request = serde_json::from_slice::<async_graphql::Request>(&body)
        .map_err(|error| format!("the body is not a GraphQL request: {error}"));
    respond(&state, peer, &headers, request, false).await
}

/// GET /graphql/sse: the request in the URL, as for GET /graphql; no mutations.
pub async fn get(
    State(state): State<HttpState>,
    ConnectInfo(peer): ConnectInfo<SocketAddr>,
    headers: HeaderMap,
    RawQuery(query): RawQuery,
) -> Response {
    let request = async_graphql::http::parse_query_string(&query.unwrap_or_default())
        .map_err(|error| format!("the URL holds no GraphQL request: {error}"));
    respond(&state, peer, &headers, request, true).await
}

async fn respond(
    state: &HttpState,
    peer: SocketAddr,
    headers: &HeaderMap,
    request: Result<async_graphql::Request, String>,
    from_get: bool,
) -> Response {
    // The same gate as /graphql: an address that keeps presenting bad keys is turned
    // away without a database query.
    let client = ClientAddress::from(peer.ip());
    let principal = match authenticate_client(state, client, headers, JSON).await {
        Ok(principal) => principal,
        Err(refusal) => return refusal,
    };
    let results = match request {
        Ok(mut request) => {
            // GET must not change anything. Its text is measured before it is parsed
            // here; the schema measures every request again before running it.
            let budget = match principal {
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
