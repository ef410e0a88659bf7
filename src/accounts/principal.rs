use crate::error::ServiceError;
use uuid::Uuid;

/// Who a request acts for, established from its API key.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Principal {
    /// May create tenants and grant credits.
    Admin,
    /// Sees and changes only this tenant's jobs, balance and events.
    Tenant { tenant_id: Uuid },
}

impl Principal {
    /// The tenant a request acts for, or `Forbidden` for an admin.
    pub fn tenant_id(self) -> Result<Uuid, ServiceError> {
        match self {
            Self::Tenant { tenant_id } => Ok(tenant_id),
            Self::Admin => Err(ServiceError::Forbidden),
        }
    }

    /// `Forbidden` unless the request acts for an admin.
    pub fn require_admin(self) -> Result<(), ServiceError> {
        match self {
            Self::Admin => Ok(()),
            Self::Tenant { .. } => Err(ServiceError::Forbidden),
        }
    }
}
