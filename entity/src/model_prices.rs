//! Versioned, effective-dated prices per model: what the provider charges us and
//! what we charge the customer, in nano-credits per million tokens.

use crate::{PriceOrigin, ProviderFamily, Timestamp};
use sea_orm::entity::prelude::*;

#[derive(Clone, Debug, PartialEq, Eq, DeriveEntityModel)]
#[sea_orm(table_name = "model_prices")]
pub struct Model {
    #[sea_orm(primary_key, auto_increment = false)]
    pub id: Uuid,
    pub model: String,
    /// 1, 2, 3 … per model; a new price is a new version, never an update.
    pub version: i32,
    pub provider_input_nanos_per_million: i64,
    pub provider_cached_input_nanos_per_million: i64,
    pub provider_output_nanos_per_million: i64,
    pub customer_input_nanos_per_million: i64,
    pub customer_cached_input_nanos_per_million: i64,
    pub customer_output_nanos_per_million: i64,
    pub effective_from: Timestamp,
    /// Where the price came from (a pricing page and its date, or a config file).
    pub source: String,
    /// Input and output tokens one call may hold together; `None`: unknown.
    pub context_window: Option<i64>,
    /// The most output tokens one call may ask for; `None`: unknown.
    pub max_output_tokens: Option<i64>,
    /// The provider's batch API price (all four batch columns set, or none: the
    /// model has no batch price and refuses PROVIDER_BATCH).
    pub provider_batch_input_nanos_per_million: Option<i64>,
    pub provider_batch_output_nanos_per_million: Option<i64>,
    /// What the customer pays for a PROVIDER_BATCH item.
    pub customer_batch_input_nanos_per_million: Option<i64>,
    pub customer_batch_output_nanos_per_million: Option<i64>,
    pub created_at: Timestamp,
    /// Where this version came from.
    pub origin: PriceOrigin,
    /// The family serving the model, for an imported model; `None`: by its name.
    pub provider_family: Option<ProviderFamily>,
}

#[derive(Copy, Clone, Debug, EnumIter, DeriveRelation)]
pub enum Relation {}

impl ActiveModelBehavior for ActiveModel {}
