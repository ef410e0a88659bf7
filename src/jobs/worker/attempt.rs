//! One attempt's run, in four steps: the provider call raced against its timeout, the
//! job's deadline, its lease, cancels and shutdown ([`Worker::race_call`]); the stream
//! of its text drained ([`Stream::drain`]); the judgement of how it ended
//! ([`CallFacts::judge`]); and the recording of that end, batched with others or alone
//! with retries ([`Worker::record`]).

use super::finisher::Finished;
use super::judge::{CallEnd, CallFacts};
use super::{Prepared, Ready, Worker, deltas};
use crate::backoff::{Backoff, Jitter};
use crate::bus::{EventNotice, TopicReceiver, Wake};
use crate::jobs::budget::Refusal;
use crate::jobs::fallbacks::ModelChain;
use crate::jobs::flow;
use crate::jobs::leases::LeaseHold;
use crate::jobs::lifecycle::deadline_of;
use crate::jobs::lifecycle::{AttemptReport, JobOutcome};
use crate::jobs::observe;
use crate::jobs::queue::{self, AttemptEnd, Claim, Renewal, StartedAttempt};
use crate::llm::{ChatRequest, Provider};
use entity::{EventKind, Timestamp};
use sea_orm::{DatabaseConnection, DbErr};
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::sync::mpsc::UnboundedSender;
use tokio::task::JoinHandle;
use tracing::Instrument;

/// The attempt lost its lease while the call ran: another worker may have the job
/// now, so the attempt writes nothing more — its end is not judged, and whoever takes
/// the job back finishes it as `LEASE_EXPIRED`.
#[derive(Debug)]
pub(super) struct LeaseLost;

/// What the call is raced with besides the call itself.
struct Race<'a> {
    claim: &'a Claim,
    provider: Option<Arc<dyn Provider>>,
    request: ChatRequest,
    /// The tenant asked to cancel before the attempt was recorded.
    cancel_requested: bool,
    /// Why the job's budget refuses the call, if it does.
    budget_refusal: Option<Refusal>,
    lease: &'a mut LeaseHold,
    /// The job's notices, subscribed before the attempt started: a cancel arrives here.
    notices: &'a mut TopicReceiver,
    /// Where streamed text goes, for a streaming attempt.
    deltas: Option<&'a UnboundedSender<String>>,
}

/// A streaming attempt's text on its way to subscribers: a forwarder batches it into
/// `OUTPUT_DELTA` notices.
struct Stream {
    sender: Option<UnboundedSender<String>>,
    forwarder: Option<JoinHandle<u64>>,
}

impl Stream {
    /// Starts the forwarder of a streaming attempt, after its `ATTEMPT_STARTED` event
    /// (`started`); a non-streaming attempt has none.
    fn start(worker: &Worker, streaming: bool, started: EventNotice) -> Self {
        if !streaming {
            return Self {
                sender: None,
                forwarder: None,
            };
        }
        let (sender, receiver) = tokio::sync::mpsc::unbounded_channel();
        let forwarder = tokio::spawn(deltas::forward_deltas(
            worker.inner.db.clone(),
            worker.inner.bus.clone(),
            started,
            receiver,
        ));
        Self {
            sender: Some(sender),
            forwarder: Some(forwarder),
        }
    }

    /// Waits until every delta reached subscribers, so that they all come before the
    /// terminal event; returns the bytes of text streamed.
    async fn drain(self, claim: &Claim) -> u64 {
        drop(self.sender);
        match self.forwarder {
            Some(forwarder) => forwarder.await.unwrap_or_else(|error| {
                tracing::warn!(job.id = %claim.job.id, error = %error, "the delta forwarder ended abnormally");
                0
            }),
            None => 0,
        }
    }
}

