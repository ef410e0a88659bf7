//! Changes: jobs for tenants; tenants and credits for admins.

use super::types::{CreditGrant, Job, Tenant};
use super::{ErrorCode, app, principal};
use crate::accounts::tenants;
use crate::billing::{Credits, CreditsError, ledger};
use crate::db::begin_write;
use crate::error::ServiceError;
use crate::jobs::input::{JobRequest, NewJob};
use crate::jobs::service;
use async_graphql::{Context, InputObject, Json, Object, SimpleObject};
use rust_decimal::Decimal;
use uuid::Uuid;

/// One chat message of a job.
#[derive(InputObject)]
pub struct MessageInput {
    /// `system`, `developer`, `user` or `assistant`.
    pub role: String,
    pub content: String,
}

/// A job to run.
#[derive(InputObject)]
pub struct CreateJobInput {
    /// The client's unique name for this request: repeating it returns the same job.
    pub idempotency_key: String,
    pub model: String,
    pub messages: Vec<MessageInput>,
    pub max_output_tokens: i32,
    /// A JSON Schema the reply must satisfy; the result is then the parsed JSON.
    pub response_schema: Option<Json<serde_json::Value>>,
    /// Attempts the job may use (default 3, at most 10).
    pub max_attempts: Option<i32>,
    /// Whether to retry an attempt whose outcome is unknown, at the risk of paying the
    /// provider twice (default true).
    pub retry_unknown_outcome: Option<bool>,
    /// Any JSON the client wants kept with the job.
    pub metadata: Option<Json<serde_json::Value>>,
}

/// The job, and whether an earlier request with the same key created it.
#[derive(SimpleObject)]
pub struct CreateJobPayload {
    pub replayed: bool,
    pub job: Job,
}

/// Credits to add to a tenant.
#[derive(InputObject)]
pub struct GrantCreditsInput {
    pub tenant_id: Uuid,
    pub amount: Decimal,
    /// Repeating a grant with the same key grants once.
    pub idempotency_key: String,
    pub reason: Option<String>,
}

/// A new tenant and its API key, shown this once.
#[derive(SimpleObject)]
pub struct CreateTenantPayload {
    pub tenant: Tenant,
    pub api_key: String,
}

/// The root of every mutation.
pub struct MutationRoot;

#[Object]
impl MutationRoot {
    /// Creates a job and holds credits for it; returns at once.
    async fn create_job(
        &self,
        context: &Context<'_>,
        input: CreateJobInput,
    ) -> async_graphql::Result<CreateJobPayload> {
        let tenant_id = principal(context)?.tenant_id()?;
        let new = NewJob::parse(JobRequest {
            idempotency_key: input.idempotency_key,
            model: input.model,
            messages: input
                .messages
                .into_iter()
                .map(|message| (message.role, message.content))
                .collect(),
            max_output_tokens: input.max_output_tokens,
            response_schema: input.response_schema.map(|json| json.0),
            max_attempts: input.max_attempts,
            retry_unknown_outcome: input.retry_unknown_outcome,
            metadata: input.metadata.map(|json| json.0),
        })?;
        let app = app(context);
        let created = service::create_job(&app.db, &app.bus, tenant_id, new).await?;
        Ok(CreateJobPayload {
            replayed: created.replayed,
            job: Job(created.job),
        })
    }

    /// Asks for a job to be cancelled: a queued job is cancelled at once, a running one
    /// as soon as its worker notices.
    async fn cancel_job(&self, context: &Context<'_>, id: Uuid) -> async_graphql::Result<Job> {
        let tenant_id = principal(context)?.tenant_id()?;
        let app = app(context);
        Ok(Job(
            service::cancel_job(&app.db, &app.bus, tenant_id, id).await?
        ))
    }

    /// Admin: creates a tenant and its first API key.
    async fn create_tenant(
        &self,
        context: &Context<'_>,
        name: String,
    ) -> async_graphql::Result<CreateTenantPayload> {
        principal(context)?.require_admin()?;
        let transaction = begin_write(&app(context).db)
            .await
            .map_err(ServiceError::from)?;
        let (tenant, key) = tenants::create_tenant(&transaction, &name).await?;
        transaction.commit().await.map_err(ServiceError::from)?;
        Ok(CreateTenantPayload {
            tenant: tenant.into(),
            api_key: key.expose().to_owned(),
        })
    }

    /// Admin: adds credits to a tenant, once per idempotency key.
    async fn grant_credits(
        &self,
        context: &Context<'_>,
        input: GrantCreditsInput,
    ) -> async_graphql::Result<CreditGrant> {
        principal(context)?.require_admin()?;
        let amount = Credits::from_decimal(input.amount).map_err(|error| match error {
            CreditsError::TooPrecise | CreditsError::TooLarge => {
                ErrorCode::Validation.error(format!("amount: {error}"))
            }
        })?;
        let idempotency_key = input.idempotency_key.trim().to_owned();
        if idempotency_key.is_empty() {
            return Err(ErrorCode::Validation.error("idempotencyKey must not be empty"));
        }
        let transaction = begin_write(&app(context).db)
            .await
            .map_err(ServiceError::from)?;
        let grant = ledger::grant(
            &transaction,
            ledger::NewGrant {
                tenant_id: input.tenant_id,
                amount,
                idempotency_key,
                reason: input.reason,
            },
        )
        .await?;
        transaction.commit().await.map_err(ServiceError::from)?;
        Ok(grant.into())
    }
}
