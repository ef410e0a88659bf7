//! API keys: a tenant manages its own; an admin names the tenant.

use super::{ApiErrorCode, app, principal};
use crate::accounts::Principal;
use crate::accounts::api_keys;
use async_graphql::{Context, Object, SimpleObject};
use chrono::{DateTime, Utc};
use uuid::Uuid;

/// A stored API key; its secret is shown only when it is created.
#[derive(SimpleObject)]
pub struct ApiKey {
    pub id: Uuid,
    pub name: String,
    /// The key's first characters, to tell keys apart.
    pub prefix: String,
    pub created_at: DateTime<Utc>,
    /// When the key was last used, to within about a minute.
    pub last_used_at: Option<DateTime<Utc>>,
    pub revoked_at: Option<DateTime<Utc>>,
}

impl From<entity::api_keys::Model> for ApiKey {
    fn from(key: entity::api_keys::Model) -> Self {
        Self {
            id: key.id,
            name: key.name,
            prefix: key.key_prefix,
            created_at: key.created_at.into(),
            last_used_at: key.last_used_at.map(Into::into),
            revoked_at: key.revoked_at.map(Into::into),
        }
    }
}

/// A new key and its secret, which is never shown again.
#[derive(SimpleObject)]
pub struct CreateApiKeyPayload {
    pub api_key: String,
    pub key: ApiKey,
}

/// Reading API keys.
#[derive(Default)]
pub struct KeyQuery;

#[Object]
impl KeyQuery {
    /// The caller's tenant's keys (an admin names the tenant), newest first: every
    /// live one and the 100 most recently created revoked ones.
    async fn api_keys(
        &self,
        context: &Context<'_>,
        tenant_id: Option<Uuid>,
    ) -> async_graphql::Result<Vec<ApiKey>> {
        let tenant_id = managed_tenant(principal(context)?, tenant_id)?;
        let keys = api_keys::list_keys(&app(context).db, tenant_id)
            .await
            .map_err(crate::error::ServiceError::from)?;
        Ok(keys.into_iter().map(Into::into).collect())
    }
}

/// Creating and revoking API keys.
#[derive(Default)]
pub struct KeyMutation;

#[Object]
impl KeyMutation {
    /// A new key for the caller's tenant (an admin names the tenant); its secret is
    /// in the answer and never shown again. A tenant holds at most 100 live keys:
    /// past them this is refused (VALIDATION) until one is revoked.
    async fn create_api_key(
        &self,
        context: &Context<'_>,
        name: String,
        tenant_id: Option<Uuid>,
    ) -> async_graphql::Result<CreateApiKeyPayload> {
        let tenant_id = managed_tenant(principal(context)?, tenant_id)?;
        // The tenant must exist: a key of no tenant would be refused at every use.
        let (stored, key) = api_keys::create_capped_key(&app(context).db, tenant_id, &name).await?;
        Ok(CreateApiKeyPayload {
            api_key: key.expose().to_owned(),
            key: stored.into(),
        })
    }

    /// Revokes a key: refused from the next request on, and every open WebSocket
    /// connection using it is closed (code 4403). A tenant revokes only its own keys.
    async fn revoke_api_key(
        &self,
        context: &Context<'_>,
        id: Uuid,
    ) -> async_graphql::Result<ApiKey> {
        let scope = match principal(context)? {
            Principal::Admin => None,
            Principal::Tenant { tenant_id } => Some(tenant_id),
            Principal::Token(_) => return Err(ApiErrorCode::Forbidden.error("forbidden")),
        };
        let app = app(context);
        Ok(api_keys::revoke_key(&app.db, &app.bus, scope, id)
            .await?
            .into())
    }
}

/// The tenant whose keys (or access tokens) a request manages: a tenant's own (naming
/// another is FORBIDDEN), or the one an admin names; never an access token's.
pub(super) fn managed_tenant(
    principal: Principal,
    named: Option<Uuid>,
) -> async_graphql::Result<Uuid> {
    match (principal, named) {
        (Principal::Tenant { tenant_id }, None) => Ok(tenant_id),
        (Principal::Tenant { tenant_id }, Some(named)) if named == tenant_id => Ok(tenant_id),
        (Principal::Tenant { .. }, Some(_)) => {
            Err(ApiErrorCode::Forbidden.error("a tenant manages only its own keys and tokens"))
        }
        (Principal::Token(_), _) => Err(ApiErrorCode::Forbidden.error("forbidden")),
        (Principal::Admin, Some(named)) => Ok(named),
        (Principal::Admin, None) => {
            Err(ApiErrorCode::Validation.error("tenantId is required for an admin"))
        }
    }
}
