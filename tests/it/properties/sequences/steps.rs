//! Each operation of a sequence, applied to the database and to the reference model.

use super::super::{
    AttemptCost, Effect, Finish, LEASE, Spec, attempt_start, grant, let_lease_pass, plan, price_of,
};
use super::{ModelJob, Op, Sequence, started_after_a_cancel};
use crate::helpers::simulated_models;
use entity::{
    AttemptOutcome, JobStatus, attempts, charges, credit_reservations, job_events, jobs,
    ledger_entries, tenants,
};
use jobledger::billing::Credits;
use jobledger::billing::ledger::{self};
use jobledger::db::begin_write;
use jobledger::error::ServiceError;
use jobledger::jobs::queue::{self, ClaimRequest, Renewal};
use jobledger::jobs::service;
use rust_decimal::Decimal;
use sea_orm::{
    ColumnTrait, DatabaseConnection, EntityTrait, PaginatorTrait, QueryFilter, QueryOrder,
};
use uuid::Uuid;

impl Sequence {
    pub(super) async fn apply(&mut self, op: Op) {
        match op {
            Op::Grant {
                tenant,
                nanos,
                key,
                same,
            } => {
                self.grant(tenant % self.tenants.len(), nanos, key, same)
                    .await
            }
            Op::Create { tenant, key, spec } => {
                self.create(tenant % self.tenants.len(), key, spec).await;
            }
            Op::Replay { pick, same } => {
                if self.jobs.is_empty() {
                    return;
                }
                let job = &self.jobs[pick % self.jobs.len()];
                let spec = if same {
                    job.spec.clone()
                } else {
                    job.spec.changed()
                };
                let (tenant, key) = (job.tenant, job.key);
                self.create(tenant, key, spec).await;
            }
            Op::Claim { limit } => self.claim(limit).await,
            Op::Start { pick } => self.start(pick).await,
            Op::Finish { pick, how } => self.finish(pick, how).await,
            Op::Cancel { pick } => {
                if !self.jobs.is_empty() {
                    self.cancel(pick % self.jobs.len()).await;
                }
            }
            Op::Expire { pick } => self.expire(pick).await,
            Op::StaleFinish { pick, how } => self.stale_finish(pick, how).await,
            Op::ResolveAgain {
                pick,
                settle,
                nanos,
            } => self.resolve_again(pick, settle, nanos).await,
        }
    }

    pub(super) async fn grant(&mut self, tenant: usize, nanos: i64, key: u8, same: bool) {
        let previous = self.tenants[tenant].grants.get(&key).copied();
        let nanos = match previous {
            Some((first, _)) if same => first,
            _ => nanos,
        };
        let tenant_id = self.tenants[tenant].id;
        // Exactly nine fractional digits on the way in, as the API receives them.
        let amount = Credits::from_decimal(Decimal::new(nanos, 9)).unwrap();
        assert_eq!(amount.nanos(), nanos, "{}", self.at);
        let result = grant(&self.db, tenant_id, amount, format!("grant-{key}")).await;
        match previous {
            Some((first, id)) if first == nanos => {
                let replayed = result.unwrap_or_else(|error| {
                    panic!("{}: a repeated grant failed: {error}", self.at)
                });
                assert_eq!(
                    replayed.id, id,
                    "{}: a repeated grant granted again",
                    self.at
                );
            }
            Some(_) => assert!(
                matches!(result, Err(ServiceError::IdempotencyConflict)),
                "{}: a grant key reused with another amount gave {result:?}",
                self.at
            ),
            None => {
                let granted =
                    result.unwrap_or_else(|error| panic!("{}: a grant failed: {error}", self.at));
                assert_eq!(granted.amount_nanos, nanos, "{}", self.at);
                let model = &mut self.tenants[tenant];
                model.granted += nanos;
                model.grants.insert(key, (nanos, granted.id));
                self.ledger_entries += 1;
            }
        }
    }