impl Worker {
    pub(super) async fn run_attempt(&self, ready: Ready) {
        let job_id = ready.prepared.claim.job.id;
        let span = tracing::info_span!(
            "attempt",
            job.id = %job_id,
            tenant.id = %ready.prepared.claim.job.tenant_id,
            model = %ready.prepared.claim.job.model,
            attempt.number = ready.started.attempt.number,
            provider = %ready.started.attempt.provider,
            trace_id = tracing::field::Empty,
        );
        crate::telemetry::record_trace_id(&span);
        if let Err(error) = self.try_run_attempt(ready).instrument(span).await {
            // The job keeps its lease until it lapses; then it is taken back and retried.
            tracing::error!(job.id = %job_id, error = %error, "attempt failed to record its outcome");
        }
    }

    async fn try_run_attempt(&self, ready: Ready) -> Result<(), DbErr> {
        let Ready {
            prepared:
                Prepared {
                    claim,
                    input,
                    start,
                    bound,
                    provider,
                    mut notices,
                },
            started:
                StartedAttempt {
                    attempt,
                    notice: started,
                    cancel_requested,
                    budget_refusal,
                },
        } = ready;
        let stream = Stream::start(self, input.stream_output, started);
        let began = Instant::now();
        // The keeper renews beside the call, so that a slow database never stalls the
        // stream, the deadline or a cancel; and until the end is recorded, so that a
        // database refusing writes for a while does not cost the answer.
        let mut lease = self.inner.leases.hold(&claim);
        let race = Race {
            claim: &claim,
            provider,
            request: ChatRequest {
                model: claim.job.model.clone(),
                messages: input.messages.clone(),
                max_output_tokens: input.max_output_tokens,
                response_schema: input.response_schema.clone(),
                parameters: input.parameters.clone(),
                tools: input.tools.clone(),
            },
            cancel_requested,
            budget_refusal,
            lease: &mut lease,
            notices: &mut notices,
            deltas: stream.sender.as_ref(),
        };
        let end = self.race_call(race).await;
        let streamed_bytes = stream.drain(&claim).await;
        let latency = began.elapsed();
        let ended_at = Timestamp::now();
        let Ok(end) = end else {
            tracing::warn!(job.id = %claim.job.id, attempt = attempt.number, "lease lost: the attempt writes nothing more");
            return Ok(());
        };
        // Where a job with fallbacks goes next depends on which of its models are
        // paused now; a job that succeeded goes nowhere.
        let chain = ModelChain::of_job(&claim.job);
        let pauses = if chain.fallbacks().is_empty() || matches!(end, CallEnd::Answered(Ok(_))) {
            Vec::new()
        } else {
            self.pauses_of(&chain, ended_at).await
        };
        let facts = CallFacts {
            claim: &claim,
            attempt: &attempt,
            price: &start.price,
            input: &input,
            bound,
            chain: &chain,
            pauses: &pauses,
            charging: self.inner.settings.charging,
            latency,
            ended_at,
            streamed_bytes,
            in_provider_batch: false,
        };
        let sent = end.was_sent();
        let (report, outcome) = facts.judge(end);
        if let Some(until) = report.model_paused_until {
            self.pause_model(&claim.job.model, until).await;
        }
        self.record(&facts, report, outcome, sent, &lease).await
    }

