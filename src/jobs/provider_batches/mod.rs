//! The provider-batch submitter: a closed PROVIDER_BATCH batch's queued items go to
//! their provider's batch API (OpenAI Batch, Anthropic Message Batches) at the batch
//! price, and every item is settled exactly once from the provider's results.
//!
//! Every worker process runs it; each provider batch row is owned by one process at
//! a time, through its `run_token` and `lease_until`, as a job claim is. The steps,
//! each fenced by the owner's token (see `docs/provider-batches.md`):
//!
//! 1. [`submit`]: in one transaction, a batch's due queued items (within the
//!    provider's limits of requests and bytes) are claimed, their attempts started
//!    (`RUNNING`, the item's run token being the provider batch's id) and the
//!    provider batch row written, `preparing` — before anything is sent. Then the row
//!    becomes `uploading` and the upload is made; its answer makes it `submitted`.
//! 2. A row left `uploading` by a crash is searched for at the provider before
//!    anything is sent again ([`search`], [`crate::llm::batches::BatchApi::find`]):
//!    found, it is `submitted` (an Anthropic batch as a candidate, until its results
//!    name the row's attempts); OpenAI's input file found without its batch, the batch is created
//!    from it; nothing found, the upload is made again, under the same row. Each
//!    request of an upload that creates something at the provider is sent only after
//!    a fenced renewal shows the row still owned (`rows::OwnerGate`), so a process
//!    paused past its lease sends nothing once it resumes; a create already on its
//!    way when the row was taken over is watched, and cancelled if the row's new
//!    owner records another batch ([`orphans`]).
//! 3. [`poll`]: a `submitted` row is read every poll interval; on `cancelBatch` the
//!    provider is asked to cancel it; once ended, its results are streamed and each
//!    line settles its attempt through the worker's own judge and finish, fenced by
//!    the attempt's run token ([`settle`]), so a line read twice settles nothing twice.
//! 4. A row the provider cannot be read about for longer than the unknown-fate bound
//!    ends `unknown`: its attempts end `UNKNOWN` with their cost bounds, reconcilable
//!    as any unknown attempt, and its items fail rather than go out again.

mod calls;
mod orphans;
mod poll;
mod rows;
mod search;
mod settle;
mod steps;
mod submit;
mod upload;
mod upload_size;

pub(crate) use submit::ITEM_LEASE;

use crate::billing::ChargingPolicy;
use crate::bus::EventBus;
use crate::llm::ProviderRegistry;
use sea_orm::DatabaseConnection;
use std::sync::Arc;
use std::time::Duration;
use tokio::task::JoinSet;
use tokio_util::sync::CancellationToken;

/// How often the submitter looks for closed batches with queued items and for rows
/// due a look: a closed batch's items go out within about this.
const TICK: Duration = Duration::from_secs(1);
/// How long a stopping submitter waits for the steps under way.
const STOP_GRACE: Duration = Duration::from_secs(10);

/// The submitter's settings.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ProviderBatchSettings {
    /// How often a submitted provider batch is read (`--provider-batch-poll-seconds`).
    pub poll: Duration,
    /// How long a provider batch may go without the provider answering about it
    /// before its items' fates are unknown (`--provider-batch-unknown-after-seconds`).
    pub unknown_after: Duration,
    /// How long after its last creating request an upload whose answer was lost (or
    /// was a 429/529, which a gateway may have sent after forwarding it) is left
    /// alone before it is searched for (`--provider-batch-create-grace-seconds`): a
    /// create still in flight is not listed yet, and a search that misses it would
    /// upload the items a second time.
    pub create_grace: Duration,
    /// The longest a request of a provider's batch API may go unanswered (a read, a
    /// cancel, a page of a search, a line of the results; an upload has twice this
    /// and its bytes' time) before it is given up as unanswered
    /// (`--provider-batch-call-timeout-seconds`).
    pub call_timeout: Duration,
}

