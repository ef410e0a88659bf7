//! Which provider serves which model.

use super::Provider;
use std::sync::Arc;

/// The families of model names the built-in routing knows.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ModelFamily {
    /// `gpt-*`, `o1`, `o3-mini`, … served by OpenAI-compatible providers.
    OpenAi,
    /// `claude-*`, served by Anthropic.
    Anthropic,
}

impl ModelFamily {
    /// The family a model name belongs to, if any.
    pub fn of(model: &str) -> Option<Self> {
        let is_o_series = model
            .strip_prefix('o')
            .is_some_and(|rest| rest.chars().next().is_some_and(|c| c.is_ascii_digit()));
        if model.starts_with("gpt-") || is_o_series {
            Some(Self::OpenAi)
        } else if model.starts_with("claude-") {
            Some(Self::Anthropic)
        } else {
            None
        }
    }
}

/// Maps model names to providers; models no configured provider claims go to the
/// fallback (the simulator when no provider is configured at all).
#[derive(Clone, Debug)]
pub struct ProviderRegistry {
    families: Vec<(ModelFamily, Arc<dyn Provider>)>,
    fallback: Arc<dyn Provider>,
}

impl ProviderRegistry {
    /// A registry sending every model to `fallback`.
    pub fn new(fallback: Arc<dyn Provider>) -> Self {
        Self {
            families: Vec::new(),
            fallback,
        }
    }

    /// Sends every model of `family` to `provider`.
    pub fn route(mut self, family: ModelFamily, provider: Arc<dyn Provider>) -> Self {
        self.families.push((family, provider));
        self
    }

    /// The provider that serves `model`.
    pub fn provider_for(&self, model: &str) -> Arc<dyn Provider> {
        let family = ModelFamily::of(model);
        self.families
            .iter()
            .find(|(candidate, _)| Some(*candidate) == family)
            .map_or_else(|| self.fallback.clone(), |(_, provider)| provider.clone())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn model_names_fall_into_their_family() {
        assert_eq!(ModelFamily::of("gpt-4o-mini"), Some(ModelFamily::OpenAi));
        assert_eq!(ModelFamily::of("o3-mini"), Some(ModelFamily::OpenAi));
        assert_eq!(
            ModelFamily::of("claude-sonnet-4-5"),
            Some(ModelFamily::Anthropic)
        );
        assert_eq!(ModelFamily::of("ollama-llama3"), None);
        assert_eq!(ModelFamily::of("other"), None);
    }
}
