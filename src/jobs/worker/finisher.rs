//! Recording finished attempts in groups: attempts that end while the previous group
//! is being written are written together in the next transaction — one commit and a
//! few statements for all of them instead of a dozen statements each. A lone attempt
//! is written at once, so a quiet worker gains nothing and loses nothing.

use crate::jobs::bus::EventNotice;
use crate::jobs::queue::{self, AttemptEnd};
use sea_orm::DatabaseConnection;
use tokio::sync::{mpsc, oneshot};

/// Most attempts finished in one transaction.
const GROUP_LIMIT: usize = 64;

/// What became of an attempt handed to the finisher.
#[derive(Debug)]
pub(super) enum Finished {
    /// Recorded with its group (`None`: the claim no longer owned the job, and
    /// nothing was written for it).
    Recorded(Option<Vec<EventNotice>>),
    /// Its group could not be written: nothing of it was, and the attempt should be
    /// recorded alone, where an error concerns only itself.
    Alone(Box<AttemptEnd>),
    /// The finisher is gone (the process is stopping abnormally); lease expiry
    /// takes the job back.
    Stopped,
}

type Request = (AttemptEnd, oneshot::Sender<Finished>);

/// The handle of the task that writes finished attempts in groups.
#[derive(Debug)]
pub(super) struct Finisher {
    requests: mpsc::UnboundedSender<Request>,
}

impl Finisher {
    /// Starts the task; it ends when the handle is dropped.
    pub(super) fn spawn(db: DatabaseConnection) -> Self {
        let (requests, queue) = mpsc::unbounded_channel();
        tokio::spawn(write_groups(db, queue));
        Self { requests }
    }

    /// Records `end` with whatever other attempts end at about the same time.
    pub(super) async fn finish(&self, end: AttemptEnd) -> Finished {
        let (reply, answer) = oneshot::channel();
        if let Err(mpsc::error::SendError((end, _))) = self.requests.send((end, reply)) {
            return Finished::Alone(Box::new(end));
        }
        answer.await.unwrap_or(Finished::Stopped)
    }
}

async fn write_groups(db: DatabaseConnection, mut queue: mpsc::UnboundedReceiver<Request>) {
    while let Some(first) = queue.recv().await {
        let mut group = vec![first];
        while group.len() < GROUP_LIMIT {
            match queue.try_recv() {
                Ok(request) => group.push(request),
                Err(_) => break,
            }
        }
        let (ends, replies): (Vec<AttemptEnd>, Vec<_>) = group.into_iter().unzip();
        match queue::finish_attempts(&db, &ends).await {
            Ok(finished) => {
                for (reply, finished) in replies.into_iter().zip(finished) {
                    // The attempt's task may be gone (aborted at shutdown): its job is
                    // recorded all the same.
                    let _ = reply.send(Finished::Recorded(finished));
                }
            }
            Err(error) => {
                tracing::warn!(error = %error, attempts = ends.len(), "recording a group of finished attempts failed; recording them one by one");
                for (reply, end) in replies.into_iter().zip(ends) {
                    let _ = reply.send(Finished::Alone(Box::new(end)));
                }
            }
        }
    }
}
