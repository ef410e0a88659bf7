//! The billing audit behind `jobledger audit`: recomputes every balance from the
//! ledger and checks each invariant of DESIGN.md "Credits" against the rows.
//!
//! Each [`Invariant`] checks one relation between two sources, so that one corrupted
//! row names one invariant: the cached balance against the ledger replay, the replay
//! against the rows that explain it (grants, open reservations, charges), each
//! reservation against its own amounts, its ledger entries and its job, each job
//! against its charge, each attempt's cost, each reconciliation against its attempt.
//!
//! Sums are aggregate SQL per page of tenants; jobs are read a page at a time with only
//! their own reservation, charges and ledger totals, so memory stays bounded by the
//! page size, not by the size of the database. [`audit_snapshot`] runs the whole audit
//! in one read-only snapshot, so a live system cannot show it a half-written state.

use super::Credits;
use super::ledger::{self, Balance};
use entity::{
    AttemptOutcome, JobStatus, LedgerEntryKind, ReservationStatus, attempt_reconciliations,
    attempts, charges, credit_grants, credit_reservations, jobs, ledger_entries, tenants,
};
use sea_orm::sea_query::{Expr, ExprTrait, Query};
use sea_orm::{
    AccessMode, ColumnTrait, Condition, ConnectOptions, ConnectionTrait, Database,
    DatabaseConnection, DbBackend, DbErr, EntityTrait, FromQueryResult, IsolationLevel, JoinType,
    PaginatorTrait, QueryFilter, QueryOrder, QuerySelect, RelationTrait, Select, TransactionTrait,
};
use std::collections::HashMap;
use std::fmt;
use std::time::Duration;
use uuid::Uuid;

/// Violations kept per invariant; the report counts the rest.
pub const VIOLATIONS_SHOWN: usize = 20;
/// Tenants or jobs read per page by [`audit`].
pub const PAGE_SIZE: u64 = 500;

/// One invariant of DESIGN.md "Credits", as the audit names it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Invariant {
    /// A tenant's cached granted, held and charged equal a replay of its ledger.
    BalanceMatchesLedger,
    /// A tenant's available = granted − charged − held is never negative (nor are held
    /// and charged).
    AvailableNonNegative,
    /// The ledger's granted equals the sum of the tenant's credit grants.
    GrantedEqualsGrants,
    /// The ledger's held equals the sum of the tenant's open (`held`) reservations.
    HeldEqualsOpenReservations,
    /// The ledger's charged equals the sum of the tenant's charges.
    ChargedEqualsCharges,
    /// A held reservation has settled = released = 0; a resolved one settled ≤ amount
    /// and settled + released = amount; a released one settled = 0.
    ReservationAmountsConsistent,
    /// A reservation is held once and resolves at most once: one hold entry of its
    /// amount, no charge or release entry while held, at most one of each after, equal
    /// to its settled and released amounts.
    ReservationResolvedOnce,
    /// Succeeded jobs have settled reservations, failed and cancelled jobs settled
    /// (when their attempts charged something) or released ones, queued and running
    /// jobs held ones: no hold is left open on a finished job.
    ReservationMatchesJobStatus,
    /// Every job has exactly one reservation, of its own tenant, and every reservation
    /// belongs to a job.
    OneReservationPerJob,
    /// A job's charge is what its attempts charged: a succeeded job has exactly one
    /// charge, naming its succeeded attempt; a failed or cancelled job one exactly when
    /// its attempts carry customer charges (streamed output, unknown outcomes the policy
    /// passes on), naming one of them; a queued or running job none. The charge equals
    /// the settled amount and the sum of the attempts' charges capped at the hold.
    ChargeMatchesAttempts,
    /// An attempt carries an exact cost or, when its outcome is unknown, an upper bound —
    /// never neither — and neither is negative.
    UnknownCostHasUpperBound,
    /// A reconciled attempt carries exactly the cost its reconciliation recorded.
    ReconciliationMatchesAttempt,
}

impl Invariant {
    /// Every invariant, in report order.
    pub const ALL: [Self; 12] = [
        Self::BalanceMatchesLedger,
        Self::AvailableNonNegative,
        Self::GrantedEqualsGrants,
        Self::HeldEqualsOpenReservations,
        Self::ChargedEqualsCharges,
        Self::ReservationAmountsConsistent,
        Self::ReservationResolvedOnce,
        Self::ReservationMatchesJobStatus,
        Self::OneReservationPerJob,
        Self::ChargeMatchesAttempts,
        Self::UnknownCostHasUpperBound,
        Self::ReconciliationMatchesAttempt,
    ];

