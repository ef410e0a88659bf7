//! Connecting to the database and the transaction rules both backends share.

use migration::{Migrator, MigratorTrait};
use sea_orm::sqlx::sqlite::{SqliteConnectOptions, SqliteJournalMode, SqliteSynchronous};
use sea_orm::{
    ConnectOptions, ConnectionTrait, Database, DatabaseConnection, DatabaseTransaction, DbBackend,
    DbErr, RuntimeErr, SqlErr, SqliteTransactionMode, Statement, TransactionOptions,
    TransactionTrait,
};
use std::time::Duration;

/// Connections in the pool. SQLite serialises writers anyway; several connections
/// let readers (subscriptions, dashboards) proceed while a write commits.
pub const POOL_SIZE: u32 = 16;
/// How long a SQLite writer waits for the write lock before giving up.
const SQLITE_BUSY_TIMEOUT: Duration = Duration::from_secs(30);

/// Opens a pool on `url` (`sqlite:…` or `postgres://…`).
///
/// SQLite runs in WAL mode with a busy timeout, so that several connections can share
/// one file; every read-then-write transaction begins IMMEDIATE (see [`begin_write`]).
pub async fn connect(url: &str) -> Result<DatabaseConnection, DbErr> {
    let mut options = ConnectOptions::new(url);
    options
        .max_connections(POOL_SIZE)
        .acquire_timeout(Duration::from_secs(30))
        .sqlx_logging(false)
        .map_sqlx_sqlite_opts(|options: SqliteConnectOptions| {
            options
                .create_if_missing(true)
                .journal_mode(SqliteJournalMode::Wal)
                .synchronous(SqliteSynchronous::Normal)
                .busy_timeout(SQLITE_BUSY_TIMEOUT)
                .foreign_keys(true)
        });
    Database::connect(options).await
}

/// Key of the PostgreSQL advisory lock that serialises migrations ("jobledgr" in ASCII).
const MIGRATION_LOCK_KEY: i64 = 0x6a6f_626c_6564_6772;

/// Applies every pending migration, one process at a time.
///
/// Processes started together against a fresh database would otherwise race to
/// create the same tables, and all but one would fail. On PostgreSQL the migration
/// runs in a transaction holding an advisory lock; on SQLite in an IMMEDIATE
/// transaction, which holds the write lock. Either way a second process waits (up to
/// the busy timeout on SQLite), then finds nothing left to apply.
pub async fn migrate(db: &DatabaseConnection) -> Result<(), DbErr> {
    tracing::info!("applying migrations (waiting for any other process migrating this database)");
    let transaction = begin_write(db).await?;
    if db.get_database_backend() == DbBackend::Postgres {
        transaction
            .execute_raw(Statement::from_sql_and_values(
                DbBackend::Postgres,
                "SELECT pg_advisory_xact_lock($1)",
                [MIGRATION_LOCK_KEY.into()],
            ))
            .await?;
    }
    Migrator::up(&transaction, None).await?;
    transaction.commit().await
}

/// How many migrations this binary knows that the database has not applied.
pub async fn pending_migrations(db: &DatabaseConnection) -> Result<usize, DbErr> {
    Ok(Migrator::get_pending_migrations(db).await?.len())
}

/// Whether the database refused a statement because of a conflict on a unique index.
pub fn is_unique_violation(error: &DbErr) -> bool {
    matches!(error.sql_err(), Some(SqlErr::UniqueConstraintViolation(_)))
}

/// Whether an error may go away if the same statement is tried again: the connection
/// or the pool failed, or the database asked the transaction to retry (a lock, a
/// serialization failure, a shutdown). A statement the database refused for what it
/// holds (a data or constraint error, a trigger) fails the same way every time.
pub fn is_transient(error: &DbErr) -> bool {
    let runtime = match error {
        DbErr::Exec(runtime) | DbErr::Query(runtime) | DbErr::Conn(runtime) => runtime,
        DbErr::ConnectionAcquire(_) => return true,
        _ => return false,
    };
    let RuntimeErr::SqlxError(error) = runtime else {
        return false;
    };
    use sea_orm::sqlx::Error;
    let refusal = match error.as_ref() {
        Error::Database(refusal) => refusal,
        // The connection failed: the statement may never have run.
        Error::Io(_)
        | Error::Tls(_)
        | Error::Protocol(_)
        | Error::PoolTimedOut
        | Error::PoolClosed
        | Error::WorkerCrashed => return true,
        _ => return false,
    };
    let code = refusal.code().unwrap_or_default();
    if refusal
        .try_downcast_ref::<sea_orm::sqlx::postgres::PgDatabaseError>()
        .is_some()
    {
        // SQLSTATE classes: connection exception, transaction rollback (serialization
        // failure, deadlock), insufficient resources, operator intervention.
        ["08", "40", "53", "57"]
            .iter()
            .any(|class| code.starts_with(class))
    } else {
        // SQLite's extended result codes: SQLITE_BUSY (5) and SQLITE_LOCKED (6) and
        // their variants.
        code.parse::<i64>()
            .is_ok_and(|code| matches!(code % 256, 5 | 6))
    }
}

/// Begins a transaction that will write. On SQLite it takes the write lock at BEGIN:
/// a deferred transaction that reads first and writes later can fail with "database
/// is locked" when another writer got in between, whatever the busy timeout.
pub async fn begin_write(db: &DatabaseConnection) -> Result<DatabaseTransaction, DbErr> {
    let options = TransactionOptions {
        sqlite_transaction_mode: (db.get_database_backend() == DbBackend::Sqlite)
            .then_some(SqliteTransactionMode::Immediate),
        ..TransactionOptions::default()
    };
    db.begin_with_options(options).await
}
