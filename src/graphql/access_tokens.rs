//! Minting access tokens: a tenant's backend (or the admin, for a tenant) gives a
//! browser a short-lived credential for its jobs alone.

use super::keys::managed_tenant;
use super::mutation::LabelInput;
use super::scalars::Amount;
use super::{ApiErrorCode, app, principal};
use crate::accounts::access_tokens::{self, TokenRequest};
use crate::accounts::api_keys::CallerKey;
use crate::billing::Credits;
use async_graphql::{Context, Enum, InputObject, Object, SimpleObject};
use chrono::{DateTime, Utc};
use entity::Timestamp;
use uuid::Uuid;

/// What an access token may do with the jobs within its reach.
#[derive(Enum, Clone, Copy, Debug, PartialEq, Eq)]
#[graphql(remote = "crate::accounts::access_tokens::AccessScope")]
// The contract names them so (READ_JOBS, …): more scopes may one day be of other
// things than jobs.
#[allow(clippy::enum_variant_names)]
pub enum AccessScope {
    /// `job`, `jobs` and `jobUpdates`.
    ReadJobs,
    /// `createJob`: the job gets the token's labels; its hold counts against
    /// `maxSpend`.
    CreateJobs,
    /// `cancelJob`.
    CancelJobs,
}

/// The token to mint.
#[derive(InputObject)]
pub struct CreateAccessTokenInput {
    /// At least one.
    pub scopes: Vec<AccessScope>,
    /// The token reaches only jobs carrying every one of these labels, and the jobs it
    /// creates get them. Without labels or `jobIds` it reaches every job of the tenant.
    pub labels: Option<Vec<LabelInput>>,
    /// The token reaches only these jobs (at most 100); not with `labels`, nor with
    /// `CREATE_JOBS`.
    pub job_ids: Option<Vec<Uuid>>,
    /// How long the token lives: 900 s unless given, at most 86,400.
    pub ttl_seconds: Option<i32>,
    /// The most the holds of its creates may take in all (needs `CREATE_JOBS`).
    pub max_spend: Option<Amount>,
    /// The tenant, for an admin; a tenant may name only itself.
    pub tenant_id: Option<Uuid>,
}

/// A minted token: its secret is shown only now.
#[derive(SimpleObject)]
pub struct CreateAccessTokenPayload {
    /// `Bearer <token>` on HTTP, `{"authorization": "Bearer <token>"}` in a
    /// WebSocket's `connection_init`.
    pub token: String,
    pub expires_at: DateTime<Utc>,
    pub scopes: Vec<AccessScope>,
}

/// Minting access tokens.
#[derive(Default)]
pub struct AccessTokenMutation;

#[Object]
impl AccessTokenMutation {
    /// Mints a short-lived token for a browser. A tenant key mints for its own tenant,
    /// the admin for the tenant it names; an access token never mints (`FORBIDDEN`).
    /// Once expired the token is `UNAUTHENTICATED` over HTTP, and its sockets close
    /// with 4403.
    async fn create_access_token(
        &self,
        context: &Context<'_>,
        input: CreateAccessTokenInput,
    ) -> async_graphql::Result<CreateAccessTokenPayload> {
        let tenant_id = managed_tenant(principal(context)?, input.tenant_id)?;
        let max_spend = input
            .max_spend
            .map(|amount| Credits::from_decimal(amount.0))
            .transpose()
            .map_err(|error| ApiErrorCode::Validation.error(format!("maxSpend: {error}")))?;
        let request = TokenRequest {
            scopes: input.scopes.into_iter().map(Into::into).collect(),
            labels: input
                .labels
                .unwrap_or_default()
                .into_iter()
                .map(|label| (label.key, label.value))
                .collect(),
            job_ids: input.job_ids,
            ttl_seconds: input.ttl_seconds.map(i64::from),
            max_spend,
        };
        let minted_with = context.data_opt::<CallerKey>().map(|key| key.0);
        let minted = access_tokens::mint(
            &app(context).db,
            tenant_id,
            minted_with,
            request,
            Timestamp::now(),
        )
        .await?;
        Ok(CreateAccessTokenPayload {
            scopes: minted.scopes().into_iter().map(Into::into).collect(),
            token: minted.secret.expose().to_owned(),
            expires_at: minted.row.expires_at.into(),
        })
    }
}
