//! Claiming due jobs: fair across tenants, by priority within a tenant, within the
//! rate limits of providers, models and tenants, and at a cost that does not grow with
//! the backlog.
//!
//! A claim visits tenants that have queued jobs in turns of at most `limit` tenants.
//! A skip scan of the queued-jobs index (tenant, model, priority, due time) finds each
//! visited tenant's (model, priority) groups with one probe per group, however many
//! jobs each holds ([`visit`]). For each group it reads at most `limit` due jobs, the
//! oldest first — again an index range scan — ranks each tenant's jobs by priority,
//! then age, and takes jobs rank by rank across the tenants (the oldest first within a
//! rank: priorities are never compared across tenants), so one tenant's 100,000
//! queued jobs never starve another tenant's single job. The rows it touches are
//! O(claimed × groups + tenants with queued jobs), never the backlog.
//!
//! A group whose model is paused (the provider answered 429) or whose budget is spent
//! is passed over with its one probe, without reading its jobs; a model whose pause
//! just ended is admitted by a ramp that starts at one call a second. When a visited model,
//! its provider or a visited tenant is limited, the claim locks those buckets, admits
//! jobs in rank order while every budget they count against allows ([`flow`]) and
//! writes back what it took, all in the transaction that claims them. Without limits
//! in play a claim is one statement on PostgreSQL.
//!
//! A worker keeps a [`TenantCursor`] between claims, so that with more tenants
//! waiting than one claim visits, each gets its turn.
//!
//! [`flow`]: crate::jobs::flow

mod postgres;
mod sqlite;
mod visit;

use crate::db::begin_write;
use crate::jobs::flow::{
    Admission, BucketKey, Deferral, FlowLimits, NO_LIMITS, RateLimit, Weighed,
};
use entity::{JobStatus, Timestamp, jobs};
use sea_orm::{
    ColumnTrait, ConnectionTrait, DatabaseConnection, DbBackend, DbErr, EntityTrait,
    FromQueryResult, QueryFilter, QuerySelect,
};
use std::collections::{HashMap, HashSet};
use std::num::NonZeroU32;
use std::time::Duration;
use uuid::Uuid;
use visit::Visit;

/// A job this worker claimed: the job as claimed, fenced by its run token.
#[derive(Clone, Debug)]
pub struct Claim {
    pub job: jobs::Model,
    pub run_token: Uuid,
    /// The tenant's rate limits as the claim admitted the job by: a finished call
    /// gives its unused tokens back to the tenant's budget only if it has one.
    pub tenant_rate: RateLimit,
}

/// What one claim asks for.
#[derive(Clone, Copy, Debug)]
pub struct ClaimRequest<'a> {
    /// Most jobs to take.
    pub limit: u32,
    /// How long each claimed job is owned without renewal.
    pub lease: Duration,
    /// Most jobs of one tenant running at once across every process, if bounded.
    pub tenant_limit: Option<u32>,
    /// The provider and model rate limits to admit jobs by.
    pub flow: &'a FlowLimits,
}

impl ClaimRequest<'static> {
    /// Up to `limit` jobs under a lease of `lease`, with no bound per tenant and no
    /// rate limits beyond the tenants' own.
    pub fn new(limit: u32, lease: Duration) -> Self {
        Self {
            limit,
            lease,
            tenant_limit: None,
            flow: &NO_LIMITS,
        }
    }
}

/// A due job of a batch being cancelled is not claimed: the cancel closes the batch
/// first and then cancels its items a few hundred at a time, so without this the
/// workers went on starting items it had not reached yet (paid calls the customer
/// had asked to stop). The batches' cancel sweep ends them. Nor is an item of a
/// PROVIDER_BATCH batch: it goes out through its provider's batch API, at the batch
/// price its hold was taken at (`jobs::provider_batches`).
const NOT_HELD_BY_ITS_BATCH: &str = "(jobs.batch_id IS NULL OR NOT EXISTS (
    SELECT 1 FROM batches WHERE batches.id = jobs.batch_id
      AND (batches.cancel_requested OR batches.mode = 'provider_batch')))";

