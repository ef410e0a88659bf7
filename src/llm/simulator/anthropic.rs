//! `POST /v1/messages` in Anthropic's shape.

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

pub(super) struct Anthropic;

impl Dialect for Anthropic {
    const REQUEST_ID_HEADER: HeaderName = HeaderName::from_static("request-id");

    fn error_body(status: StatusCode, message: &str, request_id: &str) -> Value {
        let kind = match status.as_u16() {
            401 => "authentication_error",
            403 => "permission_error",
            404 => "not_found_error",
            413 => "request_too_large",
            429 => "rate_limit_error",
            503 | 529 => "overloaded_error",
            500.. => "api_error",
            _ => "invalid_request_error",
        };
        json!({
            "type": "error",
            "error": { "type": kind, "message": message },
            "request_id": request_id,
        })
    }
}

#[derive(Deserialize)]
struct MessagesRequest {
    model: String,
    #[serde(default)]
    system: Option<Content>,
    messages: Vec<Message>,
    // Required, as at Anthropic: a client that forgets it should find out here.
    max_tokens: u64,
    #[serde(default)]
    stream: Option<bool>,
    #[serde(default)]
    tools: Option<Value>,
}

#[derive(Deserialize)]
struct Message {
    role: String,
    content: Content,
}

/// The prompt of a request body, as a single call would read it.
pub(super) fn prompt_of(body: &[u8]) -> Result<Prompt, serde_json::Error> {
    serde_json::from_slice::<MessagesRequest>(body).map(MessagesRequest::into_prompt)
}

impl MessagesRequest {
    fn into_prompt(self) -> Prompt {
        let last_user = self
            .messages
            .iter()
            .rev()
            .find(|message| message.role == "user")
            .map(|message| message.content.text())
            .unwrap_or_default();
        let texts = self
            .system
            .iter()
            .chain(self.messages.iter().map(|message| &message.content))
            .map(Content::text)
            .collect();
        let media_tokens = self
            .messages
            .iter()
            .map(|message| message.content.media_tokens(Shape::Anthropic, &self.model))
            .sum();
        Prompt {
            model: self.model,
            texts,
            media_tokens,
            last_user,
            max_tokens: Some(self.max_tokens),
            format: ReplyFormat::Text,
            tool_bytes: self.tools.map_or(0, |tools| tools.to_string().len()),
        }
    }
}

pub(super) async fn messages(
    State(sim): State<Simulator>,
    conn: Option<Extension<ConnectInfo<ConnHandle>>>,
    body: Bytes,
) -> Response {
    let request_id = format!("msg_{}", Uuid::new_v4().simple());
    let request: MessagesRequest = match serde_json::from_slice(&body) {
        Ok(request) => request,
        Err(err) => return reject::<Anthropic>(&sim, &request_id, &body, &err),
    };
    let stream = request.stream.unwrap_or(false);
    let conn = conn.map(|Extension(ConnectInfo(conn))| conn);
    let completion =
        match admit::<Anthropic>(&sim, conn, request_id, request.into_prompt(), &body).await {
            Ok(completion) => completion,
            Err(response) => return response,
        };
    let response = if stream {
        streamed(&completion)
    } else {
        Json(whole(&completion)).into_response()
    };
    with_request_id::<Anthropic>(response, &completion.request_id)
}

fn stop_reason(completion: &Completion) -> &'static str {
    if completion.truncated {
        "max_tokens"
    } else if completion.tool_call.is_some() {
        "tool_use"
    } else {
        "end_turn"
    }
}

/// The reply's one content block: its text, or its `tool_use` block. Anthropic sends
/// the arguments as the object `input`; arguments that are not a JSON object (a cut
/// reply, `[mock:reply=…]` text) are sent as a JSON string, which no schema of an
/// object accepts.
fn content_block(completion: &Completion) -> Value {
    match &completion.tool_call {
        None => json!({ "type": "text", "text": completion.text }),
        Some(call) => {
            let input = serde_json::from_str::<Value>(&call.arguments)
                .ok()
                .filter(Value::is_object)
                .unwrap_or_else(|| json!(call.arguments));
            json!({
                "type": "tool_use",
                "id": format!("toolu_{}", call.id),
                "name": call.name,
                "input": input,
            })
        }
    }
}

pub(super) fn whole(completion: &Completion) -> Value {
    json!({
        "id": completion.request_id,
        "type": "message",
        "role": "assistant",
        "model": completion.model,
        "content": [content_block(completion)],
        "stop_reason": stop_reason(completion),
        "stop_sequence": null,
        "usage": {
            "input_tokens": completion.input_tokens,
            "output_tokens": completion.output_tokens,
            "cache_read_input_tokens": 0,
            "cache_creation_input_tokens": 0,
        },
    })
}

fn streamed(completion: &Completion) -> Response {
    let event = |name: &str, data: Value| Event::default().event(name).data(data.to_string());

    let mut events = vec![event(
        "message_start",
        json!({
            "type": "message_start",
            "message": {
                "id": completion.request_id,
                "type": "message",
                "role": "assistant",
                "model": completion.model,
                "content": [],
                "stop_reason": null,
                "stop_sequence": null,
                // Output is reported once, in message_delta, so a client
                // that adds the two cannot double count.
                "usage": {
                    "input_tokens": completion.input_tokens,
                    "output_tokens": 0,
                    "cache_read_input_tokens": 0,
                    "cache_creation_input_tokens": 0,
                },
            },
        }),
    )];
    match &completion.tool_call {
        None => {
            events.push(event(
                "content_block_start",
                json!({
                    "type": "content_block_start",
                    "index": 0,
                    "content_block": { "type": "text", "text": "" },
                }),
            ));
            events.extend(deltas(&completion.text).into_iter().map(|piece| {
                event(
                    "content_block_delta",
                    json!({
                        "type": "content_block_delta",
                        "index": 0,
                        "delta": { "type": "text_delta", "text": piece },
                    }),
                )
            }));
        }
        // Anthropic streams a tool_use block with an empty input, then its input as
        // pieces of JSON text.
        Some(call) => {
            events.push(event(
                "content_block_start",
                json!({
                    "type": "content_block_start",
                    "index": 0,
                    "content_block": {
                        "type": "tool_use",
                        "id": format!("toolu_{}", call.id),
                        "name": call.name,
                        "input": {},
                    },
                }),
            ));
            events.extend(deltas(&call.arguments).into_iter().map(|piece| {
                event(
                    "content_block_delta",
                    json!({
                        "type": "content_block_delta",
                        "index": 0,
                        "delta": { "type": "input_json_delta", "partial_json": piece },
                    }),
                )
            }));
        }
    }
    events.push(event(
        "content_block_stop",
        json!({ "type": "content_block_stop", "index": 0 }),
    ));
    events.push(event(
        "message_delta",
        json!({
            "type": "message_delta",
            "delta": { "stop_reason": stop_reason(completion), "stop_sequence": null },
            "usage": { "output_tokens": completion.output_tokens },
        }),
    ));
    events.push(event("message_stop", json!({ "type": "message_stop" })));
    paced(events, completion.chunk_delay)
}
