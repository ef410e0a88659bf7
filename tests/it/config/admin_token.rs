//! The admin token an operator chooses.
use serde_json::json;
use std::net::SocketAddr;
use std::path::Path;
use std::time::Duration;

/// `jobledger serve` on a fresh SQLite file with `JOBLEDGER_ADMIN_TOKEN=token`.
fn serve_with_admin_token(
    folder: &Path,
    listen: SocketAddr,
    token: &str,
) -> tokio::process::Command {
    let database_url = format!("sqlite:{}", folder.join("jobledger.db").display());
    let mut command = tokio::process::Command::new(env!("CARGO_BIN_EXE_jobledger"));
    command
        .args(["serve", "--workers", "0", "--listen", &listen.to_string()])
        .args(["--database-url", &database_url])
        .env("JOBLEDGER_ADMIN_TOKEN", token)
        .env_remove("JOBLEDGER_CONFIG")
        .kill_on_drop(true);
    command
}

#[tokio::test]
async fn an_admin_token_under_32_characters_or_with_whitespace_inside_stops_serve() {
    let folder = tempfile::tempdir().unwrap();
    let listen: SocketAddr = "127.0.0.1:9".parse().unwrap();
    for (token, problem) in [
        ("short-admin-token", "at least 32"),
        ("   thirty-one-characters-long-xx   ", "at least 32"),
        (
            "a-token-of-more-than-32-characters\nwith-a-line-break",
            "whitespace",
        ),
    ] {
        let output = tokio::time::timeout(
            Duration::from_secs(30),
            serve_with_admin_token(folder.path(), listen, token).output(),
        )
        .await
        .expect("serve exits at once")
        .expect("the binary runs");
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert!(!output.status.success(), "{token:?} was accepted: {stderr}");
        assert!(
            stderr.contains("JOBLEDGER_ADMIN_TOKEN") && stderr.contains(problem),
            "{token:?}: {stderr}"
        );
        assert!(
            !stderr.contains(token.trim()),
            "the refusal must not print the token: {stderr}"
        );
    }
    assert!(
        !folder.path().join("jobledger.db").exists(),
        "refused before the database is touched"
    );
}

#[tokio::test]
async fn an_admin_token_of_32_characters_serves_admins() {
    let folder = tempfile::tempdir().unwrap();
    let listen = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap();
    let token = "0123456789abcdef0123456789abcdef";
    assert_eq!(token.len(), 32);
    let mut serve = serve_with_admin_token(folder.path(), listen, &format!(" {token}\n"))
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let http = reqwest::Client::new();
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    let response: serde_json::Value = loop {
        let sent = http
            .post(format!("http://{listen}/graphql"))
            .bearer_auth(token)
            .json(
                &json!({"query": "mutation { createTenant(name: \"acme\") { tenant { name } } }"}),
            )
            .send()
            .await;
        if let Ok(answer) = sent {
            break answer.json().await.unwrap();
        }
        assert!(
            serve.try_wait().unwrap().is_none(),
            "serve exited with a 32-character token"
        );
        assert!(std::time::Instant::now() < deadline, "serve never listened");
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    assert_eq!(
        response["data"]["createTenant"]["tenant"]["name"], "acme",
        "{response}"
    );
    serve.kill().await.unwrap();
}
