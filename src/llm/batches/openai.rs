//! OpenAI's Batch API: the requests go up as a JSONL file (`POST /files`, named
//! `{ours}.jsonl`), the batch is created from it (`POST /batches`, with our id in
//! `metadata.jobledger_id`), and its output and error files are read once it ends.

use super::lines::ResultLines;
use super::{
    BatchApi, BatchItem, BatchLimits, Found, ItemResult, RemoteBatch, RemoteState, ResultLine,
    SendGate, Submitted, gate_closed, unreadable,
};
use crate::llm::ProviderError;
use crate::llm::openai::OpenAiClient;
use chrono::{DateTime, Utc};
use serde::Deserialize;
use serde_json::{Value, json};
use std::collections::HashSet;
use uuid::Uuid;

/// OpenAI's limits on one batch: 50,000 requests in a file of at most 200 MB.
const LIMITS: BatchLimits = BatchLimits {
    requests: 50_000,
    bytes: 200 * 1000 * 1000,
};
/// The metadata key that names our row.
const OURS: &str = "jobledger_id";
/// Batches or files one list call asks for (OpenAI's largest page is 100 batches).
const PAGE: usize = 100;

#[derive(Deserialize)]
struct BatchObject {
    id: String,
    status: String,
    created_at: i64,
    #[serde(default)]
    metadata: Option<Value>,
    output_file_id: Option<String>,
    error_file_id: Option<String>,
    /// Why a `failed` batch failed: `{"data": [{"code", "message"}, …]}`.
    #[serde(default)]
    errors: Option<Value>,
}

#[derive(Deserialize)]
struct BatchList {
    data: Vec<BatchObject>,
    #[serde(default)]
    has_more: bool,
}

#[derive(Deserialize)]
struct FileObject {
    id: String,
    filename: String,
    created_at: i64,
}

#[derive(Deserialize)]
struct FileList {
    data: Vec<FileObject>,
    #[serde(default)]
    has_more: bool,
}

fn remote(object: BatchObject) -> RemoteBatch {
    let state = match object.status.as_str() {
        "completed" | "expired" | "cancelled" | "failed" => RemoteState::Ended,
        "cancelling" => RemoteState::Cancelling,
        _ => RemoteState::InProgress,
    };
    let ours = object
        .metadata
        .as_ref()
        .and_then(|metadata| metadata.get(OURS)?.as_str()?.parse().ok());
    let refused = (object.status == "failed").then(|| failure_of(object.errors.as_ref()));
    RemoteBatch {
        id: object.id,
        state,
        created_at: seconds(object.created_at),
        ours,
        results: [object.output_file_id, object.error_file_id]
            .into_iter()
            .flatten()
            .collect(),
        refused,
    }
}

/// What a failed batch's `errors` say, in a line.
fn failure_of(errors: Option<&Value>) -> String {
    let first = errors
        .and_then(|errors| errors.get("data")?.as_array()?.first().cloned())
        .unwrap_or_default();
    let text = |key: &str| {
        first
            .get(key)
            .and_then(Value::as_str)
            .unwrap_or("")
            .to_owned()
    };
    match (text("code"), text("message")) {
        (code, message) if code.is_empty() && message.is_empty() => {
            "the provider failed the batch without saying why".to_owned()
        }
        (code, message) => format!("the provider failed the batch: {code} {message}")
            .trim_end()
            .to_owned(),
    }
}

fn seconds(at: i64) -> DateTime<Utc> {
    DateTime::from_timestamp(at, 0).unwrap_or_default()
}

fn file_name(ours: Uuid) -> String {
    format!("{ours}.jsonl")
}

impl OpenAiClient {
    fn url(&self, path: &str) -> String {
        format!("{}/{path}", self.base_url)
    }

    fn authorised(&self, call: reqwest::RequestBuilder) -> reqwest::RequestBuilder {
        match &self.api_key {
            Some(key) => call.bearer_auth(key),
            None => call,
        }
    }

    /// Sends `call` and parses a successful answer as `T`.
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

    async fn upload(&self, ours: Uuid, encoded: &[Vec<u8>]) -> Result<String, ProviderError> {
        let mut file = Vec::with_capacity(encoded.iter().map(|line| line.len() + 1).sum());
        for line in encoded {
            file.extend_from_slice(line);
            file.push(b'\n');
        }
        // multipart/form-data by hand: the two fields OpenAI wants, the file last.
        let boundary = format!("jobledger-{}", Uuid::new_v4().simple());
        let mut body = Vec::with_capacity(file.len() + 512);
        body.extend_from_slice(
            format!(
                "--{boundary}\r\nContent-Disposition: form-data; name=\"purpose\"\r\n\r\nbatch\r\n\
                 --{boundary}\r\nContent-Disposition: form-data; name=\"file\"; filename=\"{}\"\r\n\
                 Content-Type: application/jsonl\r\n\r\n",
                file_name(ours)
            )
            .as_bytes(),
        );
        body.extend_from_slice(&file);
        body.extend_from_slice(format!("\r\n--{boundary}--\r\n").as_bytes());
        let uploaded: FileObject = self
            .json(
                self.http
                    .post(&self.url("files"))
                    .header(
                        "content-type",
                        format!("multipart/form-data; boundary={boundary}"),
                    )
                    .body(body),
                "a file object",
            )
            .await?;
        Ok(uploaded.id)
    }

