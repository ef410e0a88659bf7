//! GraphQL over HTTP, written around `Schema::execute` so that status codes and
//! content types follow the GraphQL-over-HTTP specification: `application/json` by
//! default, `application/graphql-response+json` when the client accepts it (then a
//! request that never executed answers 4xx).

use super::HttpState;
use super::auth::{AuthError, authenticate};
use crate::graphql::ErrorCode;
use async_graphql::http::GraphiQLSource;
use async_graphql::parser::types::OperationType;
use axum::body::Bytes;
use axum::extract::{RawQuery, State};
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::response::{Html, IntoResponse, Response};
use serde_json::json;

const GRAPHQL_RESPONSE_JSON: &str = "application/graphql-response+json";
const JSON: &str = "application/json";

/// POST /graphql: a JSON body `{query, variables, operationName}`.
pub async fn post(State(state): State<HttpState>, headers: HeaderMap, body: Bytes) -> Response {
    let media_type = response_media_type(&headers);
    let request: async_graphql::Request = match serde_json::from_slice(&body) {
        Ok(request) => request,
        Err(error) => {
            return request_error(
                media_type,
                StatusCode::BAD_REQUEST,
                &format!("the body is not a GraphQL request: {error}"),
            );
        }
    };
    execute(&state, &headers, request, media_type).await
}

/// GET /graphql: a query in the URL; GraphiQL for a browser asking for HTML.
pub async fn get(
    State(state): State<HttpState>,
    headers: HeaderMap,
    RawQuery(query): RawQuery,
) -> Response {
    let query = query.unwrap_or_default();
    if query.is_empty() && accepts(&headers, "text/html") {
        return Html(
            GraphiQLSource::build()
                .endpoint("/graphql")
                .subscription_endpoint("/graphql/ws")
                .finish(),
        )
        .into_response();
    }
    let media_type = response_media_type(&headers);
    let request = match async_graphql::http::parse_query_string(&query) {
        Ok(request) => request,
        Err(error) => {
            return request_error(
                media_type,
                StatusCode::BAD_REQUEST,
                &format!("the URL holds no GraphQL request: {error}"),
            );
        }
    };
    // GET must not change anything: mutations only over POST.
    if is_mutation(&request) {
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
    execute(&state, &headers, request, media_type).await
}

async fn execute(
    state: &HttpState,
    headers: &HeaderMap,
    request: async_graphql::Request,
    media_type: &'static str,
) -> Response {
    let credential = headers
        .get(header::AUTHORIZATION)
        .and_then(|value| value.to_str().ok());
    let request = match authenticate(&state.app, credential).await {
        Ok(Some(principal)) => request.data(principal),
        Ok(None) => request,
        Err(error @ (AuthError::Malformed | AuthError::UnknownKey)) => {
            return coded_error(
                media_type,
                StatusCode::UNAUTHORIZED,
                ErrorCode::Unauthenticated,
                &error.to_string(),
            );
        }
        Err(AuthError::Database(error)) => {
            tracing::error!(error = %error, "authenticating a request failed");
            return coded_error(
                media_type,
                StatusCode::INTERNAL_SERVER_ERROR,
                ErrorCode::Internal,
                "internal error",
            );
        }
    };
    let response = state.schema.execute(request).await;
    // With the newer media type, a request that failed before execution (no data at
    // all: syntax or validation errors) is a client error.
    let status = if media_type == GRAPHQL_RESPONSE_JSON
        && response.data == async_graphql::Value::Null
        && response.is_err()
    {
        StatusCode::BAD_REQUEST
    } else {
        StatusCode::OK
    };
    let body = serde_json::to_vec(&response).expect("a GraphQL response serializes");
    (status, [(header::CONTENT_TYPE, media_type)], body).into_response()
}

fn is_mutation(request: &async_graphql::Request) -> bool {
    let Ok(document) = async_graphql::parser::parse_query(&request.query) else {
        return false;
    };
    document.operations.iter().any(|(name, operation)| {
        let selected = match (&request.operation_name, name) {
            (Some(wanted), Some(name)) => wanted.as_str() == name.as_str(),
            (None, _) => true,
            (Some(_), None) => false,
        };
        selected && operation.node.ty == OperationType::Mutation
    })
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

/// A request that was not executed: a 4xx under the newer media type, and under
/// plain JSON too, since no GraphQL result exists to send with 200.
fn request_error(media_type: &'static str, status: StatusCode, message: &str) -> Response {
    let body = json!({"errors": [{"message": message}]});
    (
        status,
        [(header::CONTENT_TYPE, media_type)],
        body.to_string(),
    )
        .into_response()
}

fn coded_error(
    media_type: &'static str,
    status: StatusCode,
    code: ErrorCode,
    message: &str,
) -> Response {
    let body = json!({"errors": [{"message": message, "extensions": {"code": code.as_str()}}]});
    (
        status,
        [(header::CONTENT_TYPE, media_type)],
        body.to_string(),
    )
        .into_response()
}
