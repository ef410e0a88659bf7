//! What a client asks a job to do, parsed into types that cannot hold a bad request.

use super::fallbacks::parse_fallback_models;
use super::labels::Labels;
use super::measuring::Measuring;
use super::parameters::{ParameterRequest, parse_parameters};
use super::parts::{PartBudget, PartRequest, check_model_takes};
use super::tools::{ToolRequest, parse_tools};
use crate::billing::{CallBound, ChargingPolicy};
use crate::error::ServiceError;
use crate::llm::parts::pdf::InflateBudget;
use crate::llm::{Message, PromptCounting, Role};
use crate::llm::{Parameters, Tools};
use entity::Timestamp;
use serde::{Deserialize, Serialize};
use serde_json::Value;
use sha2::{Digest, Sha256};
use std::time::Duration;
use uuid::Uuid;

/// Longest idempotency key accepted, in characters.
const MAX_IDEMPOTENCY_KEY_LENGTH: usize = 255;
/// Most messages one job may carry.
const MAX_MESSAGES: usize = 1_000;
/// Most UTF-8 bytes of message content one job may carry.
const MAX_CONTENT_BYTES: usize = 4 * 1024 * 1024;
/// Largest `maxOutputTokens` accepted.
pub const MAX_OUTPUT_TOKENS_CAP: u32 = 200_000;
/// Attempts a job gets when the client does not say.
pub const DEFAULT_MAX_ATTEMPTS: u32 = 3;
/// Most attempts a client may ask for: each one may be paid at the provider.
pub const MAX_ATTEMPTS_CAP: u32 = 10;
/// Furthest ahead a job may be scheduled; its hold is taken at creation.
const MAX_SCHEDULE_DAYS: i64 = 366;
/// How long after it may first start a job has to finish when neither the client nor
/// the operator says (`--default-deadline-seconds`, the config file's
/// `default_deadline_seconds`).
pub const DEFAULT_DEADLINE: Duration = Duration::from_secs(24 * 60 * 60);
/// Largest serialized metadata or response schema, in bytes.
const MAX_JSON_BYTES: usize = 64 * 1024;
/// Deepest nesting of arrays and objects accepted in metadata or a response schema. A
/// job's input is stored as JSON text one level below them and read back with
/// serde_json, which stops at 128 levels: deeper metadata failed on that read as an
/// internal error. 32 is far beyond any real metadata or schema.
pub const MAX_JSON_DEPTH: usize = 32;

/// How the keys of batch items begin. A client's own key may not: a `createJob` could
/// otherwise take an item's key before the item arrives, or answer with the item.
const ITEM_KEY_PREFIX: &str = "batch/";
/// How the keys of jobs created by a labelled access token begin: `reach/`, a digest
/// of the token's labels, `/`, the client's key. End users of one tenant (one label
/// value each) then cannot see or take each other's keys, nor the backend's.
const REACH_KEY_PREFIX: &str = "reach/";

/// A client's unique name for one job request, so retries of the request are safe.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct IdempotencyKey(String);

impl IdempotencyKey {
    /// A key of 1 to 255 characters with no control characters.
    pub fn parse(text: String) -> Result<Self, ServiceError> {
        let length = text.chars().count();
        if length == 0 || length > MAX_IDEMPOTENCY_KEY_LENGTH {
            return Err(ServiceError::validation(format!(
                "idempotencyKey must be 1 to {MAX_IDEMPOTENCY_KEY_LENGTH} characters"
            )));
        }
        if text.chars().any(char::is_control) {
            return Err(ServiceError::validation(
                "idempotencyKey must not contain control characters",
            ));
        }
        if text.starts_with(ITEM_KEY_PREFIX) {
            return Err(ServiceError::validation(format!(
                "idempotencyKey must not begin with \"{ITEM_KEY_PREFIX}\": such keys name batch items"
            )));
        }
        if text.starts_with(REACH_KEY_PREFIX) {
            return Err(ServiceError::validation(format!(
                "idempotencyKey must not begin with \"{REACH_KEY_PREFIX}\": such keys name jobs of access tokens"
            )));
        }
        Ok(Self(text))
    }

    /// The key as stored for a caller whose reach is `labels`: within a namespace of
    /// its own, named by a digest of the labels, so that it is the same for every
    /// token minted with them (a page's retry with a fresh token replays).
    pub fn within(self, labels: &Labels) -> Self {
        Self(scoped_key(labels, &self.0))
    }

    /// The key of a batch's item: its batch and `customId`, which the caller has
    /// checked (at most 200 characters, one line), so it stays within 255.
    pub fn of_item(batch_id: Uuid, custom_id: &str) -> Self {
        Self(format!("{ITEM_KEY_PREFIX}{batch_id}/{custom_id}"))
    }

