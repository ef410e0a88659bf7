//! What the queue and the workers tell the metrics: each function takes what the
//! caller already knows at that point (a claim, a recorded attempt, the notices of
//! committed events), so that recording costs the hot path no query.

use super::flow::Deferral;
use super::queue::{AttemptEnd, Claim};
use crate::billing::Credits;
use crate::bus::{EventBus, EventNotice};
use crate::metrics::{AttemptFinished, LiveState, Metrics, ProviderBatchGauges, StoredState};
use entity::JobErrorCode;
use entity::{
    AttemptOutcome, BatchMode, BatchStatus, EventKind, JobStatus, ProviderBatchState, Timestamp,
    batches, jobs, provider_batches, tenants,
};
use sea_orm::sea_query::{Expr, ExprTrait};
use sea_orm::{
    ColumnTrait, DatabaseConnection, DbErr, EntityTrait, Iterable, PaginatorTrait, QueryFilter,
    QuerySelect, QueryTrait,
};
use std::collections::HashMap;
use std::time::Duration;
use tokio_util::sync::CancellationToken;

/// A claim query took `latency` and returned `claims`: jobs claimed for the first
/// time report how long they waited since they were due.
pub fn claimed(metrics: &Metrics, latency: Duration, claims: &[Claim]) {
    metrics.claimed(latency);
    let now = Timestamp::now();
    for claim in claims.iter().filter(|claim| claim.job.attempt_count == 1) {
        let due = claim.job.run_at.map_or(claim.job.created_at, |run_at| {
            Ord::max(run_at, claim.job.created_at)
        });
        metrics.first_claim(elapsed(due, now));
    }
}

/// A claim left due jobs queued for each of `deferred`.
pub fn deferred<'a>(metrics: &Metrics, deferred: impl IntoIterator<Item = &'a Deferral>) {
    for deferral in deferred {
        metrics.flow_deferred(deferral.scope.as_str(), deferral.reason.as_str());
    }
}

/// What the metrics need of a finished attempt, taken before the attempt is handed
/// over to be recorded.
#[derive(Clone, Debug)]
pub struct AttemptTally {
    outcome: AttemptOutcome,
    model: String,
    provider: String,
    duration: Duration,
    provider_cost: Credits,
    customer_charge: Credits,
    /// The error code a retry is classed by, as the API shows it.
    retry_class: String,
    created_at: Timestamp,
}

impl AttemptTally {
    /// The facts of `end`. The cost is the one the attempt row records: exact with
    /// usage, zero when nothing can have been billed, the bound fixed at the start
    /// otherwise.
    pub fn of(end: &AttemptEnd) -> Self {
        let report = &end.report;
        let provider_cost = match (&report.usage, report.not_billed) {
            (Some(usage), _) => end.price.provider_cost(usage),
            (None, true) => Credits::ZERO,
            (None, false) => Credits::from_nanos(
                end.attempt
                    .provider_cost_upper_bound_nanos
                    .unwrap_or_default(),
            ),
        };
        Self {
            outcome: report.outcome,
            model: end.claim.job.model.clone(),
            provider: end.attempt.provider.clone(),
            duration: report.latency,
            provider_cost,
            customer_charge: report.customer_charge,
            retry_class: report.error.as_ref().map_or_else(
                || "UNSPECIFIED".to_owned(),
                |error| error.code.as_str().to_owned(),
            ),
            created_at: end.claim.job.created_at,
        }
    }
}

/// An attempt was recorded as `tally` says, and its job's new state committed with
/// `notices`.
pub fn attempt_finished(metrics: &Metrics, tally: &AttemptTally, notices: &[EventNotice]) {
    metrics.attempt_finished(&AttemptFinished {
        outcome: outcome_label(tally.outcome),
        model: &tally.model,
        provider: &tally.provider,
        duration: tally.duration,
        provider_cost: tally.provider_cost,
        customer_charge: tally.customer_charge,
        unknown: tally.outcome == AttemptOutcome::Unknown,
    });
    let end_to_end = elapsed(tally.created_at, Timestamp::now());
    job_events(metrics, notices, &tally.retry_class, Some(end_to_end));
}