    /// The name the report prints.
    pub fn name(self) -> &'static str {
        match self {
            Self::BalanceMatchesLedger => "balance_matches_ledger",
            Self::AvailableNonNegative => "available_non_negative",
            Self::GrantedEqualsGrants => "granted_equals_grants",
            Self::HeldEqualsOpenReservations => "held_equals_open_reservations",
            Self::ChargedEqualsCharges => "charged_equals_charges",
            Self::ReservationAmountsConsistent => "reservation_amounts_consistent",
            Self::ReservationResolvedOnce => "reservation_resolved_once",
            Self::ReservationMatchesJobStatus => "reservation_matches_job_status",
            Self::OneReservationPerJob => "one_reservation_per_job",
            Self::ChargeMatchesAttempts => "charge_matches_attempts",
            Self::UnknownCostHasUpperBound => "unknown_cost_has_upper_bound",
            Self::ReconciliationMatchesAttempt => "reconciliation_matches_attempt",
        }
    }

    /// What the invariant checks each of.
    fn unit(self) -> &'static str {
        match self {
            Self::BalanceMatchesLedger
            | Self::AvailableNonNegative
            | Self::GrantedEqualsGrants
            | Self::HeldEqualsOpenReservations
            | Self::ChargedEqualsCharges => "tenants",
            Self::ReservationAmountsConsistent | Self::ReservationResolvedOnce => "reservations",
            Self::ReservationMatchesJobStatus
            | Self::OneReservationPerJob
            | Self::ChargeMatchesAttempts => "jobs",
            Self::UnknownCostHasUpperBound => "attempts",
            Self::ReconciliationMatchesAttempt => "reconciliations",
        }
    }

    fn index(self) -> usize {
        Self::ALL
            .iter()
            .position(|invariant| *invariant == self)
            .expect("ALL lists every invariant")
    }
}

impl fmt::Display for Invariant {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// The row a violation is about.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Subject {
    Tenant(Uuid),
    Job(Uuid),
    Reservation(Uuid),
    Charge(Uuid),
    Attempt(Uuid),
    Reconciliation(Uuid),
}

impl fmt::Display for Subject {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Tenant(id) => write!(f, "tenant {id}"),
            Self::Job(id) => write!(f, "job {id}"),
            Self::Reservation(id) => write!(f, "reservation {id}"),
            Self::Charge(id) => write!(f, "charge {id}"),
            Self::Attempt(id) => write!(f, "attempt {id}"),
            Self::Reconciliation(id) => write!(f, "reconciliation {id}"),
        }
    }
}

/// One broken instance of an invariant.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Violation {
    pub subject: Subject,
    pub detail: String,
}

impl fmt::Display for Violation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}", self.subject, self.detail)
    }
}

/// How one invariant fared.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct InvariantCheck {
    pub invariant: Invariant,
    /// How many tenants, jobs, reservations, attempts or reconciliations were checked.
    pub checked: u64,
    /// Every violation found, shown or not.
    pub violation_count: u64,
    /// The first [`VIOLATIONS_SHOWN`] violations.
    pub violations: Vec<Violation>,
}

impl InvariantCheck {
    /// Whether the invariant holds everywhere.
    pub fn is_ok(&self) -> bool {
        self.violation_count == 0
    }
}

/// What the audit found, one entry per invariant in [`Invariant::ALL`] order.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct AuditReport {
    pub checks: Vec<InvariantCheck>,
}

impl AuditReport {
    /// Whether every invariant holds.
    pub fn is_clean(&self) -> bool {
        self.checks.iter().all(InvariantCheck::is_ok)
    }

    /// How one invariant fared.
    pub fn check(&self, invariant: Invariant) -> &InvariantCheck {
        &self.checks[invariant.index()]
    }

    /// The invariants that do not hold, in report order.
    pub fn violated(&self) -> Vec<Invariant> {
        self.checks
            .iter()
            .filter(|check| !check.is_ok())
            .map(|check| check.invariant)
            .collect()
    }
}

/// One line per invariant — `OK` or `VIOLATED` with the count — then the first
/// violations indented under it, and a verdict.
impl fmt::Display for AuditReport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for check in &self.checks {
            let name = check.invariant.name();
            let unit = check.invariant.unit();
            if check.is_ok() {
                writeln!(f, "OK        {name} ({} {unit} checked)", check.checked)?;
                continue;
            }
            let plural = if check.violation_count == 1 { "" } else { "s" };
            writeln!(
                f,
                "VIOLATED  {name}: {} violation{plural} ({} {unit} checked)",
                check.violation_count, check.checked
            )?;
            for violation in &check.violations {
                writeln!(f, "          - {violation}")?;
            }
            let hidden = check.violation_count - check.violations.len() as u64;
            if hidden > 0 {
                writeln!(f, "          … and {hidden} more")?;
            }
        }
        let violated = self.violated().len();
        if violated == 0 {
            writeln!(f, "clean: all {} invariants hold", self.checks.len())
        } else {
            writeln!(
                f,
                "NOT CLEAN: {violated} of {} invariants violated",
                self.checks.len()
            )
        }
    }
}

