//! What every request handler and service call shares: the application state.

use crate::accounts::AdminToken;
use crate::bus::EventBus;
use crate::llm::ProviderRegistry;
use crate::metrics::Metrics;
use sea_orm::DatabaseConnection;

/// What request handlers share: the database, the event bus, the admin token and
/// which models this deployment can serve.
#[derive(Clone, Debug)]
pub struct App {
    pub db: DatabaseConnection,
    pub bus: EventBus,
    pub admin_token: AdminToken,
    pub providers: ProviderRegistry,
    /// This process's metrics, served on `/metrics`.
    pub metrics: Metrics,
    /// The workers' own pool, when they have one, for the pool gauge.
    pub worker_db: Option<DatabaseConnection>,
    /// The background tasks' own pool, when they have one (`serve`), for the pool
    /// gauge.
    pub background_db: Option<DatabaseConnection>,
    /// Whether webhooks may reach loopback and private addresses.
    pub allow_private_webhooks: bool,
    /// The deadline of a job whose client names none, from when it may start: the
    /// flag's, else the config file's, else [`crate::jobs::input::DEFAULT_DEADLINE`].
    pub default_deadline: std::time::Duration,
    /// The config file's charging policy (the default without one): holds follow
    /// it, as the workers' charges do.
    pub charging: crate::billing::ChargingPolicy,
    /// Where requests' documents are measured, off the async threads.
    pub measuring: crate::jobs::measuring::Measuring,
}
