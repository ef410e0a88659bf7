//! Where the documents of a request are decoded and measured: on the runtime's
//! blocking threads, a few requests at a time.
//!
//! Measuring a PDF inflates its streams (up to `pdf::MAX_INFLATED_BYTES` per request)
//! and reads every byte: seconds of CPU for a request of bombs. On the async threads
//! it stalled everything else the process serves — `/healthz`, other tenants' tiny
//! requests. Here it runs in `spawn_blocking`, behind a semaphore of about one
//! permit per core, so that documents neither hold the async threads nor take every
//! blocking thread; requests without documents never wait for a permit.

use crate::error::ServiceError;
use std::sync::Arc;
use tokio::sync::Semaphore;

/// The permits of requests whose documents are being measured, shared by the
/// process's API.
#[derive(Clone, Debug)]
pub struct Measuring {
    permits: Arc<Semaphore>,
}

impl Measuring {
    /// As many permits as the machine has cores.
    pub fn per_core() -> Self {
        let cores = std::thread::available_parallelism().map_or(1, usize::from);
        Self {
            permits: Arc::new(Semaphore::new(cores)),
        }
    }

    /// The result of `check` — the checks of a request, which measure its documents
    /// — run on a blocking thread once a permit is free; run here, at once, when
    /// the request carries no document (`documents` false).
    pub async fn run<T: Send + 'static>(
        &self,
        documents: bool,
        check: impl FnOnce() -> Result<T, ServiceError> + Send + 'static,
    ) -> Result<T, ServiceError> {
        if !documents {
            return check();
        }
        let permit = self
            .permits
            .clone()
            .acquire_owned()
            .await
            .map_err(|_| sea_orm::DbErr::Custom("document measuring is closed".into()))?;
        // The permit goes with the work: a client that gives up does not stop it,
        // and its permit is held until it ends.
        tokio::task::spawn_blocking(move || {
            let _permit = permit;
            check()
        })
        .await
        .map_err(|error| sea_orm::DbErr::Custom(format!("document measuring failed: {error}")))?
    }
}
