//! API keys: random secrets shown once, stored as SHA-256 hashes.

use super::Principal;
use crate::bus::EventBus;
use crate::error::ServiceError;
use entity::{ApiKeyRole, Timestamp, api_keys, tenants};
use rand::RngCore;
use sea_orm::sea_query::Expr;
use sea_orm::{
    ActiveValue::Set, ColumnTrait, Condition, ConnectionTrait, DatabaseConnection, DbBackend,
    DbErr, EntityTrait, PaginatorTrait, QueryFilter, QueryOrder, QuerySelect,
};
use sha2::{Digest, Sha256};
use std::fmt;
use uuid::Uuid;

/// A key's visible prefix, enough to tell keys apart without revealing them.
const PREFIX_LENGTH: usize = 10;
/// Longest key name accepted.
const MAX_NAME_LENGTH: usize = 100;
/// Live (unrevoked) keys one tenant may hold: each is a row every listing returns
/// whole, and no integration needs more; revoking one makes room.
pub const MAX_LIVE_KEYS_PER_TENANT: u64 = 100;
/// How stale a key's `last_used_at` may get: writing it on every request would make
/// every read a write.
const LAST_USED_PRECISION_SECONDS: i64 = 60;

/// A secret API key as the client presents it (`jl_` + 64 hex digits).
#[derive(Clone, PartialEq, Eq)]
pub struct ApiKey(String);

impl ApiKey {
    /// A fresh random key.
    pub fn generate() -> Self {
        let mut bytes = [0_u8; 32];
        rand::rng().fill_bytes(&mut bytes);
        Self(format!("jl_{}", hex::encode(bytes)))
    }

    /// A key as presented by a client.
    pub fn from_presented(text: &str) -> Self {
        Self(text.to_owned())
    }

    /// The key's text, to show the client once.
    pub fn expose(&self) -> &str {
        &self.0
    }

    /// What is stored instead of the key.
    pub fn hash(&self) -> String {
        hex::encode(Sha256::digest(self.0.as_bytes()))
    }

    fn prefix(&self) -> String {
        self.0.chars().take(PREFIX_LENGTH).collect()
    }
}

impl fmt::Debug for ApiKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "ApiKey({}…)", self.prefix())
    }
}

/// The operator's admin token, from `JOBLEDGER_ADMIN_TOKEN` or made at start.
#[derive(Clone, Debug)]
pub struct AdminToken(ApiKey);

impl AdminToken {
    /// The admin token given in configuration.
    pub fn new(text: &str) -> Self {
        Self(ApiKey::from_presented(text))
    }

    /// A fresh admin token, for a `serve` started without one.
    pub fn generate() -> Self {
        Self(ApiKey::generate())
    }

    /// The token's text.
    pub fn expose(&self) -> &str {
        self.0.expose()
    }

    /// Whether `presented` is the admin token.
    pub fn matches(&self, presented: &ApiKey) -> bool {
        // Comparing hashes rather than secrets keeps the comparison's timing independent
        // of how much of the secret a guess got right.
        self.0.hash() == presented.hash()
    }
}

/// Who presented a credential: the principal it stands for, the stored key (none for
/// the admin token, which lives in configuration, and for access tokens, which are
/// not revoked but expire), and when it expires, if it does.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Identity {
    pub principal: Principal,
    pub key_id: Option<Uuid>,
    pub expires_at: Option<Timestamp>,
}

/// The stored key a request presented, in the request's data beside its principal:
/// what an access token it mints depends on.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CallerKey(pub Uuid);

/// Stores a new key of `tenant_id` named `name` and returns it with its secret, which
/// is shown this once; only its hash is kept.
pub async fn create_tenant_key(
    db: &impl ConnectionTrait,
    tenant_id: Uuid,
    name: &str,
) -> Result<(api_keys::Model, ApiKey), ServiceError> {
    let name = name.trim();
    if name.chars().count() > MAX_NAME_LENGTH {
        return Err(ServiceError::validation(format!(
            "name must be at most {MAX_NAME_LENGTH} characters"
        )));
    }
    crate::validation::single_line("name", name)?;
    let key = ApiKey::generate();
    let row = api_keys::ActiveModel {
        id: Set(Uuid::now_v7()),
        tenant_id: Set(Some(tenant_id)),
        role: Set(ApiKeyRole::Tenant),
        key_hash: Set(key.hash()),
        key_prefix: Set(key.prefix()),
        name: Set(name.to_owned()),
        created_at: Set(Timestamp::now()),
        last_used_at: Set(None),
        revoked_at: Set(None),
    };
    let stored = api_keys::Entity::insert(row)
        .exec_with_returning(db)
        .await?;
    Ok((stored, key))
}

/// [`create_tenant_key`] for an existing tenant, refused (VALIDATION) when it holds
/// [`MAX_LIVE_KEYS_PER_TENANT`] live keys already. Counted and stored in one write
/// transaction holding the tenant's row, so that keys created together cannot pass
/// the cap; `NotFound` when there is no such tenant.
pub async fn create_capped_key(
    db: &DatabaseConnection,
    tenant_id: Uuid,
    name: &str,
) -> Result<(api_keys::Model, ApiKey), ServiceError> {
    let transaction = crate::db::begin_write(db).await?;
    // SQLite's write transaction holds the file already; PostgreSQL locks the row.
    let mut tenant = tenants::Entity::find_by_id(tenant_id);
    if db.get_database_backend() == DbBackend::Postgres {
        tenant = tenant.lock_exclusive();
    }
    tenant
        .one(&transaction)
        .await?
        .ok_or(ServiceError::NotFound)?;
    let live = api_keys::Entity::find()
        .filter(api_keys::Column::TenantId.eq(tenant_id))
        .filter(api_keys::Column::RevokedAt.is_null())
        .count(&transaction)
        .await?;
    if live >= MAX_LIVE_KEYS_PER_TENANT {
        return Err(ServiceError::validation(format!(
            "a tenant holds at most {MAX_LIVE_KEYS_PER_TENANT} live API keys; revoke one first"
        )));
    }
    let created = create_tenant_key(&transaction, tenant_id, name).await?;
    transaction.commit().await?;
    Ok(created)
}

