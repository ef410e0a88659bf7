//! Spend control: the limits an admin sets per tenant, and the spend caps createJob
//! enforces.
//!
//! A tenant's spend in a period is the charges plus the open holds of its jobs created
//! in that UTC day or month. Counters for the current day and month sit on the tenant's
//! row beside the balance: a create adds its hold, a settlement takes back what it
//! released. The cap check reads them under the tenant row's lock, the lock every hold
//! and settlement of the tenant takes, so concurrent creates are decided one after the
//! other and never admit past a cap.

use super::Credits;
use crate::error::ServiceError;
use entity::{Timestamp, tenant_limits, tenants};
use sea_orm::sea_query::{Expr, ExprTrait, LockType, OnConflict};
use sea_orm::{
    ActiveValue::Set, ColumnTrait, ConnectionTrait, DbErr, EntityTrait, QueryFilter, QuerySelect,
};
use std::collections::BTreeMap;
use uuid::Uuid;

pub use entity::SpendPeriod;

/// A tenant's limits; `None` is no limit.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Limits {
    pub daily_spend: Option<Credits>,
    pub monthly_spend: Option<Credits>,
    pub requests_per_minute: Option<u32>,
    pub tokens_per_minute: Option<u32>,
    pub low_balance_threshold: Option<Credits>,
}

impl From<&tenant_limits::Model> for Limits {
    fn from(row: &tenant_limits::Model) -> Self {
        let count = |value: Option<i32>| value.and_then(|value| u32::try_from(value).ok());
        Self {
            daily_spend: row.daily_spend_limit_nanos.map(Credits::from_nanos),
            monthly_spend: row.monthly_spend_limit_nanos.map(Credits::from_nanos),
            requests_per_minute: count(row.requests_per_minute),
            tokens_per_minute: count(row.tokens_per_minute),
            low_balance_threshold: row.low_balance_threshold_nanos.map(Credits::from_nanos),
        }
    }
}

/// A change to one limit: keep it, clear it, or set it.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum LimitChange<T> {
    #[default]
    Keep,
    Clear,
    Set(T),
}

impl<T: Copy> LimitChange<T> {
    fn apply(self, current: Option<T>) -> Option<T> {
        match self {
            Self::Keep => current,
            Self::Clear => None,
            Self::Set(value) => Some(value),
        }
    }
}

/// What `setTenantLimits` changes.
#[derive(Clone, Copy, Debug, Default)]
pub struct LimitsChange {
    pub daily_spend: LimitChange<Credits>,
    pub monthly_spend: LimitChange<Credits>,
    pub requests_per_minute: LimitChange<u32>,
    pub tokens_per_minute: LimitChange<u32>,
    pub low_balance_threshold: LimitChange<Credits>,
}

/// Largest per-minute rate accepted: a GraphQL `Int`.
const MAX_RATE: u32 = i32::MAX as u32;

/// Applies `change` to a tenant's limits and returns them all. Amounts may be zero
/// (a zero cap stops new jobs), rates must be at least one. Run it in a write
/// transaction: it locks the tenant, reads the current limits, then writes.
pub async fn set_limits(
    db: &impl ConnectionTrait,
    tenant_id: Uuid,
    change: LimitsChange,
) -> Result<Limits, ServiceError> {
    let amount = |field: &str, change: LimitChange<Credits>| match change {
        LimitChange::Set(amount) if amount < Credits::ZERO => Err(ServiceError::validation(
            format!("{field} must not be negative"),
        )),
        _ => Ok(()),
    };
    amount("dailySpendLimit", change.daily_spend)?;
    amount("monthlySpendLimit", change.monthly_spend)?;
    amount("lowBalanceThreshold", change.low_balance_threshold)?;
    let rate = |field: &str, change: LimitChange<u32>| match change {
        LimitChange::Set(rate) if rate == 0 || rate > MAX_RATE => Err(ServiceError::validation(
            format!("{field} must be 1 to {MAX_RATE}"),
        )),
        _ => Ok(()),
    };
    rate("requestsPerMinute", change.requests_per_minute)?;
    rate("tokensPerMinute", change.tokens_per_minute)?;
    // The tenant's row is locked until the caller commits, so that two admins
    // changing different limits at once apply one after the other: otherwise each
    // writes back the other's field as it read it, and a cap set a moment ago is
    // silently cleared. (SQLite's write transaction serialises them already.)
    tenants::Entity::find_by_id(tenant_id)
        .lock(LockType::NoKeyUpdate)
        .one(db)
        .await?
        .ok_or(ServiceError::NotFound)?;
    let current = limits_of(db, tenant_id).await?;
    let limits = Limits {
        daily_spend: change.daily_spend.apply(current.daily_spend),
        monthly_spend: change.monthly_spend.apply(current.monthly_spend),
        requests_per_minute: change
            .requests_per_minute
            .apply(current.requests_per_minute),
        tokens_per_minute: change.tokens_per_minute.apply(current.tokens_per_minute),
        low_balance_threshold: change
            .low_balance_threshold
            .apply(current.low_balance_threshold),
    };
    // Checked above: rates fit an i32.
    let rate = |value: Option<u32>| value.map(|value| value as i32);
    let row = tenant_limits::ActiveModel {
        tenant_id: Set(tenant_id),
        daily_spend_limit_nanos: Set(limits.daily_spend.map(Credits::nanos)),
        monthly_spend_limit_nanos: Set(limits.monthly_spend.map(Credits::nanos)),
        requests_per_minute: Set(rate(limits.requests_per_minute)),
        tokens_per_minute: Set(rate(limits.tokens_per_minute)),
        low_balance_threshold_nanos: Set(limits.low_balance_threshold.map(Credits::nanos)),
        updated_at: Set(Timestamp::now()),
        ..Default::default()
    };
    tenant_limits::Entity::insert(row)
        .on_conflict(
            OnConflict::column(tenant_limits::Column::TenantId)
                .update_columns([
                    tenant_limits::Column::DailySpendLimitNanos,
                    tenant_limits::Column::MonthlySpendLimitNanos,
                    tenant_limits::Column::RequestsPerMinute,
                    tenant_limits::Column::TokensPerMinute,
                    tenant_limits::Column::LowBalanceThresholdNanos,
                    tenant_limits::Column::UpdatedAt,
                ])
                .to_owned(),
        )
        .exec(db)
        .await?;
    tracing::info!(tenant.id = %tenant_id, limits = ?limits, "tenant limits set");
    Ok(limits)
}

