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

use super::HttpState;
use super::auth::{AuthError, credential, identify};
use super::limits::{ClientAddress, RequestOwner, RequestSlot, SLOT_WAIT};
use crate::accounts::Principal;
use crate::accounts::api_keys::Identity;
use crate::graphql::ErrorCode;
use crate::graphql::cost::{self, CostError, MAX_RESPONSE_BYTES, QueryBudget, ResponseMeter};
use async_graphql::parser::types::{DocumentOperations, ExecutableDocument, OperationType};
use async_graphql::{ServerError, Variables};
use axum::body::{Body, Bytes};
use axum::extract::{ConnectInfo, Query, State};
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use futures_util::StreamExt;
use serde::Deserialize;
use serde_json::json;
use std::net::SocketAddr;
use std::time::{Duration, Instant};

const GRAPHQL_RESPONSE_JSON: &str = "application/graphql-response+json";
pub(super) const JSON: &str = "application/json";

/// Largest GraphQL request body accepted: above the largest job input, so that an
/// oversized input is refused with a `VALIDATION` error that says why, not a bare 413.
pub const MAX_REQUEST_BYTES: usize = 16 * 1024 * 1024;

/// How long a client may take to send its whole request body: 16 MiB at about
/// 4.5 Mbit/s. A client that trickles its body ties up one of its slots only this long.
pub const BODY_READ_TIMEOUT: Duration = Duration::from_secs(30);

/// What a body may hold, by who sends it. Besides bytes, the JSON values outside
/// strings are counted before the body is parsed: a body of tiny objects costs
/// about 60 times its size once parsed (15 MiB of `{"a":1},` took 931 MB), while a
/// job's text is one value however long.
#[derive(Clone, Copy, Debug)]
pub(super) struct BodyLimit {
    bytes: usize,
    values: usize,
}

impl BodyLimit {
    /// With an API key: the largest job input, and far more values than a job's
    /// 1,000 messages and 64 KiB of metadata hold.
    pub(super) const AUTHENTICATED: Self = Self {
        bytes: MAX_REQUEST_BYTES,
        values: 200_000,
    };
    /// Without one: only the schema can be read.
    pub(super) const ANONYMOUS: Self = Self {
        bytes: 64 * 1024,
        values: 2_000,
    };

    pub(super) fn of(principal: Option<Principal>) -> Self {
        match principal {
            Some(_) => Self::AUTHENTICATED,
            None => Self::ANONYMOUS,
        }
    }
}

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
    let body = match read_body(&headers, body, BodyLimit::of(admitted.principal)).await {
        Ok(body) => body,
        Err((status, message)) => return request_error(media_type, status, &message),
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

/// A request that passed authentication and holds one of its principal's slots.
struct Admitted {
    principal: Option<Principal>,
    /// Held until the response is sent (or the client goes away).
    slot: RequestSlot,
}

/// The gates that need only the headers: the address's failed authentications, the
/// credential, then a slot of the principal (or of the address, without a key).
async fn admit(
    state: &HttpState,
    peer: SocketAddr,
    headers: &HeaderMap,
    media_type: &'static str,
) -> Result<Admitted, Response> {
    let client = ClientAddress::from(peer.ip());
    let principal = authenticate_client(state, client, headers, media_type)
        .await?
        .map(|identity| identity.principal);
    let owner = RequestOwner::of(principal, client);
    let Some(slot) = state.limits.slots.acquire(owner, SLOT_WAIT).await else {
        return Err(too_many_requests(
            media_type,
            Duration::from_secs(1),
            "too many requests in flight for this client",
        ));
    };
    Ok(Admitted { principal, slot })
}

/// Who the request's `Authorization` stands for (`None`: no key), unless the address
/// has failed too often lately (429, decided without the database) or the credential is
/// refused (401, counted against the address).
pub(super) async fn authenticate_client(
    state: &HttpState,
    client: ClientAddress,
    headers: &HeaderMap,
    media_type: &'static str,
) -> Result<Option<Identity>, Response> {
    let presented = headers.get(header::AUTHORIZATION);
    if presented.is_some()
        && let Err(retry_after) = state.limits.auth_failures.check(client, Instant::now())
    {
        return Err(too_many_requests(
            media_type,
            retry_after,
            "too many failed authentications from this address",
        ));
    }
    let principal = match credential(presented) {
        Ok(credential) => identify(&state.app, credential).await,
        Err(error) => Err(error),
    };
    match principal {
        Ok(principal) => Ok(principal),
        Err(error @ (AuthError::Malformed | AuthError::UnknownKey)) => {
            state
                .limits
                .auth_failures
                .record_failure(client, Instant::now());
            let mut response = coded_error(
                media_type,
                StatusCode::UNAUTHORIZED,
                ErrorCode::Unauthenticated,
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
                ErrorCode::Internal,
                "internal error",
            ))
        }
    }
}

