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
//! **What expires.** At a grant's instant (`expires_at`) the grant *lapses*: what is
//! left of it (amount − consumed − already expired) leaves the balance through an
//! `expiry` ledger entry dated at the instant, except the part that backs holds taken
//! before the instant — held credit is backed by the grants in the order charges
//! consume them, the soonest-expiring first. That part is tied to those very holds
//! ([`backings`]): their charges consume it, and what they leave expires when they
//! resolve. A lapsed grant is out of the consumption order, so no charge of a later
//! hold can ever spend credit that had expired. A grant that never expires is never
//! eaten by an expiring one.
//!
//! **Who expires it.** The sweep ([`run`], in every `serve` and `worker` process)
//! finds tenants whose `next_expiry_at` has passed through a partial index, and
//! expires each one in a transaction of its own under the tenant's row lock, so two
//! processes sweeping at once expire each credit once. A process that was down at the
//! instant expires late, with the same result and date. A hold never waits for the
//! sweep: one that finds an expiry due on the tenant's row carries it out first — so
//! every hold taken after an instant finds the grant lapsed — and resolving a backed
//! hold makes an expiry due at once.

mod backings;

use super::Credits;
use super::balance::{self, Balance};
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

/// The tenant's grants that charges may still consume — not lapsed, with something
/// left — in the order charges consume them.
async fn open_grants(
    db: &impl ConnectionTrait,
    tenant_id: Uuid,
) -> Result<Vec<credit_grants::Model>, DbErr> {
    let mut grants = credit_grants::Entity::find()
        .filter(credit_grants::Column::TenantId.eq(tenant_id))
        .filter(credit_grants::Column::Lapsed.eq(false))
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

/// Spreads the tenant's charges not yet attributed over its grants: a resolved hold
/// backed by lapsed grants uses up its backings first ([`backings::settle`]), the rest
/// goes over the open grants in consumption order. Returns the open grants that still
/// have something left, in that order, and the credits that the backings let expire.
///
/// Run it with the tenant's row locked (every charge and grant of the tenant takes
/// that lock), so the counts it reads stay true until the commit.
pub(super) async fn attribute_charges(
    db: &impl ConnectionTrait,
    tenant_id: Uuid,
) -> Result<(Vec<credit_grants::Model>, Credits), DbErr> {
    let expired = backings::settle(db, tenant_id).await?;
    let Some(tenant) = tenants::Entity::find_by_id(tenant_id).one(db).await? else {
        return Ok((Vec::new(), expired));
    };
    let mut grants = open_grants(db, tenant_id).await?;
    let mut unattributed = Credits::from_nanos(tenant.charged_nanos - tenant.attributed_nanos);
    if !unattributed.is_positive() {
        return Ok((grants, expired));
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
    Ok((grants, expired))
}

/// What happens to one grant that lapses.
#[derive(Debug, PartialEq, Eq)]
struct Lapse {
    /// Its index in the grants planned.
    index: usize,
    /// What is set aside for the holds taken before its instant.
    backing: Credits,
    /// What expires now.
    expiring: Credits,
}

/// What expiring a tenant's grants at `now` does.
#[derive(Debug, PartialEq, Eq)]
struct ExpiryPlan {
    /// The grants due, in order.
    lapses: Vec<Lapse>,
    /// The earliest instant among the grants with something left that are not due.
    next_expiry_at: Option<Timestamp>,
}

/// Plans the expiry of `grants` (open, in consumption order) with `available`
/// credits: each grant due lapses, backing what it can of the held credit that is
/// not backed yet — `unbacked[k]` for the k-th grant due, of the holds taken before
/// its instant — and losing the rest. Grants due earlier back first: they come first
/// in the order, and their holds are among the later ones'.
fn plan(
    grants: &[credit_grants::Model],
    available: Credits,
    unbacked: &[Credits],
    now: Timestamp,
) -> ExpiryPlan {
    let mut available = available;
    // Held credit set aside by the grants lapsing before this one.
    let mut backed = Credits::ZERO;
    let mut lapses = Vec::new();
    let mut next_expiry_at = None;
    for (index, grant) in grants.iter().enumerate() {
        let Some(expires_at) = grant.expires_at else {
            continue;
        };
        let left = remaining(grant);
        if expires_at <= now {
            let backable = unbacked.get(lapses.len()).copied().unwrap_or(Credits::ZERO) - backed;
            let backing = if backable.is_positive() {
                left.min(backable)
            } else {
                Credits::ZERO
            };
            backed = backed + backing;
            // Never above what is available, whatever the rows say.
            let expiring = (left - backing).min(available);
            let expiring = if expiring.is_positive() {
                expiring
            } else {
                Credits::ZERO
            };
            available = available - expiring;
            lapses.push(Lapse {
                index,
                backing,
                expiring,
            });
        } else if left.is_positive() && next_expiry_at.is_none() {
            // Grants come soonest-expiring first: the first not due.
            next_expiry_at = Some(expires_at);
        }
    }
    ExpiryPlan {
        lapses,
        next_expiry_at,
    }
}

/// Expires what is due on a tenant's grants at `now` (see [`plan`]) in the caller's
/// transaction; returns the credits that expired. Locks the tenant's row first, so
/// concurrent callers expire one after the other, the second finding nothing left to
/// do.
pub async fn expire_tenant(
    db: &impl ConnectionTrait,
    tenant_id: Uuid,
    now: Timestamp,
) -> Result<Credits, DbErr> {
    // NO KEY UPDATE, the lock holds and settlements take on the row (see
    // `limits::admit_spend`); SQLite's write transaction holds the whole database.
    let Some(locked) = tenants::Entity::find_by_id(tenant_id)
        .lock(LockType::NoKeyUpdate)
        .one(db)
        .await?
    else {
        return Ok(Credits::ZERO);
    };
    let (grants, mut expired) = attribute_charges(db, tenant_id).await?;
    // Settling backings may have expired credit: the balance as it is now.
    let tenant = if expired.is_positive() {
        tenants::Entity::find_by_id(tenant_id)
            .one(db)
            .await?
            .unwrap_or(locked)
    } else {
        locked
    };
    let mut unbacked = Vec::new();
    for grant in &grants {
        match grant.expires_at {
            Some(instant) if instant <= now => {
                unbacked.push(backings::unbacked_before(db, tenant_id, instant).await?);
            }
            _ => {}
        }
    }
    let plan = plan(&grants, Balance::from(&tenant).available(), &unbacked, now);
    let mut lapsed = Credits::ZERO;
    let mut entries = Vec::new();
    for lapse in &plan.lapses {
        let grant = &grants[lapse.index];
        let Some(expires_at) = grant.expires_at else {
            continue;
        };
        if lapse.backing.is_positive() {
            backings::assign(db, grant, expires_at, lapse.backing).await?;
        }
        credit_grants::Entity::update_many()
            .col_expr(
                credit_grants::Column::ExpiredNanos,
                Expr::value(grant.expired_nanos + lapse.expiring.nanos()),
            )
            .col_expr(credit_grants::Column::Lapsed, Expr::value(true))
            .filter(credit_grants::Column::Id.eq(grant.id))
            .exec(db)
            .await?;
        if lapse.expiring.is_positive() {
            // Dated at the expiry instant, however late the sweep came.
            entries.push(balance::entry(
                tenant_id,
                (None, Some(grant.id)),
                LedgerEntryKind::Expiry,
                lapse.expiring,
                expires_at,
            ));
            lapsed = lapsed + lapse.expiring;
        }
    }
    if !entries.is_empty() {
        ledger_entries::Entity::insert_many(entries)
            .exec(db)
            .await?;
    }
    if lapsed.is_positive() || plan.next_expiry_at != tenant.next_expiry_at {
        tenants::Entity::update_many()
            .col_expr(
                tenants::Column::ExpiredNanos,
                Expr::col(tenants::Column::ExpiredNanos).add(lapsed.nanos()),
            )
            .col_expr(
                tenants::Column::NextExpiryAt,
                Expr::value(plan.next_expiry_at),
            )
            .filter(tenants::Column::Id.eq(tenant_id))
            .exec(db)
            .await?;
    }
    expired = expired + lapsed;
    if expired.is_positive() {
        tracing::info!(tenant.id = %tenant_id, expired = %expired, "expired credit left the balance");
        super::alerts::after_balance_fell(db, tenant_id, expired).await?;
    }
    Ok(expired)
}

/// Whether expiring the tenant at `now` may change anything, judged from its rows
/// without a lock: a grant due lapses, a resolved hold's backing is used up, or the
/// next instant moves; otherwise the sweep need not take the tenant's lock.
async fn may_expire(
    db: &DatabaseConnection,
    tenant_id: Uuid,
    now: Timestamp,
) -> Result<bool, DbErr> {
    let Some(tenant) = tenants::Entity::find_by_id(tenant_id).one(db).await? else {
        return Ok(false);
    };
    let grants = open_grants(db, tenant_id).await?;
    let plan = plan(&grants, Balance::from(&tenant).available(), &[], now);
    Ok(!plan.lapses.is_empty()
        || plan.next_expiry_at != tenant.next_expiry_at
        || backings::any_to_settle(db, tenant_id).await?)
}

/// Expires everything due at `now` on every tenant, one transaction per tenant;
/// returns the credits that expired. Tenants with nothing to do (see [`may_expire`])
/// are not locked.
pub async fn sweep(db: &DatabaseConnection, now: Timestamp) -> Result<Credits, DbErr> {
    let mut expired = Credits::ZERO;
    let mut after: Option<Uuid> = None;
    loop {
        let mut query = tenants::Entity::find()
            .select_only()
            .column(tenants::Column::Id)
            .filter(tenants::Column::NextExpiryAt.is_not_null())
            .filter(tenants::Column::NextExpiryAt.lte(now))
            .filter(balance::available_column().gt(0))
            .order_by_asc(tenants::Column::Id)
            .limit(SWEEP_PAGE);
        if let Some(after) = after {
            query = query.filter(tenants::Column::Id.gt(after));
        }
        let page: Vec<Uuid> = query.into_tuple().all(db).await?;
        for tenant_id in &page {
            // Credit due but all held is looked at every sweep: cheaply, unlocked.
            if !may_expire(db, *tenant_id, now).await? {
                continue;
            }
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

#[cfg(test)]
mod tests {
    use super::*;

    const NOW: Timestamp = Timestamp(1_000_000);

    fn grant(amount: i64, expires_at: Option<i64>) -> credit_grants::Model {
        credit_grants::Model {
            id: Uuid::now_v7(),
            tenant_id: Uuid::nil(),
            amount_nanos: amount,
            idempotency_key: String::new(),
            reason: None,
            created_at: Timestamp(0),
            expires_at: expires_at.map(Timestamp),
            consumed_nanos: 0,
            expired_nanos: 0,
            lapsed: false,
        }
    }

    fn lapses(plan: &ExpiryPlan) -> Vec<(usize, i64, i64)> {
        plan.lapses
            .iter()
            .map(|lapse| (lapse.index, lapse.backing.nanos(), lapse.expiring.nanos()))
            .collect()
    }

    fn nanos(amounts: &[i64]) -> Vec<Credits> {
        amounts.iter().copied().map(Credits::from_nanos).collect()
    }

    #[test]
    fn a_due_grant_expires_what_is_left_of_it_and_nothing_before_its_instant() {
        let grants = [grant(100, Some(NOW.0)), grant(50, None)];
        let due = plan(&grants, Credits::from_nanos(150), &nanos(&[0]), NOW);
        assert_eq!(lapses(&due), vec![(0, 0, 100)]);
        assert_eq!(due.next_expiry_at, None);
        let early = plan(&grants, Credits::from_nanos(150), &[], Timestamp(NOW.0 - 1));
        assert_eq!(lapses(&early), vec![]);
        assert_eq!(early.next_expiry_at, Some(NOW));
    }

    #[test]
    fn held_credit_is_backed_by_the_soonest_expiring_grant_and_never_expires() {
        // 100 expiring, 100 lasting, 120 held before the instant: the expiring grant
        // backs 100 of it and expires nothing.
        let grants = [grant(100, Some(NOW.0)), grant(100, None)];
        let all_held = plan(&grants, Credits::from_nanos(80), &nanos(&[120]), NOW);
        assert_eq!(lapses(&all_held), vec![(0, 100, 0)]);
        assert_eq!(all_held.next_expiry_at, None, "lapsed: no longer due");
        // 30 held: 70 expires, the lasting grant stays whole.
        assert_eq!(
            lapses(&plan(&grants, Credits::from_nanos(170), &nanos(&[30]), NOW)),
            vec![(0, 30, 70)]
        );
    }

    #[test]
    fn never_more_than_available_expires_whatever_the_rows_say() {
        let grants = [grant(100, Some(NOW.0))];
        assert_eq!(
            lapses(&plan(&grants, Credits::from_nanos(10), &nanos(&[0]), NOW)),
            vec![(0, 0, 10)]
        );
    }

    #[test]
    fn grants_due_together_back_holds_in_order() {
        // 50 held before the first instant, 20 more before the second: the first
        // grant backs 40, the second the 10 left of the first holds and 20 of the
        // later ones, and loses 10.
        let grants = [
            grant(40, Some(NOW.0 - 10)),
            grant(40, Some(NOW.0)),
            grant(40, Some(NOW.0 + 10)),
        ];
        let due = plan(&grants, Credits::from_nanos(50), &nanos(&[50, 70]), NOW);
        assert_eq!(lapses(&due), vec![(0, 40, 0), (1, 30, 10)]);
        assert_eq!(due.next_expiry_at, Some(Timestamp(NOW.0 + 10)));
    }
}
