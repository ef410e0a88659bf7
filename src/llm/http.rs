//! What every HTTP provider client does the same way: sending a call, reading the
//! answer, and classifying failures by whether the provider may have billed them.

use super::{ProviderError, Timeouts};
use reqwest::header::{HeaderMap, RETRY_AFTER};
use reqwest::{RequestBuilder, StatusCode};
use serde_json::Value;
use std::time::Duration;

/// The HTTP side of a provider client: a connection pool with the connect timeout,
/// and the first-byte timeout applied to every call. No overall timeout: the worker
/// bounds each attempt itself and drops the future, which aborts the call.
#[derive(Clone, Debug)]
pub(super) struct Transport {
    client: reqwest::Client,
    first_byte: Option<std::time::Duration>,
}

impl Transport {
    pub(super) fn new(timeouts: Timeouts) -> Self {
        Self {
            client: reqwest::Client::builder()
                .connect_timeout(timeouts.connect)
                // A redirect would take the request, and Anthropic's `x-api-key`
                // (which reqwest keeps across hosts, unlike `Authorization`), to
                // wherever the answer points; and an answer from elsewhere would be
                // trusted as the provider's. The configured base URL is the provider.
                .redirect(reqwest::redirect::Policy::none())
                .build()
                .expect("the TLS backend initialises"),
            first_byte: timeouts.first_byte,
        }
    }

    /// A POST to `url`.
    pub(super) fn post(&self, url: &str) -> RequestBuilder {
        self.client.post(url)
    }

    /// Sends `call` and waits for the answer's head. Failing to connect means nothing
    /// was sent; no head within the first-byte timeout, or any failure after the
    /// connection, may have reached (and been billed by) the provider.
    async fn head(&self, call: RequestBuilder) -> Result<reqwest::Response, ProviderError> {
        let sent = call.send();
        let response = match self.first_byte {
            Some(limit) => tokio::time::timeout(limit, sent).await.map_err(|_| {
                ProviderError::OutcomeUnknown {
                    message: format!("no answer within the first-byte timeout of {limit:?}"),
                }
            })?,
            None => sent.await,
        };
        response.map_err(classify_send_error)
    }

    /// A GET of `url`.
    pub(super) fn get(&self, url: &str) -> RequestBuilder {
        self.client.get(url)
    }

    /// Sends `call`: a successful answer comes back unread, for its body to be read
    /// as a stream (a provider batch's results); an error status is read in full.
    pub(super) async fn open(
        &self,
        call: RequestBuilder,
    ) -> Result<Result<reqwest::Response, Answer>, ProviderError> {
        let response = self.head(call).await?;
        if response.status().is_success() {
            return Ok(Ok(response));
        }
        Answer::read(response).await.map(Err)
    }

    /// Sends `call` and reads the whole answer, whatever its status.
    pub(super) async fn send(&self, call: RequestBuilder) -> Result<Answer, ProviderError> {
        let response = self.head(call).await?;
        Answer::read(response).await
    }

    /// Sends a streaming `call`. A successful answer is returned unread, as a stream
    /// of server-sent events; an error status is read in full like [`Self::send`].
    pub(super) async fn open_stream(&self, call: RequestBuilder) -> Result<Opened, ProviderError> {
        let response = self.head(call).await?;
        if response.status().is_success() {
            return Ok(Opened::Events(EventStream {
                headers: response.headers().clone(),
                response,
                buffer: Vec::new(),
            }));
        }
        Answer::read(response).await.map(Opened::Refused)
    }
}

/// What opening a streaming call gave: the event stream, or an error answer read in
/// full.
pub(super) enum Opened {
    Events(EventStream),
    Refused(Answer),
}

/// A provider's answer, read in full, whatever its status.
pub(super) struct Answer {
    pub status: StatusCode,
    pub headers: HeaderMap,
    pub body: Vec<u8>,
}

/// One server-sent event.
#[derive(Debug, Default, PartialEq, Eq)]
pub(super) struct ServerEvent {
    /// The `event:` field, when the server names its events (Anthropic does).
    pub event: Option<String>,
    /// The `data:` lines, joined by newlines.
    pub data: String,
}

