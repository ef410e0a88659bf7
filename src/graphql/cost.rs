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

use super::ErrorCode;
use crate::accounts::Principal;
use crate::jobs::input::MAX_ATTEMPTS_CAP;
use crate::jobs::service::MAX_PAGE_SIZE;
use async_graphql::extensions::{
    Extension, ExtensionContext, ExtensionFactory, NextExecute, NextParseQuery, NextResolve,
    ResolveInfo,
};
use async_graphql::parser::types::{
    DocumentOperations, ExecutableDocument, OperationType, Selection, SelectionSet,
};
use async_graphql::{Name, Response, ServerError, ServerResult, Value, Variables};
use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};

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
    #[error("fragment {0} spreads itself")]
    FragmentCycle(String),
}

/// Checks the raw text in one pass that stops at the first limit passed: its length,
/// its tokens (punctuators, names, numbers, strings, as the GraphQL lexer would cut
/// them, close enough to budget by) and how deeply brackets nest. Run before parsing,
/// whose time and memory grow with tokens and nesting.
pub fn check_text(query: &str, budget: &QueryBudget) -> Result<(), CostError> {
    if query.len() > budget.bytes {
        return Err(CostError::TooLong {
            bytes: query.len(),
            limit: budget.bytes,
        });
    }
    let bytes = query.as_bytes();
    let mut index = 0;
    let mut tokens = 0;
    let mut depth = 0_usize;
    while index < bytes.len() {
        match bytes[index] {
            b' ' | b'\t' | b'\n' | b'\r' | b',' => {
                index += 1;
                continue;
            }
            b'#' => {
                while index < bytes.len() && !matches!(bytes[index], b'\n' | b'\r') {
                    index += 1;
                }
                continue;
            }
            b'"' if bytes[index..].starts_with(b"\"\"\"") => {
                index = block_string_end(bytes, index + 3);
            }
            b'"' => index = string_end(bytes, index + 1),
            b'{' | b'[' | b'(' => {
                depth += 1;
                if depth > budget.nesting {
                    return Err(CostError::TooDeep {
                        limit: budget.nesting,
                    });
                }
                index += 1;
            }
            b'}' | b']' | b')' => {
                depth = depth.saturating_sub(1);
                index += 1;
            }
            b'.' if bytes[index..].starts_with(b"...") => index += 3,
            byte if is_word_byte(byte) => {
                while index < bytes.len() && is_word_byte(bytes[index]) {
                    index += 1;
                }
            }
            // Any other punctuator (`!`, `$`, `:`, `=`, `@`, `|`, `&`), or a byte the
            // parser will refuse.
            _ => index += 1,
        }
        tokens += 1;
        if tokens > budget.tokens {
            return Err(CostError::TooManyTokens {
                limit: budget.tokens,
            });
        }
    }
    Ok(())
}

/// Names, numbers and anything non-ASCII (refused by the parser, counted here).
fn is_word_byte(byte: u8) -> bool {
    byte.is_ascii_alphanumeric() || matches!(byte, b'_' | b'-' | b'+' | b'.') || byte >= 0x80
}

/// The index after the `"` that closes a string whose contents start at `index`, or
/// the end of the line when it never closes (the parser reports that).
fn string_end(bytes: &[u8], mut index: usize) -> usize {
    while index < bytes.len() {
        match bytes[index] {
            b'\\' => index += 2,
            b'"' => return index + 1,
            b'\n' | b'\r' => return index,
            _ => index += 1,
        }
    }
    bytes.len()
}

/// The index after the `"""` that closes a block string whose contents start at
/// `index` (`\"""` inside does not close it).
fn block_string_end(bytes: &[u8], mut index: usize) -> usize {
    while index < bytes.len() {
        if bytes[index..].starts_with(b"\\\"\"\"") {
            index += 4;
        } else if bytes[index..].starts_with(b"\"\"\"") {
            return index + 3;
        } else {
            index += 1;
        }
    }
    bytes.len()
}

