//! Which groups of queued jobs a claim visits: each (tenant, model, priority) with
//! queued jobs, found by a skip scan of the queued-jobs index — one probe per group —
//! with the tenant's rate limits and until when the model was last paused.

use crate::jobs::flow::{self, BucketScope, Deferral, DeferralReason, RateLimit};
use entity::{JobStatus, Timestamp};
use sea_orm::{ConnectionTrait, DbErr, FromQueryResult, Statement};
use std::num::NonZeroU32;
use uuid::Uuid;

/// One group of a tenant's queued jobs: same model, same priority.
#[derive(Clone, Debug, FromQueryResult)]
pub struct Visit {
    pub tenant_id: Uuid,
    pub model: String,
    pub priority: i32,
    requests_per_minute: Option<i32>,
    tokens_per_minute: Option<i32>,
    /// Until when the provider paused the model (its latest 429), if it ever did.
    paused_until: Option<Timestamp>,
}

impl Visit {
    /// The tenant's own per-minute limits.
    pub fn tenant_rate(&self) -> RateLimit {
        RateLimit::from_counts(self.requests_per_minute, self.tokens_per_minute)
    }

    /// Why the group waits at `now` whatever the budgets say: its model is paused.
    pub fn pause(&self, now: Timestamp) -> Option<Deferral> {
        self.paused_until
            .is_some_and(|until| until > now)
            .then_some(Deferral {
                scope: BucketScope::Model,
                reason: DeferralReason::Paused,
            })
    }

    /// The requests a minute the model may start at `now` while it ramps back up after
    /// a pause ([`flow::ramp_limit`]).
    pub fn ramp(&self, now: Timestamp) -> Option<NonZeroU32> {
        flow::ramp_limit(self.paused_until?, now)
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
/// A recursive query steps from one group to the next, each step one index probe with
/// an equality prefix, so a group of 100,000 jobs costs what a group of one does: the
/// next priority of the same model; when there is none, a marker row (priority null)
/// steps to the tenant's next model; when there is none, a marker row (model null)
/// steps to the next tenant. Every column is its own scalar subquery (SQLite allows
/// no LATERAL join), and a CASE evaluates only the branch it takes. (SQLite does not
/// seek an index by a row comparison against a correlated row, so `(tenant, model,
/// priority) > (…)` would read each tenant's whole backlog.)
pub async fn visit(
    db: &impl ConnectionTrait,
    after: Option<Uuid>,
    until: Option<Uuid>,
    limit: u64,
) -> Result<Vec<Visit>, DbErr> {
    let backend = db.get_database_backend();
    let mut parameters = crate::db::Binds::new(backend);
    let after = parameters.bind(after.unwrap_or(Uuid::nil()));
    let until = parameters.bind(until.unwrap_or(Uuid::max()));
    let limit = parameters.bind(limit as i64);
    let probe = |column: &str, condition: &str, order: &str| {
        format!(
            "(SELECT queued.{column} FROM jobs AS queued
              WHERE queued.status = {queued} AND {condition}
              ORDER BY {order} LIMIT 1)",
            queued = JobStatus::Queued.sql(),
        )
    };
    let first_group = |column: &str, from: &str| {
        probe(
            column,
            &format!("queued.tenant_id > {from} AND queued.tenant_id <= {until}"),
            "queued.tenant_id, queued.model, queued.priority",
        )
    };
    let next_model = |column: &str| {
        probe(
            column,
            "queued.tenant_id = visit.tenant_id AND queued.model > visit.model",
            "queued.model, queued.priority",
        )
    };
    let next_priority = probe(
        "priority",
        "queued.tenant_id = visit.tenant_id AND queued.model = visit.model \
         AND queued.priority > visit.priority",
        "queued.priority",
    );
    let sql = format!(
        "WITH RECURSIVE visit(tenant_id, model, priority, turn) AS (
            SELECT {first_tenant}, {first_model}, {first_priority}, 1
            UNION ALL
            SELECT
                CASE WHEN visit.model IS NULL THEN {next_tenant} ELSE visit.tenant_id END,
                CASE WHEN visit.model IS NULL THEN {next_tenant_model}
                     WHEN visit.priority IS NULL THEN {next_model}
                     ELSE visit.model END,
                CASE WHEN visit.model IS NULL THEN {next_tenant_priority}
                     WHEN visit.priority IS NULL THEN {next_model_priority}
                     ELSE {next_priority} END,
                visit.turn + CASE WHEN visit.model IS NULL THEN 1 ELSE 0 END
            FROM visit
            WHERE visit.tenant_id IS NOT NULL AND visit.turn <= {limit}
        )
        SELECT visit.tenant_id, visit.model, visit.priority,
               limits.requests_per_minute, limits.tokens_per_minute,
               (SELECT pause.paused_until FROM rate_limit_buckets AS pause
                WHERE pause.scope = 'model' AND pause.key = visit.model) AS paused_until
        FROM visit LEFT JOIN tenant_limits AS limits ON limits.tenant_id = visit.tenant_id
        WHERE visit.tenant_id IS NOT NULL AND visit.priority IS NOT NULL AND visit.turn <= {limit}
        ORDER BY visit.tenant_id, visit.model, visit.priority",
        first_tenant = first_group("tenant_id", &after),
        first_model = first_group("model", &after),
        first_priority = first_group("priority", &after),
        next_tenant = first_group("tenant_id", "visit.tenant_id"),
        next_tenant_model = first_group("model", "visit.tenant_id"),
        next_tenant_priority = first_group("priority", "visit.tenant_id"),
        next_model = next_model("model"),
        next_model_priority = next_model("priority"),
    );
    let statement: Statement = parameters.statement(sql);
    Visit::find_by_statement(statement).all(db).await
}
