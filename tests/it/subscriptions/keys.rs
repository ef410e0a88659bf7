//! Keys over the live transports: a refused or revoked key closes its connections
//! with 4403 and ends its SSE streams; bad keys are throttled per address.

use super::{account_updates, another_key, message_for};
use crate::contract::operation;
use crate::helpers::{AppOptions, Backend, job_input, spawn_app};
use crate::socket::{GraphqlSocket, Received};
use serde_json::json;
use std::time::Duration;

on_both_backends!(
    a_revoked_key_closes_its_connections_in_every_process,
    a_refused_key_closes_the_connection_with_4403,
    a_revoked_key_ends_its_sse_streams,
);

async fn a_revoked_key_closes_its_connections_in_every_process(backend: Backend) {
    let app = spawn_app(backend.clone()).await;
    // SQLite serves the API from one process; PostgreSQL carries the revocation to
    // the others.
    let other = match backend {
        Backend::Postgres(_) => Some(app.another_process(AppOptions::no_workers()).await),
        Backend::Sqlite => None,
    };
    let listening = other.as_ref().unwrap_or(&app);
    let tenant = app.funded_tenant("acme", "5").await;
    let (key, key_id) = another_key(&app, &tenant, "dashboard").await;

    let mut revoked = GraphqlSocket::connect(listening.address).await;
    revoked.init_ok(&key).await;
    revoked.subscribe("1", &account_updates(), json!({})).await;
    let mut kept = GraphqlSocket::connect(listening.address).await;
    kept.init_ok(&tenant.key).await;
    kept.subscribe("1", &account_updates(), json!({})).await;
    tokio::time::sleep(Duration::from_millis(200)).await;

    let answer = app
        .operation(Some(&tenant.key), "RevokeApiKey", json!({"id": key_id}))
        .await;
    assert!(answer["errors"].is_null(), "{answer}");
    assert_eq!(revoked.closed_code(Duration::from_secs(5)).await, 4403);

    // The other key's connection is untouched and still delivers.
    let id = app.create_job_ok(&tenant, job_input("kept", "hello")).await;
    let event = message_for(&mut kept, "1").await;
    assert_eq!(
        event["payload"]["data"]["accountJobUpdates"]["jobId"],
        id.to_string()
    );
    // And the revoked key is refused over HTTP.
    let refused = listening
        .graphql(Some(&key), "{ account { name } }", json!({}))
        .await;
    assert_eq!(crate::helpers::error_code(&refused), "UNAUTHENTICATED");
}

async fn a_refused_key_closes_the_connection_with_4403(backend: Backend) {
    let app = spawn_app(backend).await;
    let mut socket = GraphqlSocket::connect(app.address).await;
    match socket.init("jl_not-a-key").await {
        Received::Closed(code, reason) => {
            assert_eq!(code, 4403);
            assert!(
                reason.contains("not valid"),
                "the reason says why: {reason}"
            );
        }
        other => panic!("a refused key must close the connection: {other:?}"),
    }
}

/// A stream over SSE ends, with an error saying why, once its key is revoked.
async fn a_revoked_key_ends_its_sse_streams(backend: Backend) {
    let app = spawn_app(backend).await;
    let tenant = app.funded_tenant("acme", "5").await;
    let (key, key_id) = another_key(&app, &tenant, "stream").await;
    let streaming = {
        let app_address = app.address;
        let http = app.http.clone();
        let key = key.clone();
        tokio::spawn(async move {
            let response = http
                .post(format!("http://{app_address}/graphql/sse"))
                .bearer_auth(&key)
                .json(&json!({"query": operation("AccountJobUpdates")}))
                .send()
                .await
                .unwrap();
            response.text().await.unwrap()
        })
    };
    tokio::time::sleep(Duration::from_millis(300)).await;
    let revoked = app
        .operation(Some(&tenant.key), "RevokeApiKey", json!({"id": key_id}))
        .await;
    assert!(revoked["errors"].is_null(), "{revoked}");
    let body = tokio::time::timeout(Duration::from_secs(5), streaming)
        .await
        .expect("the stream ended within 5 s of the revocation")
        .unwrap();
    assert!(body.contains("the API key was revoked"), "{body}");
    assert!(body.contains("event: complete"), "{body}");
}

/// Bad keys over WebSocket count against the address as over HTTP: past the limit a
/// `connection_init` is refused with 4429 without a database query, whatever the key.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn failed_websocket_authentications_are_throttled_per_address() {
    let app = spawn_app(Backend::Sqlite).await;
    let tenant = app.funded_tenant("acme", "5").await;
    let mut codes = Vec::new();
    for _ in 0..11 {
        let mut socket = GraphqlSocket::connect(app.address).await;
        match socket.init("jl_not-a-key").await {
            Received::Closed(code, _) => codes.push(code),
            other => panic!("a bad key must close the connection: {other:?}"),
        }
    }
    assert_eq!(codes[..10], [4403; 10]);
    assert_eq!(codes[10], 4429, "{codes:?}");
    // The address is throttled for HTTP too, and for a valid key.
    let mut socket = GraphqlSocket::connect(app.address).await;
    match socket.init(&tenant.key).await {
        Received::Closed(code, _) => assert_eq!(code, 4429),
        other => panic!("a throttled address is refused: {other:?}"),
    }
    let http = app
        .http
        .post(format!("http://{}/graphql", app.address))
        .bearer_auth(&tenant.key)
        .json(&json!({"query": "{ account { id } }"}))
        .send()
        .await
        .unwrap();
    assert_eq!(http.status(), 429);
}