    pub(super) async fn create(&mut self, tenant: usize, key: u8, spec: Spec) {
        let new = spec.new_job(&format!("job-{key}"));
        let price = &self.price_list[spec.model];
        let hold = spec.hold(price);
        assert_eq!(
            new.charging.job_hold(
                new.input
                    .call_bound(jobledger::llm::PromptCounting::QuarterBytes, "gpt-4o-mini"),
                price,
                new.max_attempts,
                new.input.stream_output,
            ),
            hold,
            "{}: the service sizes holds other than docs/architecture.md says",
            self.at
        );
        let tenant_id = self.tenants[tenant].id;
        let result =
            service::create_job(&self.db, &self.bus, &simulated_models(), tenant_id, new).await;
        let model = &self.tenants[tenant];
        if let Some(&existing) = model.keys.get(&key) {
            let existing = &self.jobs[existing];
            if existing.spec == spec {
                let created =
                    result.unwrap_or_else(|error| panic!("{}: a replay failed: {error}", self.at));
                assert!(created.replayed, "{}: a replay was not marked", self.at);
                assert_eq!(
                    created.job.id, existing.id,
                    "{}: a replay made a job",
                    self.at
                );
            } else {
                assert!(
                    matches!(result, Err(ServiceError::IdempotencyConflict)),
                    "{}: a key reused with another request gave {result:?}",
                    self.at
                );
            }
            return;
        }
        let available = model.granted - model.charged - model.held;
        if hold.nanos() > available {
            match result {
                Err(ServiceError::InsufficientCredits {
                    needed,
                    available: reported,
                }) => {
                    assert_eq!(needed, hold, "{}", self.at);
                    assert_eq!(reported.nanos(), available, "{}", self.at);
                }
                other => panic!(
                    "{}: a hold of {hold} over {available} nanos available gave {other:?}",
                    self.at
                ),
            }
            return;
        }
        let created = result.unwrap_or_else(|error| {
            panic!(
                "{}: a create of {hold} with {available} nanos available failed: {error}",
                self.at
            )
        });
        assert!(!created.replayed, "{}", self.at);
        assert_eq!(created.job.status, JobStatus::Queued, "{}", self.at);
        self.tenants[tenant].held += hold.nanos();
        self.tenants[tenant].keys.insert(key, self.jobs.len());
        self.ledger_entries += 1;
        self.jobs.push(ModelJob {
            id: created.job.id,
            tenant,
            key,
            spec,
            hold: hold.nanos(),
            status: JobStatus::Queued,
            cancel_requested: false,
            attempt_count: 0,
            claim: None,
            charged: None,
            attempts: Vec::new(),
            hand_backs: 0,
        });
    }

    pub(super) fn job_index(&self, id: Uuid) -> usize {
        self.jobs
            .iter()
            .position(|job| job.id == id)
            .unwrap_or_else(|| panic!("{}: job {id} is not in the model", self.at))
    }

    pub(super) async fn claim(&mut self, limit: u32) {
        let queued = self
            .jobs
            .iter()
            .filter(|job| job.status == JobStatus::Queued)
            .count();
        let claims = queue::claim(&self.db, ClaimRequest::new(limit, LEASE))
            .await
            .unwrap();
        assert_eq!(
            claims.len(),
            queued.min(limit as usize),
            "{}: {queued} queued jobs, limit {limit}",
            self.at
        );
        for claim in claims {
            let index = self.job_index(claim.job.id);
            let job = &mut self.jobs[index];
            assert_eq!(
                job.status,
                JobStatus::Queued,
                "{}: claimed a job that was not queued (or claimed it twice)",
                self.at
            );
            assert_eq!(claim.job.status, JobStatus::Running, "{}", self.at);
            assert_eq!(
                claim.job.attempt_count,
                job.attempt_count + 1,
                "{}",
                self.at
            );
            job.status = JobStatus::Running;
            job.attempt_count += 1;
            job.claim = Some((claim, None));
        }
    }

    pub(super) async fn start(&mut self, pick: usize) {
        let eligible: Vec<usize> = (0..self.jobs.len())
            .filter(|&index| matches!(self.jobs[index].claim, Some((_, None))))
            .collect();
        if eligible.is_empty() {
            return;
        }
        self.start_job(eligible[pick % eligible.len()]).await;
    }

    /// Records the attempt of the job's live claim, as a worker does before its call.
    pub(super) async fn start_job(&mut self, index: usize) {
        let (claim, _) = self.jobs[index].claim.clone().unwrap();
        let price = price_of(&self.price_list, &claim.job).clone();
        let start = attempt_start(&price, &claim.job);
        let started = queue::start_attempt(&self.db, &claim, &start)
            .await
            .unwrap()
            .unwrap_or_else(|| panic!("{}: the owner of a job could not start", self.at));
        let attempt = started.attempt;
        let job = &mut self.jobs[index];
        assert_eq!(
            started.cancel_requested, job.cancel_requested,
            "{}",
            self.at
        );
        assert_eq!(
            attempt.number as usize,
            job.attempts.len() + 1,
            "{}",
            self.at
        );
        // A call that will not be made is recorded as not billed from the start.
        let (bound, row) = if job.cancel_requested {
            (
                None,
                AttemptCost {
                    outcome: AttemptOutcome::Running,
                    exact: Some(0),
                    paid: false,
                },
            )
        } else {
            (
                Some(start.provider_cost_bound.nanos()),
                AttemptCost::RUNNING,
            )
        };
        assert_eq!(
            attempt.provider_cost_upper_bound_nanos, bound,
            "{}",
            self.at
        );
        assert_eq!(
            started.budget_refusal, None,
            "{}: a job was queued with no paid call left",
            self.at
        );
        job.attempts.push(row);
        job.claim = Some((claim, Some(attempt)));
    }

