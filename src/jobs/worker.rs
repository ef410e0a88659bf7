//! Workers: claim due jobs, run each attempt under its own timeout and lease, and
//! finish it — never tied to the request that created the job.

use super::bus::{EventBus, EventNotice, Wake};
use super::input::JobInput;
use super::leases::LeaseKeeper;
use super::observe;
use super::queue::{
    self, AttemptReport, AttemptStart, Claim, ClaimRequest, ErrorCode, JobError, JobOutcome,
    Renewal, StartedAttempt, TenantCursor,
};
use super::relay;
use crate::billing::{AttemptEnding, CallBound, ChargingPolicy, ModelPrice, TokenUsage, prices};
use crate::llm::{ChatRequest, Completion, ProviderError, ProviderRegistry};
use crate::metrics::Metrics;
use entity::{AttemptOutcome, EventKind, Timestamp, attempts};
use rand::Rng;
use sea_orm::{DatabaseConnection, DbErr};
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::sync::Semaphore;
use tokio::task::JoinSet;
use tokio_util::sync::CancellationToken;
use tracing::Instrument;

/// First retry delay; each further retry doubles it.
const BACKOFF_BASE: Duration = Duration::from_secs(2);
/// Longest delay between retries.
const BACKOFF_CAP: Duration = Duration::from_secs(60);
/// Longest `Retry-After` honoured; a provider asking for more is treated as this.
const RETRY_AFTER_CAP: Duration = Duration::from_secs(600);
/// Schema violations named in an invalid-output error.
const MAX_REPORTED_SCHEMA_ERRORS: usize = 3;
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
    metrics: Metrics,
    /// Cancelled when the grace period is over: running attempts stop waiting for the
    /// provider and hand their jobs back.
    abort: CancellationToken,
}

