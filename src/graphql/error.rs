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
    /// Too many live subscriptions on one connection or for one tenant.
    SubscriptionLimit,
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
            Self::SubscriptionLimit => "SUBSCRIPTION_LIMIT",
            Self::Internal => "INTERNAL",
        }
    }

    /// A GraphQL error with this code.
    pub fn error(self, message: impl Into<String>) -> async_graphql::Error {
        async_graphql::Error::new(message).extend_with(|_, extensions| {
            extensions.set("code", self.as_str());
        })
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
            ServiceError::Database(cause) => {
                // The cause goes to the log, never to the client.
                tracing::error!(error = %cause, "database error while serving a request");
                return ErrorCode::Internal.error("internal error");
            }
        };
        code.error(error.to_string())
    }
}
