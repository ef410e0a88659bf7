//! What one connection, one tenant and one address may hold: subscriptions, message
//! sizes, connections, and the time to initialise.

use super::{LIMIT, account_updates, message_for, sse_events};
use crate::helpers::{Backend, job_input, spawn_app};
use crate::socket::{GraphqlSocket, Received};
use serde_json::{Value, json};
use std::time::Duration;
use tokio_tungstenite::tungstenite::client::IntoClientRequest;

on_both_backends!(
    one_connection_holds_at_most_its_cap_of_subscriptions,
    an_oversized_message_is_refused_before_authentication,
    only_subscriptions_run_over_websocket_and_sse,
);

async fn one_connection_holds_at_most_its_cap_of_subscriptions(backend: Backend) {
    let app = spawn_app(backend).await;
    let tenant = app.funded_tenant("acme", "5").await;
    let mut socket = GraphqlSocket::connect(app.address).await;
    socket.init_ok(&tenant.key).await;
    let document = account_updates();
    for id in 1..=100 {
        socket
            .subscribe(&id.to_string(), &document, json!({}))
            .await;
    }
    socket.subscribe("101", &document, json!({})).await;
    // Subscriptions start in no particular order: one of the 101, any, is refused.
    let refused = match socket.next(LIMIT).await {
        Received::Message(message) => message,
        other => panic!("the connection ended: {other:?}"),
    };
    assert_eq!(
        refused["payload"]["errors"][0]["extensions"]["code"], "SUBSCRIPTION_LIMIT",
        "{refused}"
    );
    let refused_id = refused["id"].as_str().unwrap().to_owned();
    assert_eq!(
        message_for(&mut socket, &refused_id).await["type"],
        "complete"
    );
    assert!(
        socket
            .next_within(Duration::from_millis(500))
            .await
            .is_none(),
        "only one is refused"
    );

    // Completing a live one frees its place.
    let live = if refused_id == "1" { "2" } else { "1" };
    socket.send(json!({"id": live, "type": "complete"})).await;
    socket.subscribe("102", &document, json!({})).await;
    let id = app
        .create_job_ok(&tenant, job_input("after-cap", "hello"))
        .await;
    let event = message_for(&mut socket, "102").await;
    assert_eq!(event["type"], "next", "{event}");
    assert_eq!(
        event["payload"]["data"]["accountJobUpdates"]["jobId"],
        id.to_string()
    );
}

async fn an_oversized_message_is_refused_before_authentication(backend: Backend) {
    let app = spawn_app(backend).await;
    let mut socket = GraphqlSocket::connect(app.address).await;
    // Sending may already fail once the server has closed.
    let _ = socket
        .send_text(format!(
            r#"{{"type":"connection_init","payload":{{"x":"{}"}}}}"#,
            "x".repeat(1 << 20)
        ))
        .await;
    match socket.next(LIMIT).await {
        Received::Closed(code, _) => assert_eq!(code, 1009, "message too big"),
        Received::Dropped => {}
        Received::Message(message) => panic!("an oversized message was read: {message}"),
    }
    let health = app
        .http
        .get(format!("http://{}/healthz", app.address))
        .send()
        .await
        .unwrap();
    assert!(health.status().is_success());
}

/// Every tenant's live subscriptions in one process are capped too.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tenant_holds_at_most_its_cap_of_subscriptions() {
    let app = spawn_app(Backend::Sqlite).await;
    let tenant = app.funded_tenant("acme", "5").await;
    let per_connection = jobledger::graphql::MAX_SUBSCRIPTIONS_PER_CONNECTION;
    let connections = jobledger::bus::MAX_SUBSCRIPTIONS_PER_TENANT / per_connection;
    let mut sockets = Vec::new();
    for _ in 0..connections {
        let mut socket = GraphqlSocket::connect(app.address).await;
        socket.init_ok(&tenant.key).await;
        for id in 0..per_connection {
            socket
                .subscribe(&id.to_string(), &account_updates(), json!({}))
                .await;
        }
        sockets.push(socket);
    }
    // The others' subscriptions start as their connections get to them: one more
    // connection tries until the tenant is full.
    let mut extra = GraphqlSocket::connect(app.address).await;
    extra.init_ok(&tenant.key).await;
    let mut refused = None;
    for attempt in 0..50 {
        extra
            .subscribe(&format!("x{attempt}"), &account_updates(), json!({}))
            .await;
        if let Some(Received::Message(message)) =
            extra.next_within(Duration::from_millis(200)).await
        {
            refused = Some(message);
            break;
        }
    }
    let refused = refused.expect("a subscription past the tenant's cap is refused");
    assert_eq!(
        refused["payload"]["errors"][0]["extensions"]["code"], "SUBSCRIPTION_LIMIT",
        "{refused}"
    );
    assert!(
        refused["payload"]["errors"][0]["message"]
            .as_str()
            .unwrap()
            .contains("tenant"),
        "{refused}"
    );
}

/// A client that never sends `connection_init` is closed with 4408.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_connection_that_never_initialises_is_closed() {
    let app = spawn_app(Backend::Sqlite).await;
    let mut socket = GraphqlSocket::connect(app.address).await;
    assert_eq!(socket.closed_code(Duration::from_secs(15)).await, 4408);
}

/// One address holds at most a bounded number of WebSocket connections, whatever it
/// does with them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_address_holds_a_bounded_number_of_websockets() {
    let app = spawn_app(Backend::Sqlite).await;
    let cap = jobledger::http::MAX_SOCKETS_PER_ADDRESS;
    let mut sockets = Vec::new();
    for _ in 0..cap {
        sockets.push(GraphqlSocket::connect(app.address).await);
    }
    let mut request = format!("ws://{}/graphql/ws", app.address)
        .into_client_request()
        .unwrap();
    request.headers_mut().insert(
        "sec-websocket-protocol",
        "graphql-transport-ws".parse().unwrap(),
    );
    match tokio_tungstenite::connect_async(request).await {
        Err(tokio_tungstenite::tungstenite::Error::Http(response)) => {
            assert_eq!(response.status(), 429)
        }
        other => panic!(
            "the connection past the cap was accepted: {:?}",
            other.map(|_| ())
        ),
    }
    // Closing one frees its place.
    drop(sockets.pop());
    tokio::time::sleep(Duration::from_millis(300)).await;
    let mut socket = GraphqlSocket::connect(app.address).await;
    socket
        .init_ok(&app.funded_tenant("acme", "5").await.key)
        .await;
}

/// Queries and mutations over WebSocket or SSE would escape `/graphql`'s response
/// limit and request slots: they are refused there.
async fn only_subscriptions_run_over_websocket_and_sse(backend: Backend) {
    let app = spawn_app(backend).await;
    let tenant = app.funded_tenant("acme", "5").await;
    let events = sse_events(
        &app,
        Some(&tenant.key),
        json!({"query": "{ account { id } }"}),
    )
    .await;
    let result: Value = serde_json::from_str(&events[0].1).unwrap();
    assert_eq!(
        result["errors"][0]["extensions"]["code"], "VALIDATION",
        "{result}"
    );
    assert!(result["data"].is_null(), "{result}");

    let mut socket = GraphqlSocket::connect(app.address).await;
    socket.init_ok(&tenant.key).await;
    socket.subscribe("q", "{ account { id } }", json!({})).await;
    let refused = message_for(&mut socket, "q").await;
    assert_eq!(
        refused["payload"]["errors"][0]["extensions"]["code"], "VALIDATION",
        "{refused}"
    );
    assert!(refused["payload"]["data"].is_null(), "{refused}");
}
