//! Anthropic's Message Batches: one `POST /v1/messages/batches` with every request
//! and its custom id; the results are one JSONL body once the batch has ended.
//! A message batch carries nothing of ours but the custom ids, which only its results
//! show: after a crash it is found as a batch created since the upload began that no
//! row of ours records, holding as many requests as the upload — a candidate until its
//! results name our attempts (see [`super::BatchApi::find`]).

use super::lines::ResultLines;
use super::{
    BatchApi, BatchItem, BatchLimits, Found, ItemResult, RemoteBatch, RemoteState, ResultLine,
    SendGate, Submitted, gate_closed, unreadable,
};
use crate::llm::ProviderError;
use crate::llm::anthropic::{API_VERSION, AnthropicClient};
use chrono::{DateTime, Utc};
use serde::Deserialize;
use serde_json::{Value, json};
use std::collections::HashSet;
use uuid::Uuid;

/// Anthropic's limits on one batch: 100,000 requests in 256 MB.
const LIMITS: BatchLimits = BatchLimits {
    requests: 100_000,
    bytes: 256 * 1000 * 1000,
};
/// Batches one list call asks for (Anthropic's largest page).
const PAGE: usize = 100;

#[derive(Deserialize)]
struct BatchObject {
    id: String,
    processing_status: String,
    created_at: DateTime<Utc>,
    results_url: Option<String>,
    #[serde(default)]
    request_counts: Option<RequestCounts>,
}

/// How many of a batch's requests are in each state: together, how many it holds.
#[derive(Clone, Copy, Deserialize)]
struct RequestCounts {
    #[serde(default)]
    processing: u64,
    #[serde(default)]
    succeeded: u64,
    #[serde(default)]
    errored: u64,
    #[serde(default)]
    canceled: u64,
    #[serde(default)]
    expired: u64,
}

impl RequestCounts {
    fn total(self) -> u64 {
        self.processing + self.succeeded + self.errored + self.canceled + self.expired
    }
}

#[derive(Deserialize)]
struct BatchList {
    data: Vec<BatchObject>,
    #[serde(default)]
    has_more: bool,
    last_id: Option<String>,
}

fn remote(object: BatchObject) -> RemoteBatch {
    let state = match object.processing_status.as_str() {
        "ended" => RemoteState::Ended,
        "canceling" => RemoteState::Cancelling,
        _ => RemoteState::InProgress,
    };
    RemoteBatch {
        id: object.id,
        state,
        created_at: object.created_at,
        ours: None,
        results: object.results_url.into_iter().collect(),
        // Anthropic ends a batch only with every request's result.
        refused: None,
    }
}

impl AnthropicClient {
    fn batches_url(&self) -> String {
        format!("{}/batches", self.messages_url)
    }

    fn authorised(&self, call: reqwest::RequestBuilder) -> reqwest::RequestBuilder {
        let call = call.header("anthropic-version", API_VERSION);
        match &self.api_key {
            Some(key) => call.header("x-api-key", key),
            None => call,
        }
    }

    async fn json<T: serde::de::DeserializeOwned>(
        &self,
        call: reqwest::RequestBuilder,
        what: &str,
    ) -> Result<T, ProviderError> {
        let answer = self.http.send(self.authorised(call)).await?;
        if !answer.status.is_success() {
            return Err(answer.into_error(&self.name, None));
        }
        serde_json::from_slice(&answer.body).map_err(|error| unreadable(what, &error))
    }
}

#[async_trait::async_trait]
impl BatchApi for AnthropicClient {
    fn limits(&self) -> BatchLimits {
        LIMITS
    }

    fn finds_by_our_id(&self) -> bool {
        false
    }

    fn encode(&self, item: &BatchItem) -> Vec<u8> {
        let request = json!({"custom_id": item.custom_id, "params": Self::body(&item.request)});
        serde_json::to_vec(&request).expect("a request serializes")
    }

