//! Each attempt's cost or bound, and each reconciliation against its attempt.

use super::report::{Invariant, Recorder, Subject, VIOLATIONS_SHOWN, Violation, credits};
use entity::{attempt_reconciliations, attempts};
use sea_orm::sea_query::{Expr, ExprTrait};
use sea_orm::{
    ColumnTrait, Condition, ConnectionTrait, DbErr, EntityTrait, JoinType, PaginatorTrait,
    QueryFilter, QueryOrder, QuerySelect, RelationTrait,
};
use std::collections::HashMap;
use uuid::Uuid;

pub(super) async fn audit_attempts(
    db: &impl ConnectionTrait,
    recorder: &mut Recorder,
) -> Result<(), DbErr> {
    let invariant = Invariant::UnknownCostHasUpperBound;
    recorder.checked(invariant, attempts::Entity::find().count(db).await?);
    let broken = attempts::Entity::find().filter(
        Condition::any()
            .add(
                Condition::all()
                    .add(attempts::Column::ProviderCostNanos.is_null())
                    .add(attempts::Column::ProviderCostUpperBoundNanos.is_null()),
            )
            .add(attempts::Column::ProviderCostNanos.lt(0))
            .add(attempts::Column::ProviderCostUpperBoundNanos.lt(0)),
    );
    let count = broken.clone().count(db).await?;
    if count > 0 {
        let shown = broken
            .order_by_asc(attempts::Column::Id)
            .limit(VIOLATIONS_SHOWN as u64)
            .all(db)
            .await?
            .into_iter()
            .map(|attempt| Violation {
                subject: Subject::Attempt(attempt.id),
                detail: match (
                    attempt.provider_cost_nanos,
                    attempt.provider_cost_upper_bound_nanos,
                ) {
                    (None, None) => format!(
                        "attempt {} of job {} ({:?}) has neither an exact cost nor an upper bound",
                        attempt.number, attempt.job_id, attempt.outcome
                    ),
                    (cost, bound) => format!(
                        "attempt {} of job {} has a negative cost ({:?}) or bound ({:?}) in nano-credits",
                        attempt.number, attempt.job_id, cost, bound
                    ),
                },
            })
            .collect();
        recorder.violations(invariant, count, shown);
    }
    Ok(())
}

pub(super) async fn audit_reconciliations(
    db: &impl ConnectionTrait,
    recorder: &mut Recorder,
) -> Result<(), DbErr> {
    let invariant = Invariant::ReconciliationMatchesAttempt;
    recorder.checked(
        invariant,
        attempt_reconciliations::Entity::find().count(db).await?,
    );
    let reconciled = |column: attempt_reconciliations::Column| {
        Expr::col((attempt_reconciliations::Entity, column))
    };
    let attempt = |column: attempts::Column| Expr::col((attempts::Entity, column));
    let broken = attempt_reconciliations::Entity::find()
        .join(
            JoinType::InnerJoin,
            attempt_reconciliations::Relation::Attempt.def(),
        )
        .filter(
            Condition::any()
                .add(attempts::Column::ProviderCostNanos.is_null())
                .add(attempts::Column::ProviderCostUpperBoundNanos.is_not_null())
                .add(attempt(attempts::Column::ProviderCostNanos).ne(reconciled(
                    attempt_reconciliations::Column::ProviderCostNanos,
                )))
                .add(
                    attempt(attempts::Column::JobId)
                        .ne(reconciled(attempt_reconciliations::Column::JobId)),
                )
                .add(
                    attempt(attempts::Column::TenantId)
                        .ne(reconciled(attempt_reconciliations::Column::TenantId)),
                )
                .add(
                    attempt(attempts::Column::ModelPriceId)
                        .ne(reconciled(attempt_reconciliations::Column::ModelPriceId)),
                ),
        );
    let count = broken.clone().count(db).await?;
    if count > 0 {
        let shown = broken
            .order_by_asc(attempt_reconciliations::Column::Id)
            .limit(VIOLATIONS_SHOWN as u64)
            .all(db)
            .await?;
        let attempts: HashMap<Uuid, attempts::Model> = attempts::Entity::find()
            .filter(attempts::Column::Id.is_in(shown.iter().map(|row| row.attempt_id)))
            .all(db)
            .await?
            .into_iter()
            .map(|attempt| (attempt.id, attempt))
            .collect();
        let shown = shown
            .into_iter()
            .map(|row| Violation {
                subject: Subject::Reconciliation(row.id),
                detail: match attempts.get(&row.attempt_id) {
                    Some(attempt) => format!(
                        "recorded cost {} for attempt {} of job {}, which carries cost {:?} and bound {:?} (nano-credits)",
                        credits(row.provider_cost_nanos),
                        row.attempt_id,
                        attempt.job_id,
                        attempt.provider_cost_nanos,
                        attempt.provider_cost_upper_bound_nanos
                    ),
                    None => format!("attempt {} vanished", row.attempt_id),
                },
            })
            .collect();
        recorder.violations(invariant, count, shown);
    }
    Ok(())
}
