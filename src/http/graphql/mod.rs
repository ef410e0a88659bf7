//! GraphQL over HTTP, written around `Schema::execute` so that status codes and
//! content types follow the GraphQL-over-HTTP specification: `application/json` by
//! default, `application/graphql-response+json` when the client accepts it (then a
//! request that never executed answers 4xx).
//!
//! Every request passes the same gates before the schema sees it, cheapest first: the
//! failed-authentication throttle of its address (no database), authentication, one
//! of its principal's slots, the body (bounded in size and time), and the cost
//! pre-pass on the text (the schema's `CostLimits` check the text and the document
//! again, for every transport; see `graphql::cost`). Its response is metered while it
//! resolves and refused past `MAX_RESPONSE_BYTES`.

pub(super) mod body;
pub(super) mod gates;
pub(super) mod responses;

use super::HttpState;
use super::client_limits::RequestSlot;
use crate::accounts::api_keys::CallerKey;
use crate::graphql::ApiErrorCode;
use crate::graphql::cost::{self, MAX_RESPONSE_BYTES, QueryBudget, ResponseMeter};
use async_graphql::Variables;
use async_graphql::parser::types::{DocumentOperations, ExecutableDocument, OperationType};
use axum::body::{Body, Bytes};
use axum::extract::{ConnectInfo, Query, State};
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::response::Response;
use body::{BodyLimit, read_body};
use gates::{Admitted, admit};
use responses::{
    accepts, check_content_type, graphql_response, not_executed, request_error,
    response_media_type, too_complex, too_large,
};
use serde::Deserialize;
use std::net::SocketAddr;

/// A request's body as the GraphQL-over-HTTP specification defines it.
#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct PostBody {
    query: Option<String>,
    operation_name: Option<String>,
    /// An object or null; anything else is refused.
    #[serde(default)]
    variables: Variables,
}

/// A request in the URL. async-graphql's own parser reads `operation_name`, not the
/// specification's `operationName`, so GET parses its parameters itself.
#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct GetParameters {
    query: Option<String>,
    operation_name: Option<String>,
    /// A JSON object, URL-encoded.
    variables: Option<String>,
}

/// How the request arrived: GET may not run mutations.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Method {
    Get,
    Post,
}

/// POST /graphql: a JSON body `{query, variables, operationName}`.
pub async fn post(
    State(state): State<HttpState>,
    ConnectInfo(peer): ConnectInfo<SocketAddr>,
    headers: HeaderMap,
    body: Body,
) -> Response {
    let media_type = response_media_type(&headers);
    if let Err(refusal) = check_content_type(&headers) {
        return request_error(media_type, StatusCode::UNSUPPORTED_MEDIA_TYPE, refusal);
    }
    let admitted = match admit(&state, peer, &headers, media_type).await {
        Ok(admitted) => admitted,
        Err(response) => return response,
    };
    let large_bodies = &state.limits.large_bodies;
    let (body, _reservation) = match read_body(
        &headers,
        body,
        BodyLimit::of(admitted.principal.as_ref()),
        large_bodies,
    )
    .await
    {
        Ok(read) => read,
        Err((status, message)) => {
            let mut response = request_error(media_type, status, &message);
            if let Some(retry_after) = body::retry_after(status) {
                response
                    .headers_mut()
                    .insert(header::RETRY_AFTER, retry_after);
            }
            return response;
        }
    };
    // A JSON array (a batch) or any other value is not a GraphQL request.
    if body.iter().find(|byte| !byte.is_ascii_whitespace()) != Some(&b'{') {
        return request_error(
            media_type,
            StatusCode::BAD_REQUEST,
            "the body must be a JSON object {\"query\": …}",
        );
    }
    let body: PostBody = match serde_json::from_slice(&body) {
        Ok(body) => body,
        Err(error) => {
            return request_error(
                media_type,
                StatusCode::BAD_REQUEST,
                &format!("the body is not a GraphQL request: {error}"),
            );
        }
    };
    let Some(query) = body.query else {
        return request_error(media_type, StatusCode::BAD_REQUEST, "the body has no query");
    };
    let mut request = async_graphql::Request::new(query).variables(body.variables);
    request.operation_name = body.operation_name;
    execute(&state, admitted, request, media_type, Method::Post).await
}

/// GET /graphql: a query in the URL; GraphiQL for a browser asking for HTML.
pub async fn get(
    State(state): State<HttpState>,
    ConnectInfo(peer): ConnectInfo<SocketAddr>,
    headers: HeaderMap,
    parameters: Result<Query<GetParameters>, axum::extract::rejection::QueryRejection>,
) -> Response {
    let media_type = response_media_type(&headers);
    let parameters = match parameters {
        Ok(Query(parameters)) => parameters,
        Err(error) => {
            return request_error(
                media_type,
                StatusCode::BAD_REQUEST,
                &format!("the URL holds no GraphQL request: {error}"),
            );
        }
    };
    let Some(query) = parameters.query else {
        if accepts(&headers, "text/html") {
            return super::console::graphiql(&headers).await;
        }
        return request_error(media_type, StatusCode::BAD_REQUEST, "the URL has no query");
    };
    let variables = match parameters.variables.as_deref().map(serde_json::from_str) {
        None => Variables::default(),
        Some(Ok(serde_json::Value::Object(variables))) => {
            Variables::from_json(serde_json::Value::Object(variables))
        }
        Some(_) => {
            return request_error(
                media_type,
                StatusCode::BAD_REQUEST,
                "variables must be a JSON object",
            );
        }
    };
    let admitted = match admit(&state, peer, &headers, media_type).await {
        Ok(admitted) => admitted,
        Err(response) => return response,
    };
    let mut request = async_graphql::Request::new(query).variables(variables);
    request.operation_name = parameters.operation_name;
    execute(&state, admitted, request, media_type, Method::Get).await
}

