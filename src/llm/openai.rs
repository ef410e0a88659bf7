//! A client for OpenAI-compatible chat completions (OpenAI, OpenRouter, vLLM, Ollama,
//! llama.cpp server, and the built-in simulator).

use super::http::{self, Opened};
use super::parts;
use super::tools::StreamedCalls;
use super::{
    ChatRequest, Completion, DeltaSender, Encoding, PromptCounting, Provider, ProviderError,
    RequestShape, Timeouts, TokenUsage, ToolCall,
};
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
    /// The built-in simulator, whose usage follows its own rule, not the model's.
    simulator: bool,
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
            simulator: false,
        }
    }

    /// The same client, known to reach the built-in simulator: its prompts are
    /// counted by the simulator's rule, whatever the model's name.
    pub fn simulator(mut self) -> Self {
        self.simulator = true;
        self
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
            .map(|message| {
                json!({"role": message.role.as_str(), "content": parts::openai_content(message)})
            })
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
        request.tools.add_to_openai(&mut body);
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
        let (text, tool_calls) = match parsed.choices.into_iter().next() {
            Some(choice) => (
                choice.message.content.unwrap_or_default(),
                choice
                    .message
                    .tool_calls
                    .into_iter()
                    .flatten()
                    .map(ToolCall::from)
                    .collect(),
            ),
            None => (String::new(), Vec::new()),
        };
        Ok(Completion {
            text,
            tool_calls,
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
    // Compatible servers send `null` as often as they leave it out.
    tool_calls: Option<Vec<MessageToolCall>>,
}

#[derive(Deserialize)]
struct MessageToolCall {
    id: Option<String>,
    function: FunctionCall,
}

#[derive(Deserialize)]
struct FunctionCall {
    name: String,
    arguments: Option<String>,
}

impl From<MessageToolCall> for ToolCall {
    fn from(call: MessageToolCall) -> Self {
        Self {
            id: call.id,
            name: call.function.name,
            arguments: call.function.arguments.unwrap_or_default(),
        }
    }
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

    fn request_shape(&self) -> RequestShape {
        if self.is_openai() {
            RequestShape::OpenAi
        } else {
            RequestShape::OpenAiCompatible
        }
    }

    fn prompt_counting(&self, model: &str) -> PromptCounting {
        if self.simulator {
            return PromptCounting::QuarterBytes;
        }
        match Encoding::of_model(model) {
            // Only OpenAI's own API is known to count as OpenAI does.
            Some(encoding) if self.is_openai() => PromptCounting::Tokenizer(encoding),
            Some(encoding) => PromptCounting::TokenizerOrQuarterBytes(encoding),
            // A compatible server of its own models: how it counts images is unknown.
            None => PromptCounting::Bytes(None),
        }
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
        Self::completion_of(&self.name, &answer.body, header_request_id)
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
        let mut tool_calls = StreamedCalls::default();
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
                // A call comes in pieces: its id and name first, then its arguments.
                for piece in choice.delta.tool_calls.into_iter().flatten() {
                    let call = tool_calls.at(piece.index);
                    if let Some(id) = piece.id {
                        call.id = Some(id);
                    }
                    if let Some(function) = piece.function {
                        if let Some(name) = function.name {
                            call.name.push_str(&name);
                        }
                        if let Some(arguments) = function.arguments {
                            call.arguments.push_str(&arguments);
                        }
                    }
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
            tool_calls: tool_calls.finish(),
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
        if self.is_openai() {
            "max_completion_tokens"
        } else {
            "max_tokens"
        }
    }

    /// Whether this client talks to OpenAI's own API.
    fn is_openai(&self) -> bool {
        self.base_url.contains("api.openai.com")
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
    tool_calls: Option<Vec<ToolCallPiece>>,
}

#[derive(Deserialize)]
struct ToolCallPiece {
    #[serde(default)]
    index: u64,
    id: Option<String>,
    function: Option<FunctionPiece>,
}

#[derive(Deserialize)]
struct FunctionPiece {
    name: Option<String>,
    arguments: Option<String>,
}
