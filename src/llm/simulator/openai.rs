//! `POST /v1/chat/completions` in OpenAI's shape.

use axum::Extension;
use axum::Json;
use axum::body::Bytes;
use axum::extract::{ConnectInfo, State};
use axum::http::{HeaderName, StatusCode};
use axum::response::sse::Event;
use axum::response::{IntoResponse, Response};
use serde::Deserialize;
use serde_json::{Value, json};
use uuid::Uuid;

use crate::llm::parts::Shape;

use super::Simulator;
use super::conn::ConnHandle;
use super::exchange::{
    Completion, Content, Dialect, Prompt, ReplyFormat, admit, deltas, paced, reject,
    with_request_id,
};

pub(super) struct OpenAi;

impl Dialect for OpenAi {
    const REQUEST_ID_HEADER: HeaderName = HeaderName::from_static("x-request-id");

    fn error_body(status: StatusCode, message: &str, _request_id: &str) -> Value {
        let (kind, code) = match status.as_u16() {
            401 => ("authentication_error", Some("invalid_api_key")),
            403 => ("permission_error", None),
            404 => ("not_found_error", Some("model_not_found")),
            429 => ("rate_limit_error", Some("rate_limit_exceeded")),
            500.. => ("server_error", None),
            _ => ("invalid_request_error", None),
        };
        json!({ "error": { "message": message, "type": kind, "param": null, "code": code } })
    }
}

#[derive(Deserialize)]
struct ChatRequest {
    model: String,
    messages: Vec<ChatMessage>,
    #[serde(default)]
    max_tokens: Option<u64>,
    #[serde(default)]
    max_completion_tokens: Option<u64>,
    #[serde(default)]
    stream: Option<bool>,
    #[serde(default)]
    stream_options: Option<StreamOptions>,
    #[serde(default)]
    response_format: Option<ResponseFormat>,
    #[serde(default)]
    tools: Option<Value>,
}

#[derive(Deserialize)]
struct ChatMessage {
    role: String,
    // Assistant turns that only call tools have `content: null`.
    #[serde(default)]
    content: Option<Content>,
}

#[derive(Deserialize)]
struct StreamOptions {
    #[serde(default)]
    include_usage: Option<bool>,
}

#[derive(Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
enum ResponseFormat {
    Text,
    JsonObject,
    JsonSchema { json_schema: JsonSchemaFormat },
}

#[derive(Deserialize)]
struct JsonSchemaFormat {
    #[serde(default)]
    schema: Value,
}

/// The prompt of a request body, as a single call would read it.
pub(super) fn prompt_of(body: &[u8]) -> Result<Prompt, serde_json::Error> {
    serde_json::from_slice::<ChatRequest>(body).map(ChatRequest::into_prompt)
}

impl ChatRequest {
    fn into_prompt(self) -> Prompt {
        let texts: Vec<String> = self
            .messages
            .iter()
            .map(|message| {
                message
                    .content
                    .as_ref()
                    .map(Content::text)
                    .unwrap_or_default()
            })
            .collect();
        let last_user = self
            .messages
            .iter()
            .zip(&texts)
            .rev()
            .find(|(message, _)| message.role == "user")
            .map(|(_, text)| text.clone())
            .unwrap_or_default();
        let format = match self.response_format {
            None | Some(ResponseFormat::Text) => ReplyFormat::Text,
            Some(ResponseFormat::JsonObject) => ReplyFormat::JsonObject,
            Some(ResponseFormat::JsonSchema { json_schema }) => {
                ReplyFormat::JsonSchema(json_schema.schema)
            }
        };
        let media_tokens = self
            .messages
            .iter()
            .filter_map(|message| message.content.as_ref())
            .map(|content| content.media_tokens(Shape::OpenAi, &self.model))
            .sum();
        Prompt {
            model: self.model,
            texts,
            media_tokens,
            last_user,
            // The newer name wins, as it does at OpenAI.
            max_tokens: self.max_completion_tokens.or(self.max_tokens),
            format,
            tool_bytes: self.tools.map_or(0, |tools| tools.to_string().len()),
        }
    }
}

