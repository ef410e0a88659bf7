//! The files an operator deploys beside the binary: the Prometheus alert rules pass
//! `promtool check rules` (when promtool is installed; scripts/test installs it) and a
//! structural check, and every metric they and the Grafana dashboard query exists in
//! a real scrape.

use crate::helpers::{Backend, job_input, spawn_app};
use std::collections::BTreeSet;
use std::path::PathBuf;
use std::time::Duration;

fn deployed(path: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("deploy")
        .join(path)
}

/// Every `jobledger_…` name in `text`, histogram series reduced to their metric.
fn metric_names(text: &str) -> BTreeSet<String> {
    let mut names = BTreeSet::new();
    let mut rest = text;
    while let Some(start) = rest.find("jobledger_") {
        let tail = &rest[start..];
        let end = tail
            .find(|character: char| !(character.is_ascii_alphanumeric() || character == '_'))
            .unwrap_or(tail.len());
        let name = &tail[..end];
        let metric = ["_bucket", "_sum", "_count"]
            .iter()
            .find_map(|suffix| name.strip_suffix(suffix))
            .filter(|metric| metric.ends_with("_seconds"))
            .unwrap_or(name);
        names.insert(metric.to_owned());
        rest = &tail[end..];
    }
    names
}

#[test]
fn the_alert_rules_are_valid() {
    let path = deployed("prometheus/alerts.yml");
    let rules: serde_yaml::Value =
        serde_yaml::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
    let groups = rules["groups"].as_sequence().expect("a list of groups");
    let mut alerts = BTreeSet::new();
    for group in groups {
        assert!(group["name"].as_str().is_some(), "a group without a name");
        for rule in group["rules"].as_sequence().expect("rules") {
            let alert = rule["alert"].as_str().expect("an alert name");
            assert!(rule["expr"].as_str().is_some(), "{alert} has no expr");
            assert!(rule["labels"]["severity"].as_str().is_some(), "{alert}");
            assert!(rule["annotations"]["summary"].as_str().is_some(), "{alert}");
            assert!(alerts.insert(alert.to_owned()), "{alert} twice");
        }
    }
    for expected in [
        "JobledgerQueueStuck",
        "JobledgerUnknownOutcomeRate",
        "JobledgerLeaseExpirations",
        "JobledgerWebhookFailures",
        "JobledgerTenantsLowOnCredit",
        "JobledgerProviderBatchOverdue",
    ] {
        assert!(alerts.contains(expected), "{expected} missing");
    }
    match std::process::Command::new("promtool")
        .args(["check", "rules"])
        .arg(&path)
        .output()
    {
        Ok(output) => {
            assert!(
                output.status.success(),
                "promtool refused the rules:\n{}{}",
                String::from_utf8_lossy(&output.stdout),
                String::from_utf8_lossy(&output.stderr)
            );
            // The rules' own unit tests: alerts fire in the scenarios operators expect
            // (a queue stuck before any worker finished an attempt included).
            let tested = std::process::Command::new("promtool")
                .args(["test", "rules", "alerts_test.yml"])
                .current_dir(path.parent().unwrap())
                .output()
                .unwrap();
            assert!(
                tested.status.success(),
                "the rules' tests failed:\n{}{}",
                String::from_utf8_lossy(&tested.stdout),
                String::from_utf8_lossy(&tested.stderr)
            );
        }
        Err(error) if error.kind() == std::io::ErrorKind::NotFound => {
            eprintln!("promtool is not installed: only the structure of the rules was checked");
        }
        Err(error) => panic!("running promtool: {error}"),
    }
}

#[test]
fn the_dashboard_is_grafana_json_with_the_panels_operators_need() {
    let dashboard: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(deployed("grafana/jobledger.json")).unwrap())
            .unwrap();
    let titles: Vec<&str> = dashboard["panels"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|panel| panel["type"] == "row")
        .map(|panel| panel["title"].as_str().unwrap())
        .collect();
    assert_eq!(
        titles,
        [
            "Queue",
            "Latency",
            "Cost and margin",
            "Health",
            "Flow control"
        ]
    );
    for panel in dashboard["panels"].as_array().unwrap() {
        if panel["type"] != "row" {
            assert!(!panel["targets"].as_array().unwrap().is_empty(), "{panel}");
        }
    }
}

/// A scrape after a job succeeded and another was retried shows every series the
/// dashboard and the alerts query.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_metric_the_dashboard_and_alerts_query_is_exported() {
    let app = spawn_app(Backend::Sqlite).await;
    let tenant = app.funded_tenant("scraped", "10").await;
    let plain = app.create_job_ok(&tenant, job_input("plain", "hi")).await;
    let retried = app
        .create_job_ok(
            &tenant,
            job_input("retried", "[mock:status=503] [mock:fail_first=1]"),
        )
        .await;
    for id in [plain, retried] {
        app.wait_until_finished(&tenant, id, Duration::from_secs(30))
            .await;
    }
    let scrape = reqwest::get(format!("http://{}/metrics", app.address))
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    let exported = metric_names(&scrape);
    for name in jobledger::metrics::ALL {
        assert!(exported.contains(*name), "{name} is not exported");
    }
    for file in ["prometheus/alerts.yml", "grafana/jobledger.json"] {
        let queried = metric_names(&std::fs::read_to_string(deployed(file)).unwrap());
        assert!(!queried.is_empty());
        // Labelled by what happened (a model, a deferral's reason): their series
        // exist once it has, which a plain run does not cause.
        let occasional = [
            jobledger::metrics::FLOW_DEFERRALS,
            jobledger::metrics::MODEL_PAUSES,
        ];
        let missing: Vec<_> = queried
            .difference(&exported)
            .filter(|name| !occasional.contains(&name.as_str()))
            .collect();
        assert!(
            missing.is_empty(),
            "{file} queries unknown metrics {missing:?}"
        );
    }
}