/// Collects checks and violations while the audit runs.
struct Recorder {
    checks: Vec<InvariantCheck>,
}

impl Recorder {
    fn new() -> Self {
        Self {
            checks: Invariant::ALL
                .iter()
                .map(|invariant| InvariantCheck {
                    invariant: *invariant,
                    checked: 0,
                    violation_count: 0,
                    violations: Vec::new(),
                })
                .collect(),
        }
    }

    fn checked(&mut self, invariant: Invariant, count: u64) {
        self.checks[invariant.index()].checked += count;
    }

    fn violation(&mut self, invariant: Invariant, subject: Subject, detail: impl Into<String>) {
        let check = &mut self.checks[invariant.index()];
        check.violation_count += 1;
        if check.violations.len() < VIOLATIONS_SHOWN {
            check.violations.push(Violation {
                subject,
                detail: detail.into(),
            });
        }
    }

    /// Counts violations found by a query of their own, keeping the ones it listed.
    fn violations(&mut self, invariant: Invariant, count: u64, shown: Vec<Violation>) {
        let check = &mut self.checks[invariant.index()];
        check.violation_count += count;
        let room = VIOLATIONS_SHOWN.saturating_sub(check.violations.len());
        check.violations.extend(shown.into_iter().take(room));
    }

    fn finish(self) -> AuditReport {
        AuditReport {
            checks: self.checks,
        }
    }
}

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
    audit_tenants(db, &mut recorder, page_size).await?;
    audit_jobs(db, &mut recorder, page_size).await?;
    audit_orphans(db, &mut recorder).await?;
    audit_attempts(db, &mut recorder).await?;
    audit_reconciliations(db, &mut recorder).await?;
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

/// Sums of `amount` per tenant over the rows `select` picks, for the tenants in `ids`.
async fn sums_by_tenant<E: EntityTrait>(
    db: &impl ConnectionTrait,
    select: Select<E>,
    tenant_id: E::Column,
    amount: E::Column,
    ids: &[Uuid],
) -> Result<HashMap<Uuid, i64>, DbErr> {
    let rows: Vec<(Uuid, i64)> = select
        .select_only()
        .column(tenant_id)
        .column_as(Expr::col(amount).sum().cast_as("BIGINT"), "total")
        .filter(tenant_id.is_in(ids.iter().copied()))
        .group_by(tenant_id)
        .into_tuple()
        .all(db)
        .await?;
    Ok(rows.into_iter().collect())
}

/// Credits as the report shows them.
fn credits(nanos: i64) -> Credits {
    Credits::from_nanos(nanos)
}

