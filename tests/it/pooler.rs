//! Behind a transaction-mode pooler (`--listen-database-url`): the process LISTENs on
//! a direct connection of its own, its pools send no startup options (a pooler such as
//! PgBouncer refuses `options`), and the idle-in-transaction timeout reaches pooled
//! connections as the database's own setting, written at migrate.

use crate::helpers::{ADMIN_TOKEN, Backend, TestDatabase, wait_until_serving};
use sea_orm::{ConnectionTrait, DbBackend, Statement};
use std::time::{Duration, Instant};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_listen_connection_is_the_direct_url_and_pools_send_no_startup_options() {
    let Some(backend) = Backend::postgres() else {
        return;
    };
    let database = TestDatabase::create(&backend).await;
    let separator = if database.url.contains('?') { '&' } else { '?' };
    let listen_url = format!(
        "{}{separator}application_name=jobledger_listen",
        database.url
    );
    let pooled_url = format!(
        "{}{separator}application_name=jobledger_pooled",
        database.url
    );
    let address = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap();
    let _serve = tokio::process::Command::new(env!("CARGO_BIN_EXE_jobledger"))
        .args(["serve", "--listen", &address.to_string(), "--workers", "1"])
        .args(["--database-url", &pooled_url])
        .env("JOBLEDGER_LISTEN_DATABASE_URL", &listen_url)
        .env("JOBLEDGER_ADMIN_TOKEN", ADMIN_TOKEN)
        .env("RUST_LOG", "warn")
        .kill_on_drop(true)
        .spawn()
        .expect("the binary runs");
    wait_until_serving(address).await;

    let db = jobledger::db::connect(&database.url).await.unwrap();
    let sessions = |name: &'static str| {
        let db = db.clone();
        async move {
            db.query_all_raw(Statement::from_string(
                DbBackend::Postgres,
                format!(
                    "SELECT query FROM pg_stat_activity \
                     WHERE datname = current_database() AND application_name = '{name}'"
                ),
            ))
            .await
            .unwrap()
            .into_iter()
            .map(|row| row.try_get::<String>("", "query").unwrap())
            .collect::<Vec<String>>()
        }
    };
    // The LISTEN statement is the listen session's last (and only) query.
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let listening = sessions("jobledger_listen").await;
        if listening.iter().any(|query| query.starts_with("LISTEN")) {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "no LISTEN on the direct URL's connection: {listening:?}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let pooled = sessions("jobledger_pooled").await;
    assert!(
        !pooled.is_empty(),
        "the pools connect through --database-url"
    );
    assert!(
        pooled.iter().all(|query| !query.starts_with("LISTEN")),
        "no pooled connection LISTENs: a pooler would hand it to another client: {pooled:?}"
    );

    // A pooled connection got no startup option, yet has the timeout: the
    // database's own default, as a plain new connection sees it.
    let fresh = sea_orm::Database::connect(&database.url).await.unwrap();
    let timeout = fresh
        .query_one_raw(Statement::from_string(
            DbBackend::Postgres,
            "SELECT current_setting('idle_in_transaction_session_timeout') AS timeout",
        ))
        .await
        .unwrap()
        .unwrap()
        .try_get::<String>("", "timeout")
        .unwrap();
    assert_eq!(
        timeout, "30s",
        "the database's own idle-in-transaction timeout"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_listen_url_beside_sqlite_is_refused_at_start() {
    let folder = tempfile::tempdir().unwrap();
    let database = format!("sqlite:{}?mode=rwc", folder.path().join("db").display());
    let output = tokio::process::Command::new(env!("CARGO_BIN_EXE_jobledger"))
        .args([
            "serve",
            "--listen",
            "127.0.0.1:0",
            "--database-url",
            &database,
        ])
        .args(["--listen-database-url", "postgres://127.0.0.1:1/none"])
        .env("JOBLEDGER_ADMIN_TOKEN", ADMIN_TOKEN)
        .kill_on_drop(true)
        .output()
        .await
        .unwrap();
    assert!(!output.status.success(), "refused at start");
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        stderr.contains("--listen-database-url is for PostgreSQL"),
        "says why: {stderr}"
    );
}
