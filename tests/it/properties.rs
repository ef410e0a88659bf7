//! The billing properties of issue 5, checked by random operations:
//!
//! - On SQLite, proptest draws sequences of grant / create (fresh, replayed, conflicting,
//!   unaffordable) / claim / start / succeed / fail / cancel / retry / hand back / lease
//!   expiry / stale finish / resolving an ended job's hold again, runs them through the
//!   services against a fresh database, and after every step compares the rows with a
//!   reference model kept here and runs the full audit.
//! - On PostgreSQL, tasks run the same kinds of operations at once; a snapshot audit
//!   runs beside them, and at barriers the books are compared with what the tasks saw
//!   (`PROPERTY_SEED` repeats a run's operations; the seed is printed on failure).
//! - On both backends, concurrent createJob calls against a balance that fits exactly K
//!   holds admit exactly K, to the nano-credit; and rivals racing to release one hold
//!   release it once.

use crate::helpers::{
    AppOptions, Backend, TestDatabase, decimal, error_code, simulated_models, spawn_app_with,
};
use crate::invariants::assert_billing_invariants;
use entity::{
    AttemptOutcome, JobStatus, LedgerEntryKind, ReservationStatus, Timestamp, attempts, charges,
    credit_reservations, job_events, jobs, ledger_entries, tenants,
};
use jobledger::billing::ledger::{self, Balance};
use jobledger::billing::{Credits, ModelPrice, audit, prices};
use jobledger::db::begin_write;
use jobledger::error::ServiceError;
use jobledger::jobs::EventBus;
use jobledger::jobs::budget::may_have_been_billed;
use jobledger::jobs::input::{JobInput, JobRequest, NewJob};
use jobledger::jobs::queue::{
    self, AttemptReport, AttemptStart, Claim, ClaimRequest, ErrorCode, JobError, JobOutcome,
    Renewal,
};
use jobledger::jobs::service;
use jobledger::llm::TokenUsage;
use proptest::prelude::*;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use rust_decimal::Decimal;
use sea_orm::sea_query::Expr;
use sea_orm::{
    ColumnTrait, DatabaseConnection, EntityTrait, PaginatorTrait, QueryFilter, QueryOrder,
    QuerySelect,
};
use serde_json::json;
use std::collections::{HashMap, HashSet};
use std::str::FromStr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use uuid::Uuid;

on_both_backends!(
    concurrent_creates_never_admit_more_than_the_balance_holds,
    racing_releases_of_one_hold_resolve_it_once,
);

/// Long enough that no lease passes unless a test makes it.
const LEASE: Duration = Duration::from_secs(600);
/// The models jobs use: two price levels with odd nano-credit rates.
const MODELS: [&str; 2] = ["gpt-4o-mini", "gpt-4o"];
/// Tokens the README adds per message to the UTF-8 bytes of its content.
const MESSAGE_OVERHEAD_TOKENS: u64 = 16;

// ---------------------------------------------------------------------------------
// Shared by the SQLite and PostgreSQL properties
// ---------------------------------------------------------------------------------

/// A fresh database with the schema and the built-in prices (markup 1.25).
async fn prepared_database(backend: &Backend) -> (TestDatabase, DatabaseConnection) {
    let database = TestDatabase::create(backend).await;
    let db = jobledger::db::connect(&database.url)
        .await
        .expect("the test database opens");
    jobledger::db::migrate(&db).await.expect("migrations apply");
    let markup = Decimal::from_str(prices::DEFAULT_CUSTOMER_MARKUP).unwrap();
    prices::sync_prices(&db, &prices::built_in_prices(markup))
        .await
        .expect("prices are stored");
    (database, db)
}

/// The stored price of each of [`MODELS`], in that order.
async fn model_prices(db: &DatabaseConnection) -> Vec<ModelPrice> {
    let mut found = Vec::new();
    for model in MODELS {
        found.push(
            prices::price_at(db, model, Timestamp::now())
                .await
                .unwrap()
                .unwrap_or_else(|| panic!("{model} has a price")),
        );
    }
    found
}

async fn new_tenant(db: &DatabaseConnection, name: &str) -> Uuid {
    jobledger::accounts::tenants::create_tenant(db, name)
        .await
        .expect("a tenant is created")
        .0
        .id
}

/// A grant in its own transaction, as the `grantCredits` mutation makes it.
async fn grant(
    db: &DatabaseConnection,
    tenant_id: Uuid,
    amount: Credits,
    key: String,
) -> Result<entity::credit_grants::Model, ServiceError> {
    let transaction = begin_write(db).await?;
    let granted = ledger::grant(
        &transaction,
        ledger::NewGrant {
            tenant_id,
            amount,
            idempotency_key: key,
            reason: None,
        },
    )
    .await?;
    transaction.commit().await?;
    Ok(granted)
}

