//! Turning a presented API key or access token into a principal.

use crate::accounts::ApiKey;
use crate::accounts::Principal;
use crate::accounts::access_tokens::{self, AccessTokenSecret, TokenLookup};
use crate::accounts::api_keys::{self, Identity};
use crate::app::App;
use axum::http::HeaderValue;
use entity::Timestamp;

/// Why a presented credential was refused.
#[derive(Debug, thiserror::Error)]
pub enum AuthError {
    #[error("the credential must be \"Bearer <key>\"")]
    Malformed,
    #[error("the API key is not valid")]
    UnknownKey,
    /// A real access token whose time is up: refused like an unknown key, but not
    /// counted as a guess against the address.
    #[error("the access token has expired")]
    Expired,
    #[error("could not check the API key")]
    Database(#[from] sea_orm::DbErr),
}

/// The text of an `Authorization` header, if one was sent; a value that is not
/// visible ASCII (a key never is) is `Malformed`, not anonymous.
pub fn credential(presented: Option<&HeaderValue>) -> Result<Option<&str>, AuthError> {
    presented
        .map(|value| value.to_str().map_err(|_| AuthError::Malformed))
        .transpose()
}

/// Who an `Authorization` value (`Bearer <key>`) stands for, with the stored key
/// (for connections that must end when it is revoked); `Ok(None)` when no credential
/// was presented at all.
pub async fn identify(app: &App, credential: Option<&str>) -> Result<Option<Identity>, AuthError> {
    let Some(credential) = credential.map(str::trim).filter(|text| !text.is_empty()) else {
        return Ok(None);
    };
    let (scheme, key) = credential.split_once(' ').ok_or(AuthError::Malformed)?;
    if !scheme.eq_ignore_ascii_case("bearer") || key.trim().is_empty() {
        return Err(AuthError::Malformed);
    }
    let admin = app.admin_token.matches(&ApiKey::from_presented(key.trim()));
    if let Some(token) = AccessTokenSecret::from_presented(key.trim()).filter(|_| !admin) {
        return match access_tokens::identify(&app.db, &token, Timestamp::now()).await? {
            // The minting key's id: its revocation closes the token's connections.
            TokenLookup::Valid(grant) => Ok(Some(Identity {
                key_id: grant.minted_with,
                expires_at: Some(grant.expires_at),
                principal: Principal::Token(grant),
            })),
            TokenLookup::Expired => Err(AuthError::Expired),
            TokenLookup::Unknown => Err(AuthError::UnknownKey),
        };
    }
    let key = ApiKey::from_presented(key.trim());
    api_keys::identify(&app.db, &app.admin_token, &key)
        .await?
        .map(Some)
        .ok_or(AuthError::UnknownKey)
}

/// How long until `at`; zero once it has passed. A credential's expiry is a wall-clock
/// instant, so the wait is measured against the wall clock once and then slept.
pub fn time_until(at: Timestamp) -> std::time::Duration {
    let micros = at.micros().saturating_sub(Timestamp::now().micros());
    std::time::Duration::from_micros(micros.max(0) as u64)
}