async fn execute(
    state: &HttpState,
    admitted: Admitted,
    mut request: async_graphql::Request,
    media_type: &'static str,
    method: Method,
) -> Response {
    let budget = match admitted.principal {
        Some(_) => QueryBudget::AUTHENTICATED,
        None => QueryBudget::ANONYMOUS,
    };
    // The schema's `CostLimits` check the text and the document of every request; both
    // are checked here as well because the document is parsed here, early, to see
    // which operation it runs.
    if let Err(error) = cost::check_text(&request.query, &budget) {
        return too_complex(media_type, &error);
    }
    let operation_name = request.operation_name.clone();
    // Execution reuses this document (the cost hook measures a parse of its own).
    let operation_type = match request.parsed_query() {
        Err(error) => {
            let error = ApiErrorCode::GraphqlParseFailed.given_to(error);
            return not_executed(media_type, vec![error]);
        }
        // Measured here too, so that a refused document (an alias flood of schema
        // dumps from keyless clients) costs one parse, not the schema's three.
        Ok(document) => match cost::check_document(document, &budget) {
            Err(error) => return too_complex(media_type, &error),
            Ok(_) => selected_operation(document, operation_name.as_deref()),
        },
    };
    match operation_type {
        // GET must not change anything, whatever else the document holds.
        Some(OperationType::Mutation) if method == Method::Get => {
            let mut response = request_error(
                media_type,
                StatusCode::METHOD_NOT_ALLOWED,
                "mutations must be sent with POST",
            );
            response
                .headers_mut()
                .insert(header::ALLOW, HeaderValue::from_static("POST"));
            return response;
        }
        Some(OperationType::Subscription) => {
            return request_error(
                media_type,
                StatusCode::BAD_REQUEST,
                "subscriptions are served over WebSocket (/graphql/ws) and SSE (/graphql/sse)",
            );
        }
        // An unknown or ambiguous operation name: execution reports it.
        _ => {}
    }
    if let Some(principal) = admitted.principal {
        request = request.data(principal);
    }
    if let Some(key_id) = admitted.key_id {
        request = request.data(CallerKey(key_id));
    }
    let meter = ResponseMeter::new(MAX_RESPONSE_BYTES);
    let response = state.schema.execute(request.data(meter.clone())).await;
    if !meter.started() {
        return not_executed(media_type, response.errors);
    }
    // The meter stopped resolving before the response passed the limit by more than
    // one value, so the response in memory is bounded; serializing it is not needed
    // to know it is too large.
    if meter.exceeded() {
        return too_large(media_type, &meter);
    }
    let body = serde_json::to_vec(&response).expect("a GraphQL response serializes");
    // What the meter does not count (keys and braces of objects) is bounded by the
    // complexity limit; this check makes the limit exact all the same.
    if body.len() > MAX_RESPONSE_BYTES {
        return too_large(media_type, &meter);
    }
    // Execution started: 200 under both media types, even when a field error left
    // `data` null.
    let length = body.len();
    let mut response = graphql_response(
        media_type,
        StatusCode::OK,
        sent_holding(body, admitted.slot),
    );
    response
        .headers_mut()
        .insert(header::CONTENT_LENGTH, HeaderValue::from(length));
    response
}

/// Bytes of a response handed to the connection at a time.
const RESPONSE_PIECE: usize = 64 * 1024;

/// `body` sent in pieces while `slot` is held: the connection takes the next piece only
/// as the client reads, so a client that reads slowly keeps its slot — and the
/// response its memory — counted against its owner until the last piece is taken or
/// the connection goes away. Otherwise a tenant could pin any number of responses of
/// up to the response limit by not reading them.
fn sent_holding(body: Vec<u8>, slot: RequestSlot) -> Body {
    let body = Bytes::from(body);
    Body::from_stream(async_stream::stream! {
        let _slot = slot;
        let mut start = 0;
        while start < body.len() {
            let end = (start + RESPONSE_PIECE).min(body.len());
            yield Ok::<_, std::convert::Infallible>(body.slice(start..end));
            start = end;
        }
    })
}

/// The type of the operation the request runs: the one named, or the only one.
pub(super) fn selected_operation(
    document: &ExecutableDocument,
    operation_name: Option<&str>,
) -> Option<OperationType> {
    match (&document.operations, operation_name) {
        (DocumentOperations::Single(operation), None) => Some(operation.node.ty),
        (DocumentOperations::Multiple(operations), Some(name)) => {
            operations.get(name).map(|operation| operation.node.ty)
        }
        (DocumentOperations::Multiple(operations), None) if operations.len() == 1 => operations
            .values()
            .next()
            .map(|operation| operation.node.ty),
        _ => None,
    }
}