    /// The input file named for `ours`, uploaded at `since` or after, if any.
    async fn find_file(
        &self,
        ours: Uuid,
        since: DateTime<Utc>,
    ) -> Result<Option<String>, ProviderError> {
        let wanted = file_name(ours);
        let mut after: Option<String> = None;
        loop {
            let mut query = vec![
                ("purpose", "batch".to_owned()),
                ("limit", PAGE.to_string()),
                ("order", "desc".to_owned()),
            ];
            query.extend(after.clone().map(|after| ("after", after)));
            let page: FileList = self
                .json(
                    self.http.get(&self.url("files")).query(&query),
                    "a file list",
                )
                .await?;
            let mut older = false;
            for file in &page.data {
                if file.filename == wanted {
                    return Ok(Some(file.id.clone()));
                }
                older |= seconds(file.created_at) < since;
            }
            match page.data.last() {
                Some(last) if page.has_more && !older => after = Some(last.id.clone()),
                _ => return Ok(None),
            }
        }
    }
}

#[async_trait::async_trait]
impl BatchApi for OpenAiClient {
    fn limits(&self) -> BatchLimits {
        LIMITS
    }

    fn finds_by_our_id(&self) -> bool {
        true
    }

    fn encode(&self, item: &BatchItem) -> Vec<u8> {
        let line = json!({
            "custom_id": item.custom_id,
            "method": "POST",
            "url": "/v1/chat/completions",
            "body": self.body(&item.request),
        });
        serde_json::to_vec(&line).expect("a request line serializes")
    }

    async fn submit(
        &self,
        ours: Uuid,
        encoded: &[Vec<u8>],
        input_file: Option<&str>,
        gate: &dyn SendGate,
    ) -> Result<Submitted, ProviderError> {
        let input_file_id = match input_file {
            Some(id) => id.to_owned(),
            None => {
                if !gate.may_send().await {
                    return Err(gate_closed());
                }
                self.upload(ours, encoded).await?
            }
        };
        // Asked again after the upload, which may have taken longer than a lease: the
        // file alone bills nothing, the batch created from it does.
        if !gate.may_send().await {
            return Err(gate_closed());
        }
        let body = json!({
            "input_file_id": input_file_id,
            "endpoint": "/v1/chat/completions",
            "completion_window": "24h",
            "metadata": { OURS: ours.to_string() },
        });
        let created: BatchObject = self
            .json(
                self.http.post(&self.url("batches")).json(&body),
                "a batch object",
            )
            .await?;
        Ok(Submitted {
            batch: remote(created),
            input_file_id: Some(input_file_id),
        })
    }

    async fn find(
        &self,
        ours: Uuid,
        since: DateTime<Utc>,
        _known: &HashSet<String>,
        _requests: usize,
    ) -> Result<Found, ProviderError> {
        let mut after: Option<String> = None;
        loop {
            let mut query = vec![("limit", PAGE.to_string())];
            query.extend(after.clone().map(|after| ("after", after)));
            let page: BatchList = self
                .json(
                    self.http.get(&self.url("batches")).query(&query),
                    "a batch list",
                )
                .await?;
            let mut older = false;
            let mut last = None;
            for object in page.data {
                older |= seconds(object.created_at) < since;
                last = Some(object.id.clone());
                let batch = remote(object);
                if batch.ours == Some(ours) {
                    return Ok(Found::Batch(batch));
                }
            }
            match last {
                Some(last) if page.has_more && !older => after = Some(last),
                _ => break,
            }
        }
        Ok(match self.find_file(ours, since).await? {
            Some(file) => Found::InputFile(file),
            None => Found::Nothing,
        })
    }

    async fn read(&self, id: &str) -> Result<RemoteBatch, ProviderError> {
        let object: BatchObject = self
            .json(
                self.http.get(&self.url(&format!("batches/{id}"))),
                "a batch object",
            )
            .await?;
        Ok(remote(object))
    }

