//! Subscriptions over WebSocket: `jobUpdates` replays from a sequence number, then
//! streams live events, completing after the terminal one; `accountJobUpdates` carries
//! every event of a tenant's jobs once, across processes; connections and tenants are
//! capped; a refused or revoked key closes the connection with 4403.

use crate::contract::operation;
use crate::helpers::{AppOptions, Backend, TestApp, TestTenant, job_input, spawn_app};
use crate::socket::{GraphqlSocket, Received};
use futures_util::StreamExt;
use serde_json::{Value, json};
use std::time::Duration;
use tokio_tungstenite::tungstenite::client::IntoClientRequest;

on_both_backends!(
    a_subscription_replays_after_a_seq_and_completes,
    a_subscription_streams_live_events_until_the_end,
);

const LIMIT: Duration = Duration::from_secs(20);

fn seqs_and_kinds(payloads: &[Value]) -> Vec<(i64, String)> {
    payloads
        .iter()
        .map(|payload| {
            assert!(payload["errors"].is_null(), "{payload}");
            let event = &payload["data"]["jobUpdates"];
            (
                event["seq"].as_i64().unwrap(),
                event["kind"].as_str().unwrap().to_owned(),
            )
        })
        .collect()
}

async fn a_subscription_replays_after_a_seq_and_completes(backend: Backend) {
    let app = spawn_app(backend).await;
    let tenant = app.funded_tenant("acme", "5").await;
    let id = app
        .create_job_ok(&tenant, job_input("replay", "hello"))
        .await;
    app.wait_until_finished(&tenant, id, LIMIT).await;
    let document = operation("JobUpdates");

    let all = app
        .subscribe(&tenant.key, &document, json!({"jobId": id}), LIMIT)
        .await
        .unwrap();
    assert_eq!(
        seqs_and_kinds(&all),
        [
            (1, "CREATED".into()),
            (2, "ATTEMPT_STARTED".into()),
            (3, "SUCCEEDED".into())
        ]
    );
    assert_eq!(all[2]["data"]["jobUpdates"]["status"], "SUCCEEDED");
    assert_eq!(all[0]["data"]["jobUpdates"]["jobId"], id.to_string());

    let after_first = app
        .subscribe(
            &tenant.key,
            &document,
            json!({"jobId": id, "afterSeq": 1}),
            LIMIT,
        )
        .await
        .unwrap();
    assert_eq!(
        seqs_and_kinds(&after_first),
        [(2, "ATTEMPT_STARTED".into()), (3, "SUCCEEDED".into())]
    );

    let after_the_end = app
        .subscribe(
            &tenant.key,
            &document,
            json!({"jobId": id, "afterSeq": 3}),
            LIMIT,
        )
        .await
        .unwrap();
    assert!(
        after_the_end.is_empty(),
        "nothing after the terminal event: {after_the_end:?}"
    );
}

async fn a_subscription_streams_live_events_until_the_end(backend: Backend) {
    let app = spawn_app(backend).await;
    let tenant = app.funded_tenant("acme", "5").await;
    let id = app
        .create_job_ok(&tenant, job_input("live", "hello [mock:delay_ms=1500]"))
        .await;
    let live = app
        .subscribe(
            &tenant.key,
            &operation("JobUpdates"),
            json!({"jobId": id, "afterSeq": 0}),
            LIMIT,
        )
        .await
        .unwrap();
    assert_eq!(
        seqs_and_kinds(&live),
        [
            (1, "CREATED".into()),
            (2, "ATTEMPT_STARTED".into()),
            (3, "SUCCEEDED".into())
        ]
    );
    let job = app.job(&tenant, id).await;
    assert_eq!(job["status"], "SUCCEEDED");
}

on_both_backends!(
    one_connection_holds_at_most_its_cap_of_subscriptions,
    account_updates_carry_every_event_of_the_tenant_once_across_processes,
    a_revoked_key_closes_its_connections_in_every_process,
    a_refused_key_closes_the_connection_with_4403,
    an_oversized_message_is_refused_before_authentication,
);

