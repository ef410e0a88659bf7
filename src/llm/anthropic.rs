//! A client for Anthropic's Messages API (`POST /v1/messages`), plain and streamed.

use super::http::{self, Opened};
use super::parts::{self, Shape};
use super::tools::StreamedCalls;
use super::{
    ChatRequest, Completion, DeltaSender, PromptCounting, Provider, ProviderError, RequestShape,
    Role, Timeouts, TokenUsage, ToolCall,
};
use serde::Deserialize;
use serde_json::{Value, json};

/// The API version this client's request and answer shapes follow. Anthropic requires
/// the header and keeps old versions stable, so a fixed date is what we want.
pub(super) const API_VERSION: &str = "2023-06-01";

/// Anthropic sends its request id (`req_…`) under this name, errors included.
const REQUEST_ID_HEADERS: &[&str] = &["request-id"];

/// Put after the system prompt when the job wants structured output. Kept short: the
/// job's hold only budgets the schema's own bytes plus a small per-message overhead.
const JSON_INSTRUCTION: &str = "Reply with JSON only, valid against this JSON Schema: ";

/// Anthropic's Messages API, or a server speaking it, at `base_url`.
#[derive(Clone)]
pub struct AnthropicClient {
    pub(super) name: String,
    pub(super) messages_url: String,
    pub(super) api_key: Option<String>,
    pub(super) http: http::Transport,
}

impl AnthropicClient {
    /// A client recorded on attempts as `name`. `base_url` is the API root, e.g.
    /// `https://api.anthropic.com`; a trailing `/` or `/v1` is tolerated, since
    /// operators copy either form from docs and proxies. Without `api_key` no
    /// `x-api-key` header is sent (for a gateway that adds its own).
    pub fn new(name: &str, base_url: &str, api_key: Option<String>) -> Self {
        let base = base_url.trim_end_matches('/');
        let base = base.strip_suffix("/v1").unwrap_or(base);
        Self {
            name: name.to_owned(),
            messages_url: format!("{base}/v1/messages"),
            api_key,
            http: http::Transport::new(Timeouts::default()),
        }
    }

    /// The same client with other connect and first-byte timeouts.
    pub fn with_timeouts(mut self, timeouts: Timeouts) -> Self {
        self.http = http::Transport::new(timeouts);
        self
    }

    pub(super) fn body(request: &ChatRequest) -> Value {
        // Anthropic takes only user and assistant turns; instructions go in the
        // top-level `system`, so system and developer messages are lifted there, in
        // order, wherever they stood in the conversation.
        // Instructions are text: their text parts join them (images and documents
        // are only taken in user messages).
        let mut system: Vec<&str> = Vec::new();
        let mut messages: Vec<Value> = Vec::new();
        for message in &request.messages {
            match message.role {
                Role::System | Role::Developer => system.extend(message.texts()),
                Role::User | Role::Assistant => messages.push(json!({
                    "role": message.role.as_str(),
                    "content": parts::anthropic_content(message),
                })),
            }
        }
        // The Messages API has no `response_format`. A forced tool call would make
        // Anthropic enforce the schema, but it turns the answer into a `tool_use` block
        // and not every model or compatible server supports it the same way; so we ask
        // in the system prompt, which works everywhere, and leave checking the reply to
        // the worker (a reply that is not JSON is invalid output, retried on its own
        // budget).
        let instruction = request
            .response_schema
            .as_ref()
            .map(|schema| format!("{JSON_INSTRUCTION}{schema}"));
        system.extend(instruction.as_deref());

        let mut body = json!({
            "model": request.model,
            "max_tokens": request.max_output_tokens,
            "messages": messages,
        });
        if !system.is_empty() {
            body["system"] = json!(system.join("\n\n"));
        }
        request.parameters.add_to_anthropic(&mut body);
        request.tools.add_to_anthropic(&mut body);
        body
    }
}

impl std::fmt::Debug for AnthropicClient {
    // Providers end up in logged structures (the registry, the worker): the key must
    // not.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AnthropicClient")
            .field("name", &self.name)
            .field("messages_url", &self.messages_url)
            .field("api_key", &self.api_key.as_ref().map(|_| "<redacted>"))
            .finish_non_exhaustive()
    }
}

impl AnthropicClient {
    /// The completion a message `body` holds: a message batch's result carries one
    /// for each request that succeeded.
    pub(super) fn completion_of(
        provider: &str,
        body: &[u8],
        request_id: Option<String>,
    ) -> Result<Completion, ProviderError> {
        let parsed: MessagesResponse = serde_json::from_slice(body).map_err(|error| {
            http::unusable_answer(
                provider,
                "the answer is not a message",
                &error,
                request_id.as_deref(),
            )
        })?;
        let usage = parsed.usage.ok_or_else(|| ProviderError::OutcomeUnknown {
            message: "the answer carries no usage".to_owned(),
        })?;
        // Thinking and tool-use blocks are not part of the reply text.
        let mut text = String::new();
        let mut tool_calls = Vec::new();
        for block in parsed.content {
            match block.kind.as_str() {
                "text" => text.extend(block.text),
                "tool_use" => tool_calls.push(ToolCall {
                    id: block.id,
                    name: block.name.unwrap_or_default(),
                    arguments: block.input.unwrap_or_else(|| json!({})).to_string(),
                }),
                _ => {}
            }
        }
        Ok(Completion {
            text,
            tool_calls,
            usage: usage.token_usage(),
            request_id: request_id.or(parsed.id),
        })
    }
}

