//! Provider batch rows: who owns one (a lease and a run token, as a job claim), and
//! the fenced updates its owner makes.

use crate::db::POSTGRES_CLOCK;
use entity::{ProviderBatchState, Timestamp, provider_batches};
use sea_orm::sea_query::{Expr, ExprTrait, SimpleExpr};
use sea_orm::{
    ColumnTrait, Condition, ConnectionTrait, DbBackend, DbErr, EntityTrait, QueryFilter,
    QueryOrder, QuerySelect, Select, UpdateMany,
};
use std::time::Duration;
use uuid::Uuid;

/// How long a row is owned without renewal; every fenced write renews it, and a
/// step renews it while it runs ([`while_owned`]). A process that died holding a row holds it up this long.
pub(super) const ROW_LEASE: Duration = Duration::from_secs(30);

/// The states in which a row still has something to do.
pub(super) const OPEN: [ProviderBatchState; 5] = [
    ProviderBatchState::Preparing,
    ProviderBatchState::Uploading,
    ProviderBatchState::Submitted,
    ProviderBatchState::Cancelling,
    ProviderBatchState::Ended,
];

/// Now, as leases are judged: by PostgreSQL's clock there (as job leases are), by
/// this process's on SQLite, which has one process.
fn now(backend: DbBackend) -> SimpleExpr {
    if backend == DbBackend::Postgres {
        Expr::cust(POSTGRES_CLOCK)
    } else {
        Expr::value(Timestamp::now())
    }
}

/// A lease that nobody holds (never taken, or lapsed).
fn free(backend: DbBackend) -> Condition {
    Condition::any()
        .add(provider_batches::Column::LeaseUntil.is_null())
        .add(Expr::col(provider_batches::Column::LeaseUntil).lt(now(backend)))
}

/// The open rows due a look whose lease is free.
fn due_rows(backend: DbBackend) -> Select<provider_batches::Entity> {
    provider_batches::Entity::find()
        .filter(provider_batches::Column::State.is_in(OPEN))
        .filter(provider_batches::Column::NextPollAt.lte(Timestamp::now()))
        .filter(free(backend))
}

/// The providers with open rows due a look whose lease is free.
pub(super) async fn due_providers(db: &impl ConnectionTrait) -> Result<Vec<String>, DbErr> {
    due_rows(db.get_database_backend())
        .select_only()
        .column(provider_batches::Column::Provider)
        .distinct()
        .into_tuple()
        .all(db)
        .await
}

/// At most `at_most` of `provider`'s open rows due a look whose lease is free, the
/// longest due first.
pub(super) async fn due(
    db: &impl ConnectionTrait,
    provider: &str,
    at_most: usize,
) -> Result<Vec<provider_batches::Model>, DbErr> {
    due_rows(db.get_database_backend())
        .filter(provider_batches::Column::Provider.eq(provider))
        .order_by_asc(provider_batches::Column::NextPollAt)
        .limit(at_most as u64)
        .all(db)
        .await
}

/// Takes the row under `token` if its lease is free; the row as taken.
pub(super) async fn take(
    db: &impl ConnectionTrait,
    id: Uuid,
    token: Uuid,
) -> Result<Option<provider_batches::Model>, DbErr> {
    let backend = db.get_database_backend();
    Ok(provider_batches::Entity::update_many()
        .col_expr(provider_batches::Column::RunToken, Expr::value(token))
        .col_expr(
            provider_batches::Column::LeaseUntil,
            crate::db::lease_until(backend, ROW_LEASE),
        )
        .filter(provider_batches::Column::Id.eq(id))
        .filter(provider_batches::Column::State.is_in(OPEN))
        .filter(free(backend))
        .exec_with_returning(db)
        .await?
        .into_iter()
        .next())
}

/// An update of the row that matches only while `token` owns it; it renews the lease.
pub(super) fn fenced(
    backend: DbBackend,
    id: Uuid,
    token: Uuid,
) -> UpdateMany<provider_batches::Entity> {
    provider_batches::Entity::update_many()
        .col_expr(
            provider_batches::Column::LeaseUntil,
            crate::db::lease_until(backend, ROW_LEASE),
        )
        .filter(provider_batches::Column::Id.eq(id))
        .filter(provider_batches::Column::RunToken.eq(token))
}