impl Worker {
    /// A worker pool; `id` names it on the attempts it records, and `metrics` counts
    /// what it does.
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
        tokio::spawn(self.inner.leases.clone().run(keeper_stop));
        let permits = Arc::new(Semaphore::new(settings.concurrency));
        let mut created = self.inner.bus.watch_created();
        let mut attempts = JoinSet::new();
        let mut poll = tokio::time::interval(settings.poll_interval);
        tracing::info!(worker.id = %self.inner.id, concurrency = settings.concurrency, "worker started");
        // Sweeping is a query of its own: once per poll interval is often enough,
        // however busy the claiming gets.
        let mut last_sweep: Option<Instant> = None;
        let mut cursor = TenantCursor::default();
        while !shutdown.is_cancelled() {
            if last_sweep.is_none_or(|at| at.elapsed() >= settings.poll_interval) {
                last_sweep = Some(Instant::now());
                if let Err(error) = self.take_back_expired_leases().await {
                    tracing::error!(error = %error, "sweeping expired leases failed");
                }
            }
            let free = permits.available_permits().min(CLAIM_BATCH);
            let request = ClaimRequest {
                limit: free as u32,
                lease: settings.lease,
                tenant_limit: settings.tenant_concurrency,
            };
            let asked = Instant::now();
            let claimed = match queue::claim_in_turn(&self.inner.db, request, &mut cursor).await {
                Ok(claimed) => {
                    observe::claimed(&self.inner.metrics, asked.elapsed(), &claimed);
                    claimed
                }
                Err(error) => {
                    tracing::error!(error = %error, "claiming jobs failed");
                    Vec::new()
                }
            };
            let batch_was_full = free > 0 && claimed.len() == free;
            for claim in claimed {
                let permit = permits
                    .clone()
                    .acquire_owned()
                    .await
                    .expect("the semaphore is never closed");
                let worker = self.clone();
                attempts.spawn(async move {
                    worker.run_attempt(claim).await;
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
        let notices = queue::expire_leases(&self.inner.db).await?;
        observe::leases_expired(&self.inner.metrics, &notices);
        self.inner.bus.publish(notices);
        Ok(())
    }

    async fn run_attempt(&self, claim: Claim) {
        let job_id = claim.job.id;
        let span = tracing::info_span!(
            "attempt",
            job.id = %job_id,
            tenant.id = %claim.job.tenant_id,
            model = %claim.job.model,
            attempt.number = tracing::field::Empty,
            provider = tracing::field::Empty,
            trace_id = tracing::field::Empty,
        );
        crate::telemetry::record_trace_id(&span);
        if let Err(error) = self.try_run_attempt(claim).instrument(span).await {
            // The job keeps its lease until it lapses; then it is taken back and retried.
            tracing::error!(job.id = %job_id, error = %error, "attempt failed to record its outcome");
        }
    }

    /// Ends a claimed job that can never run, so that lease expiry does not hand it
    /// back for ever.
    async fn abandon(&self, claim: &Claim, reason: String) -> Result<(), DbErr> {
        tracing::error!(job.id = %claim.job.id, reason = %reason, "the job cannot be run");
        let error = JobError::new(ErrorCode::NotRunnable, reason);
        if let Some(notice) = queue::abandon_claim(&self.inner.db, claim, &error).await? {
            observe::job_ended(&self.inner.metrics, std::slice::from_ref(&notice));
            self.inner.bus.publish([notice]);
        }
        Ok(())
    }

    async fn try_run_attempt(&self, claim: Claim) -> Result<(), DbErr> {
        let inner = &self.inner;
        let input: JobInput = match serde_json::from_value(claim.job.input.0.clone()) {
            Ok(input) => input,
            Err(error) => {
                return self
                    .abandon(&claim, format!("its stored input is unreadable: {error}"))
                    .await;
            }
        };
        let Some(price) = prices::price_at(&inner.db, &claim.job.model, Timestamp::now()).await?
        else {
            return self
                .abandon(&claim, format!("model {} has no price", claim.job.model))
                .await;
        };
        // None when this process has no provider for the model (its config differs
        // from the API process's): the job fails without a call. Nor does a worker
        // with no provider configured simulate a job the API admitted for a real one:
        // that would charge real prices for a simulated reply.
        let provider = inner
            .providers
            .provider_for(&claim.job.model)
            .filter(|_| claim.job.simulated || !inner.providers.simulates(&claim.job.model));
        let bound = input.call_bound();
        let charging = inner.settings.charging;
        let start = AttemptStart {
            worker_id: inner.id.clone(),
            provider: provider.as_ref().map(|provider| provider.name().to_owned()),
            provider_cost_bound: bound.provider_cost(&price),
            customer_charge_bound: bound.customer_cost(&price),
            customer_charge_if_lost: charging.customer_charge(
                &price,
                bound,
                AttemptEnding::Unknown,
                None,
            ),
            price,
        };
        let mut notices = inner.bus.watch_job(claim.job.id);
        let started = match queue::start_attempt(&inner.db, &claim, &start).await {
            Ok(started) => started,
            // A database that is down or busy may let the next claim start; lease
            // expiry hands the job back for it. A refusal would repeat for ever.
            Err(error) if crate::db::is_transient(&error) => return Err(error),
            Err(error) => {
                return self
                    .abandon(
                        &claim,
                        format!("its attempt could not be recorded: {error}"),
                    )
                    .await;
            }
        };
        let Some(StartedAttempt {
            attempt,
            notice: started,
            cancel_requested,
            budget_spent,
        }) = started
        else {
            tracing::warn!(job.id = %claim.job.id, "claim lost before the attempt started");
            return Ok(());
        };
        inner.bus.publish([started.clone()]);
        tracing::Span::current()
            .record("attempt.number", attempt.number)
            .record("provider", attempt.provider.as_str());
        tracing::info!(
            job.id = %claim.job.id, attempt = attempt.number, provider = %attempt.provider,
            model = %claim.job.model, "attempt started"
        );

        let request = ChatRequest {
            model: claim.job.model.clone(),
            messages: input.messages.clone(),
            max_output_tokens: input.max_output_tokens,
            response_schema: input.response_schema.clone(),
        };
        // A streaming attempt sends its text to a forwarder that batches it into
        // OUTPUT_DELTA notices; the forwarder is drained before the attempt finishes,
        // so every delta reaches subscribers before the terminal event.
        let (deltas, forwarder) = if input.stream_output {
            let (sender, receiver) = tokio::sync::mpsc::unbounded_channel();
            let forwarder = tokio::spawn(forward_deltas(
                inner.db.clone(),
                inner.bus.clone(),
                started,
                receiver,
            ));
            (Some(sender), Some(forwarder))
        } else {
            (None, None)
        };
        let began = Instant::now();
        // A cancel that landed after the claim but before the attempt was recorded is
        // in the row start_attempt locked; one landing later reaches `notices`, to
        // which this attempt subscribed before starting.
        let end = if cancel_requested {
            CallEnd::CancelledBeforeSending
        } else if budget_spent {
            CallEnd::BudgetSpent
        } else if let Some(provider) = provider {
            let call_span = tracing::info_span!(
                "provider call",
                provider = %provider.name(),
                provider.request_id = tracing::field::Empty,
            );
            let call = async {
                match &deltas {
                    Some(sender) => provider.stream(&request, sender).await,
                    None => provider.complete(&request).await,
                }
            }
            .instrument(call_span.clone());
            tokio::pin!(call);
            let deadline = tokio::time::sleep(inner.settings.attempt_timeout);
            tokio::pin!(deadline);
            // The keeper renews beside the call, so that a slow database never stalls
            // the stream, the deadline or a cancel.
            let mut lease = inner.leases.hold(&claim);
            let _in_flight = inner.metrics.provider_call();
            loop {
                tokio::select! {
                    // An answer that is ready wins over a deadline, a cancel or an
                    // abort that became ready at the same moment: it is paid for.
                    biased;
                    answer = &mut call => {
                        let request_id = match &answer {
                            Ok(completion) => completion.request_id.as_deref(),
                            Err(error) => error.request_id(),
                        };
                        call_span.record("provider.request_id", request_id);
                        break CallEnd::Answered(answer);
                    }
                    renewal = lease.next() => match renewal {
                        Renewal::Renewed { cancel_requested: true } => break CallEnd::Cancelled,
                        Renewal::Renewed { cancel_requested: false } => {}
                        Renewal::Lost => break CallEnd::LeaseLost,
                    },
                    wake = notices.next() => match wake {
                        Wake::Notice(notice) if notice.kind == EventKind::CancelRequested => {
                            break CallEnd::Cancelled;
                        }
                        Wake::Notice(_) => {}
                        // Missed notices may have held a cancel: ask the row now.
                        Wake::Missed => lease.renew_now(),
                    },
                    _ = &mut deadline => break CallEnd::TimedOut,
                    _ = inner.abort.cancelled() => break CallEnd::Aborted,
                }
            }
        } else {
            CallEnd::NotServed
        };
        drop(deltas);
        let streamed_bytes = match forwarder {
            Some(forwarder) => forwarder.await.unwrap_or_else(|error| {
                tracing::warn!(job.id = %claim.job.id, error = %error, "the delta forwarder ended abnormally");
                0
            }),
            None => 0,
        };
        let latency = began.elapsed();
        if matches!(end, CallEnd::LeaseLost) {
            tracing::warn!(job.id = %claim.job.id, attempt = attempt.number, "lease lost: the attempt writes nothing more");
            return Ok(());
        }
        let call = CallFacts {
            claim: &claim,
            attempt: &attempt,
            price: &start.price,
            input: &input,
            bound,
            charging,
            latency,
            streamed_bytes,
        };
        let (report, outcome) = call.judge(end);
        let report_outcome = report.outcome;
        let finished = match finish_with_retries(
            &inner.db,
            &inner.metrics,
            &claim,
            &attempt,
            &start.price,
            report.clone(),
            outcome,
        )
        .await
        {
            Err(FinishError::Refused(error)) => {
                // Trying again cannot help, and leaving the job to lease expiry would
                // lose the exact usage and run it again: record what is known.
                tracing::error!(job.id = %claim.job.id, error = %error, "the database refused the attempt's outcome; recording the call without it");
                let (report, outcome) = call.not_stored(report);
                finish_with_retries(
                    &inner.db,
                    &inner.metrics,
                    &claim,
                    &attempt,
                    &start.price,
                    report,
                    outcome,
                )
                .await
            }
            other => other,
        }
        .map_err(FinishError::into_db_error)?;
        match finished {
            Some(notices) => {
                tracing::info!(
                    job.id = %claim.job.id, attempt = attempt.number, outcome = ?report_outcome,
                    duration_ms = latency.as_millis() as u64, "attempt finished"
                );
                inner.bus.publish(notices);
            }
            None => {
                tracing::warn!(job.id = %claim.job.id, "lease lost before the attempt finished")
            }
        }
        Ok(())
    }
}

/// Tries to record a finished attempt before giving up to lease expiry.
const FINISH_TRIES: u32 = 5;

/// Why an attempt's end could not be recorded.
#[derive(Debug)]
enum FinishError {
    /// The database refused the statement for what it holds: trying it again fails
    /// the same way.
    Refused(DbErr),
    /// The database stayed unreachable or busy through every try.
    Unavailable(DbErr),
}

impl FinishError {
    fn into_db_error(self) -> DbErr {
        match self {
            Self::Refused(error) | Self::Unavailable(error) => error,
        }
    }
}

/// Records the attempt's end, retrying a transient failure with backoff: the answer
/// may be paid for, and losing it to one busy moment of the database would leave only
/// a cost bound and make the job run again. The write is fenced, so retrying it is
/// safe; once the lease has lapsed it matches nothing.
async fn finish_with_retries(
    db: &DatabaseConnection,
    metrics: &Metrics,
    claim: &Claim,
    attempt: &attempts::Model,
    price: &ModelPrice,
    report: AttemptReport,
    outcome: JobOutcome,
) -> Result<Option<Vec<EventNotice>>, FinishError> {
    let mut pause = Duration::from_millis(500);
    let mut try_number = 1;
    loop {
        match queue::finish_attempt(db, claim, attempt, price, report.clone(), outcome.clone())
            .await
        {
            Ok(finished) => {
                if let Some(notices) = &finished {
                    observe::attempt_finished(metrics, claim, attempt, price, &report, notices);
                }
                return Ok(finished);
            }
            Err(error) if !crate::db::is_transient(&error) => {
                return Err(FinishError::Refused(error));
            }
            Err(error) if try_number < FINISH_TRIES => {
                tracing::warn!(job.id = %claim.job.id, error = %error, try_number, "recording the attempt failed; trying again");
                tokio::time::sleep(pause).await;
                pause *= 2;
                try_number += 1;
            }
            Err(error) => return Err(FinishError::Unavailable(error)),
        }
    }
}

/// How long text may wait to be batched into one delta notice.
const DELTA_WINDOW: Duration = Duration::from_millis(50);
/// Most bytes of a delta's text once escaped as JSON: the notice travels as a NOTIFY
/// payload, which PostgreSQL caps at 8000 bytes, and escaping can make a control
/// character six bytes.
const MAX_DELTA_BYTES: usize = 2_000;

/// Batches the text of a streaming attempt into `OutputDelta` notices that follow the
/// attempt's `AttemptStarted` event, until the call drops its sender. Returns how many
/// bytes of text it delivered, which the charging policy prices when the call ends
/// without usage.
async fn forward_deltas(
    db: DatabaseConnection,
    bus: EventBus,
    started: EventNotice,
    mut pieces: tokio::sync::mpsc::UnboundedReceiver<String>,
) -> u64 {
    let mut delivered = 0;
    while let Some(first) = pieces.recv().await {
        let mut text = first;
        let mut closed = false;
        let window = tokio::time::sleep(DELTA_WINDOW);
        tokio::pin!(window);
        while text.len() < MAX_DELTA_BYTES {
            tokio::select! {
                piece = pieces.recv() => match piece {
                    Some(piece) => text.push_str(&piece),
                    None => {
                        closed = true;
                        break;
                    }
                },
                _ = &mut window => break,
            }
        }
        delivered += text.len() as u64;
        for piece in pieces_that_fit(&text, MAX_DELTA_BYTES) {
            let notice = EventNotice {
                kind: EventKind::OutputDelta,
                delta: Some(piece.to_owned()),
                ..started.clone()
            };
            relay::broadcast(&db, &bus, notice).await;
        }
        if closed {
            break;
        }
    }
    delivered
}

/// `text` cut at character boundaries into pieces whose JSON-escaped size is at most
/// `limit` bytes (a piece holds at least one character).
fn pieces_that_fit(text: &str, limit: usize) -> Vec<&str> {
    let escaped_size = |character: char| match character {
        '"' | '\\' | '\u{8}' | '\u{c}' | '\n' | '\r' | '\t' => 2,
        control if (control as u32) < 0x20 => 6,
        other => other.len_utf8(),
    };
    let mut pieces = Vec::new();
    let (mut start, mut size) = (0, 0);
    for (index, character) in text.char_indices() {
        let grown = size + escaped_size(character);
        if grown > limit && index > start {
            pieces.push(&text[start..index]);
            start = index;
            size = escaped_size(character);
        } else {
            size = grown;
        }
    }
    if start < text.len() {
        pieces.push(&text[start..]);
    }
    pieces
}

/// How the wait for the provider ended.
#[derive(Debug)]
enum CallEnd {
    Answered(Result<Completion, ProviderError>),
    TimedOut,
    Cancelled,
    /// Cancel was requested before the call was made; it never was.
    CancelledBeforeSending,
    /// The job has no paid call left; the call was not made.
    BudgetSpent,
    /// No provider of this process serves the model; the call was not made.
    NotServed,
    LeaseLost,
    /// The worker is shutting down and the grace period is over.
    Aborted,
}

/// What an attempt's end is judged with.
struct CallFacts<'a> {
    claim: &'a Claim,
    attempt: &'a attempts::Model,
    price: &'a ModelPrice,
    input: &'a JobInput,
    bound: CallBound,
    charging: ChargingPolicy,
    latency: Duration,
    /// Bytes of reply text streamed to subscribers before the call ended.
    streamed_bytes: u64,
}

impl CallFacts<'_> {
    /// The attempt row's report: the customer charge follows from how the call ended,
    /// the charging policy, and the output it streamed.
    fn report(
        &self,
        outcome: AttemptOutcome,
        usage: Option<TokenUsage>,
        ending: AttemptEnding,
        error: Option<JobError>,
        provider_request_id: Option<String>,
    ) -> AttemptReport {
        // What produced the streamed output: counted exactly when the provider reported
        // usage, and estimated from the prompt and the text when the call ended first.
        let delivered = (self.streamed_bytes > 0).then(|| match &usage {
            Some(usage) => *usage,
            None => self.bound.estimated_delivery(self.streamed_bytes),
        });
        AttemptReport {
            outcome,
            usage,
            not_billed: ending == AttemptEnding::NotBilled,
            customer_charge: self.charging.customer_charge(
                self.price,
                self.bound,
                ending,
                delivered.as_ref(),
            ),
            delivered_output_tokens: delivered.map(|usage| usage.output_tokens),
            error,
            provider_request_id,
            latency: self.latency,
        }
    }

    /// Queued again after a backoff while attempts are left; failed otherwise.
    fn retry_or_fail(&self, error: JobError, retry_after: Option<Duration>) -> JobOutcome {
        let job = &self.claim.job;
        if job.attempt_count < job.max_attempts {
            JobOutcome::Retry {
                at: Timestamp::now().plus(
                    chrono::Duration::from_std(retry_delay(self.attempt.number, retry_after))
                        .unwrap_or(chrono::Duration::MAX),
                ),
            }
        } else {
            JobOutcome::Failed(error)
        }
    }

    /// Decides what an attempt's end means for the attempt row and for the job.
    fn judge(&self, end: CallEnd) -> (AttemptReport, JobOutcome) {
        let not_sent = |code, message: &str| {
            let error = JobError::new(code, message);
            (
                self.report(
                    AttemptOutcome::PermanentError,
                    None,
                    AttemptEnding::NotBilled,
                    Some(error.clone()),
                    None,
                ),
                JobOutcome::Failed(error),
            )
        };
        match end {
            CallEnd::Answered(Ok(completion)) => self.answered(completion),
            CallEnd::Answered(Err(error)) => self.refused(error),
            CallEnd::TimedOut => self.unknown_outcome(format!(
                "no answer within the attempt timeout of {} s",
                self.latency.as_secs()
            )),
            CallEnd::Cancelled => {
                let error = JobError::new(
                    ErrorCode::Cancelled,
                    "cancelled while the provider call was running",
                );
                (
                    self.report(
                        AttemptOutcome::Cancelled,
                        None,
                        AttemptEnding::CancelledDuringCall,
                        Some(error),
                        None,
                    ),
                    JobOutcome::Cancelled,
                )
            }
            CallEnd::CancelledBeforeSending => {
                let error = JobError::new(
                    ErrorCode::Cancelled,
                    "cancelled before the provider was called",
                );
                (
                    self.report(
                        AttemptOutcome::Cancelled,
                        None,
                        AttemptEnding::NotBilled,
                        Some(error),
                        None,
                    ),
                    JobOutcome::Cancelled,
                )
            }
            CallEnd::BudgetSpent => not_sent(
                ErrorCode::PaidCallLimit,
                "not sent: the job already made as many provider calls that may have been billed as it may pay for",
            ),
            CallEnd::NotServed => not_sent(
                ErrorCode::ModelNotServed,
                "not sent: no configured provider serves this model",
            ),
            CallEnd::Aborted => {
                // The request was in flight: it may be billed, so its bound stays, and
                // sending it again is a retry of an unknown outcome like any other.
                let error = JobError::new(
                    ErrorCode::WorkerShutdown,
                    "the worker shut down during the call",
                );
                let outcome = if self.claim.job.retry_unknown_outcome {
                    JobOutcome::HandBack
                } else {
                    JobOutcome::Failed(JobError::new(
                        ErrorCode::OutcomeUnknown,
                        "the worker shut down during the call, and the job does not retry unknown outcomes",
                    ))
                };
                (self.unknown_report(error), outcome)
            }
            CallEnd::LeaseLost => unreachable!("a lost lease is handled before judging"),
        }
    }

    fn answered(&self, mut completion: Completion) -> (AttemptReport, JobOutcome) {
        let within_bound = self.bound.limit(completion.usage);
        if within_bound != completion.usage {
            tracing::error!(
                job.id = %self.claim.job.id, model = %self.claim.job.model,
                reported = ?completion.usage, recorded = ?within_bound,
                "the provider reported more tokens than the request could use; recorded at the bound"
            );
            completion.usage = within_bound;
        }
        let request_id = completion.request_id.clone();
        match accept(&completion, self.input) {
            Ok(result) => (
                self.report(
                    AttemptOutcome::Succeeded,
                    Some(completion.usage),
                    AttemptEnding::Accepted(completion.usage),
                    None,
                    request_id,
                ),
                JobOutcome::Succeeded { result },
            ),
            Err(error) => (
                self.report(
                    AttemptOutcome::InvalidOutput,
                    Some(completion.usage),
                    AttemptEnding::Rejected,
                    Some(error.clone()),
                    request_id,
                ),
                // The finish fails it instead once its invalid-output retries are spent.
                self.retry_or_fail(error, None),
            ),
        }
    }

    fn refused(&self, error: ProviderError) -> (AttemptReport, JobOutcome) {
        let request_id = error.request_id().map(str::to_owned);
        let failed = |outcome, error: JobError, request_id| {
            self.report(
                outcome,
                None,
                AttemptEnding::NotBilled,
                Some(error),
                request_id,
            )
        };
        match error {
            ProviderError::NotSent { message } => {
                let error = JobError::new(ErrorCode::ProviderUnavailable, message);
                (
                    failed(AttemptOutcome::RetryableError, error.clone(), None),
                    self.retry_or_fail(error, None),
                )
            }
            ProviderError::Transient {
                status,
                message,
                retry_after,
                ..
            } => {
                let error = JobError::new(
                    ErrorCode::ProviderUnavailable,
                    format!("provider answered {status}: {message}"),
                );
                (
                    failed(AttemptOutcome::RetryableError, error.clone(), request_id),
                    self.retry_or_fail(error, retry_after),
                )
            }
            ProviderError::Permanent {
                status, message, ..
            } => {
                let message = tenant_message(self.claim, status, message);
                let error = JobError::new(
                    ErrorCode::ProviderRejected,
                    format!("provider refused the request with {status}: {message}"),
                );
                (
                    failed(AttemptOutcome::PermanentError, error.clone(), request_id),
                    JobOutcome::Failed(error),
                )
            }
            ProviderError::OutcomeUnknown { message } => self.unknown_outcome(message),
        }
    }

    /// The request may have been billed: the cost stays a bound, and the job is retried
    /// only if it allows paying twice.
    fn unknown_outcome(&self, message: String) -> (AttemptReport, JobOutcome) {
        let error = JobError::new(ErrorCode::OutcomeUnknown, message);
        let outcome = if self.claim.job.retry_unknown_outcome {
            self.retry_or_fail(error.clone(), None)
        } else {
            JobOutcome::Failed(error.clone())
        };
        (self.unknown_report(error), outcome)
    }

    /// The report of a call sent whose outcome is unknown: no usage, the bound stands.
    fn unknown_report(&self, error: JobError) -> AttemptReport {
        self.report(
            AttemptOutcome::Unknown,
            None,
            AttemptEnding::Unknown,
            Some(error),
            None,
        )
    }

    /// The report and outcome to record when the database refused `refused`: the call
    /// with its usage and exact cost (so the bill is explained) and the job failed —
    /// whatever the answer was, it could not be kept.
    fn not_stored(&self, refused: AttemptReport) -> (AttemptReport, JobOutcome) {
        let error = JobError::new(
            ErrorCode::ResultNotStored,
            format!(
                "the outcome of attempt {} could not be stored; the call is recorded with its usage",
                self.attempt.number
            ),
        );
        let ending = if refused.not_billed {
            AttemptEnding::NotBilled
        } else {
            AttemptEnding::Rejected
        };
        let report = self.report(
            AttemptOutcome::PermanentError,
            refused.usage,
            ending,
            Some(error.clone()),
            refused.provider_request_id,
        );
        (report, JobOutcome::Failed(error))
    }
}

/// What a tenant may read of a provider's refusal. Authentication and configuration
/// errors (401, 403, 404) are the operator's to fix and their text can carry a
/// fragment of our key or our account: the operator finds it in the log instead.
fn tenant_message(claim: &Claim, status: u16, message: String) -> String {
    if matches!(status, 401 | 403 | 404) {
        tracing::error!(
            job.id = %claim.job.id, model = %claim.job.model, status, provider_message = %message,
            "the provider refused our credentials or configuration"
        );
        "the provider refused the service's credentials or configuration; the operator has the details".to_owned()
    } else {
        message
    }
}

/// The job's result from a reply: the parsed JSON when the job has a response schema,
/// the text otherwise.
fn accept(completion: &Completion, input: &JobInput) -> Result<serde_json::Value, JobError> {
    let Some(schema) = &input.response_schema else {
        return Ok(serde_json::Value::String(completion.text.clone()));
    };
    let invalid = |message: String| JobError::new(ErrorCode::InvalidOutput, message);
    let value: serde_json::Value = serde_json::from_str(strip_code_fence(&completion.text))
        .map_err(|error| invalid(format!("the reply is not JSON: {error}")))?;
    // The schema compiled when the job was created; it still does.
    let validator = jsonschema::validator_for(schema)
        .map_err(|error| invalid(format!("the response schema does not compile: {error}")))?;
    let problems: Vec<String> = validator
        .iter_errors(&value)
        .take(MAX_REPORTED_SCHEMA_ERRORS)
        // Where the reply fails and which keyword, never the value: the message is
        // shown to the tenant, and quoting an answer it is not charged for would give
        // the answer away.
        .map(|error| {
            format!(
                "the value at \"{}\" fails \"{}\"",
                error.instance_path(),
                error.schema_path()
            )
        })
        .collect();
    if problems.is_empty() {
        Ok(value)
    } else {
        Err(invalid(format!(
            "the reply does not match the response schema: {}",
            problems.join("; ")
        )))
    }
}

/// Models asked for JSON often wrap it in a Markdown code fence anyway.
fn strip_code_fence(text: &str) -> &str {
    let trimmed = text.trim();
    let Some(inner) = trimmed.strip_prefix("```") else {
        return trimmed;
    };
    let inner = inner.trim_end().strip_suffix("```").unwrap_or(inner);
    // Drop the info string (`json`) after the opening fence.
    inner
        .trim_start_matches(|c: char| c.is_ascii_alphanumeric())
        .trim()
}

/// The wait before retry `attempt + 1`: exponential backoff from 2 s doubling to a
/// 60 s cap, with "equal jitter" (uniform between half and all of it) so that jobs
/// failing together do not retry together; a longer `Retry-After` wins.
fn retry_delay(attempt: i32, retry_after: Option<Duration>) -> Duration {
    let exponent = u32::try_from(attempt.saturating_sub(1))
        .unwrap_or(0)
        .min(16);
    let backoff = BACKOFF_BASE.saturating_mul(1 << exponent).min(BACKOFF_CAP);
    let jittered = rand::rng().random_range(backoff / 2..=backoff);
    match retry_after {
        Some(wanted) => jittered.max(wanted.min(RETRY_AFTER_CAP)),
        None => jittered,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backoff_doubles_with_jitter_and_stops_at_the_cap() {
        for _ in 0..100 {
            let first = retry_delay(1, None);
            assert!(first >= Duration::from_secs(1) && first <= Duration::from_secs(2));
            let third = retry_delay(3, None);
            assert!(third >= Duration::from_secs(4) && third <= Duration::from_secs(8));
            let late = retry_delay(30, None);
            assert!(late >= Duration::from_secs(30) && late <= BACKOFF_CAP);
        }
    }

    #[test]
    fn code_fences_around_json_are_ignored() {
        assert_eq!(strip_code_fence("```json\n{\"a\": 1}\n```"), "{\"a\": 1}");
        assert_eq!(strip_code_fence("  {\"a\": 1} "), "{\"a\": 1}");
        assert_eq!(strip_code_fence("```\n[1]\n```"), "[1]");
        assert_eq!(strip_code_fence("```json {\"a\": 1}```"), "{\"a\": 1}");
    }

    #[test]
    fn delta_pieces_fit_a_notify_payload_once_escaped() {
        let controls = "\u{1}".repeat(1_999);
        let pieces = pieces_that_fit(&controls, MAX_DELTA_BYTES);
        assert_eq!(pieces.concat(), controls);
        for piece in &pieces {
            assert!(serde_json::to_string(piece).unwrap().len() <= MAX_DELTA_BYTES + 2);
        }
        let words = "héllo \"world\" ".repeat(500);
        let pieces = pieces_that_fit(&words, 100);
        assert_eq!(pieces.concat(), words);
        assert!(
            pieces
                .iter()
                .all(|piece| serde_json::to_string(piece).unwrap().len() <= 102)
        );
        assert_eq!(pieces_that_fit("", 10), Vec::<&str>::new());
    }

    #[test]
    fn a_longer_retry_after_wins_and_is_capped() {
        assert_eq!(
            retry_delay(1, Some(Duration::from_secs(30))),
            Duration::from_secs(30)
        );
        assert_eq!(
            retry_delay(1, Some(Duration::from_secs(86_400))),
            RETRY_AFTER_CAP
        );
    }
}
