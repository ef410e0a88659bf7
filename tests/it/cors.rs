//! Browsers on the origins `serve --cors-origin` lists may call the API; pages of any
//! other origin get no CORS headers and no WebSocket; with no list, nothing changes.

use crate::helpers::{AppOptions, Backend, TestApp, spawn_app_with, wait_until_serving};
use reqwest::header::HeaderMap;
use reqwest::{Method, StatusCode};
use serde_json::json;
use std::time::Duration;
use tokio_tungstenite::tungstenite::client::IntoClientRequest;

const LISTED: &str = "http://app.example.test";
const OTHER: &str = "http://localhost:5173";
const OTHER_LISTED: &str = "https://admin.example.test:8443";

async fn app_with_origins(origins: &[&str]) -> TestApp {
    spawn_app_with(
        Backend::Sqlite,
        AppOptions {
            cors_origins: origins.iter().map(|origin| (*origin).to_owned()).collect(),
            ..AppOptions::no_workers()
        },
    )
    .await
}

/// A browser's preflight of a POST with a key and a JSON body to `path`.
async fn preflight(app: &TestApp, path: &str, origin: &str) -> reqwest::Response {
    app.http
        .request(Method::OPTIONS, format!("http://{}{path}", app.address))
        .header("origin", origin)
        .header("access-control-request-method", "POST")
        .header(
            "access-control-request-headers",
            "authorization,content-type",
        )
        .send()
        .await
        .unwrap()
}

/// A POST of a query to /graphql from a page of `origin`.
async fn post_from(app: &TestApp, origin: &str) -> reqwest::Response {
    app.http
        .post(app.url())
        .header("origin", origin)
        .json(&json!({"query": "{ __typename }"}))
        .send()
        .await
        .unwrap()
}

fn header<'a>(headers: &'a HeaderMap, name: &str) -> &'a str {
    headers
        .get(name)
        .unwrap_or_else(|| panic!("no {name} in {headers:?}"))
        .to_str()
        .unwrap()
}

fn assert_no_cors_headers(headers: &HeaderMap, context: &str) {
    let cors: Vec<_> = headers
        .keys()
        .filter(|name| name.as_str().starts_with("access-control-"))
        .collect();
    assert!(cors.is_empty(), "{context}: {cors:?} in {headers:?}");
}

#[tokio::test]
async fn a_listed_origin_may_call_the_api_from_a_browser() {
    let app = app_with_origins(&[LISTED, OTHER_LISTED]).await;
    for path in ["/graphql", "/graphql/sse"] {
        for origin in [LISTED, OTHER_LISTED] {
            let answer = preflight(&app, path, origin).await;
            assert!(answer.status().is_success(), "{path}: {answer:?}");
            let headers = answer.headers();
            assert_eq!(header(headers, "access-control-allow-origin"), origin);
            assert!(header(headers, "access-control-allow-methods").contains("POST"));
            let allowed = header(headers, "access-control-allow-headers").to_lowercase();
            assert!(
                allowed.contains("authorization") && allowed.contains("content-type"),
                "{allowed}"
            );
            assert!(headers.get("access-control-allow-credentials").is_none());
        }
    }
    let answer = post_from(&app, LISTED).await;
    assert_eq!(answer.status(), StatusCode::OK);
    let headers = answer.headers().clone();
    assert_eq!(header(&headers, "access-control-allow-origin"), LISTED);
    assert!(header(&headers, "vary").to_lowercase().contains("origin"));
    assert!(
        header(&headers, "access-control-expose-headers")
            .to_lowercase()
            .contains("retry-after")
    );
    assert_eq!(
        answer.json::<serde_json::Value>().await.unwrap(),
        json!({"data": {"__typename": "QueryRoot"}})
    );
    // The batch results are fetched with the key too (the answer: no key, 401).
    let results = app
        .http
        .get(format!(
            "http://{}/batches/{}/results",
            app.address,
            uuid::Uuid::now_v7()
        ))
        .header("origin", LISTED)
        .send()
        .await
        .unwrap();
    assert_eq!(results.status(), StatusCode::UNAUTHORIZED);
    assert_eq!(
        header(results.headers(), "access-control-allow-origin"),
        LISTED
    );
}

#[tokio::test]
async fn an_unlisted_origin_gets_no_cors_headers() {
    let app = app_with_origins(&[LISTED]).await;
    // Exact origins only: another scheme, port or subdomain is another origin.
    for origin in [
        OTHER,
        "https://app.example.test",
        "http://app.example.test:8080",
        "http://evil.app.example.test",
        "null",
    ] {
        let answer = preflight(&app, "/graphql", origin).await;
        assert!(!answer.status().is_success(), "{origin}: {answer:?}");
        assert_no_cors_headers(answer.headers(), origin);
        let answer = post_from(&app, origin).await;
        assert_eq!(answer.status(), StatusCode::OK, "served, but unreadable");
        assert_no_cors_headers(answer.headers(), origin);
        assert!(
            header(answer.headers(), "vary")
                .to_lowercase()
                .contains("origin")
        );
    }
    // A request without an Origin (not a browser) is served as it always was.
    let answer = app
        .http
        .post(app.url())
        .json(&json!({"query": "{ __typename }"}))
        .send()
        .await
        .unwrap();
    assert_eq!(answer.status(), StatusCode::OK);
    assert_no_cors_headers(answer.headers(), "no origin");
}

