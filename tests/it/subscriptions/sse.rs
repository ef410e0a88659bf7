//! Subscriptions over Server-Sent Events (`/graphql/sse`).

use super::{seqs_and_kinds, sse_events};
use crate::contract::operation;
use crate::helpers::{Backend, job_input, spawn_app};
use serde_json::{Value, json};

on_both_backends!(
    a_subscription_over_sse_replays_then_streams_until_the_end,
    sse_reports_request_errors_as_events_and_refuses_bad_keys,
);

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

    let with_a_bad_key = || {
        app.http
            .post(format!("http://{}/graphql/sse", app.address))
            .bearer_auth("jl_not-a-key")
            .json(&json!({"query": "{ account { id } }"}))
            .send()
    };
    let refused = with_a_bad_key().await.unwrap();
    assert_eq!(refused.status(), 401);
    // An address that keeps presenting bad keys is turned away, as on /graphql.
    let mut statuses = Vec::new();
    for _ in 0..10 {
        let response = with_a_bad_key().await.unwrap();
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
