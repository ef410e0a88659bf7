//! The public API under hostile or careless clients: documents that cost more than
//! they look (fragment bombs, alias floods, big pages multiplied), responses too
//! large to build, sockets left half open, bodies that are not GraphQL requests, key
//! guessing, and one tenant flooding its own requests. Each scenario was reproduced
//! against the release binary before its fix.

use crate::helpers::{
    ADMIN_TOKEN, AppOptions, Backend, TestApp, error_code, job_input, spawn_app, spawn_app_with,
};
use reqwest::StatusCode;
use serde_json::{Value, json};
use std::net::{IpAddr, Ipv4Addr};
use std::time::{Duration, Instant};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

on_both_backends!(
    fragment_bombs_and_alias_floods_are_refused_before_any_work,
    introspection_and_the_contract_still_pass,
    pages_multiply_complexity,
    responses_past_the_limit_are_replaced_by_an_error,
    half_open_sockets_are_dropped_and_healthz_keeps_answering,
    idle_connections_are_shed_when_too_many_are_open,
    requests_follow_graphql_over_http,
    failed_authentications_are_throttled_per_address,
    each_tenant_has_a_few_requests_in_flight,
);

const GRAPHQL_RESPONSE_JSON: &str = "application/graphql-response+json";

/// `query{...F0} fragment F0 on QueryRoot{...F1 ...F1} … fragment Fn on
/// QueryRoot{__typename}`: 2^n selections in a few hundred bytes.
fn fragment_bomb(levels: usize) -> String {
    let mut query = String::from("query{...F0}");
    for level in 0..levels {
        let next = level + 1;
        query.push_str(&format!(
            " fragment F{level} on QueryRoot{{...F{next} ...F{next}}}"
        ));
    }
    query.push_str(&format!(" fragment F{levels} on QueryRoot{{__typename}}"));
    query
}

/// `{a0:__typename a1:__typename …}`.
fn alias_flood(aliases: usize) -> String {
    let mut query = String::with_capacity(aliases * 20);
    query.push('{');
    for index in 0..aliases {
        query.push_str(&format!("a{index}:__typename "));
    }
    query.push('}');
    query
}

impl TestApp {
    fn url(&self) -> String {
        format!("http://{}/graphql", self.address)
    }

    /// POSTs `query` asking for `application/graphql-response+json`; the status and
    /// the body.
    async fn post_strict(&self, key: Option<&str>, query: &str) -> (StatusCode, Value) {
        let mut request = self
            .http
            .post(self.url())
            .header("accept", GRAPHQL_RESPONSE_JSON)
            .json(&json!({"query": query}));
        if let Some(key) = key {
            request = request.bearer_auth(key);
        }
        let response = request.send().await.unwrap();
        let status = response.status();
        (status, response.json().await.unwrap())
    }
}

