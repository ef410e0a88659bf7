//! The job queue in the database: claiming, lease renewal, recording attempts and
//! finishing them.
//!
//! Every write an attempt makes is fenced: it matches the job only while the job is
//! `running` with the attempt's own `run_token`. A write that matches nothing means
//! the attempt lost the job (its lease expired and it was taken back), and the attempt
//! then writes nothing further.

use crate::billing::{Credits, ModelPrice};
use crate::bus::EventNotice;
use crate::jobs::lifecycle::{JobError, Transition};
use entity::{JobStatus, JsonText, Timestamp, attempts, jobs};
use sea_orm::sea_query::{Expr, ExprTrait, LockBehavior, LockType, Query};
use sea_orm::{ColumnTrait, ConnectionTrait, DbBackend, DbErr, EntityTrait, QueryFilter};
use std::collections::HashMap;
use std::time::Duration;
use uuid::Uuid;

mod claim;
mod deadlines;
mod finish;
mod moves;
mod rescue;
mod start;

pub use claim::{Claim, ClaimRequest, Claimed, TenantCursor, claim, claim_in_turn};
pub use deadlines::fail_past_deadlines;
pub use finish::{AttemptEnd, abandon_claim, finish_attempt, finish_attempts};
pub use moves::move_off_paused_model;
pub use rescue::expire_leases;
pub use start::{start_attempt, start_attempts, start_attempts_in};

/// What a lease renewal learned.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Renewal {
    /// The lease was extended (or, its row busy in another transaction, will be next
    /// round); the attempt goes on unless cancel was requested.
    Renewed { cancel_requested: bool },
    /// The job is no longer this attempt's: stop and write nothing.
    Lost,
}

/// Most jobs one renewal statement names: far below SQLite's bound on parameters.
const RENEWAL_CHUNK: usize = 500;

/// Extends to `lease` from now the lease of every listed `(job id, run token)` whose
/// attempt still owns its job, one statement per few hundred jobs, and tells for each
/// what it learned; a job missing from the answer was lost.
///
/// On PostgreSQL a job whose row another transaction holds is passed over this round
/// and reported by what a plain read of it says: one statement for every attempt of
/// the process would otherwise hold the rows it had already renewed while it waited
/// for that one, and every finish of those jobs — other tenants' too — would wait
/// with it (a frozen process holding one job's row stalled them all). The holder is
/// the attempt's own finish, a cancel, or that frozen process; the next round, a
/// third of a lease later, renews it.
pub async fn renew_leases(
    db: &impl ConnectionTrait,
    owned: &[(Uuid, Uuid)],
    lease: Duration,
) -> Result<HashMap<Uuid, Renewal>, DbErr> {
    let backend = db.get_database_backend();
    let lease_until = crate::db::lease_until(backend, lease);
    let mut renewed = HashMap::with_capacity(owned.len());
    for chunk in owned.chunks(RENEWAL_CHUNK) {
        let ours = || {
            Expr::tuple([
                Expr::col((jobs::Entity, jobs::Column::Id)),
                Expr::col((jobs::Entity, jobs::Column::RunToken)),
            ])
            .in_tuples(chunk.iter().copied())
        };
        let mut update = Query::update();
        update
            .table(jobs::Entity)
            .value(jobs::Column::LeaseUntil, lease_until.clone())
            .and_where(jobs::Column::Status.eq(JobStatus::Running))
            .and_where(ours())
            .returning(
                Query::returning().columns([jobs::Column::Id, jobs::Column::CancelRequested]),
            );
        if backend == DbBackend::Postgres {
            update.and_where(
                Expr::col(jobs::Column::Id).in_subquery(
                    Query::select()
                        .column(jobs::Column::Id)
                        .from(jobs::Entity)
                        .and_where(ours())
                        .lock_with_behavior(LockType::NoKeyUpdate, LockBehavior::SkipLocked)
                        .to_owned(),
                ),
            );
        }
        let rows = db.query_all(&update).await?;
        let all_renewed = rows.len() == chunk.len();
        for row in rows {
            let job_id: Uuid = row.try_get("", "id")?;
            let cancel_requested: bool = row.try_get("", "cancel_requested")?;
            renewed.insert(job_id, Renewal::Renewed { cancel_requested });
        }
        if backend == DbBackend::Postgres && !all_renewed {
            let passed_over = Query::select()
                .columns([jobs::Column::Id, jobs::Column::CancelRequested])
                .from(jobs::Entity)
                .and_where(jobs::Column::Status.eq(JobStatus::Running))
                .and_where(ours())
                .to_owned();
            for row in db.query_all(&passed_over).await? {
                let job_id: Uuid = row.try_get("", "id")?;
                let cancel_requested: bool = row.try_get("", "cancel_requested")?;
                renewed
                    .entry(job_id)
                    .or_insert(Renewal::Renewed { cancel_requested });
            }
        }
    }
    Ok(renewed)
}

/// Locks the claimed job for the rest of `transaction` and returns it as it is now;
/// `None` when the claim no longer owns it.
async fn lock_claimed(
    transaction: &impl ConnectionTrait,
    claim: &Claim,
    now: Timestamp,
) -> Result<Option<jobs::Model>, DbErr> {
    Ok(fenced_update(claim)
        .col_expr(jobs::Column::UpdatedAt, Expr::value(now))
        .exec_with_returning(transaction)
        .await?
        .into_iter()
        .next())
}

