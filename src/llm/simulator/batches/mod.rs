//! The providers' batch APIs: OpenAI Batch (`/v1/files`, `/v1/batches`) and
//! Anthropic Message Batches (`/v1/messages/batches`), and `/_mock/batches`.
//!
//! # Life of a batch
//!
//! A batch is accepted whole or refused whole: every request in it must be a
//! request its single-call endpoint would accept. It then stays in progress
//! until the simulator's batch delay (`mock-llm --batch-delay-ms`) has passed
//! since its creation, and ends with every request decided at once, in input
//! order. Each request follows its own directives, as a single call of the
//! same content would, and is answered and counted by the same code
//! ([`super::exchange::plan`]):
//!
//! * `status=CODE` (and `fail_first`, which shares its counters with single
//!   calls): an errored result carrying the provider's error body; logged as
//!   a call with that status, not billed;
//! * `batch_expire`: expired, neither processed nor logged nor billed, in the
//!   first batch that holds this content (model and texts); every later batch
//!   processes it. `DELETE /_mock/calls` forgets such content, as it resets
//!   `fail_first`;
//! * anything else: succeeded, logged as a billed call with status 200.
//!   `delay_ms`, `hang` and `drop` have no meaning without a connection and
//!   are ignored here.
//!
//! Every logged request has `batch_id` set. A cancel answers with the batch
//! cancelling; from the next read on it has ended with nothing processed
//! (the simulator decides all requests at the end, so nothing was before).
//! A batch past its end is decided on the next read of anything (a batch,
//! a list, results, `/_mock/calls`) or by its own timer, whichever comes first.
//!
//! # Bounds
//!
//! Everything is held in memory for the life of the process, so sizes are
//! bounded below the providers' own limits: an OpenAI input file holds at most
//! [`OPENAI_FILE_REQUESTS`] requests (OpenAI's own count) in
//! [`OPENAI_FILE_BYTES`] (OpenAI allows 200 MB), an Anthropic batch at most
//! [`ANTHROPIC_BATCH_REQUESTS`] requests (Anthropic's count) in
//! [`ANTHROPIC_BATCH_BYTES`] (Anthropic allows 256 MB), and the simulator holds
//! at most [`STORE_BYTES`] of inputs and results altogether: past that a new
//! upload or batch is refused with 429 until `DELETE /_mock/batches` clears the
//! store. Bodies are read with the limit in force, never whole beyond it: over
//! the bytes bound is 413, over the count 400, in the provider's error shape.

mod anthropic;
mod openai;

use std::collections::{HashMap, HashSet};
use std::mem;
use std::sync::{MutexGuard, PoisonError};
use std::time::Instant;

use axum::Json;
use axum::Router;
use axum::body::Bytes;
use axum::extract::State;
use axum::http::StatusCode;
use axum::response::Response;
use axum::routing::get;
use chrono::{DateTime, Utc};
use serde::Serialize;
use serde_json::Value;
use uuid::Uuid;

use super::exchange::{self, Completion, Dialect, Fault, Prompt, content_key, fault_message};
use super::{Charge, Simulator, logged_request};

/// Requests in one OpenAI batch input file: OpenAI's own limit.
pub const OPENAI_FILE_REQUESTS: usize = 50_000;
/// Bytes of one OpenAI batch input file (OpenAI: 200 MB).
pub const OPENAI_FILE_BYTES: usize = 64 * 1024 * 1024;
/// Requests in one Anthropic message batch: Anthropic's own limit.
pub const ANTHROPIC_BATCH_REQUESTS: usize = 100_000;
/// Bytes of one Anthropic batch creation body (Anthropic: 256 MB).
pub const ANTHROPIC_BATCH_BYTES: usize = 64 * 1024 * 1024;
/// Input files, batch requests and results the simulator holds at once.
pub const STORE_BYTES: usize = 512 * 1024 * 1024;

/// Which provider's batch API a batch came through.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Api {
    OpenAi,
    Anthropic,
}

