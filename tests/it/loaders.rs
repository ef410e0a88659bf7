//! A page of jobs with every nested field costs a fixed number of SQL statements,
//! whatever the page size: each relation of the page's jobs is loaded in one batch.

use crate::helpers::{Backend, TestApp, TestTenant, job_input, spawn_app};
use async_graphql::Request;
use jobledger::accounts::Principal;
use jobledger::app::App;
use jobledger::graphql::{AppSchema, build_schema};
use serde_json::{Value, json};
use std::collections::HashSet;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

/// Every nested field of a job that reads another table.
const PAGE_WITH_EVERYTHING: &str = r#"
query Page($first: Int) {
  jobs(first: $first) {
    edges { node {
      id
      status
      attempts { number outcome providerRequestId inputTokens providerCost customerCharge }
      reservation { amount status settledAmount releasedAmount }
      charge { amount }
      cost { providerCost customerCharge margin unknownAttempts }
      events { seq jobId kind status }
    } }
  }
}
"#;

/// The schema of `app`, on a connection that counts every statement it runs.
fn counting_schema(app: &App) -> (AppSchema, Arc<AtomicUsize>) {
    let statements = Arc::new(AtomicUsize::new(0));
    let mut db = app.db.clone();
    let counter = statements.clone();
    // The callback is the clone's own: the running app's statements are not counted.
    db.set_metric_callback(move |_| {
        counter.fetch_add(1, Ordering::SeqCst);
    });
    let schema = build_schema(App { db, ..app.clone() });
    (schema, statements)
}

/// Runs the page of `first` jobs as `tenant`; returns its jobs and the statements it took.
async fn page(
    schema: &AppSchema,
    statements: &AtomicUsize,
    tenant: &TestTenant,
    first: i32,
) -> (Vec<Value>, usize) {
    statements.store(0, Ordering::SeqCst);
    let request = Request::new(PAGE_WITH_EVERYTHING)
        .variables(async_graphql::Variables::from_json(json!({"first": first})))
        .data(Principal::Tenant {
            tenant_id: tenant.id,
        });
    let response = schema.execute(request).await;
    assert!(response.errors.is_empty(), "{:?}", response.errors);
    let count = statements.load(Ordering::SeqCst);
    let data = response.data.into_json().unwrap();
    let jobs = data["jobs"]["edges"]
        .as_array()
        .unwrap()
        .iter()
        .map(|edge| edge["node"].clone())
        .collect();
    (jobs, count)
}

