//! Jobs through the contract: inputs, creating them, reading them and waiting for
//! their end.

use super::app::TestApp;
use super::tenants::TestTenant;
use serde_json::{Value, json};
use std::time::{Duration, Instant};
use uuid::Uuid;

impl TestApp {
    /// `CreateJob`, returning the whole response.
    pub async fn create_job(&self, tenant: &TestTenant, input: Value) -> Value {
        self.operation(Some(&tenant.key), "CreateJob", json!({"input": input}))
            .await
    }

    /// `CreateJob` that must succeed; returns the job's id.
    pub async fn create_job_ok(&self, tenant: &TestTenant, input: Value) -> Uuid {
        let response = self.create_job(tenant, input).await;
        assert!(response["errors"].is_null(), "createJob failed: {response}");
        response["data"]["createJob"]["job"]["id"]
            .as_str()
            .unwrap()
            .parse()
            .unwrap()
    }

    /// The contract's `Job` query, returning `data.job`.
    pub async fn job(&self, tenant: &TestTenant, id: Uuid) -> Value {
        let response = self
            .operation(Some(&tenant.key), "Job", json!({"id": id}))
            .await;
        assert!(response["errors"].is_null(), "job query failed: {response}");
        response["data"]["job"].clone()
    }

    /// Polls the job until its status is terminal (bounded by `limit`).
    pub async fn wait_until_finished(
        &self,
        tenant: &TestTenant,
        id: Uuid,
        limit: Duration,
    ) -> Value {
        let deadline = Instant::now() + limit;
        loop {
            let job = self.job(tenant, id).await;
            if ["SUCCEEDED", "FAILED", "CANCELLED"].contains(&job["status"].as_str().unwrap()) {
                return job;
            }
            assert!(Instant::now() < deadline, "job never finished: {job}");
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
}

/// The kinds of a job's stored events, in order (from the contract's `Job` query).
pub fn event_kinds(job: &Value) -> Vec<String> {
    job["events"]
        .as_array()
        .unwrap_or_else(|| panic!("no events in {job}"))
        .iter()
        .map(|event| event["kind"].as_str().unwrap().to_owned())
        .collect()
}

/// A small valid job input.
pub fn job_input(idempotency_key: &str, content: &str) -> Value {
    json!({
        "idempotencyKey": idempotency_key,
        "model": "gpt-4o-mini",
        "messages": [{"role": "user", "content": content}],
        "maxOutputTokens": 100,
    })
}

/// A valid job input of about `bytes` bytes (at most 5 MiB), for tests of large
/// requests and responses: a PNG image of `bytes` (its header, then padding) in
/// base64. Megabytes of text would pass the model's context window; an image counts
/// by its size in pixels, not its bytes.
pub fn large_job_input(idempotency_key: &str, bytes: usize) -> Value {
    use base64::Engine;
    let mut image =
        b"\x89PNG\r\n\x1a\n\x00\x00\x00\x0dIHDR\x00\x00\x04\x00\x00\x00\x04\x00".to_vec();
    image.resize(bytes * 3 / 4, 0);
    let data = base64::engine::general_purpose::STANDARD.encode(&image);
    let mut input = job_input(idempotency_key, "describe");
    input["messages"][0]["parts"] = json!([{"type": "IMAGE", "data": data}]);
    input
}

/// The answers to the same mutation sent concurrently under one key (`createJob`,
/// `rerunJob`, …, named by `field`): every one succeeded, all name one job, and exactly
/// one made it (the others are replays).
pub fn one_job_made_once(responses: &[Value], field: &str) {
    let ids: std::collections::HashSet<&str> = responses
        .iter()
        .map(|response| {
            assert!(
                response["errors"].is_null(),
                "a concurrent {field} failed: {response}"
            );
            response["data"][field]["job"]["id"].as_str().unwrap()
        })
        .collect();
    assert_eq!(
        ids.len(),
        1,
        "{} {field} calls with one key made {} jobs",
        responses.len(),
        ids.len()
    );
    let fresh = responses
        .iter()
        .filter(|response| response["data"][field]["replayed"] == false)
        .count();
    assert_eq!(fresh, 1, "exactly one {field} is not a replay");
}

/// Extends one claim's lease as a worker's renewal does (one statement for all its
/// attempts), here for one: what the renewal learned of that claim.
pub async fn renew_lease(
    db: &impl sea_orm::ConnectionTrait,
    claim: &jobledger::jobs::queue::Claim,
    lease: Duration,
) -> jobledger::jobs::queue::Renewal {
    let owned = [(claim.job.id, claim.run_token)];
    let renewed = jobledger::jobs::queue::renew_leases(db, &owned, lease)
        .await
        .unwrap();
    renewed
        .get(&claim.job.id)
        .copied()
        .unwrap_or(jobledger::jobs::queue::Renewal::Lost)
}
