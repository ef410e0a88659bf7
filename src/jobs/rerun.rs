//! Reruns: a new job with the input of a finished one.
//!
//! A rerun is created exactly as `createJob` creates a job — the same service call, so
//! its own hold, attempts and charge — from the stored input of the job it reruns:
//! model and fallback models, messages, limits, response schema, metadata, attempts,
//! priority and labels.
//! A job's money never reopens once it is terminal; a rerun is how a client tries again.

use super::batches::{self, items};
use super::fallbacks::ModelChain;
use super::input::{DEFAULT_DEADLINE, Deadline, IdempotencyKey, JobInput, NewJob, Priority};
use super::labels::{self, Labels};
use super::service::{self, CreatedJob};
use crate::billing::ChargingPolicy;
use crate::bus::EventBus;
use crate::error::ServiceError;
use crate::llm::ProviderRegistry;
use entity::jobs;
use sea_orm::DatabaseConnection;
use std::time::Duration;
use uuid::Uuid;

/// Creates a rerun of the tenant's finished job `job_id` under `idempotency_key`.
///
/// The key is the rerun's own, per tenant like every job's: used again for a rerun of
/// the same job it answers that rerun (`replayed`); used for anything else it is a
/// conflict. Another tenant's job is `NotFound`; a job not finished yet is
/// `Validation`. A rerun of a batch item joins the batch while the batch is OPEN (see
/// [`items::add_rerun`]); once it is closed, cancelled or past its deadline, the rerun
/// is a job of its own, outside the batch.
pub async fn rerun_job(
    db: &DatabaseConnection,
    bus: &EventBus,
    providers: &ProviderRegistry,
    tenant_id: Uuid,
    job_id: Uuid,
    idempotency_key: IdempotencyKey,
    charging: ChargingPolicy,
) -> Result<CreatedJob, ServiceError> {
    let original = service::find_job(db, tenant_id, job_id).await?;
    // Replayed before the original is read any further: a replay must answer even once
    // retention has pruned the input the rerun was made from.
    if let Some(existing) = service::find_by_key(db, tenant_id, idempotency_key.as_str()).await? {
        return if existing.rerun_of == Some(original.id) {
            Ok(CreatedJob {
                job: existing,
                replayed: true,
            })
        } else {
            Err(ServiceError::IdempotencyConflict)
        };
    }
    if !original.status.is_terminal() {
        return Err(ServiceError::validation(
            "only a finished job (SUCCEEDED, FAILED or CANCELLED) can be rerun",
        ));
    }
    if original.payloads_pruned_at.is_some() {
        return Err(ServiceError::validation(
            "the job's input was pruned by retention: there is nothing to rerun",
        ));
    }
    let input: JobInput = serde_json::from_value(original.input.0.clone())
        .map_err(|error| sea_orm::DbErr::Custom(format!("job input: {error}")))?;
    let labels = Labels::of_rows(labels::labels_of_jobs(db, tenant_id, &[original.id]).await?);
    // The original's own model and fallbacks, whichever model it ended on.
    let chain = ModelChain::of_job(&original);
    let new = NewJob {
        idempotency_key,
        model: chain.own().to_owned(),
        fallback_models: chain.fallbacks().to_vec(),
        input,
        max_attempts: u32::try_from(original.max_attempts)
            .map_err(|_| sea_orm::DbErr::Custom("negative max_attempts".into()))?,
        retry_unknown_outcome: original.retry_unknown_outcome,
        priority: Priority::parse(original.priority)?,
        // The original's start has passed: a rerun runs as soon as it can.
        run_at: None,
        // As long from its start as the original had: a fail-fast job stays one.
        deadline: Deadline::After(deadline_span(&original)),
        labels,
        rerun_of: Some(original.id),
        charging,
    };
    if let (Some(batch_id), Some(custom_id)) = (original.batch_id, original.custom_id.as_deref()) {
        let batch = batches::find_batch(db, tenant_id, batch_id).await?;
        let key = new.idempotency_key.clone();
        if let Some(added) =
            items::add_rerun(db, bus, providers, &batch, custom_id, new.clone()).await?
        {
            match service::find_by_key(db, tenant_id, key.as_str()).await? {
                Some(job) if job.rerun_of == Some(original.id) => {
                    return Ok(CreatedJob {
                        job,
                        replayed: added.added == 0,
                    });
                }
                Some(_) => return Err(ServiceError::IdempotencyConflict),
                // An item the client added has the rerun's name and input: it is not
                // the rerun, which is then a job of its own.
                None => {}
            }
        }
    }
    // A race with the same key ends in the service's own replay, by fingerprint, which
    // names the original.
    service::create_job(db, bus, providers, tenant_id, new).await
}

/// How long the original had from its start to its deadline; the default when it kept
/// none (it finished before deadlines were recorded).
fn deadline_span(original: &jobs::Model) -> Duration {
    let start = original.run_at.map_or(original.created_at, |run_at| {
        Ord::max(run_at, original.created_at)
    });
    original
        .deadline
        .and_then(|deadline| u64::try_from(deadline.micros() - start.micros()).ok())
        .map_or(DEFAULT_DEADLINE, Duration::from_micros)
}
