//! Prometheus metrics of one process: what it created, ran, charged and delivered, and
//! how long that took.
//!
//! Each application owns its recorder (no global one): tests run many applications in
//! one process, and each scrape must show its own application's numbers only. Labels
//! are bounded sets (status, outcome, model, provider, retry class, delivery result),
//! never job or tenant ids.
//!
//! Money counters are kept exactly, in nanocredits, and rendered as credits: the
//! `metrics` crate counts in whole numbers only.

use entity::Credits;
use metrics::{Counter, Gauge, Histogram, Key, Label, Metadata, Recorder, SharedString, Unit};
use metrics_exporter_prometheus::{PrometheusBuilder, PrometheusHandle, PrometheusRecorder};
use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::sync::atomic::{AtomicI64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

/// Jobs created (idempotent replays are not counted).
pub const JOBS_CREATED: &str = "jobledger_jobs_created_total";
/// Jobs that reached a terminal status, by `status`.
pub const JOBS_FINISHED: &str = "jobledger_jobs_finished_total";
/// Finished provider attempts, by `outcome`, `model` and `provider`.
pub const PROVIDER_ATTEMPTS: &str = "jobledger_provider_attempts_total";
/// Attempts whose call was sent and never answered: they may have been billed.
pub const UNKNOWN_OUTCOMES: &str = "jobledger_provider_unknown_outcomes_total";
/// Attempts taken back because their worker stopped renewing the lease.
pub const LEASE_EXPIRED: &str = "jobledger_lease_expired_total";
/// Jobs queued again after an attempt, by `class` (the error code that caused it, as
/// the API shows it: `PROVIDER_UNAVAILABLE`, `LEASE_EXPIRED`, …).
pub const JOB_RETRIES: &str = "jobledger_job_retries_total";
/// What providers bill for the attempts this process finished (the bound where the
/// exact cost is unknown), by `model` and `provider`.
pub const PROVIDER_COST: &str = "jobledger_provider_cost_credits_total";
/// What customers are charged for the attempts this process finished, by `model`
/// and `provider`.
pub const CUSTOMER_CHARGES: &str = "jobledger_customer_charges_credits_total";
/// Webhook delivery tries, by `result` (`success` or `failure`).
pub const WEBHOOK_DELIVERIES: &str = "jobledger_webhook_deliveries_total";
/// Claims that left due jobs queued for a budget, by `scope` (`provider`, `model`,
/// `tenant`) and `reason` (`requests`, `tokens`, `concurrency`, `paused`).
pub const FLOW_DEFERRALS: &str = "jobledger_flow_deferrals_total";
/// 429 answers that paused a model for every worker, by `model`.
pub const MODEL_PAUSES: &str = "jobledger_model_pauses_total";
/// From a job's creation to its first claim.
pub const QUEUE_WAIT: &str = "jobledger_queue_wait_seconds";
/// One provider attempt, from the call's start to its end.
pub const ATTEMPT_DURATION: &str = "jobledger_attempt_duration_seconds";
/// From a job's creation to its terminal status, for jobs ended by an attempt.
pub const END_TO_END: &str = "jobledger_job_end_to_end_seconds";
/// One `createJob` mutation, as the API handled it.
pub const CREATE_JOB_LATENCY: &str = "jobledger_create_job_latency_seconds";
/// One claim query of a worker loop.
pub const CLAIM_LATENCY: &str = "jobledger_claim_latency_seconds";
/// Jobs queued in the database and due to start now (the same figure from every
/// process: use `max`).
pub const JOBS_QUEUED: &str = "jobledger_jobs_queued";
/// Jobs queued in the database for later: a `runAt` or a retry's wait ahead (the same
/// figure from every process: use `max`). Apart from [`JOBS_QUEUED`], so that an alert
/// on jobs that wait for a worker does not fire for jobs that wait for their time.
pub const JOBS_SCHEDULED: &str = "jobledger_jobs_scheduled";
/// Jobs running in the database (the same figure from every process: use `max`).
pub const JOBS_RUNNING: &str = "jobledger_jobs_running";
/// Provider calls this process is waiting on.
pub const PROVIDER_CALLS_IN_FLIGHT: &str = "jobledger_provider_calls_in_flight";
/// Live GraphQL subscriptions this process serves.
pub const OPEN_SUBSCRIPTIONS: &str = "jobledger_open_subscriptions";
/// Database connections checked out of this process's pools, by `pool`.
pub const POOL_CONNECTIONS_IN_USE: &str = "jobledger_pool_connections_in_use";
/// Tenants with less than a tenth of the credit ever granted to them left to spend
/// (the same figure from every process: use `max`).
pub const TENANTS_LOW_CREDIT: &str = "jobledger_tenants_low_credit";
/// 1 when this process's last scrape could read the database, 0 when it could not: a
/// process that answers its scrape while its database is away still pages.
pub const DATABASE_UP: &str = "jobledger_database_up";

/// Provider batch rows by `state` (`preparing`, `uploading`, `submitted`,
/// `cancelling`, `ended`, `settled`, `abandoned`, `unknown`; the same figure from
/// every process: use `max`).
pub const PROVIDER_BATCHES: &str = "jobledger_provider_batches";
/// Items of closed PROVIDER_BATCH batches not finished yet: queued for a provider
/// batch, or in one waiting for its results (the same figure from every process).
pub const PROVIDER_BATCH_ITEMS_WAITING: &str = "jobledger_provider_batch_items_waiting";
/// Seconds since the oldest of those items' batch was closed; 0 when none waits.
pub const PROVIDER_BATCH_OLDEST_ITEM_AGE: &str =
    "jobledger_provider_batch_oldest_waiting_item_age_seconds";
/// Seconds since the oldest provider batch that has not ended yet (preparing to
/// submitted, or cancelling) was created; 0 when there is none. Past the providers'
/// completion window (24 h) something is wrong: the alert on it pages.
pub const PROVIDER_BATCH_OLDEST_AGE: &str = "jobledger_provider_batch_oldest_open_age_seconds";

/// Every metric name this process exposes, for documentation and tests.
pub const ALL: &[&str] = &[
    JOBS_CREATED,
    JOBS_FINISHED,
    PROVIDER_ATTEMPTS,
    UNKNOWN_OUTCOMES,
    LEASE_EXPIRED,
    JOB_RETRIES,
    PROVIDER_COST,
    CUSTOMER_CHARGES,
    WEBHOOK_DELIVERIES,
    QUEUE_WAIT,
    ATTEMPT_DURATION,
    END_TO_END,
    CREATE_JOB_LATENCY,
    CLAIM_LATENCY,
    JOBS_QUEUED,
    JOBS_SCHEDULED,
    JOBS_RUNNING,
    PROVIDER_CALLS_IN_FLIGHT,
    OPEN_SUBSCRIPTIONS,
    POOL_CONNECTIONS_IN_USE,
    TENANTS_LOW_CREDIT,
    DATABASE_UP,
    PROVIDER_BATCHES,
    PROVIDER_BATCH_ITEMS_WAITING,
    PROVIDER_BATCH_OLDEST_ITEM_AGE,
    PROVIDER_BATCH_OLDEST_AGE,
];

/// Histogram buckets, in seconds: from a fast database query to a long model call.
const BUCKETS: &[f64] = &[
    0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0,
    900.0, 3600.0,
];

/// How a webhook delivery try ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DeliveryResult {
    /// The endpoint answered 2xx in time.
    Success,
    /// Anything else: the delivery is retried from the outbox.
    Failure,
}

