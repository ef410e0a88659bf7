//! The spend cap of an access token: the holds of the jobs a token creates, counted
//! against the `maxSpend` it was minted with.

use super::Credits;
use crate::error::ServiceError;
use entity::access_tokens;
use sea_orm::sea_query::{Expr, ExprTrait};
use sea_orm::{ColumnTrait, Condition, ConnectionTrait, EntityTrait, QueryFilter};
use uuid::Uuid;

/// Counts a create's `hold` against the token's `maxSpend`, inside the transaction
/// that creates the job; `TokenSpendExceeded` when it would pass it.
///
/// One conditional update: on PostgreSQL a concurrent create of the same token waits
/// for this one's row lock and then re-checks the condition against what it
/// committed; SQLite runs one write transaction at a time. Either way creates made
/// together are admitted only while their holds fit in all.
pub async fn count_hold(
    db: &impl ConnectionTrait,
    token_id: Uuid,
    hold: Credits,
) -> Result<(), ServiceError> {
    let spent = Expr::col(access_tokens::Column::SpentNanos);
    let counted = access_tokens::Entity::update_many()
        .col_expr(
            access_tokens::Column::SpentNanos,
            spent.clone().add(hold.nanos()),
        )
        .filter(access_tokens::Column::Id.eq(token_id))
        .filter(
            Condition::any()
                .add(access_tokens::Column::MaxSpendNanos.is_null())
                .add(
                    spent
                        .add(hold.nanos())
                        .lte(Expr::col(access_tokens::Column::MaxSpendNanos)),
                ),
        )
        .exec(db)
        .await?;
    if counted.rows_affected == 1 {
        return Ok(());
    }
    let token = access_tokens::Entity::find_by_id(token_id)
        .one(db)
        .await?
        .ok_or(ServiceError::NotFound)?;
    Err(ServiceError::TokenSpendExceeded {
        limit: Credits::from_nanos(token.max_spend_nanos.unwrap_or_default()),
        spent: Credits::from_nanos(token.spent_nanos),
        needed: hold,
    })
}