impl Api {
    fn name(self) -> &'static str {
        match self {
            Self::OpenAi => "openai",
            Self::Anthropic => "anthropic",
        }
    }

    /// How the single-call endpoint reads a request body.
    fn prompt(self, body: &[u8]) -> Result<Prompt, serde_json::Error> {
        match self {
            Self::OpenAi => super::openai::prompt_of(body),
            Self::Anthropic => super::anthropic::prompt_of(body),
        }
    }

    fn new_request_id(self) -> String {
        let id = Uuid::new_v4().simple();
        match self {
            Self::OpenAi => format!("chatcmpl-{id}"),
            Self::Anthropic => format!("msg_{id}"),
        }
    }

    /// The body a single call would have answered.
    fn answer(self, completion: &Completion) -> Value {
        match self {
            Self::OpenAi => super::openai::whole(completion),
            Self::Anthropic => super::anthropic::whole(completion),
        }
    }

    fn error_body(self, status: StatusCode, message: &str, request_id: &str) -> Value {
        match self {
            Self::OpenAi => super::openai::OpenAi::error_body(status, message, request_id),
            Self::Anthropic => super::anthropic::Anthropic::error_body(status, message, request_id),
        }
    }
}

/// The simulator's files and batches.
#[derive(Default)]
pub(super) struct Store {
    files: HashMap<String, File>,
    /// In creation order.
    batches: Vec<Batch>,
    /// Bytes of inputs and results held, against [`STORE_BYTES`].
    held_bytes: usize,
    /// Content (see [`content_key`]) a batch already let expire.
    expired_content: HashSet<String>,
}

/// An OpenAI file: an uploaded batch input, or a batch's output or error file.
struct File {
    id: String,
    filename: String,
    purpose: &'static str,
    created_at: DateTime<Utc>,
    bytes: Bytes,
}

/// One request of a batch, as accepted.
struct Request {
    custom_id: String,
    /// The body its single-call endpoint would receive.
    body: Vec<u8>,
}

/// What became of one request.
enum Outcome {
    /// The single call's answer body.
    Succeeded {
        request_id: String,
        body: Value,
    },
    /// The provider's error body.
    Errored {
        status: StatusCode,
        request_id: String,
        body: Value,
    },
    Expired,
    Cancelled,
}

/// OpenAI's parts of a batch.
struct OpenAiParts {
    input_file_id: String,
    endpoint: String,
    completion_window: String,
    output_file_id: Option<String>,
    error_file_id: Option<String>,
}

struct Batch {
    id: String,
    api: Api,
    created_at: DateTime<Utc>,
    /// When it ends unless cancelled first.
    ends: Instant,
    metadata: Value,
    total: usize,
    /// Emptied once decided.
    requests: Vec<Request>,
    cancel_requested_at: Option<DateTime<Utc>>,
    ended_at: Option<DateTime<Utc>>,
    /// By custom id, in input order; filled when it ends.
    results: Vec<(String, Outcome)>,
    openai: Option<OpenAiParts>,
}

/// Where a batch is in its life.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Phase {
    InProgress,
    Cancelling,
    Ended,
}

/// Results by kind.
#[derive(Clone, Copy, Debug, Default)]
struct Counts {
    succeeded: usize,
    errored: usize,
    expired: usize,
    cancelled: usize,
}

impl Batch {
    fn phase(&self) -> Phase {
        match (self.ended_at, self.cancel_requested_at) {
            (Some(_), _) => Phase::Ended,
            (None, Some(_)) => Phase::Cancelling,
            (None, None) => Phase::InProgress,
        }
    }

    fn counts(&self) -> Counts {
        let mut counts = Counts::default();
        for (_, outcome) in &self.results {
            match outcome {
                Outcome::Succeeded { .. } => counts.succeeded += 1,
                Outcome::Errored { .. } => counts.errored += 1,
                Outcome::Expired => counts.expired += 1,
                Outcome::Cancelled => counts.cancelled += 1,
            }
        }
        counts
    }