/// What a claim took, and what kept due jobs queued.
#[derive(Debug, Default)]
pub struct Claimed {
    pub claims: Vec<Claim>,
    /// Each budget that kept due jobs waiting, once per claim.
    pub deferred: HashSet<Deferral>,
}

/// The tenant a worker's previous claim visited last; the next claim starts after it.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct TenantCursor(Option<Uuid>);

/// Claims up to `limit` due queued jobs, each with a fresh run token and a lease,
/// visiting tenants from the first (see [`claim_in_turn`]).
pub async fn claim(
    db: &DatabaseConnection,
    request: ClaimRequest<'_>,
) -> Result<Vec<Claim>, DbErr> {
    Ok(claim_in_turn(db, request, &mut TenantCursor::default())
        .await?
        .claims)
}

/// Claims up to `limit` due queued jobs, visiting tenants after `cursor` (wrapping
/// round) in turns of at most `limit` tenants until the claim is full or every tenant
/// with queued jobs was visited once; `cursor` then names the last tenant visited.
///
/// On PostgreSQL row locks last only the claim's statements (`FOR UPDATE SKIP
/// LOCKED`, so concurrent claims never take the same job; buckets are locked in key
/// order); on SQLite the claim is one IMMEDIATE transaction.
pub async fn claim_in_turn(
    db: &DatabaseConnection,
    request: ClaimRequest<'_>,
    cursor: &mut TenantCursor,
) -> Result<Claimed, DbErr> {
    let mut claimed = Claimed::default();
    if request.limit == 0 {
        return Ok(claimed);
    }
    let now = Timestamp::now();
    let round = Round::at(now, request);
    let turn_size = u64::from(request.limit);
    // SQLite has no row locks: the IMMEDIATE transaction holds the database's write
    // lock from the first read, so no other claim can interleave.
    let sqlite = match db.get_database_backend() {
        DbBackend::Postgres => None,
        _ => Some(begin_write(db).await?),
    };
    let started_after = cursor.0;
    let mut after = started_after;
    let mut wrapped = false;
    let mut jobs: Vec<jobs::Model> = Vec::new();
    let mut tenant_rates: HashMap<Uuid, RateLimit> = HashMap::new();
    while jobs.len() < request.limit as usize {
        // After wrapping round, visit only up to where this claim began.
        let until = if wrapped { started_after } else { None };
        let visits = match &sqlite {
            Some(transaction) => visit::visit(transaction, after, until, turn_size).await?,
            None => visit::visit(db, after, until, turn_size).await?,
        };
        let visited_tenants = visit::tenants(&visits);
        tenant_rates.extend(
            visits
                .iter()
                .map(|visit| (visit.tenant_id, visit.tenant_rate())),
        );
        if let Some(last) = visits.last() {
            cursor.0 = Some(last.tenant_id);
            let wanted = request.limit as usize - jobs.len();
            let mut open = Vec::with_capacity(visits.len());
            for visit in visits {
                match visit.pause(now) {
                    Some(deferral) => {
                        claimed.deferred.insert(deferral);
                    }
                    None => open.push(visit),
                }
            }
            // Without a bucket to count against, nothing limits these groups.
            let budgets = budgets(&open, &round);
            let taken = match (&sqlite, budgets.keys.is_empty()) {
                (Some(transaction), _) => {
                    admit_and_claim(
                        transaction,
                        &open,
                        budgets,
                        wanted,
                        &round,
                        &mut claimed.deferred,
                    )
                    .await?
                }
                (None, true) => postgres::claim_unlimited(db, &open, wanted, &round).await?,
                (None, false) => {
                    // Created outside the transaction: see `create_missing`.
                    crate::jobs::flow::storage::create_missing(db, &budgets.keys, round.now)
                        .await?;
                    let transaction = begin_write(db).await?;
                    let taken = admit_and_claim(
                        &transaction,
                        &open,
                        budgets,
                        wanted,
                        &round,
                        &mut claimed.deferred,
                    )
                    .await?;
                    transaction.commit().await?;
                    taken
                }
            };
            jobs.extend(taken);
        }
        if visited_tenants as u64 == turn_size {
            after = cursor.0;
        } else if !wrapped && started_after.is_some() {
            wrapped = true;
            after = None;
        } else {
            break;
        }
    }
    if let Some(transaction) = sqlite {
        transaction.commit().await?;
    }
    claimed.claims = jobs
        .into_iter()
        .filter_map(|job| {
            let run_token = job.run_token?;
            Some(Claim {
                tenant_rate: tenant_rates
                    .get(&job.tenant_id)
                    .copied()
                    .unwrap_or_default(),
                job,
                run_token,
            })
        })
        .collect();
    Ok(claimed)
}

