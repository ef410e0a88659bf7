//! `jobUpdates` over WebSocket replays from a sequence number, then streams live
//! events, completing after the terminal one.

use super::{LIMIT, seqs_and_kinds};
use crate::contract::operation;
use crate::helpers::{Backend, job_input, spawn_app};
use serde_json::json;

on_both_backends!(
    a_subscription_replays_after_a_seq_and_completes,
    a_subscription_streams_live_events_until_the_end,
);

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
