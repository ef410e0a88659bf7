//! Provider simulator: an OpenAI- and Anthropic-compatible HTTP server for
//! demos and tests, with fault injection.
//!
//! # Endpoints
//!
//! * `POST /v1/chat/completions`: OpenAI chat completions, plain or streamed
//!   (`stream`, `stream_options.include_usage`). The request id is the
//!   `chatcmpl-…` id, also sent as `x-request-id`.
//! * `POST /v1/messages`: Anthropic messages, plain or streamed. The request
//!   id is the `msg_…` id, also sent as `request-id`.
//! * The providers' batch APIs, OpenAI's (`/v1/files`, `/v1/batches`) and
//!   Anthropic's (`/v1/messages/batches`): see the `batches` module for their
//!   life, directives (`batch_expire`) and bounds. A batch ends
//!   [`Simulator::with_batch_delay`] after its creation (default
//!   [`DEFAULT_BATCH_DELAY`]).
//! * `GET /_mock/calls`: the call log ([`CallRecord`]s in arrival order; a
//!   batch's requests carry its `batch_id`).
//! * `DELETE /_mock/calls`: clears the log, the `fail_first` counters and the
//!   content `batch_expire` already expired, 204.
//! * `GET /_mock/batches`: every batch created, oldest first (`id`, `provider`,
//!   `requests`, `status` as its provider reports it, `created_at`,
//!   `metadata`); `DELETE /_mock/batches` drops batches and files, 204.
//!
//! Every answer, errors included, carries a fresh request id, and that id is
//! the `request_id` of its [`CallRecord`]. Errors use the endpoint's own
//! error shape: `{"error":{"message","type",..}}` for OpenAI,
//! `{"type":"error","error":{"type","message"}}` for Anthropic. That includes
//! the 400 for a body that is not valid JSON or misses a required field
//! (`model`, `messages`, and for Anthropic `max_tokens`).
//!
//! # Usage and reply
//!
//! Input tokens are `ceil(bytes / 4)` over the UTF-8 text of every message
//! (and the Anthropic `system` prompt), directives included, and the JSON of
//! the request's `tools`. The reply is
//! `Summary: <first 60 chars of the last user message, directives stripped>`,
//! or, when an OpenAI request asks for `response_format` `json_object`,
//! `{"summary": <same 60 chars>}`, and for `json_schema` a minimal instance
//! of the schema whose strings hold those 60 chars. The reply is cut (on a
//! char boundary) to `4 * max_tokens` bytes so output tokens,
//! `ceil(bytes / 4)`, never exceed `max_tokens`; a cut reply ends with
//! `finish_reason: "length"` / `stop_reason: "max_tokens"` as a real
//! provider's would, otherwise `"stop"` / `"end_turn"`.
//!
//! # Directives
//!
//! `[mock:...]` anywhere in any message (or system) text; several combine,
//! a repeated one keeps its last value, unknown ones are ignored. When
//! several faults are asked for, `hang` beats `drop`, which beats `status`.
//!
//! * `delay_ms=N`: wait N ms before answering. For streams the whole delay
//!   comes before the first byte (status line included); the chunks then
//!   follow at once, unless `chunk_delay_ms` is given.
//! * `chunk_delay_ms=N`: in a streamed answer, wait N ms before each chunk, as
//!   a model generating token by token would.
//! * `status=CODE`: answer with that 4xx/5xx status (other codes are
//!   ignored) and a provider-shaped error body.
//! * `retry_after=S`: add `Retry-After: S` to an error status answer.
//! * `fail_first=N`: the fault (the status, or `drop`/`hang` if given; 500
//!   when none is) hits only the first N calls with the same model and full
//!   message text; later ones succeed.
//! * `hang`: read the request and never answer. The connection stays open
//!   until the client leaves or [`Simulator::serve`] shuts down (which then
//!   closes it without an answer, so shutdown never waits on a hang).
//! * `drop`: read and bill the request, then close the TCP connection without
//!   sending a single response byte. This needs [`Simulator::serve`], which
//!   can reach the socket; on a router mounted elsewhere it answers 500 with
//!   a message saying so.
//! * `reply=TEXT`: answer TEXT, up to the `]` that closes the directive;
//!   nested brackets and JSON strings are skipped, so TEXT may be JSON.
//! * `invalid_json`: answer `this is not JSON {` (takes precedence over
//!   `reply`).
//! * `tool_call=NAME`: answer with one call of tool NAME (OpenAI `tool_calls`
//!   with `finish_reason: "tool_calls"`, Anthropic a `tool_use` block with
//!   `stop_reason: "tool_use"`; streamed as each provider streams calls) whose
//!   arguments are the `reply` text, or `{}`. The arguments are the output:
//!   cut and counted as a reply is. The tool need not be one the request
//!   offered. Arguments that are not a JSON object reach Anthropic clients as
//!   a JSON string `input`.
//! * `fail_model=NAME`: the faults above (`status`, `fail_first`, `hang`,
//!   `drop`) hit only calls for model NAME; other models answer normally, so
//!   a job's fallback models can be tried.
//!
//! # Call log and billing
//!
//! A [`CallRecord`] is appended as soon as a request is read (a hang shows
//! up at once with `status: 0`) and updated when its outcome is known. Its
//! `request` is the body as received; bodies over 64 KiB are logged as their
//! size, and once the bodies kept pass 16 MiB the oldest are too (the records
//! stay).
//! `status` is the HTTP status answered, `0` when none was (hang, drop, or a
//! client that left during a delay). `billed` follows what a real provider
//! charges: work it started. It is true for 200s, for `drop`, and for a hang
//! or delay the client walked away from; false for error statuses, including
//! a delayed error whose client left early. Billed records carry the reply's
//! output tokens, unbilled ones zero; `input_tokens` is always the request's.

