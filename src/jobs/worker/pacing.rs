//! What a worker tells the flow control: a provider's 429 (or an overload with a
//! `Retry-After`) pauses the model for every worker, and a finished call gives back
//! the tokens it did not use. Both are written by one background writer each per
//! process.

use super::Worker;
use crate::jobs::flow::{self, BucketKey, CallUse};
use crate::jobs::lifecycle::AttemptReport;
use crate::jobs::queue::{self, Claim};
use entity::Timestamp;
use sea_orm::DatabaseConnection;
use std::collections::HashMap;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;
use tokio::sync::{Notify, oneshot};
use tokio_util::sync::CancellationToken;

/// How long an attempt's end waits for its model's pause to be written.
const PAUSE_WRITE_WAIT: Duration = Duration::from_secs(1);
/// How often unused tokens are written back.
const RETURN_EVERY: Duration = Duration::from_millis(250);

/// Unused tokens on their way back to their buckets: summed in memory and written once
/// per bucket every [`RETURN_EVERY`], so finished calls do not each update the bucket
/// row every claim of the model reads. Best effort: tokens lost with the process only
/// leave a budget lower than it could be for a moment.
#[derive(Clone, Debug, Default)]
pub(super) struct TokenReturns {
    pending: Arc<Mutex<HashMap<BucketKey, f64>>>,
}

impl TokenReturns {
    fn add(&self, key: BucketKey, tokens: f64) {
        let mut pending = self.pending.lock().unwrap_or_else(PoisonError::into_inner);
        *pending.entry(key).or_default() += tokens;
    }

    async fn write(&self, db: &DatabaseConnection) {
        let mut returns: Vec<(BucketKey, f64)> =
            std::mem::take(&mut *self.pending.lock().unwrap_or_else(PoisonError::into_inner))
                .into_iter()
                .collect();
        returns.sort_by(|a, b| a.0.cmp(&b.0));
        for (key, tokens) in returns {
            if let Err(error) = flow::storage::give_back(db, &key, tokens).await {
                tracing::warn!(bucket = %key.key, scope = key.scope.as_str(), error = %error, "giving unused tokens back failed");
            }
        }
    }

    /// Writes returns back until `stop`, then once more.
    pub(super) async fn run(self, db: DatabaseConnection, stop: CancellationToken) {
        loop {
            let stopped = tokio::select! {
                _ = stop.cancelled() => true,
                _ = tokio::time::sleep(RETURN_EVERY) => false,
            };
            self.write(&db).await;
            if stopped {
                return;
            }
        }
    }
}

/// Model pauses on their way to the database: one writer per process writes them, the
/// latest instant per model, so that a burst of 429s while a model's row is held (by a
/// claim of a stalled process) takes one pool connection, not one per attempt.
#[derive(Clone, Debug, Default)]
pub(super) struct PauseWrites {
    pending: Arc<Mutex<HashMap<String, PendingPause>>>,
    wake: Arc<Notify>,
}

/// One model's pause waiting to be written, and who waits for it.
#[derive(Debug)]
struct PendingPause {
    until: Timestamp,
    written: Vec<oneshot::Sender<()>>,
}

impl PauseWrites {
    /// Queues `model`'s pause until `until`; the receiver hears once it is written.
    fn add(&self, model: &str, until: Timestamp) -> oneshot::Receiver<()> {
        let (sender, receiver) = oneshot::channel();
        let mut pending = self.pending.lock().unwrap_or_else(PoisonError::into_inner);
        let pause = pending
            .entry(model.to_owned())
            .or_insert_with(|| PendingPause {
                until,
                written: Vec::new(),
            });
        pause.until = pause.until.max(until);
        pause.written.push(sender);
        drop(pending);
        self.wake.notify_one();
        receiver
    }

    async fn write(&self, db: &DatabaseConnection) {
        let pauses: Vec<(String, PendingPause)> =
            std::mem::take(&mut *self.pending.lock().unwrap_or_else(PoisonError::into_inner))
                .into_iter()
                .collect();
        for (model, pause) in pauses {
            match flow::storage::pause_model(db, &model, pause.until, Timestamp::now()).await {
                Ok(()) => {
                    for waiting in pause.written {
                        let _ = waiting.send(());
                    }
                    // After the pause is on record: a job that moves is not claimed
                    // back onto the model by a claim that had not seen the pause.
                    match queue::move_off_paused_model(db, &model, Timestamp::now()).await {
                        Ok(0) => {}
                        Ok(moved) => {
                            tracing::info!(model = %model, moved, "queued jobs moved to their fallback models")
                        }
                        // They wait for the pause, as jobs without fallbacks do.
                        Err(error) => {
                            tracing::warn!(model = %model, error = %error, "moving queued jobs off the paused model failed")
                        }
                    }
                }
                // The jobs' own retries still wait for the Retry-After.
                Err(error) => {
                    tracing::error!(model = %model, error = %error, "recording the model's pause failed")
                }
            }
        }
    }

    /// Writes pauses as they come until `stop`, then once more.
    pub(super) async fn run(self, db: DatabaseConnection, stop: CancellationToken) {
        loop {
            let stopped = tokio::select! {
                _ = stop.cancelled() => true,
                _ = self.wake.notified() => false,
            };
            self.write(&db).await;
            if stopped {
                return;
            }
        }
    }
}

impl Worker {
    /// Holds off `model` for every worker until `until`, as its provider asked. The
    /// attempt's end is recorded after the pause, so that no claim starts the model
    /// once the 429 is on record; but it waits at most [`PAUSE_WRITE_WAIT`] for it:
    /// the model's row may be held by a claim of a stalled process, and the write
    /// then finishes on its own.
    pub(super) async fn pause_model(&self, model: &str, until: Timestamp) {
        tracing::warn!(model = %model, paused_until = %until.to_datetime().to_rfc3339(), "the provider asked to wait (a rate limit or an overload): pausing the model for every worker");
        self.inner.metrics.model_paused(model);
        let written = self.inner.pause_writes.add(model, until);
        let _ = tokio::time::timeout(PAUSE_WRITE_WAIT, written).await;
    }

    /// Each bucket that counted a finished call's tokens, with what it gives back: what
    /// the call did not use, as its provider counts (all of it when the request never
    /// left). A tenant's own budget counts what the call used, like a provider that
    /// counts used tokens.
    pub(super) fn unused_tokens(
        &self,
        claim: &Claim,
        report: &AttemptReport,
        sent: bool,
    ) -> Vec<(BucketKey, f64)> {
        let call = if !sent {
            CallUse::NotSent
        } else if report.not_billed {
            CallUse::Refused
        } else {
            report.usage.map_or(CallUse::Unknown, |usage| {
                CallUse::Used(usage.input_tokens.saturating_add(usage.output_tokens))
            })
        };
        let mut buckets = self.inner.settings.flow.buckets_of(&claim.job.model);
        buckets.push((BucketKey::tenant(claim.job.tenant_id), claim.tenant_rate));
        buckets
            .into_iter()
            .filter(|(_, limit)| limit.tokens_per_minute.is_some())
            .map(|(key, limit)| (key, flow::unused_tokens(limit, claim.job.token_bound, call)))
            .filter(|(_, unused)| *unused > 0.0)
            .collect()
    }

    /// Sends tokens back to their buckets, once the call's end is on record.
    pub(super) fn return_tokens(&self, unused: Vec<(BucketKey, f64)>) {
        for (key, tokens) in unused {
            self.inner.token_returns.add(key, tokens);
        }
    }
}
