//! Creating, reading, listing and cancelling jobs on behalf of a tenant.

use super::budget::Spent;
use super::events;
use super::fallbacks::ModelChain;
use super::holds;
use super::input::{self, Deadline, NewJob};
use super::labels::{self, Label};
use super::lifecycle::{self, Cancel};
use super::reach::JobReach;
use crate::billing::alerts;
use crate::billing::{ledger, limits, token_spend};
use crate::bus::{EventBus, EventNotice};
use crate::db::begin_write;
use crate::error::ServiceError;
use crate::llm::ProviderRegistry;
use crate::metrics::Metrics;
use crate::page::{Page, PageRequest};
use entity::{EventKind, JobStatus, JsonText, Timestamp, attempts, job_events, job_labels, jobs};
use sea_orm::sea_query::{Expr, ExprTrait, OnConflict};
use sea_orm::{
    ActiveValue::Set, ColumnTrait, ConnectionTrait, DatabaseConnection, EntityTrait,
    FromQueryResult, Iterable, JoinType, QueryFilter, QueryOrder, QuerySelect, QueryTrait,
    RelationTrait,
};
use uuid::Uuid;

/// The answer to a create: the job, and whether it existed before this request.
#[derive(Clone, Debug)]
pub struct CreatedJob {
    pub job: jobs::Model,
    pub replayed: bool,
}

/// Creates a job, its credit hold and its `CREATED` event in one transaction — or,
/// when the tenant used this idempotency key before, returns that job.
///
/// The hold covers every call the job may pay for (`maxAttempts` of them, see
/// `jobs::budget`). Concurrent creates with one key yield one job: the loser of the
/// race inserts nothing on the unique (tenant, key) index and reads the winner's.
pub async fn create_job(
    db: &DatabaseConnection,
    bus: &EventBus,
    providers: &ProviderRegistry,
    tenant_id: Uuid,
    new: NewJob,
) -> Result<CreatedJob, ServiceError> {
    create_job_at(db, bus, providers, tenant_id, new, Timestamp::now()).await
}

/// [`create_job`] as if it were `now`: the instant prices the job, stamps it, and
/// decides which UTC day and month its hold counts against — so a test can create jobs
/// on either side of a period boundary.
pub async fn create_job_at(
    db: &DatabaseConnection,
    bus: &EventBus,
    providers: &ProviderRegistry,
    tenant_id: Uuid,
    new: NewJob,
    now: Timestamp,
) -> Result<CreatedJob, ServiceError> {
    create(db, bus, providers, tenant_id, new, now, None).await
}

/// [`create_job`] for an access token: its hold also counts against the token's
/// `maxSpend`, in the same transaction, so the token's creates never hold more than
/// it allows in all (`TokenSpendExceeded`). A replay counts nothing again.
pub async fn create_job_for_token(
    db: &DatabaseConnection,
    bus: &EventBus,
    providers: &ProviderRegistry,
    tenant_id: Uuid,
    token_id: Uuid,
    new: NewJob,
) -> Result<CreatedJob, ServiceError> {
    create(
        db,
        bus,
        providers,
        tenant_id,
        new,
        Timestamp::now(),
        Some(token_id),
    )
    .await
}

