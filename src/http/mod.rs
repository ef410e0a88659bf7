//! The HTTP surface: GraphQL over HTTP and WebSocket, and health probes.

mod auth;
mod graphql;
mod health;
mod sse;
mod websocket;

use crate::graphql::AppSchema;
use crate::startup::App;
use axum::Router;
use axum::extract::DefaultBodyLimit;
use axum::routing::get;

/// Largest GraphQL request body accepted.
const MAX_REQUEST_BYTES: usize = 16 * 1024 * 1024;
use tower_http::trace::TraceLayer;

/// What every handler shares.
#[derive(Clone)]
pub struct HttpState {
    pub app: App,
    pub schema: AppSchema,
}

/// Every route of the API.
pub fn router(state: HttpState) -> Router {
    Router::new()
        .route(
            "/graphql",
            get(graphql::get)
                .post(graphql::post)
                // Above the largest job input, so that an oversized one is refused
                // with a VALIDATION error that says why, not a bare 413.
                .layer(DefaultBodyLimit::max(MAX_REQUEST_BYTES)),
        )
        .route("/graphql/ws", get(websocket::upgrade))
        .route(
            "/graphql/sse",
            get(sse::get)
                .post(sse::post)
                .layer(DefaultBodyLimit::max(MAX_REQUEST_BYTES)),
        )
        .route("/healthz", get(health::healthz))
        .route("/readyz", get(health::readyz))
        .layer(TraceLayer::new_for_http())
        .with_state(state)
}