    /// Makes the call unless it must not be made, and races it against its timeout,
    /// the job's deadline, its lease, a cancel and shutdown.
    async fn race_call(&self, race: Race<'_>) -> Result<CallEnd, LeaseLost> {
        let inner = &self.inner;
        let Race {
            claim,
            provider,
            request,
            cancel_requested,
            budget_refusal,
            lease,
            notices,
            deltas,
        } = race;
        // The job's deadline, as this process's clock counts down to it.
        let until_deadline = Duration::from_micros(
            u64::try_from(deadline_of(&claim.job).micros() - Timestamp::now().micros())
                .unwrap_or(0),
        );
        // A cancel that landed after the claim but before the attempt was recorded is
        // in the row start_attempts locked; one landing later reaches `notices`, to
        // which this attempt subscribed before starting.
        if cancel_requested {
            return Ok(CallEnd::CancelledBeforeSending);
        }
        if until_deadline.is_zero() {
            // Claimed before the sweep failed it: too late to start.
            return Ok(CallEnd::PastDeadlineBeforeSending);
        }
        if let Some(refusal) = budget_refusal {
            return Ok(CallEnd::BudgetSpent(refusal));
        }
        if inner.abort.is_cancelled() {
            // Checked before the call: once polled, the call may have left.
            return Ok(CallEnd::AbortedBeforeSending);
        }
        let Some(provider) = provider else {
            return Ok(CallEnd::NotServed);
        };
        let call_span = tracing::info_span!(
            "provider call",
            provider = %provider.name(),
            provider.request_id = tracing::field::Empty,
        );
        let call = async {
            match deltas {
                Some(sender) => provider.stream(&request, sender).await,
                None => provider.complete(&request).await,
            }
        }
        .instrument(call_span.clone());
        tokio::pin!(call);
        let timeout = tokio::time::sleep(inner.settings.attempt_timeout);
        tokio::pin!(timeout);
        let past_deadline = tokio::time::sleep(until_deadline);
        tokio::pin!(past_deadline);
        let _in_flight = inner.metrics.provider_call();
        loop {
            tokio::select! {
                // An answer that is ready wins over a deadline, a cancel or an abort
                // that became ready at the same moment: it is paid for.
                biased;
                answer = &mut call => {
                    let request_id = match &answer {
                        Ok(completion) => completion.request_id.as_deref(),
                        Err(error) => error.request_id(),
                    };
                    call_span.record("provider.request_id", request_id);
                    return Ok(CallEnd::Answered(answer));
                }
                renewal = lease.next() => match renewal {
                    Renewal::Renewed { cancel_requested: true } => return Ok(CallEnd::Cancelled),
                    Renewal::Renewed { cancel_requested: false } => {}
                    Renewal::Lost => return Err(LeaseLost),
                },
                wake = notices.next() => match wake {
                    Wake::Notice(notice) if notice.kind == EventKind::CancelRequested => {
                        return Ok(CallEnd::Cancelled);
                    }
                    Wake::Notice(_) => {}
                    // Missed notices may have held a cancel: ask the row now.
                    Wake::Missed => lease.renew_now(),
                },
                _ = &mut timeout => return Ok(CallEnd::TimedOut),
                // Stopped as a cancel stops it: the call is dropped at once.
                _ = &mut past_deadline => return Ok(CallEnd::PastDeadline),
                _ = inner.abort.cancelled() => return Ok(CallEnd::Aborted),
            }
        }
    }

    /// Records the judged end of the attempt `facts` describe — with the attempts that
    /// end together, or alone with retries when their group could not be written —
    /// and publishes its event. `sent`: whether the request left for the provider.
    async fn record(
        &self,
        facts: &CallFacts<'_>,
        report: AttemptReport,
        outcome: JobOutcome,
        sent: bool,
        lease: &LeaseHold,
    ) -> Result<(), DbErr> {
        let inner = &self.inner;
        let (job_id, number, report_outcome) =
            (facts.claim.job.id, facts.attempt.number, report.outcome);
        let end = AttemptEnd {
            claim: facts.claim.clone(),
            attempt: facts.attempt.clone(),
            price: facts.price.clone(),
            report,
            outcome,
        };
        let tally = observe::AttemptTally::of(&end);
        let unused_tokens = self.unused_tokens(&end.claim, &end.report, sent);
        let finished = match inner.finisher.finish(end).await {
            Finished::Recorded(finished) => finished,
            Finished::Alone(end) => {
                let end = *end;
                match finish_with_retries(&inner.db, end.clone(), lease).await {
                    Err(FinishError::Refused(error)) => {
                        // Trying again cannot help, and leaving the job to lease expiry
                        // would lose the exact usage and run it again: record what is
                        // known.
                        tracing::error!(job.id = %job_id, error = %error, "the database refused the attempt's outcome; recording the call without it");
                        let (report, outcome) = facts.not_stored(end.report.clone());
                        finish_with_retries(
                            &inner.db,
                            AttemptEnd {
                                report,
                                outcome,
                                ..end
                            },
                            lease,
                        )
                        .await
                    }
                    other => other,
                }
                .map_err(FinishError::into_db_error)?
            }
            Finished::Stopped => {
                return Err(DbErr::Custom(
                    "the task recording finished attempts stopped".into(),
                ));
            }
        };
        match finished {
            Some(notices) => {
                tracing::info!(
                    job.id = %job_id, attempt = number, outcome = ?report_outcome,
                    duration_ms = facts.latency.as_millis() as u64, "attempt finished"
                );
                observe::attempt_finished(&inner.metrics, &tally, &notices);
                inner.bus.publish(notices);
                self.return_tokens(unused_tokens);
            }
            None => {
                tracing::warn!(job.id = %job_id, "lease lost before the attempt finished")
            }
        }
        Ok(())
    }

