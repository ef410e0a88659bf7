//! The comparison of the reference model with the rows, after every step.

use super::super::AttemptCost;
use super::Sequence;
use crate::invariants::assert_billing_invariants;
use entity::{
    JobStatus, ReservationStatus, attempts, charges, credit_reservations, jobs, ledger_entries,
};
use jobledger::billing::Credits;
use jobledger::billing::balance::Balance;
use jobledger::billing::ledger;
use jobledger::jobs::budget::may_have_been_billed;
use sea_orm::{EntityTrait, PaginatorTrait, QueryOrder};
use std::collections::HashMap;
use uuid::Uuid;

impl Sequence {
    /// Every invariant of the audit, then every figure of the model against the rows.
    pub(super) async fn check(&self) {
        let at = &self.at;
        let db = &self.db;
        assert_billing_invariants(db).await;

        for tenant in &self.tenants {
            let balance = ledger::balance(db, tenant.id).await.unwrap().unwrap();
            let expected = Balance {
                granted: Credits::from_nanos(tenant.granted),
                held: Credits::from_nanos(tenant.held),
                charged: Credits::from_nanos(tenant.charged),
                expired: Credits::ZERO,
            };
            assert_eq!(balance, expected, "{at}: tenant {} balance", tenant.id);
            assert!(!balance.available().nanos().is_negative(), "{at}");
        }

        let rows = jobs::Entity::find()
            .order_by_asc(jobs::Column::Id)
            .all(db)
            .await
            .unwrap();
        assert_eq!(rows.len(), self.jobs.len(), "{at}: jobs in the database");
        let reservations: HashMap<Uuid, credit_reservations::Model> =
            credit_reservations::Entity::find()
                .all(db)
                .await
                .unwrap()
                .into_iter()
                .map(|reservation| (reservation.job_id, reservation))
                .collect();
        let charge_rows: HashMap<Uuid, charges::Model> = charges::Entity::find()
            .all(db)
            .await
            .unwrap()
            .into_iter()
            .map(|charge| (charge.job_id, charge))
            .collect();
        let mut attempt_rows: HashMap<Uuid, Vec<attempts::Model>> = HashMap::new();
        for attempt in attempts::Entity::find()
            .order_by_asc(attempts::Column::Number)
            .all(db)
            .await
            .unwrap()
        {
            attempt_rows
                .entry(attempt.job_id)
                .or_default()
                .push(attempt);
        }
        for job in &self.jobs {
            let row = rows
                .iter()
                .find(|row| row.id == job.id)
                .unwrap_or_else(|| panic!("{at}: job {} is missing", job.id));
            assert_eq!(row.tenant_id, self.tenants[job.tenant].id, "{at}");
            assert_eq!(row.status, job.status, "{at}: status of job {}", job.id);
            assert_eq!(row.attempt_count, job.attempt_count, "{at}: attempts");
            assert_eq!(row.cancel_requested, job.cancel_requested, "{at}");
            assert_eq!(
                row.run_token,
                job.claim.as_ref().map(|(claim, _)| claim.run_token),
                "{at}: the job's fence"
            );
            let reservation = &reservations[&job.id];
            assert_eq!(reservation.amount_nanos, job.hold, "{at}: hold");
            let (status, settled, released) = match job.status {
                JobStatus::Queued | JobStatus::Running => (ReservationStatus::Held, 0, 0),
                JobStatus::Succeeded => {
                    let charged = job.charged.unwrap();
                    (ReservationStatus::Settled, charged, job.hold - charged)
                }
                JobStatus::Failed | JobStatus::Cancelled => {
                    (ReservationStatus::Released, 0, job.hold)
                }
            };
            assert_eq!(
                (
                    reservation.status,
                    reservation.settled_amount_nanos,
                    reservation.released_amount_nanos
                ),
                (status, settled, released),
                "{at}: reservation of job {}",
                job.id
            );
            assert_eq!(
                charge_rows.get(&job.id).map(|charge| charge.amount_nanos),
                job.charged,
                "{at}: charge of job {}",
                job.id
            );
            let attempts: Vec<AttemptCost> = attempt_rows
                .get(&job.id)
                .map(Vec::as_slice)
                .unwrap_or_default()
                .iter()
                .map(|attempt| AttemptCost {
                    outcome: attempt.outcome,
                    exact: attempt.provider_cost_nanos,
                    paid: may_have_been_billed(attempt),
                })
                .collect();
            assert_eq!(attempts, job.attempts, "{at}: attempts of job {}", job.id);
        }
        assert_eq!(
            charge_rows.len(),
            self.jobs.iter().filter(|job| job.charged.is_some()).count(),
            "{at}"
        );
        assert_eq!(
            ledger_entries::Entity::find().count(db).await.unwrap(),
            self.ledger_entries,
            "{at}: ledger entries"
        );
    }
}