async fn audit_tenants(
    db: &impl ConnectionTrait,
    recorder: &mut Recorder,
    page_size: u64,
) -> Result<(), DbErr> {
    let mut after: Option<Uuid> = None;
    loop {
        let mut query = tenants::Entity::find()
            .order_by_asc(tenants::Column::Id)
            .limit(page_size);
        if let Some(after) = after {
            query = query.filter(tenants::Column::Id.gt(after));
        }
        let page = query.all(db).await?;
        let Some(last) = page.last() else {
            return Ok(());
        };
        after = Some(last.id);
        let ids: Vec<Uuid> = page.iter().map(|tenant| tenant.id).collect();
        let grants = sums_by_tenant(
            db,
            credit_grants::Entity::find(),
            credit_grants::Column::TenantId,
            credit_grants::Column::AmountNanos,
            &ids,
        )
        .await?;
        let open_holds = sums_by_tenant(
            db,
            credit_reservations::Entity::find()
                .filter(credit_reservations::Column::Status.eq(ReservationStatus::Held)),
            credit_reservations::Column::TenantId,
            credit_reservations::Column::AmountNanos,
            &ids,
        )
        .await?;
        let charged = sums_by_tenant(
            db,
            charges::Entity::find(),
            charges::Column::TenantId,
            charges::Column::AmountNanos,
            &ids,
        )
        .await?;
        for invariant in [
            Invariant::BalanceMatchesLedger,
            Invariant::AvailableNonNegative,
            Invariant::GrantedEqualsGrants,
            Invariant::HeldEqualsOpenReservations,
            Invariant::ChargedEqualsCharges,
        ] {
            recorder.checked(invariant, page.len() as u64);
        }
        for tenant in &page {
            let subject = Subject::Tenant(tenant.id);
            let cached = Balance::from(tenant);
            let replayed = ledger::replay_balance(db, tenant.id).await?;
            if cached != replayed {
                recorder.violation(
                    Invariant::BalanceMatchesLedger,
                    subject,
                    format!(
                        "cached granted/held/charged {}/{}/{} ≠ ledger replay {}/{}/{}",
                        cached.granted,
                        cached.held,
                        cached.charged,
                        replayed.granted,
                        replayed.held,
                        replayed.charged
                    ),
                );
            }
            // Computed without saturation, so a negative amount shows as negative.
            let available = i128::from(cached.granted.nanos())
                - i128::from(cached.charged.nanos())
                - i128::from(cached.held.nanos());
            if available < 0 || cached.held.nanos() < 0 || cached.charged.nanos() < 0 {
                recorder.violation(
                    Invariant::AvailableNonNegative,
                    subject,
                    format!(
                        "granted {} − charged {} − held {} = {} nano-credits available",
                        cached.granted, cached.charged, cached.held, available
                    ),
                );
            }
            // Each ledger total against the rows that must explain it.
            let explained = [
                (
                    Invariant::GrantedEqualsGrants,
                    "granted",
                    replayed.granted,
                    "credit grants",
                    &grants,
                ),
                (
                    Invariant::HeldEqualsOpenReservations,
                    "held",
                    replayed.held,
                    "open reservations",
                    &open_holds,
                ),
                (
                    Invariant::ChargedEqualsCharges,
                    "charged",
                    replayed.charged,
                    "charges",
                    &charged,
                ),
            ];
            for (invariant, total, in_ledger, rows, by_tenant) in explained {
                let in_rows = by_tenant.get(&tenant.id).copied().unwrap_or(0);
                if in_ledger.nanos() != in_rows {
                    recorder.violation(
                        invariant,
                        subject,
                        format!("ledger {total} {in_ledger} ≠ {rows} {}", credits(in_rows)),
                    );
                }
            }
        }
        if (page.len() as u64) < page_size {
            return Ok(());
        }
    }
}

#[derive(FromQueryResult)]
struct JobRow {
    id: Uuid,
    tenant_id: Uuid,
    status: JobStatus,
}

/// A job's ledger entries of one kind.
#[derive(Clone, Copy, Debug, Default)]
struct EntryTotal {
    count: i64,
    total: i64,
}

#[derive(FromQueryResult)]
struct JobKindTotal {
    job_id: Uuid,
    kind: LedgerEntryKind,
    count: i64,
    total: i64,
}

#[derive(FromQueryResult)]
struct AttemptRow {
    id: Uuid,
    job_id: Uuid,
    outcome: AttemptOutcome,
    customer_charge_nanos: Option<i64>,
}

/// What a job's attempts charge the customer, summed.
#[derive(Debug, FromQueryResult)]
struct AttemptChargeTotal {
    job_id: Uuid,
    total: i64,
}

async fn audit_jobs(
    db: &impl ConnectionTrait,
    recorder: &mut Recorder,
    page_size: u64,
) -> Result<(), DbErr> {
    let mut after: Option<Uuid> = None;
    loop {
        let mut query = jobs::Entity::find()
            .select_only()
            .column(jobs::Column::Id)
            .column(jobs::Column::TenantId)
            .column(jobs::Column::Status)
            .order_by_asc(jobs::Column::Id)
            .limit(page_size);
        if let Some(after) = after {
            query = query.filter(jobs::Column::Id.gt(after));
        }
        let page = query.into_model::<JobRow>().all(db).await?;
        let Some(last) = page.last() else {
            return Ok(());
        };
        after = Some(last.id);
        audit_job_page(db, recorder, &page).await?;
        if (page.len() as u64) < page_size {
            return Ok(());
        }
    }
}

