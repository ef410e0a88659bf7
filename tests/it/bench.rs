//! `jobledger bench --smoke` runs every scenario end to end (tiny counts, so it says
//! nothing about speed) and its JSON report holds every figure.

use serde_json::Value;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_benchmark_harness_runs_every_scenario() {
    let folder = tempfile::tempdir().unwrap();
    let report = folder.path().join("bench.json");
    let mut command = tokio::process::Command::new(env!("CARGO_BIN_EXE_jobledger"));
    command.args(["bench", "--smoke", "--json"]).arg(&report);
    let postgres = crate::helpers::Backend::postgres().is_some();
    if let Ok(url) = std::env::var("TEST_DATABASE_URL")
        && postgres
    {
        command.args(["--postgres", &url]);
    }
    let output = command.output().await.expect("the binary runs");
    assert!(
        output.status.success(),
        "the benchmark failed: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    let table = String::from_utf8(output.stdout).unwrap();
    assert!(table.starts_with("| engine | measure |"), "{table}");
    let tables = table.matches("| engine | measure |").count();
    assert_eq!(
        tables,
        if postgres { 2 } else { 1 },
        "one table per engine: {table}"
    );
    let report: Value = serde_json::from_slice(&std::fs::read(&report).unwrap()).unwrap();
    let figures = report["figures"].as_array().unwrap();
    let engines: &[&str] = if postgres {
        &["sqlite", "postgres"]
    } else {
        &["sqlite"]
    };
    for engine in engines {
        let measures: Vec<&str> = figures
            .iter()
            .filter(|figure| figure["engine"] == *engine)
            .map(|figure| figure["measure"].as_str().unwrap())
            .collect();
        for expected in [
            "claim of 32, 2000 queued (median)",
            "bare SQL, one row per claim",
            "bare SQL, 50 rows per claim",
            "drain of 200 jobs, settled",
            "drain of 200 jobs with 2000 queued",
            "createJob at concurrency 32, p99",
            "pickup (created → attempt started), p99",
            "subscription delivery (event → client), p99",
            "50 in flight, 2 s calls",
            "50 in flight, server peak RSS",
            "300 idle subscriptions, server peak RSS",
            "one event to 300 subscriptions",
        ] {
            assert!(
                measures.contains(&expected),
                "{engine}: {expected} missing from {measures:?}"
            );
        }
        assert!(
            figures
                .iter()
                .filter(|figure| figure["engine"] == *engine)
                .all(|figure| figure["value"].as_f64().is_some_and(|value| value > 0.0)),
            "{engine}: every figure is measured"
        );
    }
}