    /// The key's text.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

/// The stored form of the key `key` of a caller reaching the jobs with `labels`.
pub fn scoped_key(labels: &Labels, key: &str) -> String {
    format!("{}{key}", scope_prefix(labels))
}

/// `key` without the namespace of `labels` when it carries it: the stored form of a
/// key, which answers show, names the same job as the client's own form.
pub fn unscoped_key(labels: &Labels, key: String) -> String {
    match key.strip_prefix(&scope_prefix(labels)) {
        Some(own) => own.to_owned(),
        None => key,
    }
}

fn scope_prefix(labels: &Labels) -> String {
    let mut digest = Sha256::new();
    for label in labels.iter() {
        // Lengths first, so that no two label sets give the same bytes.
        for part in [label.key(), label.value()] {
            digest.update((part.len() as u64).to_be_bytes());
            digest.update(part.as_bytes());
        }
    }
    let digest = digest.finalize();
    let scope: String = digest[..8]
        .iter()
        .map(|byte| format!("{byte:02x}"))
        .collect();
    format!("{REACH_KEY_PREFIX}{scope}/")
}

/// The part of a job that is sent to the model, as stored in `jobs.input`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct JobInput {
    pub messages: Vec<Message>,
    pub max_output_tokens: u32,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub response_schema: Option<Value>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub metadata: Option<Value>,
    /// Stream the reply, so subscribers see `OUTPUT_DELTA` events while it is written.
    #[serde(default)]
    pub stream_output: bool,
    /// Sent with every call; absent from what is stored when none was given, so jobs
    /// created before parameters existed keep their fingerprints.
    #[serde(default, skip_serializing_if = "Parameters::is_empty")]
    pub parameters: Parameters,
    /// The functions the model may call; absent from what is stored when none are
    /// offered, as for parameters.
    #[serde(default, skip_serializing_if = "Tools::is_empty")]
    pub tools: Tools,
}

impl JobInput {
    /// The most one call for this input can use, its prompt counted by `counting`
    /// (the rule of the provider serving the model): what holds, cost bounds and
    /// the context window check are computed from.
    /// Media parts count by `model`'s own rule.
    pub fn call_bound(&self, counting: PromptCounting, model: &str) -> CallBound {
        let prompt = super::tokens::count_prompt(self, counting, model);
        CallBound {
            input_tokens: prompt.bound,
            input_estimate: prompt.estimate,
            max_output_tokens: u64::from(self.max_output_tokens),
        }
    }
}

/// A job request as the API receives it, before any check.
#[derive(Clone, Debug)]
pub struct JobRequest {
    pub idempotency_key: String,
    pub model: String,
    pub messages: Vec<MessageRequest>,
    pub max_output_tokens: i32,
    pub response_schema: Option<Value>,
    pub max_attempts: Option<i32>,
    pub retry_unknown_outcome: Option<bool>,
    pub metadata: Option<Value>,
    pub stream_output: Option<bool>,
    pub priority: Option<i32>,
    pub run_at: Option<Timestamp>,
    /// The instant the client wants the job finished by.
    pub deadline: Option<Timestamp>,
    /// The deadline of a job whose client names none, counted from when it may start.
    pub default_deadline: Duration,
    /// The operator's charging policy, which the hold follows.
    pub charging: ChargingPolicy,
    /// `(key, value)` pairs.
    pub labels: Vec<(String, String)>,
    pub parameters: ParameterRequest,
    /// `tools` and `toolChoice`.
    pub tools: ToolRequest,
    /// Models tried in order after `model` (`fallbackModels`).
    pub fallback_models: Vec<String>,
}

/// A job request that passed every check.
#[derive(Clone, Debug, PartialEq)]
pub struct NewJob {
    pub idempotency_key: IdempotencyKey,
    pub model: String,
    pub input: JobInput,
    pub max_attempts: u32,
    pub retry_unknown_outcome: bool,
    pub priority: Priority,
    /// Not claimed before this instant.
    pub run_at: Option<Timestamp>,
    /// By when the job must have finished.
    pub deadline: Deadline,
    pub labels: Labels,
    /// The finished job this one reruns.
    pub rerun_of: Option<Uuid>,
    /// Models tried in order after `model` when it is rate limited, paused or failing
    /// (see `jobs::fallbacks`).
    pub fallback_models: Vec<String>,
    /// The operator's charging policy, which sizes the hold: not part of the request,
    /// so a replay is the same request whatever the operator changed.
    pub charging: ChargingPolicy,
}

