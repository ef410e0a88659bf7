//! The response limit: the values a request resolves are measured as they are
//! produced, and resolving stops once they would pass it.

use crate::graphql::ApiErrorCode;
use async_graphql::{ServerError, Value};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};

/// The largest response body sent: past it the response is replaced by a
/// `RESPONSE_TOO_LARGE` error.
pub const MAX_RESPONSE_BYTES: usize = 32 * 1024 * 1024;

/// One request's execution, as the HTTP layer needs to know it: whether execution
/// started (everything before it — parsing, validation, variables — answers 4xx under
/// `application/graphql-response+json`), and the bytes of the values resolved so far.
#[derive(Debug)]
pub struct ResponseMeter {
    limit: usize,
    started: AtomicBool,
    bytes: AtomicUsize,
    exceeded: AtomicBool,
}

impl ResponseMeter {
    /// A meter that stops resolving once the values pass `limit` bytes.
    pub fn new(limit: usize) -> Arc<Self> {
        Arc::new(Self {
            limit,
            started: AtomicBool::new(false),
            bytes: AtomicUsize::new(0),
            exceeded: AtomicBool::new(false),
        })
    }

    /// Whether validation passed and resolvers started to run.
    pub fn started(&self) -> bool {
        self.started.load(Ordering::Relaxed)
    }

    /// Whether the response passed the limit, so that resolving stopped.
    pub fn exceeded(&self) -> bool {
        self.exceeded.load(Ordering::Relaxed)
    }

    /// The error that replaces a response past the limit.
    pub fn error(&self) -> ServerError {
        ApiErrorCode::ResponseTooLarge.request_error(format!(
            "the response would be larger than {} bytes: select fewer fields or smaller pages",
            self.limit
        ))
    }

    /// Records that validation passed and resolvers start to run.
    pub(super) fn mark_started(&self) {
        self.started.store(true, Ordering::Relaxed);
    }

    /// Adds a resolved leaf `value` under a key of `key_bytes`, with its punctuation;
    /// false once the total passes the limit.
    pub(super) fn charge_leaf(&self, key_bytes: usize, value: &Value) -> bool {
        // `"key":value,`
        self.charge(key_bytes + 4 + serialized_len(value))
    }

    /// Adds `bytes`; false once the total passes the limit.
    fn charge(&self, bytes: usize) -> bool {
        let total = self
            .bytes
            .fetch_add(bytes, Ordering::Relaxed)
            .saturating_add(bytes);
        if total > self.limit {
            self.exceeded.store(true, Ordering::Relaxed);
            return false;
        }
        true
    }
}

/// The bytes `value` takes as JSON, counted without keeping them.
fn serialized_len(value: &Value) -> usize {
    struct Counter(usize);
    impl std::io::Write for Counter {
        fn write(&mut self, bytes: &[u8]) -> std::io::Result<usize> {
            self.0 += bytes.len();
            Ok(bytes.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }
    let mut counter = Counter(0);
    // Writing into a counter cannot fail, and a resolved value always serializes.
    let _ = serde_json::to_writer(&mut counter, value);
    counter.0
}
