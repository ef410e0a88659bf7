//! What a request may cost, checked at three points:
//!
//! - before validation, on the text and the parsed document ([`check_text`],
//!   [`check_document`]): bytes, tokens, nesting, and the selections, aliases and
//!   directives the document holds once its fragments are expanded — counted without
//!   expanding them, so a fragment bomb is refused in microseconds instead of being
//!   expanded by the validator for seconds;
//! - at validation, by async-graphql's complexity limit, with list fields multiplied by
//!   how many items they may return ([`page_complexity`], [`LISTED_ATTEMPTS`],
//!   [`LISTED_EVENTS`]);
//! - during execution, by [`ResponseMeter`]: the resolved values are measured as they
//!   are produced, and once the response would pass its byte limit nothing more is
//!   resolved.
//!
//! The schema runs the first and the last through the [`CostLimits`] extension, so
//! every transport (HTTP, WebSocket, SSE) gets them.

mod document;
mod extension;
mod response;
mod text;

pub use document::{DocumentCost, check_document, measure};
pub use extension::{CostLimits, StreamingTransport};
pub use response::{MAX_RESPONSE_BYTES, ResponseMeter};
pub use text::check_text;

use crate::jobs::input::MAX_ATTEMPTS_CAP;
use crate::page::{DEFAULT_PAGE_SIZE, MAX_PAGE_SIZE};

/// How much one request's document may ask for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct QueryBudget {
    /// Bytes of query text.
    pub bytes: usize,
    /// Lexical tokens; a string literal is one token however long.
    pub tokens: usize,
    /// Brackets, braces and parentheses open at once.
    pub nesting: usize,
    /// Selected fields, inline fragments and spreads, with fragments expanded.
    pub selections: u64,
    /// Aliased fields, with fragments expanded.
    pub aliases: u64,
    /// Directives, with fragments expanded.
    pub directives: u64,
    /// `__schema` and `__type` fields, with fragments expanded (and each fragment's
    /// definition counted once more): one is what GraphiQL and codegen tools send, and
    /// each answers with much of the schema, so aliases of them multiply the work
    /// and the response of a small request.
    pub introspections: u64,
}

impl QueryBudget {
    /// For a request with a valid API key. Room for every contract operation and for
    /// introspection many times over. Large values (a job's messages) travel as
    /// variables: parsing a literal of megabytes takes the parser seconds of CPU.
    pub const AUTHENTICATED: Self = Self {
        bytes: 256 * 1024,
        tokens: 20_000,
        // Literal JSON values nest too: a job's metadata may nest 32 levels inside the
        // mutation, and deeper ones are refused by its validation, naming the field.
        nesting: 256,
        selections: 10_000,
        aliases: 500,
        directives: 500,
        introspections: 4,
    };

    /// For a request without a key: it can read nothing but the schema, so the budget
    /// fits GraphiQL's introspection query with room to spare and little more.
    pub const ANONYMOUS: Self = Self {
        bytes: 32 * 1024,
        tokens: 3_000,
        nesting: 32,
        selections: 1_000,
        aliases: 20,
        directives: 20,
        introspections: 2,
    };
}

/// Why a document was refused before validation.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum CostError {
    #[error("the query is {bytes} bytes long; at most {limit} are accepted")]
    TooLong { bytes: usize, limit: usize },
    #[error("the query has more than {limit} tokens")]
    TooManyTokens { limit: usize },
    #[error("the query nests more than {limit} levels of brackets")]
    TooDeep { limit: usize },
    #[error(
        "the query selects {count} fields once its fragments are expanded; at most {limit} are accepted"
    )]
    TooManySelections { count: u64, limit: u64 },
    #[error("the query has {count} aliases; at most {limit} are accepted")]
    TooManyAliases { count: u64, limit: u64 },
    #[error("the query has {count} directives; at most {limit} are accepted")]
    TooManyDirectives { count: u64, limit: u64 },
    #[error(
        "the query has {count} introspection fields (__schema, __type); at most {limit} are accepted"
    )]
    TooManyIntrospections { count: u64, limit: u64 },
    #[error("fragment {0} spreads itself")]
    FragmentCycle(String),
}

/// The complexity of a paginated field: what one row selects times the rows the page
/// may hold (`first`, else the default; values the resolver refuses count as the
/// most it would accept).
pub fn page_complexity(first: Option<i32>, child_complexity: usize) -> usize {
    let most = usize::try_from(MAX_PAGE_SIZE).unwrap_or(usize::MAX);
    let rows = match first {
        None => usize::try_from(DEFAULT_PAGE_SIZE).unwrap_or(most),
        Some(first) => usize::try_from(first).map_or(most, |first| first.clamp(1, most)),
    };
    child_complexity.saturating_mul(rows).saturating_add(1)
}

/// The complexity of a field holding a whole JSON document (a job's input or result):
/// up to megabytes loaded and sent whole, so it weighs as much as 50 plain fields.
pub const DOCUMENT_FIELD_COMPLEXITY: usize = 50;

/// The weight of an aggregate report over a tenant's whole history (`billingSummary`,
/// `billingSeries`, `billingByLabel`): a few of them fill a request's budget, so that
/// one tenant's requests cannot hold the database with dozens of aggregates at once.
pub const REPORT_COMPLEXITY: usize = 2_500;

/// Attempts a job lists, for the complexity estimate: its most paid calls. Hand-backs
/// can add a few more; the response meter bounds what the estimate misses.
pub const LISTED_ATTEMPTS: usize = MAX_ATTEMPTS_CAP as usize;

/// Events a job lists, for the complexity estimate: created, a start and a retry per
/// attempt, a cancel request and the end.
pub const LISTED_EVENTS: usize = 2 * LISTED_ATTEMPTS + 3;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pages_multiply_what_a_row_selects() {
        assert_eq!(page_complexity(Some(100), 4), 401);
        assert_eq!(page_complexity(None, 4), 81);
        assert_eq!(page_complexity(Some(-1), 4), 401);
        assert_eq!(page_complexity(Some(i32::MAX), usize::MAX), usize::MAX);
    }
}
