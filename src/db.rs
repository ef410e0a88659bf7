//! Connecting to the database and the transaction rules both backends share.

pub mod bulk;
pub mod json;
mod values;

pub use values::Values;

use entity::Timestamp;
use migration::{Migrator, MigratorTrait};
use sea_orm::sqlx::postgres::PgConnectOptions;
use sea_orm::sqlx::sqlite::{SqliteConnectOptions, SqliteJournalMode, SqliteSynchronous};
use sea_orm::{
    ConnectOptions, ConnectionTrait, Database, DatabaseConnection, DatabaseTransaction, DbBackend,
    DbErr, ExecResult, QueryResult, RuntimeErr, SqlErr, SqliteTransactionMode, Statement,
    TransactionOptions, TransactionTrait,
};
use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::{Arc, LazyLock, Mutex};
use std::time::Duration;
use tokio::sync::OwnedMutexGuard;

/// Connections in the pool. SQLite serialises writers anyway; several connections
/// let readers (subscriptions, dashboards) proceed while a write commits.
pub const POOL_SIZE: u32 = 16;
/// Connections of the pool that the background tasks of `serve` share (webhook
/// dispatcher, credit expiry, retention, the metrics gauges): each runs a statement
/// or a small batch at a time.
pub const BACKGROUND_POOL_SIZE: u32 = 4;
/// How long a SQLite writer waits for the write lock before giving up.
const SQLITE_BUSY_TIMEOUT: Duration = Duration::from_secs(30);
/// How long PostgreSQL lets a session sit idle inside a transaction before ending it.
/// Every transaction here runs its statements back to back; one that idles is a
/// process stopped or frozen mid-transaction (a paused VM, a SIGSTOP, a stuck
/// thread), and the rows it locked (a tenant's balance, a job) would stop every other
/// process's writes to them until it resumes.
pub const IDLE_IN_TRANSACTION_TIMEOUT: Duration = Duration::from_secs(30);

/// Opens a pool on `url` (`sqlite:…` or `postgres://…`).
///
/// SQLite runs in WAL mode with a busy timeout, so that several connections can share
/// one file; every read-then-write transaction begins IMMEDIATE (see [`begin_write`]).
/// PostgreSQL ends a transaction left idle for [`IDLE_IN_TRANSACTION_TIMEOUT`].
pub async fn connect(url: &str) -> Result<DatabaseConnection, DbErr> {
    connect_sized(url, POOL_SIZE).await
}

/// [`connect`] with a pool of at most `size` connections.
pub async fn connect_sized(url: &str, size: u32) -> Result<DatabaseConnection, DbErr> {
    connect_pool(url, size, Reach::Direct).await
}

/// How a process's pools reach PostgreSQL.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Reach {
    /// Straight to the server: each connection asks for the idle-in-transaction
    /// timeout in its startup packet as well.
    Direct,
    /// Through a transaction-mode pooler, which refuses startup options: the timeout
    /// comes from the database's own setting, written at migrate.
    Pooler,
}

/// A pool of at most `size` connections reaching `url` as `reach` says.
pub async fn connect_pool(url: &str, size: u32, reach: Reach) -> Result<DatabaseConnection, DbErr> {
    let mut options = ConnectOptions::new(url);
    options
        .max_connections(size)
        .acquire_timeout(Duration::from_secs(30))
        .sqlx_logging(false)
        .map_sqlx_sqlite_opts(|options: SqliteConnectOptions| {
            options
                .create_if_missing(true)
                .journal_mode(SqliteJournalMode::Wal)
                .synchronous(SqliteSynchronous::Normal)
                .busy_timeout(SQLITE_BUSY_TIMEOUT)
                .foreign_keys(true)
        })
        .map_sqlx_postgres_opts(move |options: PgConnectOptions| match reach {
            Reach::Direct => options.options([(
                "idle_in_transaction_session_timeout",
                idle_in_transaction_timeout(),
            )]),
            Reach::Pooler => options,
        });
    Database::connect(options).await
}

/// [`IDLE_IN_TRANSACTION_TIMEOUT`] as PostgreSQL reads a setting.
fn idle_in_transaction_timeout() -> String {
    format!("{}ms", IDLE_IN_TRANSACTION_TIMEOUT.as_millis())
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
    Migrator::up(transaction.inner(), None).await?;
    transaction.commit().await?;
    if db.get_database_backend() == DbBackend::Postgres {
        set_database_timeout(db).await;
    }
    Ok(())
}