/// An UPDATE of the claimed job that matches only while the claim still owns it.
fn fenced_update(claim: &Claim) -> sea_orm::UpdateMany<jobs::Entity> {
    jobs::Entity::update_many()
        .filter(jobs::Column::Id.eq(claim.job.id))
        .filter(jobs::Column::RunToken.eq(claim.run_token))
        .filter(jobs::Column::Status.eq(JobStatus::Running))
}

/// An UPDATE of several claimed jobs that matches each only while its claim still
/// owns it.
fn fenced_update_of_all<'a>(
    claims: impl IntoIterator<Item = &'a Claim>,
) -> sea_orm::UpdateMany<jobs::Entity> {
    jobs::Entity::update_many()
        .filter(jobs::Column::Status.eq(JobStatus::Running))
        .filter(
            Expr::tuple([
                Expr::col(jobs::Column::Id),
                Expr::col(jobs::Column::RunToken),
            ])
            .in_tuples(
                claims
                    .into_iter()
                    .map(|claim| (claim.job.id, claim.run_token)),
            ),
        )
}

/// A fenced UPDATE that comes with an event: it bumps the job's event sequence, which
/// the job's row lock serialises.
fn fenced_event_update(claim: &Claim, now: Timestamp) -> sea_orm::UpdateMany<jobs::Entity> {
    fenced_update(claim)
        .col_expr(jobs::Column::UpdatedAt, Expr::value(now))
        .col_expr(
            jobs::Column::LastEventSeq,
            Expr::col(jobs::Column::LastEventSeq).add(1),
        )
}

/// A fenced event UPDATE that ends the claim: the job is nobody's after it.
fn releasing_update(claim: &Claim, now: Timestamp) -> sea_orm::UpdateMany<jobs::Entity> {
    fenced_event_update(claim, now)
        .col_expr(jobs::Column::RunToken, Expr::value(Option::<Uuid>::None))
        .col_expr(
            jobs::Column::LeaseUntil,
            Expr::value(Option::<Timestamp>::None),
        )
}

/// The UPDATE also records the job's error.
fn with_error(
    update: sea_orm::UpdateMany<jobs::Entity>,
    error: &JobError,
) -> sea_orm::UpdateMany<jobs::Entity> {
    update
        .col_expr(jobs::Column::ErrorCode, Expr::value(error.code))
        .col_expr(
            jobs::Column::ErrorMessage,
            Expr::value(error.message.clone()),
        )
}

/// The UPDATE also writes what `transition` makes of the job (but its event, which
/// [`events::append`](crate::jobs::events::append) writes): its status, error and
/// result, when it runs next and on which model, its finish, and the attempt it gives
/// back.
fn apply(
    update: sea_orm::UpdateMany<jobs::Entity>,
    transition: &Transition,
    now: Timestamp,
) -> sea_orm::UpdateMany<jobs::Entity> {
    let mut update = update.col_expr(jobs::Column::Status, Expr::value(transition.status));
    if let Some(error) = &transition.error {
        update = with_error(update, error);
    }
    if let Some(result) = &transition.result {
        update = update.col_expr(jobs::Column::Result, Expr::value(JsonText(result.clone())));
    }
    if let Some(at) = transition.next_run_at {
        update = update.col_expr(jobs::Column::NextRunAt, Expr::value(at));
    }
    if let Some(model) = &transition.model {
        update = update.col_expr(jobs::Column::Model, Expr::value(model.clone()));
    }
    if transition.status.is_terminal() {
        update = update.col_expr(jobs::Column::FinishedAt, Expr::value(now));
    }
    if transition.gives_back_attempt {
        update = update.col_expr(
            jobs::Column::AttemptCount,
            Expr::col(jobs::Column::AttemptCount).sub(1),
        );
    }
    update
}

/// Details of an attempt known before the provider is called.
#[derive(Clone, Debug)]
pub struct AttemptStart {
    pub worker_id: String,
    /// The provider that serves the job's model; `None` when none does in this
    /// process, and no call will be made.
    pub provider: Option<String>,
    pub price: ModelPrice,
    /// What the call may cost at most, recorded now so that an attempt that never
    /// reports back still carries a bound.
    pub provider_cost_bound: Credits,
    /// The most the customer may be charged for the call.
    pub customer_charge_bound: Credits,
    /// What the charging policy charges the customer for the call if it is lost with
    /// its worker, recorded now for the same reason.
    pub customer_charge_if_lost: Credits,
}

/// An attempt on record, about to call the provider.
#[derive(Clone, Debug)]
pub struct StartedAttempt {
    pub attempt: attempts::Model,
    /// The `ATTEMPT_STARTED` event, to publish.
    pub notice: EventNotice,
    /// The tenant asked to cancel before the call was made: do not make it.
    pub cancel_requested: bool,
    /// Why the job's budget (see [`crate::jobs::budget`]) refuses the call, if it does: do not
    /// make it.
    pub budget_refusal: Option<crate::jobs::budget::Refusal>,
}

/// The provider name recorded on an attempt whose model no provider serves.
pub const UNROUTED_PROVIDER: &str = "unrouted";
