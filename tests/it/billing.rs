//! The billing dashboards (`JobCosts`, `BillingSummary`, `CreditLedger`) against sums
//! computed here from the rows: figures, time windows, paging, tenant isolation and
//! the admin variants.

use crate::helpers::{
    ADMIN_TOKEN, AppOptions, Backend, TestApp, TestTenant, decimal, error_code, job_input,
    spawn_app_with,
};
use crate::invariants::assert_billing_invariants;
use chrono::{DateTime, SecondsFormat, Utc};
use entity::{AttemptOutcome, JobStatus, Timestamp, attempts, charges, jobs, ledger_entries};
use rust_decimal::{Decimal, RoundingStrategy};
use sea_orm::{ColumnTrait, EntityTrait, QueryFilter, QueryOrder};
use serde_json::{Value, json};
use std::collections::{BTreeMap, HashMap};
use std::time::Duration;
use uuid::Uuid;

on_both_backends!(
    dashboards_agree_with_the_rows_per_tenant_and_for_admins,
    dashboards_page_newest_first_and_refuse_bad_arguments,
);

const LIMIT: Duration = Duration::from_secs(60);

fn no_workers() -> AppOptions {
    AppOptions::no_workers()
}

/// An amount of nano-credits as the API shows it.
fn credits(nanos: i64) -> Decimal {
    Decimal::new(nanos, 9)
}

fn rfc3339(at: DateTime<Utc>) -> String {
    at.to_rfc3339_opts(SecondsFormat::Micros, true)
}

fn at(timestamp: Timestamp) -> String {
    rfc3339(timestamp.to_datetime())
}

/// A contract operation with an extra `tenantId` argument, as an admin (or a curious
/// tenant) sends it: the same selection set as the contract.
fn with_tenant_id(name: &str) -> String {
    let mut text = crate::contract::operation(name);
    let header_end = text.find(')').expect("the operation has variables");
    text.insert_str(header_end, ", $tenantId: UUID");
    let body = text.find('{').unwrap();
    let arguments_end = body + text[body..].find(')').expect("the field has arguments");
    text.insert_str(arguments_end, ", tenantId: $tenantId");
    text
}

/// A contract operation asking for the fields the schema offers beyond the contract.
fn with_extra_fields(name: &str) -> String {
    let text = crate::contract::operation(name);
    let extended = match name {
        "JobCosts" => text.replacen("jobId", "jobId tenantId unknownAttempts", 1),
        "BillingSummary" => text
            .replacen("margin", "margin providerCostUpperBound", 1)
            .replacen(
                "customerCharges }",
                "customerCharges providerCostUpperBound margin }",
                1,
            ),
        _ => panic!("no extra fields for {name}"),
    };
    assert_ne!(extended, text, "the contract's {name} changed");
    extended
}

async fn as_tenant_of(
    app: &TestApp,
    key: &str,
    name: &str,
    tenant_id: Uuid,
    mut variables: Value,
) -> Value {
    variables["tenantId"] = json!(tenant_id);
    app.graphql(Some(key), &with_tenant_id(name), variables)
        .await
}

/// `data.<field>` of a response that must have no errors.
fn data<'a>(response: &'a Value, field: &str) -> &'a Value {
    assert!(response["errors"].is_null(), "{field} failed: {response}");
    &response["data"][field]
}

fn status_name(status: JobStatus) -> String {
    format!("{status:?}").to_uppercase()
}

/// Every row the dashboards are computed from, read back through SeaORM.
struct Rows {
    jobs: Vec<jobs::Model>,
    attempts: Vec<attempts::Model>,
    charges: Vec<charges::Model>,
}

impl Rows {
    async fn load(app: &TestApp) -> Self {
        let db = &app.app.db;
        Self {
            jobs: jobs::Entity::find()
                .order_by_desc(jobs::Column::Id)
                .all(db)
                .await
                .unwrap(),
            attempts: attempts::Entity::find().all(db).await.unwrap(),
            charges: charges::Entity::find().all(db).await.unwrap(),
        }
    }

