//! One task of the concurrent run: random operations, each checked against what the
//! task itself saw.

use super::super::{Effect, Finish, LEASE, attempt_start, grant, let_lease_pass, plan, price_of};
use super::{
    CONCURRENT_KEYS, CONCURRENT_TENANTS, CreateOutcome, CreateRecord, Env, Held, Task,
    concurrent_spec,
};
use crate::helpers::simulated_models;
use entity::{JobStatus, jobs};
use jobledger::billing::Credits;
use jobledger::error::ServiceError;
use jobledger::jobs::queue::{self, ClaimRequest, Renewal};
use jobledger::jobs::service;
use rand::Rng;
use sea_orm::{ColumnTrait, EntityTrait, QueryFilter, QuerySelect};
use std::sync::Arc;
use uuid::Uuid;

impl Task {
    pub(super) async fn run(mut self, env: Arc<Env>, steps: usize) -> Self {
        for step in 0..steps {
            let at = format!("task {} step {step}", self.index);
            match self.rng.random_range(0..23u32) {
                0..=5 => self.create(&env, &at).await,
                6 => self.grant(&env).await,
                7..=9 => self.claim(&env).await,
                10..=12 => self.start(&env, &at).await,
                13..=17 => self.finish(&env, &at).await,
                18 => self.cancel(&env, &at).await,
                19..=20 => self.expire(&env).await,
                _ => self.stale_finish(&env, &at).await,
            }
            self.ops += 1;
        }
        self
    }

    pub(super) async fn create(&mut self, env: &Env, at: &str) {
        let tenant = self.rng.random_range(0..CONCURRENT_TENANTS);
        let key = self.rng.random_range(0..CONCURRENT_KEYS);
        let variant = u32::from(self.rng.random_bool(0.15));
        let spec = concurrent_spec(tenant, key, variant);
        let hold = spec.hold(&env.price_list[spec.model]);
        let new = spec.new_job(&format!("key-{key}"));
        let result = service::create_job(
            &env.db,
            &env.bus,
            &simulated_models(),
            env.tenants[tenant],
            new,
        )
        .await;
        let outcome = match result {
            Ok(created) if created.replayed => CreateOutcome::Replayed(created.job.id),
            Ok(created) => CreateOutcome::Fresh(created.job.id),
            Err(ServiceError::IdempotencyConflict) => CreateOutcome::Conflict,
            Err(ServiceError::InsufficientCredits { needed, .. }) => {
                assert_eq!(needed, hold, "{at}");
                CreateOutcome::Insufficient
            }
            Err(error) => panic!("{at}: create failed: {error}"),
        };
        let mut seen = env.seen.lock().unwrap();
        if let CreateOutcome::Fresh(id) = outcome {
            seen.holds.insert(id, (env.tenants[tenant], hold.nanos()));
        }
        seen.creates.push(CreateRecord {
            tenant,
            key,
            variant,
            outcome,
        });
    }

    pub(super) async fn grant(&mut self, env: &Env) {
        let tenant = env.tenants[self.rng.random_range(0..CONCURRENT_TENANTS)];
        let nanos = self.rng.random_range(1..=25_000_000i64);
        grant(
            &env.db,
            tenant,
            Credits::from_nanos(nanos),
            Uuid::new_v4().to_string(),
        )
        .await
        .expect("a grant");
        *env.seen.lock().unwrap().granted.entry(tenant).or_default() += nanos;
    }

    pub(super) async fn claim(&mut self, env: &Env) {
        let limit = self.rng.random_range(1..=3);
        let claims = queue::claim(&env.db, ClaimRequest::new(limit, LEASE))
            .await
            .unwrap();
        assert!(claims.len() <= limit as usize);
        let mut seen = env.seen.lock().unwrap();
        for claim in claims {
            assert_eq!(claim.job.status, JobStatus::Running);
            assert!(seen.claimed.insert(claim.run_token), "a run token repeated");
            self.held.push(Held {
                claim,
                attempt: None,
            });
        }
    }

    /// A claim lost its job: allowed only when some task made its lease pass.
    pub(super) fn lost(&self, env: &Env, held: &Held, at: &str) {
        let mut seen = env.seen.lock().unwrap();
        assert!(
            seen.forced.contains(&held.claim.run_token),
            "{at}: job {} was taken from a claim whose lease never passed",
            held.claim.job.id
        );
        seen.lost += 1;
    }

    pub(super) async fn start(&mut self, env: &Env, at: &str) {
        let waiting: Vec<usize> = (0..self.held.len())
            .filter(|&index| self.held[index].attempt.is_none())
            .collect();
        if waiting.is_empty() {
            return;
        }
        let index = waiting[self.rng.random_range(0..waiting.len())];
        let price = price_of(&env.price_list, &self.held[index].claim.job);
        let start = attempt_start(price, &self.held[index].claim.job);
        match queue::start_attempt(&env.db, &self.held[index].claim, &start)
            .await
            .unwrap()
        {
            Some(started) => self.held[index].attempt = Some(started.attempt),
            None => {
                let held = self.held.swap_remove(index);
                self.lost(env, &held, at);
            }
        }
    }