    /// Finishes a live claim, starting its attempt first if it has none yet.
    pub(super) async fn finish(&mut self, pick: usize, how: Finish) {
        let eligible: Vec<usize> = (0..self.jobs.len())
            .filter(|&index| self.jobs[index].claim.is_some())
            .collect();
        if eligible.is_empty() {
            return;
        }
        let index = eligible[pick % eligible.len()];
        if matches!(self.jobs[index].claim, Some((_, None))) {
            self.start_job(index).await;
        }
        if matches!(how, Finish::Cancel) {
            // The tenant cancels first; the worker learns of it and stops the attempt.
            self.cancel(index).await;
        }
        let (claim, attempt) = self.jobs[index].claim.clone().unwrap();
        let attempt = attempt.unwrap();
        let how = if started_after_a_cancel(&attempt) {
            Finish::CancelledBeforeSending
        } else {
            how
        };
        let price = price_of(&self.price_list, &claim.job).clone();
        let (report, outcome, effect, cost) = plan(how, &claim.job, &price);
        let finished = queue::finish_attempt(&self.db, &claim, &attempt, &price, report, outcome)
            .await
            .unwrap();
        assert!(
            finished.is_some(),
            "{}: the owner of a job could not finish it",
            self.at
        );
        let job = &mut self.jobs[index];
        *job.attempts.last_mut().unwrap() = cost;
        if matches!(how, Finish::HandBack) {
            job.hand_backs += 1;
        }
        job.claim = None;
        let tenant = &mut self.tenants[job.tenant];
        let effect = match effect {
            // A job that made as many paid calls as maxAttempts makes no more.
            Effect::Requeue { .. } if !job.cancel_requested && !job.calls_left() => {
                Effect::Release(JobStatus::Failed)
            }
            other => other,
        };
        match effect {
            Effect::Settle { charge } => {
                let charged = charge.nanos().min(job.hold);
                tenant.held -= job.hold;
                tenant.charged += charged;
                job.status = JobStatus::Succeeded;
                job.charged = Some(charged);
                // A charge entry always; a release entry for any remainder.
                self.ledger_entries += 1 + u64::from(job.hold > charged);
            }
            Effect::Release(status) => {
                tenant.held -= job.hold;
                job.status = status;
                self.ledger_entries += 1;
            }
            // A cancel that landed while the call ran wins over going round again.
            Effect::Requeue { .. } if job.cancel_requested => {
                tenant.held -= job.hold;
                job.status = JobStatus::Cancelled;
                self.ledger_entries += 1;
            }
            Effect::Requeue { hand_back } => {
                job.status = JobStatus::Queued;
                if hand_back {
                    job.attempt_count -= 1;
                }
            }
        }
        self.stale.push((claim, Some(attempt)));
    }

    pub(super) async fn cancel(&mut self, index: usize) {
        let job = &self.jobs[index];
        let tenant_id = self.tenants[job.tenant].id;
        let returned =
            service::cancel_job(&self.db, &self.bus, &Default::default(), tenant_id, job.id)
                .await
                .unwrap_or_else(|error| panic!("{}: cancel failed: {error}", self.at));
        let job = &mut self.jobs[index];
        match job.status {
            JobStatus::Queued => {
                job.status = JobStatus::Cancelled;
                job.cancel_requested = true;
                self.tenants[job.tenant].held -= job.hold;
                self.ledger_entries += 1;
            }
            JobStatus::Running => job.cancel_requested = true,
            _ => {}
        }
        assert_eq!(returned.status, job.status, "{}", self.at);
        assert_eq!(
            returned.cancel_requested, job.cancel_requested,
            "{}",
            self.at
        );
    }

    pub(super) async fn expire(&mut self, pick: usize) {
        let eligible: Vec<usize> = (0..self.jobs.len())
            .filter(|&index| self.jobs[index].status == JobStatus::Running)
            .collect();
        if eligible.is_empty() {
            return;
        }
        let index = eligible[pick % eligible.len()];
        let (claim, attempt) = self.jobs[index].claim.clone().unwrap();
        assert_eq!(
            let_lease_pass(&self.db, claim.job.id, claim.run_token).await,
            1,
            "{}",
            self.at
        );
        let notices = queue::expire_leases(&self.db, &Default::default())
            .await
            .unwrap();
        let job = &mut self.jobs[index];
        let status = if job.cancel_requested {
            JobStatus::Cancelled
        } else if attempt.is_none() {
            // Nothing was sent: the claim is given back and does not count.
            job.attempt_count -= 1;
            JobStatus::Queued
        } else if job.attempt_count >= claim.job.max_attempts
            || !job.calls_left()
            || !job.spec.retry_unknown
        {
            JobStatus::Failed
        } else {
            JobStatus::Queued
        };
        assert_eq!(notices.len(), 1, "{}: {notices:?}", self.at);
        assert_eq!(notices[0].job_id, job.id, "{}", self.at);
        assert_eq!(notices[0].status, status, "{}", self.at);
        if attempt.is_some() {
            // The lost attempt keeps its cost bound.
            job.attempts.last_mut().unwrap().outcome = AttemptOutcome::LeaseExpired;
        }
        job.status = status;
        job.claim = None;
        if status.is_terminal() {
            self.tenants[job.tenant].held -= job.hold;
            self.ledger_entries += 1;
        }
        self.stale.push((claim, attempt));
    }

