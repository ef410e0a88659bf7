//! `scripts/batch-upload.sh`, the README's worked example, run by bash against a served
//! instance (the built-in simulator answering): 1,200 documents uploaded in chunks of
//! 1,000, the batch closed and watched to FINISHED, the results downloaded; run again,
//! it finds the same batch and downloads the same results.

use crate::helpers::{AppOptions, Backend, spawn_app_with, test_worker_settings};
use jobledger::jobs::worker::WorkerSettings;
use serde_json::{Value, json};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_batch_upload_script_uploads_watches_and_downloads() {
    let app = spawn_app_with(
        Backend::Sqlite,
        AppOptions::workers(WorkerSettings {
            concurrency: 16,
            ..test_worker_settings()
        }),
    )
    .await;
    let tenant = app.funded_tenant("script", "100").await;
    let folder = tempfile::tempdir().unwrap();
    let input = folder.path().join("documents.jsonl");
    let documents: Vec<String> = (0..1_200)
        .map(|number| {
            json!({
                "id": format!("doc-{number}"),
                "text": format!("Document {number}: \"quoted\", a backslash \\ and\na second line."),
            })
            .to_string()
        })
        .collect();
    std::fs::write(&input, documents.join("\n") + "\n").unwrap();
    let script = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("scripts/batch-upload.sh");
    let run = |output: std::path::PathBuf| {
        tokio::process::Command::new("bash")
            .arg(&script)
            .arg(&input)
            .arg(output)
            .env("JOBLEDGER_URL", app.url().trim_end_matches("/graphql"))
            .env("JOBLEDGER_KEY", &tenant.key)
            .env("JOBLEDGER_POLL_SECONDS", "0.5")
            .output()
    };
    let first = folder.path().join("results.jsonl");
    let output = tokio::time::timeout(std::time::Duration::from_secs(300), run(first.clone()))
        .await
        .expect("the script finishes within 5 minutes")
        .expect("bash runs");
    let printed = String::from_utf8_lossy(&output.stdout).into_owned();
    assert!(
        output.status.success(),
        "the script failed:\n{printed}\n{}",
        String::from_utf8_lossy(&output.stderr)
    );
    for line in [
        "added 1000, replayed 0, 1000 items",
        "added 200, replayed 0, 1200 items",
        "FINISHED: 1200/1200 finished",
        "1200 lines, 1200 succeeded",
    ] {
        assert!(printed.contains(line), "{line} in {printed}");
    }
    let results: Vec<Value> = std::fs::read_to_string(&first)
        .unwrap()
        .lines()
        .map(|line| serde_json::from_str(line).unwrap())
        .collect();
    assert_eq!(results.len(), 1_200);
    for (number, result) in results.iter().enumerate() {
        assert_eq!(result["customId"], format!("doc-{number}"));
        assert_eq!(result["status"], "SUCCEEDED");
    }

    // Again: the same batch, nothing uploaded, the same results.
    let second = folder.path().join("again.jsonl");
    let output = run(second.clone()).await.expect("bash runs");
    let printed = String::from_utf8_lossy(&output.stdout).into_owned();
    assert!(output.status.success(), "{printed}");
    assert!(!printed.contains("added"), "{printed}");
    assert_eq!(
        std::fs::read_to_string(&second).unwrap(),
        std::fs::read_to_string(&first).unwrap()
    );
}
