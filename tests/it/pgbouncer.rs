//! Through Debian's PgBouncer (1.18) in transaction mode, which carries no named
//! prepared statements: an API and two workers, their pools on the pooler with the
//! statement cache off (`?statement-cache-capacity=0`, which the patched driver takes
//! to mean unnamed statements, each in one extended-query cycle) and their LISTEN
//! sessions direct, drain 2,000 jobs with every job charged once and the audit clean.

use crate::helpers::{Backend, Client, Processes, TestDatabase, free_address};
use entity::{JobStatus, jobs};
use sea_orm::{ColumnTrait, EntityTrait, PaginatorTrait, QueryFilter};
use serde_json::json;
use std::process::Stdio;
use std::time::{Duration, Instant};

const MUTANT: &str = "0";
const ADMIN_TOKEN: &str = "pgbouncer-test-admin-token-of-32-chars-or-more";
const JOBS: usize = 2_000;
/// Creates sent at once: enough clients that the pooler's few server connections
/// are handed from one to another between statements.
const CREATORS: usize = 16;

/// A PgBouncer of the test's own on a free port, in transaction mode, in front of the
/// server of `database_url`; killed when dropped.
struct Pooler {
    port: u16,
    child: std::process::Child,
    _directory: tempfile::TempDir,
}

impl Pooler {
    fn start(database_url: &str) -> Self {
        let binary = ["/usr/sbin/pgbouncer", "/usr/bin/pgbouncer"]
            .into_iter()
            .find(|path| std::path::Path::new(path).exists())
            .expect("PgBouncer is installed (scripts/test installs Debian's pgbouncer)");
        let server = url::Url::parse(database_url).expect("a PostgreSQL URL");
        let user = server.username().to_owned();
        let directory = tempfile::tempdir().unwrap();
        let port = free_address().port();
        let config = directory.path().join("pgbouncer.ini");
        std::fs::write(
            &config,
            format!(
                "[databases]\n* = host={host} port={server_port}\n\n\
                 [pgbouncer]\nlisten_addr = 127.0.0.1\nlisten_port = {port}\n\
                 unix_socket_dir =\nauth_type = trust\nauth_file = {users}\n\
                 pool_mode = transaction\ndefault_pool_size = 8\nmax_client_conn = 1000\n\
                 ignore_startup_parameters = extra_float_digits\n\
                 log_connections = 0\nlog_disconnections = 0\nlog_stats = 0\n",
                host = server.host_str().unwrap_or("127.0.0.1"),
                server_port = server.port().unwrap_or(5432),
                users = directory.path().join("users.txt").display(),
            ),
        )
        .unwrap();
        std::fs::write(
            directory.path().join("users.txt"),
            format!("\"{user}\" \"\"\n"),
        )
        .unwrap();
        let mut command = std::process::Command::new(binary);
        // PgBouncer will not run as root: it drops to the database's own user then,
        // which must read the folder.
        if is_root() {
            let owned = std::process::Command::new("chown")
                .args(["-R", "postgres"])
                .arg(directory.path())
                .status()
                .unwrap();
            assert!(owned.success(), "chown of the pooler's folder");
            command.args(["-u", "postgres"]);
        }
        let child = command
            .arg(&config)
            .stdout(Stdio::null())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("PgBouncer starts");
        let deadline = Instant::now() + Duration::from_secs(10);
        while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
            assert!(Instant::now() < deadline, "PgBouncer never listened");
            std::thread::sleep(Duration::from_millis(50));
        }
        Self {
            port,
            child,
            _directory: directory,
        }
    }

    /// `database_url` through the pooler, with the driver's statement cache off.
    fn url(&self, database_url: &str) -> String {
        let mut url = url::Url::parse(database_url).unwrap();
        url.set_port(Some(self.port)).unwrap();
        url.query_pairs_mut()
            .append_pair("statement-cache-capacity", MUTANT);
        url.to_string()
    }
}

impl Drop for Pooler {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn is_root() -> bool {
    std::process::Command::new("id")
        .arg("-u")
        .output()
        .is_ok_and(|output| output.stdout.starts_with(b"0\n"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_api_and_two_workers_through_pgbouncer_drain_two_thousand_jobs() {
    let Some(backend) = Backend::postgres() else {
        return;
    };
    let began = Instant::now();
    let database = TestDatabase::create(&backend).await;
    // Declared after the database, so that the processes and then the pooler stop
    // before it is dropped.
    let pooler = Pooler::start(&database.url);
    let mut processes = Processes::new();
    let pooled = pooler.url(&database.url);
    let migrated = tokio::process::Command::new(env!("CARGO_BIN_EXE_jobledger"))
        .args(["migrate", "--database-url", &database.url])
        .output()
        .await
        .unwrap();
    assert!(migrated.status.success(), "migrate: {migrated:?}");
    let env = [
        ("JOBLEDGER_ADMIN_TOKEN", ADMIN_TOKEN),
        ("JOBLEDGER_LISTEN_DATABASE_URL", database.url.as_str()),
    ];
    let http = reqwest::Client::builder()
        .timeout(Duration::from_secs(30))
        .build()
        .unwrap();
    let api = processes.start_api(&http, &pooled, &env).await;
    let worker_args = ["worker", "--database-url", &pooled, "--workers", "16"];
    for name in ["worker-1", "worker-2"] {
        let worker = processes.spawn(name, &worker_args, &env);
        processes.wait_for_log(worker, "worker started").await;
    }

    let client = Client {
        http: http.clone(),
        url: format!("http://{api}/graphql"),
    };
    let key = client.funded_tenant(ADMIN_TOKEN, "pooled", "1000").await;
    let creators: Vec<_> = (0..CREATORS)
        .map(|creator| {
            let client = Client {
                http: http.clone(),
                url: client.url.clone(),
            };
            let key = key.clone();
            tokio::spawn(async move {
                for index in (creator..JOBS).step_by(CREATORS) {
                    let input = json!({
                        "idempotencyKey": format!("pooled-{index}"),
                        "model": "gpt-4o-mini",
                        "messages": [{"role": "user", "content": format!("job {index} [mock:delay_ms=20]")}],
                        "maxOutputTokens": 50,
                    });
                    client.send(&key, "CreateJob", json!({"input": input})).await;
                }
            })
        })
        .collect();
    for creator in creators {
        creator.await.unwrap();
    }
    eprintln!("pgbouncer: {JOBS} jobs created after {:?}", began.elapsed());

    let db = jobledger::db::connect(&database.url).await.unwrap();
    let deadline = Instant::now() + Duration::from_secs(300);
    loop {
        let unfinished = jobs::Entity::find()
            .filter(jobs::Column::Status.is_in([JobStatus::Queued, JobStatus::Running]))
            .count(&db)
            .await
            .unwrap();
        if unfinished == 0 {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "{unfinished} jobs unfinished after 300 s"
        );
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    eprintln!("pgbouncer: drained after {:?}", began.elapsed());
    let succeeded = jobs::Entity::find()
        .filter(jobs::Column::Status.eq(JobStatus::Succeeded))
        .count(&db)
        .await
        .unwrap();
    assert_eq!(succeeded, JOBS as u64, "every job succeeded");
    crate::invariants::assert_billing_invariants(&db).await;
    let audit = tokio::process::Command::new(env!("CARGO_BIN_EXE_jobledger"))
        .args(["audit", "--database-url", &database.url])
        .output()
        .await
        .unwrap();
    assert!(
        audit.status.success(),
        "audit: {}",
        String::from_utf8_lossy(&audit.stdout)
    );
    drop(processes);
    drop(pooler);
}
