//! What every HTTP provider client does the same way: sending a call, reading the
//! answer, and classifying failures by whether the provider may have billed them.

use super::ProviderError;
use reqwest::header::{HeaderMap, RETRY_AFTER};
use reqwest::{RequestBuilder, StatusCode};
use serde_json::Value;
use std::time::Duration;

/// How long establishing a connection may take before the call counts as not sent.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);

/// The HTTP client a provider uses. No overall timeout: the worker bounds each
/// attempt itself and drops the future, which aborts the call.
pub(super) fn client() -> reqwest::Client {
    reqwest::Client::builder()
        .connect_timeout(CONNECT_TIMEOUT)
        .build()
        .expect("the TLS backend initialises")
}

/// A provider's answer, read in full, whatever its status.
pub(super) struct Answer {
    pub status: StatusCode,
    pub headers: HeaderMap,
    pub body: Vec<u8>,
}

/// Sends `call` and reads the whole answer. Failing to connect means nothing was
/// sent; any failure after that may have reached (and been billed by) the provider.
pub(super) async fn send(call: RequestBuilder) -> Result<Answer, ProviderError> {
    let response = call.send().await.map_err(classify_send_error)?;
    let status = response.status();
    let headers = response.headers().clone();
    let body =
        response
            .bytes()
            .await
            .map(Vec::from)
            .map_err(|error| ProviderError::OutcomeUnknown {
                message: format!("reading the answer failed: {error}"),
            })?;
    Ok(Answer {
        status,
        headers,
        body,
    })
}

impl Answer {
    /// The first of the `names` headers that carries a request id.
    pub fn request_id(&self, names: &[&str]) -> Option<String> {
        names
            .iter()
            .find_map(|name| self.headers.get(*name)?.to_str().ok().map(str::to_owned))
    }

    /// The error an unsuccessful answer stands for: worth retrying or not, by status.
    pub fn into_error(self, request_id: Option<String>) -> ProviderError {
        let message = error_message(&self.body);
        let status = self.status.as_u16();
        if is_transient(status) {
            ProviderError::Transient {
                status,
                message,
                retry_after: retry_after(&self.headers),
                request_id,
            }
        } else {
            ProviderError::Permanent {
                status,
                message,
                request_id,
            }
        }
    }
}

/// Whether an error status is worth retrying: rate limits, timeouts, conflicts and
/// server errors (Anthropic's 529 "overloaded" included).
fn is_transient(status: u16) -> bool {
    matches!(status, 408 | 409 | 429) || status >= 500
}

/// A connection that was never made means the request was never sent; anything
/// after that may have reached the provider.
fn classify_send_error(error: reqwest::Error) -> ProviderError {
    if error.is_connect() {
        ProviderError::NotSent {
            message: error.to_string(),
        }
    } else {
        ProviderError::OutcomeUnknown {
            message: error.to_string(),
        }
    }
}

/// `Retry-After` in seconds (the form providers send).
fn retry_after(headers: &HeaderMap) -> Option<Duration> {
    let seconds: f64 = headers
        .get(RETRY_AFTER)?
        .to_str()
        .ok()?
        .trim()
        .parse()
        .ok()?;
    (seconds.is_finite() && seconds >= 0.0).then(|| Duration::from_secs_f64(seconds))
}

/// The message of an error body. OpenAI (`{"error":{"message",..}}`) and Anthropic
/// (`{"type":"error","error":{"type","message"}}`) keep it at the same place; any
/// other body (a proxy's HTML page, say) is kept short, as text.
fn error_message(body: &[u8]) -> String {
    serde_json::from_slice::<Value>(body)
        .ok()
        .and_then(|value| value["error"]["message"].as_str().map(str::to_owned))
        .unwrap_or_else(|| String::from_utf8_lossy(body).chars().take(500).collect())
}

#[cfg(test)]
mod tests {
    use super::*;
    use reqwest::header::HeaderValue;

    #[test]
    fn transient_statuses() {
        for status in [408, 409, 429, 500, 502, 503, 529] {
            assert!(is_transient(status), "{status}");
        }
        for status in [400, 401, 403, 404, 413, 422] {
            assert!(!is_transient(status), "{status}");
        }
    }

    #[test]
    fn retry_after_takes_seconds_only() {
        let mut headers = HeaderMap::new();
        assert_eq!(retry_after(&headers), None);
        headers.insert(RETRY_AFTER, HeaderValue::from_static(" 1.5 "));
        assert_eq!(retry_after(&headers), Some(Duration::from_millis(1500)));
        headers.insert(RETRY_AFTER, HeaderValue::from_static("-1"));
        assert_eq!(retry_after(&headers), None);
        // The HTTP-date form is not sent by the providers we talk to.
        headers.insert(
            RETRY_AFTER,
            HeaderValue::from_static("Wed, 21 Oct 2026 07:28:00 GMT"),
        );
        assert_eq!(retry_after(&headers), None);
    }

    #[test]
    fn error_messages_of_both_shapes() {
        assert_eq!(
            error_message(br#"{"error":{"message":"bad model","type":"invalid_request_error"}}"#),
            "bad model"
        );
        assert_eq!(
            error_message(
                br#"{"type":"error","error":{"type":"overloaded_error","message":"Overloaded"}}"#
            ),
            "Overloaded"
        );
        assert_eq!(error_message(b"<html>502</html>"), "<html>502</html>");
    }
}
