//! `accountJobUpdates(after:)` resumes from a cursor: the stored events it had not
//! seen, across processes and pages, then live ones, each once.

use super::message_for;
use crate::contract::operation;
use crate::helpers::{AppOptions, Backend, TestApp, TestTenant, job_input, spawn_app};
use crate::socket::GraphqlSocket;
use entity::{EventKind, JobStatus, job_events};
use sea_orm::{ColumnTrait, EntityTrait, QueryFilter, QueryOrder};
use serde_json::{Value, json};
use std::collections::HashMap;
use std::time::Duration;
use uuid::Uuid;

on_both_backends!(
    a_resumed_stream_delivers_what_it_missed_once_then_live_events,
    a_cursor_of_another_tenant_or_none_is_refused,
);

/// `(job, seq)` of each event streamed, and the cursor of the last.
type Streamed = (Vec<(Uuid, i64)>, String);

async fn open(app: &TestApp, tenant: &TestTenant, after: Option<&str>) -> GraphqlSocket {
    let mut socket = GraphqlSocket::connect(app.address).await;
    socket.init_ok(&tenant.key).await;
    socket
        .subscribe(
            "s",
            &operation("AccountJobUpdatesFrom"),
            json!({"after": after}),
        )
        .await;
    // The subscription is live once the server has it; give it a moment.
    tokio::time::sleep(Duration::from_millis(200)).await;
    socket
}

/// Events until `done` says the last one received is enough.
async fn receive(socket: &mut GraphqlSocket, mut done: impl FnMut(&Value) -> bool) -> Streamed {
    let mut events = Vec::new();
    loop {
        let message = message_for(socket, "s").await;
        assert!(message["payload"]["errors"].is_null(), "{message}");
        let event = &message["payload"]["data"]["accountJobUpdates"];
        events.push((
            event["jobId"].as_str().unwrap().parse().unwrap(),
            event["seq"].as_i64().unwrap(),
        ));
        if done(event) {
            return (events, event["cursor"].as_str().unwrap().to_owned());
        }
    }
}

fn terminal(event: &Value) -> bool {
    ["SUCCEEDED", "FAILED", "CANCELLED"].contains(&event["kind"].as_str().unwrap())
}

/// Every stored `(job, seq)` of the tenant, grouped by job.
async fn stored(app: &TestApp, tenant: &TestTenant) -> HashMap<Uuid, Vec<i64>> {
    let db = jobledger::db::connect(&app.database_url()).await.unwrap();
    let mut jobs: HashMap<Uuid, Vec<i64>> = HashMap::new();
    for event in job_events::Entity::find()
        .filter(job_events::Column::TenantId.eq(tenant.id))
        .order_by_asc(job_events::Column::Seq)
        .all(&db)
        .await
        .unwrap()
    {
        jobs.entry(event.job_id).or_default().push(event.seq.into());
    }
    jobs
}

fn by_job(events: &[(Uuid, i64)]) -> HashMap<Uuid, Vec<i64>> {
    let mut jobs: HashMap<Uuid, Vec<i64>> = HashMap::new();
    for (job, seq) in events {
        jobs.entry(*job).or_default().push(*seq);
    }
    jobs
}

async fn a_resumed_stream_delivers_what_it_missed_once_then_live_events(backend: Backend) {
    // Jobs run in one process; the subscriber listens to another, which runs none.
    let worker = spawn_app(backend).await;
    let api = worker.another_process(AppOptions::no_workers()).await;
    let acme = worker.funded_tenant("acme", "5").await;
    let limit = Duration::from_secs(20);

    let mut socket = open(&api, &acme, None).await;
    let first = worker
        .create_job_ok(&acme, job_input("first", "hello"))
        .await;
    let (before, cursor) = receive(&mut socket, terminal).await;
    drop(socket);

    // Missed while disconnected: jobs run by the other process, and an event that a
    // slow writer stamped before the cursor's last event but committed only now (a
    // cursor meaning "after this instant" would skip it).
    let mut missed = Vec::new();
    for n in 0..2 {
        let job = worker
            .create_job_ok(&acme, job_input(&format!("missed-{n}"), "hello"))
            .await;
        worker.wait_until_finished(&acme, job, limit).await;
        missed.push(job);
    }
    let db = jobledger::db::connect(&worker.database_url())
        .await
        .unwrap();
    // Stamped at the job's creation, after the stream began (it owes nothing older).
    let created_at = job_events::Entity::find()
        .filter(job_events::Column::JobId.eq(first))
        .order_by_asc(job_events::Column::Seq)
        .one(&db)
        .await
        .unwrap()
        .unwrap()
        .at;
    // More than one page of them, so that the catch-up pages.
    let late: Vec<job_events::ActiveModel> = (1..=600)
        .map(|n| {
            job_events::Model {
                job_id: first,
                seq: before.len() as i32 + n,
                tenant_id: acme.id,
                kind: EventKind::Created,
                status: JobStatus::Succeeded,
                at: created_at,
                data: None,
            }
            .into()
        })
        .collect();
    for some in late.chunks(100) {
        job_events::Entity::insert_many(some.to_vec())
            .exec(&db)
            .await
            .unwrap();
    }

    // Long enough for every notice of them to have gone by, and for them to be out of
    // reach of a live stream's re-read (a stream that did not catch up would miss them).
    tokio::time::sleep(Duration::from_secs(3)).await;
    let mut owed = stored(&worker, &acme).await;
    owed.get_mut(&first).unwrap().drain(..before.len());
    let owed_count: usize = owed.values().map(Vec::len).sum();

    let mut socket = open(&api, &acme, Some(&cursor)).await;
    let mut count = 0;
    let (mut after, _) = receive(&mut socket, |_| {
        count += 1;
        count == owed_count
    })
    .await;
    assert_eq!(
        by_job(&after),
        owed,
        "every missed event once, in order per job"
    );

    // Then live, with no gap at the hand-over.
    let live = worker
        .create_job_ok(&acme, job_input("live", "hello"))
        .await;
    let (mut live_events, _) = receive(&mut socket, terminal).await;
    after.append(&mut live_events);
    assert!(
        socket
            .next_within(Duration::from_millis(1_500))
            .await
            .is_none(),
        "nothing after the last terminal event"
    );

    let mut expected = stored(&worker, &acme).await;
    expected.get_mut(&first).unwrap().drain(..before.len());
    assert!(expected.contains_key(&live));
    assert_eq!(
        by_job(&after),
        expected,
        "then live events, with no gap or repeat"
    );
}

async fn a_cursor_of_another_tenant_or_none_is_refused(backend: Backend) {
    let app = spawn_app(backend).await;
    let acme = app.funded_tenant("acme", "5").await;
    let other = app.funded_tenant("other", "5").await;
    let mut socket = open(&app, &other, None).await;
    app.create_job_ok(&other, job_input("theirs", "hello"))
        .await;
    let (_, theirs) = receive(&mut socket, terminal).await;
    for after in ["not a cursor", theirs.as_str()] {
        let refused = app
            .subscribe(
                &acme.key,
                &operation("AccountJobUpdatesFrom"),
                json!({"after": after}),
                Duration::from_secs(10),
            )
            .await;
        let errors = match refused {
            Ok(payloads) => payloads[0]["errors"].clone(),
            Err(errors) => errors,
        };
        assert_eq!(errors[0]["extensions"]["code"], "VALIDATION", "{errors}");
    }
}
