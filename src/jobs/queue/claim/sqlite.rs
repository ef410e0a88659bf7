//! The claim's statements on SQLite, inside the claim's IMMEDIATE transaction (which
//! holds the database's write lock, so nothing interleaves).

use super::visit::Visit;
use super::{Candidate, NOT_HELD_BY_ITS_BATCH, Round};
use crate::db::Binds;
use entity::{JobStatus, jobs};
use sea_orm::sea_query::{Expr, ExprTrait};
use sea_orm::{ColumnTrait, ConnectionTrait, DbErr, EntityTrait, FromQueryResult, QueryFilter};
use uuid::Uuid;

/// Groups per statement: SQLite refuses a compound SELECT of more than 500 terms.
const GROUPS_PER_STATEMENT: usize = 200;

/// The due jobs of each group, at most `wanted` a group, oldest first: one index
/// range scan per group.
pub async fn due_jobs(
    transaction: &impl ConnectionTrait,
    visits: &[&Visit],
    wanted: usize,
    round: &Round<'_>,
) -> Result<Vec<Candidate>, DbErr> {
    let mut candidates = Vec::new();
    for chunk in visits.chunks(GROUPS_PER_STATEMENT) {
        let mut parameters = Binds::new(transaction.get_database_backend());
        let now = parameters.bind(round.now);
        let limit = parameters.bind(wanted as i64);
        let groups: Vec<String> = chunk
            .iter()
            .map(|visit| {
                format!(
                    "SELECT * FROM (
                        SELECT id, tenant_id, model, priority, next_run_at, token_bound FROM jobs
                        WHERE tenant_id = {tenant} AND model = {model} AND priority = {priority}
                          AND status = {queued} AND next_run_at <= {now}
                          AND {NOT_HELD_BY_ITS_BATCH}
                        ORDER BY next_run_at, id LIMIT {limit})",
                    tenant = parameters.bind(visit.tenant_id),
                    model = parameters.bind(visit.model.clone()),
                    priority = parameters.bind(visit.priority),
                    queued = JobStatus::Queued.sql(),
                )
            })
            .collect();
        let statement = parameters.statement(groups.join(" UNION ALL "));
        candidates.extend(
            Candidate::find_by_statement(statement)
                .all(transaction)
                .await?,
        );
    }
    Ok(candidates)
}

/// Claims the admitted jobs, each with its own token.
pub async fn claim_admitted(
    transaction: &impl ConnectionTrait,
    admitted: &[Uuid],
    round: &Round<'_>,
) -> Result<Vec<jobs::Model>, DbErr> {
    let mut claimed = Vec::with_capacity(admitted.len());
    for id in admitted {
        let rows = jobs::Entity::update_many()
            .col_expr(jobs::Column::Status, Expr::value(JobStatus::Running))
            .col_expr(
                jobs::Column::AttemptCount,
                Expr::col(jobs::Column::AttemptCount).add(1),
            )
            .col_expr(jobs::Column::RunToken, Expr::value(Uuid::new_v4()))
            .col_expr(jobs::Column::LeaseUntil, Expr::value(round.lease_until))
            .col_expr(
                jobs::Column::StartedAt,
                Expr::col(jobs::Column::StartedAt).if_null(round.now),
            )
            .col_expr(jobs::Column::UpdatedAt, Expr::value(round.now))
            .filter(jobs::Column::Id.eq(*id))
            .filter(jobs::Column::Status.eq(JobStatus::Queued))
            .exec_with_returning(transaction)
            .await?;
        claimed.extend(rows);
    }
    Ok(claimed)
}
