//! Money: the `Credits` type, model prices, and the ledger that holds, charges and
//! releases credits.

pub mod audit;
mod credits;
pub mod ledger;
pub mod prices;
pub mod reconciliation;
pub mod reports;

pub use credits::{Credits, CreditsError};
pub use prices::{ModelPrice, PricePerMillion, TokenUsage};