async fn audit_job_page(
    db: &impl ConnectionTrait,
    recorder: &mut Recorder,
    page: &[JobRow],
) -> Result<(), DbErr> {
    let ids: Vec<Uuid> = page.iter().map(|job| job.id).collect();
    let mut reservations: HashMap<Uuid, Vec<credit_reservations::Model>> = HashMap::new();
    for reservation in credit_reservations::Entity::find()
        .filter(credit_reservations::Column::JobId.is_in(ids.iter().copied()))
        .all(db)
        .await?
    {
        reservations
            .entry(reservation.job_id)
            .or_default()
            .push(reservation);
    }
    let mut job_charges: HashMap<Uuid, Vec<charges::Model>> = HashMap::new();
    for charge in charges::Entity::find()
        .filter(charges::Column::JobId.is_in(ids.iter().copied()))
        .all(db)
        .await?
    {
        job_charges.entry(charge.job_id).or_default().push(charge);
    }
    let mut entries: HashMap<(Uuid, LedgerEntryKind), EntryTotal> = HashMap::new();
    for row in ledger_entries::Entity::find()
        .select_only()
        .column(ledger_entries::Column::JobId)
        .column(ledger_entries::Column::Kind)
        .column_as(
            Expr::col(ledger_entries::Column::Id)
                .count()
                .cast_as("BIGINT"),
            "count",
        )
        .column_as(
            Expr::col(ledger_entries::Column::AmountNanos)
                .sum()
                .cast_as("BIGINT"),
            "total",
        )
        .filter(ledger_entries::Column::JobId.is_in(ids.iter().copied()))
        .group_by(ledger_entries::Column::JobId)
        .group_by(ledger_entries::Column::Kind)
        .into_model::<JobKindTotal>()
        .all(db)
        .await?
    {
        entries.insert(
            (row.job_id, row.kind),
            EntryTotal {
                count: row.count,
                total: row.total,
            },
        );
    }
    let charged_attempt_ids: Vec<Uuid> = job_charges
        .values()
        .flatten()
        .map(|charge| charge.attempt_id)
        .collect();
    let charged_attempts: HashMap<Uuid, AttemptRow> = if charged_attempt_ids.is_empty() {
        HashMap::new()
    } else {
        attempts::Entity::find()
            .select_only()
            .column(attempts::Column::Id)
            .column(attempts::Column::JobId)
            .column(attempts::Column::Outcome)
            .column(attempts::Column::CustomerChargeNanos)
            .filter(attempts::Column::Id.is_in(charged_attempt_ids))
            .into_model::<AttemptRow>()
            .all(db)
            .await?
            .into_iter()
            .map(|attempt| (attempt.id, attempt))
            .collect()
    };

    let attempt_charges: HashMap<Uuid, i64> = attempts::Entity::find()
        .select_only()
        .column(attempts::Column::JobId)
        .column_as(
            Expr::col(attempts::Column::CustomerChargeNanos)
                .sum()
                .cast_as("BIGINT"),
            "total",
        )
        .filter(attempts::Column::JobId.is_in(ids.iter().copied()))
        .group_by(attempts::Column::JobId)
        .into_model::<AttemptChargeTotal>()
        .all(db)
        .await?
        .into_iter()
        .map(|row| (row.job_id, row.total))
        .collect();

    for invariant in [
        Invariant::ReservationMatchesJobStatus,
        Invariant::OneReservationPerJob,
        Invariant::ChargeMatchesAttempts,
    ] {
        recorder.checked(invariant, page.len() as u64);
    }
    for job in page {
        let subject = Subject::Job(job.id);
        let found = reservations.get(&job.id).map_or(&[][..], Vec::as_slice);
        recorder.checked(Invariant::ReservationAmountsConsistent, found.len() as u64);
        recorder.checked(Invariant::ReservationResolvedOnce, found.len() as u64);
        let reservation = match found {
            [] => {
                recorder.violation(
                    Invariant::OneReservationPerJob,
                    subject,
                    "has no credit reservation",
                );
                None
            }
            [reservation] => Some(reservation),
            many => {
                recorder.violation(
                    Invariant::OneReservationPerJob,
                    subject,
                    format!("has {} credit reservations", many.len()),
                );
                None
            }
        };
        if let Some(reservation) = reservation {
            if reservation.tenant_id != job.tenant_id {
                recorder.violation(
                    Invariant::OneReservationPerJob,
                    subject,
                    format!(
                        "its reservation {} belongs to tenant {}, the job to tenant {}",
                        reservation.id, reservation.tenant_id, job.tenant_id
                    ),
                );
            }
            check_reservation_amounts(recorder, subject, reservation);
            check_reservation_entries(recorder, subject, reservation, &entries);
            check_reservation_status(recorder, subject, job.status, reservation);
        }
        let charges = job_charges.get(&job.id).map_or(&[][..], Vec::as_slice);
        let attempts_charged = attempt_charges.get(&job.id).copied().unwrap_or(0);
        check_charges(
            recorder,
            job,
            reservation,
            charges,
            attempts_charged,
            &charged_attempts,
        );
    }
    Ok(())
}

