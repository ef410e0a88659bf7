//! An admin reads any tenant's jobs and the list of tenants (for support and the
//! console); a tenant still sees only its own.

use crate::helpers::*;
use crate::invariants::assert_billing_invariants;
use rust_decimal::Decimal;
use serde_json::{Value, json};
use std::time::Duration;
use uuid::Uuid;

const JOBS: &str = "query($tenantId: UUID, $status: JobStatus) {
  jobs(first: 100, tenantId: $tenantId, status: $status) { edges { node { id status } } }
}";
const JOB: &str = "query($id: UUID!, $tenantId: UUID) {
  job(id: $id, tenantId: $tenantId) {
    id status attempts { outcome }
    cost { providerCost providerCostUpperBound customerCharge margin unknownAttempts }
  }
}";
const TENANTS: &str = "query($first: Int, $after: String) {
  tenants(first: $first, after: $after) {
    edges { cursor node { id name balance { granted held charged available } } }
    pageInfo { hasNextPage endCursor }
  }
}";

fn job_ids(response: &Value) -> Vec<String> {
    assert!(response["errors"].is_null(), "{response}");
    response["data"]["jobs"]["edges"]
        .as_array()
        .unwrap()
        .iter()
        .map(|edge| edge["node"]["id"].as_str().unwrap().to_owned())
        .collect()
}

on_both_backends!(
    an_admin_reads_a_named_tenants_jobs_and_tenants_only_their_own,
    an_admin_lists_tenants_with_their_balances,
);

async fn an_admin_reads_a_named_tenants_jobs_and_tenants_only_their_own(backend: Backend) {
    let app = spawn_app(backend).await;
    let acme = app.funded_tenant("acme", "5").await;
    let globex = app.funded_tenant("globex", "5").await;
    let acme_job = app
        .create_job_ok(&acme, job_input("a-1", "hello from acme"))
        .await;
    let globex_job = app
        .create_job_ok(&globex, job_input("g-1", "hello from globex"))
        .await;
    for (tenant, id) in [(&acme, acme_job), (&globex, globex_job)] {
        let job = app
            .wait_until_finished(tenant, id, Duration::from_secs(20))
            .await;
        assert_eq!(job["status"], "SUCCEEDED", "{job}");
    }

    // The admin names a tenant and sees exactly its jobs, and each job whole.
    let admin_view = app
        .graphql(Some(ADMIN_TOKEN), JOBS, json!({"tenantId": acme.id}))
        .await;
    assert_eq!(job_ids(&admin_view), vec![acme_job.to_string()]);
    let succeeded = app
        .graphql(
            Some(ADMIN_TOKEN),
            JOBS,
            json!({"tenantId": globex.id, "status": "SUCCEEDED"}),
        )
        .await;
    assert_eq!(job_ids(&succeeded), vec![globex_job.to_string()]);
    let read = app
        .graphql(
            Some(ADMIN_TOKEN),
            JOB,
            json!({"id": acme_job, "tenantId": acme.id}),
        )
        .await;
    let own = app.job(&acme, acme_job).await;
    assert_eq!(read["data"]["job"]["status"], "SUCCEEDED", "{read}");
    assert_eq!(read["data"]["job"]["cost"], own["cost"]);
    assert_eq!(read["data"]["job"]["attempts"][0]["outcome"], "SUCCEEDED");
    // Naming the wrong tenant does not reveal the job; naming none is refused.
    let wrong_tenant = app
        .graphql(
            Some(ADMIN_TOKEN),
            JOB,
            json!({"id": acme_job, "tenantId": globex.id}),
        )
        .await;
    assert_eq!(error_code(&wrong_tenant), "NOT_FOUND");
    let unnamed = app.graphql(Some(ADMIN_TOKEN), JOBS, json!({})).await;
    assert_eq!(error_code(&unnamed), "VALIDATION");
    let no_such_tenant = app
        .graphql(Some(ADMIN_TOKEN), JOBS, json!({"tenantId": Uuid::now_v7()}))
        .await;
    assert_eq!(error_code(&no_such_tenant), "NOT_FOUND");

    // A tenant sees its own jobs with or without naming itself, and nobody else's.
    let own_jobs = app.graphql(Some(&acme.key), JOBS, json!({})).await;
    assert_eq!(job_ids(&own_jobs), vec![acme_job.to_string()]);
    let named_self = app
        .graphql(Some(&acme.key), JOBS, json!({"tenantId": acme.id}))
        .await;
    assert_eq!(job_ids(&named_self), vec![acme_job.to_string()]);
    let others = app
        .graphql(Some(&acme.key), JOBS, json!({"tenantId": globex.id}))
        .await;
    assert_eq!(error_code(&others), "FORBIDDEN");
    assert!(others["data"].is_null(), "{others}");
    let other_job = app
        .graphql(Some(&acme.key), JOB, json!({"id": globex_job}))
        .await;
    assert_eq!(error_code(&other_job), "NOT_FOUND");
    let other_job_named = app
        .graphql(
            Some(&acme.key),
            JOB,
            json!({"id": globex_job, "tenantId": globex.id}),
        )
        .await;
    assert_eq!(error_code(&other_job_named), "FORBIDDEN");
    assert_billing_invariants(&app.app.db).await;
}

async fn an_admin_lists_tenants_with_their_balances(backend: Backend) {
    let app = spawn_app_with(backend, AppOptions::no_workers()).await;
    let acme = app.funded_tenant("acme", "12.5").await;
    let globex = app.funded_tenant("globex", "3").await;
    let initech = app.create_tenant("initech").await;
    let job = app
        .create_job(&acme, job_input("held", "hold some credits"))
        .await;
    let hold = decimal(&job["data"]["createJob"]["job"]["reservation"]["amount"]);
    assert!(hold > Decimal::ZERO, "{job}");

    // Newest first, two at a time.
    let first = app
        .graphql(Some(ADMIN_TOKEN), TENANTS, json!({"first": 2}))
        .await;
    assert!(first["errors"].is_null(), "{first}");
    let page = &first["data"]["tenants"];
    let names: Vec<&str> = page["edges"]
        .as_array()
        .unwrap()
        .iter()
        .map(|edge| edge["node"]["name"].as_str().unwrap())
        .collect();
    assert_eq!(names, ["initech", "globex"]);
    assert_eq!(page["pageInfo"]["hasNextPage"], true);
    assert_eq!(page["edges"][0]["node"]["id"], initech.id.to_string());
    assert_eq!(
        decimal(&page["edges"][1]["node"]["balance"]["available"]),
        Decimal::from(3)
    );
    let rest = app
        .graphql(
            Some(ADMIN_TOKEN),
            TENANTS,
            json!({"first": 2, "after": page["pageInfo"]["endCursor"]}),
        )
        .await;
    let rest = &rest["data"]["tenants"];
    assert_eq!(rest["pageInfo"]["hasNextPage"], false);
    assert_eq!(rest["edges"].as_array().unwrap().len(), 1);
    let acme_row = &rest["edges"][0]["node"];
    assert_eq!(acme_row["id"], acme.id.to_string());
    // The same balance the tenant reads for itself.
    let own = app.balance(&acme).await;
    assert_eq!(acme_row["balance"], own);
    assert_eq!(decimal(&acme_row["balance"]["held"]), hold);
    assert_eq!(
        decimal(&acme_row["balance"]["available"]),
        Decimal::new(125, 1) - hold
    );

    // Tenants may not list tenants.
    let refused = app.graphql(Some(&globex.key), TENANTS, json!({})).await;
    assert_eq!(error_code(&refused), "FORBIDDEN");
    assert_billing_invariants(&app.app.db).await;
}
