//! The providers a process calls, from its settings and config file: which client
//! serves each model, and whether the built-in simulator is needed at all.

use super::ProviderEndpoint;
use super::Settings;
use super::file::{ConfigFile, ProviderKind};
use crate::llm::anthropic::AnthropicClient;
use crate::llm::openai::OpenAiClient;
use crate::llm::routing::ModelFamily;
use crate::llm::{Provider, ProviderRegistry};
use std::sync::Arc;

/// Whether a real provider is configured (flags, environment or config file): then the
/// simulator serves only models the config file routes to it by name.
fn real_provider_configured(settings: &Settings, config: Option<&ConfigFile>) -> bool {
    settings.providers.openai.is_some()
        || settings.providers.anthropic.is_some()
        || config.is_some_and(|config| {
            config
                .providers
                .values()
                .any(|provider| provider.kind != ProviderKind::Simulator)
        })
}

/// Whether any model may be answered by the simulator: every model when no real
/// provider is configured, else those the config file routes to a simulator provider.
pub fn simulator_needed(settings: &Settings, config: Option<&ConfigFile>) -> bool {
    !real_provider_configured(settings, config)
        || config.is_some_and(|config| {
            config
                .providers
                .values()
                .any(|provider| provider.kind == ProviderKind::Simulator)
        })
}

/// Routes each model, first match wins: an exact name from the config file, then the
/// longest prefix pattern from the config file, then `gpt-*`/`o*` to the
/// OpenAI-compatible provider and `claude-*` to Anthropic when the environment
/// configures them. Everything else goes to the simulator (at `simulator_url`, which
/// `kind = "simulator"` providers of the file reach as well; started only when
/// [`simulator_needed`]) while no real provider is configured, and is served by
/// nobody once one is.
pub fn provider_registry(
    settings: &Settings,
    config: Option<&ConfigFile>,
    simulator_url: Option<&str>,
) -> ProviderRegistry {
    let timeouts = settings.providers.timeouts;
    let openai = |name: &str, base_url: &str, key: Option<String>| -> Arc<dyn Provider> {
        Arc::new(OpenAiClient::new(name, base_url, key).with_timeouts(timeouts))
    };
    let anthropic = |name: &str, base_url: &str, key: Option<String>| -> Arc<dyn Provider> {
        Arc::new(AnthropicClient::new(name, base_url, key).with_timeouts(timeouts))
    };
    let simulator = |name: &str, base_url: &str| -> Arc<dyn Provider> {
        Arc::new(
            OpenAiClient::new(name, base_url, None)
                .with_timeouts(timeouts)
                .simulator(),
        )
    };
    let fallback = if real_provider_configured(settings, config) {
        tracing::info!(
            "a real provider is configured: models no route names are refused, not simulated"
        );
        None
    } else {
        // Loud: a production process that lost its provider settings would otherwise
        // answer every job with simulated text, and charge for it.
        tracing::warn!(
            "no provider is configured: the built-in simulator answers every model (set OPENAI_API_KEY or ANTHROPIC_API_KEY, or a config file, for real answers)"
        );
        simulator_url.map(|url| simulator("simulator", url))
    };
    let mut registry = ProviderRegistry::new(fallback);
    if let Some(ProviderEndpoint { base_url, api_key }) = &settings.providers.openai {
        registry = registry.route(
            ModelFamily::OpenAi,
            openai("openai", base_url, api_key.clone()),
        );
    }
    if let Some(ProviderEndpoint { base_url, api_key }) = &settings.providers.anthropic {
        registry = registry.route(
            ModelFamily::Anthropic,
            anthropic("anthropic", base_url, api_key.clone()),
        );
    }
    let Some(config) = config else {
        return registry;
    };
    let named: std::collections::BTreeMap<&str, Arc<dyn Provider>> = config
        .providers
        .iter()
        .filter_map(|(name, provider)| {
            let key = provider.api_key().map(str::to_owned);
            // Checked when the file was read: every real provider has its base URL.
            let base_url = provider.base_url.as_deref().unwrap_or_default();
            let client = match provider.kind {
                ProviderKind::OpenAi => openai(name, base_url, key),
                ProviderKind::Anthropic => anthropic(name, base_url, key),
                ProviderKind::Simulator => simulator(name, simulator_url?),
            };
            Some((name.as_str(), client))
        })
        .collect();
    for (pattern, provider) in &config.routes {
        // Validated when the file was read: every route names a defined provider.
        if let Some(client) = named.get(provider.as_str()) {
            tracing::info!(model = %pattern, provider = %provider, "model route from the config file");
            registry = registry.route_pattern(pattern, client.clone());
        }
    }
    for (model, entry) in &config.models {
        if entry.price.is_some() && registry.is_unrouted(model) {
            if registry.serves(model) {
                tracing::warn!(
                    model = %model,
                    "the config file prices this model but routes it to no provider: the built-in simulator serves it"
                );
            } else {
                tracing::warn!(
                    model = %model,
                    "the config file prices this model but routes it to no provider: createJob refuses it"
                );
            }
        }
    }
    registry
}