async fn create(
    db: &DatabaseConnection,
    bus: &EventBus,
    providers: &ProviderRegistry,
    tenant_id: Uuid,
    new: NewJob,
    now: Timestamp,
    token_id: Option<Uuid>,
) -> Result<CreatedJob, ServiceError> {
    let fingerprint = new.fingerprint();
    // A deadline that has passed refuses only a new job: the retry of a create whose
    // answer was lost finds the job the first try made.
    if let Deadline::At(deadline) = new.deadline
        && deadline <= now
    {
        return match find_by_key(db, tenant_id, new.idempotency_key.as_str()).await? {
            Some(job) if job.request_hash == fingerprint => Ok(CreatedJob {
                job,
                replayed: true,
            }),
            Some(_) => Err(ServiceError::IdempotencyConflict),
            None => Err(input::past_deadline()),
        };
    }
    let super::quote::JobQuote {
        hold,
        model: first_model,
        token_bound,
        simulated,
        held_prices,
        ..
    } = super::quote::quote(db, providers, &new, now).await?;
    let transaction = begin_write(db).await?;
    let starts_at = new.run_at.map_or(now, |run_at| Ord::max(run_at, now));
    let row = jobs::ActiveModel {
        id: Set(Uuid::now_v7()),
        tenant_id: Set(tenant_id),
        idempotency_key: Set(new.idempotency_key.as_str().to_owned()),
        request_hash: Set(fingerprint.clone()),
        status: Set(JobStatus::Queued),
        cancel_requested: Set(false),
        model: Set(first_model),
        input: Set(JsonText(
            serde_json::to_value(&new.input).expect("job input serializes"),
        )),
        retry_unknown_outcome: Set(new.retry_unknown_outcome),
        result: Set(None),
        error_code: Set(None),
        error_message: Set(None),
        attempt_count: Set(0),
        max_attempts: Set(new.max_attempts as i32),
        run_token: Set(None),
        lease_until: Set(None),
        next_run_at: Set(starts_at),
        priority: Set(new.priority.value()),
        run_at: Set(new.run_at),
        simulated: Set(simulated),
        token_bound: Set(Some(token_bound)),
        last_event_seq: Set(1),
        created_at: Set(now),
        updated_at: Set(now),
        started_at: Set(None),
        finished_at: Set(None),
        payloads_pruned_at: Set(None),
        batch_id: Set(None),
        custom_id: Set(None),
        rerun_of: Set(new.rerun_of),
        deadline: Set(Some(new.deadline.instant(starts_at))),
        model_chain: Set(
            ModelChain::new(new.model.clone(), new.fallback_models.clone()).to_column(),
        ),
        held_prices: Set(Some(held_prices.to_column())),
    };
    // A key used before inserts nothing; on PostgreSQL an insert racing with another
    // one of the same key waits for it to commit, so the job it made is there to read.
    let inserted = jobs::Entity::insert(row)
        .on_conflict(
            OnConflict::columns([jobs::Column::TenantId, jobs::Column::IdempotencyKey])
                .do_nothing()
                .to_owned(),
        )
        .exec_with_returning(&transaction)
        .await;
    let job = match inserted {
        Ok(job) => job,
        // SeaORM tells "no row came back" by either name.
        Err(sea_orm::DbErr::RecordNotInserted | sea_orm::DbErr::RecordNotFound(_)) => {
            transaction.rollback().await?;
            let existing = find_by_key(db, tenant_id, new.idempotency_key.as_str())
                .await?
                .ok_or_else(|| {
                    ServiceError::Database(sea_orm::DbErr::Custom("job vanished".into()))
                })?;
            return replay(existing, &fingerprint);
        }
        Err(error) => return Err(error.into()),
    };
    let created = events::append(&transaction, &job, EventKind::Created, None).await?;
    labels::write(&transaction, tenant_id, job.id, &new.labels).await?;
    // Last: the hold locks the tenant's row, which every create of the tenant needs,
    // so it is held for one statement and the commit. A refusal rolls everything
    // back as the transaction drops.
    ledger::hold(&transaction, tenant_id, job.id, hold).await?;
    // After the tenant's row: every create that counts against a token locks the
    // two rows in this order.
    if let Some(token_id) = token_id {
        token_spend::count_hold(&transaction, token_id, hold).await?;
    }
    let counted_at = match limits::admit_spend(&transaction, tenant_id, hold, now).await {
        Ok(counted_at) => counted_at,
        Err(refusal) => {
            transaction.rollback().await?;
            report_spend_limit(db, tenant_id, &refusal, now).await?;
            return Err(refusal);
        }
    };
    // This process's clock is behind the one that started the tenant's current day:
    // the job is dated into that day, which counted its hold (rare; one more UPDATE).
    let job = if counted_at == job.created_at {
        job
    } else {
        jobs::Entity::update(jobs::ActiveModel {
            id: Set(job.id),
            created_at: Set(counted_at),
            ..Default::default()
        })
        .exec(&transaction)
        .await?
    };
    alerts::after_balance_fell(&transaction, tenant_id, hold).await?;
    transaction.commit().await?;
    tracing::info!(job.id = %job.id, tenant.id = %tenant_id, model = %job.model, hold = %hold, "job created");
    bus.publish([created]);
    Ok(CreatedJob {
        job,
        replayed: false,
    })
}

