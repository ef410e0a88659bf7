//! Spend control over GraphQL: `setTenantLimits` and `tenantLimits` for admins, and
//! the limits and spend an account shows its tenant.

use super::scalars::Amount;
use super::{ApiErrorCode, app, principal};
use crate::accounts::tenants;
use crate::billing::limits::{self, LimitChange, Limits, LimitsChange, Spend};
use crate::billing::{Credits, CreditsError};
use crate::db::begin_write;
use crate::error::ServiceError;
use async_graphql::{Context, InputObject, MaybeUndefined, Object, SimpleObject};
use uuid::Uuid;

/// A tenant's limits. A null field is no limit; omitting a field keeps it.
#[derive(InputObject)]
pub struct TenantLimitsInput {
    pub tenant_id: Uuid,
    /// Most the tenant may spend (charges plus open holds) on jobs created in one UTC
    /// day; createJob answers `SPEND_LIMIT_EXCEEDED` rather than pass it. Zero or more.
    pub daily_spend_limit: MaybeUndefined<Amount>,
    /// The same for one UTC month.
    pub monthly_spend_limit: MaybeUndefined<Amount>,
    /// Provider calls the tenant's jobs may start per minute (at least 1).
    pub requests_per_minute: MaybeUndefined<i32>,
    /// Tokens the tenant's jobs may use per minute (at least 1).
    pub tokens_per_minute: MaybeUndefined<i32>,
    /// A `balance.low` webhook fires when the available balance drops below this.
    pub low_balance_threshold: MaybeUndefined<Amount>,
}

/// A tenant's limits; null is no limit.
#[derive(SimpleObject)]
pub struct TenantLimits {
    pub tenant_id: Uuid,
    pub daily_spend_limit: Option<Amount>,
    pub monthly_spend_limit: Option<Amount>,
    pub requests_per_minute: Option<i32>,
    pub tokens_per_minute: Option<i32>,
    pub low_balance_threshold: Option<Amount>,
}

impl TenantLimits {
    /// The GraphQL view of a tenant's limits.
    pub fn new(tenant_id: Uuid, limits: Limits) -> Self {
        // Stored from a GraphQL Int, so they fit; saturate rather than fail all the same.
        let rate = |value: Option<u32>| value.map(|value| i32::try_from(value).unwrap_or(i32::MAX));
        Self {
            tenant_id,
            daily_spend_limit: limits.daily_spend.map(Amount::from),
            monthly_spend_limit: limits.monthly_spend.map(Amount::from),
            requests_per_minute: rate(limits.requests_per_minute),
            tokens_per_minute: rate(limits.tokens_per_minute),
            low_balance_threshold: limits.low_balance_threshold.map(Amount::from),
        }
    }
}

/// What a tenant spent: charges plus open holds of its jobs created in the period.
#[derive(SimpleObject)]
pub struct AccountSpend {
    /// In the current UTC day.
    pub today: Amount,
    /// In the current UTC month.
    pub this_month: Amount,
}

impl From<Spend> for AccountSpend {
    fn from(spend: Spend) -> Self {
        Self {
            today: spend.today.into(),
            this_month: spend.this_month.into(),
        }
    }
}

fn amount_change(
    field: &str,
    value: MaybeUndefined<Amount>,
) -> async_graphql::Result<LimitChange<Credits>> {
    Ok(match value {
        MaybeUndefined::Undefined => LimitChange::Keep,
        MaybeUndefined::Null => LimitChange::Clear,
        MaybeUndefined::Value(amount) => LimitChange::Set(
            Credits::from_decimal(amount.0).map_err(|error: CreditsError| {
                ApiErrorCode::Validation.error(format!("{field}: {error}"))
            })?,
        ),
    })
}

fn rate_change(field: &str, value: MaybeUndefined<i32>) -> async_graphql::Result<LimitChange<u32>> {
    Ok(match value {
        MaybeUndefined::Undefined => LimitChange::Keep,
        MaybeUndefined::Null => LimitChange::Clear,
        MaybeUndefined::Value(rate) => {
            // The same words as the limit's own check of zero (billing::limits).
            LimitChange::Set(u32::try_from(rate).map_err(|_| {
                ApiErrorCode::Validation.error(format!("{field} must be 1 to {}", i32::MAX))
            })?)
        }
    })
}

/// The admin's read of limits; a tenant reads its own in `account { limits }`.
#[derive(Default)]
pub struct LimitsQuery;

#[Object]
impl LimitsQuery {
    /// Admin: a tenant's limits, as `setTenantLimits` set them. A tenant is
    /// `FORBIDDEN`; an unknown tenant `NOT_FOUND`.
    async fn tenant_limits(
        &self,
        context: &Context<'_>,
        tenant_id: Uuid,
    ) -> async_graphql::Result<TenantLimits> {
        principal(context)?.require_admin()?;
        let db = &app(context).db;
        tenants::find_tenant(db, tenant_id).await?;
        let limits = limits::limits_of(db, tenant_id)
            .await
            .map_err(ServiceError::from)?;
        Ok(TenantLimits::new(tenant_id, limits))
    }
}

/// The limits mutation.
#[derive(Default)]
pub struct LimitsMutation;

#[Object]
impl LimitsMutation {
    /// Admin: sets a tenant's limits. A null field clears that limit, an omitted one
    /// stays as it was.
    async fn set_tenant_limits(
        &self,
        context: &Context<'_>,
        input: TenantLimitsInput,
    ) -> async_graphql::Result<TenantLimits> {
        principal(context)?.require_admin()?;
        let change = LimitsChange {
            daily_spend: amount_change("dailySpendLimit", input.daily_spend_limit)?,
            monthly_spend: amount_change("monthlySpendLimit", input.monthly_spend_limit)?,
            requests_per_minute: rate_change("requestsPerMinute", input.requests_per_minute)?,
            tokens_per_minute: rate_change("tokensPerMinute", input.tokens_per_minute)?,
            low_balance_threshold: amount_change(
                "lowBalanceThreshold",
                input.low_balance_threshold,
            )?,
        };
        let transaction = begin_write(&app(context).db)
            .await
            .map_err(ServiceError::from)?;
        let limits = limits::set_limits(&transaction, input.tenant_id, change).await?;
        transaction.commit().await.map_err(ServiceError::from)?;
        Ok(TenantLimits::new(input.tenant_id, limits))
    }
}
