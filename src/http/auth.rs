//! Turning a presented API key into a principal.

use crate::accounts::ApiKey;
use crate::accounts::api_keys::{self, Identity};
use crate::startup::App;
use axum::http::HeaderValue;

/// Why a presented credential was refused.
#[derive(Debug, thiserror::Error)]
pub enum AuthError {
    #[error("the credential must be \"Bearer <key>\"")]
    Malformed,
    #[error("the API key is not valid")]
    UnknownKey,
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
    let key = ApiKey::from_presented(key.trim());
    api_keys::identify(&app.db, &app.admin_token, &key)
        .await?
        .map(Some)
        .ok_or(AuthError::UnknownKey)
}