/// The body of a streaming answer, read event by event.
pub(super) struct EventStream {
    pub headers: HeaderMap,
    response: reqwest::Response,
    buffer: Vec<u8>,
}

impl EventStream {
    /// The first of the `names` headers that carries a request id.
    pub fn request_id(&self, names: &[&str]) -> Option<String> {
        names
            .iter()
            .find_map(|name| self.headers.get(*name)?.to_str().ok().map(str::to_owned))
    }

    /// The next event, or `None` at the end of the body. A connection lost midway is
    /// an unknown outcome: the provider was generating, and bills what it generated.
    pub async fn next_event(&mut self) -> Result<Option<ServerEvent>, ProviderError> {
        loop {
            if let Some(end) = find_blank_line(&self.buffer) {
                let block: Vec<u8> = self.buffer.drain(..end.0).collect();
                self.buffer.drain(..end.1 - end.0);
                if let Some(event) = parse_event(&block) {
                    return Ok(Some(event));
                }
                continue;
            }
            match self.response.chunk().await {
                Ok(Some(bytes)) => self.buffer.extend_from_slice(&bytes),
                Ok(None) => {
                    let rest = std::mem::take(&mut self.buffer);
                    return Ok(parse_event(&rest));
                }
                Err(error) => {
                    return Err(ProviderError::OutcomeUnknown {
                        message: format!("the stream broke off: {error}"),
                    });
                }
            }
        }
    }
}

/// Where the first blank line (`\n\n` or `\r\n\r\n`) starts and ends.
fn find_blank_line(buffer: &[u8]) -> Option<(usize, usize)> {
    let lf = buffer
        .windows(2)
        .position(|pair| pair == b"\n\n")
        .map(|at| (at, at + 2));
    let crlf = buffer
        .windows(4)
        .position(|quad| quad == b"\r\n\r\n")
        .map(|at| (at, at + 4));
    match (lf, crlf) {
        (Some(a), Some(b)) => Some(if a.0 <= b.0 { a } else { b }),
        (a, b) => a.or(b),
    }
}

/// An event from its lines; `None` for a block of comments or nothing.
fn parse_event(block: &[u8]) -> Option<ServerEvent> {
    let text = String::from_utf8_lossy(block);
    let mut event = ServerEvent::default();
    let mut data = Vec::new();
    for line in text.lines() {
        if let Some(value) = line.strip_prefix("event:") {
            event.event = Some(value.trim().to_owned());
        } else if let Some(value) = line.strip_prefix("data:") {
            data.push(value.strip_prefix(' ').unwrap_or(value).to_owned());
        }
    }
    if data.is_empty() && event.event.is_none() {
        return None;
    }
    event.data = data.join("\n");
    Some(event)
}

impl Answer {
    async fn read(response: reqwest::Response) -> Result<Self, ProviderError> {
        let status = response.status();
        let headers = response.headers().clone();
        let body = response.bytes().await.map(Vec::from).map_err(|error| {
            ProviderError::OutcomeUnknown {
                message: format!("reading the answer failed: {error}"),
            }
        })?;
        Ok(Self {
            status,
            headers,
            body,
        })
    }

    /// The first of the `names` headers that carries a request id.
    pub fn request_id(&self, names: &[&str]) -> Option<String> {
        names
            .iter()
            .find_map(|name| self.headers.get(*name)?.to_str().ok().map(str::to_owned))
    }