/// A sweep took back the jobs of `notices` after their leases lapsed.
pub fn leases_expired(metrics: &Metrics, notices: &[EventNotice]) {
    for _ in notices {
        metrics.lease_expired();
    }
    job_events(metrics, notices, JobErrorCode::LeaseExpired.as_str(), None);
}

/// A job ended outside an attempt (abandoned by its worker, cancelled while queued).
pub fn job_ended(metrics: &Metrics, notices: &[EventNotice]) {
    job_events(metrics, notices, "UNSPECIFIED", None);
}

fn job_events(
    metrics: &Metrics,
    notices: &[EventNotice],
    retry_class: &str,
    end_to_end: Option<Duration>,
) {
    for notice in notices {
        match notice.kind {
            EventKind::RetryScheduled => metrics.job_retried(retry_class),
            kind if kind.is_terminal() => {
                metrics.job_finished(status_label(notice.status), end_to_end)
            }
            _ => {}
        }
    }
}

/// How often the gauges kept in the database are read again: a scrape serves the
/// last values, so that scrapes (anonymous, and as many as anyone sends) cost the
/// database nothing.
pub const GAUGE_REFRESH: Duration = Duration::from_secs(2);

/// Reads the gauges kept in the database: jobs queued (due, and for later) and
/// running (counts on the partial indexes the claim uses) and tenants low on credit.
pub async fn stored_state(db: &DatabaseConnection) -> Result<StoredState, DbErr> {
    let count = |status: JobStatus| {
        jobs::Entity::find()
            .filter(jobs::Column::Status.eq(status))
            .count(db)
    };
    let queued = count(JobStatus::Queued).await?;
    let scheduled = jobs::Entity::find()
        .filter(jobs::Column::Status.eq(JobStatus::Queued))
        .filter(jobs::Column::NextRunAt.gt(Timestamp::now()))
        .count(db)
        .await?;
    Ok(StoredState {
        // Two counts rather than one grouped read, so that each stays on the index;
        // a job coming due between them only moves one count by one for 2 s.
        queued: queued.saturating_sub(scheduled),
        scheduled,
        running: count(JobStatus::Running).await?,
        tenants_low_credit: tenants::Entity::find()
            .filter(tenants::Column::GrantedNanos.gt(0))
            .filter(
                crate::billing::balance::available_column()
                    .mul(10)
                    .lt(Expr::col(tenants::Column::GrantedNanos)),
            )
            .count(db)
            .await?,
        provider_batches: provider_batch_gauges(db).await?,
    })
}

/// Provider batch rows by state, the items of closed PROVIDER_BATCH batches still
/// waiting, and how long the oldest of those and the oldest open row have waited.
async fn provider_batch_gauges(db: &DatabaseConnection) -> Result<ProviderBatchGauges, DbErr> {
    let counted: HashMap<ProviderBatchState, i64> = provider_batches::Entity::find()
        .select_only()
        .column(provider_batches::Column::State)
        .column_as(Expr::col(provider_batches::Column::Id).count(), "rows")
        .group_by(provider_batches::Column::State)
        .into_tuple::<(ProviderBatchState, i64)>()
        .all(db)
        .await?
        .into_iter()
        .collect();
    let by_state = ProviderBatchState::iter()
        .map(|state| {
            let rows = counted.get(&state).copied().unwrap_or(0);
            (state, u64::try_from(rows).unwrap_or(0))
        })
        .collect();
    // A closed batch has unfinished items by definition: it is `finished` once none is.
    let closed = || {
        batches::Entity::find()
            .filter(batches::Column::Mode.eq(BatchMode::ProviderBatch))
            .filter(batches::Column::Status.eq(BatchStatus::Closed))
    };
    let items_waiting = jobs::Entity::find()
        .filter(jobs::Column::Status.is_in([JobStatus::Queued, JobStatus::Running]))
        .filter(
            jobs::Column::BatchId.in_subquery(
                closed()
                    .select_only()
                    .column(batches::Column::Id)
                    .into_query(),
            ),
        )
        .count(db)
        .await?;
    let oldest_closed: Option<Timestamp> = closed()
        .select_only()
        .expr(Expr::col(batches::Column::ClosedAt).min())
        .into_tuple::<Option<Timestamp>>()
        .one(db)
        .await?
        .flatten();
    let oldest_open: Option<Timestamp> = provider_batches::Entity::find()
        .select_only()
        .expr(Expr::col(provider_batches::Column::CreatedAt).min())
        .filter(
            provider_batches::Column::State.is_in(
                ProviderBatchState::iter()
                    .filter(|state| !state.is_final() && *state != ProviderBatchState::Ended),
            ),
        )
        .into_tuple::<Option<Timestamp>>()
        .one(db)
        .await?
        .flatten();
    let now = Timestamp::now();
    let age = |since: Option<Timestamp>| since.map_or(Duration::ZERO, |since| elapsed(since, now));
    Ok(ProviderBatchGauges {
        by_state,
        items_waiting,
        oldest_item_wait: age(oldest_closed),
        oldest_open_age: age(oldest_open),
    })
}