/// By when a job must have finished, or it fails `DEADLINE_EXCEEDED`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Deadline {
    /// The instant the client named: part of the request, so of its fingerprint.
    At(Timestamp),
    /// A span from when the job may first start (the configured default): not part
    /// of the request, so a replay is the same request whatever the operator changed.
    After(Duration),
}

impl Deadline {
    /// The instant, for a job that may first start at `start`.
    pub fn instant(self, start: Timestamp) -> Timestamp {
        match self {
            Self::At(at) => at,
            Self::After(span) => {
                start.plus(chrono::Duration::from_std(span).unwrap_or(chrono::Duration::MAX))
            }
        }
    }
}

/// How soon a job runs among its tenant's due jobs: 0 to 9, higher first.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct Priority(u8);

impl Priority {
    /// The priority of a job that does not say.
    pub const DEFAULT: Self = Self(5);
    /// The highest priority.
    pub const MAX: u8 = 9;

    /// A priority from 0 to 9.
    pub fn parse(value: i32) -> Result<Self, ServiceError> {
        u8::try_from(value)
            .ok()
            .filter(|value| *value <= Self::MAX)
            .map(Self)
            .ok_or_else(|| ServiceError::validation(format!("priority must be 0 to {}", Self::MAX)))
    }

    /// The value as stored.
    pub fn value(self) -> i32 {
        i32::from(self.0)
    }
}

impl NewJob {
    /// [`Self::parse`], on a blocking thread when the request carries documents to
    /// measure (see `jobs::measuring`).
    pub async fn parse_measuring(
        measuring: &Measuring,
        request: JobRequest,
    ) -> Result<Self, ServiceError> {
        let documents = MessageRequest::any_document(&request.messages);
        measuring.run(documents, move || Self::parse(request)).await
    }

    /// Checks every rule and returns the first broken one as a `Validation` error.
    pub fn parse(request: JobRequest) -> Result<Self, ServiceError> {
        let idempotency_key = IdempotencyKey::parse(request.idempotency_key)?;
        let model = parse_model(request.model)?;
        let fallback_models = parse_fallback_models(&model, request.fallback_models)?;
        // The job is the request: its documents share one inflate budget.
        let messages = parse_messages(request.messages, &mut InflateBudget::default())?;
        for model in std::iter::once(&model).chain(&fallback_models) {
            check_model_takes(model, messages.iter().flat_map(|message| &message.parts))?;
        }
        let max_output_tokens = parse_max_output_tokens(request.max_output_tokens)?;
        let max_attempts = parse_max_attempts(request.max_attempts)?;
        if let Some(schema) = &request.response_schema {
            check_response_schema(schema)?;
        }
        if let Some(metadata) = &request.metadata {
            check_json("metadata", metadata)?;
        }
        let priority = request
            .priority
            .map_or(Ok(Priority::DEFAULT), Priority::parse)?;
        let labels = Labels::parse(request.labels)?;
        let parameters = parse_parameters(request.parameters)?;
        let tools = parse_tools(request.tools)?;
        if let Some(run_at) = request.run_at
            && run_at > Timestamp::now().plus(chrono::Duration::days(MAX_SCHEDULE_DAYS))
        {
            return Err(ServiceError::validation(format!(
                "runAt must be at most {MAX_SCHEDULE_DAYS} days ahead: the hold is taken now"
            )));
        }
        let deadline = match request.deadline {
            Some(at) => {
                parse_deadline(at, request.run_at)?;
                Deadline::At(at)
            }
            None => Deadline::After(request.default_deadline),
        };
        Ok(Self {
            idempotency_key,
            model,
            input: JobInput {
                messages,
                max_output_tokens,
                response_schema: request.response_schema,
                metadata: request.metadata,
                stream_output: request.stream_output.unwrap_or(false),
                parameters,
                tools,
            },
            max_attempts,
            retry_unknown_outcome: request.retry_unknown_outcome.unwrap_or(true),
            priority,
            run_at: request.run_at,
            deadline,
            labels,
            rerun_of: None,
            fallback_models,
            charging: request.charging,
        })
    }