/// Creates `count` jobs for `tenant` and waits until the workers have run them all.
async fn succeeded_jobs(app: &TestApp, tenant: &TestTenant, prefix: &str, count: usize) {
    for index in 0..count {
        app.create_job_ok(tenant, job_input(&format!("{prefix}-{index}"), "hello"))
            .await;
    }
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let response = app
            .graphql(
                Some(&tenant.key),
                "{ jobs(first: 100, status: SUCCEEDED) { edges { cursor } } }",
                json!({}),
            )
            .await;
        let done = response["data"]["jobs"]["edges"].as_array().unwrap().len();
        if done == count {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "{done} of {count} jobs succeeded"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

on_both_backends!(a_page_of_100_jobs_costs_the_statements_of_a_page_of_10);

/// Before batching, each nested field ran one query per job: 1 + 5 × 100 statements for
/// this page. Now it is one query for the page and one per relation, for 10 jobs as for
/// 100 — and each job still shows its own rows only, next to another tenant's jobs.
async fn a_page_of_100_jobs_costs_the_statements_of_a_page_of_10(backend: Backend) {
    let app = spawn_app(backend).await;
    let acme = app.funded_tenant("acme", "100").await;
    let other = app.funded_tenant("other", "100").await;
    succeeded_jobs(&app, &acme, "acme", 100).await;
    succeeded_jobs(&app, &other, "other", 3).await;
    let (schema, statements) = counting_schema(&app.app);

    let (ten, ten_statements) = page(&schema, &statements, &acme, 10).await;
    let (hundred, hundred_statements) = page(&schema, &statements, &acme, 100).await;

    assert_eq!((ten.len(), hundred.len()), (10, 100));
    assert_eq!(
        ten_statements, hundred_statements,
        "10 jobs took {ten_statements} statements, 100 took {hundred_statements}"
    );
    // The page itself, then attempts, events, reservations, charges and costs.
    assert_eq!(hundred_statements, 6);

    let own_ids: HashSet<&str> = hundred
        .iter()
        .map(|job| job["id"].as_str().unwrap())
        .collect();
    for job in &hundred {
        assert_eq!(job["status"], "SUCCEEDED", "{job}");
        let attempts = job["attempts"].as_array().unwrap();
        assert_eq!(attempts.len(), 1, "{job}");
        assert_eq!(attempts[0]["outcome"], "SUCCEEDED", "{job}");
        assert_eq!(job["reservation"]["status"], "SETTLED", "{job}");
        assert_eq!(
            job["charge"]["amount"], job["reservation"]["settledAmount"],
            "{job}"
        );
        assert_eq!(
            job["cost"]["customerCharge"], job["charge"]["amount"],
            "{job}"
        );
        assert_eq!(
            job["cost"]["providerCost"], attempts[0]["providerCost"],
            "{job}"
        );
        let events = job["events"].as_array().unwrap();
        let kinds: Vec<&str> = events
            .iter()
            .map(|event| event["kind"].as_str().unwrap())
            .collect();
        assert_eq!(kinds, ["CREATED", "ATTEMPT_STARTED", "SUCCEEDED"], "{job}");
        let seqs: Vec<i64> = events
            .iter()
            .map(|event| event["seq"].as_i64().unwrap())
            .collect();
        assert_eq!(seqs, [1, 2, 3], "{job}");
        for event in events {
            assert_eq!(event["jobId"], job["id"], "another job's event in {job}");
            assert!(own_ids.contains(event["jobId"].as_str().unwrap()));
        }
    }

    // The other tenant's page shows its three jobs and nothing of acme's.
    let (others, _) = page(&schema, &statements, &other, 100).await;
    assert_eq!(others.len(), 3);
    for job in &others {
        assert!(!own_ids.contains(job["id"].as_str().unwrap()));
        for event in job["events"].as_array().unwrap() {
            assert_eq!(event["jobId"], job["id"], "{job}");
        }
    }
}

on_both_backends!(a_page_reads_payloads_only_when_asked_and_one_job_at_a_time);

/// A page of jobs leaves their payloads (input and result, up to megabytes each) in
/// the database unless the client asks for them; asked for, each job's are read on
/// their own, so a page of large jobs is never held in memory at once — and they are
/// each job's own.
async fn a_page_reads_payloads_only_when_asked_and_one_job_at_a_time(backend: Backend) {
    let app = spawn_app(backend).await;
    let tenant = app.funded_tenant("acme", "50").await;
    let mut ids = Vec::new();
    for index in 0..3 {
        let id = app
            .create_job_ok(
                &tenant,
                job_input(&format!("payload-{index}"), &format!("text number {index}")),
            )
            .await;
        ids.push(id);
    }
    for id in &ids {
        app.wait_until_finished(&tenant, *id, Duration::from_secs(20))
            .await;
    }
    let reads = Arc::new(std::sync::Mutex::new(Vec::<String>::new()));
    let mut db = app.app.db.clone();
    let log = reads.clone();
    db.set_metric_callback(move |info| {
        log.lock().unwrap().push(info.statement.sql.clone());
    });
    let schema = build_schema(App {
        db,
        ..app.app.clone()
    });
    let run = async |query: &str| {
        reads.lock().unwrap().clear();
        let response = schema
            .execute(Request::new(query).data(Principal::Tenant {
                tenant_id: tenant.id,
            }))
            .await;
        assert!(response.errors.is_empty(), "{:?}", response.errors);
        let statements = reads.lock().unwrap().clone();
        (response.data.into_json().unwrap(), statements)
    };
    let reads_payloads = |sql: &String| sql.contains(r#""jobs"."input""#);

    let (_, statements) = run("{ jobs(first: 10) { edges { node { id status } } } }").await;
    assert!(
        !statements.iter().any(reads_payloads),
        "a page without payloads never reads them: {statements:?}"
    );

    let (page, statements) =
        run("{ jobs(first: 10) { edges { node { id input result } } } }").await;
    assert_eq!(
        statements.iter().filter(|sql| reads_payloads(sql)).count(),
        ids.len(),
        "one read per job: {statements:?}"
    );
    for edge in page["jobs"]["edges"].as_array().unwrap() {
        let id: uuid::Uuid = edge["node"]["id"].as_str().unwrap().parse().unwrap();
        let one = &app
            .graphql(
                Some(&tenant.key),
                "query($id: UUID!) { job(id: $id) { input result } }",
                json!({"id": id}),
            )
            .await["data"]["job"];
        assert_eq!(edge["node"]["input"], one["input"], "{id}");
        assert_eq!(edge["node"]["result"], one["result"], "{id}");
        assert!(edge["node"]["result"].is_string(), "{edge}");
    }
}
