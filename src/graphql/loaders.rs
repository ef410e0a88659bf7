//! Batched loading of what a job's nested fields show — attempts, events, reservation,
//! charge, cost, labels and the job it reruns — so that a page of jobs costs one query
//! per relation instead of one per job and field.
//!
//! A page of 100 jobs asking for all five made 500 queries; a few hundred aliases of
//! such a page held every pooled connection for most of a minute, and other tenants'
//! requests timed out behind them. Through these loaders every job of a response that
//! asks for its attempts shares one `WHERE job_id IN (…)` query, and likewise for each
//! other relation. A page of jobs asks for its jobs' relations all at once, before its
//! jobs are resolved (`JobConnection::edges`), so its batches do not depend on how fast
//! the fields are reached; single jobs (`job`, mutations) and the jobs reruns name
//! (`rerunOf`, whose ids are only known from each row) batch by the loader's delay.
//!
//! The loaders live for one request: [`PerRequestLoaders`], a schema extension, puts
//! fresh ones in each request's data. Created per request rather than shared in the
//! schema, a batch only ever holds the keys of one request, and what a loader caches
//! (a job asked for twice in one response is read once) is gone when the response is.
//! Each key carries the tenant of the job row it came from and every batched query
//! filters on that tenant, so even a key naming another tenant's job finds nothing.

use crate::billing::{ledger, reports};
use crate::error::ServiceError;
use crate::jobs::{labels, service};
use async_graphql::dataloader::{DataLoader, HashMapCache, Loader};
use async_graphql::extensions::{
    Extension, ExtensionContext, ExtensionFactory, NextPrepareRequest,
};
use async_graphql::{Request, ServerResult};
use entity::{attempts, charges, credit_reservations, job_events, job_labels, jobs};
use sea_orm::DatabaseConnection;
use std::collections::{BTreeMap, HashMap};
use std::hash::Hash;
use std::sync::Arc;
use uuid::Uuid;

/// A job as the loaders know it: its id and the tenant that owns it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct JobKey {
    pub tenant_id: Uuid,
    pub job_id: Uuid,
}

impl From<&jobs::Model> for JobKey {
    fn from(job: &jobs::Model) -> Self {
        Self {
            tenant_id: job.tenant_id,
            job_id: job.id,
        }
    }
}

/// The key of a job's attempts.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct AttemptsOf(pub JobKey);

/// The key of a job's stored events.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct EventsOf(pub JobKey);

/// The key of a job's credit hold.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct ReservationOf(pub JobKey);

/// The key of a job's charge.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct ChargeOf(pub JobKey);

/// The key of a job's cost figures.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct CostOf(pub JobKey);

/// The key of a job's labels.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct LabelsOf(pub JobKey);

/// The key of the metadata a client gave a job.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct MetadataOf(pub JobKey);

/// The key of a job read by its id, without its payloads (the job a rerun reruns).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct JobOf(pub JobKey);

/// Every relation of a job, each loaded in batches by its own key type.
pub struct JobRelations {
    db: DatabaseConnection,
}

/// The loaders of one request.
pub type JobLoader = DataLoader<JobRelations, HashMapCache>;

/// A schema extension that gives every request its own [`JobLoader`].
pub struct PerRequestLoaders {
    db: DatabaseConnection,
}

impl PerRequestLoaders {
    /// Loaders reading from `db`.
    pub fn new(db: DatabaseConnection) -> Self {
        Self { db }
    }
}

impl ExtensionFactory for PerRequestLoaders {
    fn create(&self) -> Arc<dyn Extension> {
        Arc::new(PerRequestLoaders {
            db: self.db.clone(),
        })
    }
}

#[async_trait::async_trait]
impl Extension for PerRequestLoaders {
    async fn prepare_request(
        &self,
        context: &ExtensionContext<'_>,
        request: Request,
        next: NextPrepareRequest<'_>,
    ) -> ServerResult<Request> {
        let loader = DataLoader::with_cache(
            JobRelations {
                db: self.db.clone(),
            },
            tokio::spawn,
            HashMapCache::default(),
        );
        next.run(context, request.data(loader)).await
    }
}

