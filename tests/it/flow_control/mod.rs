//! Flow control: provider and model rate limits that hold across worker processes,
//! tenant limits, tokens admitted by a job's bound, and a 429 that pauses a model for
//! every worker. Each scenario ends with the billing audit.

use crate::helpers::{
    AppOptions, Backend, TestApp, TestTenant, job_input, spawn_app_with, test_worker_settings,
};
use crate::invariants::assert_billing_invariants;
use entity::{Timestamp, attempts, rate_limit_buckets};
use jobledger::config::file::ConfigFile;
use jobledger::jobs::flow::TokenCounting;
use jobledger::jobs::worker::WorkerSettings;
use sea_orm::{ColumnTrait, EntityTrait, QueryFilter, QueryOrder};
use serde_json::{Value, json};
use std::path::{Path, PathBuf};
use std::time::Duration;
use uuid::Uuid;

mod held_buckets;
mod limits;
mod tokens;

/// A config file in a folder that lives as long as the returned guard.
fn config_file(text: &str) -> (tempfile::TempDir, PathBuf) {
    let folder = tempfile::tempdir().unwrap();
    let path = folder.path().join("jobledger.toml");
    std::fs::write(&path, text).unwrap();
    (folder, path)
}

fn with_config(path: &Path) -> AppOptions {
    AppOptions {
        config_file: Some(path.to_owned()),
        ..AppOptions::default()
    }
}

/// The API and one worker pool in one process, a second worker pool in another, both
/// reading `config`.
async fn two_worker_processes(backend: Backend, config: &Path) -> (TestApp, TestApp) {
    let first = spawn_app_with(backend, with_config(config)).await;
    let second = first.another_process(with_config(config)).await;
    (first, second)
}

/// Creates one job per input and waits until all are finished.
async fn run_all(app: &TestApp, tenant: &TestTenant, inputs: Vec<Value>) -> Vec<Uuid> {
    let mut ids = Vec::new();
    for input in inputs {
        ids.push(app.create_job_ok(tenant, input).await);
    }
    for id in &ids {
        let job = app
            .wait_until_finished(tenant, *id, Duration::from_secs(60))
            .await;
        assert_eq!(job["status"], "SUCCEEDED", "{job}");
    }
    ids
}

/// Every attempt of `jobs`, by start time.
async fn attempts_of(app: &TestApp, jobs: &[Uuid]) -> Vec<attempts::Model> {
    attempts::Entity::find()
        .filter(attempts::Column::JobId.is_in(jobs.iter().copied()))
        .order_by_asc(attempts::Column::StartedAt)
        .all(&app.app.db)
        .await
        .unwrap()
}

/// The largest total of `weight` over the starts in any window of `window` (starts
/// sorted): every window worth checking begins at a start.
fn busiest_window(starts: &[(Timestamp, f64)], window: Duration) -> f64 {
    let window = window.as_micros() as i64;
    starts
        .iter()
        .enumerate()
        .map(|(first, (from, _))| {
            starts[first..]
                .iter()
                .take_while(|(at, _)| at.micros() - from.micros() <= window)
                .map(|(_, weight)| weight)
                .sum()
        })
        .fold(0.0, f64::max)
}

/// `count` jobs of `tenant` at once, each with its own key.
fn inputs(prefix: &str, count: usize, content: &str) -> Vec<Value> {
    (0..count)
        .map(|index| job_input(&format!("{prefix}-{index}"), content))
        .collect()
}

#[test]
fn rate_limits_in_the_config_file_are_whole_positive_numbers() {
    let parse = |text: &str| ConfigFile::parse(text, Path::new("limits.toml"), |_| None);
    let config = parse(
        "[providers.sim]\nkind = \"simulator\"\ntokens_per_minute = 90000\n\n\
         [models.\"gpt-4o-mini\"]\nrequests_per_minute = 500\n",
    )
    .unwrap();
    assert_eq!(
        config.models["gpt-4o-mini"]
            .rate_limit
            .requests_per_minute
            .map(|count| count.get()),
        Some(500)
    );
    assert_eq!(
        config.providers["sim"]
            .rate_limit
            .tokens_per_minute
            .map(|count| count.get()),
        Some(90_000)
    );
    let counted = parse(
        "[providers.sim]\nkind = \"simulator\"\ntokens_counted = \"requested\"\n\n\
         [models.m]\ntokens_counted = \"used\"\n",
    )
    .unwrap();
    assert_eq!(
        counted.providers["sim"].rate_limit.tokens_counted,
        Some(TokenCounting::Requested)
    );
    assert_eq!(
        counted.models["m"].rate_limit.tokens_counted,
        Some(TokenCounting::Used)
    );
    for (text, key) in [
        (
            "[models.\"gpt-4o-mini\"]\nrequests_per_minute = 0\n",
            "models.gpt-4o-mini.requests_per_minute",
        ),
        (
            "[providers.sim]\nkind = \"simulator\"\ntokens_per_minute = -5\n",
            "providers.sim.tokens_per_minute",
        ),
        (
            "[models.\"gpt-4o-mini\"]\nrequests_per_minute = 99999999999\n",
            "models.gpt-4o-mini.requests_per_minute",
        ),
        (
            "[providers.sim]\nkind = \"simulator\"\ntokens_counted = \"billed\"\n",
            "providers.sim.tokens_counted",
        ),
    ] {
        let error = parse(text).unwrap_err().to_string();
        assert!(error.contains(key), "{error}");
    }
}
