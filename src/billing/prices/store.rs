//! Storing prices as versions, and which price may replace which.
//!
//! Every price is a new version, never an update: an attempt names the version it was
//! priced with. Where a price comes from decides whether it may replace the newest
//! version: the config file wins over an imported price map, which wins over the
//! built-in list. So a start (which stores the built-in and config prices) never puts
//! a built-in price back over an imported one, and an import leaves a model the config
//! file prices alone.

use super::routes::family_of;
use super::{BatchPrice, ConfiguredPrice, ModelPrice, PricePerMillion};
use entity::{PriceOrigin, Timestamp, model_prices};
use sea_orm::{
    ActiveValue::Set, ColumnTrait, ConnectionTrait, DbErr, EntityTrait, QueryFilter, QueryOrder,
};
use std::collections::HashMap;
use uuid::Uuid;

/// How often a price is stored again after another process stored a version of the
/// same model first: each try reads the newest version again.
const TRIES: usize = 5;

/// What storing one price did.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Stored {
    /// The model's first price.
    Added,
    /// A new version of a model that had a price.
    NewVersion(i32),
    /// The newest version already says the same.
    Unchanged,
    /// The newest version comes from where prices outrank this one's (the config
    /// file over an import, an import over the built-in list): it stays.
    Kept(PriceOrigin),
}

/// Whether a price from `incoming` may replace a newest version from `newest`.
fn may_replace(incoming: PriceOrigin, newest: PriceOrigin) -> bool {
    !matches!(
        (incoming, newest),
        (PriceOrigin::BuiltIn, PriceOrigin::Import) | (PriceOrigin::Import, PriceOrigin::Config)
    )
}

/// Whether `row`, a stored version, charges and routes as `price` would.
fn same_price(row: &model_prices::Model, price: &ConfiguredPrice) -> bool {
    let stored = ModelPrice::from(row.clone());
    stored.provider == price.provider
        && stored.customer == price.customer
        && stored.batch == price.batch
        && stored.limits == price.limits
        && family_of(&row.model, row.provider_family) == family_of(&price.model, price.family)
}

/// Stores `price` as the model's new version, unless the newest version says the same
/// or outranks it. Several processes may do this at once: the unique (model, version)
/// index lets one of them win, and the others look again.
pub async fn store_price(
    db: &impl ConnectionTrait,
    price: &ConfiguredPrice,
    now: Timestamp,
) -> Result<Stored, DbErr> {
    let mut tries = 0;
    loop {
        tries += 1;
        let newest = model_prices::Entity::find()
            .filter(model_prices::Column::Model.eq(&price.model))
            .order_by_desc(model_prices::Column::Version)
            .one(db)
            .await?;
        if let Some(row) = &newest {
            // The same price from the config file takes over a version from elsewhere,
            // so that an import cannot replace it afterwards.
            let claimed = price.origin == PriceOrigin::Config && row.origin != PriceOrigin::Config;
            if same_price(row, price) && !claimed {
                return Ok(Stored::Unchanged);
            }
            if !may_replace(price.origin, row.origin) {
                return Ok(Stored::Kept(row.origin));
            }
        }
        let version = newest.as_ref().map_or(1, |row| row.version + 1);
        match insert_version(db, price, version, now).await {
            Ok(()) => {
                tracing::info!(model = %price.model, version, origin = ?price.origin, "stored a new price version");
                return Ok(if version == 1 {
                    Stored::Added
                } else {
                    Stored::NewVersion(version)
                });
            }
            Err(error) if crate::db::is_unique_violation(&error) && tries < TRIES => {}
            Err(error) => return Err(error),
        }
    }
}

async fn insert_version(
    db: &impl ConnectionTrait,
    price: &ConfiguredPrice,
    version: i32,
    now: Timestamp,
) -> Result<(), DbErr> {
    model_prices::Entity::insert(version_row(price, version, now))
        .exec(db)
        .await
        .map(|_| ())
}

