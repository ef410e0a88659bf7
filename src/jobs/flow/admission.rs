//! Admission: the budgets one claim weighs its candidates against, in rank order.

use super::bucket::Bucket;
use super::{BucketKey, BucketScope, Deferral, DeferralReason, FlowLimits, RateLimit};
use entity::{Timestamp, rate_limit_buckets};
use std::collections::{HashMap, HashSet};
use std::num::NonZeroU32;
use uuid::Uuid;

/// A queued job as the claim weighs it.
#[derive(Clone, Debug)]
pub struct Weighed<'a> {
    pub tenant_id: Uuid,
    pub model: &'a str,
    pub tokens: u64,
}

/// The budgets one claim admits jobs against: the buckets it locked, refilled to the
/// claim's instant, and the running slots each tenant has left.
#[derive(Debug, Default)]
pub struct Admission {
    buckets: HashMap<BucketKey, Bucket>,
    /// Which buckets each model and tenant takes from.
    model_buckets: HashMap<String, Vec<BucketKey>>,
    tenant_buckets: HashMap<Uuid, BucketKey>,
    /// Jobs each tenant may still start, when its concurrency is bounded.
    tenant_slots: HashMap<Uuid, u32>,
    /// Buckets another claim holds: they admit nothing in this one.
    held: HashSet<BucketKey>,
}

impl Admission {
    /// Budgets for calls of `models` (each with its ramp after a pause, if it is
    /// ramping back up) and jobs of the `tenants` with their limits.
    /// `rows` are the stored buckets the caller locked; `busy` are those another claim
    /// held, which admit nothing now; `running` is how many jobs each tenant runs, when
    /// `tenant_concurrency` bounds it.
    #[allow(clippy::too_many_arguments)]
    pub fn new<'a>(
        flow: &FlowLimits,
        models: impl IntoIterator<Item = (&'a str, Option<NonZeroU32>)>,
        tenants: &[(Uuid, RateLimit)],
        rows: &[rate_limit_buckets::Model],
        busy: &[BucketKey],
        tenant_concurrency: Option<u32>,
        running: &HashMap<Uuid, u32>,
        now: Timestamp,
    ) -> Self {
        let stored: HashMap<(&str, &str), &rate_limit_buckets::Model> = rows
            .iter()
            .map(|row| ((row.scope.as_str(), row.key.as_str()), row))
            .collect();
        let mut admission = Self::default();
        let add = |admission: &mut Self, key: &BucketKey, limit: RateLimit| {
            admission.buckets.entry(key.clone()).or_insert_with(|| {
                let row = stored.get(&(key.scope.as_str(), key.key.as_str())).copied();
                Bucket::refilled(row, limit, now)
            });
        };
        for (model, ramp) in models {
            if admission.model_buckets.contains_key(model) {
                continue;
            }
            let keys = flow
                .ramping_buckets_of(model, ramp)
                .into_iter()
                .map(|(key, limit)| {
                    add(&mut admission, &key, limit);
                    key
                })
                .collect();
            admission.model_buckets.insert(model.to_owned(), keys);
        }
        for (tenant_id, limit) in tenants {
            if limit.is_limited() {
                let key = BucketKey::tenant(*tenant_id);
                add(&mut admission, &key, *limit);
                admission.tenant_buckets.insert(*tenant_id, key);
            }
            if let Some(bound) = tenant_concurrency {
                let busy = running.get(tenant_id).copied().unwrap_or(0);
                admission
                    .tenant_slots
                    .insert(*tenant_id, bound.saturating_sub(busy));
            }
        }
        for key in busy {
            admission.held.insert(key.clone());
            // Its running jobs may be changing under another claim: none start here.
            if key.scope == BucketScope::Tenant
                && let Some((tenant_id, _)) = tenants
                    .iter()
                    .find(|(tenant_id, _)| BucketKey::tenant(*tenant_id) == *key)
            {
                admission.tenant_slots.insert(*tenant_id, 0);
                admission.tenant_buckets.insert(*tenant_id, key.clone());
            }
        }
        admission
    }

    /// Why no job of `model` can start now, if none can.
    pub fn model_blocked(&self, model: &str) -> Option<Deferral> {
        self.model_buckets.get(model)?.iter().find_map(|key| {
            self.shortage(key).map(|reason| Deferral {
                scope: key.scope,
                reason,
            })
        })
    }

    /// Why `key`'s bucket cannot take a call now, if it cannot.
    fn shortage(&self, key: &BucketKey) -> Option<DeferralReason> {
        if self.held.contains(key) {
            return Some(DeferralReason::Busy);
        }
        self.buckets.get(key)?.shortage()
    }

    /// Why no job of `tenant_id` can start now, if none can.
    pub fn tenant_blocked(&self, tenant_id: Uuid) -> Option<Deferral> {
        let key = self.tenant_buckets.get(&tenant_id);
        if key.is_some_and(|key| self.held.contains(key)) {
            return Some(Deferral {
                scope: BucketScope::Tenant,
                reason: DeferralReason::Busy,
            });
        }
        if self.tenant_slots.get(&tenant_id) == Some(&0) {
            return Some(Deferral {
                scope: BucketScope::Tenant,
                reason: DeferralReason::Concurrency,
            });
        }
        self.shortage(key?).map(|reason| Deferral {
            scope: BucketScope::Tenant,
            reason,
        })
    }

