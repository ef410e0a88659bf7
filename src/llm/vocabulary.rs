//! The words every provider speaks: chat messages, their roles, and the tokens a call
//! used. Jobs store messages in these types and billing prices the usage, so both
//! depend on this module and it depends on neither.

use super::parts::Part;
use serde::{Deserialize, Serialize};

/// Who speaks a message.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Role {
    System,
    Developer,
    User,
    Assistant,
}

impl Role {
    /// Every role, in the order provider documentation lists them.
    pub const ALL: [Self; 4] = [Self::System, Self::Developer, Self::User, Self::Assistant];

    /// The role named `name` in provider APIs, if there is one.
    pub fn from_name(name: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|role| role.as_str() == name)
    }

    /// The role's name in provider APIs.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::System => "system",
            Self::Developer => "developer",
            Self::User => "user",
            Self::Assistant => "assistant",
        }
    }
}

/// One chat message: its text, and the parts that follow it (images, documents,
/// more text).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Message {
    pub role: Role,
    pub content: String,
    /// Absent from what is stored when there are none, so that messages stored
    /// before parts existed keep their fingerprints.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub parts: Vec<Part>,
}

impl Message {
    /// A message of text only.
    pub fn text(role: Role, content: impl Into<String>) -> Self {
        Self {
            role,
            content: content.into(),
            parts: Vec::new(),
        }
    }

    /// Its text: the content, then each text part.
    pub fn texts(&self) -> impl Iterator<Item = &str> {
        std::iter::once(self.content.as_str())
            .filter(|content| !content.is_empty())
            .chain(self.parts.iter().filter_map(Part::text))
    }
}

/// Tokens a provider reported for one call.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct TokenUsage {
    /// All input tokens, cached ones included.
    pub input_tokens: u64,
    pub cached_input_tokens: u64,
    pub output_tokens: u64,
}