    /// The pauses in force on `chain`'s models at `now`. A database that cannot say
    /// counts none: the next model then may be paused, and the claim waits for it.
    async fn pauses_of(&self, chain: &ModelChain, now: Timestamp) -> Vec<(String, Timestamp)> {
        flow::storage::paused_models(&self.inner.db, chain.models(), now)
            .await
            .unwrap_or_else(|error| {
                tracing::warn!(error = %error, "reading the pauses of a job's models failed");
                Vec::new()
            })
    }
}

/// Why an attempt's end could not be recorded.
#[derive(Debug)]
enum FinishError {
    /// The database refused the statement for what it holds: trying it again fails
    /// the same way.
    Refused(DbErr),
    /// The database stayed unreachable, busy or read-only for [`FINISH_PATIENCE`].
    Unavailable(DbErr),
}

impl FinishError {
    fn into_db_error(self) -> DbErr {
        match self {
            Self::Refused(error) | Self::Unavailable(error) => error,
        }
    }
}

/// Records one attempt's end in a transaction of its own, retrying with backoff
/// every failure that may pass — a busy moment, a lost connection, a database that
/// takes no writes during a failover — for as long as the attempt holds its lease
/// (the keeper goes on renewing it, and retries its renewals too): the answer may be
/// paid for, and losing it would leave only a cost bound and make the job run again.
/// The write is fenced, so retrying it is safe; once another worker has the job it
/// matches nothing.
async fn finish_with_retries(
    db: &DatabaseConnection,
    end: AttemptEnd,
    lease: &LeaseHold,
) -> Result<Option<Vec<EventNotice>>, FinishError> {
    let began = Instant::now();
    let mut try_number = 1;
    loop {
        match queue::finish_attempts(db, std::slice::from_ref(&end)).await {
            Ok(mut finished) => return Ok(finished.remove(0)),
            Err(error) if !crate::db::is_transient(&error) => {
                return Err(FinishError::Refused(error));
            }
            // Another worker has the job: nothing of this attempt would be written.
            Err(_) if lease.is_lost() => return Ok(None),
            Err(error) if began.elapsed() >= FINISH_PATIENCE => {
                return Err(FinishError::Unavailable(error));
            }
            Err(error) => {
                if try_number == 1 || try_number % 10 == 0 {
                    tracing::warn!(job.id = %end.claim.job.id, error = %error, try_number, "recording the attempt failed; trying again");
                }
                tokio::time::sleep(FINISH_BACKOFF.delay(try_number)).await;
                try_number += 1;
            }
        }
    }
}

/// The waits between tries to record an attempt: from 250 ms, doubling to 5 s.
const FINISH_BACKOFF: Backoff = Backoff {
    first: Duration::from_millis(250),
    cap: Duration::from_secs(5),
    jitter: Jitter::None,
};
/// Longest an attempt goes on trying to record its end while its lease holds.
const FINISH_PATIENCE: Duration = Duration::from_secs(600);