/// A second key of `tenant`, named `name`: its secret and its id.
async fn another_key(app: &TestApp, tenant: &TestTenant, name: &str) -> (String, String) {
    let created = app
        .operation(Some(&tenant.key), "CreateApiKey", json!({"name": name}))
        .await;
    let text = |value: &Value| value.as_str().unwrap().to_owned();
    (
        text(&created["data"]["createApiKey"]["apiKey"]),
        text(&created["data"]["createApiKey"]["key"]["id"]),
    )
}

/// The account stream of the contract, by operation name.
fn account_updates() -> String {
    operation("AccountJobUpdates")
}

/// The next `next` or `error` message for subscription `id`, skipping those of others.
async fn message_for(socket: &mut GraphqlSocket, id: &str) -> Value {
    loop {
        match socket.next(LIMIT).await {
            Received::Message(message) if message["id"] == id => return message,
            Received::Message(_) => {}
            other => panic!("the connection ended: {other:?}"),
        }
    }
}

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

async fn account_updates_carry_every_event_of_the_tenant_once_across_processes(backend: Backend) {
    // Jobs run in one process; the subscriber listens to another, which runs none.
    let worker = spawn_app(backend).await;
    let api = worker.another_process(AppOptions::no_workers()).await;
    let acme = worker.funded_tenant("acme", "5").await;
    let other = worker.funded_tenant("other", "5").await;
    let mut socket = GraphqlSocket::connect(api.address).await;
    socket.init_ok(&acme.key).await;
    socket
        .subscribe("acme", &account_updates(), json!({}))
        .await;
    // The subscription is live once the server has it; give it a moment.
    tokio::time::sleep(Duration::from_millis(200)).await;

    let mut jobs = Vec::new();
    for n in 0..3 {
        jobs.push(
            worker
                .create_job_ok(
                    &acme,
                    job_input(&format!("acct-{n}"), "hello [mock:delay_ms=100]"),
                )
                .await,
        );
    }
    let foreign = worker
        .create_job_ok(&other, job_input("foreign", "hello"))
        .await;

    let mut seen: Vec<(String, i64, String)> = Vec::new();
    let mut finished = 0;
    while finished < jobs.len() {
        let message = message_for(&mut socket, "acme").await;
        assert!(message["payload"]["errors"].is_null(), "{message}");
        let event = &message["payload"]["data"]["accountJobUpdates"];
        let kind = event["kind"].as_str().unwrap().to_owned();
        if ["SUCCEEDED", "FAILED", "CANCELLED"].contains(&kind.as_str()) {
            finished += 1;
        }
        seen.push((
            event["jobId"].as_str().unwrap().to_owned(),
            event["seq"].as_i64().unwrap(),
            kind,
        ));
    }
    // Late duplicates would arrive now.
    assert!(
        socket
            .next_within(Duration::from_millis(1_500))
            .await
            .is_none(),
        "nothing after the last terminal event"
    );
    assert!(
        seen.iter().all(|(job, _, _)| *job != foreign.to_string()),
        "another tenant's job leaked: {seen:?}"
    );
    for id in jobs {
        let stored = crate::helpers::event_kinds(&worker.job(&acme, id).await);
        let streamed: Vec<(i64, String)> = seen
            .iter()
            .filter(|(job, _, _)| *job == id.to_string())
            .map(|(_, seq, kind)| (*seq, kind.clone()))
            .collect();
        let expected: Vec<(i64, String)> = stored
            .into_iter()
            .enumerate()
            .map(|(index, kind)| (index as i64 + 1, kind))
            .collect();
        assert_eq!(streamed, expected, "each event once, in order");
    }
}

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
    let connections = jobledger::jobs::bus::MAX_SUBSCRIPTIONS_PER_TENANT / per_connection;
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

on_both_backends!(
    a_subscription_over_sse_replays_then_streams_until_the_end,
    sse_reports_request_errors_as_events_and_refuses_bad_keys,
);

