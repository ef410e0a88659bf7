//! The error of the service layer: what a job, billing or account operation can refuse.

use entity::Credits;
use entity::SpendPeriod;

/// Why a service operation did not happen.
#[derive(Debug, thiserror::Error)]
pub enum ServiceError {
    /// The input breaks a rule; the message says which, in words meant for the caller.
    #[error("{0}")]
    Validation(String),
    /// The thing does not exist, or the caller may not know that it does.
    #[error("not found")]
    NotFound,
    /// The caller is known but this operation is not theirs to perform.
    #[error("forbidden")]
    Forbidden,
    /// The idempotency key was used before with a different request.
    #[error("idempotency key already used with a different request")]
    IdempotencyConflict,
    /// The tenant's available balance does not cover the hold (of a job, or of a
    /// batch chunk's items together).
    #[error("insufficient credits: a hold of {needed} is needed, {available} is available")]
    InsufficientCredits { needed: Credits, available: Credits },
    /// The hold (of a job, or of a chunk's items) would take the tenant's spend in a
    /// period past its cap.
    #[error(
        "spend limit exceeded: a hold of {needed} is needed; the {} spend is {spend} of a limit of {limit}",
        period_name(*period)
    )]
    SpendLimitExceeded {
        period: SpendPeriod,
        limit: Credits,
        spend: Credits,
        needed: Credits,
    },
    /// The hold would take an access token's creates past its `maxSpend`.
    #[error(
        "the access token's spend limit is exceeded: a hold of {needed} is needed; it has held {spent} of its limit of {limit}"
    )]
    TokenSpendExceeded {
        limit: Credits,
        spent: Credits,
        needed: Credits,
    },
    #[error("database error: {0}")]
    Database(#[from] sea_orm::DbErr),
}

impl ServiceError {
    /// A validation error with the given message.
    pub fn validation(message: impl Into<String>) -> Self {
        Self::Validation(message.into())
    }
}

fn period_name(period: SpendPeriod) -> &'static str {
    match period {
        SpendPeriod::Day => "day's",
        SpendPeriod::Month => "month's",
    }
}
