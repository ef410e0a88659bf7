//! `[mock:...]` directives: the in-band remote control that lets a test
//! steer the simulator through ordinary message text, so the client under
//! test needs no special hooks.

use std::mem;

use axum::http::StatusCode;

const OPEN: &str = "[mock:";

/// Reply text for `[mock:invalid_json]`: it opens an object and never closes
/// it, so any JSON parser rejects it.
pub(super) const NOT_JSON: &str = "this is not JSON {";

/// The directives found across every text of one request.
///
/// A directive given twice keeps its last value, so a later message can
/// override an earlier one.
#[derive(Debug, Default, Clone, PartialEq)]
pub(super) struct Directives {
    pub delay_ms: Option<u64>,
    /// Pause between the chunks of a streamed answer.
    pub chunk_delay_ms: Option<u64>,
    pub status: Option<StatusCode>,
    pub retry_after: Option<String>,
    pub fail_first: Option<u64>,
    pub hang: bool,
    pub drop: bool,
    pub reply: Option<String>,
    pub invalid_json: bool,
    /// The faults hit only calls of this model; other models answer normally.
    pub fail_model: Option<String>,
    /// In a batch: expire the first time this content is in one.
    pub batch_expire: bool,
    /// Answer with one call of this tool, its arguments the `reply`.
    pub tool_call: Option<String>,
}

impl Directives {
    /// Collects the directives of all `texts`, in order.
    pub(super) fn parse<'a>(texts: impl IntoIterator<Item = &'a str>) -> Self {
        let mut found = Self::default();
        for text in texts {
            for piece in Pieces::new(text) {
                if let Piece::Directive(body) = piece {
                    found.apply(body);
                }
            }
        }
        found
    }

    fn apply(&mut self, body: &str) {
        let (name, value) = match body.split_once('=') {
            Some((name, value)) => (name.trim(), Some(value)),
            None => (body.trim(), None),
        };
        match (name, value) {
            ("delay_ms", Some(ms)) => {
                if let Ok(ms) = ms.trim().parse() {
                    self.delay_ms = Some(ms);
                }
            }
            ("chunk_delay_ms", Some(ms)) => {
                if let Ok(ms) = ms.trim().parse() {
                    self.chunk_delay_ms = Some(ms);
                }
            }
            ("status", Some(code)) => {
                // Only error statuses make sense: the success path is the default.
                if let Ok(code) = code.trim().parse::<u16>()
                    && let Ok(status) = StatusCode::from_u16(code)
                    && (status.is_client_error() || status.is_server_error())
                {
                    self.status = Some(status);
                }
            }
            ("retry_after", Some(seconds)) => self.retry_after = Some(seconds.trim().to_owned()),
            ("fail_first", Some(count)) => {
                if let Ok(count) = count.trim().parse() {
                    self.fail_first = Some(count);
                }
            }
            ("hang", _) => self.hang = true,
            ("drop", _) => self.drop = true,
            // Kept verbatim: the text may be JSON whose whitespace matters to the test.
            ("reply", Some(text)) => self.reply = Some(text.to_owned()),
            ("invalid_json", _) => self.invalid_json = true,
            ("fail_model", Some(model)) => self.fail_model = Some(model.trim().to_owned()),
            ("batch_expire", _) => self.batch_expire = true,
            ("tool_call", Some(name)) => self.tool_call = Some(name.trim().to_owned()),
            _ => tracing::debug!(directive = body, "ignoring unknown mock directive"),
        }
    }
}

/// `text` without its directives, as a model would "see" the user's words.
pub(super) fn strip(text: &str) -> String {
    Pieces::new(text)
        .filter_map(|piece| match piece {
            Piece::Text(text) => Some(text),
            Piece::Directive(_) => None,
        })
        .collect()
}

enum Piece<'a> {
    Text(&'a str),
    /// What stands between `[mock:` and the closing `]`.
    Directive(&'a str),
}

/// Splits a text into prose and directives.
struct Pieces<'a> {
    rest: &'a str,
}

impl<'a> Pieces<'a> {
    fn new(text: &'a str) -> Self {
        Self { rest: text }
    }
}

impl<'a> Iterator for Pieces<'a> {
    type Item = Piece<'a>;

