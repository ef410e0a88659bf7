//! The claim's statements on PostgreSQL: due jobs of each visited group by index range
//! scans under `FOR UPDATE SKIP LOCKED`, so concurrent claims never wait for each other
//! or take the same job.

use super::visit::Visit;
use super::{Candidate, NOT_HELD_BY_ITS_BATCH, Round};
use crate::db::POSTGRES_CLOCK;
use entity::{JobStatus, jobs};
use sea_orm::{
    ConnectionTrait, DatabaseConnection, DbBackend, DbErr, EntityTrait, FromQueryResult, Statement,
};
use uuid::Uuid;

/// A PostgreSQL array literal of `items`, each quoted (model names may hold commas,
/// quotes or braces).
fn array(items: impl Iterator<Item = String>) -> String {
    let quoted: Vec<String> = items
        .map(|item| format!("\"{}\"", item.replace('\\', "\\\\").replace('"', "\\\"")))
        .collect();
    format!("{{{}}}", quoted.join(","))
}

/// The visited groups as three parallel arrays: tenants, models, priorities.
fn groups(visits: &[&Visit]) -> [sea_orm::Value; 3] {
    [
        array(visits.iter().map(|visit| visit.tenant_id.to_string())).into(),
        array(visits.iter().map(|visit| visit.model.clone())).into(),
        array(visits.iter().map(|visit| visit.priority.to_string())).into(),
    ]
}

/// The due jobs of one group, locked, oldest first: `LIMIT $2` per group.
fn due() -> String {
    format!(
        "
    SELECT due.id, due.tenant_id, due.model, due.priority, due.next_run_at, due.token_bound
    FROM unnest($3::uuid[], $4::text[], $5::int[]) AS visit(tenant_id, model, priority)
    CROSS JOIN LATERAL (
        SELECT jobs.id, jobs.tenant_id, jobs.model, jobs.priority, jobs.next_run_at,
               jobs.token_bound
        FROM jobs
        WHERE jobs.tenant_id = visit.tenant_id AND jobs.model = visit.model
          AND jobs.priority = visit.priority
          AND jobs.status = {queued} AND jobs.next_run_at <= $1
          AND {NOT_HELD_BY_ITS_BATCH}
        ORDER BY jobs.next_run_at, jobs.id
        LIMIT $2
        FOR UPDATE SKIP LOCKED
    ) AS due",
        queued = JobStatus::Queued.sql(),
    )
}

/// One statement, when no budget is in play: the due jobs of each group (locked),
/// ranked within their tenant; then the best `wanted` by rank, each with its own
/// token. MATERIALIZED keeps the planner from re-running the locking part, which
/// could claim more than `wanted` rows.
pub async fn claim_unlimited(
    db: &DatabaseConnection,
    visits: &[Visit],
    wanted: usize,
    round: &Round<'_>,
) -> Result<Vec<jobs::Model>, DbErr> {
    if visits.is_empty() {
        return Ok(Vec::new());
    }
    let sql = format!(
        "WITH candidates AS MATERIALIZED ({due}
        ), ranked AS (
            SELECT id, next_run_at,
                   row_number() OVER (PARTITION BY tenant_id
                                      ORDER BY priority DESC, next_run_at, id) AS tenant_rank
            FROM candidates
        ), numbered AS (
            SELECT id, row_number() OVER (ORDER BY tenant_rank, next_run_at, id) AS position
            FROM ranked
            ORDER BY position
            LIMIT $2
        ), tokens AS (
            SELECT token, position FROM unnest($7::uuid[]) WITH ORDINALITY AS t(token, position)
        )
        UPDATE jobs SET
            status = {running},
            attempt_count = jobs.attempt_count + 1,
            run_token = tokens.token,
            lease_until = {POSTGRES_CLOCK} + $6,
            started_at = COALESCE(jobs.started_at, $1),
            updated_at = $1
        FROM numbered JOIN tokens ON tokens.position = numbered.position
        WHERE jobs.id = numbered.id
        RETURNING jobs.*",
        due = due(),
        running = JobStatus::Running.sql(),
    );
    let visits: Vec<&Visit> = visits.iter().collect();
    let [tenants, models, priorities] = groups(&visits);
    let statement = Statement::from_sql_and_values(
        DbBackend::Postgres,
        sql,
        [
            round.now.into(),
            (wanted as i64).into(),
            tenants,
            models,
            priorities,
            round.lease_micros().into(),
            array((0..wanted).map(|_| Uuid::new_v4().to_string())).into(),
        ],
    );
    jobs::Entity::find().from_raw_sql(statement).all(db).await
}

/// The due jobs of each group, at most `wanted` a group, locked until the caller's
/// transaction ends.
pub async fn due_jobs(
    transaction: &impl ConnectionTrait,
    visits: &[&Visit],
    wanted: usize,
    round: &Round<'_>,
) -> Result<Vec<Candidate>, DbErr> {
    let [tenants, models, priorities] = groups(visits);
    let statement = Statement::from_sql_and_values(
        DbBackend::Postgres,
        due(),
        [
            round.now.into(),
            (wanted as i64).into(),
            tenants,
            models,
            priorities,
        ],
    );
    Candidate::find_by_statement(statement)
        .all(transaction)
        .await
}

/// Claims the admitted jobs (locked by [`due_jobs`]), each with its own token.
pub async fn claim_admitted(
    transaction: &impl ConnectionTrait,
    admitted: &[Uuid],
    round: &Round<'_>,
) -> Result<Vec<jobs::Model>, DbErr> {
    if admitted.is_empty() {
        return Ok(Vec::new());
    }
    let statement = Statement::from_sql_and_values(
        DbBackend::Postgres,
        format!(
            "UPDATE jobs SET
            status = {running},
            attempt_count = jobs.attempt_count + 1,
            run_token = admitted.token,
            lease_until = {POSTGRES_CLOCK} + $2,
            started_at = COALESCE(jobs.started_at, $1),
            updated_at = $1
        FROM unnest($3::uuid[], $4::uuid[]) AS admitted(id, token)
        WHERE jobs.id = admitted.id AND jobs.status = {queued}
        RETURNING jobs.*",
            running = JobStatus::Running.sql(),
            queued = JobStatus::Queued.sql(),
        ),
        [
            round.now.into(),
            round.lease_micros().into(),
            array(admitted.iter().map(Uuid::to_string)).into(),
            array(admitted.iter().map(|_| Uuid::new_v4().to_string())).into(),
        ],
    );
    jobs::Entity::find()
        .from_raw_sql(statement)
        .all(transaction)
        .await
}