    async fn cancel(&self, id: &str) -> Result<(), ProviderError> {
        let _: BatchObject = self
            .json(
                self.http.post(&self.url(&format!("batches/{id}/cancel"))),
                "a batch object",
            )
            .await?;
        Ok(())
    }

    async fn results(&self, batch: &RemoteBatch) -> Result<ResultLines, ProviderError> {
        let bodies = batch
            .results
            .iter()
            .map(|file| self.authorised(self.http.get(&self.url(&format!("files/{file}/content")))))
            .collect();
        Ok(ResultLines::new(
            &self.name,
            self.http.clone(),
            bodies,
            parse_line,
        ))
    }
}

#[derive(Deserialize)]
struct Line {
    custom_id: String,
    response: Option<LineResponse>,
    error: Option<LineError>,
}

#[derive(Deserialize)]
struct LineResponse {
    status_code: u16,
    request_id: Option<String>,
    body: Value,
}

#[derive(Deserialize)]
struct LineError {
    code: Option<String>,
}

/// One line of an output or error file.
fn parse_line(provider: &str, line: &[u8]) -> Result<ResultLine, ProviderError> {
    let line: Line =
        serde_json::from_slice(line).map_err(|error| unreadable("a result line", &error))?;
    let result = match (line.response, line.error) {
        (Some(response), _) if response.status_code == 200 => {
            let body = serde_json::to_vec(&response.body).expect("JSON serializes");
            match OpenAiClient::completion_of(provider, &body, response.request_id) {
                Ok(completion) => ItemResult::Succeeded(completion),
                Err(error) => ItemResult::Errored(error),
            }
        }
        (Some(response), _) => {
            let body = serde_json::to_vec(&response.body).expect("JSON serializes");
            ItemResult::Errored(crate::llm::http::error_of(
                provider,
                response.status_code,
                body,
                response.request_id,
            ))
        }
        (None, Some(error)) if error.code.as_deref() == Some("batch_cancelled") => {
            ItemResult::Cancelled
        }
        (None, Some(error)) if error.code.as_deref() == Some("batch_expired") => {
            ItemResult::Expired
        }
        // Refused without an answer of its own (its input, say): not billed, and not a
        // free wait either, or a request refused in every batch would go out for
        // ever. It spends an attempt.
        (None, Some(error)) => ItemResult::Errored(ProviderError::Transient {
            status: 400,
            message: format!(
                "the provider batch refused the request: {}",
                error.code.as_deref().unwrap_or("no code")
            ),
            retry_after: None,
            request_id: None,
        }),
        // A line that says nothing of the request's fate.
        (None, None) => {
            ItemResult::Unknown("a result line with neither a response nor an error".to_owned())
        }
    };
    Ok(ResultLine {
        custom_id: line.custom_id,
        result,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn result_of(line: &str) -> ItemResult {
        parse_line("openai", line.as_bytes()).unwrap().result
    }

    /// Only an expiry or a cancel is a free wait; any other refusal without a response
    /// spends an attempt, and a line that says nothing is an unknown outcome.
    #[test]
    fn an_error_line_is_a_free_wait_only_when_it_says_expired_or_cancelled() {
        let error = |code: &str| {
            format!(
                r#"{{"custom_id": "a", "response": null, "error": {{"code": "{code}", "message": "m"}}}}"#
            )
        };
        assert!(matches!(
            result_of(&error("batch_expired")),
            ItemResult::Expired
        ));
        assert!(matches!(
            result_of(&error("batch_cancelled")),
            ItemResult::Cancelled
        ));
        assert!(matches!(
            result_of(&error("invalid_request")),
            ItemResult::Errored(ProviderError::Transient { .. })
        ));
        assert!(matches!(
            result_of(r#"{"custom_id": "a", "response": null, "error": null}"#),
            ItemResult::Unknown(_)
        ));
    }

    /// A failed batch says why, and carries no results.
    #[test]
    fn a_failed_batch_is_refused_with_its_reason() {
        let object: BatchObject = serde_json::from_str(
            r#"{"id": "batch_1", "status": "failed", "created_at": 0, "output_file_id": null, "error_file_id": null,
                "errors": {"data": [{"code": "token_limit_exceeded", "message": "Enqueued token limit reached."}]}}"#,
        )
        .unwrap();
        let batch = remote(object);
        assert_eq!(batch.state, RemoteState::Ended);
        assert_eq!(
            batch.refused.as_deref(),
            Some(
                "the provider failed the batch: token_limit_exceeded Enqueued token limit reached."
            )
        );
        let completed: BatchObject = serde_json::from_str(
            r#"{"id": "batch_2", "status": "completed", "created_at": 0, "output_file_id": "f", "error_file_id": null}"#,
        )
        .unwrap();
        assert_eq!(remote(completed).refused, None);
    }
}
