//! Talking to model providers: one trait, real HTTP clients, the routing of model
//! names to providers, and the simulator used when no provider is configured.

pub mod anthropic;
pub mod batches;
mod counting;
mod http;
pub mod openai;
mod parameters;
pub mod parts;
mod request_shape;
pub mod routing;
pub mod simulator;
mod tools;
mod vocabulary;

use serde_json::Value;
use std::time::Duration;

pub use counting::{Encoding, PromptCounting};
pub use parameters::Parameters;
pub use request_shape::RequestShape;
pub use routing::ProviderRegistry;
pub use tools::{Tool, ToolCall, ToolChoice, Tools};
pub use vocabulary::{Message, Role, TokenUsage};

/// One chat completion to run.
#[derive(Clone, Debug)]
pub struct ChatRequest {
    pub model: String,
    pub messages: Vec<Message>,
    pub max_output_tokens: u32,
    /// A JSON Schema the reply must satisfy, for providers that can enforce it.
    pub response_schema: Option<Value>,
    pub parameters: Parameters,
    /// The functions the model may call, and whether it must.
    pub tools: Tools,
}

/// A provider's successful answer.
#[derive(Clone, Debug, PartialEq)]
pub struct Completion {
    pub text: String,
    /// The reply's tool calls, in order; empty when it calls none.
    pub tool_calls: Vec<ToolCall>,
    pub usage: TokenUsage,
    pub request_id: Option<String>,
}

/// Why a call produced no completion, classified by what it means for billing and
/// retrying: whether the provider may have done (and billed) the work.
#[derive(Debug, thiserror::Error)]
pub enum ProviderError {
    /// The request never reached the provider (connection refused, DNS, TLS): nothing
    /// was billed and retrying is safe.
    #[error("request not sent: {message}")]
    NotSent { message: String },
    /// The provider answered with an error worth retrying (429, 408, 409, 5xx).
    #[error("provider answered {status}: {message}")]
    Transient {
        status: u16,
        message: String,
        retry_after: Option<Duration>,
        request_id: Option<String>,
    },
    /// The provider refused the request (400, 401, 403, 404, 422): retrying the same
    /// request cannot succeed.
    #[error("provider refused the request with {status}: {message}")]
    Permanent {
        status: u16,
        message: String,
        request_id: Option<String>,
    },
    /// The request was sent and no usable answer came back (timeout, connection lost,
    /// unreadable body): the provider may have billed it.
    #[error("outcome unknown: {message}")]
    OutcomeUnknown { message: String },
}

impl ProviderError {
    /// The provider's id for the failed request, when it sent one.
    pub fn request_id(&self) -> Option<&str> {
        match self {
            Self::Transient { request_id, .. } | Self::Permanent { request_id, .. } => {
                request_id.as_deref()
            }
            Self::NotSent { .. } | Self::OutcomeUnknown { .. } => None,
        }
    }
}

/// A model provider reached over HTTP.
#[async_trait::async_trait]
pub trait Provider: Send + Sync + std::fmt::Debug {
    /// The provider's name as recorded on attempts (`openai`, `anthropic`, `simulator`).
    fn name(&self) -> &str;

    /// The provider's batch API, through which jobledger sends PROVIDER_BATCH items;
    /// `None` for a provider without one (createBatch then refuses PROVIDER_BATCH).
    fn batch_api(&self) -> Option<&dyn batches::BatchApi> {
        None
    }

    /// Whether jobledger sends this provider's PROVIDER_BATCH items through its batch
    /// API.
    fn submits_batches(&self) -> bool {
        self.batch_api().is_some()
    }

    /// The API this provider's calls are sent to, which decides the `providerOptions`
    /// a job of its models may carry, and the range of their values.
    fn request_shape(&self) -> RequestShape;

    /// How this provider counts the prompt tokens of a call to `model`, which a job's
    /// hold bounds its input by. Without a public tokenizer: one token per byte.
    fn prompt_counting(&self, _model: &str) -> PromptCounting {
        PromptCounting::Bytes(None)
    }

    /// Runs one completion. Dropping the future aborts the call.
    async fn complete(&self, request: &ChatRequest) -> Result<Completion, ProviderError>;

    /// Runs one completion streaming: each piece of the reply's text is sent to
    /// `deltas` as it arrives, and the result is what `complete` would return. A
    /// provider that cannot stream sends the whole reply as one piece.
    async fn stream(
        &self,
        request: &ChatRequest,
        deltas: &DeltaSender,
    ) -> Result<Completion, ProviderError> {
        let completion = self.complete(request).await?;
        // A closed receiver only means nobody watches the live output.
        let _ = deltas.send(completion.text.clone());
        Ok(completion)
    }
}

/// How long the phases of one provider call may take; the whole call is bounded by
/// the worker's attempt timeout.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Timeouts {
    /// Establishing the connection; past it the request counts as never sent.
    pub connect: Duration,
    /// From sending the request to the answer's head; past it the outcome is unknown.
    /// `None` leaves it to the attempt timeout.
    pub first_byte: Option<Duration>,
}

impl Default for Timeouts {
    fn default() -> Self {
        Self {
            connect: Duration::from_secs(10),
            first_byte: None,
        }
    }
}

/// Where a streaming call sends the reply's text as it arrives.
pub type DeltaSender = tokio::sync::mpsc::UnboundedSender<String>;
