//! Which groups of queued jobs a claim visits: each (tenant, model, priority) with
//! queued jobs, found by a skip scan of the queued-jobs index — one probe per group —
//! with the tenant's rate limits and whether the model is paused.

use crate::jobs::flow::{Deferral, DeferralReason, RateLimit, Scope};
use entity::Timestamp;
use sea_orm::{ConnectionTrait, DbErr, FromQueryResult, Statement};
use uuid::Uuid;

/// One group of a tenant's queued jobs: same model, same priority.
#[derive(Clone, Debug, FromQueryResult)]
pub struct Visit {
    pub tenant_id: Uuid,
    pub model: String,
    pub priority: i32,
    requests_per_minute: Option<i32>,
    tokens_per_minute: Option<i32>,
    /// 1 when the provider paused the model (a 429) until after now.
    paused: i32,
}

impl Visit {
    /// The tenant's own per-minute limits.
    pub fn tenant_rate(&self) -> RateLimit {
        RateLimit::from_counts(self.requests_per_minute, self.tokens_per_minute)
    }

    /// Why the group waits whatever the budgets say: its model is paused.
    pub fn pause(&self) -> Option<Deferral> {
        (self.paused != 0).then_some(Deferral {
            scope: Scope::Model,
            reason: DeferralReason::Paused,
        })
    }
}

/// How many tenants `visits` (in tenant order) cover.
pub fn tenants(visits: &[Visit]) -> usize {
    let mut count = 0;
    let mut previous = None;
    for visit in visits {
        if previous != Some(visit.tenant_id) {
            count += 1;
            previous = Some(visit.tenant_id);
        }
    }
    count
}

/// The groups of up to `limit` tenants with queued jobs, in (tenant, model, priority)
/// order, from the first tenant after `after` up to `until` (inclusive).
///
/// A recursive query steps from one group to the next with a row comparison on the
/// index's leading columns; each step is one index probe on both backends, so a group
/// of 100,000 jobs costs what a group of one does. Every column of the next group is
/// its own scalar subquery (SQLite allows no LATERAL join), each the same probe.
pub async fn visit(
    db: &impl ConnectionTrait,
    after: Option<Uuid>,
    until: Option<Uuid>,
    limit: u64,
    now: Timestamp,
) -> Result<Vec<Visit>, DbErr> {
    let backend = db.get_database_backend();
    let mut parameters = crate::db::Parameters::new(backend);
    let after = parameters.bind(after.unwrap_or(Uuid::nil()));
    let until = parameters.bind(until.unwrap_or(Uuid::max()));
    let limit = parameters.bind(limit as i64);
    let now = parameters.bind(now);
    let first = |column: &str| {
        format!(
            "(SELECT queued.{column} FROM jobs AS queued
              WHERE queued.status = 'queued' AND queued.tenant_id > {after} AND queued.tenant_id <= {until}
              ORDER BY queued.tenant_id, queued.model, queued.priority LIMIT 1)"
        )
    };
    let next = |column: &str| {
        format!(
            "(SELECT queued.{column} FROM jobs AS queued
              WHERE queued.status = 'queued'
                AND (queued.tenant_id, queued.model, queued.priority)
                    > (visit.tenant_id, visit.model, visit.priority)
                AND queued.tenant_id <= {until}
              ORDER BY queued.tenant_id, queued.model, queued.priority LIMIT 1)"
        )
    };
    let sql = format!(
        "WITH RECURSIVE visit(tenant_id, model, priority, turn) AS (
            SELECT {first_tenant}, {first_model}, {first_priority}, 1
            UNION ALL
            SELECT {next_tenant}, {next_model}, {next_priority},
                   visit.turn + CASE WHEN {next_tenant} = visit.tenant_id THEN 0 ELSE 1 END
            FROM visit
            WHERE visit.tenant_id IS NOT NULL AND visit.turn <= {limit}
        )
        SELECT visit.tenant_id, visit.model, visit.priority,
               limits.requests_per_minute, limits.tokens_per_minute,
               CASE WHEN EXISTS (
                   SELECT 1 FROM rate_limit_buckets AS pause
                   WHERE pause.scope = 'model' AND pause.key = visit.model
                     AND pause.paused_until > {now}
               ) THEN 1 ELSE 0 END AS paused
        FROM visit LEFT JOIN tenant_limits AS limits ON limits.tenant_id = visit.tenant_id
        WHERE visit.tenant_id IS NOT NULL AND visit.turn <= {limit}
        ORDER BY visit.tenant_id, visit.model, visit.priority",
        first_tenant = first("tenant_id"),
        first_model = first("model"),
        first_priority = first("priority"),
        next_tenant = next("tenant_id"),
        next_model = next("model"),
        next_priority = next("priority"),
    );
    let statement: Statement = parameters.statement(sql);
    Visit::find_by_statement(statement).all(db).await
}
