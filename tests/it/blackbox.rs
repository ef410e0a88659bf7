//! The black-box clients of `tests/blackbox`, run by Node.js against the served API:
//! the GraphQL-over-HTTP audit suite and the reference clients of both live
//! protocols. The console's browser test runs from the same folder.

use crate::helpers::{AppOptions, Backend, job_input, spawn_app, spawn_app_with};
use std::time::Duration;

/// `tests/blackbox` with its dependencies installed; fails when Node.js is missing.
/// Installed once per test run: two `npm ci` at once in one folder would trip over
/// each other (the console's browser test uses it too).
pub(crate) async fn blackbox_folder() -> std::path::PathBuf {
    static INSTALLED: tokio::sync::OnceCell<std::path::PathBuf> =
        tokio::sync::OnceCell::const_new();
    INSTALLED.get_or_init(install_blackbox).await.clone()
}

async fn install_blackbox() -> std::path::PathBuf {
    let blackbox = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/blackbox");
    match std::process::Command::new("node").arg("--version").output() {
        Ok(output) if output.status.success() => {}
        other => panic!(
            "`node` is not on PATH ({other:?}): the black-box clients cannot run; install Node.js 20 or later"
        ),
    }
    let installed = [
        "graphql-http",
        "graphql-ws",
        "graphql-sse",
        "ws",
        "graphql",
        "playwright-core",
        "axe-core",
    ]
    .iter()
    .all(|package| blackbox.join("node_modules").join(package).exists());
    if !installed {
        let installed = tokio::process::Command::new("npm")
            .args(["ci", "--no-audit", "--no-fund", "--prefix"])
            .arg(&blackbox)
            .status()
            .await
            .expect("npm runs");
        assert!(installed.success(), "npm ci --prefix tests/blackbox failed");
    }
    blackbox
}

/// The graphql-http audit suite, the specification's own checks, run by Node.js as a
/// real client against the served API (`tests/blackbox/audit.mjs`); any MUST audit
/// that fails fails this test. Node.js is required: without it this test fails.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_graphql_over_http_audit_suite_passes() {
    let blackbox = blackbox_folder().await;
    let app = spawn_app_with(Backend::Sqlite, AppOptions::no_workers()).await;
    let output = tokio::time::timeout(
        Duration::from_secs(120),
        tokio::process::Command::new("node")
            .arg(blackbox.join("audit.mjs"))
            .arg(app.url())
            .output(),
    )
    .await
    .expect("the audits finish within 2 minutes")
    .expect("node runs");
    let report = String::from_utf8_lossy(&output.stdout);
    assert!(
        output.status.success(),
        "graphql-http audits failed:\n{report}\n{}",
        String::from_utf8_lossy(&output.stderr)
    );
    assert!(report.contains("0 MUST audit(s) failed"), "{report}");
}

/// The reference clients of both live protocols (graphql-ws over WebSocket,
/// graphql-sse over Server-Sent Events), run by Node.js as a frontend would run them
/// (`tests/blackbox/clients.mjs`): each follows a job from `CREATED` to `SUCCEEDED`,
/// and a key that is not valid is closed with 4403.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_graphql_ws_and_graphql_sse_clients_follow_a_job() {
    let blackbox = blackbox_folder().await;
    let app = spawn_app(Backend::Sqlite).await;
    let tenant = app.funded_tenant("acme", "5").await;
    let id = app
        .create_job_ok(&tenant, job_input("clients", "hello [mock:delay_ms=300]"))
        .await;
    let output = tokio::time::timeout(
        Duration::from_secs(120),
        tokio::process::Command::new("node")
            .arg(blackbox.join("clients.mjs"))
            .arg(format!("http://{}", app.address))
            .arg(&tenant.key)
            .arg(id.to_string())
            .output(),
    )
    .await
    .expect("the clients finish within 2 minutes")
    .expect("node runs");
    let report = String::from_utf8_lossy(&output.stdout);
    assert!(
        output.status.success(),
        "the reference clients failed:\n{report}\n{}",
        String::from_utf8_lossy(&output.stderr)
    );
    assert!(report.contains("0 client check(s) failed"), "{report}");
}
