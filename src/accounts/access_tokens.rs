//! Access tokens: short-lived credentials a tenant's backend mints for one browser
//! session. A token reads, creates or cancels jobs as its scopes say, and only jobs
//! within its reach (carrying its labels, or listed by id); everything else — billing,
//! the ledger, keys, webhooks, limits, other tokens — is refused to it.
//!
//! A token is a random secret stored as its SHA-256 hash, like an API key, so that it
//! can be looked up in one indexed read and its row can keep the spend its creates
//! took; it is not signed, because nothing of it needs checking without the database.

use crate::error::ServiceError;
use crate::jobs::labels::Labels;
use crate::jobs::reach::JobReach;
use entity::Credits;
use entity::{JsonText, Timestamp, access_tokens, tenants};
use rand::RngCore;
use sea_orm::{ActiveValue::Set, ColumnTrait, ConnectionTrait, DbErr, EntityTrait, QueryFilter};
use sha2::{Digest, Sha256};
use std::fmt;
use std::sync::Arc;
use uuid::Uuid;

/// How long a token lives when its minter does not say: one page visit.
pub const DEFAULT_TTL_SECONDS: i64 = 900;
/// The longest a token may live: a browser holds it, so a leaked one must die soon.
pub const MAX_TTL_SECONDS: i64 = 86_400;
/// Most job ids one token may be limited to: its row and every check carry the list.
pub const MAX_JOB_IDS: usize = 100;
/// How a token's text begins, which tells it from an API key (`jl_`).
const TOKEN_PREFIX: &str = "jlt_";

/// What a token may do with the jobs it reaches.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
// The contract names them so (READ_JOBS, …): more scopes may one day be of other
// things than jobs.
#[allow(clippy::enum_variant_names)]
pub enum AccessScope {
    /// `job`, `jobs`, `jobUpdates`.
    ReadJobs,
    /// `createJob`.
    CreateJobs,
    /// `cancelJob`.
    CancelJobs,
}

impl AccessScope {
    /// Every scope, in the order they are stored.
    pub const ALL: [Self; 3] = [Self::ReadJobs, Self::CreateJobs, Self::CancelJobs];

    /// The scope's stored name, which is also its name in the schema.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::ReadJobs => "READ_JOBS",
            Self::CreateJobs => "CREATE_JOBS",
            Self::CancelJobs => "CANCEL_JOBS",
        }
    }

    fn parse(text: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|scope| scope.as_str() == text)
    }
}

/// A token's secret as the client presents it (`jlt_` + 64 hex digits).
#[derive(Clone, PartialEq, Eq)]
pub struct AccessTokenSecret(String);

impl AccessTokenSecret {
    fn generate() -> Self {
        let mut bytes = [0_u8; 32];
        rand::rng().fill_bytes(&mut bytes);
        Self(format!("{TOKEN_PREFIX}{}", hex::encode(bytes)))
    }

    /// The presented text as a token's secret, if it has a token's form; anything
    /// else is an API key or nothing.
    pub fn from_presented(text: &str) -> Option<Self> {
        text.starts_with(TOKEN_PREFIX)
            .then(|| Self(text.to_owned()))
    }

    /// The token's text, to give the minter once.
    pub fn expose(&self) -> &str {
        &self.0
    }

    fn hash(&self) -> String {
        hex::encode(Sha256::digest(self.0.as_bytes()))
    }
}

impl fmt::Debug for AccessTokenSecret {
    // The secret never reaches a log: a browser's token is as good as its session.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("AccessTokenSecret(…)")
    }
}

/// What a presented, unexpired token allows.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct AccessGrant {
    pub token_id: Uuid,
    pub tenant_id: Uuid,
    /// The API key that minted it: its revocation ends the token too.
    pub minted_with: Option<Uuid>,
    scopes: Vec<AccessScope>,
    pub reach: JobReach,
    pub expires_at: Timestamp,
}

impl AccessGrant {
    /// `Forbidden` unless the token was given `scope`.
    pub fn require(&self, scope: AccessScope) -> Result<(), ServiceError> {
        if self.scopes.contains(&scope) {
            Ok(())
        } else {
            Err(ServiceError::Forbidden)
        }
    }
}

/// What a minter asks a token to be.
#[derive(Clone, Debug)]
pub struct TokenRequest {
    pub scopes: Vec<AccessScope>,
    pub labels: Vec<(String, String)>,
    pub job_ids: Option<Vec<Uuid>>,
    pub ttl_seconds: Option<i64>,
    pub max_spend: Option<Credits>,
}

/// A minted token: its stored row and its secret, shown this once.
#[derive(Debug)]
pub struct MintedToken {
    pub row: access_tokens::Model,
    pub secret: AccessTokenSecret,
}

impl MintedToken {
    pub fn scopes(&self) -> Vec<AccessScope> {
        parse_scopes(&self.row.scopes)
    }
}

