//! Which provider serves which model.
//!
//! A model name is routed, first match wins: an exact name from the config file, then
//! the longest matching prefix pattern (`"gpt-4o*"`) from the config file, then its
//! family's provider from the environment (`OPENAI_*`, `ANTHROPIC_*`) — the family an
//! imported price names, else the one the name tells — then the
//! fallback: the built-in simulator, but only while no real provider is configured.
//! Once one is, a model no route claims is served by nobody and refused at createJob —
//! never simulated and charged at real prices.

use super::Provider;
use std::collections::HashMap;
use std::sync::{Arc, RwLock};

/// A model name (`llama3-local`) or a prefix pattern (`gpt-*`, or `*` for every model).
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum ModelPattern {
    Exact(String),
    /// The text before the trailing `*`.
    Prefix(String),
}

/// Why a text is not a model pattern.
#[derive(Debug, PartialEq, Eq, thiserror::Error)]
pub enum PatternError {
    #[error("a model name cannot be empty")]
    Empty,
    #[error("`*` may only end a pattern (as in \"gpt-*\")")]
    InnerWildcard,
}

impl ModelPattern {
    /// `name` as an exact model name, or as a prefix pattern when it ends with `*`.
    pub fn parse(text: &str) -> Result<Self, PatternError> {
        if text.trim().is_empty() {
            return Err(PatternError::Empty);
        }
        match text.strip_suffix('*') {
            Some(prefix) if prefix.contains('*') => Err(PatternError::InnerWildcard),
            Some(prefix) => Ok(Self::Prefix(prefix.to_owned())),
            None if text.contains('*') => Err(PatternError::InnerWildcard),
            None => Ok(Self::Exact(text.to_owned())),
        }
    }

    /// Whether `model` matches.
    pub fn matches(&self, model: &str) -> bool {
        match self {
            Self::Exact(name) => name == model,
            Self::Prefix(prefix) => model.starts_with(prefix.as_str()),
        }
    }
}

impl std::fmt::Display for ModelPattern {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Exact(name) => f.write_str(name),
            Self::Prefix(prefix) => write!(f, "{prefix}*"),
        }
    }
}

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
/// fallback, if there is one (the simulator when no provider is configured at all).
#[derive(Clone, Debug)]
pub struct ProviderRegistry {
    exact: HashMap<String, Arc<dyn Provider>>,
    /// Longest prefix first, so the most specific pattern wins.
    prefixes: Vec<(String, Arc<dyn Provider>)>,
    families: Vec<(ModelFamily, Arc<dyn Provider>)>,
    /// The family of each imported model whose name does not tell it, shared by every
    /// clone and replaced as the price table is read again.
    imported: Arc<RwLock<HashMap<String, ModelFamily>>>,
    fallback: Option<Arc<dyn Provider>>,
}

impl ProviderRegistry {
    /// A registry sending every model no route claims to `fallback`, or refusing it
    /// when there is none.
    pub fn new(fallback: Option<Arc<dyn Provider>>) -> Self {
        Self {
            exact: HashMap::new(),
            prefixes: Vec::new(),
            families: Vec::new(),
            imported: Arc::default(),
            fallback,
        }
    }

    /// Replaces the families imported models are served by (every clone sees them).
    pub fn set_imported_families(&self, families: HashMap<String, ModelFamily>) {
        // A poisoned lock only means a panic while replacing the map: the map is whole.
        *self
            .imported
            .write()
            .unwrap_or_else(std::sync::PoisonError::into_inner) = families;
    }

    /// Sends the models `pattern` matches to `provider`, ahead of every family route.
    /// An exact name beats any prefix; among prefixes the longest wins; routing one
    /// pattern twice keeps the last.
    pub fn route_pattern(mut self, pattern: &ModelPattern, provider: Arc<dyn Provider>) -> Self {
        match pattern {
            ModelPattern::Exact(name) => {
                self.exact.insert(name.clone(), provider);
            }
            ModelPattern::Prefix(prefix) => {
                self.prefixes.retain(|(existing, _)| existing != prefix);
                self.prefixes.push((prefix.clone(), provider));
                self.prefixes
                    .sort_by(|(a, _), (b, _)| b.len().cmp(&a.len()).then_with(|| a.cmp(b)));
            }
        }
        self
    }

    /// Sends every model of `family` to `provider`.
    pub fn route(mut self, family: ModelFamily, provider: Arc<dyn Provider>) -> Self {
        self.families.push((family, provider));
        self
    }

    /// Whether some provider serves `model`.
    pub fn serves(&self, model: &str) -> bool {
        self.provider_for(model).is_some()
    }

    /// Whether the fallback simulator, not a configured route, serves `model`.
    pub fn simulates(&self, model: &str) -> bool {
        self.fallback.is_some() && self.route_for(model).is_none()
    }

    /// Whether no route claims `model`: the fallback serves it, if there is one.
    pub fn is_unrouted(&self, model: &str) -> bool {
        self.route_for(model).is_none()
    }

    /// The provider that serves `model`; `None` when no route claims it and there is
    /// no fallback.
    pub fn provider_for(&self, model: &str) -> Option<Arc<dyn Provider>> {
        self.route_for(model).or_else(|| self.fallback.clone())
    }

