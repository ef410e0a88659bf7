//! One client against the others: failed authentications throttled per address, a
//! few requests and top-level fields at once per tenant, keyless requests bounded in
//! rate per address, and a response counted against its owner until it is read.

use crate::helpers::{AppOptions, Backend, error_code, job_input, large_job_input, spawn_app_with};
use reqwest::StatusCode;
use serde_json::{Value, json};
use std::net::{IpAddr, Ipv4Addr};
use std::time::{Duration, Instant};
use tokio::io::AsyncWriteExt;
use tokio::net::TcpStream;

on_both_backends!(
    failed_authentications_are_throttled_per_address,
    each_tenant_has_a_few_requests_in_flight,
    a_token_cannot_take_its_tenants_request_slots,
    keyless_requests_are_bounded_in_rate_per_address,
    large_bodies_are_read_within_one_budget_of_the_process,
);

/// A client whose requests come from `address` (any 127.0.0.0/8 address reaches a
/// server on 127.0.0.1).
fn client_from(address: Ipv4Addr) -> reqwest::Client {
    reqwest::Client::builder()
        .local_address(IpAddr::V4(address))
        .build()
        .unwrap()
}

async fn failed_authentications_are_throttled_per_address(backend: Backend) {
    let app = spawn_app_with(backend, AppOptions::no_workers()).await;
    let tenant = app.funded_tenant("acme", "5").await;
    let guesser = client_from(Ipv4Addr::new(127, 0, 0, 2));
    let neighbour = client_from(Ipv4Addr::new(127, 0, 0, 3));
    let send = |client: &reqwest::Client, key: Option<&str>| {
        let mut request = client
            .post(app.url())
            .json(&json!({"query": "{ account { id } }"}));
        if let Some(key) = key {
            request = request.bearer_auth(key);
        }
        request.send()
    };
    for attempt in 0..10 {
        let response = send(&guesser, Some(&format!("jl_guess_{attempt}")))
            .await
            .unwrap();
        assert_eq!(response.status(), StatusCode::UNAUTHORIZED);
    }
    // The eleventh attempt is refused before the key is looked at, even a valid key.
    for key in ["jl_guess_10", tenant.key.as_str()] {
        let response = send(&guesser, Some(key)).await.unwrap();
        assert_eq!(response.status(), StatusCode::TOO_MANY_REQUESTS);
        let retry_after: u64 = response.headers()["retry-after"]
            .to_str()
            .unwrap()
            .parse()
            .unwrap();
        assert!((1..=60).contains(&retry_after), "{retry_after}");
        let body: Value = response.json().await.unwrap();
        assert_eq!(error_code(&body), "TOO_MANY_REQUESTS");
    }
    // Another address is not affected.
    let response = send(&neighbour, Some(&tenant.key)).await.unwrap();
    assert_eq!(response.status(), StatusCode::OK);

    // Refusing the guesser needs no database: with the pool closed, it is still
    // refused the same way, while a request that must look its key up fails.
    // Closing marks the pool closed at once, then waits for every connection to come
    // back — on PostgreSQL the relay's LISTEN connection never does.
    let _ = tokio::time::timeout(Duration::from_secs(1), app.app.db.clone().close()).await;
    let response = send(&guesser, Some(&tenant.key)).await.unwrap();
    assert_eq!(response.status(), StatusCode::TOO_MANY_REQUESTS);
    let response = send(&neighbour, Some(&tenant.key)).await.unwrap();
    assert_eq!(response.status(), StatusCode::INTERNAL_SERVER_ERROR);
}

async fn each_tenant_has_a_few_requests_in_flight(backend: Backend) {
    let app = spawn_app_with(backend, AppOptions::no_workers()).await;
    let greedy = app.funded_tenant("greedy", "5").await;
    let other = app.funded_tenant("other", "5").await;
    // Eight requests whose body never finishes arriving, half of them to the SSE
    // endpoint: each holds one of the tenant's slots until its body times out.
    let mut held = Vec::new();
    for index in 0..8 {
        let mut socket = TcpStream::connect(app.address).await.unwrap();
        let path = if index % 2 == 0 {
            "/graphql"
        } else {
            "/graphql/sse"
        };
        let head = format!(
            "POST {path} HTTP/1.1\r\nhost: test\r\ncontent-type: application/json\r\nauthorization: Bearer {}\r\ncontent-length: 100\r\n\r\n{{\"query\":",
            greedy.key
        );
        socket.write_all(head.as_bytes()).await.unwrap();
        held.push(socket);
    }
    // The server admits them as their heads arrive; a probe that still found a free
    // slot tries again.
    let mut probes = 0;
    let body = loop {
        tokio::time::sleep(Duration::from_millis(500)).await;
        let started = Instant::now();
        let (status, body) = app
            .post_strict(Some(&greedy.key), "{ account { id } }")
            .await;
        if status == StatusCode::TOO_MANY_REQUESTS {
            // Refused after waiting a bounded time for a slot.
            assert!(started.elapsed() < Duration::from_secs(10));
            break body;
        }
        probes += 1;
        assert!(
            probes < 5,
            "a ninth request in flight was served: {status} {body}"
        );
    };
    assert_eq!(error_code(&body), "TOO_MANY_REQUESTS");
    // Other tenants are not held up.
    let started = Instant::now();
    let (status, body) = app
        .post_strict(Some(&other.key), "{ account { id } }")
        .await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert!(started.elapsed() < Duration::from_secs(1));

    // Once the greedy requests are gone, the tenant is served again.
    drop(held);
    let (status, body) = app
        .post_strict(Some(&greedy.key), "{ account { id } }")
        .await;
    assert_eq!(status, StatusCode::OK, "{body}");
}

