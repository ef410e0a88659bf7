//! The credit ledger: grants, holds, charges and releases.
//!
//! Every movement is an append-only `ledger_entries` row written in the same
//! transaction as the cached balance on `tenants` it explains, so a replay of the
//! ledger always equals the cached balance. Callers pass the transaction in.

use super::Credits;
use super::balance::{Balance, append_entries, available_column, entry};
use crate::db::bulk::{self, OnConflict};
use crate::db::{WriteTransaction, begin_write};
use crate::error::ServiceError;
use entity::{
    LedgerEntryKind, ReservationStatus, Timestamp, charges, credit_grants, credit_reservations,
    ledger_entries, tenants,
};
use sea_orm::sea_query::{Expr, ExprTrait};
use sea_orm::{
    ActiveValue::Set, ColumnTrait, Condition, ConnectionTrait, DatabaseConnection, DbErr,
    EntityTrait, FromQueryResult, QueryFilter, QuerySelect,
};
use uuid::Uuid;

mod settlement;

pub use settlement::{Resolution, Settlement, release, resolve_holds, settle};

/// A new grant of credits to a tenant.
#[derive(Clone, Debug)]
pub struct NewGrant {
    pub tenant_id: Uuid,
    pub amount: Credits,
    pub idempotency_key: String,
    pub reason: Option<String>,
    /// When what is left of the grant expires; `None` never.
    pub expires_at: Option<Timestamp>,
}

/// Adds credits to a tenant, once per idempotency key: a repeated key with the same
/// amount, reason and expiry returns the first grant; anything else is a conflict.
///
/// An expiry must lie in the future, at most [`super::grant_expiry::MAX_LIFETIME_DAYS`]
/// days ahead. Charges made so far are attributed to the earlier grants first, so
/// the new grant starts whole (see [`super::grant_expiry`]).
pub async fn grant(
    db: &impl ConnectionTrait,
    new: NewGrant,
) -> Result<credit_grants::Model, ServiceError> {
    if !new.amount.is_positive() {
        return Err(ServiceError::validation("amount must be greater than zero"));
    }
    crate::validation::single_line("idempotencyKey", &new.idempotency_key)?;
    if let Some(reason) = &new.reason {
        crate::validation::free_text("reason", reason)?;
    }
    let now = Timestamp::now();
    if let Some(expires_at) = new.expires_at {
        super::grant_expiry::check_expiry(expires_at, now)?;
    }
    let existing = credit_grants::Entity::find()
        .filter(credit_grants::Column::TenantId.eq(new.tenant_id))
        .filter(credit_grants::Column::IdempotencyKey.eq(&new.idempotency_key))
        .one(db)
        .await?;
    if let Some(existing) = existing {
        return if existing.amount_nanos == new.amount.nanos()
            && existing.reason == new.reason
            && existing.expires_at == new.expires_at
        {
            Ok(existing)
        } else {
            Err(ServiceError::IdempotencyConflict)
        };
    }
    let current = balance(db, new.tenant_id)
        .await?
        .ok_or(ServiceError::NotFound)?;
    // An overflowing sum would not wrap on SQLite: it would turn the column into a
    // float. Refuse it instead.
    if current.granted.checked_add(new.amount).is_none() {
        return Err(ServiceError::validation(
            "amount: the tenant's granted total would exceed the largest amount stored",
        ));
    }
    let mut update = tenants::Entity::update_many()
        .col_expr(
            tenants::Column::GrantedNanos,
            Expr::col(tenants::Column::GrantedNanos).add(new.amount.nanos()),
        )
        .filter(tenants::Column::Id.eq(new.tenant_id));
    if let Some(expires_at) = new.expires_at {
        update = update.col_expr(
            tenants::Column::NextExpiryAt,
            super::grant_expiry::earliest_expiry(expires_at),
        );
    }
    let updated = update.exec(db).await?;
    if updated.rows_affected == 0 {
        return Err(ServiceError::NotFound);
    }
    // The tenant's row is locked now. Charges so far consumed the grants that existed
    // when they were made: attribute them before the new grant joins the order.
    super::grant_expiry::attribute_charges(db, new.tenant_id).await?;
    let row = credit_grants::ActiveModel {
        id: Set(Uuid::now_v7()),
        tenant_id: Set(new.tenant_id),
        amount_nanos: Set(new.amount.nanos()),
        idempotency_key: Set(new.idempotency_key),
        reason: Set(new.reason),
        created_at: Set(now),
        expires_at: Set(new.expires_at),
        consumed_nanos: Set(0),
        expired_nanos: Set(0),
        lapsed: Set(false),
    };
    let grant = credit_grants::Entity::insert(row)
        .exec_with_returning(db)
        .await?;
    append_entries(
        db,
        grant.tenant_id,
        (None, Some(grant.id)),
        [(LedgerEntryKind::Grant, new.amount)],
    )
    .await?;
    Ok(grant)
}