    /// The status its provider would report.
    fn status(&self) -> &'static str {
        match self.api {
            Api::OpenAi => openai::status(self),
            Api::Anthropic => anthropic::status(self),
        }
    }

    fn request_bytes(&self) -> usize {
        self.requests.iter().map(|request| request.body.len()).sum()
    }
}

/// Why a batch or file was not taken in.
#[derive(Debug)]
enum Refusal {
    /// The store holds [`STORE_BYTES`] already.
    Full,
}

impl Refusal {
    fn status(&self) -> StatusCode {
        match self {
            Self::Full => StatusCode::TOO_MANY_REQUESTS,
        }
    }

    fn message(&self) -> String {
        match self {
            Self::Full => format!(
                "the simulator holds {STORE_BYTES} bytes of batches already: DELETE /_mock/batches"
            ),
        }
    }
}

/// Newest first, `limit` at most, starting after the object `after` (its id), or
/// ending just before `before`; and whether more follow.
fn page<'a, T>(
    newest_first: Vec<&'a T>,
    id: impl Fn(&T) -> &str,
    limit: usize,
    after: Option<&str>,
    before: Option<&str>,
) -> (Vec<&'a T>, bool) {
    let position = |cursor: &str| newest_first.iter().position(|item| id(item) == cursor);
    if let Some(before) = before {
        let end = position(before).unwrap_or(0);
        let start = end.saturating_sub(limit);
        return (newest_first[start..end].to_vec(), start > 0);
    }
    let start = after.map_or(0, |after| {
        position(after).map_or(newest_first.len(), |at| at + 1)
    });
    let end = (start + limit).min(newest_first.len());
    (newest_first[start..end].to_vec(), end < newest_first.len())
}

/// A list's `limit`: 1 to 100, 20 when not given (both providers').
fn page_size(limit: Option<usize>) -> usize {
    limit.unwrap_or(20).clamp(1, 100)
}

impl Simulator {
    fn store(&self) -> MutexGuard<'_, Store> {
        // Every mutation below leaves the store consistent at each step that can panic.
        self.batches.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Forgets which content already expired in a batch.
    pub(super) fn forget_expired_content(&self) {
        self.store().expired_content.clear();
    }

    /// Takes in a batch and starts its clock; its id.
    fn create_batch(
        &self,
        api: Api,
        requests: Vec<Request>,
        metadata: Value,
        openai: Option<OpenAiParts>,
    ) -> Result<String, Refusal> {
        let id = match api {
            Api::OpenAi => format!("batch_{}", Uuid::new_v4().simple()),
            Api::Anthropic => format!("msgbatch_{}", Uuid::new_v4().simple()),
        };
        let batch = Batch {
            id: id.clone(),
            api,
            created_at: Utc::now(),
            ends: Instant::now() + self.batch_delay,
            metadata,
            total: requests.len(),
            requests,
            cancel_requested_at: None,
            ended_at: None,
            results: Vec::new(),
            openai,
        };
        {
            let mut store = self.store();
            let bytes = batch.request_bytes();
            if store.held_bytes + bytes > STORE_BYTES {
                return Err(Refusal::Full);
            }
            store.held_bytes += bytes;
            store.batches.push(batch);
        }
        tracing::debug!(batch.id = %id, api = api.name(), "mock provider: batch created");
        let sim = self.clone();
        let delay = self.batch_delay;
        tokio::spawn(async move {
            tokio::time::sleep(delay).await;
            sim.advance_batches();
        });
        Ok(id)
    }

    /// Stores an OpenAI file; its id.
    fn store_file(
        &self,
        filename: String,
        purpose: &'static str,
        bytes: Bytes,
    ) -> Result<String, Refusal> {
        let mut store = self.store();
        if purpose == "batch" && store.held_bytes + bytes.len() > STORE_BYTES {
            return Err(Refusal::Full);
        }
        Ok(store.add_file(filename, purpose, bytes))
    }