mod anthropic;
mod batches;
mod conn;
mod directives;
mod exchange;
mod openai;

use std::collections::HashMap;
use std::future::Future;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use axum::Json;
use axum::Router;
use axum::extract::{DefaultBodyLimit, State};
use axum::http::StatusCode;
use axum::routing::{get, post};
use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use tokio::net::TcpListener;
use tokio::sync::watch;

use conn::{ConnHandle, SimListener};

/// How long a batch takes unless told otherwise (`mock-llm --batch-delay-ms`).
pub const DEFAULT_BATCH_DELAY: Duration = Duration::from_millis(1000);

/// Shared state: the log of calls, the fail_first counters and the batches.
///
/// Clones share the same state, so a test can keep one to inspect the log
/// while another serves.
#[derive(Clone)]
pub struct Simulator {
    ledger: Arc<Mutex<Ledger>>,
    batches: Arc<Mutex<batches::Store>>,
    /// From a batch's creation to its end.
    batch_delay: Duration,
}

impl Default for Simulator {
    fn default() -> Self {
        Self {
            ledger: Arc::default(),
            batches: Arc::default(),
            batch_delay: DEFAULT_BATCH_DELAY,
        }
    }
}

#[derive(Default)]
struct Ledger {
    calls: Vec<CallRecord>,
    /// Bumped by every clear, so a request still in flight across a clear
    /// cannot overwrite a newer request's record at its old index.
    epoch: u64,
    /// Calls seen per `fail_first` key.
    attempts: HashMap<String, u64>,
    /// Serialized bytes of the bodies the log still holds whole, and the index of the
    /// oldest record that may hold one (see [`LOGGED_BODIES_BYTES`]).
    kept_body_bytes: usize,
    oldest_kept_body: usize,
}

impl Ledger {
    /// Appends `record`; while the bodies kept whole take more than `budget` bytes,
    /// the oldest are replaced by their size, newest kept, so that a simulator that
    /// serves for days stays small.
    fn push(&mut self, record: CallRecord, budget: usize) {
        self.kept_body_bytes += body_bytes(&record.request);
        self.calls.push(record);
        while self.kept_body_bytes > budget && self.oldest_kept_body + 1 < self.calls.len() {
            let oldest = &mut self.calls[self.oldest_kept_body];
            let size = body_bytes(&oldest.request);
            if size > 0 {
                oldest.request = serde_json::json!({"omittedBytes": size});
                self.kept_body_bytes -= size;
            }
            self.oldest_kept_body += 1;
        }
    }

    fn clear(&mut self) {
        self.calls.clear();
        self.attempts.clear();
        self.kept_body_bytes = 0;
        self.oldest_kept_body = 0;
        self.epoch += 1;
    }
}

