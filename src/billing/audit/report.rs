//! What the audit reports: the invariants, the rows a violation is about, and the
//! recorder that counts checks and keeps the first violations of each invariant.

use crate::billing::Credits;
use std::fmt;
use uuid::Uuid;

/// Violations kept per invariant; the report counts the rest.
pub const VIOLATIONS_SHOWN: usize = 20;
/// Tenants or jobs read per page by [`audit`].
pub const PAGE_SIZE: u64 = 500;

/// One billing invariant (`docs/architecture.md`, "Invariants"), as the audit names it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Invariant {
    /// A tenant's cached granted, held, charged and expired equal a replay of its
    /// ledger.
    BalanceMatchesLedger,
    /// A tenant's available = granted − expired − charged − held is never negative
    /// (nor are held, charged and expired): expiry never took held credit.
    AvailableNonNegative,
    /// The ledger's granted equals the sum of the tenant's credit grants.
    GrantedEqualsGrants,
    /// The ledger's held equals the sum of the tenant's open (`held`) reservations.
    HeldEqualsOpenReservations,
    /// The ledger's charged equals the sum of the tenant's charges.
    ChargedEqualsCharges,
    /// The ledger's expired equals the sum of what expired of the tenant's grants.
    ExpiredEqualsGrantExpiries,
    /// What the tenant's grants record as consumed by charges sums to the charges the
    /// tenant's row counts as attributed, which never exceed its charges.
    ChargesAttributedToGrants,
    /// A tenant's spend counters equal the charges, open holds and absorbed provider
    /// costs (a reservation's amount less what it released, plus what the operator
    /// absorbed of it) of its jobs created in the UTC day and month each counter covers.
    SpendCountersMatchJobs,
    /// A grant never loses more than it had: consumed + expired ≤ amount, neither
    /// negative; only a grant with an expiry has expiry entries, dated at it, summing
    /// to what expired of it; every expiry entry names a grant of its own tenant.
    GrantExpiryWithinGrant,
    /// No charge consumes credit after its grant's expiry: what is left of a lapsed
    /// grant is exactly what it still backs of holds taken before its instant, each
    /// backing used up only by its own hold's charge (never more than the hold
    /// settled) or expired once the hold resolved, and a hold's backings sum to what
    /// it records as backed.
    NoChargeAfterExpiry,
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
    /// A batch's item count and its succeeded, failed and cancelled counts equal its
    /// items, counted; queued and running are read from the items themselves.
    BatchCountsMatchItems,
    /// A batch's `reserved` equals the open holds of its items.
    BatchReservedMatchesItems,
    /// A batch's `providerCost` equals the exact costs of its items' attempts.
    BatchProviderCostMatchesItems,
    /// A batch's `providerCostUpperBound` less its `providerCost` equals the bounds of
    /// its items' attempts whose cost is not known.
    BatchCostBoundMatchesItems,
    /// A batch's `customerCharge` equals its items' charges.
    BatchChargeMatchesItems,
}

impl Invariant {
    /// Every invariant, in report order.
    pub const ALL: [Self; 22] = [
        Self::BalanceMatchesLedger,
        Self::AvailableNonNegative,
        Self::GrantedEqualsGrants,
        Self::HeldEqualsOpenReservations,
        Self::ChargedEqualsCharges,
        Self::ExpiredEqualsGrantExpiries,
        Self::ChargesAttributedToGrants,
        Self::SpendCountersMatchJobs,
        Self::GrantExpiryWithinGrant,
        Self::NoChargeAfterExpiry,
        Self::ReservationAmountsConsistent,
        Self::ReservationResolvedOnce,
        Self::ReservationMatchesJobStatus,
        Self::OneReservationPerJob,
        Self::ChargeMatchesAttempts,
        Self::UnknownCostHasUpperBound,
        Self::ReconciliationMatchesAttempt,
        Self::BatchCountsMatchItems,
        Self::BatchReservedMatchesItems,
        Self::BatchProviderCostMatchesItems,
        Self::BatchCostBoundMatchesItems,
        Self::BatchChargeMatchesItems,
    ];

