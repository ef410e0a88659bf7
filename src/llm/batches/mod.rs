//! Providers' batch APIs — OpenAI Batch and Anthropic Message Batches — as one
//! interface: submit many requests at once, find a submission again after a crash,
//! read its state, cancel it, and stream its results line by line.
//!
//! Requests are named by custom ids the caller chooses (at most 64 characters of
//! `[A-Za-z0-9_-]`, Anthropic's rule), and every result line carries its custom id.

mod anthropic;
mod lines;
mod openai;

use super::{ChatRequest, Completion, ProviderError};
use chrono::{DateTime, Utc};
use std::collections::HashSet;
use uuid::Uuid;

pub use lines::ResultLines;

/// One request of a provider batch.
#[derive(Clone, Debug)]
pub struct BatchItem {
    pub custom_id: String,
    pub request: ChatRequest,
}

/// How much one provider batch may hold.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BatchLimits {
    pub requests: usize,
    /// Bytes of the upload (OpenAI: the input file; Anthropic: the creation body).
    pub bytes: usize,
}

/// Where the provider says a batch is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RemoteState {
    InProgress,
    Cancelling,
    /// Every request has its result (succeeded, errored, expired or cancelled).
    Ended,
}

/// A provider batch as its provider reports it.
#[derive(Clone, Debug)]
pub struct RemoteBatch {
    pub id: String,
    pub state: RemoteState,
    pub created_at: DateTime<Utc>,
    /// OpenAI: the id jobledger put in its metadata.
    pub ours: Option<Uuid>,
    /// Where its results are read from (OpenAI: the output and error files;
    /// Anthropic: the results URL).
    pub results: Vec<String>,
    /// Why the provider ended the batch without running it, when it did (OpenAI's
    /// `failed`: the input failed validation, or the account's enqueued-token limit
    /// was reached). Its requests have no results, and none was billed.
    pub refused: Option<String>,
}

/// What became of one request of a batch.
#[derive(Debug)]
pub enum ItemResult {
    /// Answered, with usage: billed at the batch price.
    Succeeded(Completion),
    /// The provider answered the request with an error: not billed.
    Errored(ProviderError),
    /// Not processed before the batch's window ended: not billed.
    Expired,
    /// Not processed because the batch was cancelled: not billed.
    Cancelled,
    /// A result we cannot read as any of the above (a result type the provider added
    /// since): it may have been billed, so it is an unknown outcome, bounded by the
    /// request's cost bound and reconcilable, never taken for "not billed".
    Unknown(String),
}

/// One line of a batch's results.
#[derive(Debug)]
pub struct ResultLine {
    pub custom_id: String,
    pub result: ItemResult,
}

/// What a search for an upload after a crash found.
#[derive(Clone, Debug)]
pub enum Found {
    /// The provider has the batch.
    Batch(RemoteBatch),
    /// OpenAI: the input file is there, the batch was never created from it.
    InputFile(String),
    /// The provider has nothing of it: the upload never landed.
    Nothing,
}

/// A provider's answer to a submission.
#[derive(Clone, Debug)]
pub struct Submitted {
    pub batch: RemoteBatch,
    /// OpenAI: the input file it was created from.
    pub input_file_id: Option<String>,
}

/// Whether a submission may still send its next creating request. A submitter paused
/// (or cut off) past its lease while another process took its upload over must not
/// create the batch a second time: the other process creates it, or has found it.
#[async_trait::async_trait]
pub trait SendGate: Send + Sync {
    async fn may_send(&self) -> bool;
}

/// The answer when the gate closed: nothing of this request was sent.
pub(crate) fn gate_closed() -> ProviderError {
    ProviderError::NotSent {
        message: "the submission no longer owns its provider batch; nothing more was sent"
            .to_owned(),
    }
}

/// A provider's batch API.
#[async_trait::async_trait]
pub trait BatchApi: Send + Sync {
    /// How much one batch may hold.
    fn limits(&self) -> BatchLimits;