    /// Takes `job`'s call from every budget it counts against, or tells which one is
    /// short and takes nothing.
    pub fn admit(&mut self, job: &Weighed<'_>) -> Result<(), Deferral> {
        if self.tenant_slots.get(&job.tenant_id) == Some(&0) {
            return Err(Deferral {
                scope: BucketScope::Tenant,
                reason: DeferralReason::Concurrency,
            });
        }
        let keys: Vec<&BucketKey> = self
            .model_buckets
            .get(job.model)
            .into_iter()
            .flatten()
            .chain(self.tenant_buckets.get(&job.tenant_id))
            .collect();
        for key in &keys {
            if let Some(reason) = self.shortage(key) {
                return Err(Deferral {
                    scope: key.scope,
                    reason,
                });
            }
        }
        let keys: Vec<BucketKey> = keys.into_iter().cloned().collect();
        for key in keys {
            if let Some(bucket) = self.buckets.get_mut(&key) {
                bucket.take(job.tokens);
            }
        }
        if let Some(slots) = self.tenant_slots.get_mut(&job.tenant_id) {
            *slots -= 1;
        }
        Ok(())
    }

    /// The buckets something was taken from, to be written back.
    pub fn taken(&self) -> Vec<(&BucketKey, &Bucket)> {
        let mut taken: Vec<_> = self
            .buckets
            .iter()
            .filter(|(_, bucket)| bucket.was_taken())
            .collect();
        taken.sort_by(|a, b| a.0.cmp(b.0));
        taken
    }
}

#[cfg(test)]
mod tests {
    use super::super::bucket::tests::{at, limit};
    use super::*;
    use crate::llm::ProviderRegistry;
    use std::collections::BTreeMap;

    #[test]
    fn admission_takes_from_model_and_tenant_and_counts_running_slots() {
        let mut models = BTreeMap::new();
        models.insert("m".to_owned(), limit(Some(120), None)); // two a second
        let flow = FlowLimits::new(models, BTreeMap::new(), ProviderRegistry::new(None));
        let busy_tenant = Uuid::from_u128(1);
        let limited_tenant = Uuid::from_u128(2);
        let running = HashMap::from([(busy_tenant, 2)]);
        let mut admission = Admission::new(
            &flow,
            [("m", None), ("free", None)],
            &[
                (busy_tenant, RateLimit::default()),
                (limited_tenant, limit(Some(60), None)),
            ],
            &[],
            &[],
            Some(3),
            &running,
            at(0.0),
        );
        let job = |tenant_id, model| Weighed {
            tenant_id,
            model,
            tokens: 10,
        };
        assert_eq!(admission.admit(&job(busy_tenant, "m")), Ok(()));
        let concurrency = Deferral {
            scope: BucketScope::Tenant,
            reason: DeferralReason::Concurrency,
        };
        assert_eq!(admission.admit(&job(busy_tenant, "free")), Err(concurrency));
        assert_eq!(admission.tenant_blocked(busy_tenant), Some(concurrency));
        assert_eq!(admission.admit(&job(limited_tenant, "m")), Ok(()));
        assert_eq!(
            admission.admit(&job(limited_tenant, "free")),
            Err(Deferral {
                scope: BucketScope::Tenant,
                reason: DeferralReason::Requests
            })
        );
        assert_eq!(
            admission.model_blocked("m"),
            Some(Deferral {
                scope: BucketScope::Model,
                reason: DeferralReason::Requests
            })
        );
        assert_eq!(admission.model_blocked("free"), None);
        // Tokens: any call while some are left, none in debt.
        let mut tokens = Admission::new(
            &FlowLimits::new(
                BTreeMap::from([("t".to_owned(), limit(None, Some(600)))]), // 10 a second
                BTreeMap::new(),
                ProviderRegistry::new(None),
            ),
            [("t", None)],
            &[],
            &[],
            &[],
            None,
            &HashMap::new(),
            at(0.0),
        );
        let sized = |tokens| Weighed {
            tenant_id: busy_tenant,
            model: "t",
            tokens,
        };
        assert_eq!(tokens.admit(&sized(6)), Ok(()));
        // Four tokens left: a call of eight starts and leaves the bucket in debt.
        assert_eq!(tokens.admit(&sized(8)), Ok(()));
        assert!(tokens.admit(&sized(1)).is_err(), "nothing starts in debt");
        let taken: Vec<_> = admission
            .taken()
            .into_iter()
            .map(|(key, _)| key.clone())
            .collect();
        assert_eq!(
            taken,
            [BucketKey::model("m"), BucketKey::tenant(limited_tenant)]
        );
    }

    #[test]
    fn a_model_ramping_up_after_a_pause_admits_one_call_in_its_first_second() {
        let tenant = Uuid::from_u128(1);
        let mut admission = Admission::new(
            &FlowLimits::none(),
            [("free", NonZeroU32::new(60))],
            &[(tenant, RateLimit::default())],
            &[],
            &[],
            None,
            &HashMap::new(),
            at(0.0),
        );
        let call = Weighed {
            tenant_id: tenant,
            model: "free",
            tokens: 100,
        };
        assert_eq!(admission.admit(&call), Ok(()));
        assert_eq!(
            admission.admit(&call),
            Err(Deferral {
                scope: BucketScope::Model,
                reason: DeferralReason::Requests,
            })
        );
        assert_eq!(
            admission.taken()[0].1.requests(),
            Some(0.0),
            "the ramp's bucket is written back"
        );
    }
}