    fn attempts_of(&self, job_id: Uuid) -> impl Iterator<Item = &attempts::Model> {
        self.attempts
            .iter()
            .filter(move |attempt| attempt.job_id == job_id)
    }

    fn charge_of(&self, job_id: Uuid) -> i64 {
        self.charges
            .iter()
            .filter(|charge| charge.job_id == job_id)
            .map(|charge| charge.amount_nanos)
            .sum()
    }

    /// The jobs `include` picks, newest first.
    fn jobs_where(&self, include: impl Fn(&jobs::Model) -> bool) -> Vec<&jobs::Model> {
        self.jobs.iter().filter(|job| include(job)).collect()
    }

    /// Checks one `jobCosts` node against the job's rows.
    fn assert_cost_line(&self, node: &Value) {
        let id: Uuid = node["jobId"].as_str().unwrap().parse().unwrap();
        let job = self.jobs.iter().find(|job| job.id == id).unwrap();
        let attempts: Vec<_> = self.attempts_of(id).collect();
        let exact: i64 = attempts.iter().filter_map(|a| a.provider_cost_nanos).sum();
        let bounds: i64 = attempts
            .iter()
            .filter(|a| a.provider_cost_nanos.is_none())
            .filter_map(|a| a.provider_cost_upper_bound_nanos)
            .sum();
        let charge = self.charge_of(id);
        assert_eq!(node["model"], job.model.as_str(), "{node}");
        assert_eq!(node["status"], status_name(job.status), "{node}");
        assert_eq!(node["attempts"], attempts.len(), "{node}");
        assert_eq!(decimal(&node["providerCost"]), credits(exact), "{node}");
        assert_eq!(
            decimal(&node["providerCostUpperBound"]),
            credits(exact + bounds),
            "{node}"
        );
        assert_eq!(decimal(&node["customerCharge"]), credits(charge), "{node}");
        assert_eq!(decimal(&node["margin"]), credits(charge - exact), "{node}");
        let created: DateTime<Utc> = node["createdAt"].as_str().unwrap().parse().unwrap();
        assert_eq!(created, job.created_at.to_datetime(), "{node}");
        // Beyond the contract: only in the documents that ask for them.
        if !node["tenantId"].is_null() {
            assert_eq!(node["tenantId"], job.tenant_id.to_string(), "{node}");
            let unknown = attempts
                .iter()
                .filter(|a| a.provider_cost_nanos.is_none())
                .count();
            assert_eq!(node["unknownAttempts"], unknown, "{node}");
        }
    }

    /// The summary of `jobs`, added up here.
    fn figures(&self, jobs: &[&jobs::Model]) -> Figures {
        let mut figures = Figures::default();
        for job in jobs {
            figures.created += 1;
            match job.status {
                JobStatus::Succeeded => figures.succeeded += 1,
                JobStatus::Failed => figures.failed += 1,
                JobStatus::Cancelled => figures.cancelled += 1,
                JobStatus::Queued | JobStatus::Running => {}
            }
            let attempts: Vec<_> = self.attempts_of(job.id).collect();
            figures.attempts += attempts.len() as i64;
            figures.retries += attempts.len().saturating_sub(1) as i64;
            figures.unknown += attempts
                .iter()
                .filter(|a| a.outcome == AttemptOutcome::Unknown)
                .count() as i64;
            figures.lease_expired += attempts
                .iter()
                .filter(|a| a.outcome == AttemptOutcome::LeaseExpired)
                .count() as i64;
            let cost: i64 = attempts.iter().filter_map(|a| a.provider_cost_nanos).sum();
            let bounds: i64 = attempts
                .iter()
                .filter(|a| a.provider_cost_nanos.is_none())
                .filter_map(|a| a.provider_cost_upper_bound_nanos)
                .sum();
            let charge = self.charge_of(job.id);
            figures.cost += cost;
            figures.bounds += bounds;
            figures.charges += charge;
            let model = figures.by_model.entry(job.model.clone()).or_default();
            model.jobs += 1;
            model.cost += cost;
            model.bounds += bounds;
            model.charges += charge;
        }
        figures
    }
}

