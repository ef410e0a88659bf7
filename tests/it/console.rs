//! The web console end to end: `jobledger serve` (the binary, with its built-in
//! provider simulator) on a random port, driven in headless Chromium by
//! `tests/blackbox/console.mjs` (playwright-core and axe-core). Needs Node.js and
//! Debian's `chromium` (`scripts/test` installs it when missing); screenshots of each
//! page land in `target/console-screenshots`.

use crate::blackbox::blackbox_folder;
use crate::helpers::{ADMIN_TOKEN, AppOptions, Backend, spawn_app_with, wait_until_serving};
use std::path::Path;
use std::time::Duration;

/// Where the browser lives on Debian.
const CHROMIUM: &str = "/usr/bin/chromium";

/// A `jobledger serve` child on a fresh SQLite file, killed when dropped.
struct Served {
    address: std::net::SocketAddr,
    database_url: String,
    _child: tokio::process::Child,
    _folder: tempfile::TempDir,
}

async fn serve() -> Served {
    let folder = tempfile::tempdir().unwrap();
    let database_url = format!("sqlite:{}", folder.path().join("console.db").display());
    let address = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap();
    let mut command = tokio::process::Command::new(env!("CARGO_BIN_EXE_jobledger"));
    command
        .args(["serve", "--listen", &address.to_string()])
        .args(["--database-url", &database_url])
        // PROVIDER_BATCH batches settle within seconds.
        .args(["--provider-batch-poll-seconds", "1"])
        .env("JOBLEDGER_ADMIN_TOKEN", ADMIN_TOKEN)
        .env("RUST_LOG", "warn")
        .kill_on_drop(true);
    // No provider configured: every model is served by the built-in simulator.
    for variable in [
        "OPENAI_BASE_URL",
        "OPENAI_API_KEY",
        "ANTHROPIC_BASE_URL",
        "ANTHROPIC_API_KEY",
        "JOBLEDGER_CONFIG",
        "DATABASE_URL",
    ] {
        command.env_remove(variable);
    }
    let child = command.spawn().expect("the binary runs");
    wait_until_serving(address).await;
    Served {
        address,
        database_url,
        _child: child,
        _folder: folder,
    }
}

/// Sign-in, the live job list, a job's attempts and cost, cancelling a slow job, the
/// billing charts against `billingSummary`, the admin's pages, GraphiQL from local
/// assets, axe-core on every page, 768 px layouts, and no console errors — then the
/// ledger still balances (`jobledger audit`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_console_works_in_a_real_browser() {
    assert!(
        Path::new(CHROMIUM).exists(),
        "{CHROMIUM} is missing: install Debian's chromium (scripts/test does when run as root)"
    );
    let blackbox = blackbox_folder().await;
    let served = serve().await;
    let screenshots = Path::new(env!("CARGO_MANIFEST_DIR")).join("target/console-screenshots");
    let output = tokio::time::timeout(
        Duration::from_secs(300),
        tokio::process::Command::new("node")
            .arg(blackbox.join("console.mjs"))
            .arg(format!("http://{}", served.address))
            .arg(ADMIN_TOKEN)
            .arg(&screenshots)
            .env("CHROMIUM", CHROMIUM)
            .kill_on_drop(true)
            .output(),
    )
    .await
    .expect("the browser checks finish within 5 minutes")
    .expect("node runs");
    let report = String::from_utf8_lossy(&output.stdout);
    assert!(
        output.status.success(),
        "the console's browser checks failed:\n{report}\n{}",
        String::from_utf8_lossy(&output.stderr)
    );
    assert!(report.contains("0 console check(s) failed"), "{report}");
    for page in [
        "sign-in",
        "jobs",
        "job",
        "job-cancelled",
        "job-streaming",
        "batches",
        "batch",
        "batch-cancelled",
        "batch-provider",
        "new-job",
        "billing",
        "job-rerun",
        "admin-tenants",
        "admin-tenant",
        "admin-billing",
        "graphiql",
    ] {
        assert!(
            screenshots.join(format!("{page}.png")).exists(),
            "no screenshot of {page}"
        );
    }

    let audit = tokio::process::Command::new(env!("CARGO_BIN_EXE_jobledger"))
        .args(["audit", "--database-url", &served.database_url])
        .env("RUST_LOG", "warn")
        .output()
        .await
        .expect("the binary runs");
    assert!(
        audit.status.success(),
        "the audit found a violation:\n{}",
        String::from_utf8_lossy(&audit.stdout)
    );
}

