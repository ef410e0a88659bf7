//! A tenant's balance: the cached totals on its row, what of them is available, and
//! the ledger entries that explain every change to them. Holds and settlements
//! (`ledger`) and grant expiry (`grant_expiry`) both write through here, so neither
//! needs the other to keep the ledger and the cached balance in step.

use super::Credits;
use entity::{LedgerEntryKind, Timestamp, ledger_entries, tenants};
use sea_orm::sea_query::{Expr, ExprTrait};
use sea_orm::{ActiveValue::Set, ConnectionTrait, DbErr, EntityTrait};
use uuid::Uuid;

/// A tenant's credits. `available = granted − expired − charged − held`, never below
/// zero.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Balance {
    pub granted: Credits,
    pub held: Credits,
    pub charged: Credits,
    /// What left the balance because its grant expired.
    pub expired: Credits,
}

impl Balance {
    /// What new holds may still use.
    pub fn available(&self) -> Credits {
        self.granted - self.expired - self.charged - self.held
    }
}

/// `granted − expired − charged − held` of the tenant row, in SQL.
pub fn available_column() -> Expr {
    Expr::col(tenants::Column::GrantedNanos)
        .sub(Expr::col(tenants::Column::ExpiredNanos))
        .sub(Expr::col(tenants::Column::ChargedNanos))
        .sub(Expr::col(tenants::Column::HeldNanos))
}

impl From<&tenants::Model> for Balance {
    fn from(tenant: &tenants::Model) -> Self {
        Self {
            granted: Credits::from_nanos(tenant.granted_nanos),
            held: Credits::from_nanos(tenant.held_nanos),
            charged: Credits::from_nanos(tenant.charged_nanos),
            expired: Credits::from_nanos(tenant.expired_nanos),
        }
    }
}

/// One ledger entry of a tenant about `(job, grant)`, dated `now`: the row every
/// movement of credits writes beside the cached balance it changes.
pub(super) fn entry(
    tenant_id: Uuid,
    (job_id, grant_id): (Option<Uuid>, Option<Uuid>),
    kind: LedgerEntryKind,
    amount: Credits,
    now: Timestamp,
) -> ledger_entries::ActiveModel {
    ledger_entries::ActiveModel {
        id: Set(Uuid::now_v7()),
        tenant_id: Set(tenant_id),
        kind: Set(kind),
        amount_nanos: Set(amount.nanos()),
        job_id: Set(job_id),
        grant_id: Set(grant_id),
        created_at: Set(now),
    }
}

/// Appends one ledger entry per `(kind, amount)` of a tenant, all about the same
/// `(job, grant)`, in one statement.
pub(super) async fn append_entries(
    db: &impl ConnectionTrait,
    tenant_id: Uuid,
    subject: (Option<Uuid>, Option<Uuid>),
    entries: impl IntoIterator<Item = (LedgerEntryKind, Credits)>,
) -> Result<(), DbErr> {
    let now = Timestamp::now();
    let rows: Vec<_> = entries
        .into_iter()
        .map(|(kind, amount)| entry(tenant_id, subject, kind, amount, now))
        .collect();
    if !rows.is_empty() {
        ledger_entries::Entity::insert_many(rows).exec(db).await?;
    }
    Ok(())
}
