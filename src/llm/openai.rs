//! A client for OpenAI-compatible chat completions (OpenAI, OpenRouter, vLLM, Ollama,
//! llama.cpp server, and the built-in simulator).

use super::{ChatRequest, Completion, Provider, ProviderError};
use crate::billing::TokenUsage;
use reqwest::header::{HeaderMap, RETRY_AFTER};
use serde::Deserialize;
use serde_json::{Value, json};
use std::time::Duration;

/// How long establishing a connection may take before the call counts as not sent.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);

/// An OpenAI-compatible provider at `base_url` (which ends before `/chat/completions`,
/// e.g. `https://api.openai.com/v1`).
#[derive(Clone, Debug)]
pub struct OpenAiClient {
    name: String,
    base_url: String,
    api_key: Option<String>,
    http: reqwest::Client,
}

impl OpenAiClient {
    /// A client recorded on attempts as `name`.
    pub fn new(name: &str, base_url: &str, api_key: Option<String>) -> Self {
        let http = reqwest::Client::builder()
            .connect_timeout(CONNECT_TIMEOUT)
            .build()
            .expect("the TLS backend initialises");
        Self {
            name: name.to_owned(),
            base_url: base_url.trim_end_matches('/').to_owned(),
            api_key,
            http,
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
        let response = call.send().await.map_err(classify_send_error)?;
        let status = response.status();
        let header_request_id = request_id(response.headers());
        let retry_after = retry_after(response.headers());
        let body = response
            .bytes()
            .await
            .map_err(|error| ProviderError::OutcomeUnknown {
                message: format!("reading the answer failed: {error}"),
            })?;
        if !status.is_success() {
            let message = error_message(&body);
            let code = status.as_u16();
            return Err(if is_transient(code) {
                ProviderError::Transient {
                    status: code,
                    message,
                    retry_after,
                    request_id: header_request_id,
                }
            } else {
                ProviderError::Permanent {
                    status: code,
                    message,
                    request_id: header_request_id,
                }
            });
        }
        let parsed: ChatResponse =
            serde_json::from_slice(&body).map_err(|error| ProviderError::OutcomeUnknown {
                message: format!("the answer is not a chat completion: {error}"),
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

/// Whether an error status is worth retrying: rate limits, timeouts, conflicts and
/// server errors.
fn is_transient(status: u16) -> bool {
    matches!(status, 408 | 409 | 429) || status >= 500
}

/// A connection that was never made means the request was never sent; anything
/// after that may have reached the provider.
fn classify_send_error(error: reqwest::Error) -> ProviderError {
    if error.is_connect() {
        ProviderError::NotSent {
            message: error.to_string(),
        }
    } else {
        ProviderError::OutcomeUnknown {
            message: error.to_string(),
        }
    }
}

fn request_id(headers: &HeaderMap) -> Option<String> {
    ["x-request-id", "request-id"]
        .iter()
        .find_map(|name| headers.get(*name)?.to_str().ok().map(str::to_owned))
}

/// `Retry-After` in seconds (the form providers send).
fn retry_after(headers: &HeaderMap) -> Option<Duration> {
    let seconds: f64 = headers
        .get(RETRY_AFTER)?
        .to_str()
        .ok()?
        .trim()
        .parse()
        .ok()?;
    (seconds.is_finite() && seconds >= 0.0).then(|| Duration::from_secs_f64(seconds))
}

fn error_message(body: &[u8]) -> String {
    serde_json::from_slice::<Value>(body)
        .ok()
        .and_then(|value| value["error"]["message"].as_str().map(str::to_owned))
        .unwrap_or_else(|| String::from_utf8_lossy(body).chars().take(500).collect())
}
