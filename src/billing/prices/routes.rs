//! Which provider family serves an imported model. A model's name tells its family
//! (`gpt-*`, `o3`, `claude-*`); an imported price map names the provider of models
//! whose name does not (`chatgpt-4o-latest`, `deepseek/deepseek-chat`), and the newest
//! price version keeps it. Every process reads them at start, and again within a few
//! seconds of a new price version, so a model imported while it runs can run without
//! a restart.

use crate::llm::ProviderRegistry;
use crate::llm::routing::ModelFamily;
use entity::{ProviderFamily, model_prices};
use sea_orm::{
    ConnectionTrait, DatabaseConnection, DbErr, EntityTrait, PaginatorTrait, QueryOrder,
    QuerySelect,
};
use std::collections::HashMap;
use std::time::Duration;
use tokio_util::sync::CancellationToken;

/// How often a process looks for new price versions, reading the imported families
/// again when there are.
pub const REFRESH_INTERVAL: Duration = Duration::from_secs(5);

impl From<ProviderFamily> for ModelFamily {
    fn from(family: ProviderFamily) -> Self {
        match family {
            ProviderFamily::OpenAi => Self::OpenAi,
            ProviderFamily::Anthropic => Self::Anthropic,
        }
    }
}

/// The family serving `model`: the one a price names, else the one its name tells.
pub fn family_of(model: &str, stored: Option<ProviderFamily>) -> Option<ModelFamily> {
    stored
        .map(ModelFamily::from)
        .or_else(|| ModelFamily::of(model))
}

/// The family of each model whose newest price version names one.
pub async fn imported_families(
    db: &impl ConnectionTrait,
) -> Result<HashMap<String, ModelFamily>, DbErr> {
    let rows: Vec<(String, Option<ProviderFamily>)> = model_prices::Entity::find()
        .select_only()
        .column(model_prices::Column::Model)
        .column(model_prices::Column::ProviderFamily)
        .order_by_asc(model_prices::Column::Model)
        .order_by_desc(model_prices::Column::Version)
        .into_tuple()
        .all(db)
        .await?;
    let mut families = HashMap::new();
    let mut last: Option<String> = None;
    for (model, family) in rows {
        if last.as_deref() == Some(model.as_str()) {
            continue;
        }
        if let Some(family) = family {
            families.insert(model.clone(), family.into());
        }
        last = Some(model);
    }
    Ok(families)
}

/// Reads the imported families into `providers` now, and again whenever the price
/// versions changed, looked at every [`REFRESH_INTERVAL`] until `stop`. Versions are
/// only ever added, so their count tells a change: one cheap query a tick instead of
/// reading every version of every model (a large imported map is many thousand).
pub async fn run(db: DatabaseConnection, providers: ProviderRegistry, stop: CancellationToken) {
    let mut read_at: Option<u64> = None;
    loop {
        match model_prices::Entity::find().count(&db).await {
            Ok(versions) if read_at == Some(versions) => {}
            Ok(versions) => match imported_families(&db).await {
                Ok(families) => {
                    providers.set_imported_families(families);
                    read_at = Some(versions);
                }
                Err(error) => {
                    tracing::warn!(error = %error, "cannot read the imported models' providers; trying again shortly");
                }
            },
            Err(error) => {
                tracing::warn!(error = %error, "cannot count the price versions; trying again shortly");
            }
        }
        tokio::select! {
            () = stop.cancelled() => return,
            () = tokio::time::sleep(REFRESH_INTERVAL) => {}
        }
    }
}
