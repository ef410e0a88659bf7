//! Every request the submitter makes of a provider's batch API, under a time bound.
//!
//! A provider (or a gateway, or a half-open connection) that accepts a request and
//! never answers would otherwise hold the row's step, and with it the round of every
//! other row of this process, for as long as the connection stays open: the
//! transport bounds only connecting. Past its bound a call is dropped, which aborts
//! the request, and its outcome is unknown (a create may have been made), as for any
//! answer lost on the way: the row backs off, is searched for, and ends with an
//! unknown fate once the provider has been silent past the unknown-fate bound.

use crate::llm::ProviderError;
use crate::llm::batches::{
    BatchApi, BatchItem, Found, RemoteBatch, ResultLine, ResultLines, SendGate, Submitted,
};
use chrono::{DateTime, Utc};
use std::collections::HashSet;
use std::time::Duration;
use uuid::Uuid;

/// How fast an upload is assumed to go at worst, on top of the call bound: a
/// 200 MB OpenAI input file has 200 s more than a read.
const UPLOAD_BYTES_PER_SECOND: u64 = 1_000_000;

/// A provider's batch API whose every call ends within `limit`.
#[derive(Clone, Copy)]
pub(super) struct Calls<'a> {
    api: &'a dyn BatchApi,
    limit: Duration,
}

/// `call`, or an unknown outcome once `limit` has passed without its answer.
async fn within<T>(
    limit: Duration,
    what: &str,
    call: impl Future<Output = Result<T, ProviderError>>,
) -> Result<T, ProviderError> {
    tokio::time::timeout(limit, call).await.unwrap_or_else(|_| {
        Err(ProviderError::OutcomeUnknown {
            message: format!(
                "the provider did not answer {what} within {} s",
                limit.as_secs_f64()
            ),
        })
    })
}

impl<'a> Calls<'a> {
    pub(super) fn new(api: &'a dyn BatchApi, limit: Duration) -> Self {
        Self { api, limit }
    }

    /// `item` as it goes into the upload (no request: nothing to bound).
    pub(super) fn encode(&self, item: &BatchItem) -> Vec<u8> {
        self.api.encode(item)
    }

    pub(super) async fn read(&self, id: &str) -> Result<RemoteBatch, ProviderError> {
        within(self.limit, "a read of the batch", self.api.read(id)).await
    }

    pub(super) async fn cancel(&self, id: &str) -> Result<(), ProviderError> {
        within(self.limit, "a cancel of the batch", self.api.cancel(id)).await
    }

    /// A search lists page after page: each page is a call, the search as many as
    /// OpenAI's two lists may need within reason.
    pub(super) async fn find(
        &self,
        ours: Uuid,
        since: DateTime<Utc>,
        known: &HashSet<String>,
        requests: usize,
    ) -> Result<Found, ProviderError> {
        within(
            self.limit * 4,
            "a search for the upload",
            self.api.find(ours, since, known, requests),
        )
        .await
    }

    /// An upload has its two creating requests (OpenAI: the file, then the batch),
    /// and the time its bytes take on top.
    pub(super) async fn submit(
        &self,
        ours: Uuid,
        encoded: &[Vec<u8>],
        input_file: Option<&str>,
        gate: &dyn SendGate,
    ) -> Result<Submitted, ProviderError> {
        let bytes: usize = encoded.iter().map(Vec::len).sum();
        let sending = Duration::from_secs(bytes as u64 / UPLOAD_BYTES_PER_SECOND);
        within(
            self.limit * 2 + sending,
            "the upload",
            self.api.submit(ours, encoded, input_file, gate),
        )
        .await
    }

    /// The results, each line within the bound of the one before: a large batch's
    /// results take as long as they take, a stalled download does not.
    pub(super) async fn results(&self, batch: &RemoteBatch) -> Result<Lines, ProviderError> {
        let lines = within(self.limit, "the results", self.api.results(batch)).await?;
        Ok(Lines {
            lines,
            limit: self.limit,
        })
    }
}

/// A batch's results whose next line comes within the bound.
pub(super) struct Lines {
    lines: ResultLines,
    limit: Duration,
}

impl Lines {
    pub(super) async fn next(&mut self) -> Result<Option<ResultLine>, ProviderError> {
        within(self.limit, "the next result line", self.lines.next()).await
    }
}