    /// The name the report prints.
    pub fn name(self) -> &'static str {
        match self {
            Self::BalanceMatchesLedger => "balance_matches_ledger",
            Self::AvailableNonNegative => "available_non_negative",
            Self::GrantedEqualsGrants => "granted_equals_grants",
            Self::HeldEqualsOpenReservations => "held_equals_open_reservations",
            Self::ChargedEqualsCharges => "charged_equals_charges",
            Self::ExpiredEqualsGrantExpiries => "expired_equals_grant_expiries",
            Self::ChargesAttributedToGrants => "charges_attributed_to_grants",
            Self::SpendCountersMatchJobs => "spend_counters_match_jobs",
            Self::GrantExpiryWithinGrant => "grant_expiry_within_grant",
            Self::NoChargeAfterExpiry => "no_charge_after_expiry",
            Self::ReservationAmountsConsistent => "reservation_amounts_consistent",
            Self::ReservationResolvedOnce => "reservation_resolved_once",
            Self::ReservationMatchesJobStatus => "reservation_matches_job_status",
            Self::OneReservationPerJob => "one_reservation_per_job",
            Self::ChargeMatchesAttempts => "charge_matches_attempts",
            Self::UnknownCostHasUpperBound => "unknown_cost_has_upper_bound",
            Self::ReconciliationMatchesAttempt => "reconciliation_matches_attempt",
            Self::BatchCountsMatchItems => "batch_counts_match_items",
            Self::BatchReservedMatchesItems => "batch_reserved_matches_items",
            Self::BatchProviderCostMatchesItems => "batch_provider_cost_matches_items",
            Self::BatchCostBoundMatchesItems => "batch_cost_bound_matches_items",
            Self::BatchChargeMatchesItems => "batch_charge_matches_items",
        }
    }

    /// What the invariant checks each of.
    fn unit(self) -> &'static str {
        match self {
            Self::BalanceMatchesLedger
            | Self::AvailableNonNegative
            | Self::GrantedEqualsGrants
            | Self::HeldEqualsOpenReservations
            | Self::ChargedEqualsCharges
            | Self::ExpiredEqualsGrantExpiries
            | Self::ChargesAttributedToGrants
            | Self::SpendCountersMatchJobs => "tenants",
            Self::GrantExpiryWithinGrant | Self::NoChargeAfterExpiry => "grants",
            Self::ReservationAmountsConsistent | Self::ReservationResolvedOnce => "reservations",
            Self::ReservationMatchesJobStatus
            | Self::OneReservationPerJob
            | Self::ChargeMatchesAttempts => "jobs",
            Self::UnknownCostHasUpperBound => "attempts",
            Self::ReconciliationMatchesAttempt => "reconciliations",
            Self::BatchCountsMatchItems
            | Self::BatchReservedMatchesItems
            | Self::BatchProviderCostMatchesItems
            | Self::BatchCostBoundMatchesItems
            | Self::BatchChargeMatchesItems => "batches",
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
    Grant(Uuid),
    LedgerEntry(Uuid),
    Job(Uuid),
    Reservation(Uuid),
    Charge(Uuid),
    Attempt(Uuid),
    Reconciliation(Uuid),
    Batch(Uuid),
}

impl fmt::Display for Subject {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Tenant(id) => write!(f, "tenant {id}"),
            Self::Grant(id) => write!(f, "grant {id}"),
            Self::LedgerEntry(id) => write!(f, "ledger entry {id}"),
            Self::Job(id) => write!(f, "job {id}"),
            Self::Reservation(id) => write!(f, "reservation {id}"),
            Self::Charge(id) => write!(f, "charge {id}"),
            Self::Attempt(id) => write!(f, "attempt {id}"),
            Self::Reconciliation(id) => write!(f, "reconciliation {id}"),
            Self::Batch(id) => write!(f, "batch {id}"),
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
pub(super) struct Recorder {
    checks: Vec<InvariantCheck>,
}

impl Recorder {
    pub(super) fn new() -> Self {
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

    pub(super) fn checked(&mut self, invariant: Invariant, count: u64) {
        self.checks[invariant.index()].checked += count;
    }

    pub(super) fn violation(
        &mut self,
        invariant: Invariant,
        subject: Subject,
        detail: impl Into<String>,
    ) {
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
    pub(super) fn violations(&mut self, invariant: Invariant, count: u64, shown: Vec<Violation>) {
        let check = &mut self.checks[invariant.index()];
        check.violation_count += count;
        let room = VIOLATIONS_SHOWN.saturating_sub(check.violations.len());
        check.violations.extend(shown.into_iter().take(room));
    }

    pub(super) fn finish(self) -> AuditReport {
        AuditReport {
            checks: self.checks,
        }
    }
}

/// Credits as the report shows them.
pub(super) fn credits(nanos: i64) -> Credits {
    Credits::from_nanos(nanos)
}
