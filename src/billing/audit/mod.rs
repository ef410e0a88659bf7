//! The billing audit behind `jobledger audit`: recomputes every balance from the
//! ledger and checks each invariant of `docs/architecture.md` ("Invariants") against
//! the rows.
//!
//! Each [`Invariant`] checks one relation between two sources, so that one corrupted
//! row names one invariant: the cached balance against the ledger replay, the replay
//! against the rows that explain it (grants, grant expiries, open reservations,
//! charges), the spend counters against the jobs they count, each grant against its
//! expiry entries, each reservation against its own amounts, its ledger entries and
//! its job, each job against its charge, each attempt's cost, each reconciliation
//! against its attempt, each batch's totals against its items. One module per kind of
//! row checked.
//!
//! Sums are aggregate SQL per page of tenants; jobs are read a page at a time with only
//! their own reservation, charges and ledger totals, so memory stays bounded by the
//! page size, not by the size of the database. [`audit_snapshot`] runs the whole audit
//! in one read-only snapshot, so a live system cannot show it a half-written state.

mod attempts;
mod balances;
mod batches;
mod grants;
mod jobs;
mod report;
mod spend;

pub use report::{
    AuditReport, Invariant, InvariantCheck, PAGE_SIZE, Subject, VIOLATIONS_SHOWN, Violation,
};

use report::Recorder;
use sea_orm::{
    AccessMode, ConnectOptions, ConnectionTrait, Database, DatabaseConnection, DbBackend, DbErr,
    IsolationLevel, TransactionTrait,
};
use std::time::Duration;

/// Checks every billing invariant on `db` (a connection or a transaction).
///
/// On a live database prefer [`audit_snapshot`]: outside a snapshot, a transaction
/// committing between two of the audit's reads can look like a violation.
pub async fn audit(db: &impl ConnectionTrait) -> Result<AuditReport, DbErr> {
    audit_in_pages(db, PAGE_SIZE).await
}

/// [`audit`] reading tenants and jobs `page_size` at a time (at least one); the
/// report does not depend on it. Tests use tiny pages to exercise the paging.
pub async fn audit_in_pages(
    db: &impl ConnectionTrait,
    page_size: u64,
) -> Result<AuditReport, DbErr> {
    let page_size = Ord::max(page_size, 1);
    let mut recorder = Recorder::new();
    balances::audit_tenants(db, &mut recorder, page_size).await?;
    grants::audit_grants(db, &mut recorder, page_size).await?;
    jobs::audit_jobs(db, &mut recorder, page_size).await?;
    jobs::audit_orphans(db, &mut recorder).await?;
    attempts::audit_attempts(db, &mut recorder).await?;
    attempts::audit_reconciliations(db, &mut recorder).await?;
    batches::audit_batches(db, &mut recorder, page_size).await?;
    Ok(recorder.finish())
}

/// [`audit`] in one read-only snapshot: a REPEATABLE READ, READ ONLY transaction on
/// PostgreSQL, a read transaction on SQLite (WAL readers see one snapshot). Writers
/// are not blocked.
pub async fn audit_snapshot(db: &DatabaseConnection) -> Result<AuditReport, DbErr> {
    let (isolation, access) = match db.get_database_backend() {
        DbBackend::Postgres => (
            Some(IsolationLevel::RepeatableRead),
            Some(AccessMode::ReadOnly),
        ),
        _ => (None, None),
    };
    let transaction = db.begin_with_config(isolation, access).await?;
    let report = audit(&transaction).await;
    // Nothing was written; ending the snapshot is all that is left.
    transaction.rollback().await?;
    report
}

/// A small pool for the audit. Unlike the service's connection it never creates a
/// missing SQLite file and changes no setting of the database: the audit only reads.
pub async fn connect(url: &str) -> Result<DatabaseConnection, DbErr> {
    let mut options = ConnectOptions::new(url);
    options
        .max_connections(2)
        .acquire_timeout(Duration::from_secs(30))
        .sqlx_logging(false)
        .map_sqlx_sqlite_opts(|options| {
            options
                .create_if_missing(false)
                .busy_timeout(Duration::from_secs(30))
        });
    Database::connect(options).await
}