impl DeliveryResult {
    fn label(self) -> &'static str {
        match self {
            Self::Success => "success",
            Self::Failure => "failure",
        }
    }
}

/// One finished provider attempt, as the metrics see it.
#[derive(Clone, Debug)]
pub struct AttemptFinished<'a> {
    /// The attempt's outcome, as stored (`succeeded`, `unknown`, …).
    pub outcome: &'a str,
    pub model: &'a str,
    pub provider: &'a str,
    pub duration: Duration,
    /// The exact cost, or the bound when the outcome is unknown.
    pub provider_cost: Credits,
    pub customer_charge: Credits,
    /// The outcome may have been billed without an answer.
    pub unknown: bool,
}

/// The metrics of one process. Cheap to clone.
#[derive(Clone)]
pub struct Metrics {
    inner: Arc<Inner>,
}

struct Inner {
    recorder: PrometheusRecorder,
    handle: PrometheusHandle,
    provider_cost: Mutex<BTreeMap<(String, String), i64>>,
    customer_charges: Mutex<BTreeMap<(String, String), i64>>,
    in_flight: AtomicI64,
}

impl std::fmt::Debug for Metrics {
    fn fmt(&self, formatter: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        formatter.write_str("Metrics")
    }
}

impl Default for Metrics {
    fn default() -> Self {
        let recorder = PrometheusBuilder::new()
            .set_buckets(BUCKETS)
            .expect("the buckets are not empty")
            .build_recorder();
        let metrics = Self {
            inner: Arc::new(Inner {
                handle: recorder.handle(),
                recorder,
                provider_cost: Mutex::default(),
                customer_charges: Mutex::default(),
                in_flight: AtomicI64::new(0),
            }),
        };
        metrics.describe();
        metrics
    }
}