/// What a job asks for; every field goes into the request's fingerprint.
#[derive(Clone, Debug, PartialEq, Eq)]
struct Spec {
    /// Index into [`MODELS`].
    model: usize,
    max_output: u32,
    /// Characters of content; every third one takes two UTF-8 bytes.
    content_chars: usize,
    max_attempts: u32,
    retry_unknown: bool,
}

impl Spec {
    fn content(&self) -> String {
        (0..self.content_chars)
            .map(|index| if index % 3 == 0 { 'é' } else { 'x' })
            .collect()
    }

    fn new_job(&self, key: &str) -> NewJob {
        NewJob::parse(JobRequest {
            idempotency_key: key.to_owned(),
            model: MODELS[self.model].to_owned(),
            messages: vec![("user".to_owned(), self.content())],
            max_output_tokens: i32::try_from(self.max_output).unwrap(),
            response_schema: None,
            max_attempts: Some(i32::try_from(self.max_attempts).unwrap()),
            retry_unknown_outcome: Some(self.retry_unknown),
            metadata: None,
            stream_output: None,
            priority: None,
            run_at: None,
        })
        .expect("the generated request is valid")
    }

    /// The hold by the README's sizing rule, computed here rather than by the service:
    /// maxAttempts × the higher of the customer and the provider price ×
    /// (UTF-8 bytes + 16 per message + maxOutputTokens).
    fn hold(&self, price: &ModelPrice) -> Credits {
        let usage = TokenUsage {
            input_tokens: self.content().len() as u64 + MESSAGE_OVERHEAD_TOKENS,
            cached_input_tokens: 0,
            output_tokens: u64::from(self.max_output),
        };
        let per_call = price
            .customer_charge(&usage)
            .max(price.provider_cost(&usage));
        Credits::from_nanos(per_call.nanos() * i64::from(self.max_attempts))
    }

    /// Another request under the same key: a conflict, never a replay.
    fn changed(&self) -> Self {
        Self {
            max_output: if self.max_output < 4_000 {
                self.max_output + 1
            } else {
                self.max_output - 1
            },
            ..self.clone()
        }
    }
}

/// The attempt's start as a worker records it: the stored price and the cost bound.
/// Under the default charging policy a lost call charges the customer nothing (it
/// streamed nothing).
fn attempt_start(price: &ModelPrice, job: &jobs::Model) -> AttemptStart {
    let input: JobInput = serde_json::from_value(job.input.0.clone()).unwrap();
    let bound = input.call_bound();
    AttemptStart {
        worker_id: "property-test".into(),
        provider: Some("simulator".into()),
        provider_cost_bound: bound.provider_cost(price),
        customer_charge_bound: bound.customer_cost(price),
        customer_charge_if_lost: Credits::ZERO,
        price: price.clone(),
    }
}

fn price_of<'a>(price_list: &'a [ModelPrice], job: &jobs::Model) -> &'a ModelPrice {
    price_list
        .iter()
        .find(|price| price.model == job.model)
        .expect("jobs use a priced model")
}

/// How a test ends an attempt.
#[derive(Clone, Copy, Debug)]
enum Finish {
    /// The provider answered with this usage (which may exceed what the hold covers).
    Succeed {
        input: u64,
        cached: u64,
        output: u64,
    },
    /// A permanent error, billed by the provider or not.
    Fail { billed: bool },
    /// The tenant cancels the running job and the worker finishes the attempt cancelled.
    Cancel,
    /// A retryable error (not billed) or an unknown outcome; fails when no attempt is left.
    Retry { unknown: bool },
    /// The worker shuts down and hands the job back.
    HandBack,
    /// The attempt started after a cancel: the worker makes no call, whatever else was
    /// drawn for it.
    CancelledBeforeSending,
}

/// What a finish must do to the job and its hold.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Effect {
    /// Succeeded: charge this much (before the cap at the hold), release the rest.
    Settle { charge: Credits },
    /// Failed or cancelled: the whole hold is released.
    Release(JobStatus),
    /// Queued again; a hand-back gives the attempt back.
    Requeue { hand_back: bool },
}

/// The attempt row as a finish leaves it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct AttemptCost {
    outcome: AttemptOutcome,
    exact: Option<i64>,
    /// The call may have been billed: it counts against the job's paid calls.
    paid: bool,
}

impl AttemptCost {
    /// An attempt that has started its call and not ended.
    const RUNNING: Self = Self {
        outcome: AttemptOutcome::Running,
        exact: None,
        paid: true,
    };
}