    fn route_for(&self, model: &str) -> Option<Arc<dyn Provider>> {
        if let Some(provider) = self.exact.get(model) {
            return Some(provider.clone());
        }
        if let Some((_, provider)) = self
            .prefixes
            .iter()
            .find(|(prefix, _)| model.starts_with(prefix.as_str()))
        {
            return Some(provider.clone());
        }
        let imported = self
            .imported
            .read()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .get(model)
            .copied();
        let family = imported.or_else(|| ModelFamily::of(model));
        self.families
            .iter()
            .find(|(candidate, _)| Some(*candidate) == family)
            .map(|(_, provider)| provider.clone())
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

    #[test]
    fn patterns_are_names_or_trailing_wildcards() {
        assert_eq!(
            ModelPattern::parse("llama3-local"),
            Ok(ModelPattern::Exact("llama3-local".to_owned()))
        );
        assert_eq!(
            ModelPattern::parse("gpt-*"),
            Ok(ModelPattern::Prefix("gpt-".to_owned()))
        );
        assert_eq!(
            ModelPattern::parse("*"),
            Ok(ModelPattern::Prefix(String::new()))
        );
        assert_eq!(ModelPattern::parse(" "), Err(PatternError::Empty));
        assert_eq!(
            ModelPattern::parse("g*t-4"),
            Err(PatternError::InnerWildcard)
        );
        assert_eq!(ModelPattern::parse("**"), Err(PatternError::InnerWildcard));
        assert!(ModelPattern::parse("gpt-*").unwrap().matches("gpt-4o"));
        assert!(!ModelPattern::parse("gpt-*").unwrap().matches("claude-x"));
    }

    #[derive(Debug)]
    struct Named(&'static str);

    #[async_trait::async_trait]
    impl Provider for Named {
        fn name(&self) -> &str {
            self.0
        }

        fn request_shape(&self) -> crate::llm::RequestShape {
            crate::llm::RequestShape::OpenAiCompatible
        }

        async fn complete(
            &self,
            _: &crate::llm::ChatRequest,
        ) -> Result<crate::llm::Completion, crate::llm::ProviderError> {
            unreachable!("routing tests never call a provider")
        }
    }

    #[test]
    fn exact_beats_longest_prefix_beats_family_beats_fallback() {
        let pattern = |text| ModelPattern::parse(text).unwrap();
        let registry = ProviderRegistry::new(Some(Arc::new(Named("simulator"))))
            .route(ModelFamily::OpenAi, Arc::new(Named("openai-env")))
            .route(ModelFamily::Anthropic, Arc::new(Named("anthropic-env")))
            .route_pattern(&pattern("gpt-*"), Arc::new(Named("router")))
            .route_pattern(&pattern("gpt-4o*"), Arc::new(Named("azure")))
            .route_pattern(&pattern("gpt-4o-mini"), Arc::new(Named("local")))
            .route_pattern(&pattern("llama*"), Arc::new(Named("ollama")));
        let name = |model| registry.provider_for(model).unwrap().name().to_owned();
        assert_eq!(name("gpt-4o-mini"), "local");
        assert_eq!(name("gpt-4o"), "azure");
        assert_eq!(name("gpt-4.1"), "router");
        assert_eq!(name("o3-mini"), "openai-env");
        assert_eq!(name("claude-sonnet-4-5"), "anthropic-env");
        assert_eq!(name("llama3-local"), "ollama");
        assert_eq!(name("mistral"), "simulator");
        assert!(registry.is_unrouted("mistral"));
        assert!(!registry.is_unrouted("o3-mini"));
    }

    #[test]
    fn an_imported_family_routes_a_name_of_no_family() {
        let registry = ProviderRegistry::new(None)
            .route(ModelFamily::OpenAi, Arc::new(Named("openai-env")))
            .route(ModelFamily::Anthropic, Arc::new(Named("anthropic-env")));
        let clone = registry.clone();
        assert!(!registry.serves("chatgpt-4o-latest"));
        registry.set_imported_families(HashMap::from([
            ("chatgpt-4o-latest".to_owned(), ModelFamily::OpenAi),
            ("gpt-like-claude".to_owned(), ModelFamily::Anthropic),
        ]));
        let name = |model| clone.provider_for(model).unwrap().name().to_owned();
        assert_eq!(name("chatgpt-4o-latest"), "openai-env");
        // The imported family wins over the name's.
        assert_eq!(name("gpt-like-claude"), "anthropic-env");
        assert_eq!(name("gpt-4o"), "openai-env");
    }

    #[test]
    fn without_a_fallback_an_unrouted_model_is_served_by_nobody() {
        let registry = ProviderRegistry::new(None)
            .route(ModelFamily::OpenAi, Arc::new(Named("openai-env")))
            .route_pattern(
                &ModelPattern::parse("test-*").unwrap(),
                Arc::new(Named("simulator")),
            );
        assert!(registry.serves("gpt-4o"));
        assert!(registry.serves("test-echo"));
        assert!(!registry.serves("claude-sonnet-4-5"));
        assert!(!registry.serves("mistral"));
    }
}
