//! Settings of a running process, gathered from flags, the environment and the
//! optional config file (`file`).

pub mod file;
pub mod merge;
pub mod providers;

use crate::jobs::worker::WorkerSettings;
use crate::llm::Timeouts;
use rust_decimal::Decimal;
use std::net::SocketAddr;
use std::path::PathBuf;

/// The default database: a SQLite file in the working directory.
pub const DEFAULT_DATABASE_URL: &str = "sqlite:jobledger.db";
/// Where OpenAI's API lives when only `OPENAI_API_KEY` is set.
const OPENAI_DEFAULT_BASE_URL: &str = "https://api.openai.com/v1";
/// The variable an operator sets to choose the admin token.
pub const ADMIN_TOKEN_VARIABLE: &str = "JOBLEDGER_ADMIN_TOKEN";
/// The fewest characters an admin token may have. The token creates tenants and grants
/// credits, and anyone who can reach the API can try to guess it.
pub const MIN_ADMIN_TOKEN_CHARS: usize = 32;

/// Everything `serve` and `worker` need to start.
#[derive(Clone, Debug)]
pub struct Settings {
    /// Where the API listens; `None` runs workers only.
    pub listen: Option<SocketAddr>,
    pub database_url: String,
    /// The direct PostgreSQL URL of the LISTEN connection when `database_url` goes
    /// through a transaction-mode pooler (`--listen-database-url`); `None`: the pools'
    /// own URL, reached directly.
    pub listen_database_url: Option<String>,
    /// `None`: generate one and show it once. From the environment it has passed
    /// [`admin_token`].
    pub admin_token: Option<String>,
    /// `None`: no workers in this process (`serve --workers 0`).
    pub worker: Option<WorkerSettings>,
    pub providers: ProviderSettings,
    /// Customer price over provider price for the built-in price list (the config
    /// file's `customer_markup` replaces it).
    pub customer_markup: Decimal,
    /// The TOML file of providers, routes and prices (`--config`, `JOBLEDGER_CONFIG`),
    /// read and validated when the application is built.
    pub config_file: Option<PathBuf>,
    /// The metrics listener and retention.
    pub operations: OperationsSettings,
    /// Whether webhooks may reach loopback, private and link-local addresses
    /// (`--allow-private-webhooks`; development and tests).
    pub allow_private_webhooks: bool,
    /// The origins whose pages may call the API from a browser (`--cors-origin`), each
    /// as [`cors_origin`] accepts it; empty: none but the API's own.
    pub cors_origins: Vec<String>,
    /// The deadline of a job whose client names none, from when it may start
    /// (`--default-deadline-seconds`); `None`: the config file's, else 24 hours.
    pub default_deadline: Option<std::time::Duration>,
}

/// `text` when it is an origin exactly as a browser sends it in `Origin`: an http(s)
/// scheme, a lowercase host and a port only where it is not the scheme's default,
/// with no path, not even a trailing slash. A browser's `Origin` is compared with it
/// byte for byte, so anything else would never match: it is refused at start, with
/// the form that would.
pub fn cors_origin(text: &str) -> Result<String, String> {
    let url = reqwest::Url::parse(text).map_err(|error| format!("{text:?}: {error}"))?;
    if !matches!(url.scheme(), "http" | "https") {
        return Err(format!("{text:?}: an origin is http:// or https://"));
    }
    let origin = url.origin().ascii_serialization();
    if origin != text {
        return Err(format!(
            "{text:?} is not an origin as browsers send it: write {origin:?} (scheme, host and port, no path)"
        ));
    }
    Ok(origin)
}

/// How long a WebSocket connection may hold no subscription before it is closed.
pub const DEFAULT_UNSUBSCRIBED_SOCKET_TIMEOUT: std::time::Duration =
    std::time::Duration::from_secs(300);
/// Live connections (WebSocket, SSE) the API holds open at once, across all clients.
pub const DEFAULT_MAX_LIVE_CONNECTIONS: usize = 4_096;

/// What keeps a long-running deployment observable and small.
#[derive(Clone, Debug, Default)]
pub struct OperationsSettings {
    /// Where a process without the API serves `/metrics`, `/healthz` and `/readyz`.
    pub metrics_listen: Option<SocketAddr>,
    /// Jobs finished longer ago lose their events and payloads; `None` keeps all.
    pub retention: Option<std::time::Duration>,
    /// The bounds on the API's live connections.
    pub live: LiveConnectionSettings,
    /// How the provider-batch submitter polls, and when it gives a batch up as unknown.
    pub provider_batches: crate::jobs::provider_batches::ProviderBatchSettings,
}

/// The bounds on the API's live connections (WebSocket connections, SSE streams)
/// that are not constants (see `http::live`).
#[derive(Clone, Copy, Debug)]
pub struct LiveConnectionSettings {
    /// Open at once across all clients (`--max-live-connections`); past it a new one is
    /// refused with 503.
    pub max_open: usize,
    /// A WebSocket connection holding no subscription this long is closed: it answers
    /// pings, so nothing else would close it (`--unsubscribed-socket-timeout-seconds`).
    pub unsubscribed_socket_timeout: std::time::Duration,
}

