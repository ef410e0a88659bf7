//! A provider batch created by a process that no longer owned its row.
//!
//! The upload's gate ([`super::rows::OwnerGate`]) keeps a process that lost its row
//! from sending the create, but not one whose create was already on its way when
//! another process took the row over (paused past its lease between the gate and the
//! answer). Its batch then exists at the provider and no row of ours may record it:
//! the new owner either finds it (and records it), or made its own — and two batches
//! of the same requests bill them twice. The process that created it watches the row
//! until it knows which, and cancels its batch if another one is the row's.

use super::Submitter;
use super::calls::Calls;
use crate::llm::Provider;
use crate::llm::batches::RemoteState;
use entity::{ProviderBatchState, provider_batches};
use sea_orm::{DatabaseConnection, EntityTrait};
use std::sync::Arc;
use std::time::Duration;
use uuid::Uuid;

/// How often the row is looked at, and for how long: past a few row leases, a row
/// still `uploading` is one nobody has taken over yet, whose next owner will find
/// this batch (it is the newest of its name) and record it.
const LOOK_EVERY: Duration = Duration::from_secs(2);
const LOOKS: u32 = 90;

/// What to do with a batch `created` for a row this process lost.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Verdict {
    /// The row records it: it is the row's batch, settled by its owner.
    Recorded,
    /// The row records another batch, or will make a new upload, or is over: this
    /// one is a second submission of the same requests.
    Cancel,
    /// The row is still being uploaded or searched for: its owner may yet find it.
    Wait,
}

pub(super) fn verdict(row: Option<&provider_batches::Model>, created: &str) -> Verdict {
    let Some(row) = row else {
        return Verdict::Cancel;
    };
    match row.provider_batch_id.as_deref() {
        Some(recorded) if recorded == created => Verdict::Recorded,
        // A candidate's results have yet to show whose it is; ruled out, the row
        // searches again and finds this one.
        Some(_) if !row.attributed => Verdict::Wait,
        Some(_) => Verdict::Cancel,
        None if row.state == ProviderBatchState::Uploading => Verdict::Wait,
        // `preparing` again: its next upload makes a new batch without searching.
        None => Verdict::Cancel,
    }
}

/// Watches the row `id` in the background until the verdict on `created` is known,
/// and cancels it at the provider if it is a second batch.
pub(super) fn look_after(
    submitter: &Submitter,
    id: Uuid,
    provider: Arc<dyn Provider>,
    created: String,
) {
    tracing::error!(provider_batch.id = %id, provider_batch = %created, "created a provider batch after losing its row; watching whether the row's new owner records it");
    let db = submitter.db.clone();
    let limit = submitter.settings.call_timeout;
    tokio::spawn(async move {
        let api = Calls::new(
            provider.batch_api().expect("a provider with a batch API"),
            limit,
        );
        for _ in 0..LOOKS {
            match look(&db, id, api, &created).await {
                Ok(Verdict::Wait) | Err(_) => tokio::time::sleep(LOOK_EVERY).await,
                Ok(_) => return,
            }
        }
        tracing::warn!(provider_batch.id = %id, provider_batch = %created, "the row is still uploading; its next owner's search finds this batch");
    });
}

async fn look(
    db: &DatabaseConnection,
    id: Uuid,
    api: Calls<'_>,
    created: &str,
) -> Result<Verdict, ()> {
    let row = provider_batches::Entity::find_by_id(id)
        .one(db)
        .await
        .map_err(|error| {
            tracing::warn!(provider_batch.id = %id, error = %error, "could not read a lost provider batch row");
        })?;
    let verdict = verdict(row.as_ref(), created);
    match verdict {
        Verdict::Recorded => {
            tracing::info!(provider_batch.id = %id, provider_batch = %created, "the row's new owner recorded the batch this process created");
        }
        Verdict::Cancel => {
            if let Err(error) = api.cancel(created).await {
                // A batch that has ended cannot be cancelled (OpenAI answers 409): there
                // is nothing left to stop, so asking again is no use.
                if api
                    .read(created)
                    .await
                    .is_ok_and(|remote| remote.state == RemoteState::Ended)
                {
                    tracing::error!(provider_batch.id = %id, provider_batch = %created, "a second provider batch of one row ended before it could be cancelled: what it ran is billed by the provider and recorded nowhere");
                    return Ok(verdict);
                }
                tracing::warn!(provider_batch.id = %id, provider_batch = %created, error = %error, "could not cancel a second provider batch of one row; trying again");
                return Err(());
            }
            tracing::error!(provider_batch.id = %id, provider_batch = %created, "cancelled a second provider batch of one row: what it finished before the cancel is billed by the provider and recorded nowhere");
        }
        Verdict::Wait => {}
    }
    Ok(verdict)
}

#[cfg(test)]
mod tests {
    use super::*;
    use entity::Timestamp;

    fn row(state: ProviderBatchState, recorded: Option<&str>) -> provider_batches::Model {
        let now = Timestamp::now();
        provider_batches::Model {
            id: Uuid::nil(),
            batch_id: Uuid::nil(),
            tenant_id: Uuid::nil(),
            provider: "openai".into(),
            model: "gpt-4o-mini".into(),
            state,
            provider_batch_id: recorded.map(str::to_owned),
            input_file_id: None,
            item_count: 1,
            cost_bound_nanos: 0,
            run_token: None,
            lease_until: None,
            next_poll_at: now,
            polls: 0,
            cancel_sent: false,
            last_read_at: now,
            last_error: None,
            created_at: now,
            uploading_at: None,
            submitted_at: None,
            ended_at: None,
            attributed: true,
            ruled_out: None,
            sent_at: None,
            upload_requests: None,
            exclusive_upload: false,
        }
    }

    fn candidate(recorded: &str) -> provider_batches::Model {
        provider_batches::Model {
            attributed: false,
            ..row(ProviderBatchState::Submitted, Some(recorded))
        }
    }

    #[test]
    fn a_batch_made_after_the_row_was_lost_is_kept_only_if_the_row_records_it() {
        use ProviderBatchState::*;
        let cases = [
            (Some(row(Submitted, Some("b-1"))), Verdict::Recorded),
            (Some(row(Ended, Some("b-1"))), Verdict::Recorded),
            (Some(row(Submitted, Some("b-2"))), Verdict::Cancel),
            (Some(candidate("b-1")), Verdict::Recorded),
            (Some(candidate("b-2")), Verdict::Wait),
            (Some(row(Settled, Some("b-2"))), Verdict::Cancel),
            (Some(row(Uploading, None)), Verdict::Wait),
            (Some(row(Preparing, None)), Verdict::Cancel),
            (Some(row(Abandoned, None)), Verdict::Cancel),
            (None, Verdict::Cancel),
        ];
        for (row, expected) in cases {
            assert_eq!(verdict(row.as_ref(), "b-1"), expected, "{row:?}");
        }
    }
}