/// The report and outcome a worker would send for `how`, and what they must cause.
fn plan(
    how: Finish,
    job: &jobs::Model,
    price: &ModelPrice,
) -> (AttemptReport, JobOutcome, Effect, AttemptCost) {
    // Only the accepted answer is charged: nothing streams here, and the default
    // policy charges nothing else.
    let report =
        |outcome, usage: Option<TokenUsage>, not_billed, error: Option<JobError>| AttemptReport {
            outcome,
            usage,
            not_billed,
            customer_charge: match (outcome, usage) {
                (AttemptOutcome::Succeeded, Some(usage)) => price.customer_charge(&usage),
                _ => Credits::ZERO,
            },
            delivered_output_tokens: None,
            error,
            provider_request_id: Some(format!("req-{}", Uuid::new_v4().simple())),
            latency: Duration::from_millis(3),
            model_paused_until: None,
        };
    let cost = |outcome, usage: Option<TokenUsage>, not_billed: bool| AttemptCost {
        outcome,
        exact: match (usage, not_billed) {
            (Some(usage), _) => Some(price.provider_cost(&usage).nanos()),
            (None, true) => Some(0),
            (None, false) => None,
        },
        paid: usage.is_some() || !not_billed,
    };
    let attempts_left = job.attempt_count < job.max_attempts;
    match how {
        Finish::Succeed {
            input,
            cached,
            output,
        } => {
            let usage = TokenUsage {
                input_tokens: input,
                cached_input_tokens: cached,
                output_tokens: output,
            };
            let charge = price.customer_charge(&usage);
            (
                report(AttemptOutcome::Succeeded, Some(usage), false, None),
                JobOutcome::Succeeded {
                    result: json!("done"),
                },
                Effect::Settle { charge },
                cost(AttemptOutcome::Succeeded, Some(usage), false),
            )
        }
        Finish::Fail { billed } => {
            let usage = billed.then_some(TokenUsage {
                input_tokens: 7,
                cached_input_tokens: 0,
                output_tokens: 0,
            });
            let error = JobError::new(ErrorCode::ProviderRejected, "rejected");
            (
                report(
                    AttemptOutcome::PermanentError,
                    usage,
                    !billed,
                    Some(error.clone()),
                ),
                JobOutcome::Failed(error),
                Effect::Release(JobStatus::Failed),
                cost(AttemptOutcome::PermanentError, usage, !billed),
            )
        }
        Finish::Cancel => (
            report(
                AttemptOutcome::Cancelled,
                None,
                false,
                Some(JobError::new(ErrorCode::Cancelled, "cancelled")),
            ),
            JobOutcome::Cancelled,
            Effect::Release(JobStatus::Cancelled),
            cost(AttemptOutcome::Cancelled, None, false),
        ),
        Finish::CancelledBeforeSending => (
            report(
                AttemptOutcome::Cancelled,
                None,
                true,
                Some(JobError::new(ErrorCode::Cancelled, "not sent")),
            ),
            JobOutcome::Cancelled,
            Effect::Release(JobStatus::Cancelled),
            cost(AttemptOutcome::Cancelled, None, true),
        ),
        Finish::Retry { unknown } => {
            let (outcome, code) = if unknown {
                (AttemptOutcome::Unknown, ErrorCode::OutcomeUnknown)
            } else {
                (
                    AttemptOutcome::RetryableError,
                    ErrorCode::ProviderUnavailable,
                )
            };
            let error = JobError::new(code, "try again");
            let report = report(outcome, None, !unknown, Some(error.clone()));
            let cost = cost(outcome, None, !unknown);
            if attempts_left {
                (
                    report,
                    JobOutcome::Retry {
                        at: Timestamp::now(),
                    },
                    Effect::Requeue { hand_back: false },
                    cost,
                )
            } else {
                (
                    report,
                    JobOutcome::Failed(error),
                    Effect::Release(JobStatus::Failed),
                    cost,
                )
            }
        }
        Finish::HandBack => (
            report(
                AttemptOutcome::Unknown,
                None,
                false,
                Some(JobError::new(ErrorCode::WorkerShutdown, "shutting down")),
            ),
            JobOutcome::HandBack,
            Effect::Requeue { hand_back: true },
            cost(AttemptOutcome::Unknown, None, false),
        ),
    }
}

/// Makes the claim's lease lie in the past, as if its worker had frozen. Matches only
/// while the claim owns the job.
async fn let_lease_pass(db: &DatabaseConnection, job_id: Uuid, run_token: Uuid) -> u64 {
    jobs::Entity::update_many()
        .col_expr(
            jobs::Column::LeaseUntil,
            Expr::value(Timestamp::now().plus(chrono::Duration::seconds(-1))),
        )
        .filter(jobs::Column::Id.eq(job_id))
        .filter(jobs::Column::RunToken.eq(run_token))
        .filter(jobs::Column::Status.eq(JobStatus::Running))
        .exec(db)
        .await
        .unwrap()
        .rows_affected
}

// ---------------------------------------------------------------------------------
// 1. Random sequences against a reference model, on SQLite
// ---------------------------------------------------------------------------------

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
}

/// Whether the attempt's start saw a cancel: its row was recorded as a call never made.
fn started_after_a_cancel(attempt: &attempts::Model) -> bool {
    attempt.provider_cost_nanos == Some(0) && attempt.provider_cost_upper_bound_nanos.is_none()
}

