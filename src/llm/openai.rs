//! A client for OpenAI-compatible chat completions (OpenAI, OpenRouter, vLLM, Ollama,
//! llama.cpp server, and the built-in simulator).

use super::{ChatRequest, Completion, Provider, ProviderError, http};
use crate::billing::TokenUsage;
use serde::Deserialize;
use serde_json::{Value, json};

/// Request id headers, OpenAI's own name first; compatible servers vary.
const REQUEST_ID_HEADERS: &[&str] = &["x-request-id", "request-id"];

/// An OpenAI-compatible provider at `base_url` (which ends before `/chat/completions`,
/// e.g. `https://api.openai.com/v1`).
#[derive(Clone)]
pub struct OpenAiClient {
    name: String,
    base_url: String,
    api_key: Option<String>,
    http: reqwest::Client,
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
            http: http::client(),
        }
    }

    fn body(request: &ChatRequest) -> Value {
        let messages: Vec<Value> = request
            .messages
            .iter()
            .map(|message| json!({"role": message.role.as_str(), "content": message.content}))
            .collect();
        let mut body = json!({
            "model": request.model,
            "messages": messages,
            "max_tokens": request.max_output_tokens,
        });
        if let Some(schema) = &request.response_schema {
            body["response_format"] = json!({
                "type": "json_schema",
                "json_schema": {"name": "response", "schema": schema},
            });
        }
        body
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

#[derive(Deserialize)]
struct PromptTokensDetails {
    cached_tokens: Option<u64>,
}

#[async_trait::async_trait]
impl Provider for OpenAiClient {
    fn name(&self) -> &str {
        &self.name
    }

    async fn complete(&self, request: &ChatRequest) -> Result<Completion, ProviderError> {
        let mut call = self
            .http
            .post(format!("{}/chat/completions", self.base_url))
            .json(&Self::body(request));
        if let Some(key) = &self.api_key {
            call = call.bearer_auth(key);
        }
        let answer = http::send(call).await?;
        let header_request_id = answer.request_id(REQUEST_ID_HEADERS);
        if !answer.status.is_success() {
            return Err(answer.into_error(header_request_id));
        }
        let parsed: ChatResponse = serde_json::from_slice(&answer.body).map_err(|error| {
            ProviderError::OutcomeUnknown {
                message: format!("the answer is not a chat completion: {error}"),
            }
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
            usage: TokenUsage {
                input_tokens: usage.prompt_tokens,
                cached_input_tokens: usage
                    .prompt_tokens_details
                    .and_then(|details| details.cached_tokens)
                    .unwrap_or(0),
                output_tokens: usage.completion_tokens,
            },
            request_id: header_request_id.or(parsed.id),
        })
    }
}