/// Reads the stored gauges into `metrics` at once and then every [`GAUGE_REFRESH`]
/// on `db` (a pool of the background tasks), until `shutdown` is cancelled.
pub async fn refresh_gauges(db: DatabaseConnection, metrics: Metrics, shutdown: CancellationToken) {
    let mut interval = tokio::time::interval(GAUGE_REFRESH);
    interval.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            () = shutdown.cancelled() => return,
            _ = interval.tick() => {}
        }
        // Bounded, so that a database that does not answer shows as down in seconds
        // rather than after the pool's acquire timeout.
        match tokio::time::timeout(GAUGE_REFRESH, stored_state(&db)).await {
            Ok(Ok(state)) => {
                metrics.set_stored_state(&state);
                metrics.set_database_up(true);
            }
            // The gauges keep their last values.
            Ok(Err(error)) => {
                tracing::warn!(error = %error, "reading the queue gauges failed");
                metrics.set_database_up(false);
            }
            Err(_) => {
                tracing::warn!(timeout = ?GAUGE_REFRESH, "reading the queue gauges timed out");
                metrics.set_database_up(false);
            }
        }
    }
}

/// The gauges this process knows without a query: subscriptions and pool
/// connections in use.
pub fn live_state(bus: &EventBus, pools: &[(&'static str, DatabaseConnection)]) -> LiveState {
    LiveState {
        open_subscriptions: bus.open_subscriptions(),
        pools_in_use: pools
            .iter()
            .map(|(name, pool)| (*name, connections_in_use(pool)))
            .collect(),
    }
}

fn connections_in_use(db: &DatabaseConnection) -> u32 {
    match db.get_database_backend() {
        sea_orm::DbBackend::Postgres => {
            let pool = db.get_postgres_connection_pool();
            pool.size().saturating_sub(pool.num_idle() as u32)
        }
        _ => {
            let pool = db.get_sqlite_connection_pool();
            pool.size().saturating_sub(pool.num_idle() as u32)
        }
    }
}

fn elapsed(from: Timestamp, to: Timestamp) -> Duration {
    Duration::from_micros(u64::try_from(to.micros() - from.micros()).unwrap_or(0))
}

fn outcome_label(outcome: AttemptOutcome) -> &'static str {
    match outcome {
        AttemptOutcome::Running => "running",
        AttemptOutcome::Succeeded => "succeeded",
        AttemptOutcome::RetryableError => "retryable_error",
        AttemptOutcome::PermanentError => "permanent_error",
        AttemptOutcome::InvalidOutput => "invalid_output",
        AttemptOutcome::Unknown => "unknown",
        AttemptOutcome::Cancelled => "cancelled",
        AttemptOutcome::LeaseExpired => "lease_expired",
    }
}

fn status_label(status: JobStatus) -> &'static str {
    match status {
        JobStatus::Succeeded => "succeeded",
        JobStatus::Failed => "failed",
        JobStatus::Cancelled => "cancelled",
        JobStatus::Queued => "queued",
        JobStatus::Running => "running",
    }
}