impl Default for LiveConnectionSettings {
    fn default() -> Self {
        Self {
            max_open: DEFAULT_MAX_LIVE_CONNECTIONS,
            unsubscribed_socket_timeout: DEFAULT_UNSUBSCRIBED_SOCKET_TIMEOUT,
        }
    }
}

/// Where each provider family is reached.
#[derive(Clone, Debug, Default)]
pub struct ProviderSettings {
    pub openai: Option<ProviderEndpoint>,
    pub anthropic: Option<ProviderEndpoint>,
    /// A simulator already running elsewhere (tests read its call log); `None` starts
    /// one inside the process for every model no provider claims.
    pub simulator_url: Option<String>,
    /// Connect and first-byte timeouts of every provider call.
    pub timeouts: Timeouts,
}

/// A provider's base URL and key.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ProviderEndpoint {
    pub base_url: String,
    pub api_key: Option<String>,
}

impl ProviderSettings {
    /// Providers from `OPENAI_BASE_URL`/`OPENAI_API_KEY` and
    /// `ANTHROPIC_BASE_URL`/`ANTHROPIC_API_KEY`: a family is configured when either of
    /// its two variables is set.
    pub fn from_env() -> Self {
        Self {
            openai: endpoint_from_env("OPENAI_BASE_URL", "OPENAI_API_KEY", OPENAI_DEFAULT_BASE_URL),
            anthropic: endpoint_from_env(
                "ANTHROPIC_BASE_URL",
                "ANTHROPIC_API_KEY",
                "https://api.anthropic.com",
            ),
            simulator_url: None,
            timeouts: Timeouts::default(),
        }
    }
}

fn endpoint_from_env(
    url_variable: &str,
    key_variable: &str,
    default_url: &str,
) -> Option<ProviderEndpoint> {
    let non_empty = |name| {
        std::env::var(name)
            .ok()
            .filter(|value: &String| !value.trim().is_empty())
    };
    let base_url = non_empty(url_variable);
    let api_key = non_empty(key_variable);
    if base_url.is_none() && api_key.is_none() {
        return None;
    }
    Some(ProviderEndpoint {
        base_url: base_url.unwrap_or_else(|| default_url.to_owned()),
        api_key,
    })
}

/// Why the admin token from the environment was refused.
#[derive(Debug, PartialEq, Eq, thiserror::Error)]
pub enum AdminTokenError {
    #[error(
        "{ADMIN_TOKEN_VARIABLE} has {length} characters; it needs at least {MIN_ADMIN_TOKEN_CHARS} (or leave it unset and `serve` makes one)"
    )]
    TooShort { length: usize },
    #[error("{ADMIN_TOKEN_VARIABLE} must not contain whitespace or control characters")]
    ForbiddenCharacter,
    #[error("{ADMIN_TOKEN_VARIABLE} is not valid UTF-8")]
    NotUnicode,
}

/// The admin token `JOBLEDGER_ADMIN_TOKEN` sets, checked by [`admin_token`]; `None`
/// when the variable is unset.
pub fn admin_token_from_env() -> Result<Option<String>, AdminTokenError> {
    match std::env::var(ADMIN_TOKEN_VARIABLE) {
        Ok(value) => admin_token(&value).map(Some),
        Err(std::env::VarError::NotPresent) => Ok(None),
        Err(std::env::VarError::NotUnicode(_)) => Err(AdminTokenError::NotUnicode),
    }
}

/// An operator's admin token, without the whitespace around it: at least
/// [`MIN_ADMIN_TOKEN_CHARS`] characters, none of them whitespace or control characters
/// (a token pasted with a line break inside would never match what clients send). A
/// variable that is set but blank is refused too, rather than read as unset: a deploy
/// that meant to set a token should not start with a generated one.
pub fn admin_token(value: &str) -> Result<String, AdminTokenError> {
    let token = value.trim();
    if token
        .chars()
        .any(|character| character.is_whitespace() || character.is_control())
    {
        return Err(AdminTokenError::ForbiddenCharacter);
    }
    let length = token.chars().count();
    if length < MIN_ADMIN_TOKEN_CHARS {
        return Err(AdminTokenError::TooShort { length });
    }
    Ok(token.to_owned())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn admin_tokens_need_32_characters_without_whitespace_inside() {
        let token = "a".repeat(MIN_ADMIN_TOKEN_CHARS);
        assert_eq!(admin_token(&format!("  {token}\n")), Ok(token.clone()));
        assert_eq!(
            admin_token(&token[1..]),
            Err(AdminTokenError::TooShort { length: 31 })
        );
        assert_eq!(
            admin_token("   "),
            Err(AdminTokenError::TooShort { length: 0 })
        );
        for inside in [" ", "\t", "\n", "\u{0}", "\u{7f}", "\u{a0}"] {
            let token = format!("{}{inside}{}", &token[..16], &token[16..]);
            assert_eq!(
                admin_token(&token),
                Err(AdminTokenError::ForbiddenCharacter),
                "{token:?}"
            );
        }
        let message = AdminTokenError::TooShort { length: 5 }.to_string();
        assert!(message.contains("JOBLEDGER_ADMIN_TOKEN") && message.contains("32"));
    }
}