static METADATA: Metadata<'static> =
    Metadata::new(module_path!(), metrics::Level::INFO, Some(module_path!()));

impl Metrics {
    /// Help lines, and the counters that start at zero, so that a fresh process
    /// already shows every series dashboards and alerts query.
    fn describe(&self) {
        let recorder = &self.inner.recorder;
        for (name, help) in [
            (
                JOBS_CREATED,
                "Jobs created (idempotent replays not counted)",
            ),
            (JOBS_FINISHED, "Jobs that reached a terminal status"),
            (PROVIDER_ATTEMPTS, "Finished provider attempts"),
            (UNKNOWN_OUTCOMES, "Provider calls sent and never answered"),
            (
                LEASE_EXPIRED,
                "Attempts taken back after their lease lapsed",
            ),
            (JOB_RETRIES, "Jobs queued again after an attempt"),
            (WEBHOOK_DELIVERIES, "Webhook delivery tries"),
            (
                FLOW_DEFERRALS,
                "Claims that left due jobs queued for a rate limit, a concurrency bound or a paused model",
            ),
            (
                MODEL_PAUSES,
                "Provider 429 answers that paused a model for every worker",
            ),
        ] {
            recorder.describe_counter(name.into(), None, SharedString::const_str(help));
        }
        for (name, help) in [
            (QUEUE_WAIT, "From a job's creation to its first claim"),
            (ATTEMPT_DURATION, "One provider attempt"),
            (END_TO_END, "From a job's creation to its end"),
            (CREATE_JOB_LATENCY, "One createJob mutation"),
            (CLAIM_LATENCY, "One claim query of a worker loop"),
        ] {
            recorder.describe_histogram(
                name.into(),
                Some(Unit::Seconds),
                SharedString::const_str(help),
            );
        }
        for (name, help) in [
            (JOBS_QUEUED, "Jobs queued in the database and due to start"),
            (
                JOBS_SCHEDULED,
                "Jobs queued in the database to start later (runAt or a retry's wait)",
            ),
            (JOBS_RUNNING, "Jobs running in the database"),
            (
                PROVIDER_CALLS_IN_FLIGHT,
                "Provider calls this process waits on",
            ),
            (
                OPEN_SUBSCRIPTIONS,
                "Live GraphQL subscriptions of this process",
            ),
            (POOL_CONNECTIONS_IN_USE, "Database connections checked out"),
            (
                TENANTS_LOW_CREDIT,
                "Tenants with under a tenth of their granted credit left",
            ),
            (
                DATABASE_UP,
                "Whether this process could read the database at its last scrape",
            ),
            (PROVIDER_BATCHES, "Provider batches by state"),
            (
                PROVIDER_BATCH_ITEMS_WAITING,
                "Items of closed PROVIDER_BATCH batches waiting to be sent or for their results",
            ),
            (
                PROVIDER_BATCH_OLDEST_ITEM_AGE,
                "Seconds since the batch of the oldest item waiting for a provider batch was closed",
            ),
            (
                PROVIDER_BATCH_OLDEST_AGE,
                "Seconds since the oldest provider batch not ended yet was created",
            ),
        ] {
            recorder.describe_gauge(name.into(), None, SharedString::const_str(help));
        }
        self.counter(JOBS_CREATED, &[]).increment(0);
        self.counter(UNKNOWN_OUTCOMES, &[]).increment(0);
        self.counter(LEASE_EXPIRED, &[]).increment(0);
        for status in ["succeeded", "failed", "cancelled"] {
            self.counter(JOBS_FINISHED, &[("status", status)])
                .increment(0);
        }
        for result in [DeliveryResult::Success, DeliveryResult::Failure] {
            self.counter(WEBHOOK_DELIVERIES, &[("result", result.label())])
                .increment(0);
        }
        self.gauge(PROVIDER_CALLS_IN_FLIGHT, &[]).set(0.0);
    }

