//! The audit's report of a clean database: every invariant checked, the same whole or
//! in pages of any size, and the same from a snapshot.

use super::{report, scenario};
use crate::helpers::{Backend, job_input};
use crate::invariants::assert_billing_invariants;
use entity::{JobStatus, jobs};
use jobledger::billing::audit::{self, Invariant};
use sea_orm::sea_query::Expr;
use sea_orm::{ColumnTrait, EntityTrait, QueryFilter};

on_both_backends!(
    a_normal_scenario_audits_clean,
    the_report_does_not_depend_on_the_page_size,
);

async fn a_normal_scenario_audits_clean(backend: Backend) {
    let s = scenario(backend).await;
    let report = report(&s.app).await;
    assert!(report.is_clean(), "{report}");
    assert_eq!(report.checks.len(), Invariant::ALL.len());
    assert_eq!(report.check(Invariant::BalanceMatchesLedger).checked, 1);
    assert_eq!(report.check(Invariant::OneReservationPerJob).checked, 5);
    assert_eq!(report.check(Invariant::UnknownCostHasUpperBound).checked, 3);
    let text = report.to_string();
    for invariant in Invariant::ALL {
        assert!(
            text.contains(&format!("OK        {invariant} (")),
            "{invariant} missing from the report:\n{text}"
        );
    }
    assert!(text.ends_with("clean: all 22 invariants hold\n"), "{text}");
    assert_billing_invariants(&s.app.app.db).await;
    let snapshot = audit::audit_snapshot(&s.app.app.db).await.unwrap();
    assert_eq!(snapshot, report);
}

async fn the_report_does_not_depend_on_the_page_size(backend: Backend) {
    let s = scenario(backend).await;
    // A second tenant, so that tenants page too.
    let other = s.app.funded_tenant("globex", "1").await;
    s.app
        .create_job_ok(&other, job_input("theirs", "hello"))
        .await;
    let whole = report(&s.app).await;
    assert!(whole.is_clean(), "{whole}");
    assert_eq!(whole.check(Invariant::BalanceMatchesLedger).checked, 2);
    assert_eq!(whole.check(Invariant::OneReservationPerJob).checked, 6);
    for page_size in [1, 2, 5] {
        let paged = audit::audit_in_pages(&s.app.app.db, page_size)
            .await
            .unwrap();
        assert_eq!(paged, whole, "pages of {page_size}");
    }
    // Violations on several pages are all found.
    jobs::Entity::update_many()
        .col_expr(jobs::Column::Status, Expr::value(JobStatus::Failed))
        .filter(jobs::Column::Status.eq(JobStatus::Queued))
        .exec(&s.app.app.db)
        .await
        .unwrap();
    let paged = audit::audit_in_pages(&s.app.app.db, 1).await.unwrap();
    assert_eq!(paged, report(&s.app).await);
    assert_eq!(
        paged
            .check(Invariant::ReservationMatchesJobStatus)
            .violation_count,
        2,
        "{paged}"
    );
}