/// `/healthz` answers within `limit`, every 20 ms until `until` completes.
async fn healthz_keeps_answering(app: &TestApp, limit: Duration, until: impl Future<Output = ()>) {
    let client = reqwest::Client::new();
    let url = format!("http://{}/healthz", app.address);
    let probes = async {
        loop {
            let response = tokio::time::timeout(limit, client.get(&url).send())
                .await
                .unwrap_or_else(|_| panic!("/healthz did not answer within {limit:?}"))
                .unwrap();
            assert_eq!(response.status(), 200);
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    };
    tokio::select! {
        () = until => {}
        () = probes => {}
    }
}

async fn fragment_bombs_and_alias_floods_are_refused_before_any_work(backend: Backend) {
    let app = spawn_app_with(backend, AppOptions::no_workers()).await;
    let tenant = app.funded_tenant("acme", "5").await;
    let bomb = fragment_bomb(30);
    for key in [None, Some(tenant.key.as_str())] {
        let refused = async {
            let started = Instant::now();
            let (status, body) =
                tokio::time::timeout(Duration::from_secs(1), app.post_strict(key, &bomb))
                    .await
                    .expect("the fragment bomb is answered within 1 s");
            assert!(started.elapsed() < Duration::from_secs(1));
            assert_eq!(status, StatusCode::BAD_REQUEST, "{body}");
            assert_eq!(error_code(&body), "QUERY_TOO_COMPLEX", "{body}");
            assert!(body.get("data").is_none(), "{body}");
        };
        healthz_keeps_answering(&app, Duration::from_secs(1), refused).await;
    }

    // 600,000 aliases (about 12 MB): refused by its size, before it is parsed.
    let flood = alias_flood(600_000);
    let started = Instant::now();
    let (status, body) = app.post_strict(Some(&tenant.key), &flood).await;
    assert!(
        started.elapsed() < Duration::from_secs(3),
        "the flood took {:?}",
        started.elapsed()
    );
    assert_eq!(status, StatusCode::BAD_REQUEST, "{body}");
    assert_eq!(error_code(&body), "QUERY_TOO_COMPLEX", "{body}");
    // Without a key a body past 64 KiB is not even read.
    let (status, body) = app.post_strict(None, &alias_flood(5_000)).await;
    assert_eq!(status, StatusCode::PAYLOAD_TOO_LARGE, "{body}");
    // Fewer aliases than the token budget, still more than an anonymous client may use.
    let (status, body) = app.post_strict(None, &alias_flood(100)).await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "{body}");
    assert_eq!(error_code(&body), "QUERY_TOO_COMPLEX", "{body}");
    let (status, body) = app.post_strict(Some(&tenant.key), &alias_flood(100)).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert_eq!(body["data"]["a99"], "QueryRoot");

    // Under plain JSON the refusal is a GraphQL response like any validation error.
    let refused = app.graphql(Some(&tenant.key), &bomb, json!({})).await;
    assert_eq!(error_code(&refused), "QUERY_TOO_COMPLEX", "{refused}");

    // The schema itself checks the cost, so a subscription over WebSocket is refused
    // the same way.
    let subscription_bomb = fragment_bomb(30)
        .replacen("query{", "subscription{", 1)
        .replace("on QueryRoot", "on SubscriptionRoot");
    let refused = async {
        // An `error` message, or a `next` carrying only errors and then `complete`.
        let errors = match app
            .subscribe(
                &tenant.key,
                &subscription_bomb,
                json!({}),
                Duration::from_secs(1),
            )
            .await
        {
            Err(errors) => errors,
            Ok(payloads) => payloads[0]["errors"].clone(),
        };
        assert_eq!(
            errors[0]["extensions"]["code"], "QUERY_TOO_COMPLEX",
            "{errors}"
        );
    };
    healthz_keeps_answering(&app, Duration::from_secs(1), refused).await;
}

/// graphql-js's `getIntrospectionQuery` with every option GraphiQL turns on.
const INTROSPECTION_QUERY: &str = r#"
query IntrospectionQuery {
  __schema {
    description
    queryType { name kind }
    mutationType { name kind }
    subscriptionType { name kind }
    types { ...FullType }
    directives {
      name
      description
      isRepeatable
      locations
      args(includeDeprecated: true) { ...InputValue }
    }
  }
}
fragment FullType on __Type {
  kind
  name
  description
  specifiedByURL
  isOneOf
  fields(includeDeprecated: true) {
    name
    description
    args(includeDeprecated: true) { ...InputValue }
    type { ...TypeRef }
    isDeprecated
    deprecationReason
  }
  inputFields(includeDeprecated: true) { ...InputValue }
  interfaces { ...TypeRef }
  enumValues(includeDeprecated: true) { name description isDeprecated deprecationReason }
  possibleTypes { ...TypeRef }
}
fragment InputValue on __InputValue {
  name
  description
  type { ...TypeRef }
  defaultValue
  isDeprecated
  deprecationReason
}
fragment TypeRef on __Type {
  kind
  name
  ofType { kind name ofType { kind name ofType { kind name ofType { kind name
    ofType { kind name ofType { kind name ofType { kind name ofType { kind name
    ofType { kind name ofType { kind name } } } } } } } } } }
}
"#;

