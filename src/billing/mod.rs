//! Money: the `Credits` type, model prices, and the ledger that holds, charges and
//! releases credits.

mod credits;
pub mod ledger;
pub mod prices;

pub use credits::{Credits, CreditsError};
pub use prices::{ModelPrice, PricePerMillion, TokenUsage};
