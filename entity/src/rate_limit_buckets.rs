//! What a limited provider, model or tenant used of its per-minute budgets: one token
//! bucket for requests and one for tokens, and a pause the provider asked for.
//!
//! The limits are not stored here (they come from the config file and from
//! `tenant_limits`), so a bucket's level is only meaningful against its limit: a null
//! level is a full bucket, and a level above a lowered limit counts as full.

use crate::{BucketScope, Timestamp};
use sea_orm::entity::prelude::*;

#[derive(Clone, Debug, PartialEq, DeriveEntityModel)]
#[sea_orm(table_name = "rate_limit_buckets")]
pub struct Model {
    /// `provider`, `model` or `tenant`.
    #[sea_orm(primary_key, auto_increment = false)]
    pub scope: BucketScope,
    /// The provider's or model's name, or the tenant's id.
    #[sea_orm(primary_key, auto_increment = false)]
    pub key: String,
    /// Requests left at `refilled_at`; `None` is a full bucket.
    pub requests: Option<f64>,
    /// Tokens left at `refilled_at` (negative after a call larger than the bucket);
    /// `None` is a full bucket.
    pub tokens: Option<f64>,
    pub refilled_at: Timestamp,
    /// No call of this model starts before then (the provider answered 429).
    pub paused_until: Option<Timestamp>,
}

#[derive(Copy, Clone, Debug, EnumIter, DeriveRelation)]
pub enum Relation {}

impl ActiveModelBehavior for ActiveModel {}