/// 30 s, as the flag's default.
pub const DEFAULT_POLL: Duration = Duration::from_secs(30);
/// 24 hours: the providers' completion window. A provider unreachable that long
/// about a batch has let it expire or lost it.
pub const DEFAULT_UNKNOWN_AFTER: Duration = Duration::from_secs(24 * 60 * 60);
/// A minute: far past how long either provider takes to answer a create.
pub const DEFAULT_CREATE_GRACE: Duration = Duration::from_secs(60);
/// Two minutes: both providers answer a read or a list within seconds.
pub const DEFAULT_CALL_TIMEOUT: Duration = Duration::from_secs(120);

impl Default for ProviderBatchSettings {
    fn default() -> Self {
        Self {
            poll: DEFAULT_POLL,
            unknown_after: DEFAULT_UNKNOWN_AFTER,
            create_grace: DEFAULT_CREATE_GRACE,
            call_timeout: DEFAULT_CALL_TIMEOUT,
        }
    }
}

/// What every step works with.
#[derive(Clone)]
pub struct Submitter {
    db: DatabaseConnection,
    bus: EventBus,
    providers: ProviderRegistry,
    settings: ProviderBatchSettings,
    charging: ChargingPolicy,
    /// Recorded on the attempts it starts, as a worker's id is.
    worker_id: String,
    /// Smaller uploads for providers that refused larger ones.
    upload_sizes: upload_size::UploadSizes,
}

impl Submitter {
    pub fn new(
        db: DatabaseConnection,
        bus: EventBus,
        providers: ProviderRegistry,
        settings: ProviderBatchSettings,
        charging: ChargingPolicy,
        worker_id: String,
    ) -> Self {
        Self {
            db,
            bus,
            providers,
            settings,
            charging,
            worker_id,
            upload_sizes: upload_size::UploadSizes::default(),
        }
    }

    /// Submits, polls and settles until `stop` is cancelled. A step that fails is
    /// logged and tried again on a later tick: every step starts from the rows.
    ///
    /// Each row's step runs as a task of its own, up to [`steps::ROWS_AT_ONCE`] of
    /// each provider at a time, and a tick starts the due rows there is room for
    /// without waiting for the steps still running: a provider slow to answer about
    /// one row (up to the call timeout) holds up that row alone — not the submission
    /// of closed batches, nor rows that come due meanwhile.
    pub async fn run(self, stop: CancellationToken) {
        tracing::info!(worker.id = %self.worker_id, poll_seconds = self.settings.poll.as_secs(), "provider-batch submitter started");
        let submitter = Arc::new(self);
        let mut steps = JoinSet::new();
        let slots = steps::Slots::default();
        let mut tick = tokio::time::interval(TICK);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                () = stop.cancelled() => break,
                _ = tick.tick() => {}
            }
            while let Some(ended) = steps.try_join_next() {
                if let Err(error) = ended {
                    tracing::error!(error = %error, "a provider batch step panicked; its row is taken up again after its lease");
                }
            }
            if let Err(error) = submit::submit_closed_batches(&submitter, &stop).await {
                tracing::warn!(error = %error, "submitting closed provider batches failed; it runs again shortly");
            }
            if let Err(error) = steps::start_due_rows(&submitter, &slots, &mut steps, &stop).await {
                tracing::warn!(error = %error, "looking for due provider batches failed; it runs again shortly");
            }
        }
        // The steps under way end by their call bounds; past a grace, what is left is
        // dropped, as a crash would drop it, and taken up after its lease.
        let drained = tokio::time::timeout(STOP_GRACE, async {
            while steps.join_next().await.is_some() {}
        })
        .await;
        if drained.is_err() {
            tracing::warn!(
                steps = steps.len(),
                "provider batch steps still waiting on their provider at shutdown are dropped; their rows are taken up after their leases"
            );
            steps.abort_all();
        }
    }

    /// `provider`'s batch API, each call bounded by the call timeout.
    fn calls<'a>(
        &self,
        provider: &'a std::sync::Arc<dyn crate::llm::Provider>,
    ) -> calls::Calls<'a> {
        let api = provider.batch_api().expect("a provider with a batch API");
        calls::Calls::new(api, self.settings.call_timeout)
    }
}