impl ModelJob {
    /// Whether the job may pay for another call: fewer paid calls than maxAttempts.
    fn calls_left(&self) -> bool {
        let paid = self.attempts.iter().filter(|attempt| attempt.paid).count();
        paid < self.spec.max_attempts as usize
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

impl Sequence {
    async fn apply(&mut self, op: Op) {
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

    async fn grant(&mut self, tenant: usize, nanos: i64, key: u8, same: bool) {
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

    async fn create(&mut self, tenant: usize, key: u8, spec: Spec) {
        let new = spec.new_job(&format!("job-{key}"));
        let price = &self.price_list[spec.model];
        let hold = spec.hold(price);
        assert_eq!(
            new.input.call_bound().job_hold(price, new.max_attempts),
            hold,
            "{}: the service sizes holds other than the README says",
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
        });
    }

    fn job_index(&self, id: Uuid) -> usize {
        self.jobs
            .iter()
            .position(|job| job.id == id)
            .unwrap_or_else(|| panic!("{}: job {id} is not in the model", self.at))
    }

    async fn claim(&mut self, limit: u32) {
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

    async fn start(&mut self, pick: usize) {
        let eligible: Vec<usize> = (0..self.jobs.len())
            .filter(|&index| matches!(self.jobs[index].claim, Some((_, None))))
            .collect();
        if eligible.is_empty() {
            return;
        }
        self.start_job(eligible[pick % eligible.len()]).await;
    }

    /// Records the attempt of the job's live claim, as a worker does before its call.
    async fn start_job(&mut self, index: usize) {
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
        assert!(
            !started.budget_spent,
            "{}: a job was queued with no paid call left",
            self.at
        );
        job.attempts.push(row);
        job.claim = Some((claim, Some(attempt)));
    }

    /// Finishes a live claim, starting its attempt first if it has none yet.
    async fn finish(&mut self, pick: usize, how: Finish) {
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

    async fn cancel(&mut self, index: usize) {
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

    async fn expire(&mut self, pick: usize) {
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
        let notices = queue::expire_leases(&self.db).await.unwrap();
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

    async fn stale_finish(&mut self, pick: usize, how: Finish) {
        if self.stale.is_empty() {
            return;
        }
        let (claim, attempt) = self.stale[pick % self.stale.len()].clone();
        let before = snapshot(&self.db).await;
        let price = price_of(&self.price_list, &claim.job).clone();
        assert_eq!(
            queue::renew_lease(&self.db, &claim, LEASE).await.unwrap(),
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
    async fn resolve_again(&mut self, pick: usize, settle: bool, nanos: i64) {
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

    /// Every invariant of the audit, then every figure of the model against the rows.
    async fn check(&self) {
        let at = &self.at;
        let db = &self.db;
        assert_billing_invariants(db).await;

        for tenant in &self.tenants {
            let balance = ledger::balance(db, tenant.id).await.unwrap().unwrap();
            let expected = Balance {
                granted: Credits::from_nanos(tenant.granted),
                held: Credits::from_nanos(tenant.held),
                charged: Credits::from_nanos(tenant.charged),
            };
            assert_eq!(balance, expected, "{at}: tenant {} balance", tenant.id);
            assert!(!balance.available().nanos().is_negative(), "{at}");
        }

        let rows = jobs::Entity::find()
            .order_by_asc(jobs::Column::Id)
            .all(db)
            .await
            .unwrap();
        assert_eq!(rows.len(), self.jobs.len(), "{at}: jobs in the database");
        let reservations: HashMap<Uuid, credit_reservations::Model> =
            credit_reservations::Entity::find()
                .all(db)
                .await
                .unwrap()
                .into_iter()
                .map(|reservation| (reservation.job_id, reservation))
                .collect();
        let charge_rows: HashMap<Uuid, charges::Model> = charges::Entity::find()
            .all(db)
            .await
            .unwrap()
            .into_iter()
            .map(|charge| (charge.job_id, charge))
            .collect();
        let mut attempt_rows: HashMap<Uuid, Vec<attempts::Model>> = HashMap::new();
        for attempt in attempts::Entity::find()
            .order_by_asc(attempts::Column::Number)
            .all(db)
            .await
            .unwrap()
        {
            attempt_rows
                .entry(attempt.job_id)
                .or_default()
                .push(attempt);
        }
        for job in &self.jobs {
            let row = rows
                .iter()
                .find(|row| row.id == job.id)
                .unwrap_or_else(|| panic!("{at}: job {} is missing", job.id));
            assert_eq!(row.tenant_id, self.tenants[job.tenant].id, "{at}");
            assert_eq!(row.status, job.status, "{at}: status of job {}", job.id);
            assert_eq!(row.attempt_count, job.attempt_count, "{at}: attempts");
            assert_eq!(row.cancel_requested, job.cancel_requested, "{at}");
            assert_eq!(
                row.run_token,
                job.claim.as_ref().map(|(claim, _)| claim.run_token),
                "{at}: the job's fence"
            );
            let reservation = &reservations[&job.id];
            assert_eq!(reservation.amount_nanos, job.hold, "{at}: hold");
            let (status, settled, released) = match job.status {
                JobStatus::Queued | JobStatus::Running => (ReservationStatus::Held, 0, 0),
                JobStatus::Succeeded => {
                    let charged = job.charged.unwrap();
                    (ReservationStatus::Settled, charged, job.hold - charged)
                }
                JobStatus::Failed | JobStatus::Cancelled => {
                    (ReservationStatus::Released, 0, job.hold)
                }
            };
            assert_eq!(
                (
                    reservation.status,
                    reservation.settled_amount_nanos,
                    reservation.released_amount_nanos
                ),
                (status, settled, released),
                "{at}: reservation of job {}",
                job.id
            );
            assert_eq!(
                charge_rows.get(&job.id).map(|charge| charge.amount_nanos),
                job.charged,
                "{at}: charge of job {}",
                job.id
            );
            let attempts: Vec<AttemptCost> = attempt_rows
                .get(&job.id)
                .map(Vec::as_slice)
                .unwrap_or_default()
                .iter()
                .map(|attempt| AttemptCost {
                    outcome: attempt.outcome,
                    exact: attempt.provider_cost_nanos,
                    paid: may_have_been_billed(attempt),
                })
                .collect();
            assert_eq!(attempts, job.attempts, "{at}: attempts of job {}", job.id);
        }
        assert_eq!(
            charge_rows.len(),
            self.jobs.iter().filter(|job| job.charged.is_some()).count(),
            "{at}"
        );
        assert_eq!(
            ledger_entries::Entity::find().count(db).await.unwrap(),
            self.ledger_entries,
            "{at}: ledger entries"
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

// ---------------------------------------------------------------------------------
// 2. The same operations, concurrently, on PostgreSQL
// ---------------------------------------------------------------------------------

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

impl Task {
    async fn run(mut self, env: Arc<Env>, steps: usize) -> Self {
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

    async fn create(&mut self, env: &Env, at: &str) {
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

    async fn grant(&mut self, env: &Env) {
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

    async fn claim(&mut self, env: &Env) {
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
    fn lost(&self, env: &Env, held: &Held, at: &str) {
        let mut seen = env.seen.lock().unwrap();
        assert!(
            seen.forced.contains(&held.claim.run_token),
            "{at}: job {} was taken from a claim whose lease never passed",
            held.claim.job.id
        );
        seen.lost += 1;
    }

    async fn start(&mut self, env: &Env, at: &str) {
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

    fn random_finish(&mut self) -> Finish {
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

    async fn finish(&mut self, env: &Env, at: &str) {
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

    async fn cancel(&mut self, env: &Env, at: &str) {
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

    async fn expire(&mut self, env: &Env) {
        if !self.held.is_empty() && self.rng.random_bool(0.5) {
            // One of this task's own claims: afterwards it has surely lost the job.
            let held = self
                .held
                .swap_remove(self.rng.random_range(0..self.held.len()));
            env.seen.lock().unwrap().forced.insert(held.claim.run_token);
            let_lease_pass(&env.db, held.claim.job.id, held.claim.run_token).await;
            queue::expire_leases(&env.db).await.unwrap();
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
            queue::expire_leases(&env.db).await.unwrap();
        }
    }

    async fn stale_finish(&mut self, env: &Env, at: &str) {
        if self.stale.is_empty() {
            return;
        }
        let held = self.stale[self.rng.random_range(0..self.stale.len())].clone();
        let how = self.random_finish();
        env.seen.lock().unwrap().stale_tries += 1;
        let price = price_of(&env.price_list, &held.claim.job);
        assert_eq!(
            queue::renew_lease(&env.db, &held.claim, LEASE)
                .await
                .unwrap(),
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
        queue::expire_leases(&env.db).await.unwrap();
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

/// Compares the rows with what the tasks saw, and runs the audit. With `drained`, no
/// job is open and nothing may be held.
async fn check_books(env: &Env, at: &str, drained: bool) {
    let db = &env.db;
    assert_billing_invariants(db).await;
    let seen = {
        let seen = env.seen.lock().unwrap();
        Seen {
            granted: seen.granted.clone(),
            creates: seen.creates.clone(),
            holds: seen.holds.clone(),
            finishes: seen.finishes.clone(),
            ..Seen::default()
        }
    };

    // Idempotency: one fresh job per key; replays name it, conflicts differ from it.
    let mut fresh: HashMap<(usize, u32), (u32, Uuid)> = HashMap::new();
    for record in &seen.creates {
        if let CreateOutcome::Fresh(id) = record.outcome {
            let earlier = fresh.insert((record.tenant, record.key), (record.variant, id));
            assert!(
                earlier.is_none(),
                "{at}: key {} of tenant {} made two jobs",
                record.key,
                record.tenant
            );
        }
    }
    for record in &seen.creates {
        let winner = fresh.get(&(record.tenant, record.key)).copied();
        match (record.outcome, winner) {
            (CreateOutcome::Replayed(id), Some((variant, fresh_id))) => {
                assert_eq!(
                    (record.variant, id),
                    (variant, fresh_id),
                    "{at}: {record:?}"
                );
            }
            (CreateOutcome::Conflict, Some((variant, _))) => {
                assert_ne!(
                    record.variant, variant,
                    "{at}: {record:?} conflicted with itself"
                );
            }
            (CreateOutcome::Replayed(_) | CreateOutcome::Conflict, None) => {
                panic!("{at}: {record:?} without any job under its key");
            }
            _ => {}
        }
    }

    let rows = jobs::Entity::find().all(db).await.unwrap();
    assert_eq!(
        rows.len(),
        seen.holds.len(),
        "{at}: jobs in the database against fresh creates"
    );
    let reservations: HashMap<Uuid, i64> = credit_reservations::Entity::find()
        .all(db)
        .await
        .unwrap()
        .into_iter()
        .map(|reservation| (reservation.job_id, reservation.amount_nanos))
        .collect();
    let charge_rows: HashMap<Uuid, i64> = charges::Entity::find()
        .all(db)
        .await
        .unwrap()
        .into_iter()
        .map(|charge| (charge.job_id, charge.amount_nanos))
        .collect();
    let mut terminal_events: HashMap<Uuid, usize> = HashMap::new();
    for event in job_events::Entity::find().all(db).await.unwrap() {
        if event.kind.is_terminal() {
            *terminal_events.entry(event.job_id).or_default() += 1;
        }
    }
    let mut finishes: HashMap<Uuid, Vec<Effect>> = HashMap::new();
    for (job, effect) in &seen.finishes {
        finishes.entry(*job).or_default().push(*effect);
    }

    let mut expected: HashMap<Uuid, Balance> = HashMap::new();
    for (tenant, granted) in &seen.granted {
        expected.entry(*tenant).or_default().granted = Credits::from_nanos(*granted);
    }
    for row in &rows {
        let (tenant, hold) = *seen
            .holds
            .get(&row.id)
            .unwrap_or_else(|| panic!("{at}: job {} was made by no create", row.id));
        assert_eq!(row.tenant_id, tenant, "{at}");
        assert_eq!(
            reservations.get(&row.id),
            Some(&hold),
            "{at}: hold of {}",
            row.id
        );
        assert_eq!(
            terminal_events.get(&row.id).copied().unwrap_or(0),
            usize::from(row.status.is_terminal()),
            "{at}: terminal events of {} ({:?})",
            row.id,
            row.status
        );
        let finished = finishes.get(&row.id).map(Vec::as_slice).unwrap_or_default();
        assert!(
            finished.len() <= 1,
            "{at}: job {} ended twice: {finished:?}",
            row.id
        );
        let balance = expected.entry(tenant).or_default();
        match row.status {
            JobStatus::Queued | JobStatus::Running => {
                assert!(finished.is_empty(), "{at}: open job {} ended", row.id);
                balance.held = balance.held + Credits::from_nanos(hold);
            }
            JobStatus::Succeeded => {
                let [Effect::Settle { charge }] = finished else {
                    panic!("{at}: job {} succeeded without a settling finish", row.id);
                };
                let charged = charge.nanos().min(hold);
                assert_eq!(charge_rows.get(&row.id), Some(&charged), "{at}: charge");
                balance.charged = balance.charged + Credits::from_nanos(charged);
            }
            JobStatus::Failed | JobStatus::Cancelled => {
                assert!(
                    matches!(finished, [] | [Effect::Release(_)]),
                    "{at}: job {} is {:?} after {finished:?}",
                    row.id,
                    row.status
                );
                if let [Effect::Release(status)] = finished {
                    assert_eq!(*status, row.status, "{at}");
                }
                assert!(
                    !charge_rows.contains_key(&row.id),
                    "{at}: charged {}",
                    row.id
                );
            }
        }
    }
    for tenant in &env.tenants {
        let balance = ledger::balance(db, *tenant).await.unwrap().unwrap();
        let expected = expected.get(tenant).copied().unwrap_or_default();
        assert_eq!(balance, expected, "{at}: balance of tenant {tenant}");
        assert!(!balance.available().nanos().is_negative(), "{at}");
        if drained {
            assert_eq!(balance.held, Credits::ZERO, "{at}: a hold outlived its job");
        }
    }
}

// ---------------------------------------------------------------------------------
// 3. Concurrent creates against a balance that fits exactly K holds
// ---------------------------------------------------------------------------------

async fn concurrent_creates_never_admit_more_than_the_balance_holds(backend: Backend) {
    const FITS: i64 = 5;
    const CALLS: usize = 12;
    let app = spawn_app_with(backend, AppOptions::no_workers()).await;
    let db = app.app.db.clone();
    let input = |key: &str| {
        json!({
            "idempotencyKey": key,
            "model": "gpt-4o-mini",
            "messages": [{"role": "user", "content": "x"}],
            "maxOutputTokens": 150_001,
        })
    };
    let new = NewJob::parse(JobRequest {
        idempotency_key: "sizing".into(),
        model: "gpt-4o-mini".into(),
        messages: vec![("user".into(), "x".into())],
        max_output_tokens: 150_001,
        response_schema: None,
        max_attempts: None,
        retry_unknown_outcome: None,
        metadata: None,
        stream_output: None,
        priority: None,
        run_at: None,
    })
    .unwrap();
    let price = prices::price_at(&db, "gpt-4o-mini", Timestamp::now())
        .await
        .unwrap()
        .unwrap();
    let hold = new.input.call_bound().job_hold(&price, new.max_attempts);
    // Nine significant fractional digits, so any rounding on the way shows.
    assert!(
        hold.nanos() % 10 != 0 && (100_000_000..1_000_000_000).contains(&hold.nanos()),
        "the hold {hold} should have nine significant fractional digits"
    );
    let nanos = |count: i64| Credits::from_nanos(count);
    // One tenant fits exactly K holds; the other one nano-credit short of K + 1.
    let exact_grant = nanos(FITS * hold.nanos());
    let short_grant = nanos((FITS + 1) * hold.nanos() - 1);
    let exact = app.funded_tenant("exact", &exact_grant.to_string()).await;
    let short = app.funded_tenant("short", &short_grant.to_string()).await;

    // Watches both balances while the creates race: available never goes below zero.
    let stop = Arc::new(AtomicBool::new(false));
    let watcher = tokio::spawn({
        let db = db.clone();
        let stop = stop.clone();
        let tenants = [exact.id, short.id];
        async move {
            let mut samples = 0;
            while !stop.load(Ordering::Relaxed) {
                for tenant in tenants {
                    let balance = ledger::balance(&db, tenant).await.unwrap().unwrap();
                    assert!(
                        !balance.available().nanos().is_negative(),
                        "available below zero mid-race: {balance:?}"
                    );
                    assert!(balance.held.nanos() <= FITS * hold.nanos(), "{balance:?}");
                }
                samples += 1;
                tokio::time::sleep(Duration::from_millis(2)).await;
            }
            samples
        }
    });
    let calls: Vec<_> = (0..CALLS)
        .flat_map(|index| [(&exact, index), (&short, index)])
        .collect();
    let responses = futures_util::future::join_all(
        calls
            .iter()
            .map(|(tenant, index)| app.create_job(tenant, input(&format!("burst-{index}")))),
    )
    .await;
    stop.store(true, Ordering::Relaxed);
    let samples = watcher.await.expect("available went below zero");
    assert!(samples > 0);

    for (tenant, grant) in [(&exact, exact_grant), (&short, short_grant)] {
        let mine: Vec<_> = calls
            .iter()
            .zip(&responses)
            .filter(|((owner, _), _)| owner.id == tenant.id)
            .map(|(_, response)| response)
            .collect();
        let admitted: Vec<_> = mine
            .iter()
            .filter(|response| response["errors"].is_null())
            .collect();
        assert_eq!(
            admitted.len(),
            FITS as usize,
            "a balance for {FITS} holds admitted {}",
            admitted.len()
        );
        for response in &mine {
            if !response["errors"].is_null() {
                assert_eq!(error_code(response), "INSUFFICIENT_CREDITS", "{response}");
            }
        }
        let ids: HashSet<&str> = admitted
            .iter()
            .map(|response| {
                let job = &response["data"]["createJob"]["job"];
                assert_eq!(job["status"], "QUEUED");
                assert_eq!(
                    decimal(&job["reservation"]["amount"]),
                    hold.to_decimal(),
                    "the hold round-trips exactly: {response}"
                );
                job["id"].as_str().unwrap()
            })
            .collect();
        assert_eq!(ids.len(), FITS as usize);
        assert_eq!(
            jobs::Entity::find()
                .filter(jobs::Column::TenantId.eq(tenant.id))
                .count(&db)
                .await
                .unwrap(),
            FITS as u64
        );
        assert_eq!(
            ledger_entries::Entity::find()
                .filter(ledger_entries::Column::TenantId.eq(tenant.id))
                .filter(ledger_entries::Column::Kind.eq(LedgerEntryKind::Hold))
                .count(&db)
                .await
                .unwrap(),
            FITS as u64
        );
        let held = nanos(FITS * hold.nanos());
        let available = grant - held;
        let balance = app.balance(tenant).await;
        assert_eq!(decimal(&balance["granted"]), grant.to_decimal());
        assert_eq!(decimal(&balance["held"]), held.to_decimal());
        assert_eq!(decimal(&balance["charged"]), Decimal::ZERO);
        assert_eq!(decimal(&balance["available"]), available.to_decimal());
        assert_eq!(
            ledger::balance(&db, tenant.id).await.unwrap().unwrap(),
            Balance {
                granted: grant,
                held,
                charged: Credits::ZERO,
            }
        );
        // Exactly at the boundary: one nano-credit short is short.
        let refused = app.create_job(tenant, input("one-more")).await;
        assert_eq!(error_code(&refused), "INSUFFICIENT_CREDITS", "{refused}");
    }

    // The short tenant is one nano-credit from another hold: grant it, and it fits.
    let topped = app.grant(&short, "0.000000001").await;
    assert!(topped["errors"].is_null(), "{topped}");
    app.create_job_ok(&short, input("one-more")).await;
    let balance = app.balance(&short).await;
    assert_eq!(decimal(&balance["available"]), Decimal::ZERO);
    assert_eq!(
        decimal(&balance["held"]),
        nanos((FITS + 1) * hold.nanos()).to_decimal()
    );
    assert_billing_invariants(&db).await;
}

// ---------------------------------------------------------------------------------
// 4. Racing resolutions of one hold
// ---------------------------------------------------------------------------------

/// While one transaction has released a job's hold but not yet committed, rivals ask
/// the ledger to release the same hold: each must answer `None` once the first commits
/// (on PostgreSQL they read the hold as still held and then wait on its row; on SQLite
/// they wait for the write lock), so the tenant's held goes down exactly once.
async fn racing_releases_of_one_hold_resolve_it_once(backend: Backend) {
    const JOBS: usize = 4;
    const RIVALS: usize = 3;
    let (database, db) = prepared_database(&backend).await;
    let bus = EventBus::default();
    let tenant = new_tenant(&db, "racer").await;
    let granted = Credits::from_nanos(1_000_000_000);
    grant(&db, tenant, granted, "initial".into()).await.unwrap();
    let spec = Spec {
        model: 0,
        max_output: 1_000,
        content_chars: 10,
        max_attempts: 1,
        retry_unknown: true,
    };
    let hold = spec.hold(&model_prices(&db).await[0]);
    let mut held = Credits::from_nanos(JOBS as i64 * hold.nanos());
    let mut job_ids = Vec::new();
    for index in 0..JOBS {
        let created = service::create_job(
            &db,
            &bus,
            &simulated_models(),
            tenant,
            spec.new_job(&format!("race-{index}")),
        )
        .await
        .unwrap();
        job_ids.push(created.job.id);
    }
    for job_id in job_ids {
        // The first resolver ends the job and releases its hold, as a cancel does.
        let first = begin_write(&db).await.unwrap();
        let ended = jobs::Entity::update_many()
            .col_expr(jobs::Column::Status, Expr::value(JobStatus::Cancelled))
            .col_expr(jobs::Column::CancelRequested, Expr::value(true))
            .filter(jobs::Column::Id.eq(job_id))
            .filter(jobs::Column::Status.eq(JobStatus::Queued))
            .exec(&first)
            .await
            .unwrap();
        assert_eq!(ended.rows_affected, 1);
        let settlement = ledger::release(&first, job_id).await.unwrap();
        assert_eq!(
            settlement,
            Some(ledger::Settlement {
                charged: Credits::ZERO,
                released: hold,
            })
        );
        let rivals: Vec<_> = (0..RIVALS)
            .map(|_| {
                let db = db.clone();
                tokio::spawn(async move {
                    let transaction = begin_write(&db).await.unwrap();
                    let resolved = ledger::release(&transaction, job_id).await.unwrap();
                    transaction.commit().await.unwrap();
                    resolved
                })
            })
            .collect();
        // Long enough for the rivals to read the hold and queue behind the first.
        tokio::time::sleep(Duration::from_millis(150)).await;
        first.commit().await.unwrap();
        for rival in rivals {
            assert_eq!(rival.await.unwrap(), None, "a hold was released twice");
        }
        held = held - hold;
        assert_eq!(
            ledger::balance(&db, tenant).await.unwrap().unwrap(),
            Balance {
                granted,
                held,
                charged: Credits::ZERO,
            }
        );
        assert_eq!(
            ledger_entries::Entity::find()
                .filter(ledger_entries::Column::JobId.eq(job_id))
                .filter(ledger_entries::Column::Kind.eq(LedgerEntryKind::Release))
                .count(&db)
                .await
                .unwrap(),
            1
        );
    }
    assert_billing_invariants(&db).await;
    db.close().await.unwrap();
    drop(database);
}