/// Makes [`IDLE_IN_TRANSACTION_TIMEOUT`] the database's own default, so that
/// connections through a pooler, which cannot ask for it at startup, have it too. Only
/// the database's owner (or a superuser) may: for anyone else it is a warning, and
/// pooled connections then go without it.
async fn set_database_timeout(db: &DatabaseConnection) {
    let statement = format!(
        "DO $$ BEGIN EXECUTE format('ALTER DATABASE %I SET idle_in_transaction_session_timeout = %L', \
         current_database(), '{}'); END $$",
        idle_in_transaction_timeout()
    );
    if let Err(error) = db.execute_unprepared(&statement).await {
        tracing::warn!(
            error = %error,
            "could not make the idle-in-transaction timeout the database's default; \
             connections through a pooler go without it"
        );
    }
}

/// How many migrations this binary knows that the database has not applied, from one
/// read of the migrations table. On PostgreSQL the read gives up after `timeout` on
/// the server as well (statement and lock timeouts), so a database stuck behind a lock
/// hands the connection back then instead of keeping it until the lock goes.
pub async fn pending_migrations(
    db: &DatabaseConnection,
    timeout: Duration,
) -> Result<usize, DbErr> {
    let transaction = db.begin().await?;
    if db.get_database_backend() == DbBackend::Postgres {
        let milliseconds = timeout.as_millis();
        transaction
            .execute_unprepared(&format!(
                "SET LOCAL statement_timeout = {milliseconds}; SET LOCAL lock_timeout = {milliseconds}"
            ))
            .await?;
    }
    let applied: std::collections::HashSet<String> = transaction
        .query_all_raw(Statement::from_string(
            db.get_database_backend(),
            "SELECT version FROM seaql_migrations",
        ))
        .await?
        .into_iter()
        .map(|row| row.try_get_by_index::<String>(0))
        .collect::<Result<_, _>>()?;
    transaction.rollback().await?;
    Ok(Migrator::migrations()
        .iter()
        .filter(|migration| !applied.contains(migration.name()))
        .count())
}

/// The PostgreSQL server's clock in microseconds since the epoch, as SQL: leases are
/// written and judged by it, so that a process whose own clock runs ahead never takes
/// back a job that another process is still renewing. (`clock_timestamp()`, not
/// `now()`: the latter stands still for a whole transaction.)
pub const POSTGRES_CLOCK: &str = "(EXTRACT(EPOCH FROM clock_timestamp()) * 1000000)::bigint";

/// Now by the clock that leases are judged with: the PostgreSQL server's, which every
/// process shares; on SQLite this process's own (its file is shared only by processes
/// on one machine).
pub async fn lease_clock(db: &impl ConnectionTrait) -> Result<Timestamp, DbErr> {
    if db.get_database_backend() != DbBackend::Postgres {
        return Ok(Timestamp::now());
    }
    let row = db
        .query_one_raw(Statement::from_string(
            DbBackend::Postgres,
            format!("SELECT {POSTGRES_CLOCK} AS now"),
        ))
        .await?
        .ok_or_else(|| DbErr::Custom("the server did not tell the time".into()))?;
    Ok(Timestamp(row.try_get::<i64>("", "now")?))
}

/// `lease_until` for a lease of `lease` taken now, as a SQL expression on PostgreSQL
/// (by the server's clock) and a value on SQLite.
pub fn lease_until(backend: DbBackend, lease: Duration) -> sea_orm::sea_query::SimpleExpr {
    let micros = i64::try_from(lease.as_micros()).unwrap_or(i64::MAX / 2);
    if backend == DbBackend::Postgres {
        sea_orm::sea_query::Expr::cust(format!("{POSTGRES_CLOCK} + {micros}"))
    } else {
        sea_orm::sea_query::Expr::value(Timestamp(Timestamp::now().micros().saturating_add(micros)))
    }
}

/// Whether the database refused a statement because of a conflict on a unique index.
pub fn is_unique_violation(error: &DbErr) -> bool {
    matches!(error.sql_err(), Some(SqlErr::UniqueConstraintViolation(_)))
}

/// Whether an error may go away if the same statement is tried again: the connection
/// or the pool failed, or the database asked the transaction to retry (a lock, a
/// serialization failure, a shutdown), or it takes no writes for now (a read-only
/// transaction after a failover, an object not yet in the state the statement needs).
/// A statement the database refused for what it holds (a data or constraint error, a
/// trigger) fails the same way every time.
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
        // failure, deadlock), insufficient resources, object not in prerequisite state
        // (55000, lock not available), operator intervention (shutdown, 57P0x); and
        // 25006, a read-only transaction: a standby, or a primary being failed over.
        code == "25006"
            || ["08", "40", "53", "55", "57"]
                .iter()
                .any(|class| code.starts_with(class))
    } else {
        // SQLite's extended result codes: SQLITE_BUSY (5) and SQLITE_LOCKED (6) and
        // their variants.
        code.parse::<i64>()
            .is_ok_and(|code| matches!(code % 256, 5 | 6))
    }
}

