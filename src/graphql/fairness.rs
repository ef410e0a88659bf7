//! Fairness between tenants in the database: the top-level fields of one tenant's
//! queries run a few at a time across all of its requests in this process.
//!
//! Request slots bound a tenant's requests, and complexity bounds each request, but
//! a request's top-level fields (aliases of `billingSummary`, `creditLedger`, `jobs`)
//! resolve at once, each with its own database work: eight requests of twenty aliases
//! held every connection of the API's pool, and other tenants waited seconds. Nested
//! fields are batched by the DataLoaders, so the top-level fields are where a
//! request's database work fans out. Mutations are left alone: they run one after
//! another within a request already.

use crate::accounts::Principal;
use async_graphql::extensions::{
    Extension, ExtensionContext, ExtensionFactory, NextResolve, ResolveInfo,
};
use async_graphql::{ServerResult, Value};
use std::collections::HashMap;
use std::sync::{Arc, Mutex, PoisonError};
use tokio::sync::Semaphore;
use uuid::Uuid;

/// Top-level query fields one tenant (or the admin) resolves at once in one process.
pub const QUERY_FIELDS_PER_TENANT: usize = 4;

/// The schema extension; one per schema, shared by all its requests.
#[derive(Clone, Default)]
pub struct TenantFairness {
    /// One semaphore per tenant (`None`: the admin). Tenants are few and made by the
    /// admin, so the map stays small.
    permits: Arc<Mutex<HashMap<Option<Uuid>, Arc<Semaphore>>>>,
}

impl ExtensionFactory for TenantFairness {
    fn create(&self) -> Arc<dyn Extension> {
        Arc::new(self.clone())
    }
}

#[async_trait::async_trait]
impl Extension for TenantFairness {
    async fn resolve(
        &self,
        ctx: &ExtensionContext<'_>,
        info: ResolveInfo<'_>,
        next: NextResolve<'_>,
    ) -> ServerResult<Option<Value>> {
        let top_level_query = info.path_node.parent.is_none() && info.parent_type == "QueryRoot";
        let owner = match ctx.data_opt::<Principal>() {
            Some(principal) => principal.counted_tenant(),
            // Anonymous requests read only the schema.
            None => return next.run(ctx, info).await,
        };
        if !top_level_query {
            return next.run(ctx, info).await;
        }
        let semaphore = self
            .permits
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .entry(owner)
            .or_insert_with(|| Arc::new(Semaphore::new(QUERY_FIELDS_PER_TENANT)))
            .clone();
        // Held while the field and everything below it resolve.
        let _permit = semaphore.acquire_owned().await.expect("never closed");
        next.run(ctx, info).await
    }
}
