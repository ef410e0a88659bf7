//! The books at a barrier of the concurrent run against what the tasks saw.

use super::super::Effect;
use super::{CreateOutcome, Env, Seen};
use crate::invariants::assert_billing_invariants;
use entity::{JobStatus, charges, credit_reservations, job_events, jobs};
use jobledger::billing::Credits;
use jobledger::billing::balance::Balance;
use jobledger::billing::ledger;
use sea_orm::EntityTrait;
use std::collections::HashMap;
use uuid::Uuid;

/// Compares the rows with what the tasks saw, and runs the audit. With `drained`, no
/// job is open and nothing may be held.
pub(super) async fn check_books(env: &Env, at: &str, drained: bool) {
    let db = &env.db;
    assert_billing_invariants(db).await;
    let seen = {
        let seen = env.seen.lock().unwrap();
        Seen {
            granted: seen.granted.clone(),
            creates: seen.creates.clone(),
            holds: seen.holds.clone(),
            finishes: seen.finishes.clone(),
            ..Seen::default()
        }
    };

    // Idempotency: one fresh job per key; replays name it, conflicts differ from it.
    let mut fresh: HashMap<(usize, u32), (u32, Uuid)> = HashMap::new();
    for record in &seen.creates {
        if let CreateOutcome::Fresh(id) = record.outcome {
            let earlier = fresh.insert((record.tenant, record.key), (record.variant, id));
            assert!(
                earlier.is_none(),
                "{at}: key {} of tenant {} made two jobs",
                record.key,
                record.tenant
            );
        }
    }
    for record in &seen.creates {
        let winner = fresh.get(&(record.tenant, record.key)).copied();
        match (record.outcome, winner) {
            (CreateOutcome::Replayed(id), Some((variant, fresh_id))) => {
                assert_eq!(
                    (record.variant, id),
                    (variant, fresh_id),
                    "{at}: {record:?}"
                );
            }
            (CreateOutcome::Conflict, Some((variant, _))) => {
                assert_ne!(
                    record.variant, variant,
                    "{at}: {record:?} conflicted with itself"
                );
            }
            (CreateOutcome::Replayed(_) | CreateOutcome::Conflict, None) => {
                panic!("{at}: {record:?} without any job under its key");
            }
            _ => {}
        }
    }

    let rows = jobs::Entity::find().all(db).await.unwrap();
    assert_eq!(
        rows.len(),
        seen.holds.len(),
        "{at}: jobs in the database against fresh creates"
    );
    let reservations: HashMap<Uuid, i64> = credit_reservations::Entity::find()
        .all(db)
        .await
        .unwrap()
        .into_iter()
        .map(|reservation| (reservation.job_id, reservation.amount_nanos))
        .collect();
    let charge_rows: HashMap<Uuid, i64> = charges::Entity::find()
        .all(db)
        .await
        .unwrap()
        .into_iter()
        .map(|charge| (charge.job_id, charge.amount_nanos))
        .collect();
    let mut terminal_events: HashMap<Uuid, usize> = HashMap::new();
    for event in job_events::Entity::find().all(db).await.unwrap() {
        if event.kind.is_terminal() {
            *terminal_events.entry(event.job_id).or_default() += 1;
        }
    }
    let mut finishes: HashMap<Uuid, Vec<Effect>> = HashMap::new();
    for (job, effect) in &seen.finishes {
        finishes.entry(*job).or_default().push(*effect);
    }

    let mut expected: HashMap<Uuid, Balance> = HashMap::new();
    for (tenant, granted) in &seen.granted {
        expected.entry(*tenant).or_default().granted = Credits::from_nanos(*granted);
    }
    for row in &rows {
        let (tenant, hold) = *seen
            .holds
            .get(&row.id)
            .unwrap_or_else(|| panic!("{at}: job {} was made by no create", row.id));
        assert_eq!(row.tenant_id, tenant, "{at}");
        assert_eq!(
            reservations.get(&row.id),
            Some(&hold),
            "{at}: hold of {}",
            row.id
        );
        assert_eq!(
            terminal_events.get(&row.id).copied().unwrap_or(0),
            usize::from(row.status.is_terminal()),
            "{at}: terminal events of {} ({:?})",
            row.id,
            row.status
        );
        let finished = finishes.get(&row.id).map(Vec::as_slice).unwrap_or_default();
        assert!(
            finished.len() <= 1,
            "{at}: job {} ended twice: {finished:?}",
            row.id
        );
        let balance = expected.entry(tenant).or_default();
        match row.status {
            JobStatus::Queued | JobStatus::Running => {
                assert!(finished.is_empty(), "{at}: open job {} ended", row.id);
                balance.held = balance.held + Credits::from_nanos(hold);
            }
            JobStatus::Succeeded => {
                let [Effect::Settle { charge }] = finished else {
                    panic!("{at}: job {} succeeded without a settling finish", row.id);
                };
                let charged = charge.nanos().min(hold);
                assert_eq!(charge_rows.get(&row.id), Some(&charged), "{at}: charge");
                balance.charged = balance.charged + Credits::from_nanos(charged);
            }
            JobStatus::Failed | JobStatus::Cancelled => {
                assert!(
                    matches!(finished, [] | [Effect::Release(_)]),
                    "{at}: job {} is {:?} after {finished:?}",
                    row.id,
                    row.status
                );
                if let [Effect::Release(status)] = finished {
                    assert_eq!(*status, row.status, "{at}");
                }
                assert!(
                    !charge_rows.contains_key(&row.id),
                    "{at}: charged {}",
                    row.id
                );
            }
        }
    }
    for tenant in &env.tenants {
        let balance = ledger::balance(db, *tenant).await.unwrap().unwrap();
        let expected = expected.get(tenant).copied().unwrap_or_default();
        assert_eq!(balance, expected, "{at}: balance of tenant {tenant}");
        assert!(!balance.available().nanos().is_negative(), "{at}");
        if drained {
            assert_eq!(balance.held, Credits::ZERO, "{at}: a hold outlived its job");
        }
    }
}