/// Queues `spend_limit.reached` for a create a cap refused (once per period), in a
/// transaction of its own: the refused create wrote nothing.
pub(super) async fn report_spend_limit(
    db: &DatabaseConnection,
    tenant_id: Uuid,
    refusal: &ServiceError,
    now: Timestamp,
) -> Result<(), ServiceError> {
    let ServiceError::SpendLimitExceeded {
        period,
        limit,
        spend,
        ..
    } = refusal
    else {
        return Ok(());
    };
    let transaction = begin_write(db).await?;
    alerts::spend_limit_reached(&transaction, tenant_id, *period, *limit, *spend, now).await?;
    transaction.commit().await?;
    Ok(())
}

pub(super) async fn find_by_key(
    db: &impl ConnectionTrait,
    tenant_id: Uuid,
    idempotency_key: &str,
) -> Result<Option<jobs::Model>, sea_orm::DbErr> {
    jobs::Entity::find()
        .filter(jobs::Column::TenantId.eq(tenant_id))
        .filter(jobs::Column::IdempotencyKey.eq(idempotency_key))
        .one(db)
        .await
}

fn replay(existing: jobs::Model, fingerprint: &str) -> Result<CreatedJob, ServiceError> {
    if existing.request_hash == fingerprint {
        Ok(CreatedJob {
            job: existing,
            replayed: true,
        })
    } else {
        Err(ServiceError::IdempotencyConflict)
    }
}

/// The tenant's job with this id. Another tenant's job is `NotFound`, not
/// `Forbidden`: a tenant must not learn which ids exist.
pub async fn find_job(
    db: &impl ConnectionTrait,
    tenant_id: Uuid,
    job_id: Uuid,
) -> Result<jobs::Model, ServiceError> {
    jobs::Entity::find_by_id(job_id)
        .filter(jobs::Column::TenantId.eq(tenant_id))
        .one(db)
        .await?
        .ok_or(ServiceError::NotFound)
}

/// The tenant's job created with this idempotency key; another tenant's key finds
/// nothing (`NotFound`), as [`find_job`] does for its ids. A batch item's key
/// (`batch/…`) finds the item. A labelled token finds a job of its own namespace by
/// the key it sent, else the tenant's job of that key when it is within reach.
pub async fn find_job_by_key(
    db: &impl ConnectionTrait,
    tenant_id: Uuid,
    reach: &JobReach,
    idempotency_key: String,
) -> Result<jobs::Model, ServiceError> {
    for key in reach.lookup_keys(idempotency_key) {
        if let Some(job) = find_by_key(db, tenant_id, &key).await? {
            return Ok(job);
        }
    }
    Err(ServiceError::NotFound)
}

/// What a page of jobs is narrowed to: the caller's reach, and the client's filters.
#[derive(Clone, Debug, Default)]
pub struct JobFilter {
    pub reach: JobReach,
    pub status: Option<JobStatus>,
    pub label: Option<Label>,
}

