//! Which browser pages may call the API: the origins `serve --cors-origin` lists.
//!
//! Off by default: with no list, no response carries an `Access-Control-*` header, so a
//! browser lets only the API's own pages (the console) read its answers. With a list,
//! a page of a listed origin may call `/graphql`, `/graphql/sse` and the batch results
//! with `Authorization` and `Content-Type` (its preflight is answered), and a page of
//! any other origin gets exactly what it got without a list. tower-http's `CorsLayer`
//! answers a preflight of any origin with the allowed methods and headers, so it is
//! applied to requests of listed origins only.
//!
//! WebSocket upgrades are not covered by CORS: a browser opens a socket to any site and
//! only sends its `Origin`. With a list, an upgrade from a page that is neither of a
//! listed origin nor of the API's own (the console's) is refused. Without a list every
//! upgrade is accepted, as before the list existed: a socket carries nothing until
//! `connection_init` presents a key, which a browser does not hold for another site.

use axum::extract::{Request, State};
use axum::http::{HeaderMap, HeaderValue, Method, header};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use std::sync::Arc;
use std::time::Duration;
use tower::{Layer, ServiceExt};
use tower_http::cors::{AllowOrigin, CorsLayer};

/// How long a browser may keep a preflight's answer.
const PREFLIGHT_MAX_AGE: Duration = Duration::from_secs(600);

/// The origins browsers may call the API from; empty: none but the API's own.
#[derive(Clone, Debug, Default)]
pub struct BrowserOrigins(Option<Arc<Listed>>);

#[derive(Debug)]
struct Listed {
    origins: Vec<HeaderValue>,
    layer: CorsLayer,
}

impl BrowserOrigins {
    /// `origins` as `config::cors_origin` accepted them.
    pub fn new(origins: &[String]) -> Self {
        let origins: Vec<HeaderValue> = origins
            .iter()
            .map(|origin| HeaderValue::from_str(origin).expect("an origin is a header value"))
            .collect();
        if origins.is_empty() {
            return Self(None);
        }
        let layer = CorsLayer::new()
            .allow_origin(AllowOrigin::list(origins.clone()))
            .allow_methods([Method::GET, Method::POST])
            .allow_headers([header::AUTHORIZATION, header::CONTENT_TYPE])
            // A 429's wait, for a page that backs off as the API asks.
            .expose_headers([header::RETRY_AFTER])
            .max_age(PREFLIGHT_MAX_AGE);
        Self(Some(Arc::new(Listed { origins, layer })))
    }

    /// Whether a list is configured.
    pub fn is_listed(&self) -> bool {
        self.0.is_some()
    }

    fn lists(&self, origin: Option<&HeaderValue>) -> Option<&Listed> {
        let listed = self.0.as_deref()?;
        let origin = origin?;
        listed.origins.contains(origin).then_some(listed)
    }

    /// Whether a WebSocket upgrade with these headers may open a socket: always
    /// without a list; with one, when it carries no `Origin` (not a browser), a listed
    /// one, or the API's own (its `Host`).
    pub fn may_open_socket(&self, headers: &HeaderMap) -> bool {
        let Some(origin) = headers.get(header::ORIGIN) else {
            return true;
        };
        if self.0.is_none() || self.lists(Some(origin)).is_some() {
            return true;
        }
        // A browser sends the page's origin and the host it connects to; they are the
        // same authority for the API's own pages (each without the default port).
        let authority = origin
            .to_str()
            .ok()
            .and_then(|origin| origin.split_once("://"))
            .map(|(_, authority)| authority);
        let host = headers
            .get(header::HOST)
            .and_then(|host| host.to_str().ok());
        matches!((authority, host), (Some(authority), Some(host)) if authority.eq_ignore_ascii_case(host))
    }
}

/// The CORS headers for a request of a listed origin; nothing for any other.
pub async fn apply(
    State(origins): State<BrowserOrigins>,
    request: Request,
    next: Next,
) -> Response {
    match origins.lists(request.headers().get(header::ORIGIN)) {
        Some(listed) => match listed.layer.layer(next).oneshot(request).await {
            Ok(response) => response.into_response(),
            Err(never) => match never {},
        },
        None => {
            let mut response = next.run(request).await;
            // What a listed origin gets differs: a cache must not hand this answer to
            // one.
            response
                .headers_mut()
                .append(header::VARY, HeaderValue::from_static("origin"));
            response
        }
    }
}

/// The refusal of a WebSocket upgrade from a page of an origin not listed.
pub fn socket_refused() -> Response {
    (
        axum::http::StatusCode::FORBIDDEN,
        "this origin may not open a WebSocket to this API",
    )
        .into_response()
}