/// A tenant's limits (all `None` when an admin never set any).
pub async fn limits_of(db: &impl ConnectionTrait, tenant_id: Uuid) -> Result<Limits, DbErr> {
    Ok(tenant_limits::Entity::find_by_id(tenant_id)
        .one(db)
        .await?
        .as_ref()
        .map(Limits::from)
        .unwrap_or_default())
}

/// A tenant's spend in the UTC day and month of an instant.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Spend {
    pub today: Credits,
    pub this_month: Credits,
}

impl Spend {
    /// What the tenant row's counters say about the day and month of `at`: a counter
    /// of an earlier period counts nothing.
    pub fn of(tenant: &tenants::Model, at: Timestamp) -> Self {
        let counter = |period: SpendPeriod, starts_at: Timestamp, nanos: i64| {
            if starts_at == period.start_of(at) {
                Credits::from_nanos(nanos)
            } else {
                Credits::ZERO
            }
        };
        Self {
            today: counter(
                SpendPeriod::Day,
                tenant.spend_day_starts_at,
                tenant.spend_day_nanos,
            ),
            this_month: counter(
                SpendPeriod::Month,
                tenant.spend_month_starts_at,
                tenant.spend_month_nanos,
            ),
        }
    }
}

/// Counts a new job's hold into its tenant's spend of the day and month of `created_at`,
/// or refuses with `SpendLimitExceeded` when that passes a cap. Returns the instant the
/// hold was counted at: `created_at`, or the start of a newer day when another
/// process (with a clock ahead) has begun counting it already — the job must then be
/// dated at that instant, so that its settlement lowers the period that counted it.
///
/// Runs in the create's transaction, which a refusal must roll back. It locks the
/// tenant's row (`FOR NO KEY UPDATE` on PostgreSQL; SQLite's write transaction holds
/// the whole database), so two creates never both pass a cap on the same counts. Call
/// it after the hold, which locks the same row, so the lock is taken once and last.
pub async fn admit_spend(
    transaction: &impl ConnectionTrait,
    tenant_id: Uuid,
    hold: Credits,
    created_at: Timestamp,
) -> Result<Timestamp, ServiceError> {
    let tenant = tenants::Entity::find_by_id(tenant_id)
        // NO KEY UPDATE, the lock the ledger's UPDATE of the row takes: a plain FOR
        // UPDATE would wait for the key-share locks that other creates' inserts take on
        // the row through their foreign keys, while they wait for this one.
        .lock(LockType::NoKeyUpdate)
        .one(transaction)
        .await?
        .ok_or(ServiceError::NotFound)?;
    let limits = limits_of(transaction, tenant_id).await?;
    // A process whose clock is a little behind counts into the newest period any
    // process started, rather than restarting an older one and losing its count.
    let counted_at = Ord::max(created_at, tenant.spend_day_starts_at);
    let spent = Spend::of(&tenant, counted_at);
    for (period, limit, spend) in [
        (SpendPeriod::Day, limits.daily_spend, spent.today),
        (SpendPeriod::Month, limits.monthly_spend, spent.this_month),
    ] {
        if let Some(limit) = limit
            && spend.checked_add(hold).is_none_or(|total| total > limit)
        {
            return Err(ServiceError::SpendLimitExceeded {
                period,
                limit,
                spend,
                needed: hold,
            });
        }
    }
    let after = Spend {
        today: spent.today + hold,
        this_month: spent.this_month + hold,
    };
    tenants::Entity::update_many()
        .col_expr(
            tenants::Column::SpendDayStartsAt,
            Expr::value(SpendPeriod::Day.start_of(counted_at)),
        )
        .col_expr(
            tenants::Column::SpendDayNanos,
            Expr::value(after.today.nanos()),
        )
        .col_expr(
            tenants::Column::SpendMonthStartsAt,
            Expr::value(SpendPeriod::Month.start_of(counted_at)),
        )
        .col_expr(
            tenants::Column::SpendMonthNanos,
            Expr::value(after.this_month.nanos()),
        )
        .filter(tenants::Column::Id.eq(tenant_id))
        .exec(transaction)
        .await?;
    Ok(counted_at)
}

