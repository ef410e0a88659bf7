//! What `/graphql` answers, by media type: the GraphQL-over-HTTP rules for status
//! codes and content types, and the errors sent before or instead of execution.

use crate::graphql::ApiErrorCode;
use crate::graphql::cost::{CostError, MAX_RESPONSE_BYTES, ResponseMeter};
use async_graphql::ServerError;
use axum::body::Body;
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use serde_json::json;
use std::time::Duration;

pub(super) const GRAPHQL_RESPONSE_JSON: &str = "application/graphql-response+json";
pub(in crate::http) const JSON: &str = "application/json";
/// The Content-Type of a POST must be JSON (either media type), in UTF-8.
pub(in crate::http) fn check_content_type(headers: &HeaderMap) -> Result<(), &'static str> {
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

pub(super) fn accepts(headers: &HeaderMap, media_type: &str) -> bool {
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
pub(super) fn response_media_type(headers: &HeaderMap) -> &'static str {
    if accepts(headers, GRAPHQL_RESPONSE_JSON) && !accepts(headers, JSON) {
        GRAPHQL_RESPONSE_JSON
    } else {
        JSON
    }
}

/// A GraphQL response body with its media type, in UTF-8.
pub(super) fn graphql_response(
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
pub(super) fn not_executed(media_type: &'static str, errors: Vec<ServerError>) -> Response {
    let status = if media_type == GRAPHQL_RESPONSE_JSON {
        StatusCode::BAD_REQUEST
    } else {
        StatusCode::OK
    };
    // No `data` entry at all: the request never ran.
    let body = json!({ "errors": errors });
    graphql_response(media_type, status, body.to_string())
}

pub(super) fn too_complex(media_type: &'static str, error: &CostError) -> Response {
    not_executed(
        media_type,
        vec![ApiErrorCode::QueryTooComplex.request_error(error.to_string())],
    )
}

/// The response that replaces one past the limit: execution ran (a mutation may have
/// taken effect), so it is a GraphQL response with null data and 200.
pub(super) fn too_large(media_type: &'static str, meter: &ResponseMeter) -> Response {
    tracing::warn!(
        limit = MAX_RESPONSE_BYTES,
        "a response passed its size limit"
    );
    let body = json!({"data": null, "errors": [meter.error()]});
    graphql_response(media_type, StatusCode::OK, body.to_string())
}

/// A request that is not a GraphQL request at all (wrong media type, malformed body):
/// 4xx under either media type, since no GraphQL response exists to send with 200.
pub(super) fn request_error(
    media_type: &'static str,
    status: StatusCode,
    message: &str,
) -> Response {
    coded_error(media_type, status, ApiErrorCode::BadRequest, message)
}

pub(super) fn coded_error(
    media_type: &'static str,
    status: StatusCode,
    code: ApiErrorCode,
    message: &str,
) -> Response {
    let body = json!({"errors": [{"message": message, "extensions": {"code": code.as_str()}}]});
    graphql_response(media_type, status, body.to_string())
}

pub(super) fn too_many_requests(
    media_type: &'static str,
    retry_after: Duration,
    message: &str,
) -> Response {
    let mut response = coded_error(
        media_type,
        StatusCode::TOO_MANY_REQUESTS,
        ApiErrorCode::TooManyRequests,
        message,
    );
    // Whole seconds, rounded up: a client retrying at once would be refused again.
    let seconds = retry_after.as_secs() + u64::from(retry_after.subsec_nanos() > 0);
    response
        .headers_mut()
        .insert(header::RETRY_AFTER, HeaderValue::from(seconds.max(1)));
    response
}
