//! Credit grants that expire.
//!
//! **Which credit a charge consumes.** Charges consume grants in one fixed order: the
//! soonest-expiring first, never-expiring grants last, ties by creation time and id.
//! Holds are not attributed to grants — a hold only reserves part of the balance — so
//! a charge consumes from the grants that still have something left when it is
//! attributed. Attribution is lazy: the tenant's row counts the charged credits
//! already spread over the grants (`attributed_nanos`), and the rest is spread just
//! before the set of grants or their remainders changes (a new grant, an expiry).
//! Greedy consumption in a fixed order gives the same remainders whether charges are
//! spread one by one or together, so the lazy spread equals the eager one.
//!
//! **What expires.** At its `expires_at`, what is left of a grant (amount − consumed −
//! already expired) leaves the balance through an `expiry` ledger entry dated at
//! `expires_at`, but at most the tenant's available balance: held credit is never
//! touched. What was held at that instant stays open on the grant and expires as soon
//! as it is no longer held (a hold released), unless a charge consumes it first.
//!
//! **Who expires it.** The sweep ([`run`], in every `serve` and `worker` process)
//! finds tenants whose `next_expiry_at` has passed through a partial index, and
//! expires each one in a transaction of its own under the tenant's row lock, so two
//! processes sweeping at once expire each credit once. A process that was down at the
//! instant expires late, with the same result and date. A hold never waits for the
//! sweep: one that finds an expiry due on the tenant's row carries it out first.

use super::Credits;
use super::ledger::{self, Balance};
use crate::db::begin_write;
use crate::error::ServiceError;
use entity::{LedgerEntryKind, Timestamp, credit_grants, ledger_entries, tenants};
use sea_orm::sea_query::{Expr, ExprTrait, LockType};
use sea_orm::{
    ColumnTrait, ConnectionTrait, DatabaseConnection, DbErr, EntityTrait, QueryFilter, QueryOrder,
    QuerySelect,
};
use std::time::Duration;
use tokio_util::sync::CancellationToken;
use uuid::Uuid;

/// Longest a grant may live: a hundred years.
pub const MAX_LIFETIME_DAYS: i64 = 36_500;
/// How often the sweep looks for expiries due.
const SWEEP_INTERVAL: Duration = Duration::from_secs(1);
/// Tenants read per page of one sweep.
const SWEEP_PAGE: u64 = 200;

/// Refuses an expiry that is not in the future, or further than
/// [`MAX_LIFETIME_DAYS`] ahead.
pub fn check_expiry(expires_at: Timestamp, now: Timestamp) -> Result<(), ServiceError> {
    if expires_at <= now {
        return Err(ServiceError::validation("expiresAt must be in the future"));
    }
    if expires_at > now.plus(chrono::Duration::days(MAX_LIFETIME_DAYS)) {
        return Err(ServiceError::validation(format!(
            "expiresAt must be at most {MAX_LIFETIME_DAYS} days ahead"
        )));
    }
    Ok(())
}

/// `next_expiry_at` once a grant expiring at `expires_at` joins the tenant's grants.
pub(super) fn earliest_expiry(expires_at: Timestamp) -> Expr {
    let next = Expr::col(tenants::Column::NextExpiryAt);
    Expr::case(
        next.clone().is_null().or(next.clone().gt(expires_at)),
        Expr::val(expires_at),
    )
    .finally(next)
    .into()
}

/// What is left of a grant: neither consumed by charges nor expired.
fn remaining(grant: &credit_grants::Model) -> Credits {
    Credits::from_nanos(grant.amount_nanos - grant.consumed_nanos - grant.expired_nanos)
}

/// The tenant's grants with something left, in the order charges consume them.
async fn open_grants(
    db: &impl ConnectionTrait,
    tenant_id: Uuid,
) -> Result<Vec<credit_grants::Model>, DbErr> {
    let mut grants = credit_grants::Entity::find()
        .filter(credit_grants::Column::TenantId.eq(tenant_id))
        .filter(
            Expr::col(credit_grants::Column::ConsumedNanos)
                .add(Expr::col(credit_grants::Column::ExpiredNanos))
                .lt(Expr::col(credit_grants::Column::AmountNanos)),
        )
        .all(db)
        .await?;
    // `None` (never expires) sorts last.
    grants.sort_by_key(|grant| {
        (
            grant.expires_at.is_none(),
            grant.expires_at,
            grant.created_at,
            grant.id,
        )
    });
    Ok(grants)
}

/// Spreads the tenant's charges not yet attributed over its grants, in consumption
/// order, and returns the grants that still have something left, in that order.
///
/// Run it with the tenant's row locked (every charge and grant of the tenant takes
/// that lock), so the counts it reads stay true until the commit.
pub(super) async fn attribute_charges(
    db: &impl ConnectionTrait,
    tenant_id: Uuid,
) -> Result<Vec<credit_grants::Model>, DbErr> {
    let Some(tenant) = tenants::Entity::find_by_id(tenant_id).one(db).await? else {
        return Ok(Vec::new());
    };
    let mut grants = open_grants(db, tenant_id).await?;
    let mut unattributed = Credits::from_nanos(tenant.charged_nanos - tenant.attributed_nanos);
    if !unattributed.is_positive() {
        return Ok(grants);
    }
    let mut attributed = Credits::ZERO;
    for grant in &mut grants {
        let taken = remaining(grant).min(unattributed);
        if !taken.is_positive() {
            continue;
        }
        grant.consumed_nanos += taken.nanos();
        credit_grants::Entity::update_many()
            .col_expr(
                credit_grants::Column::ConsumedNanos,
                Expr::value(grant.consumed_nanos),
            )
            .filter(credit_grants::Column::Id.eq(grant.id))
            .exec(db)
            .await?;
        attributed = attributed + taken;
        unattributed = unattributed - taken;
        if !unattributed.is_positive() {
            break;
        }
    }
    if unattributed.is_positive() {
        // Σ remainders = available + held ≥ every charge not yet attributed; the
        // audit names the tenant whose rows say otherwise.
        tracing::error!(tenant.id = %tenant_id, unattributed = %unattributed, "charges exceed what the grants have left");
    }
    tenants::Entity::update_many()
        .col_expr(
            tenants::Column::AttributedNanos,
            Expr::col(tenants::Column::AttributedNanos).add(attributed.nanos()),
        )
        .filter(tenants::Column::Id.eq(tenant_id))
        .exec(db)
        .await?;
    grants.retain(|grant| remaining(grant).is_positive());
    Ok(grants)
}