async fn introspection_and_the_contract_still_pass(backend: Backend) {
    let app = spawn_app_with(backend, AppOptions::no_workers()).await;
    let tenant = app.funded_tenant("acme", "5").await;
    for key in [Some(tenant.key.as_str()), Some(ADMIN_TOKEN), None] {
        let (status, body) = app.post_strict(key, INTROSPECTION_QUERY).await;
        assert_eq!(status, StatusCode::OK, "{body}");
        assert!(body["errors"].is_null(), "{body}");
        assert_eq!(body["data"]["__schema"]["queryType"]["name"], "QueryRoot");
    }
    // The dashboards' pages at their largest, and a job with every field.
    let job = app.create_job_ok(&tenant, job_input("k", "hello")).await;
    let operations = [
        ("Jobs", json!({"first": 100})),
        ("JobCosts", json!({"first": 100})),
        ("CreditLedger", json!({"first": 100})),
        ("Job", json!({"id": job})),
        ("Account", json!({})),
    ];
    for (name, variables) in operations {
        let response = app.operation(Some(&tenant.key), name, variables).await;
        assert!(response["errors"].is_null(), "{name}: {response}");
    }
}

async fn pages_multiply_complexity(backend: Backend) {
    let app = spawn_app_with(backend, AppOptions::no_workers()).await;
    let tenant = app.funded_tenant("acme", "5").await;
    let aliased = |count: usize| {
        let fields: String = (0..count)
            .map(|index| {
                format!("a{index}: jobs(first: 100) {{ edges {{ node {{ id input }} }} }} ")
            })
            .collect();
        format!("{{ {fields} }}")
    };
    // Each alias may return 100 inputs: 50 of them are 5,000 jobs' inputs.
    let (status, body) = app.post_strict(Some(&tenant.key), &aliased(50)).await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "{body}");
    assert!(
        body["errors"][0]["message"]
            .as_str()
            .is_some_and(|message| message.contains("too complex")),
        "{body}"
    );
    let (status, body) = app.post_strict(Some(&tenant.key), &aliased(3)).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    let (status, body) = app.post_strict(Some(&tenant.key), &aliased(4)).await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "{body}");
    // A job's attempts and events count as lists too: one page of 100 jobs with their
    // timelines fits, two do not.
    let timelines = "jobs(first: 100) { edges { node { events { seq kind status at data } attempts { id number outcome errorCode errorMessage provider } } } }";
    let (status, body) = app
        .post_strict(Some(&tenant.key), &format!("{{ {timelines} }}"))
        .await;
    assert_eq!(status, StatusCode::OK, "{body}");
    let (status, body) = app
        .post_strict(
            Some(&tenant.key),
            &format!("{{ a: {timelines} b: {timelines} }}"),
        )
        .await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "{body}");
}

async fn responses_past_the_limit_are_replaced_by_an_error(backend: Backend) {
    let app = spawn_app_with(backend, AppOptions::no_workers()).await;
    let tenant = app.funded_tenant("acme", "1000").await;
    // Nine inputs of 4 MiB: together past the 32 MiB response limit.
    let content = "a".repeat(4 * 1024 * 1024);
    for index in 0..9 {
        app.create_job_ok(&tenant, job_input(&format!("big-{index}"), &content))
            .await;
    }
    let query = "{ jobs(first: 20) { edges { node { id input } } } }";
    for strict in [true, false] {
        let mut request = app
            .http
            .post(app.url())
            .bearer_auth(&tenant.key)
            .json(&json!({"query": query}));
        if strict {
            request = request.header("accept", GRAPHQL_RESPONSE_JSON);
        }
        let response = request.send().await.unwrap();
        assert_eq!(response.status(), StatusCode::OK);
        let body = response.bytes().await.unwrap();
        assert!(body.len() < 4096, "{} bytes were sent", body.len());
        let body: Value = serde_json::from_slice(&body).unwrap();
        assert_eq!(error_code(&body), "RESPONSE_TOO_LARGE", "{body}");
        assert!(body["data"].is_null(), "{body}");
    }
    // Fewer of them fit.
    let (status, body) = app
        .post_strict(
            Some(&tenant.key),
            "{ jobs(first: 5) { edges { node { input } } } }",
        )
        .await;
    assert_eq!(status, StatusCode::OK);
    assert!(body["errors"].is_null());
    assert_eq!(body["data"]["jobs"]["edges"].as_array().unwrap().len(), 5);
}

