//! The same operations, concurrently, on PostgreSQL: tasks run them at once, a
//! snapshot audit runs beside them, and at barriers the books are compared with what
//! the tasks saw (`PROPERTY_SEED` repeats a run's operations; the seed is printed on
//! failure).

mod books;
mod task;

use super::{Effect, Spec, grant, let_lease_pass, model_prices, new_tenant, prepared_database};
use crate::helpers::Backend;
use books::check_books;
use entity::{JobStatus, attempts, jobs};
use jobledger::billing::{Credits, ModelPrice, audit};
use jobledger::bus::EventBus;
use jobledger::jobs::queue::{self, Claim};
use jobledger::jobs::service;
use rand::SeedableRng;
use rand::rngs::StdRng;
use sea_orm::{ColumnTrait, DatabaseConnection, EntityTrait, QueryFilter};
use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use uuid::Uuid;

const TASKS: usize = 4;
const PHASES: usize = 4;
const STEPS_PER_PHASE: usize = 50;
const CONCURRENT_TENANTS: usize = 3;
/// Idempotency keys per tenant: few enough that tasks collide on them.
const CONCURRENT_KEYS: u32 = 40;

/// The request behind (tenant, key, variant): the same key and variant is always the
/// same request, another variant a conflicting one.
fn concurrent_spec(tenant: usize, key: u32, variant: u32) -> Spec {
    let n = tenant as u32 * 31 + key * 7;
    Spec {
        model: (n % 2) as usize,
        max_output: 200 + (n * 97) % 4_000 + variant,
        content_chars: 1 + (n % 40) as usize,
        max_attempts: 1 + n % 3,
        retry_unknown: !n.is_multiple_of(5),
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum CreateOutcome {
    Fresh(Uuid),
    Replayed(Uuid),
    Conflict,
    Insufficient,
}

#[derive(Clone, Copy, Debug)]
struct CreateRecord {
    tenant: usize,
    key: u32,
    variant: u32,
    outcome: CreateOutcome,
}

/// What the tasks saw, to compare with the rows at each barrier.
#[derive(Default)]
struct Seen {
    granted: HashMap<Uuid, i64>,
    creates: Vec<CreateRecord>,
    /// Every job a create made fresh: its tenant and the hold computed by the test.
    holds: HashMap<Uuid, (Uuid, i64)>,
    /// Terminal finishes that returned `Some`: job, effect.
    finishes: Vec<(Uuid, Effect)>,
    /// Run tokens whose lease a task made pass: only these may lose their job.
    forced: HashSet<Uuid>,
    claimed: HashSet<Uuid>,
    /// Claims that lost their job to a forced lease, and stale claims that tried to write.
    lost: usize,
    stale_tries: usize,
}

struct Env {
    db: DatabaseConnection,
    bus: EventBus,
    price_list: Vec<ModelPrice>,
    tenants: Vec<Uuid>,
    seen: Mutex<Seen>,
}

#[derive(Clone)]
struct Held {
    claim: Claim,
    attempt: Option<attempts::Model>,
}

struct Task {
    index: usize,
    rng: StdRng,
    held: Vec<Held>,
    /// Claims known to have lost their job.
    stale: Vec<Held>,
    ops: usize,
}

/// The seed of the concurrent run: `PROPERTY_SEED` or a random one.
fn property_seed() -> u64 {
    std::env::var("PROPERTY_SEED")
        .ok()
        .and_then(|seed| seed.parse().ok())
        .unwrap_or_else(rand::random)
}

/// Prints the seed when the test fails, so the run can be repeated.
struct SeedReport(u64);

impl Drop for SeedReport {
    fn drop(&mut self) {
        if std::thread::panicking() {
            use std::io::Write;
            let _ = writeln!(
                std::io::stderr(),
                "\n*** concurrent property failed with PROPERTY_SEED={} ***\n",
                self.0
            );
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_random_operations_keep_the_books_on_postgres() {
    let Some(backend) = Backend::postgres() else {
        return;
    };
    let seed = property_seed();
    let _report = SeedReport(seed);
    let started = Instant::now();
    let (database, db) = prepared_database(&backend).await;
    let mut seen = Seen::default();
    let mut tenant_ids = Vec::new();
    for index in 0..CONCURRENT_TENANTS {
        let id = new_tenant(&db, &format!("tenant-{index}")).await;
        // Tight enough that some creates are refused.
        let nanos = 60_000_000 + 12_345_679 * index as i64;
        grant(&db, id, Credits::from_nanos(nanos), "initial".into())
            .await
            .unwrap();
        seen.granted.insert(id, nanos);
        tenant_ids.push(id);
    }
    let env = Arc::new(Env {
        price_list: model_prices(&db).await,
        db,
        bus: EventBus::default(),
        tenants: tenant_ids,
        seen: Mutex::new(seen),
    });
    let mut tasks: Vec<Task> = (0..TASKS)
        .map(|index| Task {
            index,
            rng: StdRng::seed_from_u64(seed ^ (index as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15)),
            held: Vec::new(),
            stale: Vec::new(),
            ops: 0,
        })
        .collect();
    let mut audits = 0;
    for phase in 0..PHASES {
        // A snapshot audit beside the tasks: a consistent view is clean at any moment.
        let stop = Arc::new(AtomicBool::new(false));
        let auditor = tokio::spawn({
            let db = env.db.clone();
            let stop = stop.clone();
            async move {
                let mut runs = 0;
                while !stop.load(Ordering::Relaxed) {
                    let report = audit::audit_snapshot(&db).await.unwrap();
                    assert!(report.is_clean(), "a snapshot audit mid-run:\n{report}");
                    runs += 1;
                    tokio::time::sleep(Duration::from_millis(10)).await;
                }
                runs
            }
        });
        let handles: Vec<_> = tasks
            .into_iter()
            .map(|task| tokio::spawn(task.run(env.clone(), STEPS_PER_PHASE)))
            .collect();
        tasks = Vec::new();
        for handle in handles {
            tasks.push(handle.await.expect("a task panicked"));
        }
        stop.store(true, Ordering::Relaxed);
        audits += auditor.await.expect("the snapshot audit failed");
        check_books(&env, &format!("barrier after phase {phase}"), false).await;
    }

    // Drain: cancel what is queued, take back what runs, until every job has ended.
    for _ in 0..20 {
        let open = jobs::Entity::find()
            .filter(jobs::Column::Status.is_in([JobStatus::Queued, JobStatus::Running]))
            .all(&env.db)
            .await
            .unwrap();
        if open.is_empty() {
            break;
        }
        for job in open {
            match (job.status, job.run_token) {
                (JobStatus::Running, Some(run_token)) => {
                    let_lease_pass(&env.db, job.id, run_token).await;
                }
                _ => {
                    service::cancel_job(
                        &env.db,
                        &env.bus,
                        &Default::default(),
                        job.tenant_id,
                        job.id,
                    )
                    .await
                    .unwrap();
                }
            }
        }
        queue::expire_leases(&env.db, &Default::default())
            .await
            .unwrap();
    }
    check_books(&env, "after draining", true).await;

    let ops: usize = tasks.iter().map(|task| task.ops).sum();
    {
        let seen = env.seen.lock().unwrap();
        let count = |kind: fn(&CreateOutcome) -> bool| {
            seen.creates
                .iter()
                .filter(|record| kind(&record.outcome))
                .count()
        };
        eprintln!(
            "seed {seed}: {ops} operations by {TASKS} tasks in {:?}: creates {} fresh, {} replayed, \
         {} conflicting, {} refused; {} terminal finishes; {} forced leases, {} claims lost to \
         them; {} stale write attempts; {audits} snapshot audits",
            started.elapsed(),
            count(|outcome| matches!(outcome, CreateOutcome::Fresh(_))),
            count(|outcome| matches!(outcome, CreateOutcome::Replayed(_))),
            count(|outcome| matches!(outcome, CreateOutcome::Conflict)),
            count(|outcome| matches!(outcome, CreateOutcome::Insufficient)),
            seen.finishes.len(),
            seen.forced.len(),
            seen.lost,
            seen.stale_tries,
        );
    }
    env.db.clone().close().await.unwrap();
    drop(database);
}
