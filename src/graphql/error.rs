//! How service errors reach GraphQL clients: a message safe to show and a stable
//! `extensions.code`.

use crate::error::ServiceError;
use async_graphql::ErrorExtensions;

/// The codes clients can branch on, in `extensions.code`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ErrorCode {
    Unauthenticated,
    Forbidden,
    NotFound,
    Validation,
    IdempotencyConflict,
    InsufficientCredits,
    /// The job would take the tenant's spend in a day or month past its cap.
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
    Internal,
}

impl ErrorCode {
    /// The code's text.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Unauthenticated => "UNAUTHENTICATED",
            Self::Forbidden => "FORBIDDEN",
            Self::NotFound => "NOT_FOUND",
            Self::Validation => "VALIDATION",
            Self::IdempotencyConflict => "IDEMPOTENCY_CONFLICT",
            Self::InsufficientCredits => "INSUFFICIENT_CREDITS",
            Self::SpendLimitExceeded => "SPEND_LIMIT_EXCEEDED",
            Self::SubscriptionLimit => "SUBSCRIPTION_LIMIT",
            Self::QueryTooComplex => "QUERY_TOO_COMPLEX",
            Self::ResponseTooLarge => "RESPONSE_TOO_LARGE",
            Self::TooManyRequests => "TOO_MANY_REQUESTS",
            Self::Internal => "INTERNAL",
        }
    }

    /// A GraphQL error with this code.
    pub fn error(self, message: impl Into<String>) -> async_graphql::Error {
        async_graphql::Error::new(message).extend_with(|_, extensions| {
            extensions.set("code", self.as_str());
        })
    }

    /// An error about the whole request, found before execution: no location, no path.
    pub fn request_error(self, message: impl Into<String>) -> async_graphql::ServerError {
        let mut error = async_graphql::ServerError::new(message, None);
        error.extensions = self.error(String::new()).extensions;
        error
    }
}

impl From<ServiceError> for async_graphql::Error {
    fn from(error: ServiceError) -> Self {
        let code = match &error {
            ServiceError::Validation(_) => ErrorCode::Validation,
            ServiceError::NotFound => ErrorCode::NotFound,
            ServiceError::Forbidden => ErrorCode::Forbidden,
            ServiceError::IdempotencyConflict => ErrorCode::IdempotencyConflict,
            ServiceError::InsufficientCredits { .. } => ErrorCode::InsufficientCredits,
            ServiceError::SpendLimitExceeded {
                period,
                limit,
                spend,
                ..
            } => {
                // Amounts as strings, like the `Decimal` scalar.
                let (period, limit, spend) =
                    (period.as_str(), limit.to_string(), spend.to_string());
                return ErrorCode::SpendLimitExceeded
                    .error(error.to_string())
                    .extend_with(|_, extensions| {
                        extensions.set("period", period);
                        extensions.set("limit", limit);
                        extensions.set("spend", spend);
                    });
            }
            ServiceError::Database(cause) => {
                // The cause goes to the log, never to the client.
                tracing::error!(error = %cause, "database error while serving a request");
                return ErrorCode::Internal.error("internal error");
            }
        };
        code.error(error.to_string())
    }
}