#[derive(Debug, Default)]
struct ModelFigures {
    jobs: i64,
    cost: i64,
    bounds: i64,
    charges: i64,
}

#[derive(Debug, Default)]
struct Figures {
    created: i64,
    succeeded: i64,
    failed: i64,
    cancelled: i64,
    attempts: i64,
    retries: i64,
    unknown: i64,
    lease_expired: i64,
    cost: i64,
    bounds: i64,
    charges: i64,
    by_model: BTreeMap<String, ModelFigures>,
}

impl Figures {
    fn assert_matches(&self, summary: &Value) {
        assert_eq!(summary["jobsCreated"], self.created, "{summary}");
        assert_eq!(summary["jobsSucceeded"], self.succeeded, "{summary}");
        assert_eq!(summary["jobsFailed"], self.failed, "{summary}");
        assert_eq!(summary["jobsCancelled"], self.cancelled, "{summary}");
        assert_eq!(summary["providerAttempts"], self.attempts, "{summary}");
        let retry_rate = if self.attempts == 0 {
            0.0
        } else {
            self.retries as f64 / self.attempts as f64
        };
        let served = summary["retryRate"].as_f64().unwrap();
        assert!((served - retry_rate).abs() < 1e-12, "{summary}");
        assert_eq!(summary["unknownOutcomes"], self.unknown, "{summary}");
        assert_eq!(summary["leaseExpirations"], self.lease_expired, "{summary}");
        assert_eq!(decimal(&summary["providerCost"]), credits(self.cost));
        // Beyond the contract: only in the documents that ask for it.
        if !summary["providerCostUpperBound"].is_null() {
            assert_eq!(
                decimal(&summary["providerCostUpperBound"]),
                credits(self.cost + self.bounds)
            );
        }
        assert_eq!(decimal(&summary["customerCharges"]), credits(self.charges));
        assert_eq!(
            decimal(&summary["margin"]),
            credits(self.charges - self.cost)
        );
        if self.succeeded == 0 {
            assert!(summary["costPerSucceededJob"].is_null(), "{summary}");
        } else {
            let expected = (credits(self.cost) / Decimal::from(self.succeeded))
                .round_dp_with_strategy(9, RoundingStrategy::MidpointAwayFromZero);
            assert_eq!(decimal(&summary["costPerSucceededJob"]), expected);
        }
        let by_model = summary["byModel"].as_array().unwrap();
        let models: Vec<_> = by_model
            .iter()
            .map(|row| row["model"].as_str().unwrap())
            .collect();
        let expected_models: Vec<_> = self.by_model.keys().map(String::as_str).collect();
        assert_eq!(models, expected_models, "sorted by model: {summary}");
        for (row, expected) in by_model.iter().zip(self.by_model.values()) {
            assert_eq!(row["jobs"], expected.jobs, "{row}");
            assert_eq!(
                decimal(&row["providerCost"]),
                credits(expected.cost),
                "{row}"
            );
            assert_eq!(
                decimal(&row["customerCharges"]),
                credits(expected.charges),
                "{row}"
            );
            if !row["margin"].is_null() {
                assert_eq!(
                    decimal(&row["margin"]),
                    credits(expected.charges - expected.cost)
                );
                assert_eq!(
                    decimal(&row["providerCostUpperBound"]),
                    credits(expected.cost + expected.bounds)
                );
            }
        }
    }
}

