//! A client for OpenAI-compatible chat completions (OpenAI, OpenRouter, vLLM, Ollama,
//! llama.cpp server, and the built-in simulator).

use super::http::{self, Opened};
use super::{ChatRequest, Completion, DeltaSender, Provider, ProviderError, Timeouts, TokenUsage};
use serde::Deserialize;
use serde_json::{Value, json};

/// Request id headers, OpenAI's own name first; compatible servers vary.
const REQUEST_ID_HEADERS: &[&str] = &["x-request-id", "request-id"];

/// An OpenAI-compatible provider at `base_url` (which ends before `/chat/completions`,
/// e.g. `https://api.openai.com/v1`).
#[derive(Clone)]
pub struct OpenAiClient {
    pub(super) name: String,
    pub(super) base_url: String,
    pub(super) api_key: Option<String>,
    pub(super) http: http::Transport,
}

impl std::fmt::Debug for OpenAiClient {
    // Providers end up in logged structures (the registry, the worker): the key must
    // not.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("OpenAiClient")
            .field("name", &self.name)
            .field("base_url", &self.base_url)
            .field("api_key", &self.api_key.as_ref().map(|_| "<redacted>"))
            .finish_non_exhaustive()
    }
}

impl OpenAiClient {
    /// A client recorded on attempts as `name`.
    pub fn new(name: &str, base_url: &str, api_key: Option<String>) -> Self {
        Self {
            name: name.to_owned(),
            base_url: base_url.trim_end_matches('/').to_owned(),
            api_key,
            http: http::Transport::new(Timeouts::default()),
        }
    }

    /// The same client with other connect and first-byte timeouts.
    pub fn with_timeouts(mut self, timeouts: Timeouts) -> Self {
        self.http = http::Transport::new(timeouts);
        self
    }

    pub(super) fn body(&self, request: &ChatRequest) -> Value {
        let messages: Vec<Value> = request
            .messages
            .iter()
            .map(|message| json!({"role": message.role.as_str(), "content": message.content}))
            .collect();
        let mut body = json!({
            "model": request.model,
            "messages": messages,
            self.token_limit_field(): request.max_output_tokens,
        });
        if let Some(schema) = &request.response_schema {
            body["response_format"] = json!({
                "type": "json_schema",
                "json_schema": {"name": "response", "schema": schema},
            });
        }
        request.parameters.add_to_openai(&mut body);
        body
    }
}

impl OpenAiClient {
    /// The completion a chat completion `body` holds: a provider batch's result line
    /// carries one for each request that succeeded.
    pub(super) fn completion_of(
        provider: &str,
        body: &[u8],
        request_id: Option<String>,
    ) -> Result<Completion, ProviderError> {
        let parsed: ChatResponse = serde_json::from_slice(body).map_err(|error| {
            http::unusable_answer(
                provider,
                "the answer is not a chat completion",
                &error,
                request_id.as_deref(),
            )
        })?;
        let usage = parsed.usage.ok_or_else(|| ProviderError::OutcomeUnknown {
            message: "the answer carries no usage".to_owned(),
        })?;
        let text = parsed
            .choices
            .into_iter()
            .next()
            .and_then(|choice| choice.message.content)
            .unwrap_or_default();
        Ok(Completion {
            text,
            usage: usage.token_usage(),
            request_id: request_id.or(parsed.id),
        })
    }
}

#[derive(Deserialize)]
struct ChatResponse {
    id: Option<String>,
    choices: Vec<Choice>,
    usage: Option<Usage>,
}

#[derive(Deserialize)]
struct Choice {
    message: ChoiceMessage,
}

#[derive(Deserialize)]
struct ChoiceMessage {
    content: Option<String>,
}

#[derive(Deserialize)]
struct Usage {
    prompt_tokens: u64,
    completion_tokens: u64,
    prompt_tokens_details: Option<PromptTokensDetails>,
}

impl Usage {
    /// OpenAI's `prompt_tokens` already include the cached ones; reasoning tokens are
    /// part of `completion_tokens` and priced as output.
    fn token_usage(&self) -> TokenUsage {
        TokenUsage {
            input_tokens: self.prompt_tokens,
            cached_input_tokens: self
                .prompt_tokens_details
                .as_ref()
                .and_then(|details| details.cached_tokens)
                .unwrap_or(0),
            output_tokens: self.completion_tokens,
        }
    }
}