/// The instant and bounds one claim works with.
struct Round<'a> {
    now: Timestamp,
    lease_until: Timestamp,
    request: ClaimRequest<'a>,
}

impl<'a> Round<'a> {
    /// The lease in microseconds, for PostgreSQL, where it runs from the server's
    /// clock (`db::POSTGRES_CLOCK`) rather than from `now`.
    fn lease_micros(&self) -> i64 {
        i64::try_from(self.request.lease.as_micros()).unwrap_or(i64::MAX / 2)
    }

    fn at(now: Timestamp, request: ClaimRequest<'a>) -> Self {
        Self {
            now,
            lease_until: now
                .plus(chrono::Duration::from_std(request.lease).unwrap_or(chrono::Duration::MAX)),
            request,
        }
    }
}

/// A due queued job, as the claim ranks and weighs it.
#[derive(Clone, Debug, FromQueryResult)]
struct Candidate {
    id: Uuid,
    tenant_id: Uuid,
    model: String,
    priority: i32,
    next_run_at: i64,
    token_bound: Option<i64>,
}

/// Ranks each tenant's candidates by priority, then age, and orders them rank by rank
/// across tenants (the oldest first within a rank), keeping `wanted` ranks at most.
fn rank(mut candidates: Vec<Candidate>, wanted: usize) -> Vec<Candidate> {
    candidates.sort_by(|a, b| {
        (
            a.tenant_id,
            std::cmp::Reverse(a.priority),
            a.next_run_at,
            a.id,
        )
            .cmp(&(
                b.tenant_id,
                std::cmp::Reverse(b.priority),
                b.next_run_at,
                b.id,
            ))
    });
    let mut ranked: Vec<(usize, Candidate)> = Vec::with_capacity(candidates.len());
    let mut previous: Option<Uuid> = None;
    let mut rank = 0;
    for candidate in candidates {
        rank = if previous == Some(candidate.tenant_id) {
            rank + 1
        } else {
            1
        };
        previous = Some(candidate.tenant_id);
        if rank <= wanted {
            ranked.push((rank, candidate));
        }
    }
    ranked.sort_by(|(rank_a, a), (rank_b, b)| {
        (rank_a, a.next_run_at, a.id).cmp(&(rank_b, b.next_run_at, b.id))
    });
    ranked.into_iter().map(|(_, candidate)| candidate).collect()
}

/// `ranked` with the tenants of each rank in a random order. Oldest first would give
/// a budget that admits one job a claim to the same tenant every time (its jobs are
/// older than a newcomer's); a random turn shares it evenly, with no state to keep
/// across processes.
fn shuffle_within_ranks(ranked: Vec<Candidate>) -> Vec<Candidate> {
    let mut seen: HashMap<Uuid, u32> = HashMap::new();
    let mut keyed: Vec<(u32, u64, Candidate)> = ranked
        .into_iter()
        .map(|candidate| {
            let rank = seen.entry(candidate.tenant_id).or_default();
            *rank += 1;
            (*rank, rand::random::<u64>(), candidate)
        })
        .collect();
    keyed.sort_by_key(|(rank, draw, _)| (*rank, *draw));
    keyed
        .into_iter()
        .map(|(_, _, candidate)| candidate)
        .collect()
}