/// A page that keeps requests open (bodies that never finish arriving) holds its token's
/// few slots, not its tenant's: the tenant's backend is served while the token is
/// refused.
async fn a_token_cannot_take_its_tenants_request_slots(backend: Backend) {
    let app = spawn_app_with(backend, AppOptions::no_workers()).await;
    let tenant = app.funded_tenant("acme", "5").await;
    let minted = app
        .operation(
            Some(&tenant.key),
            "CreateAccessToken",
            json!({"input": {"scopes": ["READ_JOBS"], "labels": [{"key": "user", "value": "u1"}]}}),
        )
        .await;
    let token = minted["data"]["createAccessToken"]["token"]
        .as_str()
        .unwrap_or_else(|| panic!("{minted}"))
        .to_owned();
    // As many dripping requests as the tenant has slots.
    let mut held = Vec::new();
    for _ in 0..8 {
        let mut socket = TcpStream::connect(app.address).await.unwrap();
        let head = format!(
            "POST /graphql HTTP/1.1\r\nhost: test\r\ncontent-type: application/json\r\nauthorization: Bearer {}\r\ncontent-length: 100\r\n\r\n{{\"query\":",
            token
        );
        socket.write_all(head.as_bytes()).await.unwrap();
        held.push(socket);
    }
    tokio::time::sleep(Duration::from_millis(500)).await;
    let started = Instant::now();
    let (status, body) = app
        .post_strict(Some(&tenant.key), "{ account { id } }")
        .await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert!(started.elapsed() < Duration::from_secs(2));
    let (status, body) = app
        .post_strict(Some(&token), "{ jobs(first: 1) { edges { cursor } } }")
        .await;
    assert_eq!(status, StatusCode::TOO_MANY_REQUESTS, "{body}");
    assert_eq!(error_code(&body), "TOO_MANY_REQUESTS");

    drop(held);
    let (status, body) = app
        .post_strict(Some(&token), "{ jobs(first: 1) { edges { cursor } } }")
        .await;
    assert_eq!(status, StatusCode::OK, "{body}");
}

/// A keyless client that waits for each answer stays within its slots, but not within
/// its rate: past its burst it is refused with a `Retry-After`, while another address
/// and a key from the same address are served.
async fn keyless_requests_are_bounded_in_rate_per_address(backend: Backend) {
    let app = spawn_app_with(backend, AppOptions::no_workers()).await;
    let tenant = app.funded_tenant("acme", "5").await;
    let keyless = client_from(Ipv4Addr::new(127, 0, 0, 4));
    let send = |client: &reqwest::Client, key: Option<&str>| {
        let mut request = client
            .post(app.url())
            .json(&json!({"query": "{ __typename }"}));
        if let Some(key) = key {
            request = request.bearer_auth(key);
        }
        request.send()
    };
    let burst = jobledger::http::ANONYMOUS_REQUEST_BURST as usize;
    let mut served = 0;
    let refused = loop {
        let response = send(&keyless, None).await.unwrap();
        if response.status() == StatusCode::TOO_MANY_REQUESTS {
            break response;
        }
        assert_eq!(response.status(), StatusCode::OK);
        served += 1;
        // The bucket refills one request a second: a few more may pass meanwhile.
        assert!(served < burst + 10, "{served} keyless requests were served");
    };
    assert!(served >= burst, "refused after only {served} requests");
    let retry_after: u64 = refused.headers()["retry-after"]
        .to_str()
        .unwrap()
        .parse()
        .unwrap();
    assert_eq!(retry_after, 1);
    let body: Value = refused.json().await.unwrap();
    assert_eq!(error_code(&body), "TOO_MANY_REQUESTS");
    let neighbour = client_from(Ipv4Addr::new(127, 0, 0, 5));
    assert_eq!(
        send(&neighbour, None).await.unwrap().status(),
        StatusCode::OK
    );
    let response = send(&keyless, Some(&tenant.key)).await.unwrap();
    assert_eq!(response.status(), StatusCode::OK);
}