/// Runs a fenced update; the row as written, `None` when the token lost it.
pub(super) async fn write(
    db: &impl ConnectionTrait,
    update: UpdateMany<provider_batches::Entity>,
) -> Result<Option<provider_batches::Model>, DbErr> {
    Ok(update.exec_with_returning(db).await?.into_iter().next())
}

/// Gives the row up: the next round (of any process) may take it at once.
pub(super) async fn release(db: &impl ConnectionTrait, id: Uuid, token: Uuid) -> Result<(), DbErr> {
    provider_batches::Entity::update_many()
        .col_expr(
            provider_batches::Column::RunToken,
            Expr::value(Option::<Uuid>::None),
        )
        .col_expr(
            provider_batches::Column::LeaseUntil,
            Expr::value(Option::<Timestamp>::None),
        )
        .filter(provider_batches::Column::Id.eq(id))
        .filter(provider_batches::Column::RunToken.eq(token))
        .exec(db)
        .await?;
    Ok(())
}

/// Runs `work` (a step of the row: an upload, a read, a search, the results, any of
/// which may take longer than a lease) while renewing the row's lease, so that no
/// other process takes the row and asks the provider again, or searches for (or
/// makes again) an upload still in flight. Should the token lose the row all the
/// same (its renewals failed for a lease, or the process was paused past it),
/// renewing stops and `work` still runs to its end: every write of it is fenced, and
/// a request of an upload already on its way may have created the batch, which only
/// its answer says ([`super::orphans`]); the [`OwnerGate`] keeps it from sending
/// anything more.
pub(super) async fn while_owned<T>(
    db: &impl ConnectionTrait,
    id: Uuid,
    token: Uuid,
    work: impl Future<Output = T>,
) -> T {
    let backend = db.get_database_backend();
    let mut work = std::pin::pin!(work);
    let renew = async {
        loop {
            tokio::time::sleep(ROW_LEASE / 4).await;
            match write(db, fenced(backend, id, token)).await {
                Ok(Some(_)) => {}
                Ok(None) => return,
                // Tried again at the next beat; the lease outlasts three failures.
                Err(error) => {
                    tracing::warn!(provider_batch.id = %id, error = %error, "renewing a provider batch's lease during a step failed")
                }
            }
        }
    };
    tokio::select! {
        done = &mut work => return done,
        () = renew => {}
    }
    tracing::warn!(provider_batch.id = %id, "lost the provider batch during a step; its next owner takes it from what was written");
    work.await
}

/// The gate an upload passes before each creating request: it renews the row's lease
/// under the token and opens only if the token still owns the row. A process paused
/// past its lease (while another took the row over and found or made the upload)
/// then sends nothing more; a database it cannot reach keeps the gate shut too, since
/// ownership cannot be shown.
pub(super) struct OwnerGate<'a, C> {
    pub(super) db: &'a C,
    pub(super) id: Uuid,
    pub(super) token: Uuid,
}

#[async_trait::async_trait]
impl<C: ConnectionTrait + Send + Sync> crate::llm::batches::SendGate for OwnerGate<'_, C> {
    async fn may_send(&self) -> bool {
        // The time of the send, too: a search for the upload waits a grace period
        // from it.
        let renewed = write(
            self.db,
            fenced(self.db.get_database_backend(), self.id, self.token).col_expr(
                provider_batches::Column::SentAt,
                Expr::value(Timestamp::now()),
            ),
        )
        .await;
        match renewed {
            Ok(Some(_)) => true,
            Ok(None) => {
                tracing::warn!(provider_batch.id = %self.id, "lost the provider batch during its upload; its next owner finds the upload");
                false
            }
            Err(error) => {
                tracing::warn!(provider_batch.id = %self.id, error = %error, "could not renew a provider batch's lease before a request of its upload; nothing is sent");
                false
            }
        }
    }
}
