//! What `serve` tells an operator as it starts and stops: a built-in simulator only when
//! some model can be routed to it (and a warning when it answers every model), the
//! admin token's lifetime, no terminal colours in logs that go to a file, and an error
//! that stops the start said once.

use crate::helpers::wait_until_serving;
use std::process::Stdio;
use std::time::Duration;
use tokio::io::AsyncReadExt;

/// What a `serve` with `environment` printed to stdout and stderr from its start until
/// it was serving and then stopped by SIGTERM.
async fn serve_output(environment: &[(&str, &str)]) -> (String, String) {
    let folder = tempfile::tempdir().unwrap();
    let address = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap();
    let database = format!(
        "sqlite:{}?mode=rwc",
        folder.path().join("start.db").display()
    );
    let mut child = tokio::process::Command::new(env!("CARGO_BIN_EXE_jobledger"))
        .args(["serve", "--listen", &address.to_string(), "--database-url"])
        .arg(&database)
        .env_remove("JOBLEDGER_ADMIN_TOKEN")
        .env_remove("OPENAI_BASE_URL")
        .env_remove("OPENAI_API_KEY")
        .env_remove("ANTHROPIC_BASE_URL")
        .env_remove("ANTHROPIC_API_KEY")
        .env_remove("JOBLEDGER_LOG_FORMAT")
        .env("RUST_LOG", "info")
        .envs(environment.iter().copied())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .expect("the binary runs");
    wait_until_serving(address).await;
    let pid = child.id().expect("running");
    let signalled = std::process::Command::new("kill")
        .args(["-TERM", &pid.to_string()])
        .status()
        .unwrap();
    assert!(signalled.success());
    let mut stdout = String::new();
    let mut stderr = String::new();
    let (out, err) = (child.stdout.take().unwrap(), child.stderr.take().unwrap());
    let read = async {
        let mut out = out;
        let mut err = err;
        let _ = tokio::join!(
            out.read_to_string(&mut stdout),
            err.read_to_string(&mut stderr)
        );
        child.wait().await.unwrap()
    };
    tokio::time::timeout(Duration::from_secs(30), read)
        .await
        .expect("serve stops on SIGTERM");
    (stdout, stderr)
}

#[tokio::test]
async fn without_a_provider_the_simulator_answers_every_model_and_says_so() {
    let (stdout, stderr) = serve_output(&[]).await;
    assert!(
        stderr.contains("built-in LLM simulator started"),
        "{stderr}"
    );
    assert!(
        stderr.contains("WARN") && stderr.contains("the built-in simulator answers every model"),
        "{stderr}"
    );
    assert!(
        stdout.contains("admin token (shown once, and a new one at every start"),
        "{stdout}"
    );
    // Piped, so no colour codes: a log file would carry them as noise.
    assert!(!stderr.contains('\u{1b}'), "{stderr:?}");
}

#[tokio::test]
async fn with_a_real_provider_no_simulator_runs_beside_it() {
    let (_, stderr) = serve_output(&[
        ("OPENAI_BASE_URL", "http://127.0.0.1:9/v1"),
        ("OPENAI_API_KEY", "sk-not-used"),
    ])
    .await;
    assert!(stderr.contains("a real provider is configured"), "{stderr}");
    assert!(!stderr.contains("simulator started"), "{stderr}");
    assert!(!stderr.contains("answers every model"), "{stderr}");
}

/// What a `serve` refused at start for a too-short admin token wrote to stderr, with
/// logs in `format`.
async fn refused_start(format: &str) -> String {
    let output = tokio::process::Command::new(env!("CARGO_BIN_EXE_jobledger"))
        .args([
            "serve",
            "--listen",
            "127.0.0.1:0",
            "--database-url",
            "sqlite::memory:",
        ])
        .env("JOBLEDGER_ADMIN_TOKEN", "too-short")
        .env("JOBLEDGER_LOG_FORMAT", format)
        .output()
        .await
        .unwrap();
    assert!(!output.status.success());
    String::from_utf8_lossy(&output.stderr).into_owned()
}

#[tokio::test]
async fn an_error_that_stops_the_start_is_said_once() {
    let stderr = refused_start("text").await;
    assert_eq!(stderr.matches("at least 32").count(), 1, "{stderr}");
    assert!(stderr.contains("error: "), "{stderr}");
    // A log pipeline gets it as one structured line instead.
    let stderr = refused_start("json").await;
    assert_eq!(stderr.matches("at least 32").count(), 1, "{stderr}");
    let line = stderr
        .lines()
        .find(|line| line.contains("at least 32"))
        .unwrap();
    let logged: serde_json::Value = serde_json::from_str(line).expect("a JSON log line");
    assert_eq!(logged["level"], "ERROR", "{line}");
}
