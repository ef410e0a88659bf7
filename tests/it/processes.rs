//! Several processes on one PostgreSQL database: event notices cross between them
//! through LISTEN/NOTIFY, so pickup and cancellation do not wait for a poll or a
//! lease renewal.

use crate::helpers::{
    AppOptions, Backend, job_input, spawn_app_with, test_worker_settings, wait_until_serving,
};
use crate::invariants::assert_billing_invariants;
use jobledger::jobs::worker::WorkerSettings;
use serde_json::json;
use std::time::{Duration, Instant};

/// Workers that would take a minute to notice anything without a notification.
fn deaf_worker() -> WorkerSettings {
    WorkerSettings {
        lease: Duration::from_secs(60),
        poll_interval: Duration::from_secs(60),
        ..test_worker_settings()
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn notices_cross_processes_for_pickup_and_cancel() {
    let Some(backend @ Backend::Postgres(_)) = Backend::postgres() else {
        return;
    };
    let api = spawn_app_with(backend, AppOptions::no_workers()).await;
    let workers = api
        .another_process(AppOptions::workers(deaf_worker()))
        .await;
    let tenant = api.funded_tenant("acme", "5").await;

    // Created on the API process, run by the worker process long before its poll.
    let quick = api
        .create_job_ok(&tenant, job_input("quick", "hello"))
        .await;
    let job = api
        .wait_until_finished(&tenant, quick, Duration::from_secs(15))
        .await;
    assert_eq!(job["status"], "SUCCEEDED", "{job}");

    // Cancelled on the API process, aborted by the worker process long before its
    // next lease renewal (every 20 s here).
    let long = api
        .create_job_ok(&tenant, job_input("long", "hello [mock:hang]"))
        .await;
    let deadline = Instant::now() + Duration::from_secs(15);
    while api.job(&tenant, long).await["attempts"]
        .as_array()
        .unwrap()
        .is_empty()
    {
        assert!(Instant::now() < deadline, "the long job never started");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let cancel = api
        .operation(Some(&tenant.key), "CancelJob", json!({"id": long}))
        .await;
    assert_eq!(
        cancel["data"]["cancelJob"]["cancelRequested"], true,
        "{cancel}"
    );
    let job = api
        .wait_until_finished(&tenant, long, Duration::from_secs(10))
        .await;
    assert_eq!(job["status"], "CANCELLED", "{job}");
    assert_eq!(job["attempts"][0]["outcome"], "CANCELLED");
    assert_billing_invariants(&api.app.db).await;
    drop(workers);
}

on_both_backends!(concurrent_migrations_of_a_fresh_database_all_succeed);

/// Processes deployed together race to migrate a fresh database: each waits for the
/// other (an advisory lock on PostgreSQL, the write lock on SQLite) and all succeed.
async fn concurrent_migrations_of_a_fresh_database_all_succeed(backend: Backend) {
    let database = crate::helpers::TestDatabase::create(&backend).await;
    let migrations: Vec<_> = (0..3)
        .map(|_| {
            tokio::process::Command::new(env!("CARGO_BIN_EXE_jobledger"))
                .args(["migrate", "--database-url", &database.url])
                .output()
        })
        .collect();
    for output in futures_util::future::join_all(migrations).await {
        let output = output.expect("the binary runs");
        assert!(
            output.status.success(),
            "a concurrent migrate failed: {}",
            String::from_utf8_lossy(&output.stderr)
        );
    }
    let db = jobledger::db::connect(&database.url).await.unwrap();
    jobledger::db::migrate(&db)
        .await
        .expect("nothing is left to apply");
    assert_billing_invariants(&db).await;
}

/// A `jobledger serve` child process on `url`, killed when dropped.
pub struct ServeProcess {
    address: std::net::SocketAddr,
    _child: tokio::process::Child,
}

impl ServeProcess {
    async fn start(url: &str) -> Self {
        Self::start_with(url, &[], &[]).await
    }

    /// A `serve` with more arguments and environment variables.
    pub async fn start_with(url: &str, arguments: &[&str], environment: &[(&str, &str)]) -> Self {
        let address = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap();
        let child = tokio::process::Command::new(env!("CARGO_BIN_EXE_jobledger"))
            .args([
                "serve",
                "--listen",
                &address.to_string(),
                "--database-url",
                url,
            ])
            .args(arguments)
            .envs(environment.iter().copied())
            .env("JOBLEDGER_ADMIN_TOKEN", crate::helpers::ADMIN_TOKEN)
            .env("RUST_LOG", "warn")
            .kill_on_drop(true)
            .spawn()
            .expect("the binary runs");
        wait_until_serving(address).await;
        Self {
            address,
            _child: child,
        }
    }

    /// A new tenant granted `amount` credits, through the admin token: its id and key.
    pub async fn funded_tenant(&self, amount: &str) -> (serde_json::Value, String) {
        let created = self
            .graphql(
                crate::helpers::ADMIN_TOKEN,
                "mutation { createTenant(name: \"acme\") { tenant { id } apiKey } }",
                json!({}),
            )
            .await;
        let tenant_id = created["data"]["createTenant"]["tenant"]["id"].clone();
        let key = created["data"]["createTenant"]["apiKey"]
            .as_str()
            .unwrap_or_else(|| panic!("no tenant: {created}"))
            .to_owned();
        let granted = self
            .graphql(
                crate::helpers::ADMIN_TOKEN,
                "mutation($input: GrantCreditsInput!) { grantCredits(input: $input) { id } }",
                json!({"input": {"tenantId": tenant_id, "amount": amount, "idempotencyKey": "g"}}),
            )
            .await;
        assert!(granted["errors"].is_null(), "{granted}");
        (tenant_id, key)
    }

    /// Where it serves the API.
    pub fn address(&self) -> std::net::SocketAddr {
        self.address
    }

    /// Its resident memory now, in bytes (Linux: `VmRSS` of `/proc/<pid>/status`).
    pub fn resident_bytes(&self) -> u64 {
        let pid = self._child.id().expect("the child runs");
        let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
        let kib: u64 = status
            .lines()
            .find_map(|line| line.strip_prefix("VmRSS:"))
            .and_then(|value| value.trim().trim_end_matches("kB").trim().parse().ok())
            .expect("VmRSS in /proc/<pid>/status");
        kib * 1024
    }

    /// Sends a GraphQL document with `key`.
    pub async fn graphql(
        &self,
        key: &str,
        query: &str,
        variables: serde_json::Value,
    ) -> serde_json::Value {
        reqwest::Client::new()
            .post(format!("http://{}/graphql", self.address))
            .bearer_auth(key)
            .json(&json!({"query": query, "variables": variables}))
            .send()
            .await
            .unwrap()
            .json()
            .await
            .unwrap()
    }
}

/// Two `serve` processes on one PostgreSQL database: a subscriber of one sees every
/// event of a job the other created and ran, and a key revoked through one closes its
/// connection on the other.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn live_updates_and_revocations_cross_two_serve_processes() {
    use crate::socket::{GraphqlSocket, Received};
    let Some(backend @ Backend::Postgres(_)) = Backend::postgres() else {
        return;
    };
    let database = crate::helpers::TestDatabase::create(&backend).await;
    // One at a time: the second finds the migrations applied.
    let first = ServeProcess::start(&database.url).await;
    let second = ServeProcess::start(&database.url).await;
    let admin = crate::helpers::ADMIN_TOKEN;
    let created = first
        .graphql(
            admin,
            "mutation { createTenant(name: \"acme\") { tenant { id } apiKey } }",
            json!({}),
        )
        .await;
    let tenant_id = created["data"]["createTenant"]["tenant"]["id"]
        .as_str()
        .unwrap()
        .to_owned();
    let key = created["data"]["createTenant"]["apiKey"]
        .as_str()
        .unwrap()
        .to_owned();
    let granted = first
        .graphql(
            admin,
            "mutation($input: GrantCreditsInput!) { grantCredits(input: $input) { id } }",
            json!({"input": {"tenantId": tenant_id, "amount": "5", "idempotencyKey": "g"}}),
        )
        .await;
    assert!(granted["errors"].is_null(), "{granted}");
    let extra = second
        .graphql(
            &key,
            "mutation { createApiKey(name: \"live\") { apiKey key { id } } }",
            json!({}),
        )
        .await;
    let live_key = extra["data"]["createApiKey"]["apiKey"]
        .as_str()
        .unwrap()
        .to_owned();
    let live_key_id = extra["data"]["createApiKey"]["key"]["id"]
        .as_str()
        .unwrap()
        .to_owned();

    let mut socket = GraphqlSocket::connect(second.address).await;
    socket.init_ok(&live_key).await;
    socket
        .subscribe(
            "all",
            &crate::contract::operation("AccountJobUpdates"),
            json!({}),
        )
        .await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    let job = first
        .graphql(
            &key,
            "mutation($input: CreateJobInput!) { createJob(input: $input) { job { id } } }",
            json!({"input": job_input("two-processes", "hello [mock:delay_ms=200]")}),
        )
        .await;
    let job_id = job["data"]["createJob"]["job"]["id"]
        .as_str()
        .unwrap()
        .to_owned();
    let mut kinds = Vec::new();
    while kinds.last().is_none_or(|kind| kind != "SUCCEEDED") {
        match socket.next(Duration::from_secs(20)).await {
            Received::Message(message) => {
                let event = &message["payload"]["data"]["accountJobUpdates"];
                assert_eq!(event["jobId"], job_id.as_str(), "{message}");
                kinds.push(event["kind"].as_str().unwrap().to_owned());
            }
            other => panic!("the connection ended: {other:?}"),
        }
    }
    assert_eq!(kinds, ["CREATED", "ATTEMPT_STARTED", "SUCCEEDED"]);

    let revoked = first
        .graphql(
            &key,
            "mutation($id: UUID!) { revokeApiKey(id: $id) { revokedAt } }",
            json!({"id": live_key_id}),
        )
        .await;
    assert!(revoked["errors"].is_null(), "{revoked}");
    assert_eq!(socket.closed_code(Duration::from_secs(5)).await, 4403);
    drop((first, second));
    let db = jobledger::db::connect(&database.url).await.unwrap();
    assert_billing_invariants(&db).await;
}

/// A process frozen mid-transaction (a SIGSTOP, a paused VM) must not hold the rows it
/// locked until it resumes: PostgreSQL ends every transaction of the service's
/// connections that sits idle for 30 seconds.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_ends_a_transaction_left_idle() {
    use sea_orm::{ConnectionTrait, DbBackend, Statement};
    let Some(backend) = Backend::postgres() else {
        return;
    };
    let app = spawn_app_with(backend, AppOptions::no_workers()).await;
    let row = app
        .app
        .db
        .query_one_raw(Statement::from_string(
            DbBackend::Postgres,
            "SHOW idle_in_transaction_session_timeout",
        ))
        .await
        .unwrap()
        .unwrap();
    let timeout: String = row.try_get_by_index(0).unwrap();
    assert_eq!(timeout, "30s");
}
