//! Connecting to the database and the transaction rules both backends share.

use migration::{Migrator, MigratorTrait};
use sea_orm::sqlx::sqlite::{SqliteConnectOptions, SqliteJournalMode, SqliteSynchronous};
use sea_orm::{
    ConnectOptions, Database, DatabaseConnection, DatabaseTransaction, DbBackend, DbErr,
    SqliteTransactionMode, TransactionOptions, TransactionTrait,
};
use std::time::Duration;

/// Connections in the pool. SQLite serialises writers anyway; several connections
/// let readers (subscriptions, dashboards) proceed while a write commits.
const POOL_SIZE: u32 = 16;
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

/// Applies every pending migration.
pub async fn migrate(db: &DatabaseConnection) -> Result<(), DbErr> {
    Migrator::up(db, None).await
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