#[derive(Deserialize)]
struct MessagesResponse {
    id: Option<String>,
    content: Vec<ContentBlock>,
    usage: Option<Usage>,
}

#[derive(Deserialize)]
struct ContentBlock {
    #[serde(rename = "type")]
    kind: String,
    text: Option<String>,
    /// A `tool_use` block's call id, tool and arguments.
    id: Option<String>,
    name: Option<String>,
    input: Option<Value>,
}

#[derive(Deserialize)]
struct Usage {
    /// Only the input tokens that were neither read from nor written to the cache.
    input_tokens: u64,
    output_tokens: u64,
    cache_read_input_tokens: Option<u64>,
    cache_creation_input_tokens: Option<u64>,
}

impl Usage {
    /// Our usage counts every input token once, cached ones included, and prices the
    /// cached part at the cached rate. Anthropic's `input_tokens` excludes both cache
    /// reads and cache writes, so all three are added up.
    ///
    /// Cache writes cost Anthropic's customers more than plain input (1.25× for the
    /// 5-minute cache); having no such rate, we price them as plain input.
    fn token_usage(&self) -> TokenUsage {
        let cache_read = self.cache_read_input_tokens.unwrap_or(0);
        let cache_creation = self.cache_creation_input_tokens.unwrap_or(0);
        TokenUsage {
            input_tokens: self
                .input_tokens
                .saturating_add(cache_read)
                .saturating_add(cache_creation),
            cached_input_tokens: cache_read,
            output_tokens: self.output_tokens,
        }
    }
}

/// The top-level `request_id` Anthropic also puts in error bodies, for answers whose
/// header got lost on the way (a proxy, say).
fn error_body_request_id(body: &[u8]) -> Option<String> {
    serde_json::from_slice::<Value>(body)
        .ok()?
        .get("request_id")?
        .as_str()
        .map(str::to_owned)
}

#[async_trait::async_trait]
impl Provider for AnthropicClient {
    fn name(&self) -> &str {
        &self.name
    }

    fn request_shape(&self) -> RequestShape {
        RequestShape::Anthropic
    }

    /// Anthropic publishes no tokenizer for its current models.
    fn prompt_counting(&self, _model: &str) -> PromptCounting {
        PromptCounting::Bytes(Some(Shape::Anthropic))
    }

    fn batch_api(&self) -> Option<&dyn super::batches::BatchApi> {
        Some(self)
    }

    async fn complete(&self, request: &ChatRequest) -> Result<Completion, ProviderError> {
        let answer = self.http.send(self.call(Self::body(request))).await?;
        let header_request_id = answer.request_id(REQUEST_ID_HEADERS);
        if !answer.status.is_success() {
            let request_id = header_request_id.or_else(|| error_body_request_id(&answer.body));
            return Err(answer.into_error(&self.name, request_id));
        }
        Self::completion_of(&self.name, &answer.body, header_request_id)
    }

    async fn stream(
        &self,
        request: &ChatRequest,
        deltas: &DeltaSender,
    ) -> Result<Completion, ProviderError> {
        let mut body = Self::body(request);
        body["stream"] = json!(true);
        let mut events = match self.http.open_stream(self.call(body)).await? {
            Opened::Events(events) => events,
            Opened::Refused(answer) => {
                let request_id = answer
                    .request_id(REQUEST_ID_HEADERS)
                    .or_else(|| error_body_request_id(&answer.body));
                return Err(answer.into_error(&self.name, request_id));
            }
        };
        let mut request_id = events.request_id(REQUEST_ID_HEADERS);
        let mut text = String::new();
        let mut tool_calls = StreamedCalls::default();
        // Input usage comes with `message_start`, output usage with `message_delta`.
        let mut usage: Option<Usage> = None;
        let mut stopped = false;
        while let Some(event) = events.next_event().await? {
            let data: Value = serde_json::from_str(&event.data).unwrap_or(Value::Null);
            match event.event.as_deref().or(data["type"].as_str()) {
                Some("message_start") => {
                    let message = &data["message"];
                    if request_id.is_none() {
                        request_id = message["id"].as_str().map(str::to_owned);
                    }
                    usage = serde_json::from_value(message["usage"].clone()).ok();
                }
                Some("content_block_start") => {
                    let block = &data["content_block"];
                    if block["type"] == "tool_use" {
                        let call = tool_calls.at(data["index"].as_u64().unwrap_or(0));
                        call.id = block["id"].as_str().map(str::to_owned);
                        call.name = block["name"].as_str().unwrap_or_default().to_owned();
                    }
                }
                Some("content_block_delta") => {
                    let delta = &data["delta"];
                    if delta["type"] == "input_json_delta" {
                        // The arguments, in pieces of JSON text that add up to the
                        // block's `input`.
                        let call = tool_calls.at(data["index"].as_u64().unwrap_or(0));
                        call.arguments
                            .push_str(delta["partial_json"].as_str().unwrap_or_default());
                    } else if let Some(piece) = delta["text"].as_str().filter(|p| !p.is_empty()) {
                        text.push_str(piece);
                        // A closed receiver only means nobody watches the live output.
                        let _ = deltas.send(piece.to_owned());
                    }
                }
                Some("message_delta") => {
                    if let (Some(usage), Some(output)) =
                        (usage.as_mut(), data["usage"]["output_tokens"].as_u64())
                    {
                        usage.output_tokens = output;
                    }
                }
                Some("message_stop") => {
                    stopped = true;
                    break;
                }
                Some("error") => {
                    // The provider was generating when it gave up: it may bill that.
                    return Err(http::unusable_answer(
                        &self.name,
                        "the provider ended the stream with an error",
                        &data["error"],
                        request_id.as_deref(),
                    ));
                }
                _ => {}
            }
        }
        match (usage, stopped) {
            (Some(usage), true) => Ok(Completion {
                text,
                tool_calls: tool_calls
                    .finish()
                    .into_iter()
                    // A call with no argument pieces has the empty input `{}`.
                    .map(|mut call| {
                        if call.arguments.is_empty() {
                            call.arguments = "{}".to_owned();
                        }
                        call
                    })
                    .collect(),
                usage: usage.token_usage(),
                request_id,
            }),
            _ => Err(ProviderError::OutcomeUnknown {
                message: "the stream ended before message_stop or without usage".to_owned(),
            }),
        }
    }
}

