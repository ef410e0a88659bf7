//! Claiming due jobs: fair across tenants, by priority within a tenant, and at a cost
//! that does not grow with the backlog.
//!
//! A claim visits tenants that have queued jobs in turns of at most `limit` tenants,
//! found by a skip scan of the partial index on queued jobs (one probe per tenant,
//! however many jobs each has). For each visited tenant it reads at most `limit` due
//! jobs per priority level, highest priority first and oldest first within a level —
//! again index range scans — and takes jobs rank by rank across the tenants (the
//! oldest first within a rank: priorities are never compared across tenants), so one
//! tenant's 100,000 queued jobs never starve another tenant's single job. The rows it
//! touches are O(claimed × priority levels + tenants with queued jobs), never the
//! backlog. A worker keeps a [`TenantCursor`] between claims, so that with more
//! tenants waiting than one claim visits, each gets its turn.

use crate::db::begin_write;
use entity::{JobStatus, Timestamp, jobs};
use sea_orm::sea_query::{Expr, ExprTrait};
use sea_orm::{
    ColumnTrait, ConnectionTrait, DatabaseConnection, DbBackend, DbErr, EntityTrait,
    FromQueryResult, PaginatorTrait, QueryFilter, Statement,
};
use std::time::Duration;
use uuid::Uuid;

/// A job this worker claimed: the job as claimed, fenced by its run token.
#[derive(Clone, Debug)]
pub struct Claim {
    pub job: jobs::Model,
    pub run_token: Uuid,
}

/// What one claim asks for.
#[derive(Clone, Copy, Debug)]
pub struct ClaimRequest {
    /// Most jobs to take.
    pub limit: u32,
    /// How long each claimed job is owned without renewal.
    pub lease: Duration,
    /// Most jobs of one tenant running at once across every process, if bounded.
    pub tenant_limit: Option<u32>,
}

impl ClaimRequest {
    /// Up to `limit` jobs under a lease of `lease`, with no bound per tenant.
    pub fn new(limit: u32, lease: Duration) -> Self {
        Self {
            limit,
            lease,
            tenant_limit: None,
        }
    }
}

/// The tenant a worker's previous claim visited last; the next claim starts after it.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct TenantCursor(Option<Uuid>);

/// Priorities run from 0 to 9; each level is read by its own index range scan.
const PRIORITY_LEVELS: std::ops::RangeInclusive<i32> = 0..=9;

/// Claims up to `limit` due queued jobs, each with a fresh run token and a lease,
/// visiting tenants from the first (see [`claim_in_turn`]).
pub async fn claim(db: &DatabaseConnection, request: ClaimRequest) -> Result<Vec<Claim>, DbErr> {
    claim_in_turn(db, request, &mut TenantCursor::default()).await
}

/// Claims up to `limit` due queued jobs, visiting tenants after `cursor` (wrapping
/// round) in turns of at most `limit` tenants until the claim is full or every tenant
/// with queued jobs was visited once; `cursor` then names the last tenant visited.
///
/// A tenant already running `tenant_limit` jobs gets no more (a soft bound: two claims
/// racing may both admit up to it). Row locks last only the claim's statement on
/// PostgreSQL (`FOR UPDATE SKIP LOCKED`, so concurrent claims never wait for each other
/// or take the same job) and its IMMEDIATE transaction on SQLite.
pub async fn claim_in_turn(
    db: &DatabaseConnection,
    request: ClaimRequest,
    cursor: &mut TenantCursor,
) -> Result<Vec<Claim>, DbErr> {
    if request.limit == 0 {
        return Ok(Vec::new());
    }
    let now = Timestamp::now();
    let lease_until =
        now.plus(chrono::Duration::from_std(request.lease).unwrap_or(chrono::Duration::MAX));
    let round = Round {
        now,
        lease_until,
        tenant_limit: i64::from(request.tenant_limit.unwrap_or(u32::MAX)),
    };
    let turn_size = u64::from(request.limit);
    let backend = db.get_database_backend();
    // SQLite has no row locks: the IMMEDIATE transaction holds the database's write
    // lock from the first read, so no other claim can interleave.
    let sqlite = match backend {
        DbBackend::Postgres => None,
        _ => Some(begin_write(db).await?),
    };
    let started_after = cursor.0;
    let mut after = started_after;
    let mut wrapped = false;
    let mut claimed: Vec<jobs::Model> = Vec::new();
    while claimed.len() < request.limit as usize {
        // After wrapping round, visit only up to where this claim began.
        let until = if wrapped { started_after } else { None };
        let tenants = match &sqlite {
            Some(transaction) => {
                tenants_with_queued_jobs(transaction, after, until, turn_size).await?
            }
            None => tenants_with_queued_jobs(db, after, until, turn_size).await?,
        };
        if let Some(last) = tenants.last() {
            cursor.0 = Some(*last);
            let wanted = request.limit as usize - claimed.len();
            let taken = match &sqlite {
                Some(transaction) => claim_sqlite(transaction, &tenants, wanted, &round).await?,
                None => claim_postgres(db, &tenants, wanted, &round).await?,
            };
            claimed.extend(taken);
        }
        if tenants.len() as u64 == turn_size {
            after = tenants.last().copied();
        } else if !wrapped && started_after.is_some() {
            wrapped = true;
            after = None;
        } else {
            break;
        }
    }
    if let Some(transaction) = sqlite {
        transaction.commit().await?;
    }
    Ok(claimed
        .into_iter()
        .filter_map(|job| {
            let run_token = job.run_token?;
            Some(Claim { job, run_token })
        })
        .collect())
}