async fn half_open_sockets_are_dropped_and_healthz_keeps_answering(backend: Backend) {
    let app = spawn_app_with(backend, AppOptions::no_workers()).await;
    // Many clients that each send half a request line and then nothing.
    let mut sockets = Vec::new();
    for _ in 0..200 {
        let mut socket = TcpStream::connect(app.address).await.unwrap();
        socket.write_all(b"POST /gra").await.unwrap();
        sockets.push(socket);
    }
    let started = Instant::now();
    let dropped = async {
        for socket in &mut sockets {
            let mut buffer = [0_u8; 1024];
            // The server closes without answering (or answers 408 and closes); either
            // way the socket reaches its end.
            loop {
                match socket.read(&mut buffer).await {
                    Ok(0) | Err(_) => break,
                    Ok(_) => {}
                }
            }
        }
    };
    healthz_keeps_answering(&app, Duration::from_secs(5), async {
        tokio::time::timeout(Duration::from_secs(15), dropped)
            .await
            .expect("every half-open socket is dropped within 15 s");
    })
    .await;
    assert!(started.elapsed() < Duration::from_secs(15));
}

async fn idle_connections_are_shed_when_too_many_are_open(backend: Backend) {
    let app = spawn_app_with(backend, AppOptions::no_workers()).await;
    // More idle sockets than the server keeps while it sheds load (512): past that,
    // idle ones are closed after a second of silence, long before the 10 s header
    // timeout would close them.
    let sockets: Vec<TcpStream> = futures_util::future::join_all((0..600).map(|_| async {
        let mut socket = TcpStream::connect(app.address).await.unwrap();
        socket.write_all(b"GET /heal").await.unwrap();
        socket
    }))
    .await;
    // The point is that the server keeps answering at all (no descriptor or accept
    // starvation), not how fast on a machine the rest of the suite shares: the bound
    // is generous.
    healthz_keeps_answering(
        &app,
        Duration::from_secs(5),
        tokio::time::sleep(Duration::from_secs(4)),
    )
    .await;
    let closed = sockets
        .iter()
        .filter(|socket| {
            let mut buffer = [0_u8; 1024];
            !matches!(socket.try_read(&mut buffer), Err(error) if error.kind() == std::io::ErrorKind::WouldBlock)
        })
        .count();
    assert!(
        closed >= 600 - 512,
        "only {closed} of 600 idle sockets were closed within 4 s"
    );
}

async fn requests_follow_graphql_over_http(backend: Backend) {
    let app = spawn_app_with(backend, AppOptions::no_workers()).await;
    let tenant = app.funded_tenant("acme", "5").await;
    let body = json!({"query": "{ __typename }"}).to_string();

    // Only JSON bodies; no Content-Type at all is refused too.
    for content_type in [
        Some("text/plain"),
        Some("application/x-www-form-urlencoded"),
        Some("application/json; charset=latin1"),
        None,
    ] {
        let mut request = app.http.post(app.url()).body(body.clone());
        if let Some(content_type) = content_type {
            request = request.header("content-type", content_type);
        }
        let response = request.send().await.unwrap();
        assert_eq!(
            response.status(),
            StatusCode::UNSUPPORTED_MEDIA_TYPE,
            "{content_type:?}"
        );
    }
    for content_type in ["application/json; charset=utf-8", GRAPHQL_RESPONSE_JSON] {
        let response = app
            .http
            .post(app.url())
            .header("content-type", content_type)
            .body(body.clone())
            .send()
            .await
            .unwrap();
        assert_eq!(response.status(), StatusCode::OK, "{content_type}");
        assert_eq!(
            response.headers()["content-type"],
            "application/json; charset=utf-8"
        );
    }
    // A batch, or any JSON that is not an object, is not a request.
    for body in [
        "[]",
        "[{\"query\": \"{ __typename }\"}]",
        "\"{ __typename }\"",
        "{}",
    ] {
        let response = app
            .http
            .post(app.url())
            .header("content-type", "application/json")
            .body(body)
            .send()
            .await
            .unwrap();
        assert_eq!(response.status(), StatusCode::BAD_REQUEST, "{body}");
    }

    // A field error that leaves `data` null is still an executed request: 200.
    let (status, body) = app.post_strict(None, "{ account { id } }").await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert!(body["data"].is_null(), "{body}");
    assert_eq!(error_code(&body), "UNAUTHENTICATED");
    // A document that fails validation was never executed: 400.
    let (status, body) = app.post_strict(None, "{ noSuchField }").await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "{body}");
    let (status, body) = app.post_strict(None, "{ __typename ").await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "{body}");

    // GET runs the operation it names, and refuses a named mutation.
    let document = "query Read { __typename } mutation Write { cancelJob(id: \"0193b5c0-0000-7000-8000-000000000000\") { id } }";
    let get = |operation: &'static str| {
        app.http
            .get(app.url())
            .bearer_auth(&tenant.key)
            .query(&[("query", document), ("operationName", operation)])
            .send()
    };
    let read = get("Read").await.unwrap();
    assert_eq!(read.status(), StatusCode::OK);
    let read: Value = read.json().await.unwrap();
    assert_eq!(read["data"]["__typename"], "QueryRoot", "{read}");
    let write = get("Write").await.unwrap();
    assert_eq!(write.status(), StatusCode::METHOD_NOT_ALLOWED);
    assert_eq!(write.headers()["allow"], "POST");

    // A credential that cannot be a key is refused, never taken as anonymous.
    for credential in [
        reqwest::header::HeaderValue::from_bytes(b"Bearer \xff\xfe").unwrap(),
        reqwest::header::HeaderValue::from_static("Basic dXNlcjpwYXNz"),
        reqwest::header::HeaderValue::from_static("Bearer"),
    ] {
        let response = app
            .http
            .post(app.url())
            .header("authorization", credential.clone())
            .json(&json!({"query": "{ __typename }"}))
            .send()
            .await
            .unwrap();
        assert_eq!(
            response.status(),
            StatusCode::UNAUTHORIZED,
            "{credential:?}"
        );
        let body: Value = response.json().await.unwrap();
        assert_eq!(error_code(&body), "UNAUTHENTICATED");
    }
}

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

