//! Every figure of the dashboards against the rows, per tenant and for admins.

use super::figures::{Figures, Rows};
use super::{
    LIMIT, all_job_cost_pages, as_tenant_of, assert_ledger_entry, at, data, job_ids, no_workers,
    rfc3339, with_extra_fields,
};
use crate::helpers::{
    ADMIN_TOKEN, AppOptions, Backend, TestTenant, decimal, error_code, job_input, spawn_app_with,
};
use crate::invariants::assert_billing_invariants;
use chrono::Utc;
use entity::{AttemptOutcome, JobStatus, jobs, ledger_entries};
use rust_decimal::Decimal;
use sea_orm::{ColumnTrait, EntityTrait, QueryFilter, QueryOrder};
use serde_json::json;
use std::collections::HashMap;
use uuid::Uuid;

on_both_backends!(dashboards_agree_with_the_rows_per_tenant_and_for_admins);

async fn dashboards_agree_with_the_rows_per_tenant_and_for_admins(backend: Backend) {
    // Jobs are created with no worker running, so that one can be cancelled while
    // queued; then the app restarts with workers that run the rest.
    let app = spawn_app_with(backend, no_workers()).await;
    let acme = app.funded_tenant("acme", "10").await;
    let globex = app.funded_tenant("globex", "10").await;
    let with_model = |key: &str, content: &str, model: &str| {
        let mut input = job_input(key, content);
        input["model"] = json!(model);
        input
    };
    let mut created: Vec<(TestTenant, Uuid)> = Vec::new();
    for (tenant, input) in [
        (
            &acme,
            with_model("ok", "Summarise the quarter.", "gpt-4o-mini"),
        ),
        (&acme, with_model("ok-4o", "Translate: hello", "gpt-4o")),
        (
            &acme,
            with_model("rejected", "hello [mock:status=400]", "gpt-4o-mini"),
        ),
        (
            &acme,
            with_model(
                "flaky",
                "hello [mock:status=503][mock:fail_first=1]",
                "gpt-4o",
            ),
        ),
        (&acme, {
            let mut input = with_model("lost", "hello [mock:drop]", "gpt-4o-mini");
            input["retryUnknownOutcome"] = json!(false);
            input
        }),
        (
            &globex,
            with_model("theirs", "A globex report.", "gpt-4.1-mini"),
        ),
        (
            &globex,
            with_model(
                "theirs-retried",
                "again [mock:drop][mock:fail_first=1]",
                "gpt-4o-mini",
            ),
        ),
    ] {
        created.push((tenant.clone(), app.create_job_ok(tenant, input).await));
    }
    let cancelled = app
        .create_job_ok(&acme, job_input("cancelled", "never runs"))
        .await;
    let response = app
        .operation(Some(&acme.key), "CancelJob", json!({"id": cancelled}))
        .await;
    assert_eq!(data(&response, "cancelJob")["status"], "CANCELLED");
    created.push((acme.clone(), cancelled));

    let app = app.restart(AppOptions::default()).await;
    for (tenant, id) in &created {
        app.wait_until_finished(tenant, *id, LIMIT).await;
    }
    let rows = Rows::load(&app).await;
    let statuses: Vec<_> = rows.jobs.iter().map(|job| job.status).collect();
    for status in [
        JobStatus::Succeeded,
        JobStatus::Failed,
        JobStatus::Cancelled,
    ] {
        assert!(
            statuses.contains(&status),
            "no {status:?} job: {statuses:?}"
        );
    }
    assert!(
        rows.attempts
            .iter()
            .any(|a| a.outcome == AttemptOutcome::Unknown),
        "the scenario has an unknown outcome"
    );
    let of = |tenant: &TestTenant| {
        let tenant_id = tenant.id;
        move |job: &jobs::Model| job.tenant_id == tenant_id
    };
    let acme_jobs = rows.jobs_where(of(&acme));
    let globex_jobs = rows.jobs_where(of(&globex));
    let oldest = rows.jobs.iter().map(|job| job.created_at).min().unwrap();
    let everything = json!({
        "from": at(oldest.plus(chrono::Duration::seconds(-1))),
        "to": rfc3339(Utc::now() + chrono::Duration::hours(1)),
    });

    // Job costs: every job of the caller, newest first, each equal to its rows and to
    // the job's own `cost` field.
    for (tenant, jobs) in [(&acme, &acme_jobs), (&globex, &globex_jobs)] {
        let nodes = all_job_cost_pages(&app, &tenant.key, json!({"first": 100})).await;
        let expected: Vec<_> = jobs.iter().map(|job| job.id).collect();
        assert_eq!(job_ids(&nodes), expected, "newest first, only the caller's");
        for node in &nodes {
            rows.assert_cost_line(node);
            let id = node["jobId"].as_str().unwrap().parse().unwrap();
            let cost = &app.job(tenant, id).await["cost"];
            for field in ["providerCost", "providerCostUpperBound", "margin"] {
                assert_eq!(decimal(&cost[field]), decimal(&node[field]), "{field}");
            }
            assert_eq!(
                decimal(&cost["customerCharge"]),
                decimal(&node["customerCharge"])
            );
        }
    }

    // The summary of each tenant over a window holding every job.
    for (tenant, jobs) in [(&acme, &acme_jobs), (&globex, &globex_jobs)] {
        let response = app
            .operation(Some(&tenant.key), "BillingSummary", everything.clone())
            .await;
        rows.figures(jobs)
            .assert_matches(data(&response, "billingSummary"));
        let response = app
            .graphql(
                Some(&tenant.key),
                &with_extra_fields("BillingSummary"),
                everything.clone(),
            )
            .await;
        let summary = data(&response, "billingSummary");
        assert!(summary["providerCostUpperBound"].is_string(), "{summary}");
        assert!(summary["byModel"][0]["margin"].is_string(), "{summary}");
        rows.figures(jobs).assert_matches(summary);
    }
    let acme_figures = rows.figures(&acme_jobs);
    assert!(acme_figures.retries > 0 && acme_figures.unknown > 0);
    assert!(acme_figures.by_model.len() == 2);

    // Windows are [from, to) on the creation time: split acme's jobs at one of them.
    let middle = acme_jobs[acme_jobs.len() / 2];
    let since = json!({"from": at(middle.created_at), "to": everything["to"]});
    let before = json!({"from": everything["from"], "to": at(middle.created_at)});
    for (window, include) in [
        (
            &since,
            Box::new(|job: &jobs::Model| job.created_at >= middle.created_at)
                as Box<dyn Fn(&jobs::Model) -> bool>,
        ),
        (
            &before,
            Box::new(|job: &jobs::Model| job.created_at < middle.created_at),
        ),
    ] {
        let expected: Vec<_> = acme_jobs
            .iter()
            .copied()
            .filter(|job| include(job))
            .collect();
        assert!(!expected.is_empty() && expected.len() < acme_jobs.len());
        let response = app
            .operation(Some(&acme.key), "BillingSummary", window.clone())
            .await;
        rows.figures(&expected)
            .assert_matches(data(&response, "billingSummary"));
        let mut variables = window.clone();
        variables["first"] = json!(100);
        let nodes = all_job_cost_pages(&app, &acme.key, variables).await;
        let ids: Vec<_> = expected.iter().map(|job| job.id).collect();
        assert_eq!(job_ids(&nodes), ids);
    }
    // Only one bound: jobCosts accepts either alone.
    let nodes = all_job_cost_pages(&app, &acme.key, json!({"from": since["from"]})).await;
    assert_eq!(
        job_ids(&nodes).len(),
        acme_jobs
            .iter()
            .filter(|job| job.created_at >= middle.created_at)
            .count()
    );
    let nodes = all_job_cost_pages(&app, &acme.key, json!({"to": before["to"]})).await;
    assert_eq!(
        job_ids(&nodes).len(),
        acme_jobs
            .iter()
            .filter(|job| job.created_at < middle.created_at)
            .count()
    );

    // A window after every job: zeros, no models, no cost per success, no lines.
    let later = json!({
        "from": rfc3339(Utc::now() + chrono::Duration::minutes(30)),
        "to": everything["to"],
    });
    let response = app
        .operation(Some(&acme.key), "BillingSummary", later.clone())
        .await;
    let empty = data(&response, "billingSummary");
    Figures::default().assert_matches(empty);
    assert!(empty["costPerSucceededJob"].is_null());
    assert_eq!(empty["retryRate"], 0.0);
    let response = app.operation(Some(&acme.key), "JobCosts", later).await;
    let connection = data(&response, "jobCosts");
    assert_eq!(connection["edges"], json!([]));
    assert_eq!(connection["pageInfo"]["hasNextPage"], false);
    assert!(connection["pageInfo"]["endCursor"].is_null());

    // A tenant may name itself, never another tenant.
    for (name, variables) in [
        ("JobCosts", json!({})),
        ("BillingSummary", everything.clone()),
        ("CreditLedger", json!({})),
    ] {
        let own = as_tenant_of(&app, &acme.key, name, acme.id, variables.clone()).await;
        let plain = app
            .operation(Some(&acme.key), name, variables.clone())
            .await;
        assert!(own["errors"].is_null(), "{own}");
        assert_eq!(own["data"], plain["data"], "{name}");
        let theirs = as_tenant_of(&app, &acme.key, name, globex.id, variables).await;
        assert_eq!(error_code(&theirs), "FORBIDDEN", "{name}: {theirs}");
        assert!(theirs["data"].is_null(), "{name} leaks nothing: {theirs}");
    }

    // An admin sees every tenant when naming none, or the one it names.
    let response = app
        .operation(Some(ADMIN_TOKEN), "BillingSummary", everything.clone())
        .await;
    let all_jobs = rows.jobs_where(|_| true);
    rows.figures(&all_jobs)
        .assert_matches(data(&response, "billingSummary"));
    let nodes = all_job_cost_pages(&app, ADMIN_TOKEN, json!({"first": 3})).await;
    let all_ids: Vec<_> = all_jobs.iter().map(|job| job.id).collect();
    assert_eq!(
        job_ids(&nodes),
        all_ids,
        "every tenant's jobs, newest first"
    );
    for node in &nodes {
        rows.assert_cost_line(node);
    }
    let response = app
        .graphql(
            Some(ADMIN_TOKEN),
            &with_extra_fields("JobCosts"),
            json!({"first": 100}),
        )
        .await;
    let edges = data(&response, "jobCosts")["edges"].as_array().unwrap();
    assert_eq!(edges.len(), all_ids.len());
    for edge in edges {
        assert!(edge["node"]["tenantId"].is_string(), "{edge}");
        rows.assert_cost_line(&edge["node"]);
    }
    for (tenant, jobs) in [(&acme, &acme_jobs), (&globex, &globex_jobs)] {
        let response = as_tenant_of(
            &app,
            ADMIN_TOKEN,
            "BillingSummary",
            tenant.id,
            everything.clone(),
        )
        .await;
        rows.figures(jobs)
            .assert_matches(data(&response, "billingSummary"));
        let response = as_tenant_of(&app, ADMIN_TOKEN, "JobCosts", tenant.id, json!({})).await;
        let expected: Vec<_> = jobs.iter().map(|job| job.id).collect();
        let edges = data(&response, "jobCosts")["edges"].as_array().unwrap();
        let nodes: Vec<_> = edges.iter().map(|edge| edge["node"].clone()).collect();
        assert_eq!(job_ids(&nodes), expected);
        let mine = app
            .operation(Some(&tenant.key), "CreditLedger", json!({}))
            .await;
        let admin = as_tenant_of(&app, ADMIN_TOKEN, "CreditLedger", tenant.id, json!({})).await;
        assert!(admin["errors"].is_null(), "{admin}");
        assert_eq!(admin["data"], mine["data"]);
    }

    // The ledger of each tenant is its own rows, newest first, and adds up to its
    // balance.
    for tenant in [&acme, &globex] {
        let entries = ledger_entries::Entity::find()
            .filter(ledger_entries::Column::TenantId.eq(tenant.id))
            .order_by_desc(ledger_entries::Column::Id)
            .all(&app.app.db)
            .await
            .unwrap();
        let response = app
            .operation(Some(&tenant.key), "CreditLedger", json!({"first": 100}))
            .await;
        let connection = data(&response, "creditLedger");
        assert_eq!(connection["pageInfo"]["hasNextPage"], false);
        let nodes: Vec<_> = connection["edges"]
            .as_array()
            .unwrap()
            .iter()
            .map(|edge| &edge["node"])
            .collect();
        assert_eq!(nodes.len(), entries.len());
        let mut by_kind: HashMap<String, Decimal> = HashMap::new();
        for (node, entry) in nodes.iter().zip(&entries) {
            assert_ledger_entry(node, entry);
            *by_kind
                .entry(node["kind"].as_str().unwrap().to_owned())
                .or_default() += decimal(&node["amount"]);
        }
        let balance = app.balance(tenant).await;
        let total = |kind: &str| by_kind.get(kind).copied().unwrap_or_default();
        assert_eq!(decimal(&balance["granted"]), total("GRANT"));
        assert_eq!(decimal(&balance["charged"]), total("CHARGE"));
        assert_eq!(
            decimal(&balance["held"]),
            total("HOLD") - total("RELEASE") - total("CHARGE")
        );
    }
    assert_billing_invariants(&app.app.db).await;
}