/// What a parsed document holds once every fragment spread is replaced by its
/// fragment, as validation and execution see it.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct DocumentCost {
    pub selections: u64,
    pub aliases: u64,
    pub directives: u64,
}

impl DocumentCost {
    fn add(self, other: Self) -> Self {
        Self {
            selections: self.selections.saturating_add(other.selections),
            aliases: self.aliases.saturating_add(other.aliases),
            directives: self.directives.saturating_add(other.directives),
        }
    }
}

/// Measures `document` and refuses it when it passes `budget`.
pub fn check_document(
    document: &ExecutableDocument,
    budget: &QueryBudget,
) -> Result<DocumentCost, CostError> {
    let cost = measure(document)?;
    if cost.selections > budget.selections {
        return Err(CostError::TooManySelections {
            count: cost.selections,
            limit: budget.selections,
        });
    }
    if cost.aliases > budget.aliases {
        return Err(CostError::TooManyAliases {
            count: cost.aliases,
            limit: budget.aliases,
        });
    }
    if cost.directives > budget.directives {
        return Err(CostError::TooManyDirectives {
            count: cost.directives,
            limit: budget.directives,
        });
    }
    Ok(cost)
}

/// The cost of every operation with its fragments expanded, plus each fragment
/// definition once (validation walks those too). Each fragment's cost is computed
/// once and added at each spread, so a fragment spread twice counts twice without
/// being expanded twice; the sums saturate. A fragment that spreads itself, directly
/// or not, is refused. Spreads of unknown fragments count nothing here: validation
/// refuses them.
pub fn measure(document: &ExecutableDocument) -> Result<DocumentCost, CostError> {
    let mut fragments = FragmentCosts::new(document);
    for name in document.fragments.keys() {
        fragments.resolve(name)?;
    }
    let mut total = document
        .fragments
        .keys()
        .filter_map(|name| fragments.cost_of(name))
        .fold(DocumentCost::default(), DocumentCost::add);
    let operations: Vec<_> = match &document.operations {
        DocumentOperations::Single(operation) => vec![operation],
        DocumentOperations::Multiple(operations) => operations.values().collect(),
    };
    for operation in operations {
        let directives = DocumentCost {
            directives: operation.node.directives.len() as u64,
            ..DocumentCost::default()
        };
        total = total
            .add(directives)
            .add(fragments.selection_set_cost(&operation.node.selection_set.node));
    }
    Ok(total)
}

/// The memoised cost of each fragment of one document.
struct FragmentCosts<'a> {
    document: &'a ExecutableDocument,
    state: HashMap<&'a Name, FragmentState>,
}

#[derive(Clone, Copy)]
enum FragmentState {
    /// Its spreads are being resolved: meeting it again is a cycle.
    InProgress,
    Done(DocumentCost),
}

impl<'a> FragmentCosts<'a> {
    fn new(document: &'a ExecutableDocument) -> Self {
        Self {
            document,
            state: HashMap::new(),
        }
    }

    fn cost_of(&self, name: &Name) -> Option<DocumentCost> {
        match self.state.get(name) {
            Some(FragmentState::Done(cost)) => Some(*cost),
            _ => None,
        }
    }

