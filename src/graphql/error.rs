//! How service errors reach GraphQL clients: a message safe to show and a stable
//! `extensions.code`.

use crate::error::ServiceError;
use async_graphql::extensions::{
    Extension, ExtensionContext, ExtensionFactory, NextParseQuery, NextRequest, NextSubscribe,
};
use async_graphql::parser::types::ExecutableDocument;
use async_graphql::resolver_utils::EnumType;
use async_graphql::{Enum, ErrorExtensions, Response, ServerError, ServerResult, Variables};
use futures_util::StreamExt;
use futures_util::stream::BoxStream;
use std::sync::Arc;

/// The codes clients can branch on, in `extensions.code`: every error the API
/// answers carries one.
#[derive(Enum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum ApiErrorCode {
    /// No valid API key where one is needed, or a malformed `Authorization` header.
    Unauthenticated,
    /// The caller is known, but the operation or the tenant it names is not theirs.
    Forbidden,
    /// The object does not exist, or belongs to another tenant.
    NotFound,
    /// The input breaks a rule; the message says which.
    Validation,
    /// An idempotency key used again with a different request.
    IdempotencyConflict,
    /// The job's hold is larger than the tenant's available balance.
    InsufficientCredits,
    /// The job would take the tenant's spend in a day or month past its cap, or an
    /// access token's creates past its `maxSpend` (`extensions.period` is `TOKEN`).
    SpendLimitExceeded,
    /// Too many live subscriptions on one connection or for one tenant.
    SubscriptionLimit,
    /// The document asks for more than the request's budget allows (before it runs).
    QueryTooComplex,
    /// The response would pass its byte limit.
    ResponseTooLarge,
    /// Too many requests at once, or too many failed authentications, from one
    /// client.
    TooManyRequests,
    /// The HTTP request is not a GraphQL request: a wrong media type, a body that is
    /// not a JSON object with a query, a mutation over GET, a subscription sent to
    /// `/graphql`.
    BadRequest,
    /// The query text is not a GraphQL document.
    GraphqlParseFailed,
    /// The document does not fit the schema or its variables (an unknown field, a
    /// variable of the wrong type, an unknown operation name) or passes the schema's
    /// depth or complexity limit.
    GraphqlValidationFailed,
    /// The server could not serve the request; the cause is logged, never sent.
    Internal,
}

impl ApiErrorCode {
    /// The code's text: its name in the schema.
    pub fn as_str(self) -> &'static str {
        Self::items()
            .iter()
            .find(|item| item.value == self)
            .map(|item| item.name)
            .expect("every code is an item of its enum")
    }

    /// A GraphQL error with this code.
    pub fn error(self, message: impl Into<String>) -> async_graphql::Error {
        async_graphql::Error::new(message).extend_with(|_, extensions| {
            extensions.set("code", self.as_str());
        })
    }

    /// An error about the whole request, found before execution: no location, no path.
    pub fn request_error(self, message: impl Into<String>) -> ServerError {
        self.given_to(ServerError::new(message, None))
    }

    /// `error` with this code, unless it carries one already.
    pub fn given_to(self, mut error: ServerError) -> ServerError {
        let extensions = error.extensions.get_or_insert_with(Default::default);
        if extensions.get("code").is_none() {
            extensions.set("code", self.as_str());
        }
        error
    }
}

/// Gives every error a response holds a code, whatever its transport: async-graphql's
/// own errors carry none. A document that does not parse is `GRAPHQL_PARSE_FAILED`;
/// any other error without a code comes from async-graphql checking the document, its
/// operation name or its arguments against the schema (validation, and the scalars it
/// parses only while executing), so it is `GRAPHQL_VALIDATION_FAILED`. Registered
/// first, so that it sees the errors of every other extension.
pub struct EveryErrorCoded;

impl ExtensionFactory for EveryErrorCoded {
    fn create(&self) -> Arc<dyn Extension> {
        Arc::new(EveryErrorCoded)
    }
}

fn coded(mut response: Response) -> Response {
    response.errors = std::mem::take(&mut response.errors)
        .into_iter()
        .map(|error| ApiErrorCode::GraphqlValidationFailed.given_to(error))
        .collect();
    response
}

#[async_trait::async_trait]
impl Extension for EveryErrorCoded {
    async fn request(&self, context: &ExtensionContext<'_>, next: NextRequest<'_>) -> Response {
        coded(next.run(context).await)
    }

    fn subscribe<'s>(
        &self,
        context: &ExtensionContext<'_>,
        stream: BoxStream<'s, Response>,
        next: NextSubscribe<'_>,
    ) -> BoxStream<'s, Response> {
        next.run(context, stream).map(coded).boxed()
    }

    async fn parse_query(
        &self,
        context: &ExtensionContext<'_>,
        query: &str,
        variables: &Variables,
        next: NextParseQuery<'_>,
    ) -> ServerResult<ExecutableDocument> {
        next.run(context, query, variables)
            .await
            .map_err(|error| ApiErrorCode::GraphqlParseFailed.given_to(error))
    }
}

impl From<ServiceError> for async_graphql::Error {
    fn from(error: ServiceError) -> Self {
        let code = match &error {
            ServiceError::Validation(_) => ApiErrorCode::Validation,
            ServiceError::NotFound => ApiErrorCode::NotFound,
            ServiceError::Forbidden => ApiErrorCode::Forbidden,
            ServiceError::IdempotencyConflict => ApiErrorCode::IdempotencyConflict,
            ServiceError::InsufficientCredits { .. } => ApiErrorCode::InsufficientCredits,
            ServiceError::SpendLimitExceeded {
                period,
                limit,
                spend,
                ..
            } => {
                // Amounts as strings, like the `Decimal` scalar.
                let (period, limit, spend) =
                    (period.as_str(), limit.to_string(), spend.to_string());
                return ApiErrorCode::SpendLimitExceeded
                    .error(error.to_string())
                    .extend_with(|_, extensions| {
                        extensions.set("period", period);
                        extensions.set("limit", limit);
                        extensions.set("spend", spend);
                    });
            }
            ServiceError::TokenSpendExceeded { limit, spent, .. } => {
                let (limit, spend) = (limit.to_string(), spent.to_string());
                return ApiErrorCode::SpendLimitExceeded
                    .error(error.to_string())
                    .extend_with(|_, extensions| {
                        extensions.set("period", "TOKEN");
                        extensions.set("limit", limit);
                        extensions.set("spend", spend);
                    });
            }
            ServiceError::Database(cause) => {
                // The cause goes to the log, never to the client.
                tracing::error!(error = %cause, "database error while serving a request");
                return ApiErrorCode::Internal.error("internal error");
            }
        };
        code.error(error.to_string())
    }
}
