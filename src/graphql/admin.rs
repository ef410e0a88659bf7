//! What only an admin reads: every tenant, with its balance.

use super::types::{PageInfo, Tenant, connect, edge};
use super::{app, principal};
use crate::accounts::tenants;
use crate::billing::reports::PageRequest;
use async_graphql::{Context, Object, SimpleObject};

edge!(
    /// A tenant and the cursor to page on from it.
    TenantEdge of Tenant
);

/// A page of tenants.
#[derive(SimpleObject)]
pub struct TenantConnection {
    pub edges: Vec<TenantEdge>,
    pub page_info: PageInfo,
}

/// The admin's reads.
#[derive(Default)]
pub struct AdminQuery;

#[Object]
impl AdminQuery {
    /// Admin: every tenant with its balance, newest first, `first` at a time (default
    /// 20, at most 100) after the cursor `after`. A tenant is `FORBIDDEN`.
    #[graphql(complexity = "super::cost::page_complexity(first, child_complexity)")]
    async fn tenants(
        &self,
        context: &Context<'_>,
        first: Option<i32>,
        after: Option<String>,
    ) -> async_graphql::Result<TenantConnection> {
        principal(context)?.require_admin()?;
        let page = PageRequest::new(first, after.as_deref())?;
        let tenants = tenants::list_tenants(&app(context).db, page).await?;
        let (edges, page_info) = connect(tenants, |tenant| (tenant.id, tenant.into()));
        Ok(TenantConnection { edges, page_info })
    }
}