    /// SHA-256 of the canonical form of everything the request asks for: two requests
    /// with one idempotency key are the same request exactly when this matches.
    pub fn fingerprint(&self) -> String {
        let mut request = serde_json::json!({
            "model": self.model,
            "input": self.input,
            "max_attempts": self.max_attempts,
            "retry_unknown_outcome": self.retry_unknown_outcome,
        });
        // Only when set, so that jobs created before scheduling existed keep their
        // fingerprints.
        if self.priority != Priority::DEFAULT {
            request["priority"] = self.priority.value().into();
        }
        if let Some(run_at) = self.run_at {
            request["run_at"] = run_at.micros().into();
        }
        if let Deadline::At(deadline) = self.deadline {
            request["deadline"] = deadline.micros().into();
        }
        if !self.labels.is_empty() {
            request["labels"] = self.labels.to_json();
        }
        // In order: the chain is tried in it.
        if !self.fallback_models.is_empty() {
            request["fallback_models"] = self.fallback_models.clone().into();
        }
        // A rerun's key used again for another job's rerun, or for a createJob, is a
        // conflict even when the inputs are alike.
        if let Some(rerun_of) = self.rerun_of {
            request["rerun_of"] = rerun_of.to_string().into();
        }
        fingerprint_of(&request)
    }
}

/// SHA-256 of the canonical form of `request` (object keys sorted at every level).
pub fn fingerprint_of(request: &Value) -> String {
    let mut canonical = String::new();
    write_canonical(request, &mut canonical);
    hex::encode(Sha256::digest(canonical.as_bytes()))
}

/// A model name: trimmed, not empty, one line.
pub fn parse_model(model: String) -> Result<String, ServiceError> {
    let model = model.trim().to_owned();
    if model.is_empty() {
        return Err(ServiceError::validation("model must not be empty"));
    }
    crate::validation::single_line("model", &model)?;
    Ok(model)
}

/// One message as the API receives it: its role, its text, and its parts.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MessageRequest {
    pub role: String,
    pub content: Option<String>,
    pub parts: Vec<PartRequest>,
}

impl MessageRequest {
    /// Whether any of `messages` carries a document to measure.
    pub fn any_document(messages: &[Self]) -> bool {
        messages
            .iter()
            .flat_map(|message| &message.parts)
            .any(PartRequest::is_document_data)
    }

    /// A message of text only.
    pub fn text(role: impl Into<String>, content: impl Into<String>) -> Self {
        Self {
            role: role.into(),
            content: Some(content.into()),
            parts: Vec::new(),
        }
    }
}

/// 1 to [`MAX_MESSAGES`] messages of known roles, some content (text or parts), at
/// most [`MAX_CONTENT_BYTES`] of text and the parts within their limits
/// (`jobs::parts`).
/// Their documents' streams inflate within `inflate`, the request's.
pub fn parse_messages(
    messages: Vec<MessageRequest>,
    inflate: &mut InflateBudget,
) -> Result<Vec<Message>, ServiceError> {
    if messages.is_empty() || messages.len() > MAX_MESSAGES {
        return Err(ServiceError::validation(format!(
            "messages must hold 1 to {MAX_MESSAGES} messages"
        )));
    }
    let mut budget = PartBudget::default();
    let messages = messages
        .into_iter()
        .enumerate()
        .map(|(index, request)| {
            let role = Role::from_name(&request.role).ok_or_else(|| {
                ServiceError::validation(format!(
                    "message role must be system, developer, user or assistant, not {:?}",
                    request.role
                ))
            })?;
            let parts = budget.parse(index, role, request.parts, inflate)?;
            Ok(Message {
                role,
                content: request.content.unwrap_or_default(),
                parts,
            })
        })
        .collect::<Result<Vec<_>, ServiceError>>()?;
    if messages
        .iter()
        .all(|message| message.content.trim().is_empty() && message.parts.is_empty())
    {
        return Err(ServiceError::validation(
            "at least one message must have content or parts",
        ));
    }
    let content_bytes: usize = messages.iter().flat_map(Message::texts).map(str::len).sum();
    if content_bytes > MAX_CONTENT_BYTES {
        return Err(ServiceError::validation(format!(
            "messages hold {content_bytes} bytes; at most {MAX_CONTENT_BYTES} are accepted"
        )));
    }
    Ok(messages)
}

/// `maxOutputTokens`: 1 to [`MAX_OUTPUT_TOKENS_CAP`].
pub fn parse_max_output_tokens(tokens: i32) -> Result<u32, ServiceError> {
    u32::try_from(tokens)
        .ok()
        .filter(|tokens| (1..=MAX_OUTPUT_TOKENS_CAP).contains(tokens))
        .ok_or_else(|| {
            ServiceError::validation(format!(
                "maxOutputTokens must be 1 to {MAX_OUTPUT_TOKENS_CAP}"
            ))
        })
}