#[derive(Deserialize)]
struct PromptTokensDetails {
    cached_tokens: Option<u64>,
}

#[async_trait::async_trait]
impl Provider for OpenAiClient {
    fn name(&self) -> &str {
        &self.name
    }

    fn batch_api(&self) -> Option<&dyn super::batches::BatchApi> {
        Some(self)
    }

    async fn complete(&self, request: &ChatRequest) -> Result<Completion, ProviderError> {
        let answer = self.http.send(self.call(self.body(request))).await?;
        let header_request_id = answer.request_id(REQUEST_ID_HEADERS);
        if !answer.status.is_success() {
            return Err(answer.into_error(&self.name, header_request_id));
        }
        let parsed: ChatResponse = serde_json::from_slice(&answer.body).map_err(|error| {
            http::unusable_answer(
                &self.name,
                "the answer is not a chat completion",
                &error,
                header_request_id.as_deref(),
            )
        })?;
        let usage = parsed.usage.ok_or_else(|| ProviderError::OutcomeUnknown {
            message: "the answer carries no usage".to_owned(),
        })?;
        let text = parsed
            .choices
            .into_iter()
            .next()
            .and_then(|choice| choice.message.content)
            .unwrap_or_default();
        Ok(Completion {
            text,
            usage: usage.token_usage(),
            request_id: header_request_id.or(parsed.id),
        })
    }

    async fn stream(
        &self,
        request: &ChatRequest,
        deltas: &DeltaSender,
    ) -> Result<Completion, ProviderError> {
        let mut body = self.body(request);
        body["stream"] = json!(true);
        // Without this the stream carries no usage and the cost would stay unknown.
        body["stream_options"] = json!({"include_usage": true});
        let mut events = match self.http.open_stream(self.call(body)).await? {
            Opened::Events(events) => events,
            Opened::Refused(answer) => {
                let request_id = answer.request_id(REQUEST_ID_HEADERS);
                return Err(answer.into_error(&self.name, request_id));
            }
        };
        let mut request_id = events.request_id(REQUEST_ID_HEADERS);
        let mut text = String::new();
        let mut usage = None;
        while let Some(event) = events.next_event().await? {
            if event.data.trim() == "[DONE]" {
                break;
            }
            let chunk: StreamChunk = serde_json::from_str(&event.data).map_err(|error| {
                http::unusable_answer(
                    &self.name,
                    "a stream chunk is not a chat completion chunk",
                    &error,
                    request_id.as_deref(),
                )
            })?;
            if request_id.is_none() {
                request_id = chunk.id;
            }
            for choice in chunk.choices {
                if let Some(piece) = choice.delta.content.filter(|piece| !piece.is_empty()) {
                    text.push_str(&piece);
                    // A closed receiver only means nobody watches the live output.
                    let _ = deltas.send(piece);
                }
            }
            if let Some(reported) = chunk.usage {
                usage = Some(reported.token_usage());
            }
        }
        let usage = usage.ok_or_else(|| ProviderError::OutcomeUnknown {
            message: "the stream ended without usage".to_owned(),
        })?;
        Ok(Completion {
            text,
            usage,
            request_id,
        })
    }
}

impl OpenAiClient {
    /// OpenAI itself refuses `max_tokens` for its reasoning models and wants
    /// `max_completion_tokens` everywhere; most compatible servers (vLLM, Ollama,
    /// llama.cpp, older routers) know `max_tokens` only.
    fn token_limit_field(&self) -> &'static str {
        if self.base_url.contains("api.openai.com") {
            "max_completion_tokens"
        } else {
            "max_tokens"
        }
    }

    fn call(&self, body: Value) -> reqwest::RequestBuilder {
        let call = self
            .http
            .post(&format!("{}/chat/completions", self.base_url))
            .json(&body);
        match &self.api_key {
            Some(key) => call.bearer_auth(key),
            None => call,
        }
    }
}

#[derive(Deserialize)]
struct StreamChunk {
    id: Option<String>,
    #[serde(default)]
    choices: Vec<StreamChoice>,
    usage: Option<Usage>,
}

#[derive(Deserialize)]
struct StreamChoice {
    delta: StreamDelta,
}

#[derive(Deserialize)]
struct StreamDelta {
    content: Option<String>,
}
