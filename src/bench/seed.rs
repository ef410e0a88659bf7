//! Seeding a backlog fast, in the shapes the real create path writes.
//!
//! One job per tenant is created through `jobs::service::create_job` (so its row, hold,
//! ledger entry and `CREATED` event are exactly what production writes); then each
//! template is copied `count` times by set-based SQL over a recursive series: the job
//! rows (fresh ids, their own idempotency keys, one microsecond apart), a held
//! reservation of the template's amount, a `hold` ledger entry and a `CREATED` event
//! each, and the tenant's cached `held` raised by the total — so `jobledger audit`
//! holds over a seeded database exactly as over one filled through the API.

use crate::billing::ledger::{self, NewGrant};
use crate::billing::prices;
use crate::bus::EventBus;
use crate::db::begin_write;
use crate::error::ServiceError;
use crate::jobs::input::{JobRequest, MessageRequest, NewJob};
use crate::jobs::service;
use crate::llm::{PromptCounting, ProviderRegistry};
use entity::{JobStatus, Timestamp, credit_reservations};
use sea_orm::{
    ColumnTrait, ConnectionTrait, DatabaseConnection, DbBackend, EntityTrait, QueryFilter,
};
use uuid::Uuid;

/// The model every seeded job asks for.
pub const MODEL: &str = "gpt-4o-mini";

/// Creates a tenant with enough credit for `jobs` jobs; returns its id and API key.
pub async fn funded_tenant(
    db: &DatabaseConnection,
    name: &str,
    jobs: u64,
) -> Result<(Uuid, String), ServiceError> {
    let transaction = begin_write(db).await?;
    let (tenant, key) = crate::accounts::tenants::create_tenant(&transaction, name).await?;
    transaction.commit().await?;
    let price = prices::price_at(db, MODEL, Timestamp::now())
        .await?
        .ok_or_else(|| ServiceError::validation(format!("{MODEL} has no price")))?;
    // Counted as the built-in simulator counts, which the benchmark runs against.
    let template = job(0);
    let per_job = template.charging.job_hold(
        template
            .input
            .call_bound(PromptCounting::QuarterBytes, &template.model),
        &price,
        template.max_attempts,
        template.input.stream_output,
    );
    // Room for every seeded job and for the template and benchmark creates on top.
    let amount = per_job.times(u32::try_from(jobs + 10_000).unwrap_or(u32::MAX));
    ledger::grant_credits(
        db,
        NewGrant {
            expires_at: None,
            tenant_id: tenant.id,
            amount,
            idempotency_key: format!("bench-{}", Uuid::new_v4()),
            reason: Some("benchmark".to_owned()),
        },
    )
    .await?;
    Ok((tenant.id, key.expose().to_owned()))
}

/// The job the benchmark creates: a short prompt the simulator answers at once.
pub fn job(index: u64) -> NewJob {
    job_saying(index, "Summarise: the quarter went well.")
}

/// A benchmark job whose prompt is `content` (which may carry simulator directives).
pub fn job_saying(index: u64, content: &str) -> NewJob {
    NewJob::parse(JobRequest {
        idempotency_key: format!("bench-create-{index}-{}", Uuid::new_v4().simple()),
        model: MODEL.to_owned(),
        messages: vec![MessageRequest::text("user", content)],
        max_output_tokens: 64,
        response_schema: None,
        max_attempts: None,
        retry_unknown_outcome: None,
        metadata: None,
        stream_output: None,
        priority: None,
        run_at: None,
        deadline: None,
        default_deadline: crate::jobs::input::DEFAULT_DEADLINE,
        charging: Default::default(),
        labels: Vec::new(),
        parameters: Default::default(),
        tools: Default::default(),
        fallback_models: Vec::new(),
    })
    .expect("the benchmark's job is valid")
}

