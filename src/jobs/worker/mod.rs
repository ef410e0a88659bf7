//! Workers: claim due jobs, run each attempt under its own timeout and lease, and
//! finish it — never tied to the request that created the job.
//!
//! The database work of a busy worker is batched: the attempts of one claim start in
//! one transaction, and attempts that end at about the same moment finish in one
//! transaction ([`finisher`]); each job is still fenced by its own run token.

mod attempt;
mod deltas;
mod finisher;
mod judge;
mod pacing;

pub use judge::{CallEnd, judge_batch_request};

use super::flow::FlowLimits;
use super::input::JobInput;
use super::leases::LeaseKeeper;
use super::observe;
use super::queue::{
    self, AttemptStart, Claim, ClaimRequest, Claimed, StartedAttempt, TenantCursor,
};
use crate::billing::{AttemptEnding, CallBound, ChargingPolicy, Credits, ModelPrice, prices};
use crate::bus::{EventBus, TopicReceiver};
use crate::jobs::lifecycle::JobError;
use crate::llm::{Provider, ProviderRegistry};
use crate::metrics::Metrics;
use entity::JobErrorCode;
use entity::Timestamp;
use finisher::Finisher;
use pacing::{PauseWrites, TokenReturns};
use sea_orm::{DatabaseConnection, DbErr};
use serde::Deserialize;
use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::sync::Semaphore;
use tokio::task::JoinSet;
use tokio_util::sync::CancellationToken;
use uuid::Uuid;

/// Most jobs one claim takes, so one worker does not hoard a burst.
const CLAIM_BATCH: usize = 16;
/// How long aborted attempts may take to record their hand-back after the grace period.
const HAND_BACK_LIMIT: Duration = Duration::from_secs(10);

/// How a worker pool runs attempts.
#[derive(Clone, Debug)]
pub struct WorkerSettings {
    /// Most attempts running at once in this process.
    pub concurrency: usize,
    /// How long a claim owns a job without renewal.
    pub lease: Duration,
    /// Longest one provider call may take.
    pub attempt_timeout: Duration,
    /// How long running attempts may go on after shutdown is asked for.
    pub shutdown_grace: Duration,
    /// Most jobs of one tenant running at once across all workers (a soft bound).
    pub tenant_concurrency: Option<u32>,
    /// How often an idle worker looks for due jobs no notice told it about
    /// (retries coming due, jobs created by another process).
    pub poll_interval: Duration,
    /// What the customer pays for calls that did not simply succeed (the config
    /// file's `[charging]`).
    pub charging: ChargingPolicy,
    /// The providers' and models' per-minute limits (the config file's).
    pub flow: FlowLimits,
}

/// A pool of concurrent attempts in one process.
#[derive(Clone, Debug)]
pub struct Worker {
    inner: Arc<Inner>,
}

#[derive(Debug)]
struct Inner {
    id: String,
    db: DatabaseConnection,
    bus: EventBus,
    providers: ProviderRegistry,
    settings: WorkerSettings,
    leases: LeaseKeeper,
    finisher: Finisher,
    /// Unused tokens on their way back to their buckets.
    token_returns: TokenReturns,
    /// Model pauses on their way to the database.
    pause_writes: PauseWrites,
    metrics: Metrics,
    /// Cancelled when the grace period is over: running attempts stop waiting for the
    /// provider and hand their jobs back.
    abort: CancellationToken,
}

/// A claimed job made ready to run: its input read, its price and provider found.
struct Prepared {
    claim: Claim,
    input: JobInput,
    start: AttemptStart,
    /// The call's bound, its prompt counted by the provider's rule.
    bound: CallBound,
    provider: Option<Arc<dyn Provider>>,
    /// Subscribed before the attempt is recorded, so that no cancel slips between.
    notices: TopicReceiver,
}

/// An attempt on record, about to call the provider.
struct Ready {
    prepared: Prepared,
    started: StartedAttempt,
}

impl Worker {
    /// A worker pool; `id` names it on the attempts it records, and `metrics` counts
    /// what it does. Must be called inside a Tokio runtime: it starts the task that
    /// records finished attempts.
    pub fn new(
        id: String,
        db: DatabaseConnection,
        bus: EventBus,
        providers: ProviderRegistry,
        settings: WorkerSettings,
        metrics: Metrics,
    ) -> Self {
        Self {
            inner: Arc::new(Inner {
                id,
                leases: LeaseKeeper::new(db.clone(), settings.lease),
                finisher: Finisher::spawn(db.clone()),
                token_returns: TokenReturns::default(),
                pause_writes: PauseWrites::default(),
                db,
                bus,
                providers,
                settings,
                metrics,
                abort: CancellationToken::new(),
            }),
        }
    }