    fn next(&mut self) -> Option<Piece<'a>> {
        if self.rest.is_empty() {
            return None;
        }
        let Some(start) = self.rest.find(OPEN) else {
            return Some(Piece::Text(mem::take(&mut self.rest)));
        };
        if start > 0 {
            let (text, rest) = self.rest.split_at(start);
            self.rest = rest;
            return Some(Piece::Text(text));
        }
        let body = &self.rest[OPEN.len()..];
        match closing_bracket(body) {
            Some(end) => {
                self.rest = &body[end + 1..];
                Some(Piece::Directive(&body[..end]))
            }
            None => {
                // Unterminated: it is just text that happens to look like a directive.
                let (text, rest) = self.rest.split_at(OPEN.len());
                self.rest = rest;
                Some(Piece::Text(text))
            }
        }
    }
}

/// Byte offset of the `]` that closes a directive body.
///
/// `reply=` bodies may carry JSON, so nested brackets are balanced and
/// brackets inside JSON strings are skipped. Text that is not well-formed in
/// that sense (a lone `"`, a stray `[`) falls back to looser rules rather than
/// swallowing the rest of the message.
fn closing_bracket(body: &str) -> Option<usize> {
    balanced_close(body, true)
        .or_else(|| balanced_close(body, false))
        .or_else(|| body.find(']'))
}

fn balanced_close(body: &str, skip_strings: bool) -> Option<usize> {
    let mut depth = 0usize;
    let mut in_string = false;
    let mut escaped = false;
    for (at, ch) in body.char_indices() {
        if in_string {
            match ch {
                _ if escaped => escaped = false,
                '\\' => escaped = true,
                '"' => in_string = false,
                _ => {}
            }
            continue;
        }
        match ch {
            '"' if skip_strings => in_string = true,
            '[' => depth += 1,
            ']' if depth == 0 => return Some(at),
            ']' => depth -= 1,
            _ => {}
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn combines_directives_from_several_texts() {
        let found = Directives::parse([
            "hi [mock:status=429][mock:retry_after=7]",
            "[mock:delay_ms=15] and [mock:fail_first=2] [mock:bogus=1] [mock:hang]",
        ]);
        assert_eq!(found.status, Some(StatusCode::TOO_MANY_REQUESTS));
        assert_eq!(found.retry_after.as_deref(), Some("7"));
        assert_eq!(found.delay_ms, Some(15));
        assert_eq!(found.fail_first, Some(2));
        assert!(found.hang);
        assert!(!found.drop);
        assert_eq!(found.fail_model, None);
        let aimed = Directives::parse(["[mock:status=500][mock:fail_model= gpt-4o ]"]);
        assert_eq!(aimed.fail_model.as_deref(), Some("gpt-4o"));
        assert!(!found.batch_expire);
        assert!(Directives::parse(["x [mock:batch_expire]"]).batch_expire);
        let call = Directives::parse([r#"[mock:tool_call= weather ][mock:reply={"city":"Oslo"}]"#]);
        assert_eq!(call.tool_call.as_deref(), Some("weather"));
        assert_eq!(call.reply.as_deref(), Some(r#"{"city":"Oslo"}"#));
    }

    #[test]
    fn later_directive_wins_and_bad_values_are_ignored() {
        let found = Directives::parse(["[mock:status=500] [mock:status=503] [mock:status=200]"]);
        assert_eq!(found.status, Some(StatusCode::SERVICE_UNAVAILABLE));
        let found = Directives::parse(["[mock:delay_ms=soon] [mock:status=abc]"]);
        assert_eq!(found, Directives::default());
    }

    #[test]
    fn reply_may_hold_json_with_brackets_and_quotes() {
        let found = Directives::parse([r#"x [mock:reply={"a":[1,2],"b":"]"}] y"#]);
        assert_eq!(found.reply.as_deref(), Some(r#"{"a":[1,2],"b":"]"}"#));
    }

    #[test]
    fn reply_with_a_lone_quote_or_bracket_still_terminates() {
        let found = Directives::parse([r#"[mock:reply=say "hi] tail"#]);
        assert_eq!(found.reply.as_deref(), Some(r#"say "hi"#));
        let found = Directives::parse(["[mock:reply=a [b] tail"]);
        assert_eq!(found.reply.as_deref(), Some("a [b"));
    }

    #[test]
    fn strip_keeps_prose_and_unterminated_directives() {
        assert_eq!(strip("a [mock:hang]b[mock:x=1] c"), "a b c");
        assert_eq!(strip("open [mock:hang"), "open [mock:hang");
    }
}
