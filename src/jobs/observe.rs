//! What the queue and the workers tell the metrics: each function takes what the
//! caller already knows at that point (a claim, a recorded attempt, the notices of
//! committed events), so that recording costs the hot path no query.

use super::bus::{EventBus, EventNotice};
use super::queue::{AttemptReport, Claim, ErrorCode};
use crate::billing::{Credits, ModelPrice};
use crate::metrics::{AttemptFinished, Metrics, State};
use entity::{AttemptOutcome, EventKind, JobStatus, Timestamp, attempts, jobs, tenants};
use sea_orm::sea_query::{Expr, ExprTrait};
use sea_orm::{ColumnTrait, DatabaseConnection, DbErr, EntityTrait, PaginatorTrait, QueryFilter};
use std::time::Duration;

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

/// An attempt was recorded with `report`, and its job's new state committed with
/// `notices`. A retry is classed by the attempt's error code, as the API shows it.
pub fn attempt_finished(
    metrics: &Metrics,
    claim: &Claim,
    attempt: &attempts::Model,
    price: &ModelPrice,
    report: &AttemptReport,
    notices: &[EventNotice],
) {
    // The cost as the attempt row records it: exact with usage, zero when nothing can
    // have been billed, the bound fixed at the start otherwise.
    let provider_cost = match (&report.usage, report.not_billed) {
        (Some(usage), _) => price.provider_cost(usage),
        (None, true) => Credits::ZERO,
        (None, false) => {
            Credits::from_nanos(attempt.provider_cost_upper_bound_nanos.unwrap_or_default())
        }
    };
    metrics.attempt_finished(&AttemptFinished {
        outcome: outcome_label(report.outcome),
        model: &claim.job.model,
        provider: &attempt.provider,
        duration: report.latency,
        provider_cost,
        customer_charge: report.customer_charge,
        unknown: report.outcome == AttemptOutcome::Unknown,
    });
    let class = report
        .error
        .as_ref()
        .map_or("UNSPECIFIED", |error| error.code.as_str());
    let end_to_end = elapsed(claim.job.created_at, Timestamp::now());
    job_events(metrics, notices, class, Some(end_to_end));
}

/// A sweep took back the jobs of `notices` after their leases lapsed.
pub fn leases_expired(metrics: &Metrics, notices: &[EventNotice]) {
    for _ in notices {
        metrics.lease_expired();
    }
    job_events(metrics, notices, ErrorCode::LeaseExpired.as_str(), None);
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

/// Reads the gauges a scrape shows: jobs queued and running (two counts on the
/// partial indexes the claim uses), tenants low on credit, subscriptions, and pool
/// connections in use.
pub async fn state(
    db: &DatabaseConnection,
    bus: &EventBus,
    pools: &[(&'static str, DatabaseConnection)],
) -> Result<State, DbErr> {
    let count = |status: JobStatus| {
        jobs::Entity::find()
            .filter(jobs::Column::Status.eq(status))
            .count(db)
    };
    Ok(State {
        queued: count(JobStatus::Queued).await?,
        running: count(JobStatus::Running).await?,
        open_subscriptions: bus.open_subscriptions(),
        tenants_low_credit: tenants::Entity::find()
            .filter(tenants::Column::GrantedNanos.gt(0))
            .filter(
                Expr::col(tenants::Column::GrantedNanos)
                    .sub(Expr::col(tenants::Column::HeldNanos))
                    .sub(Expr::col(tenants::Column::ChargedNanos))
                    .mul(10)
                    .lt(Expr::col(tenants::Column::GrantedNanos)),
            )
            .count(db)
            .await?,
        pools_in_use: pools
            .iter()
            .map(|(name, pool)| (*name, connections_in_use(pool)))
            .collect(),
    })
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
