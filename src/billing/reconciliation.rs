//! Reconciliation: an admin records the real usage of an attempt whose outcome was
//! unknown (from the provider's usage report or generation lookup), turning the cost
//! bound it carried into an exact cost, with an audit-trail row.
//!
//! The cost is computed with the price version the attempt stored, so a price change
//! since then does not change it. The customer's charge does not change: the customer
//! pays for the accepted attempt only, and a reconciled attempt is never that one.

use super::batch_totals::BatchTotals;
use super::{Credits, ModelPrice};
use crate::error::ServiceError;
use crate::llm::TokenUsage;
use entity::{AttemptOutcome, Timestamp, attempt_reconciliations, attempts, jobs, model_prices};
use sea_orm::sea_query::Expr;
use sea_orm::{
    ActiveValue::Set, ColumnTrait, ConnectionTrait, DbErr, EntityTrait, QueryFilter, SqlErr,
};
use uuid::Uuid;

/// Longest note kept with a reconciliation.
pub const MAX_NOTE_LENGTH: usize = 2_000;
/// Longest provider request id accepted.
pub const MAX_REQUEST_ID_LENGTH: usize = 200;

/// Outcomes after which an attempt's cost may be unknown: the request may have been
/// billed and no usage came back.
const UNKNOWN_OUTCOMES: [AttemptOutcome; 3] = [
    AttemptOutcome::Unknown,
    AttemptOutcome::LeaseExpired,
    AttemptOutcome::Cancelled,
];

/// The real usage of an attempt, as the provider reported it.
#[derive(Clone, Debug)]
pub struct NewReconciliation {
    pub attempt_id: Uuid,
    pub usage: TokenUsage,
    /// Kept on the attempt when given; the attempt's own id stays otherwise.
    pub provider_request_id: Option<String>,
    /// Why, and from which source.
    pub note: String,
    /// Who records it.
    pub reconciled_by: String,
}

/// The audit-trail row and the attempt as it now is.
#[derive(Clone, Debug)]
pub struct Reconciled {
    pub reconciliation: attempt_reconciliations::Model,
    pub attempt: attempts::Model,
}