/// The bytes a logged body counts against [`LOGGED_BODIES_BYTES`]: none for the
/// small stand-ins of bodies not kept.
fn body_bytes(request: &serde_json::Value) -> usize {
    match request {
        serde_json::Value::Null => 0,
        request
            if request.get("omittedBytes").is_some()
                && request.as_object().is_some_and(|o| o.len() == 1) =>
        {
            0
        }
        request => request.to_string().len(),
    }
}

/// One request received by the simulator, as listed by `GET /_mock/calls`.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct CallRecord {
    /// The id returned in the body and the request id header.
    pub request_id: String,
    /// The model the request named (empty when the body did not say).
    pub model: String,
    /// When the request had been read.
    pub received_at: DateTime<Utc>,
    /// The HTTP status answered, or 0 while pending or when nothing was answered.
    pub status: u16,
    /// Whether a real provider would charge for this call.
    pub billed: bool,
    /// Prompt tokens of the request.
    pub input_tokens: u64,
    /// Completion tokens charged (0 unless billed).
    pub output_tokens: u64,
    /// The body as received, so that a test can see what a client sent (parameters,
    /// tools, parts); `null` when it was not JSON. A body over [`LOGGED_BODY_BYTES`]
    /// is logged as `{"omittedBytes": n}`, and so are the oldest once the bodies kept
    /// pass [`LOGGED_BODIES_BYTES`]: the log lives as long as the process.
    pub request: serde_json::Value,
    /// The simulator's id of the batch this request came in; `None` for a single call.
    #[serde(default)]
    pub batch_id: Option<String>,
}

/// The largest request body the call log keeps whole.
const LOGGED_BODY_BYTES: usize = 64 * 1024;
/// The most bytes of bodies the call log keeps whole in all: the newest 256 of the
/// largest, and many more of ordinary ones.
const LOGGED_BODIES_BYTES: usize = 16 * 1024 * 1024;

/// `body` as the call log keeps it (see [`CallRecord::request`]).
fn logged_request(body: &[u8]) -> serde_json::Value {
    if body.len() > LOGGED_BODY_BYTES {
        return serde_json::json!({"omittedBytes": body.len()});
    }
    serde_json::from_slice(body).unwrap_or(serde_json::Value::Null)
}

impl Simulator {
    /// A simulator with an empty call log.
    pub fn new() -> Self {
        Self::default()
    }

    /// The same simulator whose batches end `delay` after they were created.
    pub fn with_batch_delay(mut self, delay: Duration) -> Self {
        self.batch_delay = delay;
        self
    }

    /// The axum router serving every endpoint below.
    pub fn router(&self) -> Router {
        Router::new()
            .route("/v1/chat/completions", post(openai::chat_completions))
            .route("/v1/messages", post(anthropic::messages))
            .route("/_mock/calls", get(list_calls).delete(clear_calls))
            .merge(batches::router())
            // axum's 2 MB default would turn long prompts into a bare 413
            // that no real provider sends; 32 MB is Anthropic's own limit.
            .layer(DefaultBodyLimit::max(32 * 1024 * 1024))
            .with_state(self.clone())
    }

    /// Serve on an already-bound listener until `shutdown` resolves.
    ///
    /// Shutdown is graceful for ordinary requests; hung ones are cut off.
    pub async fn serve(
        self,
        listener: TcpListener,
        shutdown: impl Future<Output = ()> + Send + 'static,
    ) -> std::io::Result<()> {
        let (stop_tx, stop_rx) = watch::channel(false);
        let app = self
            .router()
            .into_make_service_with_connect_info::<ConnHandle>();
        axum::serve(SimListener::new(listener, stop_rx), app)
            .with_graceful_shutdown(async move {
                shutdown.await;
                stop_tx.send_replace(true);
            })
            .await
    }

    /// Snapshot of the call log (same objects as GET /_mock/calls).
    pub fn calls(&self) -> Vec<CallRecord> {
        // A batch past its end shows its requests, whether or not anyone polled it.
        self.advance_batches();
        self.ledger().calls.clone()
    }

