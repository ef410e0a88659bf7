//! Live connections (WebSocket connections and SSE streams) bounded per tenant and for
//! the whole process, not only per address (issue 29): a tenant's keys used from many
//! addresses, or many addresses together, could hold any number of them.

use crate::helpers::{AppOptions, Backend, TestApp, spawn_app_with};
use crate::socket::{GraphqlSocket, Received};
use reqwest::StatusCode;
use serde_json::json;
use tokio_tungstenite::tungstenite::client::IntoClientRequest;

on_both_backends!(
    a_tenant_holds_a_bounded_number_of_live_connections,
    the_process_holds_a_bounded_number_of_live_connections,
);

/// Opens an SSE stream of `accountJobUpdates` with `key`; the response, its body
/// left unread.
async fn open_sse(app: &TestApp, key: &str) -> reqwest::Response {
    app.http
        .post(format!("http://{}/graphql/sse", app.address))
        .header("accept", "text/event-stream")
        .bearer_auth(key)
        .json(&json!({"query": crate::contract::operation("AccountJobUpdates")}))
        .send()
        .await
        .unwrap()
}

/// The status of a WebSocket upgrade refused before it happened.
async fn refused_upgrade(app: &TestApp) -> u16 {
    let mut request = format!("ws://{}/graphql/ws", app.address)
        .into_client_request()
        .unwrap();
    request.headers_mut().insert(
        "sec-websocket-protocol",
        "graphql-transport-ws".parse().unwrap(),
    );
    match tokio_tungstenite::connect_async(request).await {
        Err(tokio_tungstenite::tungstenite::Error::Http(response)) => response.status().as_u16(),
        other => panic!("the upgrade was accepted: {:?}", other.map(|_| ())),
    }
}

/// Past its cap of WebSocket connections and SSE streams together, a tenant's next
/// WebSocket is closed with 4429 at `connection_init` and its next SSE stream refused
/// with 429, within every per-address cap; another tenant is served, and a closed
/// stream frees its place.
async fn a_tenant_holds_a_bounded_number_of_live_connections(backend: Backend) {
    let app = spawn_app_with(backend, AppOptions::no_workers()).await;
    let greedy = app.funded_tenant("greedy", "5").await;
    let other = app.funded_tenant("other", "5").await;
    let cap = jobledger::http::MAX_LIVE_CONNECTIONS_PER_TENANT;
    let sockets_held = cap - cap / 4;
    let mut sockets = Vec::new();
    for _ in 0..sockets_held {
        let mut socket = GraphqlSocket::connect(app.address).await;
        socket.init_ok(&greedy.key).await;
        sockets.push(socket);
    }
    let mut streams = Vec::new();
    for _ in sockets_held..cap {
        let stream = open_sse(&app, &greedy.key).await;
        assert_eq!(stream.status(), StatusCode::OK);
        streams.push(stream);
    }
    let mut extra = GraphqlSocket::connect(app.address).await;
    match extra.init(&greedy.key).await {
        Received::Closed(code, reason) => {
            assert_eq!(code, 4429, "{reason}");
            assert!(reason.contains("live connections"), "{reason}");
        }
        other => panic!("a connection past the tenant's cap was kept: {other:?}"),
    }
    let refused = open_sse(&app, &greedy.key).await;
    assert_eq!(refused.status(), StatusCode::TOO_MANY_REQUESTS);
    // Another tenant is not affected.
    GraphqlSocket::connect(app.address)
        .await
        .init_ok(&other.key)
        .await;
    assert_eq!(open_sse(&app, &other.key).await.status(), StatusCode::OK);
    // A connection that closes gives its place back.
    drop(sockets.pop());
    let mut freed = None;
    for _ in 0..50 {
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
        let mut socket = GraphqlSocket::connect(app.address).await;
        if let Received::Message(message) = socket.init(&greedy.key).await
            && message["type"] == "connection_ack"
        {
            freed = Some(socket);
            break;
        }
    }
    assert!(
        freed.is_some(),
        "the closed connection's place was not given back"
    );
    drop(streams);
}

/// Past the process's budget of live connections (here 3) a WebSocket upgrade and an
/// SSE stream are refused with 503, whoever asks, while plain requests are served.
async fn the_process_holds_a_bounded_number_of_live_connections(backend: Backend) {
    let mut options = AppOptions::no_workers();
    options.operations.live.max_open = 3;
    let app = spawn_app_with(backend, options).await;
    let one = app.funded_tenant("one", "5").await;
    let two = app.funded_tenant("two", "5").await;
    let mut first = GraphqlSocket::connect(app.address).await;
    first.init_ok(&one.key).await;
    let mut second = GraphqlSocket::connect(app.address).await;
    second.init_ok(&two.key).await;
    let stream = open_sse(&app, &two.key).await;
    assert_eq!(stream.status(), StatusCode::OK);
    assert_eq!(refused_upgrade(&app).await, 503);
    assert_eq!(
        open_sse(&app, &one.key).await.status(),
        StatusCode::SERVICE_UNAVAILABLE
    );
    let account = app
        .http
        .post(app.url())
        .bearer_auth(&one.key)
        .json(&json!({"query": "{ account { id } }"}))
        .send()
        .await
        .unwrap();
    assert_eq!(account.status(), StatusCode::OK);
    // A closed connection gives its place back.
    drop(first);
    let mut freed = false;
    for _ in 0..50 {
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
        if open_sse(&app, &one.key).await.status() == StatusCode::OK {
            freed = true;
            break;
        }
    }
    assert!(freed, "the closed connection's place was not given back");
    drop((second, stream));
}