pub(super) async fn chat_completions(
    State(sim): State<Simulator>,
    conn: Option<Extension<ConnectInfo<ConnHandle>>>,
    body: Bytes,
) -> Response {
    let request_id = format!("chatcmpl-{}", Uuid::new_v4().simple());
    let request: ChatRequest = match serde_json::from_slice(&body) {
        Ok(request) => request,
        Err(err) => return reject::<OpenAi>(&sim, &request_id, &body, &err),
    };
    let stream = request.stream.unwrap_or(false);
    let include_usage = request
        .stream_options
        .as_ref()
        .and_then(|options| options.include_usage)
        .unwrap_or(false);
    let conn = conn.map(|Extension(ConnectInfo(conn))| conn);
    let completion =
        match admit::<OpenAi>(&sim, conn, request_id, request.into_prompt(), &body).await {
            Ok(completion) => completion,
            Err(response) => return response,
        };
    let response = if stream {
        streamed(&completion, include_usage)
    } else {
        Json(whole(&completion)).into_response()
    };
    with_request_id::<OpenAi>(response, &completion.request_id)
}

fn finish_reason(completion: &Completion) -> &'static str {
    if completion.truncated {
        "length"
    } else if completion.tool_call.is_some() {
        "tool_calls"
    } else {
        "stop"
    }
}

/// The assistant message: its text, or its one tool call with `content: null`.
fn message(completion: &Completion) -> Value {
    match &completion.tool_call {
        None => json!({ "role": "assistant", "content": completion.text }),
        Some(call) => json!({
            "role": "assistant",
            "content": null,
            "tool_calls": [{
                "id": format!("call_{}", call.id),
                "type": "function",
                "function": { "name": call.name, "arguments": call.arguments },
            }],
        }),
    }
}

fn usage(completion: &Completion) -> Value {
    json!({
        "prompt_tokens": completion.input_tokens,
        "completion_tokens": completion.output_tokens,
        "total_tokens": completion.input_tokens + completion.output_tokens,
        "prompt_tokens_details": { "cached_tokens": 0 },
        "completion_tokens_details": { "reasoning_tokens": 0 },
    })
}

pub(super) fn whole(completion: &Completion) -> Value {
    json!({
        "id": completion.request_id,
        "object": "chat.completion",
        "created": chrono::Utc::now().timestamp(),
        "model": completion.model,
        "choices": [{
            "index": 0,
            "message": message(completion),
            "finish_reason": finish_reason(completion),
        }],
        "usage": usage(completion),
    })
}

fn streamed(completion: &Completion, include_usage: bool) -> Response {
    let created = chrono::Utc::now().timestamp();
    let chunk = |choices: Value, usage: Value| {
        let mut chunk = json!({
            "id": completion.request_id,
            "object": "chat.completion.chunk",
            "created": created,
            "model": completion.model,
            "choices": choices,
        });
        // OpenAI sends `usage: null` on every chunk but the last once usage was requested.
        if include_usage {
            chunk["usage"] = usage;
        }
        Event::default().data(chunk.to_string())
    };
    let choice = |delta: Value, finish_reason: Value| json!([{ "index": 0, "delta": delta, "finish_reason": finish_reason }]);

    let mut events = vec![chunk(
        choice(json!({ "role": "assistant", "content": "" }), Value::Null),
        Value::Null,
    )];
    match &completion.tool_call {
        None => events.extend(deltas(&completion.text).into_iter().map(|piece| {
            chunk(
                choice(json!({ "content": piece }), Value::Null),
                Value::Null,
            )
        })),
        // OpenAI's pieces of a call: its id and name with empty arguments first, then
        // the arguments piece by piece, each naming the call by its index.
        Some(call) => {
            events.push(chunk(
                choice(
                    json!({ "tool_calls": [{
                        "index": 0,
                        "id": format!("call_{}", call.id),
                        "type": "function",
                        "function": { "name": call.name, "arguments": "" },
                    }] }),
                    Value::Null,
                ),
                Value::Null,
            ));
            events.extend(deltas(&call.arguments).into_iter().map(|piece| {
                chunk(
                    choice(
                        json!({ "tool_calls": [{ "index": 0, "function": { "arguments": piece } }] }),
                        Value::Null,
                    ),
                    Value::Null,
                )
            }));
        }
    }
    events.push(chunk(
        choice(json!({}), json!(finish_reason(completion))),
        Value::Null,
    ));
    if include_usage {
        events.push(chunk(json!([]), usage(completion)));
    }
    events.push(Event::default().data("[DONE]"));
    paced(events, completion.chunk_delay)
}