/// A transaction that will write. On SQLite it also holds this process's turn to
/// write to the file (see [`begin_write`]) until it commits, rolls back or drops.
pub struct WriteTransaction {
    transaction: DatabaseTransaction,
    _turn: Option<OwnedMutexGuard<()>>,
}

impl WriteTransaction {
    /// Commits, and lets the next writer of this process in.
    pub async fn commit(self) -> Result<(), DbErr> {
        self.transaction.commit().await
    }

    /// Rolls back, and lets the next writer of this process in.
    pub async fn rollback(self) -> Result<(), DbErr> {
        self.transaction.rollback().await
    }

    /// The transaction itself, for APIs that want SeaORM's own type.
    pub fn inner(&self) -> &DatabaseTransaction {
        &self.transaction
    }
}

#[async_trait::async_trait]
impl ConnectionTrait for WriteTransaction {
    fn get_database_backend(&self) -> DbBackend {
        self.transaction.get_database_backend()
    }

    async fn execute_raw(&self, statement: Statement) -> Result<ExecResult, DbErr> {
        self.transaction.execute_raw(statement).await
    }

    async fn execute_unprepared(&self, sql: &str) -> Result<ExecResult, DbErr> {
        self.transaction.execute_unprepared(sql).await
    }

    async fn query_one_raw(&self, statement: Statement) -> Result<Option<QueryResult>, DbErr> {
        self.transaction.query_one_raw(statement).await
    }

    async fn query_all_raw(&self, statement: Statement) -> Result<Vec<QueryResult>, DbErr> {
        self.transaction.query_all_raw(statement).await
    }
}

/// Each SQLite file's turn to write, shared by every pool of this process on it.
static SQLITE_WRITERS: LazyLock<Mutex<HashMap<PathBuf, Arc<tokio::sync::Mutex<()>>>>> =
    LazyLock::new(Default::default);

/// Begins a transaction that will write. On SQLite it takes the write lock at BEGIN:
/// a deferred transaction that reads first and writes later can fail with "database
/// is locked" when another writer got in between, whatever the busy timeout. And the
/// writers of one process take turns in the order they asked (a queue in memory)
/// before asking SQLite, whose busy handler would otherwise have them sleep and retry
/// — slower, and in no order, so that one unlucky writer could wait for hundreds of
/// milliseconds under load.
pub async fn begin_write(db: &DatabaseConnection) -> Result<WriteTransaction, DbErr> {
    if db.get_database_backend() != DbBackend::Sqlite {
        let transaction = db.begin().await?;
        return Ok(WriteTransaction {
            transaction,
            _turn: None,
        });
    }
    let file = db
        .get_sqlite_connection_pool()
        .connect_options()
        .get_filename()
        .to_path_buf();
    let gate = SQLITE_WRITERS
        .lock()
        .expect("the writers' map is never poisoned")
        .entry(file)
        .or_default()
        .clone();
    let turn = gate.lock_owned().await;
    let options = TransactionOptions {
        sqlite_transaction_mode: Some(SqliteTransactionMode::Immediate),
        ..TransactionOptions::default()
    };
    let transaction = db.begin_with_options(options).await?;
    Ok(WriteTransaction {
        transaction,
        _turn: Some(turn),
    })
}

/// The values of a hand-written statement and their numbered placeholders. A
/// statement that changes or reads many rows by a list of rows uses [`Values`], which
/// names the list's columns.
pub struct Binds {
    backend: DbBackend,
    values: Vec<sea_orm::Value>,
}

impl Binds {
    /// No values yet.
    pub fn new(backend: DbBackend) -> Self {
        Self {
            backend,
            values: Vec::new(),
        }
    }

    /// Binds `value`; returns its placeholder.
    pub fn bind(&mut self, value: impl Into<sea_orm::Value>) -> String {
        self.values.push(value.into());
        let number = self.values.len();
        match self.backend {
            DbBackend::Postgres => format!("${number}"),
            _ => format!("?{number}"),
        }
    }

    /// Binds a row of values; returns it as `(…, …)` for a `VALUES` list.
    pub fn row(&mut self, row: impl IntoIterator<Item = sea_orm::Value>) -> String {
        let placeholders: Vec<String> = row.into_iter().map(|value| self.bind(value)).collect();
        format!("({})", placeholders.join(", "))
    }

    /// The statement `sql`, with the values bound so far.
    pub fn statement(self, sql: String) -> Statement {
        Statement::from_sql_and_values(self.backend, sql, self.values)
    }
}

/// Text from outside (a provider's message or request id) as a text column can hold
/// it on both backends: NUL characters replaced by U+FFFD.
pub fn storable_text(text: String) -> String {
    if text.contains('\0') {
        text.replace('\0', "\u{FFFD}")
    } else {
        text
    }
}