    /// `item` as it goes into the upload: the bytes counted against
    /// [`BatchLimits::bytes`] (one JSON line, or one element of the requests array).
    fn encode(&self, item: &BatchItem) -> Vec<u8>;

    /// Submits the encoded items as one batch named `ours`; with `input_file` (OpenAI,
    /// found again after a crash) the batch is created from that file instead of a new
    /// upload. `gate` is asked right before each request that creates something at the
    /// provider; when it says no, nothing more is sent and the answer is
    /// [`ProviderError::NotSent`].
    async fn submit(
        &self,
        ours: Uuid,
        encoded: &[Vec<u8>],
        input_file: Option<&str>,
        gate: &dyn SendGate,
    ) -> Result<Submitted, ProviderError>;

    /// Looks for the upload named `ours`, made at `since` or after, among the
    /// provider's batches, leaving out those in `known` (recorded by some row of ours,
    /// or ruled out already). OpenAI's batches carry `ours` in their metadata, so what
    /// it finds is ours ([`RemoteBatch::ours`]). Anthropic's carry nothing of ours
    /// before their results do: what it finds is the oldest batch created since that
    /// holds `requests` requests, as many as the upload sent — a candidate, which the
    /// caller must neither cancel nor settle as its own before its results name its
    /// requests' custom ids (someone else may use the key).
    async fn find(
        &self,
        ours: Uuid,
        since: DateTime<Utc>,
        known: &HashSet<String>,
        requests: usize,
    ) -> Result<Found, ProviderError>;

    /// Whether [`BatchApi::find`] knows an upload by our id, which the provider's batch
    /// carries (OpenAI's metadata), rather than only by when it was made and how many
    /// requests it holds (Anthropic): uploads of the latter are made one at a time.
    fn finds_by_our_id(&self) -> bool;

    /// The batch as the provider reports it now.
    async fn read(&self, id: &str) -> Result<RemoteBatch, ProviderError>;

    /// Asks the provider to cancel the batch; what it finished before stays finished.
    async fn cancel(&self, id: &str) -> Result<(), ProviderError>;

    /// The results of an ended batch, read as a stream, line by line.
    async fn results(&self, batch: &RemoteBatch) -> Result<ResultLines, ProviderError>;
}

/// A custom id as both providers accept it.
pub fn valid_custom_id(id: &str) -> bool {
    (1..=64).contains(&id.len())
        && id
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_')
}

/// Whether a failed creating request certainly created nothing at the provider: it
/// was not sent. Anything else may have created the batch, which is then searched
/// for before anything is sent again — a 429 or Anthropic's 529 too: a gateway in
/// front of the provider may have forwarded the request before answering so, and
/// what a search finds is ours, or (Anthropic) a candidate its results prove or
/// rule out.
pub fn created_nothing(error: &ProviderError) -> bool {
    matches!(error, ProviderError::NotSent { .. })
}

/// A provider batch API answer that is not what it should be: a fault of the
/// provider (or of whatever answered), worth reading again later.
fn unreadable(what: &str, detail: &dyn std::fmt::Display) -> ProviderError {
    tracing::warn!(detail = %detail, "unreadable provider batch answer: {what}");
    ProviderError::OutcomeUnknown {
        message: format!("unreadable provider batch answer: {what}"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn transient(status: u16) -> ProviderError {
        ProviderError::Transient {
            status,
            message: String::new(),
            retry_after: None,
            request_id: None,
        }
    }

    /// Only a request never sent spares the search: a rate limit (perhaps a
    /// gateway's, after forwarding), a server error or a lost answer may stand for a
    /// batch the provider made.
    #[test]
    fn only_a_request_turned_away_certainly_created_nothing() {
        let cases = [
            (
                ProviderError::NotSent {
                    message: String::new(),
                },
                true,
            ),
            (transient(429), false),
            (transient(529), false),
            (transient(500), false),
            (transient(503), false),
            (transient(408), false),
            (
                ProviderError::OutcomeUnknown {
                    message: String::new(),
                },
                false,
            ),
        ];
        for (error, expected) in cases {
            assert_eq!(created_nothing(&error), expected, "{error:?}");
        }
    }
}
