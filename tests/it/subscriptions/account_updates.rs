//! `accountJobUpdates` carries every event of a tenant's jobs once, across processes.

use super::{account_updates, message_for};
use crate::helpers::{AppOptions, Backend, job_input, spawn_app};
use crate::socket::GraphqlSocket;
use serde_json::json;
use std::time::Duration;

on_both_backends!(account_updates_carry_every_event_of_the_tenant_once_across_processes,);

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