/// The jobIds of every page of `JobCosts` (as `key` sees it), walking the cursors.
async fn all_job_cost_pages(app: &TestApp, key: &str, variables: Value) -> Vec<Value> {
    let mut nodes = Vec::new();
    let mut after = Value::Null;
    loop {
        let mut page_variables = variables.clone();
        page_variables["after"] = after.clone();
        let response = app.operation(Some(key), "JobCosts", page_variables).await;
        let connection = data(&response, "jobCosts");
        let edges = connection["edges"].as_array().unwrap();
        nodes.extend(edges.iter().map(|edge| edge["node"].clone()));
        if connection["pageInfo"]["hasNextPage"] == false {
            return nodes;
        }
        assert!(!edges.is_empty(), "a page with more after it is not empty");
        after = connection["pageInfo"]["endCursor"].clone();
    }
}

fn job_ids(nodes: &[Value]) -> Vec<Uuid> {
    nodes
        .iter()
        .map(|node| node["jobId"].as_str().unwrap().parse().unwrap())
        .collect()
}

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

fn assert_ledger_entry(node: &Value, entry: &ledger_entries::Model) {
    assert_eq!(node["id"], entry.id.to_string(), "{node}");
    assert_eq!(
        node["kind"],
        format!("{:?}", entry.kind).to_uppercase(),
        "{node}"
    );
    assert_eq!(
        decimal(&node["amount"]),
        credits(entry.amount_nanos),
        "{node}"
    );
    assert!(decimal(&node["amount"]) > Decimal::ZERO);
    assert_eq!(node["jobId"], json!(entry.job_id), "{node}");
    let created: DateTime<Utc> = node["createdAt"].as_str().unwrap().parse().unwrap();
    assert_eq!(created, entry.created_at.to_datetime());
}

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
    let mut after = Value::Null;
    let mut pages = Vec::new();
    let mut listed = Vec::new();
    loop {
        let response = app
            .operation(
                Some(&acme.key),
                "JobCosts",
                json!({"first": 2, "after": after}),
            )
            .await;
        let connection = data(&response, "jobCosts").clone();
        let nodes: Vec<_> = connection["edges"]
            .as_array()
            .unwrap()
            .iter()
            .map(|edge| edge["node"].clone())
            .collect();
        pages.push(nodes.len());
        let page_ids = job_ids(&nodes);
        assert_eq!(
            connection["pageInfo"]["endCursor"],
            json!(page_ids.last().map(Uuid::to_string))
        );
        for node in &nodes {
            // Queued and cancelled jobs have no attempts, no cost and no charge.
            assert_eq!(node["attempts"], 0);
            assert_eq!(decimal(&node["providerCost"]), Decimal::ZERO);
            assert_eq!(decimal(&node["providerCostUpperBound"]), Decimal::ZERO);
            assert_eq!(decimal(&node["customerCharge"]), Decimal::ZERO);
            assert_eq!(decimal(&node["margin"]), Decimal::ZERO);
        }
        listed.extend(page_ids);
        if connection["pageInfo"]["hasNextPage"] == false {
            break;
        }
        after = connection["pageInfo"]["endCursor"].clone();
    }
    assert_eq!(pages, [2, 2, 1]);
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
    let mut after = Value::Null;
    let mut pages = Vec::new();
    let mut listed = Vec::new();
    loop {
        let response = app
            .operation(
                Some(&acme.key),
                "CreditLedger",
                json!({"first": 3, "after": after}),
            )
            .await;
        let connection = data(&response, "creditLedger").clone();
        let nodes: Vec<_> = connection["edges"]
            .as_array()
            .unwrap()
            .iter()
            .map(|edge| edge["node"].clone())
            .collect();
        pages.push(nodes.len());
        listed.extend(nodes);
        if connection["pageInfo"]["hasNextPage"] == false {
            break;
        }
        after = connection["pageInfo"]["endCursor"].clone();
        assert_eq!(after, listed.last().unwrap()["id"]);
    }
    assert_eq!(pages, [3, 3, 1]);
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