    async fn submit(
        &self,
        _ours: Uuid,
        encoded: &[Vec<u8>],
        _input_file: Option<&str>,
        gate: &dyn SendGate,
    ) -> Result<Submitted, ProviderError> {
        let mut body =
            Vec::with_capacity(encoded.iter().map(|item| item.len() + 1).sum::<usize>() + 16);
        body.extend_from_slice(b"{\"requests\":[");
        for (index, item) in encoded.iter().enumerate() {
            if index > 0 {
                body.push(b',');
            }
            body.extend_from_slice(item);
        }
        body.extend_from_slice(b"]}");
        if !gate.may_send().await {
            return Err(gate_closed());
        }
        let created: BatchObject = self
            .json(
                self.http
                    .post(&self.batches_url())
                    .header("content-type", "application/json")
                    .body(body),
                "a message batch",
            )
            .await?;
        Ok(Submitted {
            batch: remote(created),
            input_file_id: None,
        })
    }

    async fn find(
        &self,
        _ours: Uuid,
        since: DateTime<Utc>,
        known: &HashSet<String>,
        requests: usize,
    ) -> Result<Found, ProviderError> {
        let mut after: Option<String> = None;
        let mut candidates = Vec::new();
        loop {
            let mut query = vec![("limit", PAGE.to_string())];
            query.extend(after.clone().map(|after| ("after_id", after)));
            let page: BatchList = self
                .json(
                    self.http.get(&self.batches_url()).query(&query),
                    "a message batch list",
                )
                .await?;
            let mut older = false;
            for object in page.data {
                if object.created_at < since {
                    older = true;
                    continue;
                }
                if !known.contains(&object.id) {
                    let total = object.request_counts.map(RequestCounts::total);
                    candidates.push((total, remote(object)));
                }
            }
            match page.last_id {
                Some(last) if page.has_more && !older => after = Some(last),
                _ => break,
            }
        }
        // Someone else creates batches with our key: ours holds as many requests as
        // the upload sent. Of those, the oldest is the candidate; its results tell
        // whether it is ours (the caller's to check), and a batch they rule out is
        // left out of the next search through `known`.
        candidates.retain(|(total, _)| total.is_none_or(|total| total == requests as u64));
        Ok(candidates
            .into_iter()
            .map(|(_, batch)| batch)
            .min_by_key(|batch| batch.created_at)
            .map_or(Found::Nothing, Found::Batch))
    }

    async fn read(&self, id: &str) -> Result<RemoteBatch, ProviderError> {
        let object: BatchObject = self
            .json(
                self.http.get(&format!("{}/{id}", self.batches_url())),
                "a message batch",
            )
            .await?;
        Ok(remote(object))
    }

    async fn cancel(&self, id: &str) -> Result<(), ProviderError> {
        let _: BatchObject = self
            .json(
                self.http
                    .post(&format!("{}/{id}/cancel", self.batches_url())),
                "a message batch",
            )
            .await?;
        Ok(())
    }

    async fn results(&self, batch: &RemoteBatch) -> Result<ResultLines, ProviderError> {
        let own = format!("{}/{}/results", self.batches_url(), batch.id);
        let url = match batch.results.first() {
            Some(url) if same_origin(url, &own) => url.clone(),
            // The key goes only where the operator configured: a results URL
            // elsewhere (a provider that was not Anthropic, or a gateway passing on
            // the upstream address) is read at the configured base instead, where
            // Anthropic serves it too.
            Some(url) => {
                tracing::warn!(provider = %self.name, provider_batch = %batch.id, results_url = %url, "a batch's results URL is outside the configured base; reading the results from the base");
                own
            }
            None => own,
        };
        Ok(ResultLines::new(
            &self.name,
            self.http.clone(),
            vec![self.authorised(self.http.get(&url))],
            parse_line,
        ))
    }
}

/// Whether `url` has the scheme, host and port of `base`.
fn same_origin(url: &str, base: &str) -> bool {
    match (reqwest::Url::parse(url), reqwest::Url::parse(base)) {
        (Ok(url), Ok(base)) => url.origin() == base.origin(),
        _ => false,
    }
}

