//! The price versions a job's hold was sized with.
//!
//! A create quotes the job at the prices in force then, and holds that quote. Should a
//! price change before an attempt runs, the attempt charges the customer at the held
//! version — the quote is what the customer agreed to — and records its provider cost
//! at the version in force when it ran, which is what the provider bills: the operator
//! absorbs a rise and keeps a fall. Without this a rise between create and start made
//! the first call's customer bound outgrow the hold, and the job failed without a call.

use super::ModelPrice;
use entity::{JsonText, jobs};
use sea_orm::{ConnectionTrait, DbErr};
use std::collections::hash_map::Entry;
use std::collections::{BTreeMap, HashMap};
use uuid::Uuid;

/// The version held for each model of a job's chain, by model name.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct HeldPrices(BTreeMap<String, Uuid>);

impl HeldPrices {
    /// Records that the hold was sized with `price` for its model.
    pub fn hold(&mut self, price: &ModelPrice) {
        self.0.insert(price.model.clone(), price.id);
    }

    /// The versions a job row stores (`jobs.held_prices`); `None` for a job written
    /// before holds recorded them, or whose column cannot be read: it is charged at
    /// the price in force when each attempt runs.
    pub fn stored(column: Option<&JsonText>) -> Option<Self> {
        column
            .and_then(|column| serde_json::from_value(column.0.clone()).ok())
            .map(Self)
    }

    /// What the job row stores.
    pub fn to_column(&self) -> JsonText {
        JsonText(serde_json::to_value(&self.0).expect("a map of names to ids serializes"))
    }

    /// The version held for `model`, if the job holds one for it.
    pub fn version_of(&self, model: &str) -> Option<Uuid> {
        self.0.get(model).copied()
    }
}

/// The price an attempt of `job` on its current model runs at: `current`, the version
/// in force now, charged at the version the job holds for the model. A job that holds
/// none (created before holds recorded them) runs at `current` on both sides, as it
/// always did; so does one whose held version is not stored (never expected): the
/// budget then refuses a call its hold does not cover at that price, and says so.
/// `read`: the versions read so far, by id, that a caller pricing several attempts
/// shares.
pub async fn attempt_price(
    db: &impl ConnectionTrait,
    job: &jobs::Model,
    current: ModelPrice,
    read: &mut HashMap<Uuid, Option<ModelPrice>>,
) -> Result<ModelPrice, DbErr> {
    let Some(held_id) = HeldPrices::stored(job.held_prices.as_ref())
        .and_then(|held| held.version_of(&job.model))
        .filter(|held_id| *held_id != current.id)
    else {
        return Ok(current);
    };
    let held = match read.entry(held_id) {
        Entry::Occupied(read) => read.into_mut(),
        Entry::Vacant(unread) => {
            unread.insert(super::versions(db, [held_id]).await?.remove(&held_id))
        }
    };
    match held {
        Some(held) => Ok(current.charged_at(held)),
        None => {
            tracing::error!(
                job.id = %job.id, model = %job.model, price.id = %held_id,
                "the price version the job was held at is not stored; pricing the attempt at the one in force"
            );
            Ok(current)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::billing::Credits;
    use crate::billing::prices::{BatchPrice, BatchRates, PricePerMillion, Rates};

    fn price(version: i32, nanos: i64) -> ModelPrice {
        let rate = |nanos| PricePerMillion(Credits::from_nanos(nanos));
        let rates = |nanos| Rates {
            input: rate(nanos),
            cached_input: rate(nanos),
            output: rate(nanos),
        };
        let id = Uuid::now_v7();
        ModelPrice {
            id,
            model: "m".into(),
            version,
            provider: rates(nanos),
            customer: rates(2 * nanos),
            batch: Some(BatchPrice {
                provider: BatchRates {
                    input: rate(nanos / 2),
                    output: rate(nanos / 2),
                },
                customer: BatchRates {
                    input: rate(nanos),
                    output: rate(nanos),
                },
            }),
            limits: Default::default(),
            source: String::new(),
            customer_version: id,
        }
    }

    #[test]
    fn a_held_version_sets_the_customer_side_and_leaves_the_provider_side() {
        let held = price(1, 1_000);
        let now = price(2, 3_000);
        let charged = now.clone().charged_at(&held);
        assert_eq!(charged.id, now.id, "the attempt names the version in force");
        assert_eq!(charged.customer_version, held.id);
        assert_eq!(charged.provider, now.provider);
        assert_eq!(charged.customer, held.customer);
        let batch = charged.batch.unwrap();
        assert_eq!(batch.provider, now.batch.unwrap().provider);
        assert_eq!(batch.customer, held.batch.unwrap().customer);
        let view = charged.batch_view().unwrap();
        assert_eq!(view.customer_version, held.id);
        assert_eq!(view.customer.input, held.batch.unwrap().customer.input);
    }

    #[test]
    fn held_versions_survive_their_column() {
        let mut held = HeldPrices::default();
        let (a, b) = (price(1, 1), price(4, 1));
        held.hold(&a);
        held.hold(&ModelPrice {
            model: "n".into(),
            ..b.clone()
        });
        let stored = HeldPrices::stored(Some(&held.to_column())).unwrap();
        assert_eq!(stored, held);
        assert_eq!(stored.version_of("m"), Some(a.id));
        assert_eq!(stored.version_of("n"), Some(b.id));
        assert_eq!(stored.version_of("o"), None);
        assert_eq!(HeldPrices::stored(None), None);
        assert_eq!(
            HeldPrices::stored(Some(&JsonText(serde_json::json!(7)))),
            None
        );
    }
}
