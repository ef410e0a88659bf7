//! Documents that cost more than they look: fragment bombs, alias floods, pages
//! multiplied, aggregates aliased, responses too large to build — and the
//! introspection and contract operations that must still pass.

use super::{GRAPHQL_RESPONSE_JSON, healthz_keeps_answering};
use crate::helpers::{
    ADMIN_TOKEN, AppOptions, Backend, error_code, job_input, large_job_input, spawn_app_with,
};
use reqwest::StatusCode;
use serde_json::{Value, json};
use std::time::{Duration, Instant};

on_both_backends!(
    fragment_bombs_and_alias_floods_are_refused_before_any_work,
    introspection_and_the_contract_still_pass,
    pages_multiply_complexity,
    responses_past_the_limit_are_replaced_by_an_error,
);

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
    for index in 0..9 {
        app.create_job_ok(
            &tenant,
            large_job_input(&format!("big-{index}"), 4 * 1024 * 1024),
        )
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