/// `tests/blackbox` with its dependencies installed; fails when Node.js is missing.
/// Installed once per test run: two `npm ci` at once in one folder would trip over
/// each other (the console's browser test uses it too).
pub(crate) async fn blackbox_folder() -> std::path::PathBuf {
    static INSTALLED: tokio::sync::OnceCell<std::path::PathBuf> =
        tokio::sync::OnceCell::const_new();
    INSTALLED.get_or_init(install_blackbox).await.clone()
}

async fn install_blackbox() -> std::path::PathBuf {
    let blackbox = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/blackbox");
    match std::process::Command::new("node").arg("--version").output() {
        Ok(output) if output.status.success() => {}
        other => panic!(
            "`node` is not on PATH ({other:?}): the black-box clients cannot run; install Node.js 20 or later"
        ),
    }
    let installed = [
        "graphql-http",
        "graphql-ws",
        "graphql-sse",
        "ws",
        "graphql",
        "playwright-core",
        "axe-core",
    ]
    .iter()
    .all(|package| blackbox.join("node_modules").join(package).exists());
    if !installed {
        let installed = tokio::process::Command::new("npm")
            .args(["ci", "--no-audit", "--no-fund", "--prefix"])
            .arg(&blackbox)
            .status()
            .await
            .expect("npm runs");
        assert!(installed.success(), "npm ci --prefix tests/blackbox failed");
    }
    blackbox
}

/// The graphql-http audit suite, the specification's own checks, run by Node.js as a
/// real client against the served API (`tests/blackbox/audit.mjs`); any MUST audit
/// that fails fails this test. Node.js is required: without it this test fails.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_graphql_over_http_audit_suite_passes() {
    let blackbox = blackbox_folder().await;
    let app = spawn_app_with(Backend::Sqlite, AppOptions::no_workers()).await;
    let output = tokio::time::timeout(
        Duration::from_secs(120),
        tokio::process::Command::new("node")
            .arg(blackbox.join("audit.mjs"))
            .arg(app.url())
            .output(),
    )
    .await
    .expect("the audits finish within 2 minutes")
    .expect("node runs");
    let report = String::from_utf8_lossy(&output.stdout);
    assert!(
        output.status.success(),
        "graphql-http audits failed:\n{report}\n{}",
        String::from_utf8_lossy(&output.stderr)
    );
    assert!(report.contains("0 MUST audit(s) failed"), "{report}");
}

