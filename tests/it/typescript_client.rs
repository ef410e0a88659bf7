//! The TypeScript client of `clients/typescript`, built as a user would build it and
//! run by Node.js against `jobledger serve` (the binary, with its built-in provider
//! simulator): its generated code is what `schema.graphql` gives, its operations are
//! the contract's, its own tests pass on each backend, and in headless Chromium a page
//! of a listed origin calls the API while a page of another origin is blocked.

use crate::contract::{operation, operation_in, operation_names_in};
use crate::helpers::{ADMIN_TOKEN, Backend, TestDatabase};
use crate::processes::ServeProcess;
use std::path::{Path, PathBuf};
use std::time::Duration;

on_both_backends!(the_clients_own_tests_pass_against_serve);

/// Where the browser lives on Debian.
const CHROMIUM: &str = "/usr/bin/chromium";

fn folder() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("clients/typescript")
}

/// `npm` in the client's folder, bounded; panics with its output when it fails.
async fn npm(arguments: &[&str]) {
    let output = tokio::time::timeout(
        Duration::from_secs(300),
        tokio::process::Command::new("npm")
            .args(arguments)
            .current_dir(folder())
            .kill_on_drop(true)
            .output(),
    )
    .await
    .unwrap_or_else(|_| panic!("npm {arguments:?} did not finish within 5 minutes"))
    .expect("npm runs");
    assert!(
        output.status.success(),
        "npm {arguments:?} failed in clients/typescript:\n{}\n{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
}

/// The client's folder with its dependencies installed (`npm ci`) and the client
/// built (`tsc`, then the browser bundle), once per test run: the tests share it, and
/// two installs or builds at once in one folder would trip over each other.
async fn built_client() -> PathBuf {
    static BUILT: tokio::sync::OnceCell<PathBuf> = tokio::sync::OnceCell::const_new();
    BUILT
        .get_or_init(|| async {
            match std::process::Command::new("node").arg("--version").output() {
                Ok(output) if output.status.success() => {}
                other => panic!(
                    "`node` is not on PATH ({other:?}): the TypeScript client cannot be built; install Node.js 20 or later"
                ),
            }
            // `npm ci` starts from scratch (tens of seconds); it is skipped when the
            // installed tree was made from this very lock file.
            let lock = std::fs::read(folder().join("package-lock.json")).unwrap();
            let stamp = folder().join("node_modules/.installed-from-package-lock.json");
            if std::fs::read(&stamp).ok().as_ref() != Some(&lock) {
                npm(&["ci", "--no-audit", "--no-fund"]).await;
                std::fs::write(&stamp, &lock).unwrap();
            }
            npm(&["run", "--silent", "build"]).await;
            folder()
        })
        .await
        .clone()
}

/// `node` with `arguments` in the client's folder, bounded; its stdout when it exits 0.
async fn node(arguments: &[String], environment: &[(&str, &str)]) -> String {
    let output = tokio::time::timeout(
        Duration::from_secs(240),
        tokio::process::Command::new("node")
            .args(arguments)
            .envs(environment.iter().copied())
            .current_dir(built_client().await)
            .kill_on_drop(true)
            .output(),
    )
    .await
    .expect("node finishes within 4 minutes")
    .expect("node runs");
    let report = String::from_utf8_lossy(&output.stdout).into_owned();
    assert!(
        output.status.success(),
        "node {arguments:?} failed:\n{report}\n{}",
        String::from_utf8_lossy(&output.stderr)
    );
    report
}

/// A change to `schema.graphql` that the client's operations or generated types do not
/// follow fails here: the generated file must be what graphql-codegen makes of the
/// schema and `operations.graphql` today (an operation the schema no longer serves
/// fails the generation itself).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_generated_client_is_what_the_schema_gives() {
    built_client().await;
    npm(&["run", "--silent", "codegen:check"]).await;
}

/// The client sends the contract's operations as the contract spells them: each of its
/// operations named as one of the contract's has the same text.
#[test]
fn the_clients_operations_are_the_contracts() {
    let document = std::fs::read_to_string(folder().join("operations.graphql")).unwrap();
    let contract = operation_names_in(include_str!("contract/operations.graphql"));
    let names = operation_names_in(&document);
    let shared: Vec<&String> = names
        .iter()
        .filter(|name| contract.contains(name))
        .collect();
    for expected in ["CreateJob", "CancelJob", "Job", "JobUpdates"] {
        assert!(
            shared.iter().any(|name| *name == expected),
            "{expected} in {names:?}"
        );
    }
    let words = |text: String| text.split_whitespace().collect::<Vec<_>>().join(" ");
    for name in shared {
        assert_eq!(
            words(operation_in(&document, name)),
            words(operation(name)),
            "clients/typescript/operations.graphql: {name} differs from the contract"
        );
    }
}

/// `test/client.test.mjs` (node:test) against a served API: create a job, follow it to
/// SUCCEEDED over graphql-ws and over SSE, every event once and in seq order, also
/// when the connection is cut mid-stream; read its cost; credentials as strings and
/// functions, and refused ones.
async fn the_clients_own_tests_pass_against_serve(backend: Backend) {
    let folder = built_client().await;
    let database = TestDatabase::create(&backend).await;
    let served = ServeProcess::start_with(&database.url, &[], &[]).await;
    let (_, key) = served.funded_tenant("10").await;
    let url = format!("http://{}", served.address());
    let test = folder.join("test/client.test.mjs").display().to_string();
    let report = node(
        &["--test".to_owned(), test],
        &[("JOBLEDGER_URL", &url), ("JOBLEDGER_KEY", &key)],
    )
    .await;
    assert!(report.contains("# fail 0"), "{report}");
    assert!(!report.contains("# pass 0"), "{report}");
}

/// Two distinct free ports on 127.0.0.1, for servers that node starts: `serve` must
/// know the page's origin before the page exists.
fn two_free_ports() -> (u16, u16) {
    let bind = || std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    // Both held at once, so that they differ.
    let (first, second) = (bind(), bind());
    let port = |listener: &std::net::TcpListener| listener.local_addr().unwrap().port();
    (port(&first), port(&second))
}

/// `test/browser.mjs` in headless Chromium: a page served from another origin that
/// `--cors-origin` lists creates a job and follows it to the end over both live
/// protocols with the built bundle; a page of an origin not listed gets neither an
/// answer nor a WebSocket, and its job is never created.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_page_of_a_listed_origin_calls_the_api_and_another_is_blocked() {
    assert!(
        Path::new(CHROMIUM).exists(),
        "{CHROMIUM} is missing: install Debian's chromium (scripts/test does when run as root)"
    );
    let folder = built_client().await;
    let database = TestDatabase::create(&Backend::Sqlite).await;
    let (listed, unlisted) = two_free_ports();
    let origin = format!("http://127.0.0.1:{listed}");
    let served = ServeProcess::start_with(&database.url, &["--cors-origin", &origin], &[]).await;
    let report = node(
        &[
            folder.join("test/browser.mjs").display().to_string(),
            format!("http://{}", served.address()),
            ADMIN_TOKEN.to_owned(),
            listed.to_string(),
            unlisted.to_string(),
        ],
        &[("CHROMIUM", CHROMIUM)],
    )
    .await;
    assert!(report.contains("0 browser check(s) failed"), "{report}");
}