/// Revoked keys a listing shows at most, the most recently created first: revoking
/// frees a place under the cap of live keys, so revoked ones could pile up without
/// bound, and every listing would return them all.
pub const LISTED_REVOKED_KEYS: u64 = 100;

/// The tenant's keys, newest first: every live one (at most
/// [`MAX_LIVE_KEYS_PER_TENANT`]) and the newest [`LISTED_REVOKED_KEYS`] revoked ones.
pub async fn list_keys(
    db: &impl ConnectionTrait,
    tenant_id: Uuid,
) -> Result<Vec<api_keys::Model>, DbErr> {
    let newest_first = |revoked: bool| {
        let revoked_at = api_keys::Column::RevokedAt;
        api_keys::Entity::find()
            .filter(api_keys::Column::TenantId.eq(tenant_id))
            .filter(if revoked {
                revoked_at.is_not_null()
            } else {
                revoked_at.is_null()
            })
            .order_by_desc(api_keys::Column::CreatedAt)
            .order_by_desc(api_keys::Column::Id)
    };
    let mut keys = newest_first(false).all(db).await?;
    keys.extend(
        newest_first(true)
            .limit(LISTED_REVOKED_KEYS)
            .all(db)
            .await?,
    );
    keys.sort_by_key(|key| std::cmp::Reverse((key.created_at, key.id)));
    Ok(keys)
}

/// Revokes a key at once: it is refused from the next request on, and every open
/// connection using it, in any process, is told to close. `tenant_id` limits which
/// keys the caller may revoke (`None`: any, for an admin). Revoking a revoked key
/// changes nothing.
pub async fn revoke_key(
    db: &DatabaseConnection,
    bus: &EventBus,
    tenant_id: Option<Uuid>,
    key_id: Uuid,
) -> Result<api_keys::Model, ServiceError> {
    let transaction = crate::db::begin_write(db).await?;
    let key = api_keys::Entity::find_by_id(key_id)
        .one(&transaction)
        .await?
        .filter(|key| tenant_id.is_none_or(|tenant_id| key.tenant_id == Some(tenant_id)))
        .ok_or(ServiceError::NotFound)?;
    if key.revoked_at.is_some() {
        return Ok(key);
    }
    let revoked_at = Timestamp::now();
    api_keys::Entity::update_many()
        .col_expr(api_keys::Column::RevokedAt, Expr::value(revoked_at))
        .filter(api_keys::Column::Id.eq(key_id))
        .filter(api_keys::Column::RevokedAt.is_null())
        .exec(&transaction)
        .await?;
    crate::bus::relay::notify_revoked_key(&transaction, key_id).await?;
    transaction.commit().await?;
    bus.announce_revoked_key(key_id);
    tracing::info!(key.id = %key_id, "API key revoked");
    Ok(api_keys::Model {
        revoked_at: Some(revoked_at),
        ..key
    })
}

/// Who a presented key stands for, or `None` for an unknown or revoked key.
pub async fn identify(
    db: &impl ConnectionTrait,
    admin_token: &AdminToken,
    presented: &ApiKey,
) -> Result<Option<Identity>, DbErr> {
    if admin_token.matches(presented) {
        return Ok(Some(Identity {
            principal: Principal::Admin,
            key_id: None,
            expires_at: None,
        }));
    }
    let Some(row) = api_keys::Entity::find()
        .filter(api_keys::Column::KeyHash.eq(presented.hash()))
        .filter(api_keys::Column::RevokedAt.is_null())
        .one(db)
        .await?
    else {
        return Ok(None);
    };
    let principal = match (row.role, row.tenant_id) {
        (ApiKeyRole::Admin, _) => Principal::Admin,
        (ApiKeyRole::Tenant, Some(tenant_id)) => Principal::Tenant { tenant_id },
        (ApiKeyRole::Tenant, None) => return Ok(None),
    };
    record_use(db, &row).await?;
    Ok(Some(Identity {
        principal,
        key_id: Some(row.id),
        expires_at: None,
    }))
}

/// Whether the stored key is still valid (not revoked).
pub async fn is_active(db: &impl ConnectionTrait, key_id: Uuid) -> Result<bool, DbErr> {
    Ok(api_keys::Entity::find_by_id(key_id)
        .filter(api_keys::Column::RevokedAt.is_null())
        .one(db)
        .await?
        .is_some())
}

/// Notes that `key` was used, unless that was noted less than a minute ago.
async fn record_use(db: &impl ConnectionTrait, key: &api_keys::Model) -> Result<(), DbErr> {
    let now = Timestamp::now();
    let stale_before = now.plus(-chrono::Duration::seconds(LAST_USED_PRECISION_SECONDS));
    if key.last_used_at.is_some_and(|at| at >= stale_before) {
        return Ok(());
    }
    // The condition makes concurrent requests write once between them.
    api_keys::Entity::update_many()
        .col_expr(api_keys::Column::LastUsedAt, Expr::value(now))
        .filter(api_keys::Column::Id.eq(key.id))
        .filter(
            Condition::any()
                .add(api_keys::Column::LastUsedAt.is_null())
                .add(api_keys::Column::LastUsedAt.lt(stale_before)),
        )
        .exec(db)
        .await?;
    Ok(())
}