/// Takes what settlements released out of the spend of the periods their jobs were
/// created in — one UPDATE per tenant and pair of periods, in tenant order. Each entry
/// is `(tenant, job created at, released)`; run it in the transaction that settles,
/// after the ledger locked the tenants' rows.
pub async fn release_spends(
    transaction: &impl ConnectionTrait,
    releases: impl IntoIterator<Item = (Uuid, Timestamp, Credits)>,
) -> Result<(), DbErr> {
    // Keyed by tenant and the starts of the day and month: one sum per row update.
    let mut totals: BTreeMap<(Uuid, Timestamp, Timestamp), Credits> = BTreeMap::new();
    for (tenant_id, created_at, released) in releases {
        let key = (
            tenant_id,
            SpendPeriod::Day.start_of(created_at),
            SpendPeriod::Month.start_of(created_at),
        );
        let total = totals.entry(key).or_insert(Credits::ZERO);
        *total = *total + released;
    }
    for ((tenant_id, day, _), released) in totals {
        release_spend(transaction, tenant_id, day, released).await?;
    }
    Ok(())
}

/// Takes the part of a job's hold that its settlement released back out of the spend
/// of the day and month the job was created in — when those are still the counted
/// ones; an earlier period's spend is history.
///
/// Call it in the transaction that resolves the hold, after the ledger has (the
/// tenant's row is then locked already, so this takes no lock of its own).
async fn release_spend(
    transaction: &impl ConnectionTrait,
    tenant_id: Uuid,
    job_created_at: Timestamp,
    released: Credits,
) -> Result<(), DbErr> {
    if !released.is_positive() {
        return Ok(());
    }
    let lowered = |starts_at: tenants::Column, nanos: tenants::Column, period: SpendPeriod| {
        Expr::case(
            Expr::col(starts_at).eq(period.start_of(job_created_at)),
            Expr::col(nanos).sub(released.nanos()),
        )
        .finally(Expr::col(nanos))
    };
    tenants::Entity::update_many()
        .col_expr(
            tenants::Column::SpendDayNanos,
            lowered(
                tenants::Column::SpendDayStartsAt,
                tenants::Column::SpendDayNanos,
                SpendPeriod::Day,
            )
            .into(),
        )
        .col_expr(
            tenants::Column::SpendMonthNanos,
            lowered(
                tenants::Column::SpendMonthStartsAt,
                tenants::Column::SpendMonthNanos,
                SpendPeriod::Month,
            )
            .into(),
        )
        .filter(tenants::Column::Id.eq(tenant_id))
        .exec(transaction)
        .await?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use chrono::{TimeZone, Utc};

    fn at(year: i32, month: u32, day: u32, hour: u32, minute: u32) -> Timestamp {
        Timestamp::from(
            Utc.with_ymd_and_hms(year, month, day, hour, minute, 0)
                .unwrap(),
        )
    }

    #[test]
    fn periods_start_at_utc_midnight_and_the_first_of_the_month() {
        let instant = at(2026, 11, 30, 23, 59);
        assert_eq!(SpendPeriod::Day.start_of(instant), at(2026, 11, 30, 0, 0));
        assert_eq!(SpendPeriod::Month.start_of(instant), at(2026, 11, 1, 0, 0));
        let next = at(2026, 12, 1, 0, 0);
        assert_eq!(SpendPeriod::Day.start_of(next), next);
        assert_eq!(SpendPeriod::Month.start_of(next), next);
    }
}
