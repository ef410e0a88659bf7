//! A batch's counts and money, moved on its row by the transactions that move its
//! items: the chunk that adds them, the start and finish of their attempts, the
//! resolution of their holds, an admin's reconciliation of a cost.
//!
//! Each of those transactions gathers what it changed per batch into a [`BatchTotals`]
//! and applies it last, one UPDATE per batch (in id order, so that two transactions
//! touching the same batches never wait on each other in a cycle), so a finished group
//! of 100 items of one batch writes its row once. The row is updated after the
//! tenants' rows, as every writer of both does.

use super::Credits;
use super::ledger::Settlement;
use crate::db::Binds;
use entity::{BatchStatus, JobStatus, Timestamp, batches, jobs};
use sea_orm::{ConnectionTrait, DbBackend, DbErr, EntityTrait};
use std::collections::BTreeMap;
use uuid::Uuid;

/// What changed of one batch's items, as sums to add to its row.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
struct Delta {
    succeeded: i64,
    failed: i64,
    cancelled: i64,
    reserved_nanos: i64,
    provider_cost_nanos: i64,
    unknown_bound_nanos: i64,
    customer_charge_nanos: i64,
}

/// The changes one transaction made to the items of batches, by batch.
#[derive(Clone, Debug, Default)]
pub struct BatchTotals(BTreeMap<Uuid, Delta>);

impl BatchTotals {
    fn of(&mut self, batch_id: Uuid) -> &mut Delta {
        self.0.entry(batch_id).or_default()
    }

    /// `batch_id` is looked at when applied even if nothing of it changed: a closed
    /// batch whose items all finished is then marked finished.
    pub fn touch(mut self, batch_id: Uuid) -> Self {
        self.of(batch_id);
        self
    }

    /// Items added with these holds.
    pub fn held(&mut self, batch_id: Uuid, held: Credits) {
        self.of(batch_id).reserved_nanos += held.nanos();
    }

    /// An attempt's cost went from `before` to `after`, each `(exact cost, bound of a
    /// cost not known)` as stored on the attempt (an attempt just inserted was nothing
    /// before).
    pub fn attempt_cost(
        &mut self,
        job: &jobs::Model,
        before: (Option<i64>, Option<i64>),
        after: (Option<i64>, Option<i64>),
    ) {
        let Some(batch_id) = job.batch_id else {
            return;
        };
        let exact = after.0.unwrap_or(0) - before.0.unwrap_or(0);
        let bound = after.1.unwrap_or(0) - before.1.unwrap_or(0);
        if exact != 0 || bound != 0 {
            let delta = self.of(batch_id);
            delta.provider_cost_nanos += exact;
            delta.unknown_bound_nanos += bound;
        }
    }

    /// A job became terminal and its hold resolved as `settlement` (`None`: it had
    /// been resolved before, which moved the batch then).
    pub fn item_finished(&mut self, job: &jobs::Model, settlement: Option<&Settlement>) {
        let Some(batch_id) = job.batch_id else {
            return;
        };
        let delta = self.of(batch_id);
        match job.status {
            JobStatus::Succeeded => delta.succeeded += 1,
            JobStatus::Failed => delta.failed += 1,
            JobStatus::Cancelled => delta.cancelled += 1,
            JobStatus::Queued | JobStatus::Running => return,
        }
        if let Some(settlement) = settlement {
            delta.reserved_nanos -= (settlement.charged + settlement.released).nanos();
            delta.customer_charge_nanos += settlement.charged.nanos();
        }
    }

    /// Adds each batch's changes to its row, finishing a closed batch whose items have
    /// all finished (and queueing its `batch.finished` delivery), in the caller's
    /// transaction. Returns the rows of the batches it finished.
    pub async fn apply(self, db: &impl ConnectionTrait) -> Result<Vec<batches::Model>, DbErr> {
        let backend = db.get_database_backend();
        let mut finished = Vec::new();
        let now = Timestamp::now();
        for (batch_id, delta) in self.0 {
            let mut parameters = Binds::new(backend);
            let id = parameters.bind(batch_id);
            let at = parameters.bind(now);
            let [succeeded, failed, cancelled, reserved, cost, bound, charge] = [
                delta.succeeded,
                delta.failed,
                delta.cancelled,
                delta.reserved_nanos,
                delta.provider_cost_nanos,
                delta.unknown_bound_nanos,
                delta.customer_charge_nanos,
            ]
            .map(|value| parameters.bind(value));
            let done = format!(
                "(status = 'closed' AND succeeded + failed + cancelled + {succeeded} + {failed} + {cancelled} >= item_count)"
            );
            let returning = if backend == DbBackend::Postgres {
                "batches.*"
            } else {
                "*"
            };
            // The finish time is written only by the update that finishes the batch,
            // so the row coming back with it tells this transaction finished it.
            let sql = format!(
                "UPDATE batches SET
                    succeeded = succeeded + {succeeded},
                    failed = failed + {failed},
                    cancelled = cancelled + {cancelled},
                    reserved_nanos = reserved_nanos + {reserved},
                    provider_cost_nanos = provider_cost_nanos + {cost},
                    unknown_bound_nanos = unknown_bound_nanos + {bound},
                    customer_charge_nanos = customer_charge_nanos + {charge},
                    finished_at = CASE WHEN {done} THEN {at} ELSE finished_at END,
                    status = CASE WHEN {done} THEN 'finished' ELSE status END,
                    updated_at = {at}
                WHERE id = {id}
                RETURNING {returning}"
            );
            let Some(row) = batches::Entity::find()
                .from_raw_sql(parameters.statement(sql))
                .one(db)
                .await?
            else {
                continue;
            };
            if row.status == BatchStatus::Finished && row.finished_at == Some(now) {
                tracing::info!(batch.id = %row.id, items = row.item_count, "batch finished");
                crate::outbox::enqueue_batch_finished(db, &row).await?;
                finished.push(row);
            }
        }
        Ok(finished)
    }
}
