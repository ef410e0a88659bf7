//! How a provider counts the tokens of a prompt: what a job's hold bounds its input by.
//!
//! A provider says which rule it counts by ([`super::Provider::prompt_counting`]); the
//! jobs module turns the rule into a number (`jobs::tokens`). A bound below what the
//! provider reports would cut the usage it bills; one far above it holds credit a
//! customer never spends.

use super::parts::{Part, Shape};

/// A public tokenizer a model's prompt is counted with.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Encoding {
    /// `o200k_base`: gpt-4o, gpt-4.1, gpt-5 and the o-series.
    O200kBase,
    /// `cl100k_base`: gpt-4, gpt-3.5-turbo and their snapshots.
    Cl100kBase,
}

impl Encoding {
    /// The encoding OpenAI counts `model` with, when it is one tiktoken knows (a
    /// fine-tuned `ft:gpt-4o-…:org::id` counts as its base model).
    pub fn of_model(model: &str) -> Option<Self> {
        use tiktoken_rs::tokenizer::{Tokenizer, get_tokenizer};
        match get_tokenizer(model)? {
            Tokenizer::O200kBase => Some(Self::O200kBase),
            Tokenizer::Cl100kBase => Some(Self::Cl100kBase),
            // Completion-era encodings, and gpt-oss's harmony format: models a chat
            // call does not reach here, or whose chat framing OpenAI does not publish.
            _ => None,
        }
    }
}

/// The rule a provider counts a prompt's text by.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PromptCounting {
    /// The model's public tokenizer plus the per-message framing OpenAI documents:
    /// exactly what OpenAI's own API reports.
    Tokenizer(Encoding),
    /// An OpenAI-compatible endpoint other than OpenAI's own serving a model whose
    /// tokenizer is public. It may be a proxy that reports OpenAI's count, or a
    /// server that counts otherwise — the built-in simulator reports a quarter of the
    /// bytes — so the larger of the two rules.
    TokenizerOrQuarterBytes(Encoding),
    /// The built-in simulator: the UTF-8 bytes of the message contents divided by
    /// four, rounded up, exactly.
    QuarterBytes,
    /// No public tokenizer (Anthropic's models, models of unknown servers): every
    /// token covers at least one UTF-8 byte, so at most one token per byte, plus
    /// room for each message's framing. Images and documents count by the rules of
    /// the provider's shape; `None`, a server whose rules are unknown: the larger of
    /// both providers' counts.
    Bytes(Option<Shape>),
}

impl PromptCounting {
    /// The tokenizer this rule counts with, if any.
    pub fn encoding(self) -> Option<Encoding> {
        match self {
            Self::Tokenizer(encoding) | Self::TokenizerOrQuarterBytes(encoding) => Some(encoding),
            Self::QuarterBytes | Self::Bytes(_) => None,
        }
    }

    /// What the media parts among `parts` count as under this rule, sent to `model`.
    pub fn media_tokens<'a>(
        self,
        model: &str,
        parts: impl IntoIterator<Item = &'a Part> + Clone,
    ) -> u64 {
        match self {
            // The simulator counts OpenAI's way in OpenAI's shape.
            Self::Tokenizer(_) | Self::TokenizerOrQuarterBytes(_) | Self::QuarterBytes => {
                Shape::OpenAi.media_tokens(model, parts)
            }
            Self::Bytes(Some(shape)) => shape.media_tokens(model, parts),
            Self::Bytes(None) => parts
                .into_iter()
                .map(|part| {
                    let one = std::iter::once(part);
                    Shape::OpenAi
                        .media_tokens(model, one.clone())
                        .max(Shape::Anthropic.media_tokens(model, one))
                })
                .sum(),
        }
    }
}