/// The console's files come from the binary with their media types and a policy that
/// allows only this origin; GraphiQL's page names no other host; an unknown file is a
/// 404.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_console_and_graphiql_are_served_from_the_binary() {
    let app = spawn_app_with(Backend::Sqlite, AppOptions::no_workers()).await;
    let get = |path: &str, accept: &str| {
        app.http
            .get(format!("http://{}{path}", app.address))
            .header("accept", accept)
            .send()
    };
    let header = |response: &reqwest::Response, name: &str| {
        response
            .headers()
            .get(name)
            .map(|value| value.to_str().unwrap().to_owned())
            .unwrap_or_default()
    };

    let index = get("/", "text/html").await.unwrap();
    assert_eq!(index.status(), 200);
    assert_eq!(header(&index, "content-type"), "text/html; charset=utf-8");
    let policy = header(&index, "content-security-policy");
    assert!(policy.contains("default-src 'none'"), "{policy}");
    assert!(policy.contains("script-src 'self';"), "{policy}");
    assert!(!policy.contains("unsafe"), "{policy}");
    assert_eq!(header(&index, "x-content-type-options"), "nosniff");
    let page = index.text().await.unwrap();
    assert!(page.contains(r#"<script type="module" src="/assets/app.js">"#));

    let script = get("/assets/app.js", "*/*").await.unwrap();
    assert_eq!(script.status(), 200);
    assert_eq!(
        header(&script, "content-type"),
        "text/javascript; charset=utf-8"
    );
    let style = get("/assets/style.css", "*/*").await.unwrap();
    assert_eq!(header(&style, "content-type"), "text/css; charset=utf-8");
    let missing = get("/assets/nothing-here.js", "*/*").await.unwrap();
    assert_eq!(missing.status(), 404);

    let graphiql = get("/graphql", "text/html,application/xhtml+xml")
        .await
        .unwrap();
    assert_eq!(graphiql.status(), 200);
    let policy = header(&graphiql, "content-security-policy");
    assert!(policy.contains("script-src 'self';"), "{policy}");
    let page = graphiql.text().await.unwrap();
    assert!(page.contains("/assets/vendor/graphiql/graphiql.min.js"));
    assert!(
        !page.contains("//unpkg.com") && !page.contains("https://"),
        "{page}"
    );
    for vendored in [
        "/assets/vendor/graphiql/graphiql.min.js",
        "/assets/vendor/graphiql/graphiql.min.css",
        "/assets/vendor/react/react.production.min.js",
        "/assets/vendor/react-dom/react-dom.production.min.js",
    ] {
        let file = get(vendored, "*/*").await.unwrap();
        assert_eq!(file.status(), 200, "{vendored}");
    }
    // A query still runs over GET.
    let answer = get("/graphql?query=%7B__typename%7D", "application/json")
        .await
        .unwrap();
    assert_eq!(answer.status(), 200);
    assert_eq!(
        answer.json::<serde_json::Value>().await.unwrap()["data"]["__typename"],
        "QueryRoot"
    );
}

/// A console file carries a strong validator: asked again with it, the server answers
/// 304 with no body, so the 3.5 MB GraphiQL bundle is downloaded once; a client that
/// accepts gzip gets the same bytes gzipped, under a validator of their own.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn console_files_are_revalidated_by_etag_and_sent_gzipped() {
    let app = spawn_app_with(Backend::Sqlite, AppOptions::no_workers()).await;
    let get = |path: &str, headers: &[(&str, &str)]| {
        let mut request = app.http.get(format!("http://{}{path}", app.address));
        for (name, value) in headers {
            request = request.header(*name, *value);
        }
        request.send()
    };
    let etag =
        |response: &reqwest::Response| response.headers()["etag"].to_str().unwrap().to_owned();
    for path in [
        "/",
        "/assets/app.js",
        "/assets/vendor/graphiql/graphiql.min.js",
    ] {
        let whole = get(path, &[]).await.unwrap();
        assert_eq!(whole.status(), 200, "{path}");
        assert_eq!(whole.headers()["cache-control"], "no-cache", "{path}");
        assert!(whole.headers().get("content-encoding").is_none(), "{path}");
        let validator = etag(&whole);
        assert!(
            validator.starts_with('"') && validator.ends_with('"') && validator.len() > 20,
            "a strong validator for {path}: {validator}"
        );
        let contents = whole.bytes().await.unwrap();

        let again = get(path, &[("if-none-match", &validator)]).await.unwrap();
        assert_eq!(again.status(), 304, "{path}");
        assert_eq!(etag(&again), validator);
        assert!(again.bytes().await.unwrap().is_empty());
        let listed = format!("\"stale\", W/{validator}");
        let among_others = get(path, &[("if-none-match", &listed)]).await.unwrap();
        assert_eq!(among_others.status(), 304, "{path}: {listed}");
        let stale = get(path, &[("if-none-match", "\"stale\"")]).await.unwrap();
        assert_eq!(stale.status(), 200, "{path}");
        assert_eq!(stale.bytes().await.unwrap(), contents);

        let gzipped = get(path, &[("accept-encoding", "br, gzip")]).await.unwrap();
        assert_eq!(gzipped.status(), 200, "{path}");
        assert_eq!(gzipped.headers()["content-encoding"], "gzip", "{path}");
        assert_eq!(gzipped.headers()["vary"], "accept-encoding", "{path}");
        let gzip_validator = etag(&gzipped);
        assert_ne!(gzip_validator, validator, "{path}: another representation");
        let compressed = gzipped.bytes().await.unwrap();
        let mut unpacked = Vec::new();
        std::io::Read::read_to_end(
            &mut flate2::read::GzDecoder::new(&compressed[..]),
            &mut unpacked,
        )
        .unwrap();
        assert_eq!(unpacked, contents, "{path}: gzip carries the same bytes");
        let revalidated = get(
            path,
            &[
                ("accept-encoding", "gzip"),
                ("if-none-match", &gzip_validator),
            ],
        )
        .await
        .unwrap();
        assert_eq!(revalidated.status(), 304, "{path}");

        let refused = get(path, &[("accept-encoding", "gzip;q=0, identity")])
            .await
            .unwrap();
        assert!(
            refused.headers().get("content-encoding").is_none(),
            "{path}"
        );
    }
    let bundle = get(
        "/assets/vendor/graphiql/graphiql.min.js",
        &[("accept-encoding", "gzip")],
    )
    .await
    .unwrap()
    .bytes()
    .await
    .unwrap();
    assert!(
        bundle.len() < 1_500_000,
        "the GraphiQL bundle gzipped is {} bytes",
        bundle.len()
    );
}