/// About how many JSON values `body` holds: the separators and openings outside
/// strings. Exact enough to bound what parsing it costs, and linear in its size.
fn json_values(body: &[u8]) -> usize {
    let (mut values, mut in_string, mut escaped) = (0, false, false);
    for &byte in body {
        if in_string {
            match byte {
                _ if escaped => escaped = false,
                b'\\' => escaped = true,
                b'"' => in_string = false,
                _ => {}
            }
        } else {
            match byte {
                b'"' => in_string = true,
                b'{' | b'[' | b',' | b':' => values += 1,
                _ => {}
            }
        }
    }
    values
}

/// The body, refused when it passes `limit` or takes longer than `BODY_READ_TIMEOUT`
/// to arrive.
pub(super) async fn read_body(
    headers: &HeaderMap,
    body: Body,
    limit: BodyLimit,
) -> Result<Bytes, (StatusCode, String)> {
    let too_large = || {
        (
            StatusCode::PAYLOAD_TOO_LARGE,
            format!("the body is larger than {} bytes", limit.bytes),
        )
    };
    let declared = headers
        .get(header::CONTENT_LENGTH)
        .and_then(|value| value.to_str().ok())
        .and_then(|value| value.parse::<u64>().ok());
    if declared.is_some_and(|length| length > limit.bytes as u64) {
        return Err(too_large());
    }
    let read = async {
        let mut stream = body.into_data_stream();
        let mut collected = Vec::new();
        while let Some(chunk) = stream.next().await {
            let chunk = chunk.map_err(|error| {
                (
                    StatusCode::BAD_REQUEST,
                    format!("the body could not be read: {error}"),
                )
            })?;
            if collected.len() + chunk.len() > limit.bytes {
                return Err(too_large());
            }
            collected.extend_from_slice(&chunk);
        }
        if json_values(&collected) > limit.values {
            return Err((
                StatusCode::PAYLOAD_TOO_LARGE,
                format!(
                    "the body holds more than {} JSON values; send large texts as strings",
                    limit.values
                ),
            ));
        }
        Ok(Bytes::from(collected))
    };
    tokio::time::timeout(BODY_READ_TIMEOUT, read)
        .await
        .unwrap_or_else(|_| {
            Err((
                StatusCode::REQUEST_TIMEOUT,
                format!(
                    "the body did not arrive within {} s",
                    BODY_READ_TIMEOUT.as_secs()
                ),
            ))
        })
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
    // The schema's `CostLimits` check the text and the document of every request; the
    // text is checked here as well because the document is parsed here, early, to see
    // which operation it runs.
    if let Err(error) = cost::check_text(&request.query, &budget) {
        return too_complex(media_type, &error);
    }
    let operation_name = request.operation_name.clone();
    // Execution reuses this document (the cost hook measures a parse of its own).
    let operation_type = match request.parsed_query() {
        Err(error) => return not_executed(media_type, vec![error]),
        Ok(document) => selected_operation(document, operation_name.as_deref()),
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

/// The Content-Type of a POST must be JSON (either media type), in UTF-8.
pub(super) fn check_content_type(headers: &HeaderMap) -> Result<(), &'static str> {
    let Some(value) = headers.get(header::CONTENT_TYPE) else {
        return Err("a POST must say Content-Type: application/json");
    };
    let value = value
        .to_str()
        .map_err(|_| "the Content-Type is not readable")?;
    let mut parts = value.split(';').map(str::trim);
    let essence = parts.next().unwrap_or_default();
    if !essence.eq_ignore_ascii_case(JSON) && !essence.eq_ignore_ascii_case(GRAPHQL_RESPONSE_JSON) {
        return Err("a POST must say Content-Type: application/json");
    }
    let charset_is_not_utf8 = parts
        .filter_map(|part| part.split_once('='))
        .any(|(name, value)| {
            name.trim().eq_ignore_ascii_case("charset")
                && !value.trim().trim_matches('"').eq_ignore_ascii_case("utf-8")
        });
    if charset_is_not_utf8 {
        return Err("the body must be UTF-8");
    }
    Ok(())
}

fn accepts(headers: &HeaderMap, media_type: &str) -> bool {
    headers
        .get_all(header::ACCEPT)
        .iter()
        .filter_map(|value| value.to_str().ok())
        .flat_map(|value| value.split(','))
        .any(|item| {
            item.split(';')
                .next()
                .is_some_and(|item| item.trim() == media_type)
        })
}

/// The newer media type only for clients that ask for it; plain JSON otherwise.
fn response_media_type(headers: &HeaderMap) -> &'static str {
    if accepts(headers, GRAPHQL_RESPONSE_JSON) && !accepts(headers, JSON) {
        GRAPHQL_RESPONSE_JSON
    } else {
        JSON
    }
}