    pub(super) async fn stale_finish(&mut self, pick: usize, how: Finish) {
        if self.stale.is_empty() {
            return;
        }
        let (claim, attempt) = self.stale[pick % self.stale.len()].clone();
        let before = snapshot(&self.db).await;
        let price = price_of(&self.price_list, &claim.job).clone();
        assert_eq!(
            crate::helpers::renew_lease(&self.db, &claim, LEASE).await,
            Renewal::Lost,
            "{}: a stale claim renewed its lease",
            self.at
        );
        assert!(
            queue::start_attempt(&self.db, &claim, &attempt_start(&price, &claim.job))
                .await
                .unwrap()
                .is_none(),
            "{}: a stale claim started an attempt",
            self.at
        );
        if let Some(attempt) = &attempt {
            let (report, outcome, _, _) = plan(how, &claim.job, &price);
            let finished =
                queue::finish_attempt(&self.db, &claim, attempt, &price, report, outcome)
                    .await
                    .unwrap();
            assert!(finished.is_none(), "{}: a stale claim finished", self.at);
        }
        assert!(
            before == snapshot(&self.db).await,
            "{}: a stale claim wrote something",
            self.at
        );
    }

    /// A hold resolves once, whoever asks twice: settling or releasing an ended job's
    /// hold again answers `None` and writes nothing.
    pub(super) async fn resolve_again(&mut self, pick: usize, settle: bool, nanos: i64) {
        let ended: Vec<Uuid> = self
            .jobs
            .iter()
            .filter(|job| job.status.is_terminal())
            .map(|job| job.id)
            .collect();
        if ended.is_empty() {
            return;
        }
        let job_id = ended[pick % ended.len()];
        let attempt_id = attempts::Entity::find()
            .filter(attempts::Column::JobId.eq(job_id))
            .one(&self.db)
            .await
            .unwrap()
            .map_or(Uuid::nil(), |attempt| attempt.id);
        let before = snapshot(&self.db).await;
        let transaction = begin_write(&self.db).await.unwrap();
        let resolved = if settle {
            ledger::settle(&transaction, job_id, attempt_id, Credits::from_nanos(nanos)).await
        } else {
            ledger::release(&transaction, job_id).await
        };
        transaction.commit().await.unwrap();
        let resolved = resolved.unwrap_or_else(|error| {
            panic!("{}: resolving a resolved hold failed: {error}", self.at)
        });
        assert_eq!(
            resolved, None,
            "{}: a resolved hold resolved again",
            self.at
        );
        assert!(
            before == snapshot(&self.db).await,
            "{}: resolving a resolved hold wrote something",
            self.at
        );
    }
}

/// Everything a stale claim could write.
#[derive(PartialEq)]
struct Snapshot {
    jobs: Vec<jobs::Model>,
    attempts: Vec<attempts::Model>,
    reservations: Vec<credit_reservations::Model>,
    tenants: Vec<tenants::Model>,
    ledger_entries: u64,
    charges: u64,
    events: u64,
}

async fn snapshot(db: &DatabaseConnection) -> Snapshot {
    Snapshot {
        jobs: jobs::Entity::find()
            .order_by_asc(jobs::Column::Id)
            .all(db)
            .await
            .unwrap(),
        attempts: attempts::Entity::find()
            .order_by_asc(attempts::Column::Id)
            .all(db)
            .await
            .unwrap(),
        reservations: credit_reservations::Entity::find()
            .order_by_asc(credit_reservations::Column::Id)
            .all(db)
            .await
            .unwrap(),
        tenants: tenants::Entity::find()
            .order_by_asc(tenants::Column::Id)
            .all(db)
            .await
            .unwrap(),
        ledger_entries: ledger_entries::Entity::find().count(db).await.unwrap(),
        charges: charges::Entity::find().count(db).await.unwrap(),
        events: job_events::Entity::find().count(db).await.unwrap(),
    }
}
