//! Labels on jobs (`createJob`'s `labels`, `Job.labels`, `jobs(label:)`) and finding a
//! job by its idempotency key (`job(idempotencyKey:)`).

use crate::helpers::{
    AppOptions, Backend, TestApp, TestTenant, error_code, job_input, spawn_app_with,
};
use crate::invariants::assert_billing_invariants;
use entity::{job_labels, jobs};
use sea_orm::{EntityTrait, PaginatorTrait};
use serde_json::{Value, json};
use uuid::Uuid;

on_both_backends!(
    bad_labels_are_refused_and_write_nothing,
    a_jobs_labels_come_back_in_order_of_key_and_count_in_its_replay,
    jobs_are_found_by_label_page_by_page_and_only_the_tenants_own,
    a_job_is_found_by_its_idempotency_key_and_only_by_its_tenant,
);

/// A job input with `labels`.
fn labelled(key: &str, labels: Value) -> Value {
    let mut input = job_input(key, "Summarise the document.");
    input["labels"] = labels;
    input
}

async fn labels_of(app: &TestApp, tenant: &TestTenant, id: Uuid) -> Value {
    let response = app
        .graphql(
            Some(&tenant.key),
            "query($id: UUID!) { job(id: $id) { labels { key value } } }",
            json!({"id": id}),
        )
        .await;
    assert!(response["errors"].is_null(), "{response}");
    response["data"]["job"]["labels"].clone()
}

async fn bad_labels_are_refused_and_write_nothing(backend: Backend) {
    let app = spawn_app_with(backend, AppOptions::no_workers()).await;
    let tenant = app.funded_tenant("acme", "5").await;
    let long = "x".repeat(129);
    let seventeen: Vec<Value> = (0..17)
        .map(|n| json!({"key": format!("k{n}"), "value": "v"}))
        .collect();
    let cases = [
        (json!(seventeen), "at most 16"),
        (json!([{"key": "", "value": "v"}]), "1 to 128"),
        (json!([{"key": "doc", "value": ""}]), "1 to 128"),
        (json!([{"key": long, "value": "v"}]), "1 to 128"),
        (json!([{"key": "doc", "value": long}]), "1 to 128"),
        (json!([{"key": "doc\u{0}", "value": "v"}]), "control"),
        (json!([{"key": "doc", "value": "a\tb"}]), "control"),
        (json!([{"key": "doc", "value": "d\u{200B}1"}]), "invisible"),
        (json!([{"key": "doc\u{202E}", "value": "d1"}]), "invisible"),
        (
            json!([{"key": "doc", "value": "d1"}, {"key": "doc", "value": "d2"}]),
            "more than once",
        ),
    ];
    for (index, (labels, reason)) in cases.into_iter().enumerate() {
        let response = app
            .create_job(&tenant, labelled(&format!("bad-{index}"), labels.clone()))
            .await;
        assert_eq!(error_code(&response), "VALIDATION", "{labels}: {response}");
        let message = response["errors"][0]["message"].as_str().unwrap();
        assert!(message.contains(reason), "{message:?} should say {reason}");
    }
    // Sixteen labels of 128 characters each are accepted.
    let longest = "y".repeat(128);
    let sixteen: Vec<Value> = (0..16)
        .map(|n| json!({"key": format!("{n:0>128}"), "value": longest}))
        .collect();
    let id = app
        .create_job_ok(&tenant, labelled("sixteen", json!(sixteen)))
        .await;
    assert_eq!(
        labels_of(&app, &tenant, id).await.as_array().unwrap().len(),
        16
    );
    let db = &app.app.db;
    assert_eq!(jobs::Entity::find().count(db).await.unwrap(), 1);
    assert_eq!(job_labels::Entity::find().count(db).await.unwrap(), 16);
    assert_billing_invariants(db).await;
}

async fn a_jobs_labels_come_back_in_order_of_key_and_count_in_its_replay(backend: Backend) {
    let app = spawn_app_with(backend, AppOptions::no_workers()).await;
    let tenant = app.funded_tenant("acme", "5").await;
    let labels = json!([
        {"key": "user", "value": "u-7"},
        {"key": "doc", "value": "report.pdf"},
        {"key": "upload", "value": "2026-12-01"},
    ]);
    let id = app.create_job_ok(&tenant, labelled("job-1", labels)).await;
    assert_eq!(
        labels_of(&app, &tenant, id).await,
        json!([
            {"key": "doc", "value": "report.pdf"},
            {"key": "upload", "value": "2026-12-01"},
            {"key": "user", "value": "u-7"},
        ])
    );
    // The same labels in another order are the same request; other labels are not.
    let reordered = json!([
        {"key": "upload", "value": "2026-12-01"},
        {"key": "user", "value": "u-7"},
        {"key": "doc", "value": "report.pdf"},
    ]);
    let replay = app.create_job(&tenant, labelled("job-1", reordered)).await;
    assert_eq!(replay["data"]["createJob"]["replayed"], true, "{replay}");
    assert_eq!(replay["data"]["createJob"]["job"]["id"], id.to_string());
    let changed = json!([{"key": "doc", "value": "other.pdf"}]);
    let conflict = app.create_job(&tenant, labelled("job-1", changed)).await;
    assert_eq!(error_code(&conflict), "IDEMPOTENCY_CONFLICT", "{conflict}");
    // A job created without labels has none.
    let plain = app
        .create_job_ok(&tenant, job_input("job-2", "No labels here."))
        .await;
    assert_eq!(labels_of(&app, &tenant, plain).await, json!([]));
    let db = &app.app.db;
    assert_eq!(job_labels::Entity::find().count(db).await.unwrap(), 3);
    assert_billing_invariants(db).await;
}

