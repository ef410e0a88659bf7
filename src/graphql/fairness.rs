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

/// Top-level query fields one tenant (or the admin) resolves at once in one process,
/// its access tokens' aside.
pub const QUERY_FIELDS_PER_TENANT: usize = 4;
/// Top-level query fields all access tokens of one tenant resolve at once in one
/// process: apart from the tenant's own [`QUERY_FIELDS_PER_TENANT`], so that pages
/// (one token per page load, each within its own request slots) cannot take the
/// fields its backend needs.
pub const QUERY_FIELDS_PER_TENANTS_TOKENS: usize = 4;
/// Top-level query fields one access token resolves at once: one browser's share of
/// its tenant's [`QUERY_FIELDS_PER_TENANTS_TOKENS`].
pub const QUERY_FIELDS_PER_TOKEN: usize = 1;

/// Whose top-level fields share a set of permits.
#[derive(Clone, Copy, Debug, Hash, PartialEq, Eq)]
enum FieldOwner {
    /// A tenant's own key (`None`: the admin).
    Tenant(Option<Uuid>),
    /// Every access token of the tenant together.
    TokensOf(Uuid),
    /// One access token.
    Token(Uuid),
}

impl FieldOwner {
    fn permits(self) -> usize {
        match self {
            Self::Tenant(_) => QUERY_FIELDS_PER_TENANT,
            Self::TokensOf(_) => QUERY_FIELDS_PER_TENANTS_TOKENS,
            Self::Token(_) => QUERY_FIELDS_PER_TOKEN,
        }
    }

    /// The owners whose permits a field of `principal` takes, in the order taken
    /// (the narrower first, so that one token waiting for its own turn holds none of
    /// its tenant's tokens' permits).
    fn of(principal: &Principal) -> Vec<Self> {
        match principal {
            Principal::Token(grant) => {
                vec![Self::Token(grant.token_id), Self::TokensOf(grant.tenant_id)]
            }
            other => vec![Self::Tenant(other.counted_tenant())],
        }
    }
}

/// The schema extension; one per schema, shared by all its requests.
#[derive(Clone, Default)]
pub struct TenantFairness {
    /// One semaphore per owner with a field resolving or waiting: tokens come and go
    /// by the thousand, so an owner's entry goes when its last field does.
    permits: Arc<Mutex<HashMap<FieldOwner, Arc<Semaphore>>>>,
}

impl TenantFairness {
    fn semaphore(&self, owner: FieldOwner) -> Arc<Semaphore> {
        self.permits
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .entry(owner)
            .or_insert_with(|| Arc::new(Semaphore::new(owner.permits())))
            .clone()
    }

    /// Drops `owner`'s entry when nothing but the map holds its semaphore.
    fn release(&self, owner: FieldOwner, semaphore: Arc<Semaphore>) {
        let mut permits = self.permits.lock().unwrap_or_else(PoisonError::into_inner);
        // Clones are made under this lock, so no field can take it meanwhile; a
        // permit holds no clone of its own beyond the one its turn gives back here.
        if Arc::strong_count(&semaphore) == 2 {
            permits.remove(&owner);
        }
    }
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
        let owners = match ctx.data_opt::<Principal>() {
            Some(principal) if top_level_query => FieldOwner::of(principal),
            // Anonymous requests read only the schema; nested fields are batched.
            _ => return next.run(ctx, info).await,
        };
        let mut held = Vec::with_capacity(owners.len());
        for owner in owners {
            // Made before the wait, so that a request dropped while it waits still
            // takes its owner's entry out of the map.
            let mut turn = FieldTurn {
                fairness: self.clone(),
                owner,
                semaphore: Some(self.semaphore(owner)),
                permit: None,
            };
            let semaphore = turn.semaphore.clone().expect("just set");
            turn.permit = Some(semaphore.acquire_owned().await.expect("never closed"));
            held.push(turn);
        }
        // Held while the field and everything below it resolve.
        next.run(ctx, info).await
    }
}

/// A field's turn among its owner's: the permit, given back when dropped (the field
/// resolved, or its request went away).
struct FieldTurn {
    fairness: TenantFairness,
    owner: FieldOwner,
    semaphore: Option<Arc<Semaphore>>,
    permit: Option<tokio::sync::OwnedSemaphorePermit>,
}

impl Drop for FieldTurn {
    fn drop(&mut self) {
        drop(self.permit.take());
        if let Some(semaphore) = self.semaphore.take() {
            self.fairness.release(self.owner, semaphore);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn an_owner_takes_no_memory_once_its_fields_are_done() {
        let fairness = TenantFairness::default();
        let owner = FieldOwner::Token(Uuid::now_v7());
        let turns: Vec<FieldTurn> = (0..2)
            .map(|_| FieldTurn {
                fairness: fairness.clone(),
                owner,
                semaphore: Some(fairness.semaphore(owner)),
                permit: None,
            })
            .collect();
        assert_eq!(fairness.permits.lock().unwrap().len(), 1);
        drop(turns);
        assert!(fairness.permits.lock().unwrap().is_empty());
    }
}
