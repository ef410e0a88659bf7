//! Rivals racing to release one hold release it once.

use super::{Spec, grant, model_prices, new_tenant, prepared_database};
use crate::helpers::{Backend, simulated_models};
use crate::invariants::assert_billing_invariants;
use entity::{JobStatus, LedgerEntryKind, jobs, ledger_entries};
use jobledger::billing::balance::Balance;
use jobledger::billing::ledger;
use jobledger::billing::{Credits, limits};
use jobledger::bus::EventBus;
use jobledger::db::begin_write;
use jobledger::jobs::service;
use sea_orm::sea_query::Expr;
use sea_orm::{ColumnTrait, EntityTrait, PaginatorTrait, QueryFilter};
use std::time::Duration;

on_both_backends!(racing_releases_of_one_hold_resolve_it_once);

/// While one transaction has released a job's hold but not yet committed, rivals ask
/// the ledger to release the same hold: each must answer `None` once the first commits
/// (on PostgreSQL they read the hold as still held and then wait on its row; on SQLite
/// they wait for the write lock), so the tenant's held goes down exactly once.
async fn racing_releases_of_one_hold_resolve_it_once(backend: Backend) {
    const JOBS: usize = 4;
    const RIVALS: usize = 3;
    let (database, db) = prepared_database(&backend).await;
    let bus = EventBus::default();
    let tenant = new_tenant(&db, "racer").await;
    let granted = Credits::from_nanos(1_000_000_000);
    grant(&db, tenant, granted, "initial".into()).await.unwrap();
    let spec = Spec {
        model: 0,
        max_output: 1_000,
        content_chars: 10,
        max_attempts: 1,
        retry_unknown: true,
    };
    let hold = spec.hold(&model_prices(&db).await[0]);
    let mut held = Credits::from_nanos(JOBS as i64 * hold.nanos());
    let mut job_ids = Vec::new();
    for index in 0..JOBS {
        let created = service::create_job(
            &db,
            &bus,
            &simulated_models(),
            tenant,
            spec.new_job(&format!("race-{index}")),
        )
        .await
        .unwrap();
        job_ids.push((created.job.id, created.job.created_at));
    }
    for (job_id, created_at) in job_ids {
        // The first resolver ends the job and releases its hold, as a cancel does.
        let first = begin_write(&db).await.unwrap();
        let ended = jobs::Entity::update_many()
            .col_expr(jobs::Column::Status, Expr::value(JobStatus::Cancelled))
            .col_expr(jobs::Column::CancelRequested, Expr::value(true))
            .filter(jobs::Column::Id.eq(job_id))
            .filter(jobs::Column::Status.eq(JobStatus::Queued))
            .exec(&first)
            .await
            .unwrap();
        assert_eq!(ended.rows_affected, 1);
        let settlement = ledger::release(&first, job_id).await.unwrap();
        assert_eq!(
            settlement,
            Some(ledger::Settlement {
                charged: Credits::ZERO,
                released: hold,
                absorbed: Credits::ZERO,
            })
        );
        // As every resolver of the service does: the spend counters forget the hold.
        limits::release_spends(&first, [(tenant, created_at, hold)])
            .await
            .unwrap();
        let rivals: Vec<_> = (0..RIVALS)
            .map(|_| {
                let db = db.clone();
                tokio::spawn(async move {
                    let transaction = begin_write(&db).await.unwrap();
                    let resolved = ledger::release(&transaction, job_id).await.unwrap();
                    transaction.commit().await.unwrap();
                    resolved
                })
            })
            .collect();
        // Long enough for the rivals to read the hold and queue behind the first.
        tokio::time::sleep(Duration::from_millis(150)).await;
        first.commit().await.unwrap();
        for rival in rivals {
            assert_eq!(rival.await.unwrap(), None, "a hold was released twice");
        }
        held = held - hold;
        assert_eq!(
            ledger::balance(&db, tenant).await.unwrap().unwrap(),
            Balance {
                granted,
                held,
                charged: Credits::ZERO,
                expired: Credits::ZERO,
            }
        );
        assert_eq!(
            ledger_entries::Entity::find()
                .filter(ledger_entries::Column::JobId.eq(job_id))
                .filter(ledger_entries::Column::Kind.eq(LedgerEntryKind::Release))
                .count(&db)
                .await
                .unwrap(),
            1
        );
    }
    assert_billing_invariants(&db).await;
    db.close().await.unwrap();
    drop(database);
}
