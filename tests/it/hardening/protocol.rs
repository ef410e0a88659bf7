//! Bodies that are not GraphQL requests: the GraphQL-over-HTTP rules, and bodies
//! bounded before they are parsed.

use super::GRAPHQL_RESPONSE_JSON;
use crate::helpers::{AppOptions, Backend, error_code, large_job_input, spawn_app_with};
use reqwest::StatusCode;
use serde_json::{Value, json};

on_both_backends!(requests_follow_graphql_over_http);

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
    // A large string is one value: a job's input of megabytes still passes.
    let id = app
        .create_job_ok(&tenant, large_job_input("big", 3 * 1024 * 1024))
        .await;
    assert!(!id.is_nil());
}