/// Expires what is due on a tenant's grants at `now`, at most its available balance,
/// in the caller's transaction; returns the credits that expired. Locks the tenant's
/// row first, so concurrent callers expire one after the other, the second finding
/// nothing left to do.
pub async fn expire_tenant(
    db: &impl ConnectionTrait,
    tenant_id: Uuid,
    now: Timestamp,
) -> Result<Credits, DbErr> {
    // NO KEY UPDATE, the lock holds and settlements take on the row (see
    // `limits::admit_spend`); SQLite's write transaction holds the whole database.
    let Some(tenant) = tenants::Entity::find_by_id(tenant_id)
        .lock(LockType::NoKeyUpdate)
        .one(db)
        .await?
    else {
        return Ok(Credits::ZERO);
    };
    let grants = attribute_charges(db, tenant_id).await?;
    let mut available = Balance::from(&tenant).available();
    let mut expired = Credits::ZERO;
    let mut entries = Vec::new();
    let mut next_expiry_at = None;
    for grant in &grants {
        let Some(expires_at) = grant.expires_at else {
            continue;
        };
        let left = if expires_at <= now {
            let taken = remaining(grant).min(available);
            if taken.is_positive() {
                credit_grants::Entity::update_many()
                    .col_expr(
                        credit_grants::Column::ExpiredNanos,
                        Expr::value(grant.expired_nanos + taken.nanos()),
                    )
                    .filter(credit_grants::Column::Id.eq(grant.id))
                    .exec(db)
                    .await?;
                // Dated at the expiry instant, however late the sweep came.
                entries.push(ledger::entry(
                    tenant_id,
                    (None, Some(grant.id)),
                    LedgerEntryKind::Expiry,
                    taken,
                    expires_at,
                ));
                available = available - taken;
                expired = expired + taken;
            }
            remaining(grant) - taken
        } else {
            remaining(grant)
        };
        if left.is_positive() && next_expiry_at.is_none() {
            // Grants come soonest-expiring first: the first with something left.
            next_expiry_at = Some(expires_at);
        }
    }
    if !entries.is_empty() {
        ledger_entries::Entity::insert_many(entries)
            .exec(db)
            .await?;
    }
    tenants::Entity::update_many()
        .col_expr(
            tenants::Column::ExpiredNanos,
            Expr::col(tenants::Column::ExpiredNanos).add(expired.nanos()),
        )
        .col_expr(tenants::Column::NextExpiryAt, Expr::value(next_expiry_at))
        .filter(tenants::Column::Id.eq(tenant_id))
        .exec(db)
        .await?;
    if expired.is_positive() {
        tracing::info!(tenant.id = %tenant_id, expired = %expired, "expired credit left the balance");
        crate::webhooks::alerts::after_balance_fell(db, tenant_id, expired).await?;
    }
    Ok(expired)
}

/// Expires everything due at `now` on every tenant, one transaction per tenant;
/// returns the credits that expired. Tenants whose due credit is all held (nothing
/// available) are not touched: there is nothing to expire until a hold is released.
pub async fn sweep(db: &DatabaseConnection, now: Timestamp) -> Result<Credits, DbErr> {
    let mut expired = Credits::ZERO;
    let mut after: Option<Uuid> = None;
    loop {
        let mut query = tenants::Entity::find()
            .select_only()
            .column(tenants::Column::Id)
            .filter(tenants::Column::NextExpiryAt.is_not_null())
            .filter(tenants::Column::NextExpiryAt.lte(now))
            .filter(ledger::available_column().gt(0))
            .order_by_asc(tenants::Column::Id)
            .limit(SWEEP_PAGE);
        if let Some(after) = after {
            query = query.filter(tenants::Column::Id.gt(after));
        }
        let page: Vec<Uuid> = query.into_tuple().all(db).await?;
        for tenant_id in &page {
            let transaction = begin_write(db).await?;
            let tenant_expired = expire_tenant(&transaction, *tenant_id, now).await?;
            transaction.commit().await?;
            expired = expired + tenant_expired;
        }
        if (page.len() as u64) < SWEEP_PAGE {
            return Ok(expired);
        }
        after = page.last().copied();
    }
}

/// Sweeps every [`SWEEP_INTERVAL`] until `stop` is cancelled.
pub async fn run(db: DatabaseConnection, stop: CancellationToken) {
    loop {
        if let Err(error) = sweep(&db, Timestamp::now()).await {
            tracing::warn!(error = %error, "the credit expiry sweep failed; it runs again shortly");
        }
        tokio::select! {
            () = stop.cancelled() => return,
            () = tokio::time::sleep(SWEEP_INTERVAL) => {}
        }
    }
}
