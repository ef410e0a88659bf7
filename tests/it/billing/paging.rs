//! The dashboards page newest first and refuse bad arguments.

use super::{as_tenant_of, assert_ledger_entry, data, job_ids, no_workers, pages};
use crate::helpers::{ADMIN_TOKEN, Backend, decimal, error_code, job_input, spawn_app_with};
use crate::invariants::assert_billing_invariants;
use entity::ledger_entries;
use rust_decimal::Decimal;
use sea_orm::{ColumnTrait, EntityTrait, QueryFilter, QueryOrder};
use serde_json::json;
use uuid::Uuid;

on_both_backends!(dashboards_page_newest_first_and_refuse_bad_arguments);

async fn dashboards_page_newest_first_and_refuse_bad_arguments(backend: Backend) {
    let app = spawn_app_with(backend, no_workers()).await;
    let acme = app.funded_tenant("acme", "5").await;
    let globex = app.funded_tenant("globex", "5").await;
    let mut ids = Vec::new();
    for index in 0..5 {
        ids.push(
            app.create_job_ok(&acme, job_input(&format!("page-{index}"), "hello"))
                .await,
        );
    }
    let response = app
        .operation(Some(&acme.key), "CancelJob", json!({"id": ids[1]}))
        .await;
    assert_eq!(data(&response, "cancelJob")["status"], "CANCELLED");
    let theirs = app
        .create_job_ok(&globex, job_input("theirs", "hello"))
        .await;

    // Job costs, two at a time: 2 + 2 + 1, newest first, the cursor is endCursor.
    let job_cost_pages = pages(&app, &acme.key, "JobCosts", "jobCosts", json!({"first": 2})).await;
    let mut listed = Vec::new();
    for page in &job_cost_pages {
        let page_ids = job_ids(&page.nodes);
        assert_eq!(
            page.page_info["endCursor"],
            json!(page_ids.last().map(Uuid::to_string))
        );
        for node in &page.nodes {
            // Queued and cancelled jobs have no attempts, no cost and no charge.
            assert_eq!(node["attempts"], 0);
            assert_eq!(decimal(&node["providerCost"]), Decimal::ZERO);
            assert_eq!(decimal(&node["providerCostUpperBound"]), Decimal::ZERO);
            assert_eq!(decimal(&node["customerCharge"]), Decimal::ZERO);
            assert_eq!(decimal(&node["margin"]), Decimal::ZERO);
        }
        listed.extend(page_ids);
    }
    let sizes: Vec<_> = job_cost_pages.iter().map(|page| page.nodes.len()).collect();
    assert_eq!(sizes, [2, 2, 1]);
    let newest_first: Vec<_> = ids.iter().rev().copied().collect();
    assert_eq!(listed, newest_first);
    let statuses: Vec<_> = {
        let response = app.operation(Some(&acme.key), "JobCosts", json!({})).await;
        data(&response, "jobCosts")["edges"]
            .as_array()
            .unwrap()
            .iter()
            .map(|edge| edge["node"]["status"].as_str().unwrap().to_owned())
            .collect()
    };
    assert_eq!(
        statuses,
        ["QUEUED", "QUEUED", "QUEUED", "CANCELLED", "QUEUED"]
    );

    // The credit ledger, three at a time: the grant, five holds and one release.
    let entries = ledger_entries::Entity::find()
        .filter(ledger_entries::Column::TenantId.eq(acme.id))
        .order_by_desc(ledger_entries::Column::Id)
        .all(&app.app.db)
        .await
        .unwrap();
    assert_eq!(entries.len(), 7);
    let ledger_pages = pages(
        &app,
        &acme.key,
        "CreditLedger",
        "creditLedger",
        json!({"first": 3}),
    )
    .await;
    for page in &ledger_pages[..ledger_pages.len() - 1] {
        assert_eq!(
            page.page_info["endCursor"],
            page.nodes.last().unwrap()["id"]
        );
    }
    let sizes: Vec<_> = ledger_pages.iter().map(|page| page.nodes.len()).collect();
    let listed: Vec<_> = ledger_pages
        .into_iter()
        .flat_map(|page| page.nodes)
        .collect();
    assert_eq!(sizes, [3, 3, 1]);
    for (node, entry) in listed.iter().zip(&entries) {
        assert_ledger_entry(node, entry);
    }
    let kinds: Vec<_> = listed
        .iter()
        .map(|node| node["kind"].as_str().unwrap())
        .collect();
    assert_eq!(
        kinds,
        ["RELEASE", "HOLD", "HOLD", "HOLD", "HOLD", "HOLD", "GRANT"]
    );
    assert_eq!(listed[0]["jobId"], ids[1].to_string());
    assert!(listed[6]["jobId"].is_null());

    // Cursors that are not from the caller's list, and sizes out of range.
    let globex_entry = ledger_entries::Entity::find()
        .filter(ledger_entries::Column::TenantId.eq(globex.id))
        .one(&app.app.db)
        .await
        .unwrap()
        .unwrap();
    let stranger = Uuid::now_v7().to_string();
    for (name, variables) in [
        ("JobCosts", json!({"after": "not-a-cursor"})),
        ("JobCosts", json!({"after": stranger})),
        ("JobCosts", json!({"after": theirs})),
        ("JobCosts", json!({"first": 0})),
        ("JobCosts", json!({"first": 101})),
        ("JobCosts", json!({"first": -1})),
        (
            "JobCosts",
            json!({"from": "2026-01-02T00:00:00Z", "to": "2026-01-01T00:00:00Z"}),
        ),
        ("CreditLedger", json!({"after": "not-a-cursor"})),
        ("CreditLedger", json!({"after": stranger})),
        ("CreditLedger", json!({"after": globex_entry.id})),
        ("CreditLedger", json!({"first": 0})),
        ("CreditLedger", json!({"first": 101})),
        (
            "BillingSummary",
            json!({"from": "2026-01-01T00:00:00Z", "to": "2026-01-01T00:00:00Z"}),
        ),
    ] {
        let response = app
            .operation(Some(&acme.key), name, variables.clone())
            .await;
        assert_eq!(
            error_code(&response),
            "VALIDATION",
            "{name} {variables}: {response}"
        );
    }
    // The largest page is allowed.
    let response = app
        .operation(Some(&acme.key), "CreditLedger", json!({"first": 100}))
        .await;
    assert_eq!(
        data(&response, "creditLedger")["edges"]
            .as_array()
            .unwrap()
            .len(),
        7
    );

    // An admin must name the tenant of a ledger, and only tenants that exist.
    let response = app
        .operation(Some(ADMIN_TOKEN), "CreditLedger", json!({}))
        .await;
    assert_eq!(error_code(&response), "VALIDATION", "{response}");
    let nobody = Uuid::now_v7();
    for (name, variables) in [
        ("CreditLedger", json!({})),
        ("JobCosts", json!({})),
        (
            "BillingSummary",
            json!({"from": "2026-01-01T00:00:00Z", "to": "2099-01-01T00:00:00Z"}),
        ),
    ] {
        let response = as_tenant_of(&app, ADMIN_TOKEN, name, nobody, variables).await;
        assert_eq!(error_code(&response), "NOT_FOUND", "{name}: {response}");
    }
    // The admin pages every tenant's jobs with one cursor: globex's newest job first.
    let response = app
        .operation(Some(ADMIN_TOKEN), "JobCosts", json!({"first": 1}))
        .await;
    let connection = data(&response, "jobCosts");
    assert_eq!(connection["edges"][0]["node"]["jobId"], theirs.to_string());
    assert_eq!(connection["pageInfo"]["hasNextPage"], true);
    let response = app
        .operation(
            Some(ADMIN_TOKEN),
            "JobCosts",
            json!({"first": 100, "after": connection["pageInfo"]["endCursor"]}),
        )
        .await;
    let nodes: Vec<_> = data(&response, "jobCosts")["edges"]
        .as_array()
        .unwrap()
        .iter()
        .map(|edge| edge["node"].clone())
        .collect();
    assert_eq!(job_ids(&nodes), newest_first);

    // Anonymous callers get nothing.
    let response = app.operation(None, "CreditLedger", json!({})).await;
    assert_eq!(error_code(&response), "UNAUTHENTICATED");
    assert_billing_invariants(&app.app.db).await;
}
