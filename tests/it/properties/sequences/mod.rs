//! Random sequences of operations against a reference model, on SQLite: after every
//! step the rows are compared with the model and the full audit runs.

mod check;
mod steps;

use super::{AttemptCost, Finish, Spec, model_prices, new_tenant, prepared_database};
use crate::helpers::Backend;
use entity::{JobStatus, attempts};
use jobledger::billing::ModelPrice;
use jobledger::bus::EventBus;
use jobledger::jobs::budget::FREE_HAND_BACKS;
use jobledger::jobs::queue::Claim;
use proptest::prelude::*;
use sea_orm::DatabaseConnection;
use std::collections::HashMap;
use uuid::Uuid;

/// One step of a sequence. `pick` chooses among the eligible jobs or claims (modulo
/// their number); a step with nothing eligible does nothing.
#[derive(Clone, Debug)]
enum Op {
    /// A grant under key `key`; with `same`, a repeated key reuses the first amount.
    Grant {
        tenant: usize,
        nanos: i64,
        key: u8,
        same: bool,
    },
    /// A create under key `key` (keys repeat, so some are replays or conflicts).
    Create {
        tenant: usize,
        key: u8,
        spec: Spec,
    },
    /// An existing job's key again, with the same request or a changed one.
    Replay {
        pick: usize,
        same: bool,
    },
    Claim {
        limit: u32,
    },
    Start {
        pick: usize,
    },
    Finish {
        pick: usize,
        how: Finish,
    },
    /// `cancelJob` on any job: queued ones end at once, running ones get the request.
    Cancel {
        pick: usize,
    },
    /// A running job's lease passes and `expire_leases` takes it back.
    Expire {
        pick: usize,
    },
    /// A claim that lost its job (expired, or already finished) tries to write.
    StaleFinish {
        pick: usize,
        how: Finish,
    },
    /// The ledger is asked to settle or release an ended job's hold again.
    ResolveAgain {
        pick: usize,
        settle: bool,
        nanos: i64,
    },
}

fn spec_strategy() -> impl Strategy<Value = Spec> {
    // Mostly the cheaper model, so that balances admit a fair number of jobs.
    let model = prop_oneof![3 => Just(0usize), 1 => Just(1usize)];
    (model, 1..=4_000u32, 1..=60usize, 1..=3u32, any::<bool>()).prop_map(
        |(model, max_output, content_chars, max_attempts, retry_unknown)| Spec {
            model,
            max_output,
            content_chars,
            max_attempts,
            retry_unknown,
        },
    )
}

fn finish_strategy() -> impl Strategy<Value = Finish> {
    prop_oneof![
        // Up to twice what a hold covers, so the cap at the hold is exercised.
        4 => (0..=200u64, 0..=100u64, 0..=18_000u64).prop_map(|(input, cached, output)| {
            Finish::Succeed { input, cached, output }
        }),
        2 => any::<bool>().prop_map(|billed| Finish::Fail { billed }),
        2 => Just(Finish::Cancel),
        2 => any::<bool>().prop_map(|unknown| Finish::Retry { unknown }),
        1 => Just(Finish::HandBack),
    ]
}

fn op_strategy() -> impl Strategy<Value = Op> {
    prop_oneof![
        2 => (0..3usize, 1..=120_000_000i64, 0..4u8, any::<bool>())
            .prop_map(|(tenant, nanos, key, same)| Op::Grant { tenant, nanos, key, same }),
        5 => (0..3usize, 0..12u8, spec_strategy())
            .prop_map(|(tenant, key, spec)| Op::Create { tenant, key, spec }),
        1 => (0..64usize, any::<bool>()).prop_map(|(pick, same)| Op::Replay { pick, same }),
        3 => (1..=3u32).prop_map(|limit| Op::Claim { limit }),
        3 => (0..64usize).prop_map(|pick| Op::Start { pick }),
        4 => (0..64usize, finish_strategy()).prop_map(|(pick, how)| Op::Finish { pick, how }),
        1 => (0..64usize).prop_map(|pick| Op::Cancel { pick }),
        2 => (0..64usize).prop_map(|pick| Op::Expire { pick }),
        2 => (0..64usize, finish_strategy())
            .prop_map(|(pick, how)| Op::StaleFinish { pick, how }),
        1 => (0..64usize, any::<bool>(), 0..=10_000_000i64)
            .prop_map(|(pick, settle, nanos)| Op::ResolveAgain { pick, settle, nanos }),
    ]
}