async fn jobs_are_found_by_label_page_by_page_and_only_the_tenants_own(backend: Backend) {
    let app = spawn_app_with(backend, AppOptions::no_workers()).await;
    let acme = app.funded_tenant("acme", "5").await;
    let globex = app.funded_tenant("globex", "5").await;
    let doc = |value: &str| json!([{"key": "doc", "value": value}, {"key": "user", "value": "u1"}]);
    let mut wanted = Vec::new();
    for n in 0..5 {
        let id = app
            .create_job_ok(&acme, labelled(&format!("d1-{n}"), doc("d1")))
            .await;
        wanted.push(id.to_string());
        // Interleaved: jobs of another value, of no label, and another tenant's jobs
        // with the very same label.
        app.create_job_ok(&acme, labelled(&format!("d2-{n}"), doc("d2")))
            .await;
        app.create_job_ok(&acme, job_input(&format!("plain-{n}"), "No labels."))
            .await;
        app.create_job_ok(&globex, labelled(&format!("d1-{n}"), doc("d1")))
            .await;
    }
    wanted.reverse();

    let mut seen = Vec::new();
    let mut after: Option<String> = None;
    let mut pages = 0;
    loop {
        let response = app
            .operation(
                Some(&acme.key),
                "JobsByLabel",
                json!({"key": "doc", "value": "d1", "first": 2, "after": after}),
            )
            .await;
        assert!(response["errors"].is_null(), "{response}");
        let page = &response["data"]["jobs"];
        pages += 1;
        for edge in page["edges"].as_array().unwrap() {
            assert_eq!(edge["cursor"], edge["node"]["id"]);
            assert_eq!(
                edge["node"]["labels"],
                json!([{"key": "doc", "value": "d1"}, {"key": "user", "value": "u1"}])
            );
            seen.push(edge["node"]["id"].as_str().unwrap().to_owned());
        }
        if page["pageInfo"]["hasNextPage"] == false {
            break;
        }
        after = Some(page["pageInfo"]["endCursor"].as_str().unwrap().to_owned());
    }
    assert_eq!(pages, 3, "5 jobs at 2 a page");
    assert_eq!(seen, wanted, "acme's d1 jobs, newest first, each once");

    // The label and a status narrow together; another tenant sees only its own.
    let queued = app
        .graphql(
            Some(&acme.key),
            r#"{ jobs(label: {key: "user", value: "u1"}, status: QUEUED, first: 100) { edges { node { id } } } }"#,
            json!({}),
        )
        .await;
    assert_eq!(
        queued["data"]["jobs"]["edges"].as_array().unwrap().len(),
        10,
        "{queued}"
    );
    let theirs = app
        .operation(
            Some(&globex.key),
            "JobsByLabel",
            json!({"key": "doc", "value": "d1", "first": 100}),
        )
        .await;
    let theirs = theirs["data"]["jobs"]["edges"].as_array().unwrap().clone();
    assert_eq!(theirs.len(), 5);
    assert!(
        theirs
            .iter()
            .all(|edge| !wanted.contains(&edge["node"]["id"].as_str().unwrap().to_owned()))
    );
    let none = app
        .operation(
            Some(&acme.key),
            "JobsByLabel",
            json!({"key": "doc", "value": "d3"}),
        )
        .await;
    assert_eq!(none["data"]["jobs"]["edges"], json!([]), "{none}");
    assert_eq!(none["data"]["jobs"]["pageInfo"]["hasNextPage"], false);
    let bad = app
        .operation(
            Some(&acme.key),
            "JobsByLabel",
            json!({"key": "", "value": "d1"}),
        )
        .await;
    assert_eq!(error_code(&bad), "VALIDATION", "{bad}");
    assert_billing_invariants(&app.app.db).await;
}

async fn a_job_is_found_by_its_idempotency_key_and_only_by_its_tenant(backend: Backend) {
    let app = spawn_app_with(backend, AppOptions::no_workers()).await;
    let acme = app.funded_tenant("acme", "5").await;
    let globex = app.funded_tenant("globex", "5").await;
    let id = app
        .create_job_ok(&acme, job_input("acme-only", "Find me by my key."))
        .await;
    let found = app
        .operation(Some(&acme.key), "JobByKey", json!({"key": "acme-only"}))
        .await;
    assert!(found["errors"].is_null(), "{found}");
    assert_eq!(found["data"]["job"]["id"], id.to_string());
    assert_eq!(found["data"]["job"]["status"], "QUEUED");

    // Another tenant's key finds nothing, as another tenant's id does; so does a key
    // nobody used.
    for (tenant, key) in [(&globex, "acme-only"), (&acme, "never-used")] {
        let missing = app
            .operation(Some(&tenant.key), "JobByKey", json!({"key": key}))
            .await;
        assert_eq!(error_code(&missing), "NOT_FOUND", "{missing}");
    }
    let by_id = app
        .graphql(
            Some(&globex.key),
            "query($id: UUID!) { job(id: $id) { id } }",
            json!({"id": id}),
        )
        .await;
    assert_eq!(error_code(&by_id), "NOT_FOUND", "{by_id}");

    // Exactly one of the two.
    for document in [
        "{ job { id } }",
        r#"query($id: UUID!) { job(id: $id, idempotencyKey: "acme-only") { id } }"#,
    ] {
        let response = app
            .graphql(Some(&acme.key), document, json!({"id": id}))
            .await;
        assert_eq!(
            error_code(&response),
            "VALIDATION",
            "{document}: {response}"
        );
    }
    assert_billing_invariants(&app.app.db).await;
}