/// A page of at most `first` jobs older than the job `after`, narrowed by `filter`.
pub async fn list_jobs(
    db: &impl ConnectionTrait,
    tenant_id: Uuid,
    page: PageRequest,
    filter: JobFilter,
) -> Result<Page<jobs::Model>, ServiceError> {
    let PageRequest { first, after } = page;
    let mut query = jobs_without_payloads().filter(jobs::Column::TenantId.eq(tenant_id));
    if let Some(after) = after {
        // Ids are version-7 UUIDs: ordering by id is ordering by creation.
        query = query.filter(jobs::Column::Id.lt(after));
    }
    let Some(labels) = filter.reach.labels_with(filter.label) else {
        return Ok(Page::empty());
    };
    if let JobReach::Listed(ids) = &filter.reach {
        query = query.filter(jobs::Column::Id.is_in(ids.iter().copied()));
    }
    let mut order = jobs::Column::Id.into_expr();
    let mut labels = labels.into_iter();
    if let Some(label) = labels.next() {
        // Driven by the label index: its rows for (tenant, key, value) in order of job
        // id, each joined to its job by primary key, so the page is a range of the
        // index read backwards. The cursor bounds both sides: PostgreSQL does not carry
        // an inequality across the join, and a merge join (its choice for a label on
        // most of a tenant's jobs) otherwise walks the jobs from the newest down to
        // the cursor on every page.
        query = query
            .join_rev(JoinType::InnerJoin, job_labels::Relation::Job.def())
            .filter(job_labels::Column::TenantId.eq(tenant_id))
            .filter(job_labels::Column::Key.eq(label.key()))
            .filter(job_labels::Column::Value.eq(label.value()));
        if let Some(after) = after {
            query = query.filter(job_labels::Column::JobId.lt(after));
        }
        order = job_labels::Column::JobId.into_expr();
    }
    // Any further label (an access token's own, with the client's) is a lookup of
    // the same index per job of the page's range.
    for label in labels {
        query = query.filter(
            jobs::Column::Id.in_subquery(
                job_labels::Entity::find()
                    .select_only()
                    .column(job_labels::Column::JobId)
                    .filter(job_labels::Column::TenantId.eq(tenant_id))
                    .filter(job_labels::Column::Key.eq(label.key()))
                    .filter(job_labels::Column::Value.eq(label.value()))
                    .into_query(),
            ),
        );
    }
    if let Some(status) = filter.status {
        query = query.filter(jobs::Column::Status.eq(status));
    }
    let jobs = query.order_by_desc(order).limit(first + 1).all(db).await?;
    Ok(Page::from_rows(jobs, first))
}

/// Jobs without their payloads, for lists: a page of 100 jobs with inputs of megabytes
/// each would otherwise sit in memory whatever the client asked for. Their columns
/// read as a JSON `null` input and no result; [`job_payloads`] reads them one job at a
/// time.
pub fn jobs_without_payloads() -> sea_orm::Select<jobs::Entity> {
    jobs::Entity::find()
        .select_only()
        .columns(
            jobs::Column::iter()
                .filter(|column| !matches!(column, jobs::Column::Input | jobs::Column::Result)),
        )
        .column_as(Expr::cust("CAST('null' AS TEXT)"), "input")
        .column_as(Expr::cust("CAST(NULL AS TEXT)"), "result")
}

/// The tenant's jobs among `job_ids`, without their payloads. The tenant is part of the
/// query, so another tenant's job id finds nothing.
pub async fn jobs_of_ids(
    db: &impl ConnectionTrait,
    tenant_id: Uuid,
    job_ids: &[Uuid],
) -> Result<Vec<jobs::Model>, ServiceError> {
    Ok(jobs_without_payloads()
        .filter(jobs::Column::TenantId.eq(tenant_id))
        .filter(jobs::Column::Id.is_in(job_ids.iter().copied()))
        .all(db)
        .await?)
}

/// A job's input and result, which `list_jobs` leaves out.
pub async fn job_payloads(
    db: &impl ConnectionTrait,
    tenant_id: Uuid,
    job_id: Uuid,
) -> Result<JobPayloads, ServiceError> {
    jobs::Entity::find_by_id(job_id)
        .filter(jobs::Column::TenantId.eq(tenant_id))
        .select_only()
        .columns([jobs::Column::Input, jobs::Column::Result])
        .into_model::<JobPayloads>()
        .one(db)
        .await?
        .ok_or(ServiceError::NotFound)
}

/// The large columns of a job.
#[derive(Clone, Debug, FromQueryResult)]
pub struct JobPayloads {
    pub input: JsonText,
    pub result: Option<JsonText>,
}

/// The attempts of a tenant's jobs among `job_ids`, each job's in order of number. The
/// tenant is part of the query, so another tenant's job id finds nothing.
pub async fn attempts_of_jobs(
    db: &impl ConnectionTrait,
    tenant_id: Uuid,
    job_ids: &[Uuid],
) -> Result<Vec<attempts::Model>, ServiceError> {
    Ok(attempts::Entity::find()
        .filter(attempts::Column::TenantId.eq(tenant_id))
        .filter(attempts::Column::JobId.is_in(job_ids.iter().copied()))
        .order_by_asc(attempts::Column::JobId)
        .order_by_asc(attempts::Column::Number)
        .all(db)
        .await?)
}