/// 24 cases unless `PROPTEST_CASES` says otherwise; no regression files are written
/// (the failing sequence is printed, shrunk).
fn property_config() -> ProptestConfig {
    let cases = std::env::var("PROPTEST_CASES")
        .ok()
        .and_then(|cases| cases.parse().ok())
        .unwrap_or(24);
    ProptestConfig {
        cases,
        failure_persistence: None,
        max_shrink_time: 180_000,
        ..ProptestConfig::default()
    }
}

proptest! {
    #![proptest_config(property_config())]

    #[test]
    fn random_operations_keep_the_books_on_sqlite(
        initial in proptest::collection::vec(0..=300_000_000i64, 2..=3),
        ops in proptest::collection::vec(op_strategy(), 1..=40),
    ) {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        runtime.block_on(run_sequence(initial, ops));
    }
}

#[derive(Debug)]
struct ModelTenant {
    id: Uuid,
    granted: i64,
    held: i64,
    charged: i64,
    /// Grant key → (amount, grant id).
    grants: HashMap<u8, (i64, Uuid)>,
    /// Job key → index into the model's jobs.
    keys: HashMap<u8, usize>,
}

#[derive(Debug)]
struct ModelJob {
    id: Uuid,
    tenant: usize,
    key: u8,
    spec: Spec,
    hold: i64,
    status: JobStatus,
    cancel_requested: bool,
    attempt_count: i32,
    /// The live claim and, once started, its attempt.
    claim: Option<(Claim, Option<attempts::Model>)>,
    /// The charge after the cap, once succeeded.
    charged: Option<i64>,
    /// Every attempt row in order: outcome and exact cost (`None`: the bound stands).
    attempts: Vec<AttemptCost>,
    /// Calls aborted at shutdown and handed back (or, cancelled meanwhile, ended).
    hand_backs: usize,
}

/// Whether the attempt's start saw a cancel: its row was recorded as a call never made.
fn started_after_a_cancel(attempt: &attempts::Model) -> bool {
    attempt.provider_cost_nanos == Some(0) && attempt.provider_cost_upper_bound_nanos.is_none()
}

impl ModelJob {
    /// Whether the job may pay for another call: fewer paid calls than maxAttempts,
    /// where the first few hand-backs do not count.
    fn calls_left(&self) -> bool {
        let paid = self.attempts.iter().filter(|attempt| attempt.paid).count();
        let free = self.hand_backs.min(FREE_HAND_BACKS as usize);
        paid - free < self.spec.max_attempts as usize
    }
}

/// The reference model and the database it describes.
struct Sequence {
    db: DatabaseConnection,
    bus: EventBus,
    price_list: Vec<ModelPrice>,
    tenants: Vec<ModelTenant>,
    jobs: Vec<ModelJob>,
    /// Claims that no longer own their job, with their attempt if they started one.
    stale: Vec<(Claim, Option<attempts::Model>)>,
    ledger_entries: u64,
    /// The step being run, for failure messages.
    at: String,
}

/// Runs `ops` for tenants starting with the `initial` balances (in nano-credits).
async fn run_sequence(initial: Vec<i64>, ops: Vec<Op>) {
    let (database, db) = prepared_database(&Backend::Sqlite).await;
    let price_list = model_prices(&db).await;
    let mut tenants = Vec::new();
    for index in 0..initial.len() {
        tenants.push(ModelTenant {
            id: new_tenant(&db, &format!("tenant-{index}")).await,
            granted: 0,
            held: 0,
            charged: 0,
            grants: HashMap::new(),
            keys: HashMap::new(),
        });
    }
    let mut sequence = Sequence {
        db,
        bus: EventBus::default(),
        price_list,
        tenants,
        jobs: Vec::new(),
        stale: Vec::new(),
        ledger_entries: 0,
        at: "setup".into(),
    };
    for (index, nanos) in initial.into_iter().enumerate() {
        if nanos > 0 {
            sequence.grant(index, nanos, u8::MAX, false).await;
        }
    }
    sequence.check().await;
    for (index, op) in ops.into_iter().enumerate() {
        sequence.at = format!("step {index}: {op:?}");
        sequence.apply(op).await;
        sequence.check().await;
    }
    sequence.db.close().await.unwrap();
    drop(database);
}