    fn key(name: &'static str, labels: &[(&'static str, &str)]) -> Key {
        let labels: Vec<Label> = labels
            .iter()
            .map(|(key, value)| Label::new(*key, value.to_string()))
            .collect();
        Key::from_parts(name, labels)
    }

    fn counter(&self, name: &'static str, labels: &[(&'static str, &str)]) -> Counter {
        self.inner
            .recorder
            .register_counter(&Self::key(name, labels), &METADATA)
    }

    fn gauge(&self, name: &'static str, labels: &[(&'static str, &str)]) -> Gauge {
        self.inner
            .recorder
            .register_gauge(&Self::key(name, labels), &METADATA)
    }

    fn histogram(&self, name: &'static str) -> Histogram {
        self.inner
            .recorder
            .register_histogram(&Self::key(name, &[]), &METADATA)
    }

    /// A `createJob` mutation took `latency`; `created` is false for a replay.
    pub fn create_job_handled(&self, latency: Duration, created: bool) {
        self.histogram(CREATE_JOB_LATENCY).record(latency);
        if created {
            self.counter(JOBS_CREATED, &[]).increment(1);
        }
    }

    /// A worker loop's claim query took `latency`.
    pub fn claimed(&self, latency: Duration) {
        self.histogram(CLAIM_LATENCY).record(latency);
    }

    /// A job was claimed for the first time, `wait` after it was created.
    pub fn first_claim(&self, wait: Duration) {
        self.histogram(QUEUE_WAIT).record(wait);
    }

    /// A provider attempt ended and was recorded.
    pub fn attempt_finished(&self, attempt: &AttemptFinished<'_>) {
        let labels = [
            ("outcome", attempt.outcome),
            ("model", attempt.model),
            ("provider", attempt.provider),
        ];
        self.counter(PROVIDER_ATTEMPTS, &labels).increment(1);
        if attempt.unknown {
            self.counter(UNKNOWN_OUTCOMES, &[]).increment(1);
        }
        self.histogram(ATTEMPT_DURATION).record(attempt.duration);
        let key = (attempt.model.to_owned(), attempt.provider.to_owned());
        for (totals, amount) in [
            (&self.inner.provider_cost, attempt.provider_cost),
            (&self.inner.customer_charges, attempt.customer_charge),
        ] {
            let mut totals = totals.lock().unwrap_or_else(PoisonError::into_inner);
            let total = totals.entry(key.clone()).or_default();
            *total = total.saturating_add(amount.nanos());
        }
    }

    /// A job reached `status` (`succeeded`, `failed` or `cancelled`); `end_to_end`
    /// is its time since creation, when known.
    pub fn job_finished(&self, status: &str, end_to_end: Option<Duration>) {
        self.counter(JOBS_FINISHED, &[("status", status)])
            .increment(1);
        if let Some(elapsed) = end_to_end {
            self.histogram(END_TO_END).record(elapsed);
        }
    }

    /// A job was queued again, because of `class` (an error code).
    pub fn job_retried(&self, class: &str) {
        self.counter(JOB_RETRIES, &[("class", class)]).increment(1);
    }

    /// A claim left due jobs queued because `scope`'s budget was short for `reason`.
    pub fn flow_deferred(&self, scope: &str, reason: &str) {
        self.counter(FLOW_DEFERRALS, &[("scope", scope), ("reason", reason)])
            .increment(1);
    }

    /// A provider's 429 paused `model` for every worker.
    pub fn model_paused(&self, model: &str) {
        self.counter(MODEL_PAUSES, &[("model", model)]).increment(1);
    }

    /// An attempt was taken back after its lease lapsed.
    pub fn lease_expired(&self) {
        self.counter(LEASE_EXPIRED, &[]).increment(1);
    }

    /// A webhook delivery try ended with `result`. For the webhook sender.
    pub fn webhook_delivered(&self, result: DeliveryResult) {
        self.counter(WEBHOOK_DELIVERIES, &[("result", result.label())])
            .increment(1);
    }

    /// Counts a provider call as in flight until the returned guard is dropped.
    pub fn provider_call(&self) -> InFlight {
        let now = self.inner.in_flight.fetch_add(1, Ordering::Relaxed) + 1;
        self.gauge(PROVIDER_CALLS_IN_FLIGHT, &[]).set(now as f64);
        InFlight {
            metrics: self.clone(),
        }
    }

    /// Records whether the database could be read for this scrape.
    pub fn set_database_up(&self, up: bool) {
        self.gauge(DATABASE_UP, &[]).set(if up { 1.0 } else { 0.0 });
    }

    /// Sets the gauges read from the database (by the background refresher).
    pub fn set_stored_state(&self, state: &StoredState) {
        self.gauge(JOBS_QUEUED, &[]).set(state.queued as f64);
        self.gauge(JOBS_SCHEDULED, &[]).set(state.scheduled as f64);
        self.gauge(JOBS_RUNNING, &[]).set(state.running as f64);
        self.gauge(TENANTS_LOW_CREDIT, &[])
            .set(state.tenants_low_credit as f64);
        let batches = &state.provider_batches;
        for (provider_state, count) in &batches.by_state {
            self.gauge(PROVIDER_BATCHES, &[("state", provider_state.as_str())])
                .set(*count as f64);
        }
        self.gauge(PROVIDER_BATCH_ITEMS_WAITING, &[])
            .set(batches.items_waiting as f64);
        self.gauge(PROVIDER_BATCH_OLDEST_ITEM_AGE, &[])
            .set(batches.oldest_item_wait.as_secs_f64());
        self.gauge(PROVIDER_BATCH_OLDEST_AGE, &[])
            .set(batches.oldest_open_age.as_secs_f64());
    }

    /// Sets the gauges this process knows without a query, at scrape time.
    pub fn set_live_state(&self, state: &LiveState) {
        self.gauge(OPEN_SUBSCRIPTIONS, &[])
            .set(state.open_subscriptions as f64);
        for (pool, in_use) in &state.pools_in_use {
            self.gauge(POOL_CONNECTIONS_IN_USE, &[("pool", pool)])
                .set(*in_use as f64);
        }
    }

    /// The Prometheus text format of everything recorded so far.
    pub fn render(&self) -> String {
        let mut output = self.inner.handle.render();
        for (name, help, totals) in [
            (
                PROVIDER_COST,
                "What providers bill for the attempts this process finished, in credits",
                &self.inner.provider_cost,
            ),
            (
                CUSTOMER_CHARGES,
                "What customers are charged for the attempts this process finished, in credits",
                &self.inner.customer_charges,
            ),
        ] {
            let totals = totals.lock().unwrap_or_else(PoisonError::into_inner);
            let _ = writeln!(output, "# HELP {name} {help}");
            let _ = writeln!(output, "# TYPE {name} counter");
            if totals.is_empty() {
                let _ = writeln!(output, "{name} 0");
            }
            for ((model, provider), nanos) in totals.iter() {
                let credits = Credits::from_nanos(*nanos).to_decimal();
                let _ = writeln!(
                    output,
                    "{name}{{model=\"{}\",provider=\"{}\"}} {credits}",
                    escape(model),
                    escape(provider)
                );
            }
            output.push('\n');
        }
        output
    }
}