/// What the visited groups count against.
struct Budgets<'v> {
    /// Each group's model, with its ramp after a pause if it is ramping back up.
    models: Vec<(&'v str, Option<NonZeroU32>)>,
    /// The visited tenants with their own limits.
    tenants: Vec<(Uuid, RateLimit)>,
    /// Every bucket the models and tenants count against, sorted and distinct.
    keys: Vec<BucketKey>,
}

/// The budgets `visits` count against. Ramps are read at the claim's first instant,
/// so that the buckets locked are the buckets admission counts.
fn budgets<'v>(visits: &'v [Visit], round: &Round<'_>) -> Budgets<'v> {
    let request = &round.request;
    let mut tenants: Vec<(Uuid, RateLimit)> = Vec::new();
    for visit in visits {
        if tenants.last().map(|(tenant, _)| *tenant) != Some(visit.tenant_id) {
            tenants.push((visit.tenant_id, visit.tenant_rate()));
        }
    }
    let models: Vec<(&str, Option<NonZeroU32>)> = visits
        .iter()
        .map(|visit| (visit.model.as_str(), visit.ramp(round.now)))
        .collect();
    let mut keys: Vec<_> = models
        .iter()
        .flat_map(|(model, ramp)| request.flow.ramping_buckets_of(model, *ramp))
        .map(|(key, _)| key)
        .chain(
            tenants
                .iter()
                // A bound on running jobs is counted under the tenant's bucket lock,
                // so two claims cannot both fill the tenant's last slot.
                .filter(|(_, rate)| rate.is_limited() || request.tenant_limit.is_some())
                .map(|(tenant, _)| BucketKey::tenant(*tenant)),
        )
        .collect();
    keys.sort();
    keys.dedup();
    Budgets {
        models,
        tenants,
        keys,
    }
}

/// The claim with the `budgets` of `visits`, in the caller's transaction: locks the
/// buckets, passes over groups nothing can be admitted from, reads the other groups'
/// due jobs, admits them in rank order while every budget allows, writes back what
/// was taken and claims what was admitted.
async fn admit_and_claim(
    transaction: &impl ConnectionTrait,
    visits: &[Visit],
    budgets: Budgets<'_>,
    wanted: usize,
    round: &Round<'_>,
    deferred: &mut HashSet<Deferral>,
) -> Result<Vec<jobs::Model>, DbErr> {
    let request = &round.request;
    let Budgets {
        models,
        tenants,
        keys,
    } = budgets;
    let rows = crate::jobs::flow::storage::lock(transaction, &keys, round.now).await?;
    let busy: Vec<BucketKey> = keys
        .into_iter()
        .filter(|key| {
            !rows
                .iter()
                .any(|row| row.scope == key.scope && row.key == key.key)
        })
        .collect();
    // Budgets refill and leases run from when the buckets were ours, not from before.
    let round = &Round::at(Timestamp::now().max(round.now), round.request);
    let running = match request.tenant_limit {
        Some(_) => running_jobs(transaction, &tenants).await?,
        None => HashMap::new(),
    };
    let mut admission = Admission::new(
        request.flow,
        models,
        &tenants,
        &rows,
        &busy,
        request.tenant_limit,
        &running,
        round.now,
    );
    let open: Vec<&Visit> = visits
        .iter()
        .filter(|visit| {
            match admission
                .tenant_blocked(visit.tenant_id)
                .or_else(|| admission.model_blocked(&visit.model))
            {
                Some(deferral) => {
                    deferred.insert(deferral);
                    false
                }
                None => true,
            }
        })
        .collect();
    if open.is_empty() {
        return Ok(Vec::new());
    }
    let candidates = match transaction.get_database_backend() {
        DbBackend::Postgres => postgres::due_jobs(transaction, &open, wanted, round).await?,
        _ => sqlite::due_jobs(transaction, &open, wanted, round).await?,
    };
    let mut admitted = Vec::with_capacity(wanted);
    for candidate in shuffle_within_ranks(rank(candidates, wanted)) {
        if admitted.len() == wanted {
            break;
        }
        let weighed = Weighed {
            tenant_id: candidate.tenant_id,
            model: &candidate.model,
            tokens: candidate
                .token_bound
                .and_then(|bound| u64::try_from(bound).ok())
                .unwrap_or(0),
        };
        match admission.admit(&weighed) {
            Ok(()) => admitted.push(candidate.id),
            Err(deferral) => {
                deferred.insert(deferral);
            }
        }
    }
    crate::jobs::flow::storage::store(transaction, &admission.taken()).await?;
    match transaction.get_database_backend() {
        DbBackend::Postgres => postgres::claim_admitted(transaction, &admitted, round).await,
        _ => sqlite::claim_admitted(transaction, &admitted, round).await,
    }
}

