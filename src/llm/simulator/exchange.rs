//! The provider-independent half of answering a completion: the call log,
//! directives and faults, usage and the reply text.

use std::time::Duration;

use axum::Json;
use axum::http::{HeaderName, HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use serde::Deserialize;
use serde_json::{Value, json};

use super::conn::ConnHandle;
use super::directives::{self, Directives, NOT_JSON};
use super::{Charge, Simulator, logged_request};
use crate::llm::parts::{Shape, TOKENS_PER_PDF_PAGE, image, pdf};

/// How many characters of the last user message the default reply echoes.
const GIST_CHARS: usize = 60;
/// Deepest `$ref`/nesting followed when sampling a JSON schema; recursive
/// schemas would otherwise never end.
const SCHEMA_DEPTH: u8 = 8;

/// Message content: a plain string or a list of typed parts.
#[derive(Deserialize)]
#[serde(untagged)]
pub(super) enum Content {
    Text(String),
    Parts(Vec<Part>),
}

/// One part of a multi-part content; only `text` parts carry text. Images and PDFs
/// count by the published rules of the shape they came in.
#[derive(Deserialize)]
pub(super) struct Part {
    #[serde(rename = "type")]
    kind: String,
    #[serde(default)]
    text: Option<String>,
    /// OpenAI's `image_url` part.
    #[serde(default)]
    image_url: Option<ImageUrl>,
    /// OpenAI's `file` part.
    #[serde(default)]
    file: Option<FileData>,
    /// Anthropic's `image` and `document` blocks.
    #[serde(default)]
    source: Option<BlockSource>,
}

#[derive(Deserialize)]
struct ImageUrl {
    url: String,
}

#[derive(Deserialize)]
struct FileData {
    #[serde(default)]
    file_data: Option<String>,
}

#[derive(Deserialize)]
struct BlockSource {
    #[serde(rename = "type")]
    kind: String,
    #[serde(default)]
    data: Option<String>,
}

/// The bytes of a `data:…;base64,…` URL.
fn data_url_bytes(url: &str) -> Option<Vec<u8>> {
    let (_, data) = url.strip_prefix("data:")?.split_once(";base64,")?;
    base64_bytes(data)
}

fn base64_bytes(data: &str) -> Option<Vec<u8>> {
    use base64::Engine;
    base64::engine::general_purpose::STANDARD.decode(data).ok()
}

impl Part {
    /// What this part counts as input, by `shape`'s rules: an image by its size
    /// (one whose bytes are not at hand, by URL, at the most an image counts), a PDF
    /// by its pages and the text it shows; text and anything else nothing here.
    fn media_tokens(&self, shape: Shape, model: &str) -> u64 {
        let image = |bytes: Option<Vec<u8>>| {
            let size = bytes
                .as_deref()
                .and_then(image::read_header)
                .map(|(_, width, height)| (width, height));
            shape.image_tokens(model, size)
        };
        // Its pages at their allowance; its text, measured as the hold measures it,
        // as the simulator counts any text: a quarter of its bytes. A budget of its
        // own: the job's documents passed a shared one when it was created.
        let document = |bytes: Option<Vec<u8>>| {
            bytes
                .as_deref()
                .and_then(|bytes| pdf::measure(bytes, &mut pdf::InflateBudget::default()).ok())
                .map_or(0, |measure| {
                    TOKENS_PER_PDF_PAGE * u64::from(measure.pages) + measure.text_tokens.div_ceil(4)
                })
        };
        let block_bytes = || {
            self.source
                .as_ref()
                .filter(|source| source.kind == "base64")
                .and_then(|source| source.data.as_deref())
                .and_then(base64_bytes)
        };
        match self.kind.as_str() {
            "image_url" => image(
                self.image_url
                    .as_ref()
                    .and_then(|image| data_url_bytes(&image.url)),
            ),
            "file" => document(
                self.file
                    .as_ref()
                    .and_then(|file| file.file_data.as_deref())
                    .and_then(data_url_bytes),
            ),
            "image" => image(block_bytes()),
            "document" => document(block_bytes()),
            _ => 0,
        }
    }
}

impl Content {
    /// What the images and documents among the parts count as, by `shape`'s rules.
    pub(super) fn media_tokens(&self, shape: Shape, model: &str) -> u64 {
        match self {
            Self::Text(_) => 0,
            Self::Parts(parts) => parts
                .iter()
                .map(|part| part.media_tokens(shape, model))
                .sum(),
        }
    }

    /// The text parts, concatenated; images and the like count for nothing.
    pub(super) fn text(&self) -> String {
        match self {
            Self::Text(text) => text.clone(),
            Self::Parts(parts) => parts
                .iter()
                .filter(|part| part.kind == "text")
                .filter_map(|part| part.text.as_deref())
                .collect(),
        }
    }
}

/// A completion request, reduced to what the simulator acts on.
pub(super) struct Prompt {
    pub model: String,
    /// Every input text, system prompt first, in request order.
    pub texts: Vec<String>,
    /// What the images and documents count as, by the rules of the request's shape.
    pub media_tokens: u64,
    /// Text of the last user message (empty when there is none).
    pub last_user: String,
    pub max_tokens: Option<u64>,
    pub format: ReplyFormat,
    /// Bytes of the request's tool definitions, which count as input as the prompt's
    /// text does.
    pub tool_bytes: usize,
}

/// What the client asked the reply to look like.
pub(super) enum ReplyFormat {
    Text,
    JsonObject,
    /// Holds the schema itself.
    JsonSchema(Value),
}

/// A successful answer, ready to be rendered in a provider's shape.
pub(super) struct Completion {
    pub request_id: String,
    pub model: String,
    pub text: String,
    /// The tool call answered instead of text (`tool_call`).
    pub tool_call: Option<ToolCall>,
    /// The reply was cut at `max_tokens`.
    pub truncated: bool,
    pub input_tokens: u64,
    pub output_tokens: u64,
    /// Pause between the chunks of a streamed answer (`chunk_delay_ms`).
    pub chunk_delay: std::time::Duration,
}

/// The one tool call of a `tool_call` answer.
pub(super) struct ToolCall {
    /// Unique per call; each dialect puts its own prefix before it.
    pub id: String,
    pub name: String,
    /// JSON text as the model "wrote" it: the `reply`, or `{}`.
    pub arguments: String,
}

/// An SSE body that sends `events` with `pause` between them, the way a model
/// generating token by token would.
pub(super) fn paced(
    events: Vec<axum::response::sse::Event>,
    pause: std::time::Duration,
) -> axum::response::Response {
    use axum::response::IntoResponse;
    use futures_util::StreamExt;
    let stream = futures_util::stream::iter(events).then(move |event| async move {
        if !pause.is_zero() {
            tokio::time::sleep(pause).await;
        }
        Ok::<_, std::convert::Infallible>(event)
    });
    axum::response::sse::Sse::new(stream).into_response()
}

/// What differs between providers outside the success path.
pub(super) trait Dialect {
    /// Response header carrying the request id.
    const REQUEST_ID_HEADER: HeaderName;
    /// The provider's error body.
    fn error_body(status: StatusCode, message: &str, request_id: &str) -> Value;
}

pub(super) enum Fault {
    Status(StatusCode),
    Drop,
    Hang,
}

/// What the simulator makes of one request before anything is played out: the
/// answer it would give, and the fault its directives ask for instead. Shared by
/// single calls and batch requests, so both count usage alike.
pub(super) struct Plan {
    pub directives: Directives,
    pub completion: Completion,
    pub fault: Option<Fault>,
}

/// Works out the reply, its usage and the fault of `prompt`; counts a `fail_first`
/// call.
pub(super) fn plan(sim: &Simulator, request_id: String, prompt: Prompt) -> Plan {
    let directives = Directives::parse(prompt.texts.iter().map(String::as_str));
    let input_tokens =
        tokens(prompt.texts.iter().map(String::len).sum::<usize>() + prompt.tool_bytes)
            + prompt.media_tokens;
    // A tool call's arguments are its output: they are cut and counted as text is.
    let (tool_call, (text, truncated)) = match &directives.tool_call {
        Some(name) => {
            let arguments = directives.reply.clone().unwrap_or_else(|| "{}".to_owned());
            let (arguments, truncated) = cap(arguments, prompt.max_tokens);
            let call = ToolCall {
                id: uuid::Uuid::new_v4().simple().to_string(),
                name: name.clone(),
                arguments,
            };
            (Some(call), (String::new(), truncated))
        }
        None => (
            None,
            cap(reply_text(&directives, &prompt), prompt.max_tokens),
        ),
    };
    let output_tokens = tokens(
        tool_call
            .as_ref()
            .map_or(text.len(), |call| call.arguments.len()),
    );
    let fault = choose_fault(sim, &directives, &prompt);
    let chunk_delay = Duration::from_millis(directives.chunk_delay_ms.unwrap_or(0));
    Plan {
        directives,
        completion: Completion {
            request_id,
            model: prompt.model,
            text,
            tool_call,
            truncated,
            input_tokens,
            output_tokens,
            chunk_delay,
        },
        fault,
    }
}

/// Logs the call and plays out its directives.
///
/// Returns the completion to render, or the error response to send. Never
/// returns for `hang` and `drop`: the future is dropped with the connection.
pub(super) async fn admit<D: Dialect>(
    sim: &Simulator,
    conn: Option<ConnHandle>,
    request_id: String,
    prompt: Prompt,
    body: &[u8],
) -> Result<Completion, Response> {
    let Plan {
        directives,
        completion,
        fault,
    } = plan(sim, request_id, prompt);
    let request_id = completion.request_id.clone();
    let output_tokens = completion.output_tokens;
    // Refusals are free; anything else is work started, billed even if
    // nobody stays around for the answer.
    let if_abandoned = match fault {
        Some(Fault::Status(_)) => Charge::FREE,
        _ => Charge::billed(output_tokens),
    };
    let slot = sim.open_call(
        &request_id,
        &completion.model,
        completion.input_tokens,
        logged_request(body),
        None,
        if_abandoned,
    );
    tracing::debug!(%request_id, model = %completion.model, ?directives, "mock provider: call");

    if let Some(ms) = directives.delay_ms {
        tokio::time::sleep(Duration::from_millis(ms)).await;
    }
    match fault {
        None => {
            slot.settle(200, Charge::billed(output_tokens));
            Ok(completion)
        }
        Some(Fault::Status(status)) => {
            slot.settle(status.as_u16(), Charge::FREE);
            Err(error_response::<D>(
                status,
                &fault_message(status),
                &request_id,
                directives.retry_after.as_deref(),
            ))
        }
        Some(Fault::Drop) => {
            let Some(conn) = conn else {
                slot.settle(500, Charge::FREE);
                let message =
                    "mock:drop needs Simulator::serve: this router cannot reach its socket";
                return Err(error_response::<D>(
                    StatusCode::INTERNAL_SERVER_ERROR,
                    message,
                    &request_id,
                    None,
                ));
            };
            slot.settle(0, Charge::billed(output_tokens));
            conn.sever();
            std::future::pending().await
        }
        Some(Fault::Hang) => {
            // `slot` settles when this future is dropped: the client left,
            // or the cut below closed the connection.
            if let Some(conn) = conn {
                conn.server_stopping().await;
                conn.sever();
            }
            std::future::pending().await
        }
    }
}

/// Whether `prompt` asks to expire in the first batch that holds it.
pub(super) fn expires_in_batch(prompt: &Prompt) -> bool {
    Directives::parse(prompt.texts.iter().map(String::as_str)).batch_expire
}

/// The error message of a `status=` fault.
pub(super) fn fault_message(status: StatusCode) -> String {
    format!("simulated {status} (mock directive)")
}

/// The key under which a prompt's content is remembered (`fail_first`, `batch_expire`).
pub(super) fn content_key(prompt_model: &str, texts: &[String]) -> String {
    // The separator keeps ["ab", "c"] and ["a", "bc"] apart.
    format!("{prompt_model}\u{1f}{}", texts.join("\u{1f}"))
}

/// Logs an unreadable request and answers 400.
pub(super) fn reject<D: Dialect>(
    sim: &Simulator,
    request_id: &str,
    body: &[u8],
    err: &serde_json::Error,
) -> Response {
    // Valid JSON that is not a valid request may still say which model it
    // wanted, which makes the log easier to read.
    let model = serde_json::from_slice::<Value>(body)
        .ok()
        .and_then(|value| value.get("model")?.as_str().map(str::to_owned))
        .unwrap_or_default();
    sim.open_call(
        request_id,
        &model,
        0,
        logged_request(body),
        None,
        Charge::FREE,
    )
    .settle(400, Charge::FREE);
    let message = format!("invalid request body: {err}");
    error_response::<D>(StatusCode::BAD_REQUEST, &message, request_id, None)
}

pub(super) fn error_response<D: Dialect>(
    status: StatusCode,
    message: &str,
    request_id: &str,
    retry_after: Option<&str>,
) -> Response {
    let mut response = (status, Json(D::error_body(status, message, request_id))).into_response();
    if let Some(value) = retry_after.and_then(|value| HeaderValue::from_str(value).ok()) {
        response.headers_mut().insert(header::RETRY_AFTER, value);
    }
    with_request_id::<D>(response, request_id)
}

/// Adds the provider's request id header.
pub(super) fn with_request_id<D: Dialect>(mut response: Response, request_id: &str) -> Response {
    if let Ok(value) = HeaderValue::from_str(request_id) {
        response.headers_mut().insert(D::REQUEST_ID_HEADER, value);
    }
    response
}

fn choose_fault(sim: &Simulator, directives: &Directives, prompt: &Prompt) -> Option<Fault> {
    if directives
        .fail_model
        .as_ref()
        .is_some_and(|model| *model != prompt.model)
    {
        return None;
    }
    let fault = if directives.hang {
        Fault::Hang
    } else if directives.drop {
        Fault::Drop
    } else if let Some(status) = directives.status {
        Fault::Status(status)
    } else if directives.fail_first.is_some() {
        Fault::Status(StatusCode::INTERNAL_SERVER_ERROR)
    } else {
        return None;
    };
    match directives.fail_first {
        Some(limit) => {
            let key = content_key(&prompt.model, &prompt.texts);
            (sim.next_attempt(&key) <= limit).then_some(fault)
        }
        None => Some(fault),
    }
}

fn reply_text(directives: &Directives, prompt: &Prompt) -> String {
    if directives.invalid_json {
        return NOT_JSON.to_owned();
    }
    if let Some(reply) = &directives.reply {
        return reply.clone();
    }
    let gist: String = directives::strip(&prompt.last_user)
        .trim()
        .chars()
        .take(GIST_CHARS)
        .collect();
    match &prompt.format {
        ReplyFormat::Text => format!("Summary: {gist}"),
        ReplyFormat::JsonObject => json!({ "summary": gist }).to_string(),
        ReplyFormat::JsonSchema(schema) => sample_schema(schema, schema, &gist, 0).to_string(),
    }
}

/// Cuts `text` so that its token count stays within `max_tokens`.
fn cap(mut text: String, max_tokens: Option<u64>) -> (String, bool) {
    let Some(max_tokens) = max_tokens else {
        return (text, false);
    };
    let limit = usize::try_from(max_tokens.saturating_mul(4)).unwrap_or(usize::MAX);
    if text.len() <= limit {
        return (text, false);
    }
    let mut end = limit;
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    text.truncate(end);
    (text, true)
}

/// The simulator's tokenizer: one token per started 4 bytes.
fn tokens(bytes: usize) -> u64 {
    (bytes as u64).div_ceil(4)
}

/// Cuts `text` into a few pieces, the way a model streams it; concatenated
/// they give `text` back.
pub(super) fn deltas(text: &str) -> Vec<&str> {
    const PIECES: usize = 4;
    let per_piece = text.chars().count().div_ceil(PIECES).max(1);
    let mut pieces = Vec::with_capacity(PIECES);
    let mut rest = text;
    while !rest.is_empty() {
        let cut = rest
            .char_indices()
            .nth(per_piece)
            .map_or(rest.len(), |(at, _)| at);
        let (piece, tail) = rest.split_at(cut);
        pieces.push(piece);
        rest = tail;
    }
    pieces
}

/// A small value valid against the common subset of JSON Schema, every
/// string holding `text`, so structured-output demos work with no directive.
fn sample_schema(schema: &Value, root: &Value, text: &str, depth: u8) -> Value {
    if depth > SCHEMA_DEPTH {
        return Value::Null;
    }
    let sample = |schema: &Value| sample_schema(schema, root, text, depth + 1);
    if let Some(target) = schema
        .get("$ref")
        .and_then(Value::as_str)
        .and_then(|reference| root.pointer(reference.strip_prefix('#')?))
    {
        return sample(target);
    }
    if let Some(value) = schema.get("const") {
        return value.clone();
    }
    if let Some(first) = schema
        .get("enum")
        .and_then(Value::as_array)
        .and_then(|values| values.first())
    {
        return first.clone();
    }
    for combinator in ["anyOf", "oneOf", "allOf"] {
        if let Some(first) = schema
            .get(combinator)
            .and_then(Value::as_array)
            .and_then(|options| options.first())
        {
            return sample(first);
        }
    }
    let kind = match schema.get("type") {
        Some(Value::String(kind)) => kind.as_str(),
        // e.g. ["string", "null"]: the first type is the informative one.
        Some(Value::Array(kinds)) => kinds.first().and_then(Value::as_str).unwrap_or("null"),
        _ if schema.get("properties").is_some() => "object",
        _ => "string",
    };
    match kind {
        "object" => Value::Object(
            schema
                .get("properties")
                .and_then(Value::as_object)
                .map(|properties| {
                    properties
                        .iter()
                        .map(|(name, property)| (name.clone(), sample(property)))
                        .collect()
                })
                .unwrap_or_default(),
        ),
        "array" => Value::Array(schema.get("items").map(sample).into_iter().collect()),
        "integer" | "number" => json!(0),
        "boolean" => json!(false),
        "null" => Value::Null,
        _ => json!(text),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cap_respects_char_boundaries() {
        assert_eq!(cap("héé wörld".into(), Some(1)), ("hé".into(), true));
        assert_eq!(cap("abcd".into(), Some(1)), ("abcd".into(), false));
        assert_eq!(cap("abcd".into(), Some(0)), (String::new(), true));
    }

    #[test]
    fn deltas_reassemble() {
        for text in ["", "a", "Summary: héllo wörld, a longer reply"] {
            let pieces = deltas(text);
            assert!(pieces.len() <= 4);
            assert_eq!(pieces.concat(), text);
        }
    }

    #[test]
    fn schema_sample_follows_refs_and_types() {
        let schema = json!({
            "type": "object",
            "properties": {
                "title": {"type": "string"},
                "count": {"type": "integer"},
                "kind": {"enum": ["a", "b"]},
                "tags": {"type": "array", "items": {"$ref": "#/$defs/Tag"}},
                "note": {"anyOf": [{"type": "null"}, {"type": "string"}]},
            },
            "$defs": {"Tag": {"type": "object", "properties": {"ok": {"type": "boolean"}}}},
        });
        assert_eq!(
            sample_schema(&schema, &schema, "gist", 0),
            json!({"title": "gist", "count": 0, "kind": "a", "tags": [{"ok": false}], "note": null})
        );
    }

    #[test]
    fn recursive_schema_terminates() {
        let schema = json!({"$ref": "#"});
        assert_eq!(sample_schema(&schema, &schema, "x", 0), Value::Null);
    }
}