/// Loads one relation of all `keys` in one batch when `wanted`, for the jobs' own
/// fields to find in the request's cache; a relation nobody asked for reads nothing.
pub async fn prefetch<K>(
    loader: &JobLoader,
    wanted: bool,
    keys: impl Iterator<Item = K>,
) -> async_graphql::Result<()>
where
    K: Send + Sync + Hash + Eq + Clone + 'static,
    JobRelations: Loader<K, Error = async_graphql::Error>,
{
    if wanted {
        loader.load_many(keys).await?;
    }
    Ok(())
}

/// The job ids of `keys`, by tenant: one query per tenant, each filtered on it. A
/// request only reads one tenant's jobs, so in practice this is one group.
fn by_tenant<'a>(keys: impl Iterator<Item = &'a JobKey>) -> BTreeMap<Uuid, Vec<Uuid>> {
    let mut groups: BTreeMap<Uuid, Vec<Uuid>> = BTreeMap::new();
    for key in keys {
        groups.entry(key.tenant_id).or_default().push(key.job_id);
    }
    groups
}

/// A database failure, logged once for the whole batch; every field waiting on it gets
/// the same `INTERNAL` error.
fn internal(error: impl Into<ServiceError>) -> async_graphql::Error {
    error.into().into()
}

/// An entry for every key, empty until rows are filed under it: the cache then also
/// remembers that a job has no attempt or no charge yet, and asking again reads nothing.
fn empty_entries<K: Copy + Eq + Hash, V: Default>(keys: &[K]) -> HashMap<K, V> {
    keys.iter().map(|key| (*key, V::default())).collect()
}

impl Loader<AttemptsOf> for JobRelations {
    type Value = Vec<attempts::Model>;
    type Error = async_graphql::Error;

    async fn load(
        &self,
        keys: &[AttemptsOf],
    ) -> Result<HashMap<AttemptsOf, Self::Value>, Self::Error> {
        let mut found: HashMap<_, Self::Value> = empty_entries(keys);
        for (tenant_id, job_ids) in by_tenant(keys.iter().map(|key| &key.0)) {
            let rows = service::attempts_of_jobs(&self.db, tenant_id, &job_ids)
                .await
                .map_err(internal)?;
            for row in rows {
                let job_id = row.job_id;
                // Rows come in order of number within each job, and stay in it.
                found
                    .entry(AttemptsOf(JobKey { tenant_id, job_id }))
                    .or_default()
                    .push(row);
            }
        }
        Ok(found)
    }
}

impl Loader<EventsOf> for JobRelations {
    type Value = Vec<job_events::Model>;
    type Error = async_graphql::Error;

    async fn load(&self, keys: &[EventsOf]) -> Result<HashMap<EventsOf, Self::Value>, Self::Error> {
        let mut found: HashMap<_, Self::Value> = empty_entries(keys);
        for (tenant_id, job_ids) in by_tenant(keys.iter().map(|key| &key.0)) {
            let rows = service::events_of_jobs(&self.db, tenant_id, &job_ids)
                .await
                .map_err(internal)?;
            for row in rows {
                let job_id = row.job_id;
                // Rows come in order of seq within each job, and stay in it.
                found
                    .entry(EventsOf(JobKey { tenant_id, job_id }))
                    .or_default()
                    .push(row);
            }
        }
        Ok(found)
    }
}

impl Loader<ReservationOf> for JobRelations {
    type Value = Option<credit_reservations::Model>;
    type Error = async_graphql::Error;

    async fn load(
        &self,
        keys: &[ReservationOf],
    ) -> Result<HashMap<ReservationOf, Self::Value>, Self::Error> {
        let mut found = empty_entries(keys);
        for (tenant_id, job_ids) in by_tenant(keys.iter().map(|key| &key.0)) {
            let rows = ledger::reservations_of_jobs(&self.db, tenant_id, &job_ids)
                .await
                .map_err(internal)?;
            for row in rows {
                let job_id = row.job_id;
                found.insert(ReservationOf(JobKey { tenant_id, job_id }), Some(row));
            }
        }
        Ok(found)
    }
}