/// [`grant`] in a transaction of its own. Two grants racing with one key: the loser
/// hits the unique (tenant, key) index, and trying again replays the winner's grant.
pub async fn grant_credits(
    db: &DatabaseConnection,
    new: NewGrant,
) -> Result<credit_grants::Model, ServiceError> {
    let mut tries_left = 2;
    loop {
        let transaction = begin_write(db).await?;
        match grant(&transaction, new.clone()).await {
            Ok(granted) => {
                transaction.commit().await?;
                return Ok(granted);
            }
            Err(ServiceError::Database(error))
                if tries_left > 1 && crate::db::is_unique_violation(&error) =>
            {
                transaction.rollback().await?;
                tries_left -= 1;
            }
            Err(error) => return Err(error),
        }
    }
}

/// Holds `amount` of a tenant's available credits for a job, or refuses when the
/// balance is short.
///
/// Credit past its grant's expiry is never held: when the tenant has an expiry due
/// that the sweep has not carried out yet, the hold carries it out first (in this
/// transaction, under the tenant's lock) and tries once more.
///
/// Runs in the caller's transaction, which a refusal must roll back: the reservation
/// and its ledger entry are written first, so that the tenant's row — which every hold
/// and settlement of the tenant needs — is locked by the last statement only, until
/// the commit. The check and the hold are one conditional UPDATE, so concurrent holds
/// can never take the balance below zero: on PostgreSQL the row lock makes the second
/// UPDATE re-evaluate its condition after the first commits.
pub async fn hold(
    transaction: &WriteTransaction,
    tenant_id: Uuid,
    job_id: Uuid,
    amount: Credits,
) -> Result<credit_reservations::Model, ServiceError> {
    // One instant for the row and the expiry check: a hold dated before a grant's
    // instant may be backed by the grant, so one that checks after it must not be.
    let now = Timestamp::now();
    let row = credit_reservations::ActiveModel {
        id: Set(Uuid::now_v7()),
        job_id: Set(job_id),
        tenant_id: Set(tenant_id),
        amount_nanos: Set(amount.nanos()),
        status: Set(ReservationStatus::Held),
        settled_amount_nanos: Set(0),
        released_amount_nanos: Set(0),
        created_at: Set(now),
        resolved_at: Set(None),
        backed_nanos: Set(0),
        absorbed_nanos: Set(0),
    };
    let reservation = credit_reservations::Entity::insert(row)
        .exec_with_returning(transaction)
        .await?;
    append_entries(
        transaction,
        tenant_id,
        (Some(job_id), None),
        [(LedgerEntryKind::Hold, amount)],
    )
    .await?;
    take_held(transaction, tenant_id, amount, now).await?;
    Ok(reservation)
}

/// [`hold`] for many jobs of one tenant at once, all or nothing: every reservation and
/// ledger entry in one statement each, and one conditional UPDATE of the tenant's row
/// for their sum. A refusal names the sum and must roll the caller's transaction back.
pub async fn hold_many(
    transaction: &WriteTransaction,
    tenant_id: Uuid,
    holds: &[(Uuid, Credits)],
) -> Result<Credits, ServiceError> {
    let total = holds
        .iter()
        .try_fold(Credits::ZERO, |total, (_, amount)| {
            total.checked_add(*amount)
        })
        .ok_or_else(|| {
            ServiceError::validation("the holds of these jobs exceed the largest amount stored")
        })?;
    let now = Timestamp::now();
    let reservations = holds
        .iter()
        .map(|(job_id, amount)| credit_reservations::ActiveModel {
            id: Set(Uuid::now_v7()),
            job_id: Set(*job_id),
            tenant_id: Set(tenant_id),
            amount_nanos: Set(amount.nanos()),
            status: Set(ReservationStatus::Held),
            settled_amount_nanos: Set(0),
            released_amount_nanos: Set(0),
            created_at: Set(now),
            resolved_at: Set(None),
            backed_nanos: Set(0),
            absorbed_nanos: Set(0),
        });
    bulk::insert(transaction, reservations.collect(), OnConflict::Fail).await?;
    let entries = holds.iter().map(|(job_id, amount)| {
        entry(
            tenant_id,
            (Some(*job_id), None),
            LedgerEntryKind::Hold,
            *amount,
            now,
        )
    });
    bulk::insert(transaction, entries.collect(), OnConflict::Fail).await?;
    take_held(transaction, tenant_id, total, now).await?;
    Ok(total)
}