#[derive(Deserialize)]
struct Line {
    custom_id: String,
    result: LineResult,
}

#[derive(Deserialize)]
struct LineResult {
    #[serde(rename = "type")]
    kind: String,
    message: Option<Value>,
    error: Option<Value>,
}

/// The status an errored request's error body stands for (Anthropic's error types).
fn status_of(error: &Value) -> u16 {
    let kind = error
        .pointer("/error/type")
        .or_else(|| error.get("type"))
        .and_then(Value::as_str)
        .unwrap_or("");
    match kind {
        "invalid_request_error" => 400,
        "authentication_error" => 401,
        "permission_error" => 403,
        "not_found_error" => 404,
        "request_too_large" => 413,
        "rate_limit_error" => 429,
        "overloaded_error" => 529,
        _ => 500,
    }
}

fn parse_line(provider: &str, line: &[u8]) -> Result<ResultLine, ProviderError> {
    let line: Line =
        serde_json::from_slice(line).map_err(|error| unreadable("a result line", &error))?;
    let result = match line.result.kind.as_str() {
        "succeeded" => {
            let body = serde_json::to_vec(&line.result.message.unwrap_or(Value::Null))
                .expect("JSON serializes");
            match AnthropicClient::completion_of(provider, &body, None) {
                Ok(completion) => ItemResult::Succeeded(completion),
                Err(error) => ItemResult::Errored(error),
            }
        }
        "errored" => {
            let error = line.result.error.unwrap_or(Value::Null);
            let request_id = error
                .get("request_id")
                .and_then(Value::as_str)
                .map(str::to_owned);
            let status = status_of(&error);
            let body = serde_json::to_vec(&error).expect("JSON serializes");
            ItemResult::Errored(crate::llm::http::error_of(
                provider, status, body, request_id,
            ))
        }
        "canceled" => ItemResult::Cancelled,
        "expired" => ItemResult::Expired,
        // A result type added after this was written may stand for a processed (and
        // billed) request: its outcome is unknown, not "expired".
        other => ItemResult::Unknown(format!(
            "the provider batch answered the request with a result type of {other:?}, which is not known"
        )),
    };
    Ok(ResultLine {
        custom_id: line.custom_id,
        result,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The API key follows a results URL only to the configured origin.
    #[test]
    fn a_results_url_is_followed_only_on_the_configured_origin() {
        let base = "https://api.anthropic.com/v1/messages/batches/b1/results";
        let cases = [
            (
                "https://api.anthropic.com/v1/messages/batches/b1/results",
                true,
            ),
            ("https://api.anthropic.com:443/other/path", true),
            (
                "http://api.anthropic.com/v1/messages/batches/b1/results",
                false,
            ),
            (
                "https://api.anthropic.com:8443/v1/messages/batches/b1/results",
                false,
            ),
            ("https://evil.example/v1/messages/batches/b1/results", false),
            ("https://api.anthropic.com.evil.example/x", false),
            ("not a url", false),
        ];
        for (url, expected) in cases {
            assert_eq!(same_origin(url, base), expected, "{url}");
        }
    }

    fn parsed(kind: &str) -> ItemResult {
        let line = json!({"custom_id": "a1", "result": {"type": kind}}).to_string();
        parse_line("anthropic", line.as_bytes()).unwrap().result
    }

    /// `expired` and `canceled` are requests Anthropic never ran (not billed); a result
    /// type it may add later is not taken for one of them: it may stand for a billed
    /// request, so its outcome is unknown.
    #[test]
    fn an_unknown_result_type_is_an_unknown_outcome_not_an_expiry() {
        assert!(matches!(parsed("expired"), ItemResult::Expired));
        assert!(matches!(parsed("canceled"), ItemResult::Cancelled));
        match parsed("partially_processed") {
            ItemResult::Unknown(message) => {
                assert!(message.contains("partially_processed"), "{message}")
            }
            other => panic!("an unknown result type read as {other:?}"),
        }
    }
}
