//! The schema extension that applies the cost limits to every request, whatever its
//! transport.

use super::{CostError, QueryBudget, ResponseMeter, check_document, check_text};
use crate::accounts::Principal;
use crate::graphql::ApiErrorCode;
use async_graphql::extensions::{
    Extension, ExtensionContext, ExtensionFactory, NextExecute, NextParseQuery, NextResolve,
    ResolveInfo,
};
use async_graphql::parser::types::{ExecutableDocument, OperationType};
use async_graphql::{Response, ServerError, ServerResult, Value, Variables};
use std::sync::Arc;

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
            |error: CostError| ApiErrorCode::QueryTooComplex.request_error(error.to_string());
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
            return Err(ApiErrorCode::Validation.request_error(
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
            meter.mark_started();
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
            && !meter.charge_leaf(key_bytes, value)
        {
            return Err(meter.error());
        }
        Ok(value)
    }
}
