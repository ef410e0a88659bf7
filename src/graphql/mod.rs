//! The GraphQL API: schema, resolvers and their types. Resolvers are thin: they
//! check who is asking and call the services.

mod access_tokens;
mod admin;
mod batches;
mod billing;
pub mod cost;
mod error;
pub mod fairness;
mod keys;
mod loaders;
mod models;
mod mutation;
mod provider_batches;
mod query;
mod quotes;
mod scalars;
mod spans;
mod spend_limits;
mod subscription;
mod types;
mod webhooks;

use crate::accounts::Principal;
use crate::accounts::access_tokens::AccessScope;
use crate::app::App;
use crate::error::ServiceError;
use crate::jobs::reach::JobReach;
use async_graphql::{Context, MergedObject, Schema, SchemaBuilder};
use uuid::Uuid;

pub use error::ApiErrorCode;
pub use subscription::{
    ConnectionSubscriptions, MAX_SUBSCRIPTIONS_PER_CONNECTION, SubscriptionRoot,
};

/// The root of every query: jobs and accounts, the billing dashboards, keys and the
/// admin's list of tenants.
#[derive(MergedObject, Default)]
pub struct QueryRoot(
    query::JobQuery,
    batches::BatchQuery,
    billing::BillingQuery,
    keys::KeyQuery,
    admin::AdminQuery,
    spend_limits::LimitsQuery,
    webhooks::WebhookQuery,
    models::ModelQuery,
    quotes::QuoteQuery,
);

/// The root of every change: jobs, tenants and credits, and API keys.
#[derive(MergedObject, Default)]
pub struct MutationRoot(
    mutation::JobMutation,
    batches::BatchMutation,
    keys::KeyMutation,
    access_tokens::AccessTokenMutation,
    spend_limits::LimitsMutation,
    webhooks::WebhookMutation,
);

/// The schema with its resolvers.
pub type AppSchema = Schema<QueryRoot, MutationRoot, SubscriptionRoot>;

/// Deep enough for GraphiQL's and codegen tools' introspection queries.
const MAX_DEPTH: usize = 32;
/// The complexity one request may have: one per field selected, a job's `input` and
/// `result` 50 each, list fields multiplied by the items they may return (a page by
/// its `first`, a job's attempts and events by their usual most). Room for every
/// contract operation at full pages (a 100-row `jobCosts` page is about 1,400), for
/// introspection, and for a 100-job page with every job's attempts, events, hold,
/// charge and cost (about 17,000); `jobs(first: 100) { edges { node { id input } } }`
/// (5,301) fits 3 times.
const MAX_COMPLEXITY: usize = 20_000;

/// The schema serving `app`.
pub fn build_schema(app: App) -> AppSchema {
    schema_builder()
        .extension(error::EveryErrorCoded)
        .extension(loaders::PerRequestLoaders::new(app.db.clone()))
        .extension(cost::CostLimits)
        .extension(fairness::TenantFairness::default())
        .extension(spans::OperationSpans)
        .data(types::PayloadGate::default())
        .data(app)
        .limit_depth(MAX_DEPTH)
        .limit_complexity(MAX_COMPLEXITY)
        .finish()
}

/// The schema's SDL, as committed in `schema.graphql`.
pub fn sdl() -> String {
    schema_builder().finish().sdl()
}

/// The types and resolvers of the schema, before its extensions and data.
fn schema_builder() -> SchemaBuilder<QueryRoot, MutationRoot, SubscriptionRoot> {
    Schema::build(
        QueryRoot::default(),
        MutationRoot::default(),
        SubscriptionRoot,
    )
    // No field returns it: clients read it in `extensions.code`, and the schema
    // documents its values.
    .register_output_type::<ApiErrorCode>()
}

/// Who the request acts for; `UNAUTHENTICATED` without a valid key.
fn principal(context: &Context<'_>) -> async_graphql::Result<Principal> {
    context
        .data_opt::<Principal>()
        .cloned()
        .ok_or_else(|| ApiErrorCode::Unauthenticated.error("a valid API key is required"))
}

/// The tenant, and the jobs of it, that a job operation needing `scope` may touch: an
/// access token's reach (if it has the scope), a tenant key's every job; an admin
/// the tenant it names where the operation lets it name one (`admin_names`, else
/// `FORBIDDEN`). Naming another tenant than one's own is `FORBIDDEN`.
async fn job_access(
    context: &Context<'_>,
    scope: AccessScope,
    named: Option<Uuid>,
    admin_names: bool,
) -> async_graphql::Result<(Uuid, JobReach)> {
    let principal = principal(context)?;
    if principal == Principal::Admin && admin_names {
        let tenant_id = principal.report_tenant(&app(context).db, named).await?;
        return Ok((tenant_id, JobReach::All));
    }
    let (tenant_id, reach) = principal.job_access(scope)?;
    if named.is_some_and(|named| named != tenant_id) {
        return Err(ServiceError::Forbidden.into());
    }
    Ok((tenant_id, reach))
}

fn app<'a>(context: &Context<'a>) -> &'a App {
    context.data_unchecked::<App>()
}

/// The request's loaders of job relations, which every request executed by the schema
/// has (see `loaders`).
fn loader<'a>(context: &Context<'a>) -> &'a loaders::JobLoader {
    context.data_unchecked::<loaders::JobLoader>()
}
