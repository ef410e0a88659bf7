//! API keys: random secrets shown once, stored as SHA-256 hashes.

use super::Principal;
use entity::{ApiKeyRole, Timestamp, api_keys};
use rand::RngCore;
use sea_orm::{ActiveValue::Set, ColumnTrait, ConnectionTrait, DbErr, EntityTrait, QueryFilter};
use sha2::{Digest, Sha256};
use std::fmt;
use uuid::Uuid;

/// A key's visible prefix, enough to tell keys apart without revealing them.
const PREFIX_LENGTH: usize = 10;

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

    fn matches(&self, presented: &ApiKey) -> bool {
        // Comparing hashes rather than secrets keeps the comparison's timing independent
        // of how much of the secret a guess got right.
        self.0.hash() == presented.hash()
    }
}

/// Stores a new tenant key and returns it; only its hash is kept.
pub async fn create_tenant_key(
    db: &impl ConnectionTrait,
    tenant_id: Uuid,
) -> Result<ApiKey, DbErr> {
    let key = ApiKey::generate();
    let row = api_keys::ActiveModel {
        id: Set(Uuid::now_v7()),
        tenant_id: Set(Some(tenant_id)),
        role: Set(ApiKeyRole::Tenant),
        key_hash: Set(key.hash()),
        key_prefix: Set(key.prefix()),
        created_at: Set(Timestamp::now()),
        revoked_at: Set(None),
    };
    api_keys::Entity::insert(row).exec(db).await?;
    Ok(key)
}

/// The principal a presented key stands for, or `None` for an unknown or revoked key.
pub async fn authenticate(
    db: &impl ConnectionTrait,
    admin_token: &AdminToken,
    presented: &ApiKey,
) -> Result<Option<Principal>, DbErr> {
    if admin_token.matches(presented) {
        return Ok(Some(Principal::Admin));
    }
    let Some(row) = api_keys::Entity::find()
        .filter(api_keys::Column::KeyHash.eq(presented.hash()))
        .filter(api_keys::Column::RevokedAt.is_null())
        .one(db)
        .await?
    else {
        return Ok(None);
    };
    Ok(match (row.role, row.tenant_id) {
        (ApiKeyRole::Admin, _) => Some(Principal::Admin),
        (ApiKeyRole::Tenant, Some(tenant_id)) => Some(Principal::Tenant { tenant_id }),
        (ApiKeyRole::Tenant, None) => None,
    })
}