    /// Claims and runs jobs until `shutdown` is cancelled; then stops claiming, lets
    /// running attempts finish within the grace period, and aborts the rest, handing
    /// their jobs back at once without spending an attempt.
    pub async fn run(self, shutdown: CancellationToken) {
        let settings = &self.inner.settings;
        // Renews leases until this returns, however it returns.
        let keeper_stop = CancellationToken::new();
        let _stop_keeper = keeper_stop.clone().drop_guard();
        tokio::spawn(self.inner.leases.clone().run(keeper_stop.clone()));
        tokio::spawn(
            self.inner
                .pause_writes
                .clone()
                .run(self.inner.db.clone(), keeper_stop.clone()),
        );
        tokio::spawn(
            self.inner
                .token_returns
                .clone()
                .run(self.inner.db.clone(), keeper_stop),
        );
        if let Err(error) = tokio::task::spawn_blocking(super::tokens::load_tokenizers).await {
            tracing::error!(error = %error, "loading the tokenizers failed");
        }
        let permits = Arc::new(Semaphore::new(settings.concurrency));
        let mut created = self.inner.bus.watch_created();
        let mut attempts = JoinSet::new();
        let mut poll = tokio::time::interval(settings.poll_interval);
        tracing::info!(worker.id = %self.inner.id, concurrency = settings.concurrency, "worker started");
        // Sweeping is a query of its own: once per poll interval is often enough,
        // however busy the claiming gets.
        let mut last_sweep: Option<Instant> = None;
        // When the database last refused this process a write that may pass (a
        // failover, a lost connection). Leases lapse in the rows while nobody can renew
        // them, but their attempts may be alive in other processes, holding answers
        // they will record once writes pass: leases are judged again only a whole
        // lease after the database came back, time enough for every owner to renew.
        let mut refused_at: Option<Instant> = None;
        let mut cursor = TenantCursor::default();
        while !shutdown.is_cancelled() {
            let refused_lately = refused_at.is_some_and(|at| at.elapsed() < settings.lease);
            if !refused_lately && last_sweep.is_none_or(|at| at.elapsed() >= settings.poll_interval)
            {
                last_sweep = Some(Instant::now());
                if let Err(error) = self.take_back_expired_leases().await {
                    if crate::db::is_transient(&error) {
                        refused_at = Some(Instant::now());
                    }
                    tracing::error!(error = %error, "sweeping expired leases failed");
                }
                if let Err(error) = self.fail_past_deadlines().await {
                    tracing::error!(error = %error, "failing queued jobs past their deadline failed");
                }
            }
            let free = permits.available_permits().min(CLAIM_BATCH);
            let request = ClaimRequest {
                limit: free as u32,
                lease: settings.lease,
                tenant_limit: settings.tenant_concurrency,
                flow: &settings.flow,
            };
            let asked = Instant::now();
            let claimed = match queue::claim_in_turn(&self.inner.db, request, &mut cursor).await {
                Ok(Claimed { claims, deferred }) => {
                    observe::claimed(&self.inner.metrics, asked.elapsed(), &claims);
                    observe::deferred(&self.inner.metrics, &deferred);
                    claims
                }
                Err(error) => {
                    if crate::db::is_transient(&error) {
                        refused_at = Some(Instant::now());
                    }
                    tracing::error!(error = %error, "claiming jobs failed");
                    Vec::new()
                }
            };
            let batch_was_full = free > 0 && claimed.len() == free;
            for ready in self.start_attempts(claimed).await {
                let permit = permits
                    .clone()
                    .acquire_owned()
                    .await
                    .expect("the semaphore is never closed");
                let worker = self.clone();
                attempts.spawn(async move {
                    worker.run_attempt(ready).await;
                    drop(permit);
                });
            }
            if batch_was_full {
                continue;
            }
            // Idle or full: wait for a reason to look again.
            tokio::select! {
                _ = shutdown.cancelled() => {}
                _ = poll.tick() => {}
                Some(_) = attempts.join_next(), if !attempts.is_empty() => {}
                _ = created.next() => {}
            }
        }
        tracing::info!(worker.id = %self.inner.id, running = attempts.len(), "worker stopping");
        let drain = async { while attempts.join_next().await.is_some() {} };
        if tokio::time::timeout(settings.shutdown_grace, drain)
            .await
            .is_ok()
        {
            return;
        }
        tracing::warn!(
            aborting = attempts.len(),
            "grace period over: handing running jobs back"
        );
        self.inner.abort.cancel();
        let hand_back = async { while attempts.join_next().await.is_some() {} };
        if tokio::time::timeout(HAND_BACK_LIMIT, hand_back)
            .await
            .is_err()
        {
            // Their leases lapse and another worker takes the jobs back.
            attempts.shutdown().await;
        }
    }

