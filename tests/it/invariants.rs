//! The billing invariants (`docs/architecture.md`, "Invariants"), checked from the rows
//! after a scenario by the same audit that `jobledger audit` runs.

use jobledger::billing::audit;
use sea_orm::ConnectionTrait;

/// Panics with the audit's report when any billing invariant is broken.
///
/// Every check lives in the library audit ([`audit::audit`]), so the tests and the
/// `jobledger audit` command can never disagree about what "consistent" means.
pub async fn assert_billing_invariants(db: &impl ConnectionTrait) {
    let report = audit::audit(db).await.expect("the audit runs to its end");
    assert!(
        report.is_clean(),
        "billing invariants violated: {:?}\n{report}",
        report
            .violated()
            .iter()
            .map(|invariant| invariant.name())
            .collect::<Vec<_>>()
    );
}