    /// Computes the cost of fragment `name` and of every fragment it spreads, depth
    /// first with an explicit stack (a chain of thousands of fragments must not
    /// exhaust the thread's stack).
    fn resolve(&mut self, name: &'a Name) -> Result<(), CostError> {
        // (fragment, whether its spreads have been pushed already)
        let mut stack = vec![(name, false)];
        while let Some((name, spreads_pushed)) = stack.pop() {
            let Some(fragment) = self.document.fragments.get(name) else {
                continue;
            };
            let selection_set = &fragment.node.selection_set.node;
            if spreads_pushed {
                let own = DocumentCost {
                    directives: fragment.node.directives.len() as u64,
                    ..DocumentCost::default()
                };
                let cost = own.add(self.selection_set_cost(selection_set));
                self.state.insert(name, FragmentState::Done(cost));
                continue;
            }
            match self.state.get(name) {
                Some(FragmentState::Done(_)) => continue,
                Some(FragmentState::InProgress) => {
                    return Err(CostError::FragmentCycle(name.to_string()));
                }
                None => {}
            }
            self.state.insert(name, FragmentState::InProgress);
            stack.push((name, true));
            let mut spreads = Vec::new();
            spreads_in(selection_set, &mut spreads);
            for spread in spreads {
                match self.state.get(spread) {
                    Some(FragmentState::InProgress) => {
                        return Err(CostError::FragmentCycle(spread.to_string()));
                    }
                    Some(FragmentState::Done(_)) => {}
                    None => stack.push((spread, false)),
                }
            }
        }
        Ok(())
    }

    /// The cost of a selection set whose spreads are all resolved. Recursion follows
    /// the document's nesting, which `check_text` bounds.
    fn selection_set_cost(&self, selection_set: &SelectionSet) -> DocumentCost {
        selection_set
            .items
            .iter()
            .map(|selection| match &selection.node {
                Selection::Field(field) => DocumentCost {
                    selections: 1,
                    aliases: u64::from(field.node.alias.is_some()),
                    directives: field.node.directives.len() as u64,
                }
                .add(self.selection_set_cost(&field.node.selection_set.node)),
                Selection::FragmentSpread(spread) => DocumentCost {
                    selections: 1,
                    directives: spread.node.directives.len() as u64,
                    ..DocumentCost::default()
                }
                .add(
                    self.cost_of(&spread.node.fragment_name.node)
                        .unwrap_or_default(),
                ),
                Selection::InlineFragment(inline) => DocumentCost {
                    selections: 1,
                    directives: inline.node.directives.len() as u64,
                    ..DocumentCost::default()
                }
                .add(self.selection_set_cost(&inline.node.selection_set.node)),
            })
            .fold(DocumentCost::default(), DocumentCost::add)
    }
}

/// The fragments spread anywhere in `selection_set`, without following them.
fn spreads_in<'a>(selection_set: &'a SelectionSet, spreads: &mut Vec<&'a Name>) {
    for selection in &selection_set.items {
        match &selection.node {
            Selection::Field(field) => spreads_in(&field.node.selection_set.node, spreads),
            Selection::FragmentSpread(spread) => spreads.push(&spread.node.fragment_name.node),
            Selection::InlineFragment(inline) => {
                spreads_in(&inline.node.selection_set.node, spreads);
            }
        }
    }
}

/// Rows a page holds when the client gives no `first`: the resolvers' default.
const DEFAULT_PAGE_ROWS: usize = 20;

/// The complexity of a paginated field: what one row selects times the rows the page
/// may hold (`first`, else the default; values the resolver refuses count as the
/// most it would accept).
pub fn page_complexity(first: Option<i32>, child_complexity: usize) -> usize {
    let most = usize::try_from(MAX_PAGE_SIZE).unwrap_or(usize::MAX);
    let rows = match first {
        None => DEFAULT_PAGE_ROWS,
        Some(first) => usize::try_from(first).map_or(most, |first| first.clamp(1, most)),
    };
    child_complexity.saturating_mul(rows).saturating_add(1)
}

/// The complexity of a field holding a whole JSON document (a job's input or result):
/// up to megabytes loaded and sent whole, so it weighs as much as 50 plain fields.
pub const DOCUMENT_FIELD_COMPLEXITY: usize = 50;

/// The weight of an aggregate report over a tenant's whole history
/// (`billingSummary`): a few of them fill a request's budget, so that one tenant's
/// requests cannot hold the database with dozens of aggregates at once.
pub const REPORT_COMPLEXITY: usize = 2_500;