/// A GraphQL response body with its media type, in UTF-8.
fn graphql_response(
    media_type: &'static str,
    status: StatusCode,
    body: impl Into<Body>,
) -> Response {
    let content_type = if media_type == GRAPHQL_RESPONSE_JSON {
        "application/graphql-response+json; charset=utf-8"
    } else {
        "application/json; charset=utf-8"
    };
    (status, [(header::CONTENT_TYPE, content_type)], body.into()).into_response()
}

/// A GraphQL request that failed before execution (parse, validation, variables, or
/// the cost pre-pass): 400 under the newer media type; 200 under plain JSON, whose
/// clients expect any GraphQL response with 200.
fn not_executed(media_type: &'static str, errors: Vec<ServerError>) -> Response {
    let status = if media_type == GRAPHQL_RESPONSE_JSON {
        StatusCode::BAD_REQUEST
    } else {
        StatusCode::OK
    };
    // No `data` entry at all: the request never ran.
    let body = json!({ "errors": errors });
    graphql_response(media_type, status, body.to_string())
}

fn too_complex(media_type: &'static str, error: &CostError) -> Response {
    not_executed(
        media_type,
        vec![ErrorCode::QueryTooComplex.request_error(error.to_string())],
    )
}

/// The response that replaces one past the limit: execution ran (a mutation may have
/// taken effect), so it is a GraphQL response with null data and 200.
fn too_large(media_type: &'static str, meter: &ResponseMeter) -> Response {
    tracing::warn!(
        limit = MAX_RESPONSE_BYTES,
        "a response passed its size limit"
    );
    let body = json!({"data": null, "errors": [meter.error()]});
    graphql_response(media_type, StatusCode::OK, body.to_string())
}

/// A request that is not a GraphQL request at all (wrong media type, malformed body):
/// 4xx under either media type, since no GraphQL response exists to send with 200.
fn request_error(media_type: &'static str, status: StatusCode, message: &str) -> Response {
    let body = json!({"errors": [{"message": message}]});
    graphql_response(media_type, status, body.to_string())
}

fn coded_error(
    media_type: &'static str,
    status: StatusCode,
    code: ErrorCode,
    message: &str,
) -> Response {
    let body = json!({"errors": [{"message": message, "extensions": {"code": code.as_str()}}]});
    graphql_response(media_type, status, body.to_string())
}

fn too_many_requests(media_type: &'static str, retry_after: Duration, message: &str) -> Response {
    let mut response = coded_error(
        media_type,
        StatusCode::TOO_MANY_REQUESTS,
        ErrorCode::TooManyRequests,
        message,
    );
    // Whole seconds, rounded up: a client retrying at once would be refused again.
    let seconds = retry_after.as_secs() + u64::from(retry_after.subsec_nanos() > 0);
    response
        .headers_mut()
        .insert(header::RETRY_AFTER, HeaderValue::from(seconds.max(1)));
    response
}
