//! The web console and GraphiQL: static files compiled into the binary from
//! `console/`, so a browser needs nothing but this server. The console's pages run
//! under a Content-Security-Policy that allows only this origin and no inline script.
//!
//! Every file carries a strong `ETag` (a hash of its bytes, computed once) and is
//! answered `304 Not Modified` when the browser already holds it, so the 3.5 MB GraphiQL
//! bundle is downloaded once per binary rather than on every visit; files are sent gzipped
//! to clients that accept it, compressed once per file and kept.

use axum::body::Bytes;
use axum::extract::Path;
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use flate2::Compression;
use flate2::write::GzEncoder;
use include_dir::{Dir, File, include_dir};
use sha2::{Digest, Sha256};
use std::collections::HashMap;
use std::io::Write;
use std::sync::LazyLock;
use tokio::sync::OnceCell;

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

/// Every console file by its path under `console/`, with its validator.
static ASSETS: LazyLock<HashMap<&'static str, Asset>> = LazyLock::new(|| {
    let mut assets = HashMap::new();
    collect(&FILES, &mut assets);
    assets
});

/// One file as served.
struct Asset {
    contents: &'static [u8],
    /// A strong validator: the first 128 bits of the SHA-256 of `contents`, quoted.
    etag: HeaderValue,
    /// The gzip form, made on the first request that accepts it and kept.
    gzipped: OnceCell<Gzipped>,
}

/// A file's gzip form: another representation, so another validator.
struct Gzipped {
    bytes: Bytes,
    etag: HeaderValue,
}

fn collect(folder: &'static Dir<'static>, assets: &mut HashMap<&'static str, Asset>) {
    for file in folder.files() {
        assets.insert(file_path(file), Asset::new(file.contents()));
    }
    for inner in folder.dirs() {
        collect(inner, assets);
    }
}

fn file_path(file: &'static File<'static>) -> &'static str {
    file.path()
        .to_str()
        .expect("the console's file names are UTF-8")
}

impl Asset {
    fn new(contents: &'static [u8]) -> Self {
        let digest = Sha256::digest(contents);
        let etag = format!("\"{}\"", hex::encode(&digest[..16]));
        Self {
            contents,
            etag: HeaderValue::from_str(&etag).expect("hex digits make a header value"),
            gzipped: OnceCell::new(),
        }
    }

    /// The gzip form, compressed off the async threads the first time it is asked for.
    async fn gzipped(&'static self) -> &'static Gzipped {
        self.gzipped
            .get_or_init(|| async move {
                let contents = self.contents;
                let bytes = tokio::task::spawn_blocking(move || gzip(contents))
                    .await
                    .expect("compressing a console file does not panic");
                let etag = self.etag.to_str().expect("the validator is ASCII");
                let etag = format!("{}-gzip\"", &etag[..etag.len() - 1]);
                Gzipped {
                    bytes: Bytes::from(bytes),
                    etag: HeaderValue::from_str(&etag).expect("hex digits make a header value"),
                }
            })
            .await
    }
}

fn gzip(contents: &[u8]) -> Vec<u8> {
    let mut encoder = GzEncoder::new(Vec::new(), Compression::best());
    encoder
        .write_all(contents)
        .and_then(|()| encoder.finish())
        .expect("writing into memory does not fail")
}

/// Hashes every console file now, so that no request waits for it.
pub fn prepare() {
    LazyLock::force(&ASSETS);
}

/// GET /: the console's single page.
pub async fn index(headers: HeaderMap) -> Response {
    served("index.html", &headers, CONSOLE_POLICY).await
}

/// The GraphiQL page that GET /graphql shows a browser.
pub async fn graphiql(headers: &HeaderMap) -> Response {
    served("graphiql.html", headers, GRAPHIQL_POLICY).await
}

/// GET /assets/{path}: a script, style sheet or vendored library.
pub async fn asset(Path(path): Path<String>, headers: HeaderMap) -> Response {
    served(&format!("assets/{path}"), &headers, CONSOLE_POLICY).await
}

/// The file at `path`: 304 when the request names its current validator, gzipped when
/// the client accepts gzip, as it is otherwise. `no-cache` makes a browser
/// revalidate every time, so a new binary's console is never mixed with an old one's
/// scripts; the validator keeps that revalidation to a few hundred bytes.
async fn served(path: &str, request: &HeaderMap, policy: &'static str) -> Response {
    let Some(asset) = ASSETS.get(path) else {
        return (StatusCode::NOT_FOUND, "no such file").into_response();
    };
    let content_type = content_type(path);
    let (body, etag, encoding) = if accepts_gzip(request) {
        let gzipped = asset.gzipped().await;
        (gzipped.bytes.clone(), gzipped.etag.clone(), Some("gzip"))
    } else {
        (Bytes::from_static(asset.contents), asset.etag.clone(), None)
    };
    let mut response = if none_match(request, &etag) {
        StatusCode::NOT_MODIFIED.into_response()
    } else {
        let mut response = body.into_response();
        if let Some(encoding) = encoding {
            response
                .headers_mut()
                .insert(header::CONTENT_ENCODING, HeaderValue::from_static(encoding));
        }
        response
    };
    let headers = response.headers_mut();
    headers.insert(header::ETAG, etag);
    headers.insert(header::VARY, HeaderValue::from_static("accept-encoding"));
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

/// Whether `If-None-Match` names `etag` (or `*`). The comparison is the weak one RFC
/// 9110 prescribes for this header: a `W/` prefix is ignored.
fn none_match(request: &HeaderMap, etag: &HeaderValue) -> bool {
    let etag = etag.as_bytes();
    request
        .get_all(header::IF_NONE_MATCH)
        .iter()
        .filter_map(|value| value.to_str().ok())
        .flat_map(|value| value.split(','))
        .map(|tag| tag.trim())
        .any(|tag| tag == "*" || tag.trim_start_matches("W/").as_bytes() == etag)
}

/// Whether `Accept-Encoding` accepts gzip: named (or `*`) without `q=0`.
fn accepts_gzip(request: &HeaderMap) -> bool {
    request
        .get_all(header::ACCEPT_ENCODING)
        .iter()
        .filter_map(|value| value.to_str().ok())
        .flat_map(|value| value.split(','))
        .any(|item| {
            let mut parts = item.split(';').map(str::trim);
            let coding = parts.next().unwrap_or_default();
            let refused = parts.any(|parameter| {
                parameter
                    .strip_prefix("q=")
                    .and_then(|quality| quality.parse::<f32>().ok())
                    .is_some_and(|quality| quality == 0.0)
            });
            (coding.eq_ignore_ascii_case("gzip") || coding == "*") && !refused
        })
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
