//! The real `jobledger audit` binary: its exit code and output on a clean database, a
//! corrupted one and one that is not there.

use super::{bump_tenant, scenario};
use crate::helpers::{Backend, TestApp};
use entity::tenants;
use jobledger::billing::audit::Invariant;
use sea_orm::{ConnectionTrait, DbBackend, Statement};

on_both_backends!(the_audit_command_exits_zero_when_clean_and_one_on_a_violation);

/// The URL of the database the app runs on, for another process to open.
async fn database_url(app: &TestApp, backend: &Backend) -> String {
    let db = &app.app.db;
    match backend {
        Backend::Sqlite => {
            let row = db
                .query_one_raw(Statement::from_string(
                    DbBackend::Sqlite,
                    "SELECT file FROM pragma_database_list WHERE name = 'main'",
                ))
                .await
                .unwrap()
                .unwrap();
            format!("sqlite:{}", row.try_get::<String>("", "file").unwrap())
        }
        Backend::Postgres(server_url) => {
            let row = db
                .query_one_raw(Statement::from_string(
                    DbBackend::Postgres,
                    "SELECT current_database() AS name",
                ))
                .await
                .unwrap()
                .unwrap();
            let name: String = row.try_get("", "name").unwrap();
            let (base, query) = server_url
                .split_once('?')
                .map_or((server_url.as_str(), None), |(b, q)| (b, Some(q)));
            let authority = base.find("://").map_or(0, |index| index + 3);
            let path = base[authority..]
                .find('/')
                .map_or(base.len(), |index| authority + index);
            let mut url = format!("{}/{name}", &base[..path]);
            if let Some(query) = query {
                url = format!("{url}?{query}");
            }
            url
        }
    }
}

/// Runs `jobledger audit --database-url url`: (exit code, stdout, stderr).
async fn run_audit_command(url: &str) -> (i32, String, String) {
    let output = tokio::process::Command::new(env!("CARGO_BIN_EXE_jobledger"))
        .args(["audit", "--database-url", url])
        .env("RUST_LOG", "warn")
        .output()
        .await
        .expect("the binary runs");
    (
        output.status.code().expect("the audit exits by itself"),
        String::from_utf8(output.stdout).unwrap(),
        String::from_utf8(output.stderr).unwrap(),
    )
}

async fn the_audit_command_exits_zero_when_clean_and_one_on_a_violation(backend: Backend) {
    let s = scenario(backend.clone()).await;
    let url = database_url(&s.app, &backend).await;

    let (code, stdout, stderr) = run_audit_command(&url).await;
    assert_eq!(code, 0, "stdout:\n{stdout}\nstderr:\n{stderr}");
    assert_eq!(stdout.lines().count(), Invariant::ALL.len() + 1, "{stdout}");
    for invariant in Invariant::ALL {
        assert!(
            stdout.contains(&format!("OK        {invariant} (")),
            "{stdout}"
        );
    }
    assert!(stdout.contains("clean: all 22 invariants hold"), "{stdout}");

    bump_tenant(&s.app, &s.tenant, tenants::Column::HeldNanos, 1).await;
    let (code, stdout, stderr) = run_audit_command(&url).await;
    assert_eq!(code, 1, "stdout:\n{stdout}\nstderr:\n{stderr}");
    assert!(
        stdout.contains("VIOLATED  balance_matches_ledger: 1 violation"),
        "{stdout}"
    );
    assert!(
        stdout.contains(&format!("- tenant {}: cached", s.tenant.id)),
        "{stdout}"
    );
    assert!(
        stdout.contains("OK        held_equals_open_reservations"),
        "{stdout}"
    );
    assert!(
        stdout.contains("NOT CLEAN: 1 of 22 invariants violated"),
        "{stdout}"
    );

    if matches!(backend, Backend::Sqlite) {
        // A database that is not there is "could not audit" (2), and is not created.
        let directory = tempfile::tempdir().unwrap();
        let missing = directory.path().join("missing.db");
        let (code, _, stderr) = run_audit_command(&format!("sqlite:{}", missing.display())).await;
        assert_eq!(code, 2, "{stderr}");
        assert!(stderr.contains("the audit could not run"), "{stderr}");
        assert!(!missing.exists(), "the audit created a database");
    }
}