/// Sends `body` to `/graphql/sse` and collects `(event, data)` pairs until `complete`.
async fn sse_events(app: &TestApp, key: Option<&str>, body: Value) -> Vec<(String, String)> {
    let mut request = app
        .http
        .post(format!("http://{}/graphql/sse", app.address))
        .header("accept", "text/event-stream")
        .json(&body);
    if let Some(key) = key {
        request = request.bearer_auth(key);
    }
    let response = request.send().await.unwrap();
    assert_eq!(response.status(), 200);
    assert!(
        response.headers()["content-type"]
            .to_str()
            .unwrap()
            .starts_with("text/event-stream")
    );
    let mut body = response.bytes_stream();
    let mut buffer = String::new();
    let mut events = Vec::new();
    let collect = async {
        while let Some(chunk) = body.next().await {
            buffer.push_str(std::str::from_utf8(&chunk.unwrap()).unwrap());
            while let Some(end) = buffer.find("\n\n") {
                let block: String = buffer.drain(..end + 2).collect();
                let mut event = None;
                let mut data = String::new();
                for line in block.lines() {
                    if let Some(name) = line.strip_prefix("event:") {
                        event = Some(name.trim().to_owned());
                    } else if let Some(text) = line.strip_prefix("data:") {
                        data.push_str(text.trim_start());
                    }
                }
                // Comments (keep-alives) carry no event.
                if let Some(event) = event {
                    let complete = event == "complete";
                    events.push((event, data));
                    if complete {
                        return;
                    }
                }
            }
        }
        panic!("the stream ended without `complete`: {events:?}");
    };
    tokio::time::timeout(LIMIT, collect)
        .await
        .expect("the stream completed in time");
    events
}

async fn a_subscription_over_sse_replays_then_streams_until_the_end(backend: Backend) {
    let app = spawn_app(backend).await;
    let tenant = app.funded_tenant("acme", "5").await;
    let id = app
        .create_job_ok(&tenant, job_input("sse", "hello [mock:delay_ms=500]"))
        .await;
    let events = sse_events(
        &app,
        Some(&tenant.key),
        json!({"query": operation("JobUpdates"), "variables": {"jobId": id, "afterSeq": 0}}),
    )
    .await;
    let (last, nexts) = events.split_last().unwrap();
    assert_eq!(last.0, "complete");
    let payloads: Vec<Value> = nexts
        .iter()
        .map(|(event, data)| {
            assert_eq!(event, "next");
            json!({"data": serde_json::from_str::<Value>(data).unwrap()["data"]})
        })
        .collect();
    assert_eq!(
        seqs_and_kinds(&payloads),
        [
            (1, "CREATED".into()),
            (2, "ATTEMPT_STARTED".into()),
            (3, "SUCCEEDED".into())
        ]
    );
}

async fn sse_reports_request_errors_as_events_and_refuses_bad_keys(backend: Backend) {
    let app = spawn_app(backend).await;
    let tenant = app.funded_tenant("acme", "5").await;
    let events = sse_events(
        &app,
        Some(&tenant.key),
        json!({"query": "subscription { noSuchField }"}),
    )
    .await;
    assert_eq!(events.len(), 2, "{events:?}");
    assert_eq!(events[0].0, "next");
    let result: Value = serde_json::from_str(&events[0].1).unwrap();
    assert!(result["errors"][0]["message"].is_string(), "{result}");
    assert_eq!(events[1].0, "complete");

    let refused = app
        .http
        .post(format!("http://{}/graphql/sse", app.address))
        .bearer_auth("jl_not-a-key")
        .json(&json!({"query": "{ account { id } }"}))
        .send()
        .await
        .unwrap();
    assert_eq!(refused.status(), 401);
    // An address that keeps presenting bad keys is turned away, as on /graphql.
    let mut statuses = Vec::new();
    for _ in 0..10 {
        let response = app
            .http
            .post(format!("http://{}/graphql/sse", app.address))
            .bearer_auth("jl_not-a-key")
            .json(&json!({"query": "{ account { id } }"}))
            .send()
            .await
            .unwrap();
        statuses.push(response.status().as_u16());
    }
    assert_eq!(statuses.last(), Some(&429), "{statuses:?}");
    let plain = app
        .http
        .post(format!("http://{}/graphql/sse", app.address))
        .header("content-type", "text/plain")
        .body(r#"{"query": "{ __typename }"}"#)
        .send()
        .await
        .unwrap();
    assert_eq!(plain.status(), 415);
}

on_both_backends!(
    only_subscriptions_run_over_websocket_and_sse,
    a_revoked_key_ends_its_sse_streams,
);

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