/// The instant and bounds one claim works with.
struct Round {
    now: Timestamp,
    lease_until: Timestamp,
    tenant_limit: i64,
}

#[derive(FromQueryResult)]
struct TenantRow {
    tenant_id: Uuid,
}

/// Up to `limit` tenants with queued jobs, in id order, after `after` and up to
/// `until` (inclusive): a skip scan of the queued-jobs index, one probe per tenant.
async fn tenants_with_queued_jobs(
    db: &impl ConnectionTrait,
    after: Option<Uuid>,
    until: Option<Uuid>,
    limit: u64,
) -> Result<Vec<Uuid>, DbErr> {
    let backend = db.get_database_backend();
    let [after_p, until_p, limit_p] = placeholders(backend);
    let next = |from: &str| {
        format!(
            "(SELECT queued.tenant_id FROM jobs AS queued
              WHERE queued.status = 'queued' AND queued.tenant_id > {from} AND queued.tenant_id <= {until_p}
              ORDER BY queued.tenant_id LIMIT 1)"
        )
    };
    let sql = format!(
        "WITH RECURSIVE visit(tenant_id, turn) AS (
            SELECT {first}, 1
            UNION ALL
            SELECT {following}, visit.turn + 1 FROM visit
            WHERE visit.tenant_id IS NOT NULL AND visit.turn < {limit_p}
        )
        SELECT tenant_id FROM visit WHERE tenant_id IS NOT NULL",
        first = next(after_p),
        following = next("visit.tenant_id"),
    );
    let statement = Statement::from_sql_and_values(
        backend,
        sql,
        [
            after.unwrap_or(Uuid::nil()).into(),
            until.unwrap_or(Uuid::max()).into(),
            (limit as i64).into(),
        ],
    );
    Ok(TenantRow::find_by_statement(statement)
        .all(db)
        .await?
        .into_iter()
        .map(|row| row.tenant_id)
        .collect())
}

fn placeholders<const N: usize>(backend: DbBackend) -> [&'static str; N] {
    const POSTGRES: [&str; 8] = ["$1", "$2", "$3", "$4", "$5", "$6", "$7", "$8"];
    const SQLITE: [&str; 8] = ["?1", "?2", "?3", "?4", "?5", "?6", "?7", "?8"];
    let all = if backend == DbBackend::Postgres {
        POSTGRES
    } else {
        SQLITE
    };
    std::array::from_fn(|index| all[index])
}