/// Attempts a job lists, for the complexity estimate: its most paid calls. Hand-backs
/// can add a few more; the response meter bounds what the estimate misses.
pub const LISTED_ATTEMPTS: usize = MAX_ATTEMPTS_CAP as usize;

/// Events a job lists, for the complexity estimate: created, a start and a retry per
/// attempt, a cancel request and the end.
pub const LISTED_EVENTS: usize = 2 * LISTED_ATTEMPTS + 3;

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
        ErrorCode::ResponseTooLarge.request_error(format!(
            "the response would be larger than {} bytes: select fewer fields or smaller pages",
            self.limit
        ))
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

/// The cost limits a schema applies to every request, whatever its transport:
///
/// - the pre-pass: the text is checked before it is parsed, the document after,
///   against the budget of a request with a [`Principal`] or of an anonymous one;
/// - [`ResponseMeter`] accounting, for requests that carry an `Arc<ResponseMeter>` in
///   their data (the others run unmetered).
///
/// Every leaf value (scalar, enum, JSON) is measured by serializing it into a counter
/// as soon as its resolver returns it, with its key and punctuation. Leaves hold
/// nearly all of a response's bytes: what they leave out (the keys and braces of
/// objects and lists) grows with the number of fields, which the complexity limit
/// bounds. Once the total passes the limit no further resolver runs, so the response
/// never holds more than the limit plus the one value that crossed it, and the HTTP
/// layer replaces it with the error without serializing it.
pub struct CostLimits;

/// Marks a request that arrived over WebSocket or SSE, where only subscriptions run:
/// queries and mutations go to `/graphql`, whose response limit, request slots and
/// body limits they would otherwise escape.
#[derive(Clone, Copy, Debug)]
pub struct StreamingTransport;

impl ExtensionFactory for CostLimits {
    fn create(&self) -> Arc<dyn Extension> {
        Arc::new(CostLimits)
    }
}

#[async_trait::async_trait]
impl Extension for CostLimits {
    async fn parse_query(
        &self,
        ctx: &ExtensionContext<'_>,
        query: &str,
        variables: &Variables,
        next: NextParseQuery<'_>,
    ) -> ServerResult<ExecutableDocument> {
        let budget = match ctx.data_opt::<Principal>() {
            Some(_) => QueryBudget::AUTHENTICATED,
            None => QueryBudget::ANONYMOUS,
        };
        let too_complex =
            |error: CostError| ErrorCode::QueryTooComplex.request_error(error.to_string());
        check_text(query, &budget).map_err(too_complex)?;
        // Measured on a parse of its own: async-graphql's parse step (`next`) ends with
        // a recursion-depth check that follows every fragment spread, which a fragment
        // bomb turns exponential. The text check bounds this extra parse.
        let document = async_graphql::parser::parse_query(query).map_err(ServerError::from)?;
        check_document(&document, &budget).map_err(too_complex)?;
        if ctx.data_opt::<StreamingTransport>().is_some()
            && document
                .operations
                .iter()
                .any(|(_, operation)| operation.node.ty != OperationType::Subscription)
        {
            return Err(ErrorCode::Validation.request_error(
                "only subscriptions run over WebSocket and SSE; send queries and mutations to /graphql",
            ));
        }
        next.run(ctx, query, variables).await
    }

    async fn execute(
        &self,
        ctx: &ExtensionContext<'_>,
        operation_name: Option<&str>,
        next: NextExecute<'_>,
    ) -> Response {
        if let Some(meter) = ctx.data_opt::<Arc<ResponseMeter>>() {
            meter.started.store(true, Ordering::Relaxed);
        }
        next.run(ctx, operation_name).await
    }