/// One tenant's many requests of many top-level fields run a few fields at a time in
/// the database, leaving the rest of the pool to other tenants: counted as the most
/// statements of that tenant running at once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_tenant_runs_a_few_top_level_fields_at_once() {
    use jobledger::accounts::Principal;
    use jobledger::app::App;
    use jobledger::graphql::build_schema;
    use std::sync::{Arc, Mutex};

    let app = spawn_app_with(Backend::Sqlite, AppOptions::no_workers()).await;
    let tenant = app.funded_tenant("acme", "5").await;
    let spans = Arc::new(Mutex::new(Vec::<(Instant, Instant)>::new()));
    let log = spans.clone();
    let mut db = app.app.db.clone();
    db.set_metric_callback(move |info| {
        let end = Instant::now();
        log.lock().unwrap().push((end - info.elapsed, end));
    });
    let schema = build_schema(App {
        db,
        ..app.app.clone()
    });
    let mut query = String::from("{");
    for index in 0..7 {
        query.push_str(&format!(
            " r{index}: billingSummary(from: \"2026-01-01T00:00:00Z\", to: \"2027-01-01T00:00:00Z\") {{ jobsCreated }}"
        ));
    }
    query.push('}');
    let requests = (0..8).map(|_| {
        let request = async_graphql::Request::new(query.clone()).data(Principal::Tenant {
            tenant_id: tenant.id,
        });
        schema.execute(request)
    });
    for response in futures_util::future::join_all(requests).await {
        assert!(response.errors.is_empty(), "{:?}", response.errors);
    }
    let spans = spans.lock().unwrap().clone();
    assert!(spans.len() >= 56, "every field ran: {}", spans.len());
    let most_at_once = spans
        .iter()
        .map(|(start, _)| {
            spans
                .iter()
                .filter(|(other_start, other_end)| other_start <= start && start < other_end)
                .count()
        })
        .max()
        .unwrap();
    assert!(
        most_at_once <= jobledger::graphql::fairness::QUERY_FIELDS_PER_TENANT,
        "{most_at_once} statements of one tenant ran at once"
    );
}

/// Pages with access tokens (one per page load) cannot take the top-level fields of
/// their tenant's backend: every token's fields wait their turn among the tenant's
/// tokens, apart from the tenant's own. Without that, the backend's one field waited
/// behind every aliased field the pages had sent.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tenants_tokens_cannot_take_its_backends_fields() {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicUsize, Ordering};

    let app = Arc::new(spawn_app_with(Backend::Sqlite, AppOptions::no_workers()).await);
    let tenant = app.funded_tenant("acme", "50").await;
    for index in 0..100 {
        let mut input = job_input(&format!("doc-{index}"), "Summarise.");
        input["labels"] = json!([{"key": "user", "value": "u1"}]);
        app.create_job_ok(&tenant, input).await;
    }
    let mut tokens = Vec::new();
    for _ in 0..8 {
        let minted = app
            .operation(
                Some(&tenant.key),
                "CreateAccessToken",
                json!({"input": {"scopes": ["READ_JOBS"], "labels": [{"key": "user", "value": "u1"}]}}),
            )
            .await;
        tokens.push(
            minted["data"]["createAccessToken"]["token"]
                .as_str()
                .unwrap_or_else(|| panic!("{minted}"))
                .to_owned(),
        );
    }
    let mut heavy = String::from("{");
    for index in 0..40 {
        heavy.push_str(&format!(
            " a{index}: jobs(first: 100) {{ edges {{ node {{ id status }} }} }}"
        ));
    }
    heavy.push('}');
    let finished = Arc::new(AtomicUsize::new(0));
    let mut pages = Vec::new();
    for token in &tokens {
        for _ in 0..2 {
            let (app, token, heavy, finished) =
                (app.clone(), token.clone(), heavy.clone(), finished.clone());
            pages.push(tokio::spawn(async move {
                let (status, body) = app.post_strict(Some(&token), &heavy).await;
                finished.fetch_add(1, Ordering::SeqCst);
                (status, body)
            }));
        }
    }
    // Once the pages' fields are queued, the backend asks for one field.
    tokio::time::sleep(Duration::from_millis(300)).await;
    let (status, body) = app
        .post_strict(Some(&tenant.key), "{ account { id } }")
        .await;
    assert_eq!(status, StatusCode::OK, "{body}");
    let done_before = finished.load(Ordering::SeqCst);
    for page in pages {
        let (status, body) = page.await.unwrap();
        assert_eq!(status, StatusCode::OK, "{body}");
    }
    assert!(
        done_before <= 4,
        "the backend was answered only after {done_before} of the pages' 16 requests"
    );
}

