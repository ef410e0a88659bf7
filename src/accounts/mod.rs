//! Tenants, their API keys and access tokens, and who a request acts for.

pub mod access_tokens;
pub mod api_keys;
mod principal;
pub mod tenants;

pub use api_keys::{AdminToken, ApiKey};
pub use principal::Principal;
