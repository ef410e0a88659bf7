//! The billing invariants of DESIGN.md, checked from the rows after a scenario.

use entity::{JobStatus, ReservationStatus, charges, credit_reservations, jobs, tenants};
use jobledger::billing::ledger;
use sea_orm::{ConnectionTrait, EntityTrait};
use std::collections::HashMap;

/// Panics with the first broken invariant.
pub async fn assert_billing_invariants(db: &impl ConnectionTrait) {
    let tenants = tenants::Entity::find().all(db).await.unwrap();
    let jobs = jobs::Entity::find().all(db).await.unwrap();
    let reservations: HashMap<_, _> = credit_reservations::Entity::find()
        .all(db)
        .await
        .unwrap()
        .into_iter()
        .map(|reservation| (reservation.job_id, reservation))
        .collect();
    let charges = charges::Entity::find().all(db).await.unwrap();
    let mut charges_per_job: HashMap<_, Vec<_>> = HashMap::new();
    for charge in &charges {
        charges_per_job
            .entry(charge.job_id)
            .or_default()
            .push(charge);
    }

    for tenant in &tenants {
        let cached = ledger::balance(db, tenant.id).await.unwrap().unwrap();
        let replayed = ledger::replay_balance(db, tenant.id).await.unwrap();
        assert_eq!(
            cached, replayed,
            "tenant {} balance differs from a replay of the ledger",
            tenant.id
        );
        assert!(
            cached.available().nanos() >= 0,
            "tenant {} has negative available credits",
            tenant.id
        );
        assert!(
            cached.held.nanos() >= 0,
            "tenant {} holds a negative amount",
            tenant.id
        );
        let open_holds: i64 = reservations
            .values()
            .filter(|r| r.tenant_id == tenant.id && r.status == ReservationStatus::Held)
            .map(|r| r.amount_nanos)
            .sum();
        assert_eq!(
            cached.held.nanos(),
            open_holds,
            "tenant {} held ≠ its open reservations",
            tenant.id
        );
        let charged: i64 = charges
            .iter()
            .filter(|c| c.tenant_id == tenant.id)
            .map(|c| c.amount_nanos)
            .sum();
        assert_eq!(
            cached.charged.nanos(),
            charged,
            "tenant {} charged ≠ its charges",
            tenant.id
        );
    }

    for job in &jobs {
        let reservation = reservations
            .get(&job.id)
            .unwrap_or_else(|| panic!("job {} has no reservation", job.id));
        let job_charges = charges_per_job.get(&job.id).map_or(&[][..], Vec::as_slice);
        match job.status {
            JobStatus::Succeeded => {
                assert_eq!(
                    job_charges.len(),
                    1,
                    "succeeded job {} must have exactly one charge",
                    job.id
                );
                assert_eq!(
                    reservation.status,
                    ReservationStatus::Settled,
                    "job {}",
                    job.id
                );
                assert_eq!(
                    job_charges[0].amount_nanos, reservation.settled_amount_nanos,
                    "job {}",
                    job.id
                );
            }
            JobStatus::Failed | JobStatus::Cancelled => {
                assert!(
                    job_charges.is_empty(),
                    "{:?} job {} was charged",
                    job.status,
                    job.id
                );
                assert_eq!(
                    reservation.status,
                    ReservationStatus::Released,
                    "job {}",
                    job.id
                );
                assert_eq!(
                    reservation.released_amount_nanos, reservation.amount_nanos,
                    "job {}",
                    job.id
                );
            }
            JobStatus::Queued | JobStatus::Running => {
                assert!(
                    job_charges.is_empty(),
                    "unfinished job {} was charged",
                    job.id
                );
                assert_eq!(
                    reservation.status,
                    ReservationStatus::Held,
                    "job {}",
                    job.id
                );
            }
        }
        match reservation.status {
            ReservationStatus::Held => {
                assert_eq!(
                    reservation.settled_amount_nanos + reservation.released_amount_nanos,
                    0
                );
            }
            ReservationStatus::Settled | ReservationStatus::Released => {
                assert!(
                    reservation.settled_amount_nanos <= reservation.amount_nanos,
                    "job {} settled above its hold",
                    job.id
                );
                assert_eq!(
                    reservation.settled_amount_nanos + reservation.released_amount_nanos,
                    reservation.amount_nanos,
                    "job {}: settled + released ≠ held",
                    job.id
                );
            }
        }
    }
}