/// A response stays counted against its owner until the client has read it: a
/// tenant that asks for large responses and never reads them cannot pin more than its
/// slots' worth of memory — its next request waits, then is refused.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_response_holds_its_slot_until_it_is_read() {
    let app = spawn_app_with(Backend::Sqlite, AppOptions::no_workers()).await;
    let tenant = app.funded_tenant("acme", "50").await;
    // About 24 MB of inputs: more than the socket buffers between client and server.
    for index in 0..6 {
        app.create_job_ok(
            &tenant,
            large_job_input(&format!("large-{index}"), 4 * 1024 * 1024),
        )
        .await;
    }
    let body = json!({"query": "{ jobs(first: 10) { edges { node { input } } } }"}).to_string();
    let mut unread = Vec::new();
    for _ in 0..8 {
        let mut socket = TcpStream::connect(app.address).await.unwrap();
        let request = format!(
            "POST /graphql HTTP/1.1\r\nhost: test\r\ncontent-type: application/json\r\nauthorization: Bearer {}\r\ncontent-length: {}\r\n\r\n{body}",
            tenant.key,
            body.len()
        );
        socket.write_all(request.as_bytes()).await.unwrap();
        unread.push(socket);
    }
    let mut refused = None;
    for _ in 0..5 {
        tokio::time::sleep(Duration::from_millis(500)).await;
        let (status, body) = app
            .post_strict(Some(&tenant.key), "{ account { id } }")
            .await;
        if status == StatusCode::TOO_MANY_REQUESTS {
            refused = Some(body);
            break;
        }
    }
    let refused = refused.expect("a ninth request waits for a slot the unread responses hold");
    assert_eq!(error_code(&refused), "TOO_MANY_REQUESTS");
    // Once the clients go away, their slots come back.
    drop(unread);
    let mut served = false;
    for _ in 0..20 {
        tokio::time::sleep(Duration::from_millis(250)).await;
        let (status, _) = app
            .post_strict(Some(&tenant.key), "{ account { id } }")
            .await;
        if status == StatusCode::OK {
            served = true;
            break;
        }
    }
    assert!(served, "the slots came back once the clients left");
}

/// Large bodies (a chunk of a thousand documents is about 16 MiB) take what serving
/// them costs from one budget of the process before they are read, and give it back
/// with their response: three of 16 MiB nearly fill it, so another large one waits
/// and is refused with 503 and a Retry-After, while a small request is served at once;
/// once the three are gone the large one is read. (Each tenant's requests were bounded, the
/// process's not: 24 tenants sending such chunks at once took 737 MiB.)
async fn large_bodies_are_read_within_one_budget_of_the_process(backend: Backend) {
    let app = spawn_app_with(backend, AppOptions::no_workers()).await;
    let senders = [
        app.funded_tenant("a", "5").await,
        app.funded_tenant("b", "5").await,
    ];
    let other = app.funded_tenant("c", "5").await;
    let declared = 16 * 1024 * 1024 - 4096;
    let mut held = Vec::new();
    for index in 0..3 {
        let mut socket = TcpStream::connect(app.address).await.unwrap();
        let head = format!(
            "POST /graphql HTTP/1.1\r\nhost: test\r\ncontent-type: application/json\r\nauthorization: Bearer {}\r\ncontent-length: {declared}\r\n\r\n{{\"query\":",
            senders[index % 2].key
        );
        socket.write_all(head.as_bytes()).await.unwrap();
        held.push(socket);
    }
    tokio::time::sleep(Duration::from_millis(500)).await;
    let small = app.create_job(&other, job_input("small", "hi")).await;
    assert!(small["errors"].is_null(), "{small}");
    let large = json!({
        "query": "query Large($pad: String!) { __typename __type(name: $pad) { name } }",
        "variables": {"pad": "x".repeat(4 * 1024 * 1024)},
    });
    let send = || {
        reqwest::Client::new()
            .post(format!("http://{}/graphql", app.address))
            .bearer_auth(&other.key)
            .json(&large)
            .send()
    };
    let waited = Instant::now();
    let refused = send().await.unwrap();
    assert_eq!(refused.status(), StatusCode::SERVICE_UNAVAILABLE);
    assert!(
        refused.headers().contains_key("retry-after"),
        "{:?}",
        refused.headers()
    );
    assert!(
        waited.elapsed() >= Duration::from_secs(5),
        "refused after {:?}: a large body waits for room first",
        waited.elapsed()
    );
    drop(held);
    tokio::time::sleep(Duration::from_millis(500)).await;
    let read = send().await.unwrap();
    assert_eq!(read.status(), StatusCode::OK);
    let body: Value = read.json().await.unwrap();
    assert_eq!(body["data"]["__typename"], "QueryRoot", "{body}");
}