/// Adds `amount` to the tenant's held credits when its available balance covers it —
/// one conditional UPDATE, the last statement of a hold — or refuses.
///
/// Credit past its grant's expiry is never held: when the tenant has an expiry due
/// that the sweep has not carried out yet, this carries it out first (under the
/// tenant's lock) and tries once more.
async fn take_held(
    transaction: &WriteTransaction,
    tenant_id: Uuid,
    amount: Credits,
    now: Timestamp,
) -> Result<(), ServiceError> {
    let take_hold = |expiry_due: Condition| {
        tenants::Entity::update_many()
            .col_expr(
                tenants::Column::HeldNanos,
                Expr::col(tenants::Column::HeldNanos).add(amount.nanos()),
            )
            .filter(tenants::Column::Id.eq(tenant_id))
            .filter(available_column().gte(amount.nanos()))
            .filter(expiry_due)
            .exec(transaction)
    };
    let no_expiry_due = Condition::any()
        .add(tenants::Column::NextExpiryAt.is_null())
        .add(tenants::Column::NextExpiryAt.gt(now));
    if take_hold(no_expiry_due.clone()).await?.rows_affected == 1 {
        return Ok(());
    }
    let tenant = tenants::Entity::find_by_id(tenant_id)
        .one(transaction)
        .await?
        .ok_or(ServiceError::NotFound)?;
    if tenant.next_expiry_at.is_some_and(|due| due <= now) {
        // Under the tenant's lock, whatever is still due after this is held credit.
        super::grant_expiry::expire_tenant(transaction, tenant_id, now).await?;
        if take_hold(Condition::all()).await?.rows_affected == 1 {
            return Ok(());
        }
    } else if take_hold(no_expiry_due).await?.rows_affected == 1 {
        // The sweep carried the expiry out between the first try and the read: the
        // first try may have failed on the expiry alone.
        return Ok(());
    }
    let balance = balance(transaction, tenant_id)
        .await?
        .ok_or(ServiceError::NotFound)?;
    Err(ServiceError::InsufficientCredits {
        needed: amount,
        available: balance.available(),
    })
}

/// Most rows one multi-row insert carries: far below SQLite's bound on parameters.
const INSERT_CHUNK: usize = 500;

/// The credit holds of a tenant's jobs among `job_ids`, at most one per job. The tenant
/// is part of the query, so another tenant's job id finds nothing.
pub async fn reservations_of_jobs(
    db: &impl ConnectionTrait,
    tenant_id: Uuid,
    job_ids: &[Uuid],
) -> Result<Vec<credit_reservations::Model>, DbErr> {
    credit_reservations::Entity::find()
        .filter(credit_reservations::Column::TenantId.eq(tenant_id))
        .filter(credit_reservations::Column::JobId.is_in(job_ids.iter().copied()))
        .all(db)
        .await
}

/// The charges of a tenant's jobs among `job_ids`, at most one per job. The tenant is
/// part of the query, so another tenant's job id finds nothing.
pub async fn charges_of_jobs(
    db: &impl ConnectionTrait,
    tenant_id: Uuid,
    job_ids: &[Uuid],
) -> Result<Vec<charges::Model>, DbErr> {
    charges::Entity::find()
        .filter(charges::Column::TenantId.eq(tenant_id))
        .filter(charges::Column::JobId.is_in(job_ids.iter().copied()))
        .all(db)
        .await
}

/// A tenant's cached balance; `None` when the tenant does not exist.
pub async fn balance(db: &impl ConnectionTrait, tenant_id: Uuid) -> Result<Option<Balance>, DbErr> {
    Ok(tenants::Entity::find_by_id(tenant_id)
        .one(db)
        .await?
        .as_ref()
        .map(Balance::from))
}

/// A tenant's balance recomputed from the ledger alone, to check the cached one.
pub async fn replay_balance(db: &impl ConnectionTrait, tenant_id: Uuid) -> Result<Balance, DbErr> {
    #[derive(FromQueryResult)]
    struct KindTotal {
        kind: LedgerEntryKind,
        total: i64,
    }
    let totals = ledger_entries::Entity::find()
        .select_only()
        .column(ledger_entries::Column::Kind)
        .column_as(
            Expr::col(ledger_entries::Column::AmountNanos)
                .sum()
                .cast_as("BIGINT"),
            "total",
        )
        .filter(ledger_entries::Column::TenantId.eq(tenant_id))
        .group_by(ledger_entries::Column::Kind)
        .into_model::<KindTotal>()
        .all(db)
        .await?;
    let total = |kind| {
        Credits::from_nanos(
            totals
                .iter()
                .find(|row| row.kind == kind)
                .map_or(0, |row| row.total),
        )
    };
    let charged = total(LedgerEntryKind::Charge);
    Ok(Balance {
        granted: total(LedgerEntryKind::Grant),
        held: total(LedgerEntryKind::Hold) - total(LedgerEntryKind::Release) - charged,
        charged,
        expired: total(LedgerEntryKind::Expiry),
    })
}
