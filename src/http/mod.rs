//! The HTTP surface: GraphQL over HTTP, SSE and WebSocket, health probes and the web
//! console, served with the connection timeouts of `serve`.

mod auth;
mod batches;
mod client_limits;
mod console;
mod cors;
mod graphql;
mod health;
mod live;
mod rate;
mod serve;
mod sse;
mod websocket;

use crate::app::App;
use crate::config::LiveConnectionSettings;
use crate::graphql::AppSchema;
use axum::Router;
use axum::extract::{DefaultBodyLimit, FromRef};
use axum::http::{HeaderValue, header};
use axum::routing::get;
use client_limits::{AuthThrottle, RequestSlots};
use std::sync::Arc;
use std::time::Duration;
use tower_http::set_header::SetResponseHeaderLayer;
use tower_http::trace::TraceLayer;

pub use client_limits::{MAX_CONNECTIONS_PER_ADDRESS, MAX_SOCKETS_PER_ADDRESS};
pub use cors::BrowserOrigins;
pub use live::MAX_LIVE_CONNECTIONS_PER_TENANT;
pub use rate::ANONYMOUS_REQUEST_BURST;
pub use serve::serve;

/// What every handler shares.
#[derive(Clone)]
pub struct HttpState {
    pub app: App,
    pub schema: AppSchema,
    limits: Arc<ClientLimits>,
    /// How long a WebSocket connection may hold no subscription before it is closed.
    unsubscribed_socket_timeout: Duration,
    /// The origins whose pages may call the API (see `cors`).
    origins: BrowserOrigins,
}

/// The in-memory limits every GraphQL request passes (see `limits`).
#[derive(Debug)]
struct ClientLimits {
    auth_failures: AuthThrottle,
    slots: RequestSlots,
    anonymous_rate: rate::AnonymousRate,
    sockets: client_limits::AddressCounts,
    live: live::LiveConnections,
    large_bodies: graphql::body::LargeBodies,
}

impl ClientLimits {
    fn new(live: &LiveConnectionSettings) -> Self {
        Self {
            auth_failures: AuthThrottle::default(),
            slots: RequestSlots::default(),
            anonymous_rate: rate::AnonymousRate::default(),
            sockets: client_limits::AddressCounts::new(MAX_SOCKETS_PER_ADDRESS),
            live: live::LiveConnections::new(live),
            large_bodies: graphql::body::LargeBodies::default(),
        }
    }
}

impl HttpState {
    /// The state of one server: `app` and `schema`, with fresh client limits, the
    /// bounds on its live connections and the origins browsers may call it from.
    pub fn new(
        app: App,
        schema: AppSchema,
        live: LiveConnectionSettings,
        origins: BrowserOrigins,
    ) -> Self {
        Self {
            app,
            schema,
            limits: Arc::new(ClientLimits::new(&live)),
            unsubscribed_socket_timeout: live.unsubscribed_socket_timeout,
            origins,
        }
    }
}

impl FromRef<HttpState> for App {
    fn from_ref(state: &HttpState) -> Self {
        state.app.clone()
    }
}

/// Every route of the API; `/metrics` too unless `metrics_elsewhere` (then the
/// operations listener serves it, off the API's port).
pub fn router(state: HttpState, metrics_elsewhere: bool) -> Router {
    console::prepare();
    // What a page of another origin may call, when `--cors-origin` lists it.
    let browser_routes = Router::new()
        .route("/graphql", get(graphql::get).post(graphql::post))
        .route(
            "/graphql/sse",
            get(sse::get)
                .post(sse::post)
                .layer(DefaultBodyLimit::max(graphql::body::MAX_REQUEST_BYTES)),
        )
        .route("/batches/{id}/results", get(batches::results));
    let browser_routes = if state.origins.is_listed() {
        browser_routes.layer(axum::middleware::from_fn_with_state(
            state.origins.clone(),
            cors::apply,
        ))
    } else {
        browser_routes
    };
    let router = Router::new()
        .merge(browser_routes)
        .route("/", get(console::index))
        .route("/assets/{*path}", get(console::asset))
        .route("/graphql/ws", get(websocket::upgrade))
        .route("/healthz", get(health::healthz))
        .route("/readyz", get(health::readyz));
    let router = if metrics_elsewhere {
        router
    } else {
        router.route("/metrics", get(health::metrics))
    };
    router
        .layer(no_sniffing())
        .layer(TraceLayer::new_for_http())
        .with_state(state)
}

/// `X-Content-Type-Options: nosniff` on every response: a browser never reads a JSON
/// answer (which may echo what a client sent) as HTML or script.
fn no_sniffing() -> SetResponseHeaderLayer<HeaderValue> {
    SetResponseHeaderLayer::overriding(
        header::X_CONTENT_TYPE_OPTIONS,
        HeaderValue::from_static("nosniff"),
    )
}

/// The routes of a worker's metrics listener: `/metrics`, `/healthz` and `/readyz`.
pub fn operations_router(app: App) -> Router {
    Router::new()
        .route("/healthz", get(health::healthz))
        .route("/readyz", get(health::readyz))
        .route("/metrics", get(health::metrics))
        .layer(no_sniffing())
        .layer(TraceLayer::new_for_http())
        .with_state(app)
}