fn check_reservation_amounts(
    recorder: &mut Recorder,
    subject: Subject,
    reservation: &credit_reservations::Model,
) {
    let amount = reservation.amount_nanos;
    let settled = reservation.settled_amount_nanos;
    let released = reservation.released_amount_nanos;
    let shown = format!(
        "{:?} reservation of {}: settled {}, released {}",
        reservation.status,
        credits(amount),
        credits(settled),
        credits(released)
    );
    let problem = if amount < 0 || settled < 0 || released < 0 {
        Some("an amount is negative")
    } else {
        match reservation.status {
            ReservationStatus::Held if settled != 0 || released != 0 => {
                Some("an open hold has settled or released something")
            }
            ReservationStatus::Held => None,
            ReservationStatus::Settled | ReservationStatus::Released if settled > amount => {
                Some("settled above the hold")
            }
            ReservationStatus::Settled | ReservationStatus::Released
                if i128::from(settled) + i128::from(released) != i128::from(amount) =>
            {
                Some("settled + released ≠ the hold")
            }
            ReservationStatus::Released if settled != 0 => {
                Some("a released hold has a settled part")
            }
            ReservationStatus::Settled | ReservationStatus::Released => None,
        }
    };
    if let Some(problem) = problem {
        recorder.violation(
            Invariant::ReservationAmountsConsistent,
            subject,
            format!("{shown}: {problem}"),
        );
    }
}

fn check_reservation_entries(
    recorder: &mut Recorder,
    subject: Subject,
    reservation: &credit_reservations::Model,
    entries: &HashMap<(Uuid, LedgerEntryKind), EntryTotal>,
) {
    let entry = |kind| {
        entries
            .get(&(reservation.job_id, kind))
            .copied()
            .unwrap_or_default()
    };
    let (hold, charge, release) = (
        entry(LedgerEntryKind::Hold),
        entry(LedgerEntryKind::Charge),
        entry(LedgerEntryKind::Release),
    );
    let mut problems = Vec::new();
    if hold.count != 1 || hold.total != reservation.amount_nanos {
        problems.push(format!(
            "{} hold entries totalling {} for a hold of {}",
            hold.count,
            credits(hold.total),
            credits(reservation.amount_nanos)
        ));
    }
    // What the ledger must show once the reservation is resolved: one charge entry
    // when settled (even of zero), one release entry when anything was released.
    let (charges_wanted, releases_wanted) = match reservation.status {
        ReservationStatus::Held => (0, 0),
        ReservationStatus::Settled => (1, i64::from(reservation.released_amount_nanos > 0)),
        ReservationStatus::Released => (0, i64::from(reservation.released_amount_nanos > 0)),
    };
    if charge.count > 1 || release.count > 1 {
        problems.push(format!(
            "resolved more than once: {} charge and {} release entries",
            charge.count, release.count
        ));
    } else if charge.count != charges_wanted || release.count != releases_wanted {
        problems.push(format!(
            "a {:?} reservation with {} charge and {} release entries",
            reservation.status, charge.count, release.count
        ));
    }
    if charge.count <= 1
        && release.count <= 1
        && reservation.status != ReservationStatus::Held
        && (charge.total != reservation.settled_amount_nanos
            || release.total != reservation.released_amount_nanos)
    {
        problems.push(format!(
            "ledger charged {} and released {}, the reservation settled {} and released {}",
            credits(charge.total),
            credits(release.total),
            credits(reservation.settled_amount_nanos),
            credits(reservation.released_amount_nanos)
        ));
    }
    if !problems.is_empty() {
        recorder.violation(
            Invariant::ReservationResolvedOnce,
            subject,
            problems.join("; "),
        );
    }
}

fn check_reservation_status(
    recorder: &mut Recorder,
    subject: Subject,
    status: JobStatus,
    reservation: &credit_reservations::Model,
) {
    let wanted: &[ReservationStatus] = match status {
        JobStatus::Succeeded => &[ReservationStatus::Settled],
        JobStatus::Failed | JobStatus::Cancelled => {
            &[ReservationStatus::Released, ReservationStatus::Settled]
        }
        JobStatus::Queued | JobStatus::Running => &[ReservationStatus::Held],
    };
    if !wanted.contains(&reservation.status) {
        recorder.violation(
            Invariant::ReservationMatchesJobStatus,
            subject,
            format!(
                "a {status:?} job's reservation is {:?}, not one of {wanted:?}",
                reservation.status
            ),
        );
    }
}