#[tokio::test]
async fn without_a_list_no_origin_gets_cors_headers() {
    let app = app_with_origins(&[]).await;
    for origin in [LISTED, OTHER] {
        let answer = preflight(&app, "/graphql", origin).await;
        assert_eq!(answer.status(), StatusCode::METHOD_NOT_ALLOWED);
        assert_no_cors_headers(answer.headers(), origin);
        let answer = post_from(&app, origin).await;
        assert_eq!(answer.status(), StatusCode::OK);
        assert_no_cors_headers(answer.headers(), origin);
    }
    // WebSockets as before: any origin may open one (it still needs a key).
    assert_eq!(
        upgrade(&app, Some(OTHER)).await,
        StatusCode::SWITCHING_PROTOCOLS
    );
}

/// The status a WebSocket upgrade to /graphql/ws with `origin` is answered with.
async fn upgrade(app: &TestApp, origin: Option<&str>) -> StatusCode {
    let mut request = format!("ws://{}/graphql/ws", app.address)
        .into_client_request()
        .unwrap();
    let headers = request.headers_mut();
    headers.insert(
        "sec-websocket-protocol",
        "graphql-transport-ws".parse().unwrap(),
    );
    if let Some(origin) = origin {
        headers.insert("origin", origin.parse().unwrap());
    }
    match tokio_tungstenite::connect_async(request).await {
        Ok((_, response)) => response.status(),
        Err(tokio_tungstenite::tungstenite::Error::Http(response)) => response.status(),
        Err(error) => panic!("{origin:?}: {error}"),
    }
}

#[tokio::test]
async fn websocket_upgrades_from_unlisted_origins_are_refused() {
    let app = app_with_origins(&[LISTED]).await;
    for origin in [OTHER, "https://app.example.test", "null"] {
        assert_eq!(
            upgrade(&app, Some(origin)).await,
            StatusCode::FORBIDDEN,
            "{origin}"
        );
    }
    let own = format!("http://{}", app.address);
    for origin in [Some(LISTED), Some(own.as_str()), None] {
        assert_eq!(
            upgrade(&app, origin).await,
            StatusCode::SWITCHING_PROTOCOLS,
            "{origin:?}"
        );
    }
}

/// `jobledger serve` on a fresh SQLite file in `folder`, on a free port.
fn serve(folder: &std::path::Path) -> (tokio::process::Command, std::net::SocketAddr) {
    let listen = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap();
    let database_url = format!("sqlite:{}", folder.join("jobledger.db").display());
    let mut command = tokio::process::Command::new(env!("CARGO_BIN_EXE_jobledger"));
    command
        .args(["serve", "--workers", "0", "--listen", &listen.to_string()])
        .args(["--database-url", &database_url])
        .env("JOBLEDGER_ADMIN_TOKEN", crate::helpers::ADMIN_TOKEN)
        .env_remove("JOBLEDGER_CONFIG")
        .stdout(std::process::Stdio::null())
        .kill_on_drop(true);
    (command, listen)
}

#[tokio::test]
async fn the_environment_lists_origins_comma_separated_and_bad_ones_stop_serve() {
    let folder = tempfile::tempdir().unwrap();
    let (mut command, listen) = serve(folder.path());
    let _serving = command
        .env("JOBLEDGER_CORS_ORIGINS", format!("{LISTED},{OTHER_LISTED}"))
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    wait_until_serving(listen).await;
    let client = reqwest::Client::new();
    for origin in [LISTED, OTHER_LISTED] {
        let answer = client
            .request(Method::OPTIONS, format!("http://{listen}/graphql"))
            .header("origin", origin)
            .header("access-control-request-method", "POST")
            .send()
            .await
            .unwrap();
        assert_eq!(
            header(answer.headers(), "access-control-allow-origin"),
            origin
        );
    }

    for (origin, problem) in [
        (
            "http://app.example.test/",
            "write \"http://app.example.test\"",
        ),
        (
            "https://App.example.test",
            "write \"https://app.example.test\"",
        ),
        ("*", "*"),
        ("ftp://files.example.test", "http:// or https://"),
    ] {
        let (mut command, _) = serve(folder.path());
        let output = tokio::time::timeout(
            Duration::from_secs(30),
            command.args(["--cors-origin", origin]).output(),
        )
        .await
        .expect("serve exits at once")
        .expect("the binary runs");
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert!(!output.status.success(), "{origin} was accepted");
        assert!(
            stderr.contains("--cors-origin") && stderr.contains(problem),
            "{origin}: {stderr}"
        );
    }
}