impl Loader<ChargeOf> for JobRelations {
    type Value = Option<charges::Model>;
    type Error = async_graphql::Error;

    async fn load(&self, keys: &[ChargeOf]) -> Result<HashMap<ChargeOf, Self::Value>, Self::Error> {
        let mut found = empty_entries(keys);
        for (tenant_id, job_ids) in by_tenant(keys.iter().map(|key| &key.0)) {
            let rows = ledger::charges_of_jobs(&self.db, tenant_id, &job_ids)
                .await
                .map_err(internal)?;
            for row in rows {
                let job_id = row.job_id;
                found.insert(ChargeOf(JobKey { tenant_id, job_id }), Some(row));
            }
        }
        Ok(found)
    }
}

impl Loader<CostOf> for JobRelations {
    type Value = Option<reports::JobCost>;
    type Error = async_graphql::Error;

    async fn load(&self, keys: &[CostOf]) -> Result<HashMap<CostOf, Self::Value>, Self::Error> {
        let mut found = empty_entries(keys);
        for (tenant_id, job_ids) in by_tenant(keys.iter().map(|key| &key.0)) {
            let costs = reports::costs_of_jobs(&self.db, tenant_id, &job_ids)
                .await
                .map_err(internal)?;
            for cost in costs {
                let job_id = cost.job_id;
                found.insert(CostOf(JobKey { tenant_id, job_id }), Some(cost));
            }
        }
        Ok(found)
    }
}

impl Loader<LabelsOf> for JobRelations {
    type Value = Vec<job_labels::Model>;
    type Error = async_graphql::Error;

    async fn load(&self, keys: &[LabelsOf]) -> Result<HashMap<LabelsOf, Self::Value>, Self::Error> {
        let mut found: HashMap<_, Self::Value> = empty_entries(keys);
        for (tenant_id, job_ids) in by_tenant(keys.iter().map(|key| &key.0)) {
            let rows = labels::labels_of_jobs(&self.db, tenant_id, &job_ids)
                .await
                .map_err(internal)?;
            for row in rows {
                let job_id = row.job_id;
                // Rows come in order of key within each job, and stay in it.
                found
                    .entry(LabelsOf(JobKey { tenant_id, job_id }))
                    .or_default()
                    .push(row);
            }
        }
        Ok(found)
    }
}

impl Loader<MetadataOf> for JobRelations {
    type Value = Option<serde_json::Value>;
    type Error = async_graphql::Error;

    async fn load(
        &self,
        keys: &[MetadataOf],
    ) -> Result<HashMap<MetadataOf, Self::Value>, Self::Error> {
        let mut found = empty_entries(keys);
        for (tenant_id, job_ids) in by_tenant(keys.iter().map(|key| &key.0)) {
            let metadata = crate::db::json::job_metadata(&self.db, Some(tenant_id), &job_ids)
                .await
                .map_err(internal)?;
            for (job_id, value) in metadata {
                found.insert(MetadataOf(JobKey { tenant_id, job_id }), Some(value));
            }
        }
        Ok(found)
    }
}

impl Loader<JobOf> for JobRelations {
    type Value = Option<jobs::Model>;
    type Error = async_graphql::Error;

    async fn load(&self, keys: &[JobOf]) -> Result<HashMap<JobOf, Self::Value>, Self::Error> {
        let mut found = empty_entries(keys);
        for (tenant_id, job_ids) in by_tenant(keys.iter().map(|key| &key.0)) {
            let rows = service::jobs_of_ids(&self.db, tenant_id, &job_ids)
                .await
                .map_err(internal)?;
            for row in rows {
                let job_id = row.id;
                found.insert(JobOf(JobKey { tenant_id, job_id }), Some(row));
            }
        }
        Ok(found)
    }
}
