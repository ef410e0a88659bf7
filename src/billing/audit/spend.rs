//! The spend counters on each tenant's row against the jobs they count.
//!
//! A counter covers the UTC day (or month) that starts at its `spend_*_starts_at`;
//! it must equal the charges plus open holds of the tenant's jobs created in that
//! period, which is each reservation's amount less what it released (a held one
//! released nothing, a settled one released what it did not charge, a released one
//! everything). Two known gaps make the audit report a difference on purpose: holds
//! open when the counters were installed (migration 9) were not counted, and a
//! process whose clock was behind counted its job into the newer period.

use super::report::{Invariant, Recorder, Subject, credits};
use crate::billing::limits::SpendPeriod;
use crate::db::Values;
use chrono::{Datelike, Months};
use entity::{Timestamp, tenants};
use sea_orm::{ConnectionTrait, DbErr};
use std::collections::HashMap;
use uuid::Uuid;

/// The first instant after the period of `period` that starts at `starts_at`.
fn period_end(period: SpendPeriod, starts_at: Timestamp) -> Timestamp {
    let start = starts_at.to_datetime();
    let end = match period {
        SpendPeriod::Day => start.checked_add_days(chrono::Days::new(1)),
        SpendPeriod::Month => start
            .with_day(1)
            .and_then(|first| first.checked_add_months(Months::new(1))),
    };
    end.map_or(Timestamp(i64::MAX), Timestamp::from)
}

/// Checks the day and month counters of a page of tenants with one query.
pub(super) async fn audit_spend_counters(
    db: &impl ConnectionTrait,
    recorder: &mut Recorder,
    page: &[tenants::Model],
) -> Result<(), DbErr> {
    let invariant = Invariant::SpendCountersMatchJobs;
    recorder.checked(invariant, page.len() as u64);
    if page.is_empty() {
        return Ok(());
    }
    let mut values = Values::new(
        db.get_database_backend(),
        "period",
        [
            "tenant_id",
            "day_starts",
            "day_ends",
            "month_starts",
            "month_ends",
        ],
    );
    for tenant in page {
        values.push([
            tenant.id.into(),
            tenant.spend_day_starts_at.into(),
            period_end(SpendPeriod::Day, tenant.spend_day_starts_at).into(),
            tenant.spend_month_starts_at.into(),
            period_end(SpendPeriod::Month, tenant.spend_month_starts_at).into(),
        ]);
    }
    let in_period = |starts: &str, ends: &str| {
        format!("jobs.created_at >= period.{starts} AND jobs.created_at < period.{ends}")
    };
    let spent = |starts: &str, ends: &str| {
        format!(
            "CAST(COALESCE(SUM(CASE WHEN {} \
             THEN credit_reservations.amount_nanos - credit_reservations.released_amount_nanos \
                  + credit_reservations.absorbed_nanos \
             ELSE 0 END), 0) AS BIGINT)",
            in_period(starts, ends)
        )
    };
    let sql = format!(
        "SELECT period.tenant_id, {day}, {month}
         FROM period
         JOIN jobs ON jobs.tenant_id = period.tenant_id
             AND (({in_day}) OR ({in_month}))
         JOIN credit_reservations ON credit_reservations.job_id = jobs.id
         GROUP BY period.tenant_id",
        day = spent("day_starts", "day_ends"),
        month = spent("month_starts", "month_ends"),
        in_day = in_period("day_starts", "day_ends"),
        in_month = in_period("month_starts", "month_ends"),
    );
    let mut counted: HashMap<Uuid, (i64, i64)> = HashMap::new();
    for row in db.query_all_raw(values.statement(&sql)).await? {
        counted.insert(
            row.try_get_by_index(0)?,
            (row.try_get_by_index(1)?, row.try_get_by_index(2)?),
        );
    }
    for tenant in page {
        let (day, month) = counted.get(&tenant.id).copied().unwrap_or_default();
        let mut problems = Vec::new();
        for (name, counter, starts_at, jobs) in [
            (
                "day",
                tenant.spend_day_nanos,
                tenant.spend_day_starts_at,
                day,
            ),
            (
                "month",
                tenant.spend_month_nanos,
                tenant.spend_month_starts_at,
                month,
            ),
        ] {
            if counter != jobs {
                problems.push(format!(
                    "the {name} from {} counts {}, its jobs' charges and open holds {}",
                    starts_at.to_datetime().to_rfc3339(),
                    credits(counter),
                    credits(jobs)
                ));
            }
        }
        if !problems.is_empty() {
            recorder.violation(invariant, Subject::Tenant(tenant.id), problems.join("; "));
        }
    }
    Ok(())
}
