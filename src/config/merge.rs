//! What the settings from flags and the environment and the optional config file
//! decide together. A flag wins over the file and the file over the built-in default,
//! except where the file alone says (charging, per-minute limits).

use super::Settings;
use super::file::ConfigFile;
use crate::billing::ChargingPolicy;
use crate::jobs::worker::WorkerSettings;
use crate::llm::ProviderRegistry;
use std::time::Duration;

/// The deadline of a job whose client names none: the flag's, else the file's, else
/// the built-in 24 hours.
pub fn default_deadline(settings: &Settings, config: Option<&ConfigFile>) -> Duration {
    settings
        .default_deadline
        .or(config.and_then(|config| config.default_deadline))
        .unwrap_or(crate::jobs::input::DEFAULT_DEADLINE)
}

/// What the customer pays for calls that did not simply succeed: the file's
/// `[charging]`, else the default policy.
pub fn charging(config: Option<&ConfigFile>) -> ChargingPolicy {
    config.map_or_else(Default::default, |config| config.charging)
}

/// The workers' settings, `None` when this process runs none; a file adds its charging
/// policy and its per-minute limits of providers and models, which `providers` routes.
pub fn worker_settings(
    settings: &Settings,
    config: Option<&ConfigFile>,
    providers: &ProviderRegistry,
) -> Option<WorkerSettings> {
    let mut worker = settings.worker.clone()?;
    if let Some(config) = config {
        worker.charging = config.charging;
        worker.flow = config.flow_limits(providers);
    }
    Some(worker)
}