fn version_row(price: &ConfiguredPrice, version: i32, now: Timestamp) -> model_prices::ActiveModel {
    let batch_nanos = |rate: fn(&BatchPrice) -> PricePerMillion| {
        price.batch.as_ref().map(|batch| rate(batch).0.nanos())
    };
    model_prices::ActiveModel {
        id: Set(Uuid::now_v7()),
        model: Set(price.model.clone()),
        version: Set(version),
        provider_input_nanos_per_million: Set(price.provider.input.0.nanos()),
        provider_cached_input_nanos_per_million: Set(price.provider.cached_input.0.nanos()),
        provider_output_nanos_per_million: Set(price.provider.output.0.nanos()),
        customer_input_nanos_per_million: Set(price.customer.input.0.nanos()),
        customer_cached_input_nanos_per_million: Set(price.customer.cached_input.0.nanos()),
        customer_output_nanos_per_million: Set(price.customer.output.0.nanos()),
        effective_from: Set(now),
        source: Set(price.source.clone()),
        context_window: Set(price.limits.context_window.map(i64::from)),
        max_output_tokens: Set(price.limits.max_output_tokens.map(i64::from)),
        provider_batch_input_nanos_per_million: Set(batch_nanos(|b| b.provider.input)),
        provider_batch_output_nanos_per_million: Set(batch_nanos(|b| b.provider.output)),
        customer_batch_input_nanos_per_million: Set(batch_nanos(|b| b.customer.input)),
        customer_batch_output_nanos_per_million: Set(batch_nanos(|b| b.customer.output)),
        created_at: Set(now),
        origin: Set(price.origin),
        provider_family: Set(price.family),
    }
}

/// The newest version of every model that has a price, by model.
pub async fn newest_versions(
    db: &impl ConnectionTrait,
) -> Result<HashMap<String, model_prices::Model>, DbErr> {
    let rows = model_prices::Entity::find()
        .order_by_asc(model_prices::Column::Model)
        .order_by_desc(model_prices::Column::Version)
        .all(db)
        .await?;
    let mut newest = HashMap::new();
    for row in rows {
        newest.entry(row.model.clone()).or_insert(row);
    }
    Ok(newest)
}

/// Versions written by one statement: well within both databases' limits on a
/// statement's parameters.
const ROWS_PER_INSERT: usize = 500;

/// [`store_price`] for many prices at once, against `newest` (read by
/// [`newest_versions`]), writing the new versions [`ROWS_PER_INSERT`] to a statement
/// instead of two statements each. A statement another process beat to one of its
/// versions writes nothing, and its prices are stored one by one instead.
pub async fn store_prices(
    db: &impl ConnectionTrait,
    prices: &[ConfiguredPrice],
    newest: &HashMap<String, model_prices::Model>,
    now: Timestamp,
) -> Result<Vec<Stored>, DbErr> {
    let mut stored = Vec::with_capacity(prices.len());
    // Index into `prices`, and its version, of each price to write.
    let mut to_write: Vec<(usize, i32)> = Vec::new();
    for (index, price) in prices.iter().enumerate() {
        let row = newest.get(&price.model);
        let outcome = match row {
            Some(row) => {
                let claimed =
                    price.origin == PriceOrigin::Config && row.origin != PriceOrigin::Config;
                if same_price(row, price) && !claimed {
                    Some(Stored::Unchanged)
                } else if !may_replace(price.origin, row.origin) {
                    Some(Stored::Kept(row.origin))
                } else {
                    None
                }
            }
            None => None,
        };
        stored.push(outcome.unwrap_or(Stored::Added));
        if outcome.is_none() {
            to_write.push((index, row.map_or(1, |row| row.version + 1)));
        }
    }
    for chunk in to_write.chunks(ROWS_PER_INSERT) {
        let rows = chunk
            .iter()
            .map(|&(index, version)| version_row(&prices[index], version, now));
        match model_prices::Entity::insert_many(rows).exec(db).await {
            Ok(_) => {
                for &(index, version) in chunk {
                    stored[index] = if version == 1 {
                        Stored::Added
                    } else {
                        Stored::NewVersion(version)
                    };
                }
            }
            Err(error) if crate::db::is_unique_violation(&error) => {
                for &(index, _) in chunk {
                    stored[index] = store_price(db, &prices[index], now).await?;
                }
            }
            Err(error) => return Err(error),
        }
    }
    tracing::info!(written = to_write.len(), "stored new price versions");
    Ok(stored)
}

/// Stores the prices a process starts with (the built-in list and the config file's)
/// as new versions where they differ from the newest, unless an imported price
/// outranks them.
pub async fn sync_prices(
    db: &impl ConnectionTrait,
    prices: &[ConfiguredPrice],
) -> Result<(), DbErr> {
    let now = Timestamp::now();
    for price in prices {
        if let Stored::Kept(origin) = store_price(db, price, now).await? {
            tracing::info!(model = %price.model, kept = ?origin, "an imported price stays over the built-in one");
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_config_file_outranks_an_import_which_outranks_the_built_in_list() {
        use PriceOrigin::{BuiltIn, Config, Import};
        assert!(!may_replace(BuiltIn, Import));
        assert!(!may_replace(Import, Config));
        assert!(may_replace(Import, BuiltIn));
        assert!(may_replace(Import, Import));
        assert!(may_replace(Config, Import));
        assert!(may_replace(Config, BuiltIn));
        // A model taken out of the config file goes back to its built-in price.
        assert!(may_replace(BuiltIn, Config));
    }
}