/// How many jobs each tenant runs now.
async fn running_jobs(
    db: &impl ConnectionTrait,
    tenants: &[(Uuid, RateLimit)],
) -> Result<HashMap<Uuid, u32>, DbErr> {
    let rows: Vec<(Uuid, i64)> = jobs::Entity::find()
        .select_only()
        .column(jobs::Column::TenantId)
        .column_as(jobs::Column::Id.count(), "running")
        .filter(jobs::Column::Status.eq(JobStatus::Running))
        .filter(jobs::Column::TenantId.is_in(tenants.iter().map(|(tenant, _)| *tenant)))
        .group_by(jobs::Column::TenantId)
        .into_tuple()
        .all(db)
        .await?;
    Ok(rows
        .into_iter()
        .map(|(tenant, running)| (tenant, u32::try_from(running).unwrap_or(u32::MAX)))
        .collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn candidate(tenant: u128, priority: i32, next_run_at: i64, id: u128) -> Candidate {
        Candidate {
            id: Uuid::from_u128(id),
            tenant_id: Uuid::from_u128(tenant),
            model: "m".into(),
            priority,
            next_run_at,
            token_bound: None,
        }
    }

    #[test]
    fn ranks_by_priority_within_a_tenant_and_takes_turns_across_tenants() {
        let ranked = rank(
            vec![
                candidate(1, 5, 10, 1),
                candidate(1, 9, 30, 2),
                candidate(1, 5, 5, 3),
                candidate(2, 0, 20, 4),
                candidate(2, 0, 40, 5),
            ],
            2,
        );
        let ids: Vec<u128> = ranked.iter().map(|c| c.id.as_u128()).collect();
        // Rank 1: tenant 1's priority 9 (due 30) and tenant 2's oldest (due 20), the
        // older first; rank 2: tenant 1's oldest priority 5 and tenant 2's next.
        assert_eq!(ids, [4, 2, 3, 5]);
    }

    #[test]
    fn a_limited_claim_keeps_each_tenants_order_and_gives_every_tenant_first_turns() {
        let ranked = rank(
            vec![
                candidate(1, 5, 10, 1),
                candidate(1, 5, 20, 2),
                candidate(2, 5, 30, 3),
                candidate(2, 5, 40, 4),
            ],
            2,
        );
        let mut first_turns = std::collections::BTreeMap::new();
        for _ in 0..200 {
            let ids: Vec<u128> = shuffle_within_ranks(ranked.clone())
                .iter()
                .map(|c| c.id.as_u128())
                .collect();
            // Rank by rank, each tenant's jobs in its own order.
            assert!(ids[..2].contains(&1) && ids[..2].contains(&3), "{ids:?}");
            assert!(ids[2..].contains(&2) && ids[2..].contains(&4), "{ids:?}");
            *first_turns.entry(ids[0]).or_insert(0) += 1;
        }
        // Oldest first would give tenant 1 every first turn.
        assert_eq!(first_turns.len(), 2, "{first_turns:?}");
    }
}