/// Records the real usage of an attempt whose cost is still a bound, in the caller's
/// transaction: the exact cost at the attempt's price version, the token counts and
/// request id on the attempt, its bound cleared, and the audit-trail row.
///
/// `NotFound` for an unknown attempt; `Validation` for an attempt whose cost is
/// already exact (reconciled before, or usage came back), one still running, or bad
/// usage.
pub async fn reconcile_attempt(
    db: &impl ConnectionTrait,
    new: NewReconciliation,
) -> Result<Reconciled, ServiceError> {
    let note = new.note.trim().to_owned();
    if note.is_empty() {
        return Err(ServiceError::validation(
            "note must say why and from which source",
        ));
    }
    if note.chars().count() > MAX_NOTE_LENGTH {
        return Err(ServiceError::validation(format!(
            "note must be at most {MAX_NOTE_LENGTH} characters"
        )));
    }
    crate::validation::free_text("note", &note)?;
    let provider_request_id = new
        .provider_request_id
        .map(|id| id.trim().to_owned())
        .filter(|id| !id.is_empty());
    if provider_request_id
        .as_ref()
        .is_some_and(|id| id.chars().count() > MAX_REQUEST_ID_LENGTH)
    {
        return Err(ServiceError::validation(format!(
            "providerRequestId must be at most {MAX_REQUEST_ID_LENGTH} characters"
        )));
    }
    if let Some(request_id) = &provider_request_id {
        crate::validation::single_line("providerRequestId", request_id)?;
    }
    let usage = new.usage;
    if usage.cached_input_tokens > usage.input_tokens {
        return Err(ServiceError::validation(
            "cachedInputTokens are part of inputTokens and cannot exceed them",
        ));
    }
    let tokens = |count: u64| {
        i64::try_from(count).map_err(|_| ServiceError::validation("a token count is too large"))
    };
    let (input_tokens, cached_input_tokens, output_tokens) = (
        tokens(usage.input_tokens)?,
        tokens(usage.cached_input_tokens)?,
        tokens(usage.output_tokens)?,
    );

    let attempt = attempts::Entity::find_by_id(new.attempt_id)
        .one(db)
        .await?
        .ok_or(ServiceError::NotFound)?;
    let already_exact = || {
        ServiceError::validation(format!(
            "attempt {} of job {} already has an exact cost",
            attempt.number, attempt.job_id
        ))
    };
    if attempt.provider_cost_nanos.is_some() {
        return Err(already_exact());
    }
    if !UNKNOWN_OUTCOMES.contains(&attempt.outcome) {
        return Err(ServiceError::validation(format!(
            "attempt {} of job {} is {:?}: only an attempt whose outcome was unknown (unknown, lease expired or cancelled) can be reconciled",
            attempt.number, attempt.job_id, attempt.outcome
        )));
    }
    let price: ModelPrice = model_prices::Entity::find_by_id(attempt.model_price_id)
        .one(db)
        .await?
        .ok_or_else(|| {
            DbErr::Custom(format!(
                "price {} of attempt {} is missing",
                attempt.model_price_id, attempt.id
            ))
        })?
        .into();
    let cost = price.provider_cost(&usage);
    if let Some(bound) = attempt.provider_cost_upper_bound_nanos
        && cost.nanos() > bound
    {
        // Recorded all the same: the provider's report is the truth, and the bound
        // that was exceeded stays in the audit trail.
        tracing::warn!(
            attempt.id = %attempt.id, cost = %cost, bound = %Credits::from_nanos(bound),
            "a reconciled cost exceeds the attempt's upper bound"
        );
    }

    // Conditional on the cost still being unknown: of two concurrent reconciliations
    // one updates the row, the other matches nothing and is refused.
    let mut update = attempts::Entity::update_many()
        .col_expr(
            attempts::Column::ProviderCostNanos,
            Expr::value(cost.nanos()),
        )
        .col_expr(
            attempts::Column::ProviderCostUpperBoundNanos,
            Expr::value(Option::<i64>::None),
        )
        .col_expr(attempts::Column::InputTokens, Expr::value(input_tokens))
        .col_expr(
            attempts::Column::CachedInputTokens,
            Expr::value(cached_input_tokens),
        )
        .col_expr(attempts::Column::OutputTokens, Expr::value(output_tokens));
    if let Some(request_id) = &provider_request_id {
        update = update.col_expr(
            attempts::Column::ProviderRequestId,
            Expr::value(request_id.clone()),
        );
    }
    let Some(updated) = update
        .filter(attempts::Column::Id.eq(attempt.id))
        .filter(attempts::Column::ProviderCostNanos.is_null())
        .filter(attempts::Column::Outcome.is_in(UNKNOWN_OUTCOMES))
        .exec_with_returning(db)
        .await?
        .into_iter()
        .next()
    else {
        return Err(already_exact());
    };

    // The bound becomes the cost in the sums of the job's batch too.
    if let Some(job) = jobs::Entity::find_by_id(attempt.job_id).one(db).await? {
        let mut totals = BatchTotals::default();
        totals.attempt_cost(
            &job,
            (
                attempt.provider_cost_nanos,
                attempt.provider_cost_upper_bound_nanos,
            ),
            (Some(cost.nanos()), None),
        );
        totals.apply(db).await?;
    }

    let row = attempt_reconciliations::ActiveModel {
        id: Set(Uuid::now_v7()),
        attempt_id: Set(attempt.id),
        job_id: Set(attempt.job_id),
        tenant_id: Set(attempt.tenant_id),
        previous_upper_bound_nanos: Set(attempt.provider_cost_upper_bound_nanos),
        provider_cost_nanos: Set(cost.nanos()),
        model_price_id: Set(attempt.model_price_id),
        input_tokens: Set(input_tokens),
        cached_input_tokens: Set(cached_input_tokens),
        output_tokens: Set(output_tokens),
        provider_request_id: Set(provider_request_id),
        note: Set(note),
        reconciled_by: Set(new.reconciled_by),
        created_at: Set(Timestamp::now()),
    };
    let reconciliation = match attempt_reconciliations::Entity::insert(row)
        .exec_with_returning(db)
        .await
    {
        Ok(reconciliation) => reconciliation,
        Err(error) if matches!(error.sql_err(), Some(SqlErr::UniqueConstraintViolation(_))) => {
            return Err(already_exact());
        }
        Err(error) => return Err(error.into()),
    };
    tracing::info!(
        attempt.id = %attempt.id, job.id = %attempt.job_id, cost = %cost,
        bound = ?attempt.provider_cost_upper_bound_nanos.map(Credits::from_nanos),
        "attempt reconciled"
    );
    Ok(Reconciled {
        reconciliation,
        attempt: updated,
    })
}
