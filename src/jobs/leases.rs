//! Keeps the leases of a worker's running attempts: one statement every third of a
//! lease renews all of them, instead of a task and a statement per attempt.
//!
//! Each attempt holds its job while it runs and watches what the last renewal learned:
//! renewed (and whether a cancel was asked for) or lost. A renewal that fails leaves
//! every attempt running: the lease may still hold, and the fenced finish decides.

use super::queue::{self, Claim, Renewal};
use sea_orm::DatabaseConnection;
use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;
use tokio::sync::{Notify, watch};
use tokio_util::sync::CancellationToken;
use uuid::Uuid;

/// Renews the leases of every attempt that holds one.
#[derive(Clone, Debug)]
pub struct LeaseKeeper {
    shared: Arc<Shared>,
}

#[derive(Debug)]
struct Shared {
    db: DatabaseConnection,
    lease: Duration,
    held: Mutex<HashMap<Uuid, Held>>,
    /// Wakes the keeper for a round before its time.
    renew_now: Notify,
}

#[derive(Debug)]
struct Held {
    run_token: Uuid,
    learned: watch::Sender<Option<Renewal>>,
}

impl LeaseKeeper {
    /// A keeper extending leases to `lease` from each renewal.
    pub fn new(db: DatabaseConnection, lease: Duration) -> Self {
        Self {
            shared: Arc::new(Shared {
                db,
                lease,
                held: Mutex::default(),
                renew_now: Notify::new(),
            }),
        }
    }

    /// Keeps `claim`'s lease until the returned hold is dropped. The claim took the
    /// lease just now, so the next round is soon enough.
    pub fn hold(&self, claim: &Claim) -> LeaseHold {
        let (learned, watched) = watch::channel(None);
        self.shared.held().insert(
            claim.job.id,
            Held {
                run_token: claim.run_token,
                learned,
            },
        );
        LeaseHold {
            keeper: self.clone(),
            job_id: claim.job.id,
            run_token: claim.run_token,
            learned: watched,
        }
    }

    /// The jobs whose leases this keeper holds: attempts alive in this process.
    pub fn held_jobs(&self) -> HashSet<Uuid> {
        self.shared.held().keys().copied().collect()
    }

    /// Renews every held lease each third of a lease (or at once when an attempt asks)
    /// until `stop` is cancelled.
    pub async fn run(self, stop: CancellationToken) {
        let mut interval = tokio::time::interval(self.shared.lease / 3);
        interval.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                _ = stop.cancelled() => return,
                _ = interval.tick() => {}
                _ = self.shared.renew_now.notified() => {}
            }
            self.renew_all().await;
        }
    }

    async fn renew_all(&self) {
        let owned: Vec<(Uuid, Uuid)> = self
            .shared
            .held()
            .iter()
            .map(|(job_id, held)| (*job_id, held.run_token))
            .collect();
        if owned.is_empty() {
            return;
        }
        let renewed = match queue::renew_leases(&self.shared.db, &owned, self.shared.lease).await {
            Ok(renewed) => renewed,
            Err(error) => {
                tracing::warn!(jobs = owned.len(), error = %error, "lease renewal failed");
                return;
            }
        };
        let held = self.shared.held();
        for (job_id, run_token) in owned {
            // An attempt that ended meanwhile is no longer held: nobody to tell.
            if let Some(attempt) = held.get(&job_id).filter(|held| held.run_token == run_token) {
                let learned = renewed.get(&job_id).copied().unwrap_or(Renewal::Lost);
                attempt.learned.send_replace(Some(learned));
            }
        }
    }
}

impl Shared {
    fn held(&self) -> std::sync::MutexGuard<'_, HashMap<Uuid, Held>> {
        self.held.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

/// One attempt's lease, kept until dropped.
pub struct LeaseHold {
    keeper: LeaseKeeper,
    job_id: Uuid,
    run_token: Uuid,
    learned: watch::Receiver<Option<Renewal>>,
}

impl LeaseHold {
    /// What the next renewal learns.
    pub async fn next(&mut self) -> Renewal {
        loop {
            // The keeper outlives its holds: the sender is never dropped while held.
            if self.learned.changed().await.is_err() {
                std::future::pending::<()>().await;
            }
            if let Some(renewal) = *self.learned.borrow_and_update() {
                return renewal;
            }
        }
    }

    /// Whether a renewal found the job no longer ours: another worker took it back,
    /// and nothing this attempt writes would match.
    pub fn is_lost(&self) -> bool {
        matches!(*self.learned.borrow(), Some(Renewal::Lost))
    }

    /// Asks for a renewal now: notices of a cancel may have been missed, and the
    /// renewal reads the job's row.
    pub fn renew_now(&self) {
        self.keeper.shared.renew_now.notify_one();
    }
}

impl Drop for LeaseHold {
    fn drop(&mut self) {
        let mut held = self.keeper.shared.held();
        // A later attempt of the same job may hold it by now.
        if held
            .get(&self.job_id)
            .is_some_and(|held| held.run_token == self.run_token)
        {
            held.remove(&self.job_id);
        }
    }
}
