//! The account alerts: `balance.low` once per crossing of the tenant's threshold, and
//! `spend_limit.reached` once per period in which a cap refused a job.

use crate::billing::Credits;
use crate::billing::balance::Balance;
use crate::billing::limits::SpendPeriod;
use crate::outbox;
use entity::{Timestamp, WebhookEvent, tenant_limits, tenants};
use sea_orm::sea_query::Expr;
use sea_orm::{ColumnTrait, Condition, ConnectionTrait, DbErr, EntityTrait, QueryFilter};
use serde_json::json;
use uuid::Uuid;

/// Queues `balance.low` when a fall of `fall` (a hold, or credit expiring) just took
/// the tenant's available balance below its threshold and the alert is armed. It fires
/// once; a grant re-arms it, once the balance is back at or above the threshold before
/// a fall.
///
/// Call it in the transaction of the fall, after it (the tenant's row is locked).
pub async fn after_balance_fell(
    transaction: &impl ConnectionTrait,
    tenant_id: Uuid,
    fall: Credits,
) -> Result<(), DbErr> {
    let Some(limits) = tenant_limits::Entity::find_by_id(tenant_id)
        .one(transaction)
        .await?
    else {
        return Ok(());
    };
    let Some(threshold) = limits.low_balance_threshold_nanos.map(Credits::from_nanos) else {
        return Ok(());
    };
    let Some(tenant) = tenants::Entity::find_by_id(tenant_id)
        .one(transaction)
        .await?
    else {
        return Ok(());
    };
    let after = Balance::from(&tenant).available();
    let before = after + fall;
    let armed = match limits.low_balance_alerted_granted_nanos {
        None => true,
        Some(granted_then) => tenant.granted_nanos > granted_then && before >= threshold,
    };
    if !armed || after >= threshold {
        return Ok(());
    }
    tenant_limits::Entity::update_many()
        .col_expr(
            tenant_limits::Column::LowBalanceAlertedGrantedNanos,
            Expr::value(Some(tenant.granted_nanos)),
        )
        .filter(tenant_limits::Column::TenantId.eq(tenant_id))
        .exec(transaction)
        .await?;
    tracing::info!(tenant.id = %tenant_id, "balance below the low-balance threshold");
    let data = json!({
        "tenantId": tenant_id,
        "available": after.to_string(),
        "threshold": threshold.to_string(),
    });
    outbox::enqueue(transaction, tenant_id, WebhookEvent::BalanceLow, data).await
}

/// Queues `spend_limit.reached` for a cap that refused a job at `at`, unless it was
/// already sent for that period. The mark and the delivery commit together, and the
/// mark is a conditional UPDATE, so concurrent refusals send it once.
pub async fn spend_limit_reached(
    transaction: &impl ConnectionTrait,
    tenant_id: Uuid,
    period: SpendPeriod,
    limit: Credits,
    spend: Credits,
    at: Timestamp,
) -> Result<(), DbErr> {
    let column = match period {
        SpendPeriod::Day => tenant_limits::Column::SpendLimitReachedDay,
        SpendPeriod::Month => tenant_limits::Column::SpendLimitReachedMonth,
    };
    let starts_at = period.start_of(at);
    let marked = tenant_limits::Entity::update_many()
        .col_expr(column, Expr::value(Some(starts_at)))
        .filter(tenant_limits::Column::TenantId.eq(tenant_id))
        .filter(
            Condition::any()
                .add(column.is_null())
                .add(column.lt(starts_at)),
        )
        .exec(transaction)
        .await?;
    if marked.rows_affected == 0 {
        return Ok(());
    }
    tracing::info!(tenant.id = %tenant_id, period = period.as_str(), "spend limit reached");
    let data = json!({
        "tenantId": tenant_id,
        "period": period.as_str(),
        "limit": limit.to_string(),
        "spend": spend.to_string(),
        "periodStart": starts_at.to_datetime().to_rfc3339_opts(chrono::SecondsFormat::Secs, true),
    });
    outbox::enqueue(
        transaction,
        tenant_id,
        WebhookEvent::SpendLimitReached,
        data,
    )
    .await
}