/// A deadline the job can meet: after its `runAt`. Whether it is still in the future
/// is the service's to say ([`past_deadline`]), after it has looked for the job a
/// retry of the same request names: a retry sent after the deadline passed must find
/// the job the first try created, not a refusal.
pub fn parse_deadline(deadline: Timestamp, run_at: Option<Timestamp>) -> Result<(), ServiceError> {
    if run_at.is_some_and(|run_at| deadline <= run_at) {
        return Err(ServiceError::validation("deadline must be after runAt"));
    }
    Ok(())
}

/// The refusal of a new job or batch whose named deadline is not in the future.
pub fn past_deadline() -> ServiceError {
    ServiceError::validation("deadline must be in the future")
}

/// `maxAttempts`: 1 to [`MAX_ATTEMPTS_CAP`], [`DEFAULT_MAX_ATTEMPTS`] when not given.
pub fn parse_max_attempts(attempts: Option<i32>) -> Result<u32, ServiceError> {
    match attempts {
        None => Ok(DEFAULT_MAX_ATTEMPTS),
        Some(attempts) => u32::try_from(attempts)
            .ok()
            .filter(|attempts| (1..=MAX_ATTEMPTS_CAP).contains(attempts))
            .ok_or_else(|| {
                ServiceError::validation(format!("maxAttempts must be 1 to {MAX_ATTEMPTS_CAP}"))
            }),
    }
}

/// A response schema: a JSON object within the size and depth limits that compiles
/// as a JSON Schema. Refused now rather than after a paid call: a schema that does not
/// compile could never accept a reply. Remote `$ref`s do not resolve (no fetching).
pub fn check_response_schema(schema: &Value) -> Result<(), ServiceError> {
    if !schema.is_object() {
        return Err(ServiceError::validation(
            "responseSchema must be a JSON object",
        ));
    }
    check_json("responseSchema", schema)?;
    jsonschema::meta::validate(schema)
        .map_err(|error| error.to_string())
        .and_then(|()| {
            jsonschema::validator_for(schema)
                .map(drop)
                .map_err(|error| error.to_string())
        })
        .map_err(|error| {
            ServiceError::validation(format!(
                "responseSchema is not a valid JSON Schema: {error}"
            ))
        })
}

/// Refuses free JSON input nested deeper than [`MAX_JSON_DEPTH`] or larger than
/// [`MAX_JSON_BYTES`] once serialized.
pub fn check_json(field: &str, value: &Value) -> Result<(), ServiceError> {
    if nesting_depth(value, MAX_JSON_DEPTH) > MAX_JSON_DEPTH {
        return Err(ServiceError::validation(format!(
            "{field} nests arrays and objects more than {MAX_JSON_DEPTH} levels deep; at most {MAX_JSON_DEPTH} are accepted"
        )));
    }
    let size = value.to_string().len();
    if size > MAX_JSON_BYTES {
        return Err(ServiceError::validation(format!(
            "{field} is {size} bytes; at most {MAX_JSON_BYTES} are accepted"
        )));
    }
    Ok(())
}

/// How deeply `value` nests arrays and objects (a scalar is 0, `{"a": 1}` is 1),
/// counted up to `limit + 1` only: enough to tell that a value is over the limit
/// without walking all of it. A loop, not recursion, whatever the client sent.
fn nesting_depth(value: &Value, limit: usize) -> usize {
    let mut deepest = 0;
    let mut pending = vec![(value, 0)];
    while let Some((value, depth)) = pending.pop() {
        let children: Box<dyn Iterator<Item = &Value>> = match value {
            Value::Array(items) => Box::new(items.iter()),
            Value::Object(map) => Box::new(map.values()),
            _ => continue,
        };
        let depth = depth + 1;
        deepest = deepest.max(depth);
        if deepest > limit {
            break;
        }
        pending.extend(children.map(|child| (child, depth)));
    }
    deepest
}

/// JSON with object keys sorted at every level, whatever order the client sent.
fn write_canonical(value: &Value, out: &mut String) {
    match value {
        Value::Object(map) => {
            let mut entries: Vec<_> = map.iter().collect();
            entries.sort_by_key(|(key, _)| *key);
            out.push('{');
            for (index, (key, item)) in entries.into_iter().enumerate() {
                if index > 0 {
                    out.push(',');
                }
                out.push_str(&Value::String(key.clone()).to_string());
                out.push(':');
                write_canonical(item, out);
            }
            out.push('}');
        }
        Value::Array(items) => {
            out.push('[');
            for (index, item) in items.iter().enumerate() {
                if index > 0 {
                    out.push(',');
                }
                write_canonical(item, out);
            }
            out.push(']');
        }
        scalar => out.push_str(&scalar.to_string()),
    }
}

#[cfg(test)]
mod tests;