    /// Decides every batch that is past its end or was cancelled.
    pub(super) fn advance_batches(&self) {
        let now = Instant::now();
        let mut store = self.store();
        for index in 0..store.batches.len() {
            let batch = &store.batches[index];
            match batch.phase() {
                Phase::Ended => {}
                Phase::Cancelling => store.cancel(index),
                Phase::InProgress if now >= batch.ends => self.process(&mut store, index),
                Phase::InProgress => {}
            }
        }
    }

    /// Runs every request of the batch at `index` and ends it.
    fn process(&self, store: &mut Store, index: usize) {
        let batch = &mut store.batches[index];
        let requests = mem::take(&mut batch.requests);
        let (api, batch_id) = (batch.api, batch.id.clone());
        let prompts: Vec<_> = requests
            .iter()
            .map(|request| api.prompt(&request.body))
            .collect();
        let keys: Vec<Option<String>> = prompts
            .iter()
            .map(|prompt| {
                let prompt = prompt.as_ref().ok()?;
                exchange::expires_in_batch(prompt)
                    .then(|| content_key(&prompt.model, &prompt.texts))
            })
            .collect();
        // Content expires in the first batch that holds it: all of its requests there.
        let expiring: HashSet<String> = keys
            .iter()
            .flatten()
            .filter(|key| !store.expired_content.contains(*key))
            .cloned()
            .collect();
        let mut results = Vec::with_capacity(requests.len());
        for ((request, prompt), key) in requests.iter().zip(prompts).zip(&keys) {
            let outcome = match prompt {
                _ if key.as_ref().is_some_and(|key| expiring.contains(key)) => Outcome::Expired,
                Ok(prompt) => self.run(api, &batch_id, &request.body, prompt),
                // Checked when the batch was taken in; kept total rather than trusted.
                Err(error) => {
                    let request_id = api.new_request_id();
                    let message = format!("invalid request body: {error}");
                    Outcome::Errored {
                        status: StatusCode::BAD_REQUEST,
                        body: api.error_body(StatusCode::BAD_REQUEST, &message, &request_id),
                        request_id,
                    }
                }
            };
            results.push((request.custom_id.clone(), outcome));
        }
        store.expired_content.extend(expiring);
        let freed: usize = requests.iter().map(|request| request.body.len()).sum();
        store.held_bytes = store.held_bytes.saturating_sub(freed);
        let batch = &mut store.batches[index];
        batch.results = results;
        batch.ended_at = Some(Utc::now());
        if api == Api::OpenAi {
            openai::write_result_files(store, index);
        }
    }

    /// One request of a batch, answered and logged as a single call would be.
    fn run(&self, api: Api, batch_id: &str, body: &[u8], prompt: Prompt) -> Outcome {
        let plan = exchange::plan(self, api.new_request_id(), prompt);
        let completion = plan.completion;
        let slot = self.open_call(
            &completion.request_id,
            &completion.model,
            completion.input_tokens,
            logged_request(body),
            Some(batch_id),
            Charge::FREE,
        );
        match plan.fault {
            Some(Fault::Status(status)) => {
                slot.settle(status.as_u16(), Charge::FREE);
                let body = api.error_body(status, &fault_message(status), &completion.request_id);
                Outcome::Errored {
                    status,
                    request_id: completion.request_id,
                    body,
                }
            }
            // No connection to hang or cut: the request is simply processed.
            None | Some(Fault::Drop | Fault::Hang) => {
                slot.settle(200, Charge::billed(completion.output_tokens));
                Outcome::Succeeded {
                    body: api.answer(&completion),
                    request_id: completion.request_id,
                }
            }
        }
    }
}

impl Store {
    fn add_file(&mut self, filename: String, purpose: &'static str, bytes: Bytes) -> String {
        let id = format!("file-{}", Uuid::new_v4().simple());
        self.held_bytes += bytes.len();
        self.files.insert(
            id.clone(),
            File {
                id: id.clone(),
                filename,
                purpose,
                created_at: Utc::now(),
                bytes,
            },
        );
        id
    }

