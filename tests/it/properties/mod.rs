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

mod admission;
mod concurrent;
mod releases;
mod sequences;

use crate::helpers::{Backend, TestDatabase};
use entity::JobErrorCode;
use entity::{AttemptOutcome, JobStatus, Timestamp, jobs};
use jobledger::billing::ledger::{self};
use jobledger::billing::{Credits, ModelPrice, prices};
use jobledger::db::begin_write;
use jobledger::error::ServiceError;
use jobledger::jobs::input::{JobInput, JobRequest, NewJob};
use jobledger::jobs::lifecycle::{AttemptReport, JobError, JobOutcome};
use jobledger::jobs::queue::AttemptStart;
use jobledger::llm::TokenUsage;
use rust_decimal::Decimal;
use sea_orm::sea_query::Expr;
use sea_orm::{ColumnTrait, DatabaseConnection, EntityTrait, QueryFilter};
use serde_json::json;
use std::str::FromStr;
use std::time::Duration;
use uuid::Uuid;

/// Long enough that no lease passes unless a test makes it.
const LEASE: Duration = Duration::from_secs(600);
/// The models jobs use: two price levels with odd nano-credit rates.
const MODELS: [&str; 2] = ["gpt-4o-mini", "gpt-4o"];

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
            expires_at: None,
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
            messages: vec![jobledger::jobs::input::MessageRequest::text(
                "user",
                self.content(),
            )],
            max_output_tokens: i32::try_from(self.max_output).unwrap(),
            response_schema: None,
            max_attempts: Some(i32::try_from(self.max_attempts).unwrap()),
            retry_unknown_outcome: Some(self.retry_unknown),
            metadata: None,
            stream_output: None,
            priority: None,
            run_at: None,
            deadline: None,
            default_deadline: jobledger::jobs::input::DEFAULT_DEADLINE,
            charging: Default::default(),
            labels: Vec::new(),
            parameters: Default::default(),
            tools: Default::default(),
            fallback_models: Vec::new(),
        })
        .expect("the generated request is valid")
    }

    /// The hold by the sizing rule of `docs/architecture.md` ("Holds and
    /// settlement"), computed here rather than by the service: under the default
    /// policy a job that does not stream is held for one call at the customer price,
    /// whatever its maxAttempts — its prompt as the simulator counts it (a quarter of
    /// the UTF-8 bytes, rounded up) and maxOutputTokens.
    fn hold(&self, price: &ModelPrice) -> Credits {
        let usage = TokenUsage {
            input_tokens: (self.content().len() as u64).div_ceil(4),
            cached_input_tokens: 0,
            output_tokens: u64::from(self.max_output),
        };
        price.customer_charge(&usage)
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
    // The tests' models are served by the simulator, which counts a quarter of the bytes.
    let bound = input.call_bound(jobledger::llm::PromptCounting::QuarterBytes, "gpt-4o-mini");
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
            ended_at: Timestamp::now(),
            model_paused_until: None,
            wait: false,
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
            let error = JobError::new(JobErrorCode::ProviderRejected, "rejected");
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
                Some(JobError::new(JobErrorCode::Cancelled, "cancelled")),
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
                Some(JobError::new(JobErrorCode::Cancelled, "not sent")),
            ),
            JobOutcome::Cancelled,
            Effect::Release(JobStatus::Cancelled),
            cost(AttemptOutcome::Cancelled, None, true),
        ),
        Finish::Retry { unknown } => {
            let (outcome, code) = if unknown {
                (AttemptOutcome::Unknown, JobErrorCode::OutcomeUnknown)
            } else {
                (
                    AttemptOutcome::RetryableError,
                    JobErrorCode::ProviderUnavailable,
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
                        model: None,
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
                Some(JobError::new(JobErrorCode::WorkerShutdown, "shutting down")),
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