    pub(super) fn random_finish(&mut self) -> Finish {
        match self.rng.random_range(0..10u32) {
            0..=3 => Finish::Succeed {
                input: self.rng.random_range(0..=150),
                cached: self.rng.random_range(0..=50),
                output: self.rng.random_range(0..=6_000),
            },
            4 => Finish::Fail {
                billed: self.rng.random_bool(0.5),
            },
            5..=6 => Finish::Cancel,
            7..=8 => Finish::Retry {
                unknown: self.rng.random_bool(0.5),
            },
            _ => Finish::HandBack,
        }
    }

    pub(super) async fn finish(&mut self, env: &Env, at: &str) {
        let started: Vec<usize> = (0..self.held.len())
            .filter(|&index| self.held[index].attempt.is_some())
            .collect();
        if started.is_empty() {
            return;
        }
        let index = started[self.rng.random_range(0..started.len())];
        let how = self.random_finish();
        let held = self.held.swap_remove(index);
        let claim = &held.claim;
        if matches!(how, Finish::Cancel) {
            service::cancel_job(
                &env.db,
                &env.bus,
                &Default::default(),
                claim.job.tenant_id,
                claim.job.id,
            )
            .await
            .unwrap_or_else(|error| panic!("{at}: cancel failed: {error}"));
        }
        let price = price_of(&env.price_list, &claim.job);
        let (report, outcome, effect, _) = plan(how, &claim.job, price);
        let attempt = held.attempt.as_ref().unwrap();
        match queue::finish_attempt(&env.db, claim, attempt, price, report, outcome)
            .await
            .unwrap()
        {
            Some(_) => {
                if !matches!(effect, Effect::Requeue { .. }) {
                    env.seen
                        .lock()
                        .unwrap()
                        .finishes
                        .push((claim.job.id, effect));
                }
                self.stale.push(held);
            }
            None => self.lost(env, &held, at),
        }
    }

    pub(super) async fn cancel(&mut self, env: &Env, at: &str) {
        let jobs: Vec<(Uuid, Uuid)> = env
            .seen
            .lock()
            .unwrap()
            .holds
            .iter()
            .map(|(job, (tenant, _))| (*job, *tenant))
            .collect();
        if jobs.is_empty() {
            return;
        }
        let (job_id, tenant_id) = jobs[self.rng.random_range(0..jobs.len())];
        let job = service::cancel_job(&env.db, &env.bus, &Default::default(), tenant_id, job_id)
            .await
            .unwrap_or_else(|error| panic!("{at}: cancel failed: {error}"));
        assert_eq!(job.id, job_id);
        assert!(
            job.cancel_requested || job.status.is_terminal(),
            "{at}: a cancel left {job:?}"
        );
    }

    pub(super) async fn expire(&mut self, env: &Env) {
        if !self.held.is_empty() && self.rng.random_bool(0.5) {
            // One of this task's own claims: afterwards it has surely lost the job.
            let held = self
                .held
                .swap_remove(self.rng.random_range(0..self.held.len()));
            env.seen.lock().unwrap().forced.insert(held.claim.run_token);
            let_lease_pass(&env.db, held.claim.job.id, held.claim.run_token).await;
            queue::expire_leases(&env.db, &Default::default())
                .await
                .unwrap();
            self.stale.push(held);
        } else {
            // Any running job, whoever holds it.
            let running = jobs::Entity::find()
                .filter(jobs::Column::Status.eq(JobStatus::Running))
                .limit(20)
                .all(&env.db)
                .await
                .unwrap();
            if running.is_empty() {
                return;
            }
            let job = &running[self.rng.random_range(0..running.len())];
            let Some(run_token) = job.run_token else {
                panic!("a running job without a run token: {job:?}");
            };
            env.seen.lock().unwrap().forced.insert(run_token);
            let_lease_pass(&env.db, job.id, run_token).await;
            queue::expire_leases(&env.db, &Default::default())
                .await
                .unwrap();
        }
    }

    pub(super) async fn stale_finish(&mut self, env: &Env, at: &str) {
        if self.stale.is_empty() {
            return;
        }
        let held = self.stale[self.rng.random_range(0..self.stale.len())].clone();
        let how = self.random_finish();
        env.seen.lock().unwrap().stale_tries += 1;
        let price = price_of(&env.price_list, &held.claim.job);
        assert_eq!(
            crate::helpers::renew_lease(&env.db, &held.claim, LEASE).await,
            Renewal::Lost,
            "{at}: a stale claim renewed"
        );
        assert!(
            queue::start_attempt(&env.db, &held.claim, &attempt_start(price, &held.claim.job))
                .await
                .unwrap()
                .is_none(),
            "{at}: a stale claim started an attempt"
        );
        if let Some(attempt) = &held.attempt {
            let (report, outcome, _, _) = plan(how, &held.claim.job, price);
            assert!(
                queue::finish_attempt(&env.db, &held.claim, attempt, price, report, outcome)
                    .await
                    .unwrap()
                    .is_none(),
                "{at}: a stale claim finished job {}",
                held.claim.job.id
            );
        }
    }
}