    /// The error an unsuccessful answer from `provider` stands for: worth retrying or
    /// not, by status.
    ///
    /// Its message is what the tenant reads on the job, its attempts and events: a
    /// fixed sentence per class of answer and the provider's request id, never the
    /// provider's own text. An error body can carry our organisation id (OpenAI puts it
    /// in 429s), a gateway's host name (a proxy's 502 page) or a quote of another
    /// request; the operator finds that text in the log, next to the same request id.
    pub fn into_error(self, provider: &str, request_id: Option<String>) -> ProviderError {
        let status = self.status.as_u16();
        let body = ErrorBody::parse(&self.body);
        let class = ErrorClass::of(status, &body);
        let request = request_id.as_deref().unwrap_or("none");
        if class == ErrorClass::Redirected {
            // Every call to this provider fails the same way until an operator fixes
            // the base URL; where it points is the hint.
            let location = self
                .headers
                .get(reqwest::header::LOCATION)
                .and_then(|value| value.to_str().ok())
                .unwrap_or("none");
            tracing::error!(
                provider,
                status,
                provider_request_id = request,
                location,
                "the provider's base URL answers with a redirect: correct it in the configuration"
            );
        } else if class == ErrorClass::QuotaExhausted {
            // A 429 that no retry fixes: the provider account is out of credit. Every
            // job on this provider will fail until an operator tops it up.
            tracing::error!(
                provider, status, provider_request_id = request, provider_message = %body.text,
                "the provider account has no quota left"
            );
        } else {
            tracing::warn!(
                provider, status, provider_request_id = request, provider_message = %body.text,
                "the provider answered with an error"
            );
        }
        let message = with_request_id(class.sentence(), request_id.as_deref());
        if class != ErrorClass::QuotaExhausted && is_transient(status) {
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

/// The error a provider's answer of `status` with `body` stands for, as
/// [`Answer::into_error`] tells it: for a request of a batch, whose answer comes back
/// inside the batch's results.
pub(super) fn error_of(
    provider: &str,
    status: u16,
    body: Vec<u8>,
    request_id: Option<String>,
) -> ProviderError {
    Answer {
        status: StatusCode::from_u16(status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR),
        headers: HeaderMap::new(),
        body,
    }
    .into_error(provider, request_id)
}

/// A successful answer we cannot use (not the JSON it should be, or a stream that
/// reports an error midway): the outcome is unknown, since the provider may have done
/// and billed the work. As for error answers, the tenant reads `what` and the request
/// id, and the provider's words (`detail`, which can quote the body) go to the log.
pub(super) fn unusable_answer(
    provider: &str,
    what: &str,
    detail: &dyn std::fmt::Display,
    request_id: Option<&str>,
) -> ProviderError {
    tracing::warn!(
        provider, provider_request_id = request_id.unwrap_or("none"), detail = %detail,
        "unusable provider answer: {what}"
    );
    ProviderError::OutcomeUnknown {
        message: with_request_id(what, request_id),
    }
}

/// `sentence`, with the provider's request id when there is one: what the tenant quotes
/// to the operator, who finds the provider's own text in the log under it.
fn with_request_id(sentence: &str, request_id: Option<&str>) -> String {
    match request_id {
        Some(id) => format!("{sentence} (provider request id {id})"),
        None => sentence.to_owned(),
    }
}

/// What an error body says, as far as we read it: its machine-readable code and type,
/// and its text (for the log only).
struct ErrorBody {
    /// OpenAI's `error.code` and the `error.type` of both OpenAI and Anthropic.
    codes: Vec<String>,
    /// `error.message` of a JSON body; any other body (a proxy's HTML page, say) kept
    /// short, as text.
    text: String,
}

impl ErrorBody {
    fn parse(body: &[u8]) -> Self {
        let json = serde_json::from_slice::<Value>(body).ok();
        let error = json.as_ref().map(|value| &value["error"]);
        let codes = error
            .map(|error| {
                [&error["code"], &error["type"]]
                    .into_iter()
                    .filter_map(|field| field.as_str().map(str::to_owned))
                    .collect()
            })
            .unwrap_or_default();
        let text = error
            .and_then(|error| error["message"].as_str().map(str::to_owned))
            .unwrap_or_else(|| String::from_utf8_lossy(body).chars().take(500).collect());
        Self { codes, text }
    }

    fn has_code(&self, code: &str) -> bool {
        self.codes.iter().any(|known| known == code)
    }
}

/// The classes of error answers a tenant is told apart: each is something the tenant
/// can act on differently (fix the request, shorten the prompt, wait, ask the operator).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum ErrorClass {
    /// OpenAI's `context_length_exceeded`: the prompt and `max_tokens` do not fit.
    ContextWindow,
    /// OpenAI's (and compatible routers') 429 `insufficient_quota`: out of credit, not
    /// merely rate limited.
    QuotaExhausted,
    Invalid,
    Credentials,
    NotFound,
    TooLarge,
    Unprocessable,
    RateLimited,
    Timeout,
    Conflict,
    Overloaded,
    Failed,
    /// A 3xx: the configured base URL is not the provider's API (a moved endpoint, a
    /// proxy sending clients to a login page). Redirects are not followed.
    Redirected,
    Refused,
}

impl ErrorClass {
    /// The class of an answer with this status and body, recognised by the provider's
    /// error code where the status alone is ambiguous.
    fn of(status: u16, body: &ErrorBody) -> Self {
        if body.has_code("context_length_exceeded") {
            return Self::ContextWindow;
        }
        if body.has_code("insufficient_quota") {
            return Self::QuotaExhausted;
        }
        match status {
            400 => Self::Invalid,
            401 | 403 => Self::Credentials,
            404 => Self::NotFound,
            408 => Self::Timeout,
            409 => Self::Conflict,
            413 => Self::TooLarge,
            422 => Self::Unprocessable,
            429 => Self::RateLimited,
            // 529 is Anthropic's "overloaded".
            503 | 529 => Self::Overloaded,
            500.. => Self::Failed,
            300..=399 => Self::Redirected,
            _ => Self::Refused,
        }
    }

    /// What the tenant reads; the worker puts the status before it.
    fn sentence(self) -> &'static str {
        match self {
            Self::ContextWindow => "the prompt exceeds the model's context window",
            Self::QuotaExhausted => "the service's provider account has no quota left",
            Self::Invalid => "the provider refused the request as invalid",
            Self::Credentials => "the provider refused the service's credentials",
            Self::NotFound => "the provider does not know the model or the endpoint",
            Self::TooLarge => "the request is too large for the provider",
            Self::Unprocessable => "the provider could not process the request",
            Self::RateLimited => "rate limited by the provider",
            Self::Timeout => "the provider timed out waiting for the request",
            Self::Conflict => "the provider reported a conflict",
            Self::Overloaded => "the provider is overloaded or unavailable",
            Self::Failed => "the provider failed",
            Self::Redirected => {
                "the provider's configured address answered with a redirect, which is not followed: its base URL needs correcting"
            }
            Self::Refused => "the provider refused the request",
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
    // Tenants read these messages on their attempts: a fixed sentence per class, as
    // for error answers; the transport's own text (host names, addresses) stays in
    // the log.
    let (connect, timeout) = (error.is_connect(), error.is_timeout());
    tracing::warn!(error = %error.without_url(), "provider call failed");
    if connect {
        ProviderError::NotSent {
            message: "the provider could not be reached; nothing was sent".to_owned(),
        }
    } else if timeout {
        ProviderError::OutcomeUnknown {
            message: "the provider did not answer in time".to_owned(),
        }
    } else {
        ProviderError::OutcomeUnknown {
            message: "the connection to the provider broke before the answer was complete"
                .to_owned(),
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
    // Whatever the provider asks, the worker waits at most its own cap; a huge value
    // must not overflow a Duration.
    (seconds.is_finite() && seconds >= 0.0)
        .then(|| Duration::try_from_secs_f64(seconds.min(MAX_RETRY_AFTER_SECONDS)).ok())
        .flatten()
}

/// Longer than any wait the worker honours.
const MAX_RETRY_AFTER_SECONDS: f64 = 86_400.0;

#[cfg(test)]
mod tests {
    use super::*;
    use reqwest::header::HeaderValue;

    /// A server that answers every request `answer` and counts the requests.
    async fn server(answer: String) -> (String, std::sync::Arc<std::sync::atomic::AtomicUsize>) {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let address = listener.local_addr().unwrap();
        let seen = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let counted = seen.clone();
        tokio::spawn(async move {
            while let Ok((mut stream, _)) = listener.accept().await {
                counted.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                let mut buffer = [0; 4096];
                let _ = stream.read(&mut buffer).await;
                let _ = stream.write_all(answer.as_bytes()).await;
            }
        });
        (format!("http://{address}"), seen)
    }

    #[tokio::test]
    async fn a_redirect_is_not_followed() {
        let (elsewhere, reached) =
            server("HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\n{}".into()).await;
        let (provider, _) = server(format!(
            "HTTP/1.1 307 Temporary Redirect\r\nlocation: {elsewhere}/v1/messages\r\ncontent-length: 0\r\n\r\n"
        ))
        .await;
        let transport = Transport::new(Timeouts::default());
        let call = transport
            .post(&format!("{provider}/v1/messages"))
            .header("x-api-key", "secret")
            .body("{}");
        let answer = transport.send(call).await.unwrap();
        assert_eq!(answer.status, StatusCode::TEMPORARY_REDIRECT);
        // Not worth retrying, and the tenant reads why, not a bare refusal.
        match answer.into_error("anthropic", None) {
            ProviderError::Permanent {
                status, message, ..
            } => {
                assert_eq!(status, 307);
                assert!(message.contains("redirect"), "{message}");
            }
            other => panic!("a redirect is permanent: {other:?}"),
        }
        assert_eq!(
            reached.load(std::sync::atomic::Ordering::SeqCst),
            0,
            "nothing reached the redirect's target"
        );
    }

    #[test]
    fn events_split_on_blank_lines_of_either_kind() {
        let body = b"event: a\ndata: 1\n\n: comment\n\ndata: x\r\ndata: y\r\n\r\n";
        let first = find_blank_line(body).unwrap();
        assert_eq!(
            parse_event(&body[..first.0]),
            Some(ServerEvent {
                event: Some("a".into()),
                data: "1".into()
            })
        );
        let rest = &body[first.1..];
        let second = find_blank_line(rest).unwrap();
        assert_eq!(
            parse_event(&rest[..second.0]),
            None,
            "a comment is no event"
        );
        let last = &rest[second.1..];
        let third = find_blank_line(last).unwrap();
        assert_eq!(parse_event(&last[..third.0]).unwrap().data, "x\ny");
    }

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
        headers.insert(RETRY_AFTER, HeaderValue::from_static("1e300"));
        assert_eq!(retry_after(&headers), Some(Duration::from_secs(86_400)));
        // The HTTP-date form is not sent by the providers we talk to.
        headers.insert(
            RETRY_AFTER,
            HeaderValue::from_static("Wed, 21 Oct 2026 07:28:00 GMT"),
        );
        assert_eq!(retry_after(&headers), None);
    }

    #[test]
    fn error_bodies_of_both_shapes_give_their_codes_and_text() {
        let openai = ErrorBody::parse(
            br#"{"error":{"message":"too long","type":"invalid_request_error","code":"context_length_exceeded"}}"#,
        );
        assert_eq!(openai.text, "too long");
        assert_eq!(ErrorClass::of(400, &openai), ErrorClass::ContextWindow);
        let anthropic = ErrorBody::parse(
            br#"{"type":"error","error":{"type":"overloaded_error","message":"Overloaded"}}"#,
        );
        assert_eq!(anthropic.text, "Overloaded");
        assert_eq!(ErrorClass::of(529, &anthropic), ErrorClass::Overloaded);
        let quota =
            ErrorBody::parse(br#"{"error":{"message":"pay up","code":"insufficient_quota"}}"#);
        assert_eq!(ErrorClass::of(429, &quota), ErrorClass::QuotaExhausted);
        let page = ErrorBody::parse(b"<html>502</html>");
        assert_eq!(page.text, "<html>502</html>");
        assert_eq!(ErrorClass::of(502, &page), ErrorClass::Failed);
        assert_eq!(ErrorClass::of(429, &page), ErrorClass::RateLimited);
    }
}
