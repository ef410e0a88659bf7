//! A token's end: its expiry (and its streams'), the key that minted it, and the tenant's live connections it cannot take.

use super::*;

on_both_backends!(
    an_expired_token_is_refused_and_its_streams_end,
    a_token_dies_with_the_key_that_minted_it,
    a_token_cannot_take_its_tenants_live_connections,
);

async fn an_expired_token_is_refused_and_its_streams_end(backend: Backend) {
    let app = spawn_app(backend).await;
    let tenant = app.funded_tenant("acme", "5").await;
    // Scheduled far ahead, so that the job's stream stays open.
    let mut input = job_input("later", "hello");
    input["runAt"] = json!((chrono::Utc::now() + chrono::Duration::days(30)).to_rfc3339());
    let job = app.create_job_ok(&tenant, input).await;
    let token = mint(
        &app,
        &tenant.key,
        &tenant,
        json!({"scopes": ["READ_JOBS"], "ttlSeconds": 2}),
    )
    .await;
    let minted_at = Instant::now();
    let mut socket = GraphqlSocket::connect(app.address).await;
    socket.init_ok(&token.key).await;
    socket
        .subscribe("1", &operation("JobUpdates"), json!({"jobId": job}))
        .await;
    let sse = {
        let address = app.address;
        let http = app.http.clone();
        let key = token.key.clone();
        tokio::spawn(async move {
            http.post(format!("http://{address}/graphql/sse"))
                .bearer_auth(&key)
                .json(&json!({"query": operation("JobUpdates"), "variables": {"jobId": job}}))
                .send()
                .await
                .unwrap()
                .text()
                .await
                .unwrap()
        })
    };
    assert!(job_as(&app, &token, job).await["errors"].is_null());

    assert_eq!(socket.closed_code(Duration::from_secs(7)).await, 4403);
    let closed_after = minted_at.elapsed();
    assert!(
        closed_after >= Duration::from_millis(1_500) && closed_after < Duration::from_secs(7),
        "closed {closed_after:?} after minting"
    );
    let body = tokio::time::timeout(Duration::from_secs(5), sse)
        .await
        .expect("the SSE stream ended soon after the expiry")
        .unwrap();
    assert!(body.contains("the access token has expired"), "{body}");
    assert!(body.contains("event: complete"), "{body}");

    let response = app
        .http
        .post(format!("http://{}/graphql", app.address))
        .bearer_auth(&token.key)
        .json(&json!({"query": operation("Job"), "variables": {"id": job}}))
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 401);
    let body: Value = response.json().await.unwrap();
    assert_eq!(error_code(&body), "UNAUTHENTICATED");
    // A new connection with it is refused at its handshake.
    let mut late = GraphqlSocket::connect(app.address).await;
    match late.init(&token.key).await {
        Received::Closed(code, reason) => {
            assert_eq!(code, 4403);
            assert!(reason.contains("expired"), "{reason}");
        }
        other => panic!("an expired token must be refused: {other:?}"),
    }
}

/// Revoking the key that minted a token ends the token: over HTTP at once, and on its
/// open sockets as for the key itself.
async fn a_token_dies_with_the_key_that_minted_it(backend: Backend) {
    let app = spawn_app_with(backend, AppOptions::no_workers()).await;
    let tenant = app.funded_tenant("acme", "5").await;
    let created = app
        .operation(
            Some(&tenant.key),
            "CreateApiKey",
            json!({"name": "backend"}),
        )
        .await;
    let backend_key = created["data"]["createApiKey"]["apiKey"]
        .as_str()
        .unwrap()
        .to_owned();
    let key_id = created["data"]["createApiKey"]["key"]["id"].clone();
    let job = app
        .create_job_ok(&tenant, job_input("queued", "hello"))
        .await;
    let token = mint(
        &app,
        &backend_key,
        &tenant,
        json!({"scopes": ["READ_JOBS"]}),
    )
    .await;
    let admin_minted = mint(
        &app,
        crate::helpers::ADMIN_TOKEN,
        &tenant,
        json!({"scopes": ["READ_JOBS"], "tenantId": tenant.id}),
    )
    .await;
    let mut socket = GraphqlSocket::connect(app.address).await;
    socket.init_ok(&token.key).await;
    socket
        .subscribe("1", &operation("JobUpdates"), json!({"jobId": job}))
        .await;
    assert!(job_as(&app, &token, job).await["errors"].is_null());

    let revoked = app
        .operation(Some(&tenant.key), "RevokeApiKey", json!({"id": key_id}))
        .await;
    assert!(revoked["errors"].is_null(), "{revoked}");
    assert_eq!(socket.closed_code(Duration::from_secs(5)).await, 4403);
    assert_eq!(
        error_code(&job_as(&app, &token, job).await),
        "UNAUTHENTICATED"
    );
    // Tokens of other keys, and the admin's, live on.
    assert!(job_as(&app, &admin_minted, job).await["errors"].is_null());
}

/// A browser's token holds at most 16 live connections of its own, so that it cannot
/// fill its tenant's 256 and shut out the tenant's backend and other users.
async fn a_token_cannot_take_its_tenants_live_connections(backend: Backend) {
    let app = spawn_app_with(backend, AppOptions::no_workers()).await;
    let tenant = app.funded_tenant("acme", "5").await;
    let token = mint(&app, &tenant.key, &tenant, json!({"scopes": ["READ_JOBS"]})).await;
    let mut held = Vec::new();
    for _ in 0..16 {
        let mut socket = GraphqlSocket::connect(app.address).await;
        socket.init_ok(&token.key).await;
        held.push(socket);
    }
    let mut refused = GraphqlSocket::connect(app.address).await;
    match refused.init(&token.key).await {
        Received::Closed(code, reason) => {
            assert_eq!(code, 4429);
            assert!(reason.contains("access token"), "{reason}");
        }
        other => panic!("a 17th connection of one token must be refused: {other:?}"),
    }
    // The tenant's own key, and another token of it, still connect.
    let mut backend_socket = GraphqlSocket::connect(app.address).await;
    backend_socket.init_ok(&tenant.key).await;
    let other = mint(&app, &tenant.key, &tenant, json!({"scopes": ["READ_JOBS"]})).await;
    let mut other_socket = GraphqlSocket::connect(app.address).await;
    other_socket.init_ok(&other.key).await;
    // A place is given back when its connection closes.
    drop(held.pop());
    tokio::time::sleep(Duration::from_millis(300)).await;
    let mut again = GraphqlSocket::connect(app.address).await;
    again.init_ok(&token.key).await;
}
