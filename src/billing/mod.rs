//! Money: the `Credits` type, model prices, the ledger that holds, charges and
//! releases credits, and the account alerts its changes raise (written to the outbox).

pub mod alerts;
pub mod audit;
pub mod balance;
pub mod batch_totals;
pub mod grant_expiry;
pub mod ledger;
pub mod limits;
pub mod policy;
pub mod prices;
pub mod reconciliation;
pub mod reports;
pub mod token_spend;

// Credits are billing's unit, but the type lives in `entity` so that the layers below
// billing (the service error, the outbox, metrics) can name amounts without it.
pub use entity::{Credits, CreditsError};
pub use policy::{AttemptEnding, CallBound, ChargingPolicy, UnfinishedCall};
pub use prices::{ModelPrice, PricePerMillion};