    /// Ends the cancelled batch at `index` with every request cancelled.
    fn cancel(&mut self, index: usize) {
        let batch = &mut self.batches[index];
        let freed = batch.request_bytes();
        let requests = mem::take(&mut batch.requests);
        batch.results = requests
            .into_iter()
            .map(|request| (request.custom_id, Outcome::Cancelled))
            .collect();
        batch.ended_at = Some(Utc::now());
        let api = batch.api;
        self.held_bytes = self.held_bytes.saturating_sub(freed);
        if api == Api::OpenAi {
            openai::write_result_files(self, index);
        }
    }

    fn batch(&self, api: Api, id: &str) -> Option<&Batch> {
        self.batches
            .iter()
            .find(|batch| batch.api == api && batch.id == id)
    }

    fn batch_mut(&mut self, api: Api, id: &str) -> Option<&mut Batch> {
        self.batches
            .iter_mut()
            .find(|batch| batch.api == api && batch.id == id)
    }

    /// The batches of `api`, newest first.
    fn newest_first(&self, api: Api) -> Vec<&Batch> {
        self.batches
            .iter()
            .rev()
            .filter(|batch| batch.api == api)
            .collect()
    }
}

/// A batch as `GET /_mock/batches` lists it.
#[derive(Serialize)]
struct ListedBatch<'a> {
    id: &'a str,
    provider: &'static str,
    requests: usize,
    status: &'static str,
    created_at: DateTime<Utc>,
    metadata: &'a Value,
}

async fn list_batches(State(sim): State<Simulator>) -> Json<Value> {
    sim.advance_batches();
    let store = sim.store();
    let listed: Vec<ListedBatch<'_>> = store
        .batches
        .iter()
        .map(|batch| ListedBatch {
            id: &batch.id,
            provider: batch.api.name(),
            requests: batch.total,
            status: batch.status(),
            created_at: batch.created_at,
            metadata: &batch.metadata,
        })
        .collect();
    Json(serde_json::to_value(listed).expect("batches serialize"))
}

async fn clear_batches(State(sim): State<Simulator>) -> StatusCode {
    let mut store = sim.store();
    store.batches.clear();
    store.files.clear();
    store.held_bytes = 0;
    StatusCode::NO_CONTENT
}

/// An error answer of `D`'s shape with a fresh request id.
fn refuse<D: Dialect>(status: StatusCode, message: &str) -> Response {
    let request_id = format!("req_{}", Uuid::new_v4().simple());
    exchange::error_response::<D>(status, message, &request_id, None)
}

/// The batch endpoints of both providers and `/_mock/batches`.
pub(super) fn router() -> Router<Simulator> {
    Router::new()
        .route("/_mock/batches", get(list_batches).delete(clear_batches))
        .merge(openai::router())
        .merge(anthropic::router())
}

#[cfg(test)]
mod tests {
    use super::*;

    struct Item(&'static str);

    fn id(item: &Item) -> &str {
        item.0
    }

    fn ids(items: &[&Item]) -> Vec<&'static str> {
        items.iter().map(|item| item.0).collect()
    }

    #[test]
    fn pages_run_newest_first_from_either_cursor() {
        let items = [Item("e"), Item("d"), Item("c"), Item("b"), Item("a")];
        let all: Vec<&Item> = items.iter().collect();
        let (first, more) = page(all.clone(), id, 2, None, None);
        assert_eq!((ids(&first), more), (vec!["e", "d"], true));
        let (next, more) = page(all.clone(), id, 2, Some("d"), None);
        assert_eq!((ids(&next), more), (vec!["c", "b"], true));
        let (last, more) = page(all.clone(), id, 2, Some("b"), None);
        assert_eq!((ids(&last), more), (vec!["a"], false));
        let (back, more) = page(all.clone(), id, 2, None, Some("c"));
        assert_eq!((ids(&back), more), (vec!["e", "d"], false));
        let (unknown, more) = page(all, id, 2, Some("zz"), None);
        assert_eq!((ids(&unknown), more), (Vec::<&str>::new(), false));
    }
}