/// The reference clients of both live protocols (graphql-ws over WebSocket,
/// graphql-sse over Server-Sent Events), run by Node.js as a frontend would run them
/// (`tests/blackbox/clients.mjs`): each follows a job from `CREATED` to `SUCCEEDED`,
/// and a key that is not valid is closed with 4403.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_graphql_ws_and_graphql_sse_clients_follow_a_job() {
    let blackbox = blackbox_folder().await;
    let app = spawn_app(Backend::Sqlite).await;
    let tenant = app.funded_tenant("acme", "5").await;
    let id = app
        .create_job_ok(&tenant, job_input("clients", "hello [mock:delay_ms=300]"))
        .await;
    let output = tokio::time::timeout(
        Duration::from_secs(120),
        tokio::process::Command::new("node")
            .arg(blackbox.join("clients.mjs"))
            .arg(format!("http://{}", app.address))
            .arg(&tenant.key)
            .arg(id.to_string())
            .output(),
    )
    .await
    .expect("the clients finish within 2 minutes")
    .expect("node runs");
    let report = String::from_utf8_lossy(&output.stdout);
    assert!(
        output.status.success(),
        "the reference clients failed:\n{report}\n{}",
        String::from_utf8_lossy(&output.stderr)
    );
    assert!(report.contains("0 client check(s) failed"), "{report}");
}

/// A body is bounded by who sends it, in bytes and in JSON values counted before it is
/// parsed: 15 MiB of tiny objects cost about 60 times that once parsed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bodies_are_bounded_before_they_are_parsed() {
    let app = spawn_app_with(Backend::Sqlite, AppOptions::no_workers()).await;
    let tenant = app.funded_tenant("acme", "5").await;
    let flood = |count: usize| {
        let items = vec![r#"{"a":1}"#; count].join(",");
        format!(r#"{{"query":"{{ __typename }}","variables":{{"v":[{items}]}}}}"#)
    };
    for path in ["/graphql", "/graphql/sse"] {
        let anonymous = app
            .http
            .post(format!("http://{}{path}", app.address))
            .header("content-type", "application/json")
            .body(flood(20_000))
            .send()
            .await
            .unwrap();
        assert_eq!(anonymous.status(), 413, "{path}: anonymous, 160 KB");
        let keyed = app
            .http
            .post(format!("http://{}{path}", app.address))
            .header("content-type", "application/json")
            .bearer_auth(&tenant.key)
            .body(flood(100_000))
            .send()
            .await
            .unwrap();
        assert_eq!(keyed.status(), 413, "{path}: 300,000 values");
    }
    // A large text is one value: a job's input of megabytes still passes.
    let id = app
        .create_job_ok(&tenant, job_input("big", &"x".repeat(3 * 1024 * 1024)))
        .await;
    assert!(!id.is_nil());
}

/// An aggregate report weighs enough that a few fill a request: aliasing dozens of
/// them at once would hold the database for every tenant.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn aggregate_reports_fill_a_request_quickly() {
    let app = spawn_app_with(Backend::Sqlite, AppOptions::no_workers()).await;
    let tenant = app.funded_tenant("acme", "5").await;
    let reports = |count: usize| {
        let mut query = String::from("{");
        for index in 0..count {
            query.push_str(&format!(
                " r{index}: billingSummary(from: \"2026-01-01T00:00:00Z\", to: \"2027-01-01T00:00:00Z\") {{ jobsCreated }}"
            ));
        }
        query.push('}');
        query
    };
    let few = app.graphql(Some(&tenant.key), &reports(4), json!({})).await;
    assert!(few["errors"].is_null(), "{few}");
    let many = app
        .graphql(Some(&tenant.key), &reports(20), json!({}))
        .await;
    assert!(
        many["errors"][0]["message"]
            .as_str()
            .is_some_and(|message| message.contains("too complex")),
        "{many}"
    );
}

/// One tenant's many requests of many top-level fields run a few fields at a time in
/// the database, leaving the rest of the pool to other tenants: counted as the most
/// statements of that tenant running at once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_tenant_runs_a_few_top_level_fields_at_once() {
    use jobledger::accounts::Principal;
    use jobledger::graphql::build_schema;
    use jobledger::startup::App;
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
            job_input(&format!("large-{index}"), &"x".repeat(4 * 1024 * 1024 - 64)),
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