/// Stores a new token of `tenant_id` as `request` describes, minted with the API key
/// `minted_with` (`None`: the admin token); `Validation` for the first broken rule,
/// `NotFound` when there is no such tenant.
pub async fn mint(
    db: &impl ConnectionTrait,
    tenant_id: Uuid,
    minted_with: Option<Uuid>,
    request: TokenRequest,
    now: Timestamp,
) -> Result<MintedToken, ServiceError> {
    let mut scopes = request.scopes;
    scopes.sort();
    scopes.dedup();
    if scopes.is_empty() {
        return Err(ServiceError::validation(
            "scopes must name at least one scope",
        ));
    }
    let ttl = request.ttl_seconds.unwrap_or(DEFAULT_TTL_SECONDS);
    if !(1..=MAX_TTL_SECONDS).contains(&ttl) {
        return Err(ServiceError::validation(format!(
            "ttlSeconds must be 1 to {MAX_TTL_SECONDS}"
        )));
    }
    let labels = Labels::parse(request.labels)?;
    let job_ids = match request.job_ids {
        None => None,
        Some(_) if !labels.is_empty() => {
            return Err(ServiceError::validation(
                "a token is limited either to labels or to jobIds, not both",
            ));
        }
        Some(ids) if ids.is_empty() || ids.len() > MAX_JOB_IDS => {
            return Err(ServiceError::validation(format!(
                "jobIds must list 1 to {MAX_JOB_IDS} jobs"
            )));
        }
        // A job it created would be out of its reach at once: a token that creates
        // must reach its creations through labels.
        Some(_) if scopes.contains(&AccessScope::CreateJobs) => {
            return Err(ServiceError::validation(
                "a token limited to jobIds cannot have CREATE_JOBS: it could not see the jobs it created",
            ));
        }
        Some(mut ids) => {
            ids.sort();
            ids.dedup();
            Some(ids)
        }
    };
    if let Some(max_spend) = request.max_spend {
        if max_spend < Credits::ZERO {
            return Err(ServiceError::validation("maxSpend must not be negative"));
        }
        if !scopes.contains(&AccessScope::CreateJobs) {
            return Err(ServiceError::validation(
                "maxSpend caps the holds of a token's creates: it needs CREATE_JOBS",
            ));
        }
    }
    tenants::Entity::find_by_id(tenant_id)
        .one(db)
        .await?
        .ok_or(ServiceError::NotFound)?;
    // A page visit mints a token, so rows would pile up: each mint deletes the
    // tenant's expired ones, which an expired token's refusal does not need — its
    // expiry alone refuses it, and an unknown token is refused alike.
    access_tokens::Entity::delete_many()
        .filter(access_tokens::Column::TenantId.eq(tenant_id))
        .filter(access_tokens::Column::ExpiresAt.lte(now))
        .exec(db)
        .await?;
    let secret = AccessTokenSecret::generate();
    let row = access_tokens::ActiveModel {
        id: Set(Uuid::now_v7()),
        tenant_id: Set(tenant_id),
        api_key_id: Set(minted_with),
        token_hash: Set(secret.hash()),
        scopes: Set(scopes
            .iter()
            .map(|scope| scope.as_str())
            .collect::<Vec<_>>()
            .join(",")),
        labels: Set(JsonText(labels.to_json())),
        job_ids: Set(job_ids.map(|ids| JsonText(serde_json::json!(ids)))),
        max_spend_nanos: Set(request.max_spend.map(Credits::nanos)),
        spent_nanos: Set(0),
        created_at: Set(now),
        expires_at: Set(now.plus(chrono::Duration::seconds(ttl))),
    };
    let row = access_tokens::Entity::insert(row)
        .exec_with_returning(db)
        .await?;
    tracing::info!(token.id = %row.id, tenant.id = %tenant_id, scopes = %row.scopes, "access token minted");
    Ok(MintedToken { row, secret })
}

/// What a presented token turned out to be.
#[derive(Debug)]
pub enum TokenLookup {
    Valid(Arc<AccessGrant>),
    Expired,
    Unknown,
}

/// Who a presented token stands for at `now`.
pub async fn identify(
    db: &impl ConnectionTrait,
    presented: &AccessTokenSecret,
    now: Timestamp,
) -> Result<TokenLookup, DbErr> {
    let Some(row) = access_tokens::Entity::find()
        .filter(access_tokens::Column::TokenHash.eq(presented.hash()))
        .one(db)
        .await?
    else {
        return Ok(TokenLookup::Unknown);
    };
    if row.expires_at <= now {
        return Ok(TokenLookup::Expired);
    }
    if let Some(key_id) = row.api_key_id
        && !super::api_keys::is_active(db, key_id).await?
    {
        return Ok(TokenLookup::Unknown);
    }
    let reach = match &row.job_ids {
        Some(ids) => JobReach::Listed(
            serde_json::from_value(ids.0.clone())
                .map_err(|error| DbErr::Custom(format!("a token's job ids: {error}")))?,
        ),
        None => {
            let pairs: Vec<(String, String)> = serde_json::from_value(row.labels.0.clone())
                .map_err(|error| DbErr::Custom(format!("a token's labels: {error}")))?;
            let labels = Labels::parse(pairs)
                .map_err(|error| DbErr::Custom(format!("a token's labels: {error}")))?;
            if labels.is_empty() {
                JobReach::All
            } else {
                JobReach::Labelled(labels)
            }
        }
    };
    Ok(TokenLookup::Valid(Arc::new(AccessGrant {
        token_id: row.id,
        tenant_id: row.tenant_id,
        minted_with: row.api_key_id,
        scopes: parse_scopes(&row.scopes),
        reach,
        expires_at: row.expires_at,
    })))
}

fn parse_scopes(stored: &str) -> Vec<AccessScope> {
    stored.split(',').filter_map(AccessScope::parse).collect()
}