impl AnthropicClient {
    fn call(&self, body: Value) -> reqwest::RequestBuilder {
        let call = self
            .http
            .post(&self.messages_url)
            .header("anthropic-version", API_VERSION)
            .json(&body);
        match &self.api_key {
            Some(key) => call.header("x-api-key", key),
            None => call,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::llm::Message;

    fn message(role: Role, content: &str) -> Message {
        Message::text(role, content)
    }

    fn request(messages: Vec<Message>, response_schema: Option<Value>) -> ChatRequest {
        ChatRequest {
            model: "claude-sonnet-4-5".to_owned(),
            messages,
            max_output_tokens: 100,
            response_schema,
            parameters: Default::default(),
            tools: Default::default(),
        }
    }

    #[test]
    fn base_urls_with_and_without_v1() {
        for base in [
            "https://api.anthropic.com",
            "https://api.anthropic.com/",
            "https://api.anthropic.com/v1",
            "https://api.anthropic.com/v1/",
        ] {
            assert_eq!(
                AnthropicClient::new("anthropic", base, None).messages_url,
                "https://api.anthropic.com/v1/messages",
                "{base}"
            );
        }
    }

    #[test]
    fn system_and_developer_messages_become_the_system_prompt() {
        let body = AnthropicClient::body(&request(
            vec![
                message(Role::System, "Be brief."),
                message(Role::User, "Hi"),
                message(Role::Assistant, "Hello"),
                message(Role::Developer, "Answer in French."),
                message(Role::User, "Bye"),
            ],
            None,
        ));
        assert_eq!(
            body,
            json!({
                "model": "claude-sonnet-4-5",
                "max_tokens": 100,
                "system": "Be brief.\n\nAnswer in French.",
                "messages": [
                    {"role": "user", "content": "Hi"},
                    {"role": "assistant", "content": "Hello"},
                    {"role": "user", "content": "Bye"},
                ],
            })
        );
    }

    #[test]
    fn no_system_prompt_without_instructions() {
        let body = AnthropicClient::body(&request(vec![message(Role::User, "Hi")], None));
        assert!(body.get("system").is_none());
    }

    #[test]
    fn a_response_schema_is_asked_for_in_the_system_prompt() {
        let schema = json!({"type": "object", "properties": {"title": {"type": "string"}}});
        let body = AnthropicClient::body(&request(
            vec![
                message(Role::System, "Be brief."),
                message(Role::User, "Hi"),
            ],
            Some(schema.clone()),
        ));
        assert_eq!(
            body["system"],
            json!(format!("Be brief.\n\n{JSON_INSTRUCTION}{schema}"))
        );
        assert!(body.get("response_format").is_none());
    }

    #[test]
    fn cached_tokens_count_as_input_once() {
        let usage = Usage {
            input_tokens: 10,
            output_tokens: 7,
            cache_read_input_tokens: Some(1000),
            cache_creation_input_tokens: Some(200),
        };
        assert_eq!(
            usage.token_usage(),
            TokenUsage {
                input_tokens: 1210,
                cached_input_tokens: 1000,
                output_tokens: 7,
            }
        );
    }

    #[test]
    fn debug_hides_the_key() {
        let client = AnthropicClient::new("anthropic", "http://x", Some("sk-ant-secret".into()));
        assert!(!format!("{client:?}").contains("sk-ant-secret"));
    }
}
