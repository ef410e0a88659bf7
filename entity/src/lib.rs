//! SeaORM entities for jobledger, one module per table.
//!
//! Storage conventions shared by every table:
//! - ids are UUIDs made in Rust (version 7, so they sort by creation time);
//! - money is a BIGINT of nano-credits (`*_nanos`), read as [`Credits`], so sums are
//!   exact on SQLite too;
//! - time is a [`Timestamp`]: BIGINT microseconds since the Unix epoch, UTC, so that
//!   comparisons in SQL (`lease_until < now`) are integer comparisons on both backends;
//! - JSON is a [`JsonText`]: serialized text, so any JSON value round-trips exactly.

pub mod access_tokens;
pub mod api_keys;
pub mod attempt_reconciliations;
pub mod attempts;
pub mod batches;
pub mod charges;
pub mod credit_grants;
pub mod credit_reservations;
mod credits;
pub mod hold_backings;
pub mod job_events;
pub mod job_labels;
pub mod jobs;
mod json_text;
pub mod ledger_entries;
pub mod model_prices;
pub mod provider_batches;
pub mod rate_limit_buckets;
mod spend_period;
pub mod tenant_limits;
pub mod tenants;
mod timestamp;
mod values;
pub mod webhook_deliveries;
pub mod webhooks;

pub use credits::{Credits, CreditsError};
pub use json_text::JsonText;
pub use spend_period::SpendPeriod;
pub use timestamp::Timestamp;
pub use values::{
    ApiKeyRole, AttemptOutcome, BatchMode, BatchStatus, BucketScope, EventKind, JobErrorCode,
    JobStatus, LedgerEntryKind, PriceOrigin, ProviderBatchState, ProviderFamily, ReservationStatus,
    WebhookDeliveryStatus, WebhookEvent,
};
