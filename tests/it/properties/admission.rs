//! Concurrent creates against a balance that fits exactly K holds admit exactly K, to
//! the nano-credit.

use crate::helpers::{AppOptions, Backend, decimal, error_code, spawn_app_with};
use crate::invariants::assert_billing_invariants;
use entity::{LedgerEntryKind, Timestamp, jobs, ledger_entries};
use jobledger::billing::balance::Balance;
use jobledger::billing::ledger;
use jobledger::billing::{Credits, prices};
use jobledger::jobs::input::{JobRequest, NewJob};
use rust_decimal::Decimal;
use sea_orm::{ColumnTrait, EntityTrait, PaginatorTrait, QueryFilter};
use serde_json::json;
use std::collections::HashSet;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

on_both_backends!(concurrent_creates_never_admit_more_than_the_balance_holds);

async fn concurrent_creates_never_admit_more_than_the_balance_holds(backend: Backend) {
    const FITS: i64 = 5;
    const CALLS: usize = 12;
    let app = spawn_app_with(backend, AppOptions::no_workers()).await;
    let db = app.app.db.clone();
    let input = |key: &str| {
        json!({
            "idempotencyKey": key,
            "model": "o4-mini",
            "messages": [{"role": "user", "content": "x"}],
            "maxOutputTokens": 50_001,
        })
    };
    let new = NewJob::parse(JobRequest {
        idempotency_key: "sizing".into(),
        model: "o4-mini".into(),
        messages: vec![jobledger::jobs::input::MessageRequest::text("user", "x")],
        max_output_tokens: 50_001,
        response_schema: None,
        max_attempts: None,
        retry_unknown_outcome: None,
        metadata: None,
        stream_output: None,
        priority: None,
        run_at: None,
        deadline: None,
        default_deadline: jobledger::jobs::input::DEFAULT_DEADLINE,
        charging: Default::default(),
        labels: Vec::new(),
        parameters: Default::default(),
        tools: Default::default(),
        fallback_models: Vec::new(),
    })
    .unwrap();
    let price = prices::price_at(&db, "o4-mini", Timestamp::now())
        .await
        .unwrap()
        .unwrap();
    // Counted as the simulator that serves the tests' models counts.
    let hold = new.charging.job_hold(
        new.input
            .call_bound(jobledger::llm::PromptCounting::QuarterBytes, "gpt-4o-mini"),
        &price,
        new.max_attempts,
        new.input.stream_output,
    );
    // Nine significant fractional digits, so any rounding on the way shows.
    assert!(
        hold.nanos() % 10 != 0 && (100_000_000..1_000_000_000).contains(&hold.nanos()),
        "the hold {hold} should have nine significant fractional digits"
    );
    let nanos = |count: i64| Credits::from_nanos(count);
    // One tenant fits exactly K holds; the other one nano-credit short of K + 1.
    let exact_grant = nanos(FITS * hold.nanos());
    let short_grant = nanos((FITS + 1) * hold.nanos() - 1);
    let exact = app.funded_tenant("exact", &exact_grant.to_string()).await;
    let short = app.funded_tenant("short", &short_grant.to_string()).await;

    // Watches both balances while the creates race: available never goes below zero.
    let stop = Arc::new(AtomicBool::new(false));
    let watcher = tokio::spawn({
        let db = db.clone();
        let stop = stop.clone();
        let tenants = [exact.id, short.id];
        async move {
            let mut samples = 0;
            while !stop.load(Ordering::Relaxed) {
                for tenant in tenants {
                    let balance = ledger::balance(&db, tenant).await.unwrap().unwrap();
                    assert!(
                        !balance.available().nanos().is_negative(),
                        "available below zero mid-race: {balance:?}"
                    );
                    assert!(balance.held.nanos() <= FITS * hold.nanos(), "{balance:?}");
                }
                samples += 1;
                tokio::time::sleep(Duration::from_millis(2)).await;
            }
            samples
        }
    });
    let calls: Vec<_> = (0..CALLS)
        .flat_map(|index| [(&exact, index), (&short, index)])
        .collect();
    let responses = futures_util::future::join_all(
        calls
            .iter()
            .map(|(tenant, index)| app.create_job(tenant, input(&format!("burst-{index}")))),
    )
    .await;
    stop.store(true, Ordering::Relaxed);
    let samples = watcher.await.expect("available went below zero");
    assert!(samples > 0);

    for (tenant, grant) in [(&exact, exact_grant), (&short, short_grant)] {
        let mine: Vec<_> = calls
            .iter()
            .zip(&responses)
            .filter(|((owner, _), _)| owner.id == tenant.id)
            .map(|(_, response)| response)
            .collect();
        let admitted: Vec<_> = mine
            .iter()
            .filter(|response| response["errors"].is_null())
            .collect();
        assert_eq!(
            admitted.len(),
            FITS as usize,
            "a balance for {FITS} holds admitted {}",
            admitted.len()
        );
        for response in &mine {
            if !response["errors"].is_null() {
                assert_eq!(error_code(response), "INSUFFICIENT_CREDITS", "{response}");
            }
        }
        let ids: HashSet<&str> = admitted
            .iter()
            .map(|response| {
                let job = &response["data"]["createJob"]["job"];
                assert_eq!(job["status"], "QUEUED");
                assert_eq!(
                    decimal(&job["reservation"]["amount"]),
                    hold.to_decimal(),
                    "the hold round-trips exactly: {response}"
                );
                job["id"].as_str().unwrap()
            })
            .collect();
        assert_eq!(ids.len(), FITS as usize);
        assert_eq!(
            jobs::Entity::find()
                .filter(jobs::Column::TenantId.eq(tenant.id))
                .count(&db)
                .await
                .unwrap(),
            FITS as u64
        );
        assert_eq!(
            ledger_entries::Entity::find()
                .filter(ledger_entries::Column::TenantId.eq(tenant.id))
                .filter(ledger_entries::Column::Kind.eq(LedgerEntryKind::Hold))
                .count(&db)
                .await
                .unwrap(),
            FITS as u64
        );
        let held = nanos(FITS * hold.nanos());
        let available = grant - held;
        let balance = app.balance(tenant).await;
        assert_eq!(decimal(&balance["granted"]), grant.to_decimal());
        assert_eq!(decimal(&balance["held"]), held.to_decimal());
        assert_eq!(decimal(&balance["charged"]), Decimal::ZERO);
        assert_eq!(decimal(&balance["available"]), available.to_decimal());
        assert_eq!(
            ledger::balance(&db, tenant.id).await.unwrap().unwrap(),
            Balance {
                granted: grant,
                held,
                charged: Credits::ZERO,
                expired: Credits::ZERO,
            }
        );
        // Exactly at the boundary: one nano-credit short is short.
        let refused = app.create_job(tenant, input("one-more")).await;
        assert_eq!(error_code(&refused), "INSUFFICIENT_CREDITS", "{refused}");
    }

    // The short tenant is one nano-credit from another hold: grant it, and it fits.
    let topped = app.grant(&short, "0.000000001").await;
    assert!(topped["errors"].is_null(), "{topped}");
    app.create_job_ok(&short, input("one-more")).await;
    let balance = app.balance(&short).await;
    assert_eq!(decimal(&balance["available"]), Decimal::ZERO);
    assert_eq!(
        decimal(&balance["held"]),
        nanos((FITS + 1) * hold.nanos()).to_decimal()
    );
    assert_billing_invariants(&db).await;
}