fn check_charges(
    recorder: &mut Recorder,
    job: &JobRow,
    reservation: Option<&credit_reservations::Model>,
    charges: &[charges::Model],
    attempts_charged: i64,
    charged_attempts: &HashMap<Uuid, AttemptRow>,
) {
    let subject = Subject::Job(job.id);
    let invariant = Invariant::ChargeMatchesAttempts;
    let charges_wanted = match job.status {
        JobStatus::Succeeded => 1,
        JobStatus::Failed | JobStatus::Cancelled => usize::from(attempts_charged > 0),
        JobStatus::Queued | JobStatus::Running => 0,
    };
    if charges.len() != charges_wanted {
        recorder.violation(
            invariant,
            subject,
            format!(
                "a {:?} job whose attempts charged {} has {} charge(s) totalling {}",
                job.status,
                credits(attempts_charged),
                charges.len(),
                credits(charges.iter().map(|charge| charge.amount_nanos).sum())
            ),
        );
        return;
    }
    let [charge] = charges else {
        return;
    };
    let mut problems = Vec::new();
    if let Some(reservation) = reservation {
        if charge.amount_nanos != reservation.settled_amount_nanos {
            problems.push(format!(
                "charge {} ≠ settled amount {}",
                credits(charge.amount_nanos),
                credits(reservation.settled_amount_nanos)
            ));
        }
        let wanted = std::cmp::min(attempts_charged, reservation.amount_nanos);
        if charge.amount_nanos != wanted {
            problems.push(format!(
                "charge {} ≠ the attempts' charges {} capped at the hold {}",
                credits(charge.amount_nanos),
                credits(attempts_charged),
                credits(reservation.amount_nanos)
            ));
        }
    }
    if charge.tenant_id != job.tenant_id {
        problems.push(format!(
            "the charge is on tenant {}, the job of tenant {}",
            charge.tenant_id, job.tenant_id
        ));
    }
    match charged_attempts.get(&charge.attempt_id) {
        Some(attempt) if attempt.job_id != job.id => problems.push(format!(
            "the charged attempt {} belongs to job {}",
            attempt.id, attempt.job_id
        )),
        Some(attempt)
            if job.status == JobStatus::Succeeded
                && attempt.outcome != AttemptOutcome::Succeeded =>
        {
            problems.push(format!(
                "the charged attempt {} is {:?}, not the accepted one",
                attempt.id, attempt.outcome
            ))
        }
        Some(attempt)
            if job.status != JobStatus::Succeeded
                && attempt.customer_charge_nanos.unwrap_or(0) <= 0 =>
        {
            problems.push(format!(
                "the charged attempt {} of a {:?} job charged nothing",
                attempt.id, job.status
            ))
        }
        Some(_) => {}
        None => problems.push(format!(
            "the charged attempt {} does not exist",
            charge.attempt_id
        )),
    }
    if !problems.is_empty() {
        recorder.violation(invariant, subject, problems.join("; "));
    }
}

/// Reservations and charges whose job does not exist (foreign keys forbid them; the
/// audit does not take that on trust).
async fn audit_orphans(db: &impl ConnectionTrait, recorder: &mut Recorder) -> Result<(), DbErr> {
    // NOT EXISTS, not NOT IN: PostgreSQL runs a NOT IN over a subquery that does not
    // fit in memory as a nested loop, which took minutes at 200,000 jobs.
    use sea_orm::sea_query::IntoColumnRef;
    let job_missing = |job_id: sea_orm::sea_query::ColumnRef| {
        Expr::exists(
            Query::select()
                .expr(Expr::val(1))
                .from(jobs::Entity)
                .and_where(Expr::col((jobs::Entity, jobs::Column::Id)).equals(job_id))
                .to_owned(),
        )
        .not()
    };
    let orphans = credit_reservations::Entity::find().filter(job_missing(
        (
            credit_reservations::Entity,
            credit_reservations::Column::JobId,
        )
            .into_column_ref(),
    ));
    let count = orphans.clone().count(db).await?;
    if count > 0 {
        let shown = orphans
            .limit(VIOLATIONS_SHOWN as u64)
            .all(db)
            .await?
            .into_iter()
            .map(|reservation| Violation {
                subject: Subject::Reservation(reservation.id),
                detail: format!(
                    "holds {} for job {}, which does not exist",
                    credits(reservation.amount_nanos),
                    reservation.job_id
                ),
            })
            .collect();
        recorder.violations(Invariant::OneReservationPerJob, count, shown);
    }
    let orphans = charges::Entity::find().filter(job_missing(
        (charges::Entity, charges::Column::JobId).into_column_ref(),
    ));
    let count = orphans.clone().count(db).await?;
    if count > 0 {
        let shown = orphans
            .limit(VIOLATIONS_SHOWN as u64)
            .all(db)
            .await?
            .into_iter()
            .map(|charge| Violation {
                subject: Subject::Charge(charge.id),
                detail: format!(
                    "charges {} for job {}, which does not exist",
                    credits(charge.amount_nanos),
                    charge.job_id
                ),
            })
            .collect();
        recorder.violations(Invariant::ChargeMatchesAttempts, count, shown);
    }
    Ok(())
}