    async fn resolve(
        &self,
        ctx: &ExtensionContext<'_>,
        info: ResolveInfo<'_>,
        next: NextResolve<'_>,
    ) -> ServerResult<Option<Value>> {
        let Some(meter) = ctx.data_opt::<Arc<ResponseMeter>>() else {
            return next.run(ctx, info).await;
        };
        if meter.exceeded() {
            return Err(meter.error());
        }
        let is_leaf = ctx
            .schema_env
            .registry
            .concrete_type_by_name(info.return_type)
            .is_some_and(|ty| ty.is_leaf());
        let key_bytes = info.alias.unwrap_or(info.name).len();
        let value = next.run(ctx, info).await?;
        if is_leaf
            && let Some(value) = &value
            // `"key":value,`
            && !meter.charge(key_bytes + 4 + serialized_len(value))
        {
            return Err(meter.error());
        }
        Ok(value)
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

#[cfg(test)]
mod tests {
    use super::*;
    use async_graphql::parser::parse_query;

    fn fragment_bomb(levels: usize) -> String {
        let mut query = String::from("query{...F0}");
        for level in 0..levels {
            query.push_str(&format!(
                " fragment F{level} on QueryRoot{{...F{next} ...F{next}}}",
                next = level + 1
            ));
        }
        query.push_str(&format!(" fragment F{levels} on QueryRoot{{__typename}}"));
        query
    }

    #[test]
    fn a_fragment_spread_twice_counts_twice_without_being_expanded() {
        let document = parse_query(fragment_bomb(30)).unwrap();
        let cost = measure(&document).unwrap();
        // 2^30 leaves under the operation alone.
        assert!(cost.selections > 1 << 30, "{cost:?}");
        assert!(matches!(
            check_document(&document, &QueryBudget::AUTHENTICATED),
            Err(CostError::TooManySelections { .. })
        ));
    }

    #[test]
    fn fragment_counts_are_exact() {
        let document =
            parse_query("{ a: __typename ...F ...F } fragment F on QueryRoot { b: __typename @skip(if: false) }")
                .unwrap();
        // The operation: one field and two spreads of F (2 selections each with F's
        // field); the definition of F once more.
        assert_eq!(
            measure(&document).unwrap(),
            DocumentCost {
                selections: 3 + 2 + 1,
                aliases: 1 + 2 + 1,
                directives: 2 + 1,
            }
        );
    }

    #[test]
    fn cycles_are_refused() {
        let document = parse_query(
            "{...A} fragment A on QueryRoot {...B} fragment B on QueryRoot {__typename ...A}",
        )
        .unwrap();
        assert!(matches!(
            measure(&document),
            Err(CostError::FragmentCycle(_))
        ));
    }

    #[test]
    fn the_text_check_counts_tokens_strings_as_one_and_nesting() {
        let budget = QueryBudget {
            tokens: 8,
            nesting: 2,
            ..QueryBudget::ANONYMOUS
        };
        // { a ( x : "…long…" ) } — 8 tokens, the string one of them.
        let long = format!("{{ a(x: \"{}\") }}", "y\\\"".repeat(1000));
        assert_eq!(check_text(&long, &budget), Ok(()));
        assert_eq!(
            check_text("{ a b c d e f g h }", &budget),
            Err(CostError::TooManyTokens { limit: 8 })
        );
        assert_eq!(
            check_text("{a{b{c}}}", &budget),
            Err(CostError::TooDeep { limit: 2 })
        );
        assert_eq!(
            check_text("# { { { {\n{ a }", &budget),
            Ok(()),
            "comments are skipped"
        );
        assert_eq!(
            check_text("{ a(x: \"\"\" { { { \\\"\"\" { \"\"\") }", &budget),
            Ok(()),
            "block strings are one token"
        );
    }

    #[test]
    fn pages_multiply_what_a_row_selects() {
        assert_eq!(page_complexity(Some(100), 4), 401);
        assert_eq!(page_complexity(None, 4), 81);
        assert_eq!(page_complexity(Some(-1), 4), 401);
        assert_eq!(page_complexity(Some(i32::MAX), usize::MAX), usize::MAX);
    }
}
