//! What a PROVIDER_BATCH batch's page shows beyond its row: the uploads to the
//! provider's batch API that carried its items, each with its attempts by outcome, and
//! what its answered items would have cost at the realtime price.

use crate::billing::Credits;
use crate::billing::prices::ModelPrice;
use crate::error::ServiceError;
use crate::llm::TokenUsage;
use entity::{AttemptOutcome, attempts, batches, jobs, model_prices, provider_batches};
use sea_orm::sea_query::{Expr, ExprTrait, Func, SimpleExpr};
use sea_orm::{
    ColumnTrait, ConnectionTrait, EntityTrait, FromQueryResult, QueryFilter, QueryOrder,
    QuerySelect, QueryTrait,
};
use std::collections::HashMap;
use uuid::Uuid;

/// One upload to a provider's batch API, and its attempts (one per item it carried)
/// by outcome so far.
#[derive(Clone, Debug)]
pub struct ProviderBatchView {
    pub row: provider_batches::Model,
    pub outcomes: Vec<(AttemptOutcome, i64)>,
}

/// The provider batches of `batch`, oldest first (none for a REALTIME batch).
pub async fn provider_batches_of(
    db: &impl ConnectionTrait,
    batch: &batches::Model,
) -> Result<Vec<ProviderBatchView>, ServiceError> {
    let rows = provider_batches::Entity::find()
        .filter(provider_batches::Column::BatchId.eq(batch.id))
        .filter(provider_batches::Column::TenantId.eq(batch.tenant_id))
        .order_by_asc(provider_batches::Column::Id)
        .all(db)
        .await?;
    if rows.is_empty() {
        return Ok(Vec::new());
    }
    let counted = attempts::Entity::find()
        .select_only()
        .column(attempts::Column::ProviderBatchId)
        .column(attempts::Column::Outcome)
        .column_as(Expr::col(attempts::Column::Id).count(), "count")
        .filter(attempts::Column::TenantId.eq(batch.tenant_id))
        .filter(attempts::Column::ProviderBatchId.is_in(rows.iter().map(|row| row.id)))
        .group_by(attempts::Column::ProviderBatchId)
        .group_by(attempts::Column::Outcome)
        .order_by_asc(attempts::Column::Outcome)
        .into_model::<OutcomeCount>()
        .all(db)
        .await?;
    let mut outcomes: HashMap<Uuid, Vec<(AttemptOutcome, i64)>> = HashMap::new();
    for count in counted {
        outcomes
            .entry(count.provider_batch_id)
            .or_default()
            .push((count.outcome, count.count));
    }
    Ok(rows
        .into_iter()
        .map(|row| {
            let outcomes = outcomes.remove(&row.id).unwrap_or_default();
            ProviderBatchView { row, outcomes }
        })
        .collect())
}

#[derive(Debug, FromQueryResult)]
struct OutcomeCount {
    provider_batch_id: Uuid,
    outcome: AttemptOutcome,
    count: i64,
}

/// The batch's answered items against the realtime price: the accepted answers that
/// came through a provider batch, what they were charged, and what the same usage
/// is charged at the customer's realtime price of the same price version. Attempts
/// without an accepted answer are left out on both sides: what they cost depends on
/// how they failed, not on the mode.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RealtimeComparison {
    pub answers: i64,
    pub charged: Credits,
    pub at_realtime_price: Credits,
}

impl RealtimeComparison {
    /// What the batch price saved on those answers (negative if it cost more).
    pub fn saving(&self) -> Credits {
        self.at_realtime_price - self.charged
    }
}

/// [`RealtimeComparison`] of `batch`, summed per price version in one statement: the
/// usage of each version's answers is priced at its realtime customer rates. The
/// version is the one each answer was charged at (its item's held version), not the
/// one in force when it ran: the saving compares two prices of one quote.
pub async fn realtime_comparison(
    db: &impl ConnectionTrait,
    batch: &batches::Model,
) -> Result<RealtimeComparison, ServiceError> {
    let sum = |column: attempts::Column| Expr::col(column).sum().if_null(0).cast_as("BIGINT");
    let items = jobs::Entity::find()
        .select_only()
        .column(jobs::Column::Id)
        .filter(jobs::Column::BatchId.eq(batch.id))
        .filter(jobs::Column::TenantId.eq(batch.tenant_id))
        .into_query();
    // Attempts recorded before they named their customer version were charged at
    // the version they ran at.
    let charged_at: SimpleExpr = Func::coalesce([
        Expr::col(attempts::Column::CustomerPriceId),
        Expr::col(attempts::Column::ModelPriceId),
    ])
    .into();
    let groups = attempts::Entity::find()
        .select_only()
        .column_as(charged_at.clone(), "model_price_id")
        .column_as(Expr::col(attempts::Column::Id).count(), "answers")
        .column_as(sum(attempts::Column::InputTokens), "input_tokens")
        .column_as(
            sum(attempts::Column::CachedInputTokens),
            "cached_input_tokens",
        )
        .column_as(sum(attempts::Column::OutputTokens), "output_tokens")
        .column_as(sum(attempts::Column::CustomerChargeNanos), "charged")
        .filter(attempts::Column::TenantId.eq(batch.tenant_id))
        .filter(attempts::Column::JobId.in_subquery(items))
        .filter(attempts::Column::Outcome.eq(AttemptOutcome::Succeeded))
        .filter(attempts::Column::ProviderBatchId.is_not_null())
        .group_by(charged_at)
        .into_model::<VersionUsage>()
        .all(db)
        .await?;
    let versions: HashMap<Uuid, ModelPrice> = model_prices::Entity::find()
        .filter(model_prices::Column::Id.is_in(groups.iter().map(|group| group.model_price_id)))
        .all(db)
        .await?
        .into_iter()
        .map(|row| (row.id, ModelPrice::from(row)))
        .collect();
    let mut comparison = RealtimeComparison {
        answers: 0,
        charged: Credits::ZERO,
        at_realtime_price: Credits::ZERO,
    };
    let tokens = |count: i64| u64::try_from(count).unwrap_or(0);
    for group in groups {
        let price = versions.get(&group.model_price_id).ok_or_else(|| {
            ServiceError::Database(sea_orm::DbErr::Custom(format!(
                "attempts name the price version {} which is not stored",
                group.model_price_id
            )))
        })?;
        comparison.answers += group.answers;
        comparison.charged = comparison.charged + Credits::from_nanos(group.charged);
        comparison.at_realtime_price = comparison.at_realtime_price
            + price.customer_charge(&TokenUsage {
                input_tokens: tokens(group.input_tokens),
                cached_input_tokens: tokens(group.cached_input_tokens),
                output_tokens: tokens(group.output_tokens),
            });
    }
    Ok(comparison)
}

#[derive(Debug, FromQueryResult)]
struct VersionUsage {
    model_price_id: Uuid,
    answers: i64,
    input_tokens: i64,
    cached_input_tokens: i64,
    output_tokens: i64,
    charged: i64,
}
