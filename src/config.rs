//! Settings of a running process, gathered from flags, the environment and the
//! optional config file (`file`).

pub mod file;

use crate::jobs::worker::WorkerSettings;
use crate::llm::Timeouts;
use rust_decimal::Decimal;
use std::net::SocketAddr;
use std::path::PathBuf;

/// The default database: a SQLite file in the working directory.
pub const DEFAULT_DATABASE_URL: &str = "sqlite:jobledger.db";
/// Where OpenAI's API lives when only `OPENAI_API_KEY` is set.
const OPENAI_DEFAULT_BASE_URL: &str = "https://api.openai.com/v1";

/// Everything `serve` and `worker` need to start.
#[derive(Clone, Debug)]
pub struct Settings {
    /// Where the API listens; `None` runs workers only.
    pub listen: Option<SocketAddr>,
    pub database_url: String,
    /// `None`: generate one and show it once.
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