/// One statement: for each visited tenant and priority level, the oldest due jobs
/// (locked with SKIP LOCKED, so concurrent claims take different jobs), ranked within
/// their tenant; then the best `wanted` by rank, each with its own token.
/// MATERIALIZED keeps the planner from re-running the locking part, which could
/// claim more than `wanted` rows.
async fn claim_postgres(
    db: &DatabaseConnection,
    tenants: &[Uuid],
    wanted: usize,
    round: &Round,
) -> Result<Vec<jobs::Model>, DbErr> {
    let sql = r#"
        WITH visited AS (
            SELECT tenant_id,
                   CASE WHEN $5 < 2147483647
                        THEN (SELECT count(*) FROM jobs AS running
                              WHERE running.tenant_id = visit.tenant_id AND running.status = 'running')
                        ELSE 0 END AS busy
            FROM unnest($3::uuid[]) AS visit(tenant_id)
        ), candidates AS MATERIALIZED (
            SELECT due.id, due.next_run_at, visited.busy,
                   row_number() OVER (PARTITION BY visited.tenant_id
                                      ORDER BY due.priority DESC, due.next_run_at, due.id) AS tenant_rank
            FROM visited
            CROSS JOIN generate_series(9, 0, -1) AS level(priority)
            CROSS JOIN LATERAL (
                SELECT jobs.id, jobs.priority, jobs.next_run_at FROM jobs
                WHERE jobs.tenant_id = visited.tenant_id AND jobs.priority = level.priority
                  AND jobs.status = 'queued' AND jobs.next_run_at <= $1
                ORDER BY jobs.next_run_at, jobs.id
                LIMIT $2
                FOR UPDATE SKIP LOCKED
            ) AS due
        ), numbered AS (
            SELECT id, row_number() OVER (ORDER BY tenant_rank, next_run_at, id) AS position
            FROM candidates
            WHERE tenant_rank + busy <= $5
            ORDER BY position
            LIMIT $2
        ), tokens AS (
            SELECT token, position FROM unnest($6::uuid[]) WITH ORDINALITY AS t(token, position)
        )
        UPDATE jobs SET
            status = 'running',
            attempt_count = jobs.attempt_count + 1,
            run_token = tokens.token,
            lease_until = $4,
            started_at = COALESCE(jobs.started_at, $1),
            updated_at = $1
        FROM numbered JOIN tokens ON tokens.position = numbered.position
        WHERE jobs.id = numbered.id
        RETURNING jobs.*"#;
    let uuid_array = |ids: &mut dyn Iterator<Item = Uuid>| {
        format!(
            "{{{}}}",
            ids.map(|id| id.to_string()).collect::<Vec<_>>().join(",")
        )
    };
    let statement = Statement::from_sql_and_values(
        DbBackend::Postgres,
        sql,
        [
            round.now.micros().into(),
            (wanted as i64).into(),
            uuid_array(&mut tenants.iter().copied()).into(),
            round.lease_until.micros().into(),
            round.tenant_limit.into(),
            uuid_array(&mut (0..wanted).map(|_| Uuid::new_v4())).into(),
        ],
    );
    jobs::Entity::find().from_raw_sql(statement).all(db).await
}

/// A due queued job, as the claim ranks it.
#[derive(Clone, Copy, Debug, FromQueryResult)]
struct Candidate {
    id: Uuid,
    priority: i32,
    next_run_at: i64,
}

/// The same choice as on PostgreSQL, one tenant at a time inside the claim's
/// IMMEDIATE transaction (SQLite has no LATERAL join).
async fn claim_sqlite(
    transaction: &impl ConnectionTrait,
    tenants: &[Uuid],
    wanted: usize,
    round: &Round,
) -> Result<Vec<jobs::Model>, DbErr> {
    // One range scan of the queued-jobs index per priority level.
    let levels: Vec<String> = PRIORITY_LEVELS
        .rev()
        .map(|level| {
            format!(
                "SELECT * FROM (SELECT id, priority, next_run_at FROM jobs
                 WHERE tenant_id = ?1 AND priority = {level} AND status = 'queued'
                   AND next_run_at <= ?2
                 ORDER BY next_run_at, id LIMIT ?3)"
            )
        })
        .collect();
    let sql = levels.join(" UNION ALL ");
    let mut ranked: Vec<(usize, Candidate)> = Vec::new();
    for tenant in tenants {
        let busy = if round.tenant_limit < i64::from(i32::MAX) {
            jobs::Entity::find()
                .filter(jobs::Column::TenantId.eq(*tenant))
                .filter(jobs::Column::Status.eq(JobStatus::Running))
                .count(transaction)
                .await?
        } else {
            0
        };
        let statement = Statement::from_sql_and_values(
            DbBackend::Sqlite,
            sql.clone(),
            [
                (*tenant).into(),
                round.now.micros().into(),
                (wanted as i64).into(),
            ],
        );
        let mut due = Candidate::find_by_statement(statement)
            .all(transaction)
            .await?;
        due.sort_by_key(|job| (std::cmp::Reverse(job.priority), job.next_run_at, job.id));
        let room = usize::try_from(round.tenant_limit - busy as i64).unwrap_or(0);
        ranked.extend(due.into_iter().take(room).enumerate());
    }
    ranked.sort_by_key(|(rank, job)| (*rank, job.next_run_at, job.id));
    let mut claimed = Vec::with_capacity(wanted);
    for (_, job) in ranked.into_iter().take(wanted) {
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
            .filter(jobs::Column::Id.eq(job.id))
            .filter(jobs::Column::Status.eq(JobStatus::Queued))
            .exec_with_returning(transaction)
            .await?;
        claimed.extend(rows);
    }
    Ok(claimed)
}