    async fn take_back_expired_leases(&self) -> Result<(), DbErr> {
        let held_here = self.inner.leases.held_jobs();
        let notices = queue::expire_leases(&self.inner.db, &held_here).await?;
        observe::leases_expired(&self.inner.metrics, &notices);
        self.inner.bus.publish(notices);
        Ok(())
    }

    async fn fail_past_deadlines(&self) -> Result<(), DbErr> {
        let notices = queue::fail_past_deadlines(&self.inner.db).await?;
        observe::job_ended(&self.inner.metrics, &notices);
        self.inner.bus.publish(notices);
        Ok(())
    }

    /// Ends a claimed job that can never run, so that lease expiry does not hand it
    /// back for ever.
    async fn abandon(&self, claim: &Claim, reason: String) {
        tracing::error!(job.id = %claim.job.id, reason = %reason, "the job cannot be run");
        let error = JobError::new(JobErrorCode::NotRunnable, reason);
        match queue::abandon_claim(&self.inner.db, claim, &error).await {
            Ok(Some(notice)) => {
                observe::job_ended(&self.inner.metrics, std::slice::from_ref(&notice));
                self.inner.bus.publish([notice]);
            }
            Ok(None) => {}
            // The job keeps its lease until it lapses; then it is taken back.
            Err(error) => {
                tracing::error!(job.id = %claim.job.id, error = %error, "abandoning the job failed")
            }
        }
    }

    /// Records the attempts of a claimed batch — in one transaction when it can — and
    /// returns those ready to call their provider. A claim that cannot be started is
    /// abandoned when it never can, or left to lease expiry when the database is busy.
    async fn start_attempts(&self, claims: Vec<Claim>) -> Vec<Ready> {
        if claims.is_empty() {
            return Vec::new();
        }
        let mut prices: HashMap<String, Option<ModelPrice>> = HashMap::new();
        let mut held: HashMap<Uuid, Option<ModelPrice>> = HashMap::new();
        let mut prepared = Vec::with_capacity(claims.len());
        for claim in claims {
            if let Some(ready) = self.prepare(claim, &mut prices, &mut held).await {
                prepared.push(ready);
            }
        }
        // Every claim of the batch may have been abandoned.
        if prepared.is_empty() {
            return Vec::new();
        }
        let starts: Vec<_> = prepared
            .iter()
            .map(|prepared| (&prepared.claim, &prepared.start))
            .collect();
        let started = match queue::start_attempts(&self.inner.db, &starts).await {
            Ok(started) => started,
            Err(error) if prepared.len() > 1 => {
                // One claim's rows may be what the database refuses: start each alone,
                // so that only that one is affected.
                tracing::warn!(error = %error, claims = prepared.len(), "starting a batch of attempts failed; starting them one by one");
                let mut one_by_one = Vec::with_capacity(prepared.len());
                for prepared in &prepared {
                    one_by_one.push(self.start_alone(prepared).await);
                }
                one_by_one
            }
            Err(error) => vec![self.refused_start(&prepared[0], error).await],
        };
        let mut ready = Vec::with_capacity(prepared.len());
        for (prepared, started) in prepared.into_iter().zip(started) {
            let Some(started) = started else {
                tracing::warn!(job.id = %prepared.claim.job.id, "claim lost before the attempt started");
                continue;
            };
            self.inner.bus.publish([started.notice.clone()]);
            tracing::info!(
                job.id = %prepared.claim.job.id, attempt = started.attempt.number,
                provider = %started.attempt.provider, model = %prepared.claim.job.model,
                "attempt started"
            );
            ready.push(Ready { prepared, started });
        }
        ready
    }