async fn audit_attempts(db: &impl ConnectionTrait, recorder: &mut Recorder) -> Result<(), DbErr> {
    let invariant = Invariant::UnknownCostHasUpperBound;
    recorder.checked(invariant, attempts::Entity::find().count(db).await?);
    let broken = attempts::Entity::find().filter(
        Condition::any()
            .add(
                Condition::all()
                    .add(attempts::Column::ProviderCostNanos.is_null())
                    .add(attempts::Column::ProviderCostUpperBoundNanos.is_null()),
            )
            .add(attempts::Column::ProviderCostNanos.lt(0))
            .add(attempts::Column::ProviderCostUpperBoundNanos.lt(0)),
    );
    let count = broken.clone().count(db).await?;
    if count > 0 {
        let shown = broken
            .order_by_asc(attempts::Column::Id)
            .limit(VIOLATIONS_SHOWN as u64)
            .all(db)
            .await?
            .into_iter()
            .map(|attempt| Violation {
                subject: Subject::Attempt(attempt.id),
                detail: match (
                    attempt.provider_cost_nanos,
                    attempt.provider_cost_upper_bound_nanos,
                ) {
                    (None, None) => format!(
                        "attempt {} of job {} ({:?}) has neither an exact cost nor an upper bound",
                        attempt.number, attempt.job_id, attempt.outcome
                    ),
                    (cost, bound) => format!(
                        "attempt {} of job {} has a negative cost ({:?}) or bound ({:?}) in nano-credits",
                        attempt.number, attempt.job_id, cost, bound
                    ),
                },
            })
            .collect();
        recorder.violations(invariant, count, shown);
    }
    Ok(())
}

async fn audit_reconciliations(
    db: &impl ConnectionTrait,
    recorder: &mut Recorder,
) -> Result<(), DbErr> {
    let invariant = Invariant::ReconciliationMatchesAttempt;
    recorder.checked(
        invariant,
        attempt_reconciliations::Entity::find().count(db).await?,
    );
    let reconciled = |column: attempt_reconciliations::Column| {
        Expr::col((attempt_reconciliations::Entity, column))
    };
    let attempt = |column: attempts::Column| Expr::col((attempts::Entity, column));
    let broken = attempt_reconciliations::Entity::find()
        .join(
            JoinType::InnerJoin,
            attempt_reconciliations::Relation::Attempt.def(),
        )
        .filter(
            Condition::any()
                .add(attempts::Column::ProviderCostNanos.is_null())
                .add(attempts::Column::ProviderCostUpperBoundNanos.is_not_null())
                .add(attempt(attempts::Column::ProviderCostNanos).ne(reconciled(
                    attempt_reconciliations::Column::ProviderCostNanos,
                )))
                .add(
                    attempt(attempts::Column::JobId)
                        .ne(reconciled(attempt_reconciliations::Column::JobId)),
                )
                .add(
                    attempt(attempts::Column::TenantId)
                        .ne(reconciled(attempt_reconciliations::Column::TenantId)),
                )
                .add(
                    attempt(attempts::Column::ModelPriceId)
                        .ne(reconciled(attempt_reconciliations::Column::ModelPriceId)),
                ),
        );
    let count = broken.clone().count(db).await?;
    if count > 0 {
        let shown = broken
            .order_by_asc(attempt_reconciliations::Column::Id)
            .limit(VIOLATIONS_SHOWN as u64)
            .all(db)
            .await?;
        let attempts: HashMap<Uuid, attempts::Model> = attempts::Entity::find()
            .filter(attempts::Column::Id.is_in(shown.iter().map(|row| row.attempt_id)))
            .all(db)
            .await?
            .into_iter()
            .map(|attempt| (attempt.id, attempt))
            .collect();
        let shown = shown
            .into_iter()
            .map(|row| Violation {
                subject: Subject::Reconciliation(row.id),
                detail: match attempts.get(&row.attempt_id) {
                    Some(attempt) => format!(
                        "recorded cost {} for attempt {} of job {}, which carries cost {:?} and bound {:?} (nano-credits)",
                        credits(row.provider_cost_nanos),
                        row.attempt_id,
                        attempt.job_id,
                        attempt.provider_cost_nanos,
                        attempt.provider_cost_upper_bound_nanos
                    ),
                    None => format!("attempt {} vanished", row.attempt_id),
                },
            })
            .collect();
        recorder.violations(invariant, count, shown);
    }
    Ok(())
}
