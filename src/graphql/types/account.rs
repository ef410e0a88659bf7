//! Accounts and tenants, with their credits.

use super::{money, time};
use crate::billing::balance::Balance;
use crate::error::ServiceError;
use crate::graphql::scalars::Amount;
use async_graphql::{ComplexObject, Context, SimpleObject};
use chrono::{DateTime, Utc};
use entity::{Timestamp, credit_grants, tenants};
use uuid::Uuid;

/// The tenant's own account.
#[derive(SimpleObject)]
#[graphql(complex)]
pub struct Account {
    pub id: Uuid,
    pub name: String,
    #[graphql(skip)]
    pub tenant: tenants::Model,
}

#[ComplexObject]
impl Account {
    async fn balance(&self) -> AccountBalance {
        AccountBalance::from(Balance::from(&self.tenant))
    }

    /// The limits an admin set for this account.
    async fn limits(
        &self,
        context: &Context<'_>,
    ) -> async_graphql::Result<crate::graphql::spend_limits::TenantLimits> {
        let limits = crate::billing::limits::limits_of(&crate::graphql::app(context).db, self.id)
            .await
            .map_err(ServiceError::from)?;
        Ok(crate::graphql::spend_limits::TenantLimits::new(
            self.id, limits,
        ))
    }

    /// What this account spent in the current UTC day and month.
    async fn spend(&self) -> crate::graphql::spend_limits::AccountSpend {
        crate::billing::limits::Spend::of(&self.tenant, Timestamp::now()).into()
    }
}

/// A tenant's credits.
#[derive(SimpleObject)]
pub struct AccountBalance {
    /// Everything ever granted.
    pub granted: Amount,
    /// Reserved by jobs not yet finished.
    pub held: Amount,
    /// Paid for succeeded jobs.
    pub charged: Amount,
    /// Left the balance because its grant expired.
    pub expired: Amount,
    /// `granted − expired − charged − held`: what new jobs may reserve.
    pub available: Amount,
}

impl From<Balance> for AccountBalance {
    fn from(balance: Balance) -> Self {
        Self {
            granted: balance.granted.into(),
            held: balance.held.into(),
            charged: balance.charged.into(),
            expired: balance.expired.into(),
            available: balance.available().into(),
        }
    }
}

/// A tenant, as an admin sees it.
#[derive(SimpleObject)]
pub struct Tenant {
    pub id: Uuid,
    pub name: String,
    pub created_at: DateTime<Utc>,
    /// The tenant's credits, as its own `account { balance }` shows them.
    pub balance: AccountBalance,
}

impl From<tenants::Model> for Tenant {
    fn from(tenant: tenants::Model) -> Self {
        Self {
            balance: AccountBalance::from(Balance::from(&tenant)),
            id: tenant.id,
            name: tenant.name,
            created_at: time(tenant.created_at),
        }
    }
}

/// Credits granted to a tenant.
#[derive(SimpleObject)]
pub struct CreditGrant {
    pub id: Uuid,
    pub tenant_id: Uuid,
    pub amount: Amount,
    pub idempotency_key: String,
    pub reason: Option<String>,
    pub created_at: DateTime<Utc>,
    /// When what is left of it expires; null when it never does.
    pub expires_at: Option<DateTime<Utc>>,
    /// What charges consumed of it so far, as attributed at its last expiry or at the
    /// next grant (charges consume the soonest-expiring grants first).
    pub consumed: Amount,
    /// What expired of it.
    pub expired: Amount,
}

impl From<credit_grants::Model> for CreditGrant {
    fn from(grant: credit_grants::Model) -> Self {
        Self {
            id: grant.id,
            tenant_id: grant.tenant_id,
            amount: money(grant.amount_nanos),
            idempotency_key: grant.idempotency_key,
            reason: grant.reason,
            created_at: time(grant.created_at),
            expires_at: grant.expires_at.map(time),
            consumed: money(grant.consumed_nanos),
            expired: money(grant.expired_nanos),
        }
    }
}
