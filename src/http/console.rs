//! The web console and GraphiQL: static files compiled into the binary from
//! `console/`, so a browser needs nothing but this server. The console's pages run
//! under a Content-Security-Policy that allows only this origin and no inline script.

use axum::extract::Path;
use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use include_dir::{Dir, include_dir};

/// Every file of the console, GraphiQL's page and the vendored libraries.
static FILES: Dir<'static> = include_dir!("$CARGO_MANIFEST_DIR/console");

/// The console's policy: scripts, styles, images and connections (WebSocket
/// included) from this origin only; no inline script or style, no framing.
const CONSOLE_POLICY: &str = "default-src 'none'; script-src 'self'; style-src 'self'; \
    img-src 'self' data:; connect-src 'self'; font-src 'self'; base-uri 'none'; \
    form-action 'self'; frame-ancestors 'none'";

/// GraphiQL's policy: as the console's, but its editor sets inline styles and embeds
/// its fonts and icons as data URLs.
const GRAPHIQL_POLICY: &str = "default-src 'none'; script-src 'self'; \
    style-src 'self' 'unsafe-inline'; img-src 'self' data:; connect-src 'self'; \
    font-src 'self' data:; base-uri 'none'; form-action 'self'; frame-ancestors 'none'";

/// GET /: the console's single page.
pub async fn index() -> Response {
    page("index.html", CONSOLE_POLICY)
}

/// The GraphiQL page that GET /graphql shows a browser.
pub fn graphiql() -> Response {
    page("graphiql.html", GRAPHIQL_POLICY)
}

/// GET /assets/{path}: a script, style sheet or vendored library.
pub async fn asset(Path(path): Path<String>) -> Response {
    match FILES.get_file(format!("assets/{path}")) {
        Some(file) => served(file.contents(), content_type(&path), CONSOLE_POLICY),
        None => (StatusCode::NOT_FOUND, "no such file").into_response(),
    }
}

fn page(name: &str, policy: &'static str) -> Response {
    let file = FILES
        .get_file(name)
        .expect("the console's pages are compiled in");
    served(file.contents(), "text/html; charset=utf-8", policy)
}

/// `contents` with the headers every console file carries. `no-cache` makes a browser
/// revalidate, so a new binary's console is never mixed with an old one's scripts.
fn served(contents: &'static [u8], content_type: &'static str, policy: &'static str) -> Response {
    let mut response = contents.into_response();
    let headers = response.headers_mut();
    headers.insert(header::CONTENT_TYPE, HeaderValue::from_static(content_type));
    headers.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-cache"));
    headers.insert(
        header::CONTENT_SECURITY_POLICY,
        HeaderValue::from_static(policy),
    );
    headers.insert(
        header::X_CONTENT_TYPE_OPTIONS,
        HeaderValue::from_static("nosniff"),
    );
    headers.insert(header::X_FRAME_OPTIONS, HeaderValue::from_static("DENY"));
    headers.insert(
        header::REFERRER_POLICY,
        HeaderValue::from_static("no-referrer"),
    );
    response
}

/// The media type of a console file, by its extension.
fn content_type(path: &str) -> &'static str {
    match path.rsplit_once('.').map(|(_, extension)| extension) {
        Some("js") => "text/javascript; charset=utf-8",
        Some("css") => "text/css; charset=utf-8",
        Some("svg") => "image/svg+xml",
        Some("html") => "text/html; charset=utf-8",
        _ => "text/plain; charset=utf-8",
    }
}
