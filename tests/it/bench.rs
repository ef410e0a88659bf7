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

/// `jobledger bench --scenario batch` enqueues a small batch (3,000 items, so 3 chunks
/// of 1,000 across the 4 clients) over addBatchItems next to its two baselines, drains
/// it to FINISHED and reports each figure with its ratio.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_batch_benchmark_enqueues_and_drains_a_batch() {
    let folder = tempfile::tempdir().unwrap();
    let report = folder.path().join("bench.json");
    let output = tokio::process::Command::new(env!("CARGO_BIN_EXE_jobledger"))
        .args([
            "bench",
            "--smoke",
            "--scenario",
            "batch",
            "--items",
            "3000",
            "--json",
        ])
        .arg(&report)
        .output()
        .await
        .expect("the binary runs");
    assert!(
        output.status.success(),
        "the benchmark failed: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    let report: Value = serde_json::from_slice(&std::fs::read(&report).unwrap()).unwrap();
    assert_eq!(report["scale"]["batch_items"], 3000);
    let figures = report["figures"].as_array().unwrap();
    let measure = |name: &str| {
        figures
            .iter()
            .find(|figure| figure["measure"] == name)
            .unwrap_or_else(|| panic!("{name} missing from {figures:?}"))
    };
    for name in [
        "bare SQL multi-row INSERT of 3000 job rows",
        "createJob at concurrency 32 (batch baseline)",
        "addBatchItems, 3000 items, 4 clients",
        "addBatchItems, 3000 items, vs bare SQL",
        "drain of a batch of 3000 items until FINISHED",
        "PROVIDER_BATCH of 3000 items through the simulator's batch API, end to end",
        "customer charge per item, realtime batch of 3000",
        "customer charge per item, PROVIDER_BATCH of 3000",
    ] {
        assert!(measure(name)["value"].as_f64().unwrap() > 0.0, "{name}");
    }
    // At the batch price (half the list price), with the customer price policy applied
    // to it, an item costs the customer half what it costs in a realtime batch.
    let saving = &measure("customer charge per item, PROVIDER_BATCH of 3000")["ratio"];
    assert_eq!(
        saving["of"],
        "customer charge per item, realtime batch of 3000"
    );
    let ratio = saving["value"].as_f64().unwrap();
    assert!((0.45..=0.55).contains(&ratio), "{saving}");
    assert_eq!(
        measure("PROVIDER_BATCH of 3000 items through the simulator's batch API, end to end")["ratio"]
            ["of"],
        "drain of a batch of 3000 items until FINISHED"
    );
    let versus_create = &measure("addBatchItems, 3000 items, 4 clients")["ratio"];
    assert_eq!(
        versus_create["of"],
        "createJob at concurrency 32 (batch baseline)"
    );
    assert!(versus_create["value"].as_f64().unwrap() > 0.0);
    assert!(
        figures.iter().all(|figure| figure["engine"] == "sqlite"
            && !figure["measure"].as_str().unwrap().starts_with("claim")),
        "only the batch scenario runs: {figures:?}"
    );
}
