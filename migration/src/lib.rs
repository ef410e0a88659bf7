//! Schema migrations, portable across PostgreSQL and SQLite.
//!
//! Migrations describe tables with their own identifiers and never import the entity
//! crate: an old migration must keep meaning what it meant when it was written.

pub use sea_orm_migration::prelude::*;

mod steps;

mod m20261130_000001_create_core_tables;
mod m20261130_000002_attempt_reconciliations;
mod m20261130_000003_jobs_tenant_created_at_index;
mod m20261130_000004_json_as_text;
mod m20261130_000005_attempt_customer_charges;
mod m20261130_000006_claimable_jobs;
mod m20261130_000007_simulated_jobs;
mod m20261130_000008_api_key_names;
mod m20261130_000009_tenant_limits;
mod m20261130_000010_webhooks;
mod m20261130_000011_pruned_payloads;
mod m20261130_000012_flow_control;
mod m20261130_000013_credit_expiry;
mod m20261201_000001_api_keys_tenant_index;
mod m20261201_000002_hold_backings;
mod m20261201_000003_absorbed_exposure;
mod m20261201_000004_batches;
mod m20261201_000005_job_labels_and_reruns;
mod m20261202_000001_job_deadlines;
mod m20261202_000010_access_tokens;
mod m20261202_000011_model_limits;
mod m20261202_000012_batch_prices;
mod m20261202_000020_fallback_models;
mod m20261202_000030_provider_batches;
mod m20261202_000040_price_origins;
mod m20261203_000010_held_prices;
mod m20261203_000040_provider_batch_attribution;
mod m20261204_000100_provider_batch_sends;
mod m20261205_000010_exclusive_uploads;

/// Applies jobledger's migrations in order.
pub struct Migrator;

#[async_trait::async_trait]
impl MigratorTrait for Migrator {
    fn migrations() -> Vec<Box<dyn MigrationTrait>> {
        vec![
            Box::new(m20261130_000001_create_core_tables::Migration),
            Box::new(m20261130_000002_attempt_reconciliations::Migration),
            Box::new(m20261130_000003_jobs_tenant_created_at_index::Migration),
            Box::new(m20261130_000004_json_as_text::Migration),
            Box::new(m20261130_000005_attempt_customer_charges::Migration),
            Box::new(m20261130_000006_claimable_jobs::Migration),
            Box::new(m20261130_000007_simulated_jobs::Migration),
            Box::new(m20261130_000008_api_key_names::Migration),
            Box::new(m20261130_000009_tenant_limits::Migration),
            Box::new(m20261130_000010_webhooks::Migration),
            Box::new(m20261130_000011_pruned_payloads::Migration),
            Box::new(m20261130_000012_flow_control::Migration),
            Box::new(m20261130_000013_credit_expiry::Migration),
            Box::new(m20261201_000001_api_keys_tenant_index::Migration),
            Box::new(m20261201_000002_hold_backings::Migration),
            Box::new(m20261201_000003_absorbed_exposure::Migration),
            Box::new(m20261201_000004_batches::Migration),
            Box::new(m20261201_000005_job_labels_and_reruns::Migration),
            Box::new(m20261202_000001_job_deadlines::Migration),
            Box::new(m20261202_000010_access_tokens::Migration),
            Box::new(m20261202_000011_model_limits::Migration),
            Box::new(m20261202_000012_batch_prices::Migration),
            Box::new(m20261202_000020_fallback_models::Migration),
            Box::new(m20261202_000030_provider_batches::Migration),
            Box::new(m20261202_000040_price_origins::Migration),
            Box::new(m20261203_000010_held_prices::Migration),
            Box::new(m20261203_000040_provider_batch_attribution::Migration),
            Box::new(m20261204_000100_provider_batch_sends::Migration),
            Box::new(m20261205_000010_exclusive_uploads::Migration),
        ]
    }
}