/// The stored events of a tenant's jobs among `job_ids`, each job's in order of seq.
/// The tenant is part of the query, so another tenant's job id finds nothing.
pub async fn events_of_jobs(
    db: &impl ConnectionTrait,
    tenant_id: Uuid,
    job_ids: &[Uuid],
) -> Result<Vec<job_events::Model>, ServiceError> {
    Ok(job_events::Entity::find()
        .filter(job_events::Column::TenantId.eq(tenant_id))
        .filter(job_events::Column::JobId.is_in(job_ids.iter().copied()))
        .order_by_asc(job_events::Column::JobId)
        .order_by_asc(job_events::Column::Seq)
        .all(db)
        .await?)
}

/// Records the tenant's wish to cancel a job.
///
/// A queued job becomes `CANCELLED` at once and its hold is released. A running job
/// gets `cancel_requested`; its worker sees that, aborts the call and finishes the
/// attempt as cancelled. A finished job stays as it is.
pub async fn cancel_job(
    db: &DatabaseConnection,
    bus: &EventBus,
    metrics: &Metrics,
    tenant_id: Uuid,
    job_id: Uuid,
) -> Result<jobs::Model, ServiceError> {
    let transaction = begin_write(db).await?;
    let now = Timestamp::now();
    // Lock the row first and decide on what it is now: between a read and a write a
    // worker could queue the job for a retry, and the cancel would be lost.
    let current = jobs::Entity::update_many()
        .col_expr(jobs::Column::UpdatedAt, Expr::col(jobs::Column::UpdatedAt))
        .filter(jobs::Column::Id.eq(job_id))
        .filter(jobs::Column::TenantId.eq(tenant_id))
        .exec_with_returning(&transaction)
        .await?
        .into_iter()
        .next()
        .ok_or(ServiceError::NotFound)?;
    let bump_seq = Expr::col(jobs::Column::LastEventSeq).add(1);
    let mut notices: Vec<EventNotice> = Vec::new();
    let job = match lifecycle::cancel(current.status, current.cancel_requested) {
        Cancel::Ends => {
            let job = jobs::Entity::update_many()
                .col_expr(jobs::Column::Status, Expr::value(JobStatus::Cancelled))
                .col_expr(jobs::Column::CancelRequested, Expr::value(true))
                .col_expr(jobs::Column::FinishedAt, Expr::value(now))
                .col_expr(jobs::Column::UpdatedAt, Expr::value(now))
                .col_expr(jobs::Column::LastEventSeq, bump_seq)
                .filter(jobs::Column::Id.eq(job_id))
                .exec_with_returning(&transaction)
                .await?
                .remove(0);
            // Attempts that ran before (a retry waiting for its backoff) may carry
            // charges: streamed output, or unknown outcomes the policy passes on.
            let spent = Spent::load(&transaction, job.id).await?;
            notices.push(events::append(&transaction, &job, EventKind::Cancelled, None).await?);
            // Last: it locks the tenant's row, which every job of the tenant needs.
            holds::resolve_hold(&transaction, &job, None, &spent).await?;
            job
        }
        Cancel::Asks => {
            let job = jobs::Entity::update_many()
                .col_expr(jobs::Column::CancelRequested, Expr::value(true))
                .col_expr(jobs::Column::UpdatedAt, Expr::value(now))
                .col_expr(jobs::Column::LastEventSeq, bump_seq)
                .filter(jobs::Column::Id.eq(job_id))
                .exec_with_returning(&transaction)
                .await?
                .remove(0);
            notices
                .push(events::append(&transaction, &job, EventKind::CancelRequested, None).await?);
            job
        }
        Cancel::Nothing => current,
    };
    transaction.commit().await?;
    if !notices.is_empty() {
        tracing::info!(job.id = %job.id, status = ?job.status, "job cancel recorded");
    }
    super::observe::job_ended(metrics, &notices);
    bus.publish(notices);
    Ok(job)
}