/// Adds `count` queued jobs to `tenant`, copied from `template` once created through
/// the service.
pub async fn queued_jobs(
    db: &DatabaseConnection,
    providers: &ProviderRegistry,
    tenant: Uuid,
    count: u64,
    template: NewJob,
) -> Result<(), ServiceError> {
    let template = service::create_job(db, &EventBus::default(), providers, tenant, template)
        .await?
        .job;
    let hold = credit_reservations::Entity::find()
        .filter(credit_reservations::Column::JobId.eq(template.id))
        .one(db)
        .await?
        .map_or(0, |reservation| reservation.amount_nanos);
    let backend = db.get_database_backend();
    let new_id = match backend {
        DbBackend::Postgres => "gen_random_uuid()",
        _ => "randomblob(16)",
    };
    // Every value below is made here (a number, hex, a key of hex and dashes), so the
    // statements carry them inline and bind nothing.
    let batch = Uuid::new_v4().simple();
    let template_key = &template.idempotency_key;
    let template_row = format!("(SELECT id FROM jobs WHERE idempotency_key = '{template_key}')");
    let queued = JobStatus::Queued.sql();
    let seeded = format!(
        "FROM jobs WHERE tenant_id = (SELECT tenant_id FROM jobs WHERE id = {template_row}) \
         AND idempotency_key LIKE 'seed-{batch}-%'"
    );
    let statements = [
        format!(
            "WITH RECURSIVE series(n) AS (SELECT 1 UNION ALL SELECT n + 1 FROM series WHERE n < {count})
            INSERT INTO jobs (id, tenant_id, idempotency_key, request_hash, status, cancel_requested,
                model, input, retry_unknown_outcome, result, error_code, error_message, attempt_count,
                max_attempts, run_token, lease_until, next_run_at, priority, run_at, simulated,
                last_event_seq, created_at, updated_at, started_at, finished_at, deadline)
            SELECT {new_id}, t.tenant_id, 'seed-{batch}-' || series.n, t.request_hash,
                {queued}, t.cancel_requested, t.model, t.input, t.retry_unknown_outcome, NULL, NULL,
                NULL, 0, t.max_attempts, NULL, NULL, t.next_run_at + series.n, t.priority, NULL,
                t.simulated, 1, t.created_at + series.n, t.updated_at + series.n, NULL, NULL,
                t.deadline
            FROM jobs AS t, series WHERE t.id = {template_row}"
        ),
        format!(
            "INSERT INTO credit_reservations (id, job_id, tenant_id, amount_nanos, status,
                settled_amount_nanos, released_amount_nanos, created_at, resolved_at)
            SELECT {new_id}, id, tenant_id, {hold}, 'held', 0, 0, created_at, NULL {seeded}"
        ),
        format!(
            "INSERT INTO ledger_entries (id, tenant_id, kind, amount_nanos, job_id, grant_id, created_at)
            SELECT {new_id}, tenant_id, 'hold', {hold}, id, NULL, created_at {seeded}"
        ),
        format!(
            "INSERT INTO job_events (job_id, seq, tenant_id, kind, status, at, data)
            SELECT id, 1, tenant_id, 'created', {queued}, created_at, NULL {seeded}"
        ),
        // The copies' holds count into the spend of the template's day and month, as
        // creates would (they are created microseconds after it: the same day, unless
        // the template was made in the last fraction of a second before midnight).
        format!(
            "UPDATE tenants SET held_nanos = held_nanos + {hold} * (SELECT count(*) {seeded}),
                spend_day_nanos = spend_day_nanos + {hold} * (SELECT count(*) {seeded}),
                spend_month_nanos = spend_month_nanos + {hold} * (SELECT count(*) {seeded})
            WHERE id = (SELECT tenant_id FROM jobs WHERE id = {template_row})"
        ),
    ];
    let transaction = begin_write(db).await?;
    for sql in statements {
        transaction.execute_unprepared(&sql).await?;
    }
    transaction.commit().await?;
    Ok(())
}