    /// Reads what a claimed job needs to run; `None` when it cannot run (it is then
    /// abandoned) or its price could not be read (lease expiry hands it back).
    /// `prices` (by model) and `held` (by id) are the versions read for the claim so
    /// far.
    async fn prepare(
        &self,
        claim: Claim,
        prices: &mut HashMap<String, Option<ModelPrice>>,
        held: &mut HashMap<Uuid, Option<ModelPrice>>,
    ) -> Option<Prepared> {
        let inner = &self.inner;
        let input = match JobInput::deserialize(&claim.job.input.0) {
            Ok(input) => input,
            Err(error) => {
                self.abandon(&claim, format!("its stored input is unreadable: {error}"))
                    .await;
                return None;
            }
        };
        let price = match prices.get(&claim.job.model) {
            Some(price) => price.clone(),
            None => match prices::price_at(&inner.db, &claim.job.model, Timestamp::now()).await {
                Ok(price) => {
                    prices.insert(claim.job.model.clone(), price.clone());
                    price
                }
                Err(error) => {
                    tracing::error!(job.id = %claim.job.id, error = %error, "reading the model's price failed");
                    return None;
                }
            },
        };
        let Some(price) = price else {
            self.abandon(&claim, format!("model {} has no price", claim.job.model))
                .await;
            return None;
        };
        // The provider bills the price in force; the customer pays the one it was held at.
        let price = match prices::attempt_price(&inner.db, &claim.job, price, held).await {
            Ok(price) => price,
            Err(error) => {
                tracing::error!(job.id = %claim.job.id, error = %error, "reading the job's held price failed");
                return None;
            }
        };
        // None when this process has no provider for the model (its config differs
        // from the API process's): the job fails without a call. Nor does a worker
        // with no provider configured simulate a job the API admitted for a real one:
        // that would charge real prices for a simulated reply.
        let provider = inner
            .providers
            .provider_for(&claim.job.model)
            .filter(|_| claim.job.simulated || !inner.providers.simulates(&claim.job.model));
        let bound = input
            .call_bound(
                provider
                    .as_ref()
                    .map_or(crate::llm::PromptCounting::Bytes(None), |provider| {
                        provider.prompt_counting(&claim.job.model)
                    }),
                &claim.job.model,
            )
            .within(claim.job.token_bound);
        let charging = inner.settings.charging;
        // Without a provider nothing is sent, so nothing can be billed: the attempt's
        // bounds are zero, and no budget can refuse a start that only records why the
        // job fails (the bytes rule above would count more than the API held for).
        let (provider_cost_bound, customer_charge_bound, customer_charge_if_lost) =
            if provider.is_some() {
                (
                    bound.provider_cost(&price),
                    bound.customer_cost(&price),
                    charging.customer_charge(&price, bound, AttemptEnding::Unknown, None),
                )
            } else {
                (Credits::ZERO, Credits::ZERO, Credits::ZERO)
            };
        let start = AttemptStart {
            worker_id: inner.id.clone(),
            provider: provider.as_ref().map(|provider| provider.name().to_owned()),
            provider_cost_bound,
            customer_charge_bound,
            customer_charge_if_lost,
            price,
        };
        let notices = inner.bus.watch_job(claim.job.id);
        Some(Prepared {
            claim,
            input,
            start,
            bound,
            provider,
            notices,
        })
    }

    async fn start_alone(&self, prepared: &Prepared) -> Option<StartedAttempt> {
        match queue::start_attempt(&self.inner.db, &prepared.claim, &prepared.start).await {
            Ok(started) => started,
            Err(error) => self.refused_start(prepared, error).await,
        }
    }

    /// A database that is down or busy may let the next claim start; lease expiry
    /// hands the job back for it. A refusal would repeat for ever: the job is
    /// abandoned.
    async fn refused_start(&self, prepared: &Prepared, error: DbErr) -> Option<StartedAttempt> {
        if crate::db::is_transient(&error) {
            tracing::error!(job.id = %prepared.claim.job.id, error = %error, "recording the attempt's start failed");
        } else {
            self.abandon(
                &prepared.claim,
                format!("its attempt could not be recorded: {error}"),
            )
            .await;
        }
        None
    }
}
