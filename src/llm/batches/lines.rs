//! A batch's results, read as a stream of JSON lines from one or more bodies (OpenAI
//! has an output and an error file), never held whole.

use super::{ResultLine, unreadable};
use crate::llm::ProviderError;
use crate::llm::http::Transport;
use futures_util::StreamExt;
use futures_util::stream::BoxStream;
use std::collections::VecDeque;

/// Longest result line read: far above any completion a call may hold.
const MAX_LINE_BYTES: usize = 64 * 1024 * 1024;

/// How a line of one provider's results reads.
pub(super) type ParseLine = fn(&str, &[u8]) -> Result<ResultLine, ProviderError>;

/// The results of one batch, line by line.
pub struct ResultLines {
    provider: String,
    http: Transport,
    /// Bodies still to read, each a prepared GET.
    pending: VecDeque<reqwest::RequestBuilder>,
    body: Option<BoxStream<'static, reqwest::Result<axum::body::Bytes>>>,
    buffer: Vec<u8>,
    parse: ParseLine,
}

impl ResultLines {
    pub(super) fn new(
        provider: &str,
        http: Transport,
        bodies: Vec<reqwest::RequestBuilder>,
        parse: ParseLine,
    ) -> Self {
        Self {
            provider: provider.to_owned(),
            http,
            pending: bodies.into(),
            body: None,
            buffer: Vec::new(),
            parse,
        }
    }

    /// The next result, `None` after the last. An error leaves the rest unread: the
    /// caller reads the results again later (settling a line twice changes nothing).
    pub async fn next(&mut self) -> Result<Option<ResultLine>, ProviderError> {
        loop {
            if let Some(end) = self.buffer.iter().position(|byte| *byte == b'\n') {
                let line: Vec<u8> = self.buffer.drain(..=end).collect();
                if line.iter().all(u8::is_ascii_whitespace) {
                    continue;
                }
                return (self.parse)(&self.provider, &line).map(Some);
            }
            if self.buffer.len() > MAX_LINE_BYTES {
                return Err(unreadable("a result line is too long", &self.buffer.len()));
            }
            match &mut self.body {
                Some(body) => match body.next().await {
                    Some(Ok(chunk)) => self.buffer.extend_from_slice(&chunk),
                    Some(Err(error)) => {
                        return Err(ProviderError::OutcomeUnknown {
                            message: format!("reading the batch results failed: {error}"),
                        });
                    }
                    None => {
                        self.body = None;
                        // A last line without its newline.
                        if !self.buffer.iter().all(u8::is_ascii_whitespace) {
                            self.buffer.push(b'\n');
                        } else {
                            self.buffer.clear();
                        }
                    }
                },
                None => {
                    let Some(call) = self.pending.pop_front() else {
                        return Ok(None);
                    };
                    match self.http.open(call).await? {
                        Ok(response) => self.body = Some(response.bytes_stream().boxed()),
                        Err(answer) => return Err(answer.into_error(&self.provider, None)),
                    }
                }
            }
        }
    }
}
