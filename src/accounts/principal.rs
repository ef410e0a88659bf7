use super::access_tokens::{AccessGrant, AccessScope};
use super::tenants;
use crate::billing::reports::ReportScope;
use crate::error::ServiceError;
use crate::jobs::reach::JobReach;
use sea_orm::ConnectionTrait;
use std::sync::Arc;
use uuid::Uuid;

/// Who a request acts for, established from its API key or access token.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Principal {
    /// May create tenants and grant credits.
    Admin,
    /// Sees and changes only this tenant's jobs, balance and events.
    Tenant { tenant_id: Uuid },
    /// A browser's access token: only the job operations its scopes name, on the jobs
    /// of its tenant within its reach; nothing else.
    Token(Arc<AccessGrant>),
}

impl Principal {
    /// The tenant a request acts for with a tenant's full powers, or `Forbidden` for
    /// an admin and for an access token.
    pub fn tenant_id(self) -> Result<Uuid, ServiceError> {
        match self {
            Self::Tenant { tenant_id } => Ok(tenant_id),
            Self::Admin | Self::Token(_) => Err(ServiceError::Forbidden),
        }
    }

    /// `Forbidden` unless the request acts for an admin.
    pub fn require_admin(self) -> Result<(), ServiceError> {
        match self {
            Self::Admin => Ok(()),
            Self::Tenant { .. } | Self::Token(_) => Err(ServiceError::Forbidden),
        }
    }

    /// The tenant whose capacity the request uses (live connections, request rates,
    /// fair shares): an access token's is its tenant's. `None` for an admin.
    pub fn counted_tenant(&self) -> Option<Uuid> {
        match self {
            Self::Admin => None,
            Self::Tenant { tenant_id } => Some(*tenant_id),
            Self::Token(grant) => Some(grant.tenant_id),
        }
    }

    /// The tenant and the jobs of it that a job operation needing `scope` may touch:
    /// all of a tenant key's, an access token's within its reach if it has the scope
    /// (`Forbidden` otherwise). An admin is `Forbidden`: it names tenants explicitly.
    pub fn job_access(&self, scope: AccessScope) -> Result<(Uuid, JobReach), ServiceError> {
        match self {
            Self::Tenant { tenant_id } => Ok((*tenant_id, JobReach::All)),
            Self::Token(grant) => {
                grant.require(scope)?;
                Ok((grant.tenant_id, grant.reach.clone()))
            }
            Self::Admin => Err(ServiceError::Forbidden),
        }
    }

    /// The billing figures this principal may see when it asks for `requested` (a
    /// tenant id or none).
    ///
    /// A tenant sees itself: naming no tenant or its own id is the same, naming another
    /// tenant is `Forbidden`. An admin sees the tenant it names (`NotFound` when there is
    /// no such tenant), or every tenant when it names none.
    pub async fn report_scope(
        self,
        db: &impl ConnectionTrait,
        requested: Option<Uuid>,
    ) -> Result<ReportScope, ServiceError> {
        match (self, requested) {
            (Self::Tenant { tenant_id }, None) => Ok(ReportScope::Tenant(tenant_id)),
            (Self::Tenant { tenant_id }, Some(requested)) if requested == tenant_id => {
                Ok(ReportScope::Tenant(tenant_id))
            }
            (Self::Tenant { .. } | Self::Token(_), _) => Err(ServiceError::Forbidden),
            (Self::Admin, Some(requested)) => {
                tenants::find_tenant(db, requested).await?;
                Ok(ReportScope::Tenant(requested))
            }
            (Self::Admin, None) => Ok(ReportScope::AllTenants),
        }
    }

    /// The one tenant whose figures this principal may see, as
    /// [`Principal::report_scope`] says, for reports that cover a single tenant: an
    /// admin must name it.
    pub async fn report_tenant(
        self,
        db: &impl ConnectionTrait,
        requested: Option<Uuid>,
    ) -> Result<Uuid, ServiceError> {
        match self.report_scope(db, requested).await? {
            ReportScope::Tenant(tenant_id) => Ok(tenant_id),
            ReportScope::AllTenants => Err(ServiceError::validation(
                "tenantId is required for an admin",
            )),
        }
    }
}