/// A label value as the text format wants it.
fn escape(value: &str) -> String {
    value
        .replace('\\', "\\\\")
        .replace('"', "\\\"")
        .replace('\n', "\\n")
}

/// The gauges read from the database, every few seconds rather than per scrape.
#[derive(Clone, Debug, Default)]
pub struct StoredState {
    /// Queued and due.
    pub queued: u64,
    /// Queued for later.
    pub scheduled: u64,
    pub running: u64,
    pub tenants_low_credit: u64,
    pub provider_batches: ProviderBatchGauges,
}

/// The provider-batch gauges, read from the database with the others.
#[derive(Clone, Debug, Default)]
pub struct ProviderBatchGauges {
    /// Every state with its count of rows, zeros included, so that each series exists.
    pub by_state: Vec<(entity::ProviderBatchState, u64)>,
    pub items_waiting: u64,
    /// Since the oldest waiting item's batch was closed.
    pub oldest_item_wait: Duration,
    /// Since the oldest provider batch not ended yet was created.
    pub oldest_open_age: Duration,
}

/// The gauges this process knows in memory, read at each scrape.
#[derive(Clone, Debug, Default)]
pub struct LiveState {
    pub open_subscriptions: usize,
    /// Connections in use, by pool name (`api`, `worker`, `background`).
    pub pools_in_use: Vec<(&'static str, u32)>,
}

/// A provider call in flight; dropping it ends the count.
pub struct InFlight {
    metrics: Metrics,
}

impl Drop for InFlight {
    fn drop(&mut self) {
        let now = self.metrics.inner.in_flight.fetch_sub(1, Ordering::Relaxed) - 1;
        self.metrics
            .gauge(PROVIDER_CALLS_IN_FLIGHT, &[])
            .set(now as f64);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_instance_counts_for_itself_and_money_is_exact() {
        let one = Metrics::default();
        let other = Metrics::default();
        one.create_job_handled(Duration::from_millis(3), true);
        one.create_job_handled(Duration::from_millis(3), false);
        one.attempt_finished(&AttemptFinished {
            outcome: "succeeded",
            model: "gpt-4o-mini",
            provider: "simulator",
            duration: Duration::from_millis(10),
            provider_cost: Credits::from_nanos(1),
            customer_charge: Credits::from_nanos(1_250_000_001),
            unknown: false,
        });
        let text = one.render();
        assert!(text.contains("jobledger_jobs_created_total 1\n"), "{text}");
        assert!(
            text.contains("jobledger_create_job_latency_seconds_count 2\n"),
            "{text}"
        );
        assert!(
            text.contains(
                "jobledger_provider_cost_credits_total{model=\"gpt-4o-mini\",provider=\"simulator\"} 0.000000001\n"
            ),
            "{text}"
        );
        assert!(
            text.contains(
                "jobledger_customer_charges_credits_total{model=\"gpt-4o-mini\",provider=\"simulator\"} 1.250000001\n"
            ),
            "{text}"
        );
        assert!(other.render().contains("jobledger_jobs_created_total 0\n"));
        {
            let _call = one.provider_call();
            assert!(
                one.render()
                    .contains("jobledger_provider_calls_in_flight 1\n")
            );
        }
        assert!(
            one.render()
                .contains("jobledger_provider_calls_in_flight 0\n")
        );
    }
}