    fn ledger(&self) -> MutexGuard<'_, Ledger> {
        // The ledger stays consistent even if a holder panicked: every
        // mutation is a single push or field assignment.
        self.ledger.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Counts one more call for `key` and returns how many there have been.
    fn next_attempt(&self, key: &str) -> u64 {
        let mut ledger = self.ledger();
        let seen = ledger.attempts.entry(key.to_owned()).or_default();
        *seen += 1;
        *seen
    }

    /// Logs a request as received; the returned slot settles its outcome.
    ///
    /// `if_abandoned` is recorded, with status 0, should the request be
    /// dropped before it is settled.
    fn open_call(
        &self,
        request_id: &str,
        model: &str,
        input_tokens: u64,
        request: serde_json::Value,
        batch_id: Option<&str>,
        if_abandoned: Charge,
    ) -> CallSlot {
        let mut ledger = self.ledger();
        let record = CallRecord {
            request_id: request_id.to_owned(),
            model: model.to_owned(),
            received_at: Utc::now(),
            status: 0,
            billed: false,
            input_tokens,
            output_tokens: 0,
            request,
            batch_id: batch_id.map(str::to_owned),
        };
        ledger.push(record, LOGGED_BODIES_BYTES);
        CallSlot {
            sim: self.clone(),
            epoch: ledger.epoch,
            index: ledger.calls.len() - 1,
            if_abandoned: Some(if_abandoned),
        }
    }
}

/// What a call costs the client.
#[derive(Clone, Copy, Debug)]
struct Charge {
    billed: bool,
    output_tokens: u64,
}

impl Charge {
    const FREE: Self = Self {
        billed: false,
        output_tokens: 0,
    };

    fn billed(output_tokens: u64) -> Self {
        Self {
            billed: true,
            output_tokens,
        }
    }
}

/// A logged call whose outcome is not known yet.
///
/// Settling happens on drop too, because a request future is simply dropped
/// when its client goes away or its connection is cut.
struct CallSlot {
    sim: Simulator,
    epoch: u64,
    index: usize,
    /// `None` once settled.
    if_abandoned: Option<Charge>,
}

impl CallSlot {
    fn settle(mut self, status: u16, charge: Charge) {
        self.if_abandoned = None;
        self.write(status, charge);
    }

    fn write(&self, status: u16, charge: Charge) {
        let mut ledger = self.sim.ledger();
        if ledger.epoch != self.epoch {
            return;
        }
        if let Some(record) = ledger.calls.get_mut(self.index) {
            record.status = status;
            record.billed = charge.billed;
            record.output_tokens = charge.output_tokens;
        }
    }
}

impl Drop for CallSlot {
    fn drop(&mut self) {
        if let Some(charge) = self.if_abandoned.take() {
            self.write(0, charge);
        }
    }
}

async fn list_calls(State(sim): State<Simulator>) -> Json<Vec<CallRecord>> {
    Json(sim.calls())
}

async fn clear_calls(State(sim): State<Simulator>) -> StatusCode {
    sim.ledger().clear();
    // `batch_expire` remembers content as `fail_first` does: cleared alike.
    sim.forget_expired_content();
    StatusCode::NO_CONTENT
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn record(request: serde_json::Value) -> CallRecord {
        CallRecord {
            request_id: "r".into(),
            model: "m".into(),
            received_at: Utc::now(),
            status: 200,
            billed: true,
            input_tokens: 1,
            output_tokens: 1,
            request,
            batch_id: None,
        }
    }

    #[test]
    fn the_oldest_bodies_give_way_past_the_budget() {
        let body = json!({"model": "m", "messages": "x".repeat(90)});
        let size = body.to_string().len();
        let mut ledger = Ledger::default();
        for _ in 0..5 {
            ledger.push(record(body.clone()), 3 * size);
        }
        let kept: Vec<bool> = ledger
            .calls
            .iter()
            .map(|call| call.request == body)
            .collect();
        assert_eq!(kept, [false, false, true, true, true]);
        assert_eq!(ledger.calls[0].request, json!({"omittedBytes": size}));
        assert_eq!(ledger.kept_body_bytes, 3 * size);
        // The newest is kept whole even when it alone is over the budget.
        ledger.push(record(body.clone()), size / 2);
        assert_eq!(ledger.calls.last().unwrap().request, body);
        ledger.clear();
        assert_eq!((ledger.kept_body_bytes, ledger.oldest_kept_body), (0, 0));
    }
}
