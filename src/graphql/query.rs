//! Reads: a tenant's jobs and account.

use super::mutation::LabelInput;
use super::types::{Account, Job, JobConnection, JobStatus, connect};
use super::{ApiErrorCode, app, job_access, principal};
use crate::accounts::access_tokens::AccessScope;
use crate::accounts::tenants;
use crate::jobs::labels::Label;
use crate::jobs::service::{self, JobFilter};
use crate::page::PageRequest;
use async_graphql::{Context, Object};
use uuid::Uuid;

/// The queries of jobs and accounts.
#[derive(Default)]
pub struct JobQuery;

#[Object]
impl JobQuery {
    /// One of the caller's jobs, by its `id` or by the `idempotencyKey` it was created
    /// with (exactly one of them, else `VALIDATION`); `NOT_FOUND` when the tenant has
    /// no such job. An admin reads any tenant's job by naming the tenant (`VALIDATION`
    /// otherwise); a tenant naming another tenant is `FORBIDDEN`. An access token needs
    /// `READ_JOBS` and reads only jobs within its reach (others are `NOT_FOUND`).
    async fn job(
        &self,
        context: &Context<'_>,
        id: Option<Uuid>,
        idempotency_key: Option<String>,
        tenant_id: Option<Uuid>,
    ) -> async_graphql::Result<Job> {
        let db = &app(context).db;
        let (tenant_id, reach) =
            job_access(context, AccessScope::ReadJobs, tenant_id, true).await?;
        let job = match (id, idempotency_key) {
            (Some(id), None) => service::find_job(db, tenant_id, id).await?,
            (None, Some(key)) => service::find_job_by_key(db, tenant_id, &reach, key).await?,
            _ => {
                return Err(ApiErrorCode::Validation.error("job takes either id or idempotencyKey"));
            }
        };
        reach.require(db, tenant_id, job.id).await?;
        Ok(job.into())
    }

    /// The caller's jobs, newest first, `first` at a time (at most 100), optionally only
    /// those of one status or carrying one label. An admin reads any tenant's jobs by
    /// naming the tenant (`VALIDATION` otherwise); a tenant naming another tenant is
    /// `FORBIDDEN`. An access token needs `READ_JOBS` and lists only jobs within its
    /// reach.
    #[graphql(complexity = "super::cost::page_complexity(first, child_complexity)")]
    async fn jobs(
        &self,
        context: &Context<'_>,
        first: Option<i32>,
        after: Option<String>,
        status: Option<JobStatus>,
        label: Option<LabelInput>,
        tenant_id: Option<Uuid>,
    ) -> async_graphql::Result<JobConnection> {
        let db = &app(context).db;
        let (tenant_id, reach) =
            job_access(context, AccessScope::ReadJobs, tenant_id, true).await?;
        let page = PageRequest::new(first, after.as_deref())?;
        let filter = JobFilter {
            reach,
            status: status.map(Into::into),
            label: label
                .map(|label| Label::parse(label.key, label.value))
                .transpose()?,
        };
        let page = service::list_jobs(db, tenant_id, page, filter).await?;
        let (edges, page_info) = connect(page, |job| (job.id, Job::without_payloads(job)));
        Ok(JobConnection { edges, page_info })
    }

    /// The caller's account and balance.
    async fn account(&self, context: &Context<'_>) -> async_graphql::Result<Account> {
        let tenant_id = principal(context)?.tenant_id()?;
        let tenant = tenants::find_tenant(&app(context).db, tenant_id).await?;
        Ok(Account {
            id: tenant.id,
            name: tenant.name.clone(),
            tenant,
        })
    }
}
