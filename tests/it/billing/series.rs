//! `BillingSeries` and `BillingByLabel`: the points add up to `BillingSummary` over the
//! same window, empty intervals are zeros, per-label rows add up to the jobs' own
//! `cost`, another tenant is invisible, and each report is one statement.

use super::{LIMIT, at, data, no_workers};
use crate::helpers::{
    AppOptions, Backend, TestTenant, decimal, error_code, job_input, spawn_app_with,
};
use entity::{Timestamp, jobs};
use jobledger::billing::reports::{self, ReportScope, SeriesInterval, Window};
use rust_decimal::Decimal;
use sea_orm::sea_query::{Expr, ExprTrait};
use sea_orm::{ColumnTrait, DatabaseConnection, EntityTrait, QueryFilter};
use serde_json::{Value, json};
use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use uuid::Uuid;

on_both_backends!(series_and_labels_add_up_to_the_summary_and_the_jobs_costs);

const HOUR: i64 = 3_600_000_000;

fn labelled(key: &str, content: &str, customer: &str) -> Value {
    let mut input = job_input(key, content);
    input["labels"] = json!([{"key": "customer", "value": customer}]);
    input
}

/// Moves a job's creation `hours` back, so that jobs fall in different intervals.
async fn created_hours_ago(db: &DatabaseConnection, id: Uuid, hours: i64) {
    jobs::Entity::update_many()
        .col_expr(
            jobs::Column::CreatedAt,
            Expr::col(jobs::Column::CreatedAt).sub(hours * HOUR),
        )
        .filter(jobs::Column::Id.eq(id))
        .exec(db)
        .await
        .unwrap();
}

/// A connection that counts the statements run through it.
fn counted(db: &DatabaseConnection) -> (DatabaseConnection, Arc<AtomicUsize>) {
    let statements = Arc::new(AtomicUsize::new(0));
    let counter = statements.clone();
    let mut db = db.clone();
    db.set_metric_callback(move |_| {
        counter.fetch_add(1, Ordering::SeqCst);
    });
    (db, statements)
}

fn sum(points: &[Value], field: &str) -> Decimal {
    points.iter().map(|point| decimal(&point[field])).sum()
}

fn count(points: &[Value], field: &str) -> i64 {
    points
        .iter()
        .map(|point| point[field].as_i64().unwrap())
        .sum()
}

async fn series_and_labels_add_up_to_the_summary_and_the_jobs_costs(backend: Backend) {
    let app = spawn_app_with(backend, no_workers()).await;
    let acme = app.funded_tenant("acme", "10").await;
    let globex = app.funded_tenant("globex", "10").await;
    let mut created: Vec<(TestTenant, Uuid, i64)> = Vec::new();
    for (tenant, input, hours_ago) in [
        (&acme, labelled("a", "Summarise the quarter.", "alice"), 0),
        (
            &acme,
            labelled("b", "hello [mock:status=503][mock:fail_first=1]", "bob"),
            0,
        ),
        (&acme, labelled("c", "hello [mock:status=400]", "alice"), 3),
        (&acme, job_input("unlabelled", "Translate: hello"), 3),
        (&globex, labelled("theirs", "A globex report.", "alice"), 3),
    ] {
        created.push((
            tenant.clone(),
            app.create_job_ok(tenant, input).await,
            hours_ago,
        ));
    }
    let app = app.restart(AppOptions::default()).await;
    for (tenant, id, hours_ago) in &created {
        app.wait_until_finished(tenant, *id, LIMIT).await;
        created_hours_ago(&app.app.db, *id, *hours_ago).await;
    }

    // Six hours ending an hour from now: the jobs are in points 1 and 4.
    let from = Timestamp::now().plus(chrono::Duration::hours(-5));
    let to = from.plus(chrono::Duration::hours(6));
    let window = json!({"from": at(from), "to": at(to)});
    let mut variables = window.clone();
    variables["interval"] = json!("HOUR");
    let response = app
        .operation(Some(&acme.key), "BillingSeries", variables.clone())
        .await;
    let points = data(&response, "billingSeries").as_array().unwrap().clone();
    assert_eq!(points.len(), 6, "{points:?}");
    for (index, point) in points.iter().enumerate() {
        let start: chrono::DateTime<chrono::Utc> =
            point["start"].as_str().unwrap().parse().unwrap();
        assert_eq!(
            Timestamp::from(start),
            from.plus(chrono::Duration::hours(index as i64))
        );
    }
    let jobs_per_point: Vec<_> = points
        .iter()
        .map(|p| p["jobsCreated"].as_i64().unwrap())
        .collect();
    assert_eq!(
        jobs_per_point,
        [0, 2, 0, 0, 2, 0],
        "globex's job is not acme's"
    );
    for empty in [0, 2, 3, 5] {
        let point = &points[empty];
        assert_eq!(decimal(&point["providerCost"]), Decimal::ZERO, "{point}");
        assert_eq!(decimal(&point["customerCharges"]), Decimal::ZERO, "{point}");
        assert_eq!(point["retryRate"], 0.0, "{point}");
        assert_eq!(point["unknownOutcomes"], 0, "{point}");
    }

    // The points add up to the summary of the window, figure by figure.
    let response = app
        .operation(Some(&acme.key), "BillingSummary", window.clone())
        .await;
    let summary = data(&response, "billingSummary");
    // Beyond the contract, a point has the margin, attempts and lease expirations the
    // console's per-day tables show.
    let extended = crate::contract::operation("BillingSeries").replacen(
        "unknownOutcomes",
        "unknownOutcomes margin providerAttempts leaseExpirations",
        1,
    );
    let response = app
        .graphql(Some(&acme.key), &extended, variables.clone())
        .await;
    let extended_points = data(&response, "billingSeries").as_array().unwrap();
    for field in [
        "jobsCreated",
        "jobsSucceeded",
        "jobsFailed",
        "unknownOutcomes",
        "providerAttempts",
        "leaseExpirations",
    ] {
        assert_eq!(
            json!(count(extended_points, field)),
            summary[field],
            "{field}"
        );
    }
    assert!(summary["providerAttempts"].as_i64().unwrap() >= 4);
    for field in ["providerCost", "customerCharges", "margin"] {
        assert_eq!(
            sum(extended_points, field),
            decimal(&summary[field]),
            "{field}"
        );
    }
    assert!(decimal(&summary["providerCost"]) > Decimal::ZERO);
    // The latest point holds a job of one attempt and one retried once: 1 retry of 3.
    assert_eq!(points[4]["retryRate"], 1.0 / 3.0, "{:?}", points[4]);

    // An admin naming acme sees the same series.
    let mut as_admin = variables.clone();
    as_admin["tenantId"] = json!(acme.id);
    let text = super::with_tenant_id("BillingSeries");
    let response = app
        .graphql(Some(crate::helpers::ADMIN_TOKEN), &text, as_admin)
        .await;
    assert_eq!(
        data(&response, "billingSeries").as_array().unwrap(),
        &points
    );

    // Past the bound of points, and a window that ends before it starts, are refused.
    for (from, to, interval) in [
        (from, from.plus(chrono::Duration::hours(1001)), "HOUR"),
        (from, from.plus(chrono::Duration::days(1001)), "DAY"),
        (to, from, "DAY"),
    ] {
        let response = app
            .operation(
                Some(&acme.key),
                "BillingSeries",
                json!({"from": at(from), "to": at(to), "interval": interval}),
            )
            .await;
        assert_eq!(error_code(&response), "VALIDATION", "{response}");
    }
    // A thousand days is one request of a thousand points.
    let response = app
        .operation(
            Some(&acme.key),
            "BillingSeries",
            json!({
                "from": at(from),
                "to": at(from.plus(chrono::Duration::days(1000))),
                "interval": "DAY",
            }),
        )
        .await;
    let days = data(&response, "billingSeries").as_array().unwrap();
    assert_eq!(days.len(), 1000);
    assert_eq!(count(days, "jobsCreated"), 4, "every job of acme");

    // Per label: each value's row adds up the jobs' own `cost` fields; the unlabelled
    // job and globex's are in no row.
    let mut expected: BTreeMap<&str, (i64, Decimal, Decimal)> = BTreeMap::new();
    for ((tenant, id, _), customer) in created.iter().zip(["alice", "bob", "alice"]) {
        let cost = app.job(tenant, *id).await["cost"].clone();
        let row = expected.entry(customer).or_default();
        row.0 += 1;
        row.1 += decimal(&cost["providerCost"]);
        row.2 += decimal(&cost["customerCharge"]);
    }
    let mut variables = window.clone();
    variables["key"] = json!("customer");
    let response = app
        .operation(Some(&acme.key), "BillingByLabel", variables)
        .await;
    let rows = data(&response, "billingByLabel").as_array().unwrap();
    let got: BTreeMap<&str, (i64, Decimal, Decimal)> = rows
        .iter()
        .map(|row| {
            let provider_cost = decimal(&row["providerCost"]);
            let customer_charges = decimal(&row["customerCharges"]);
            assert_eq!(
                decimal(&row["margin"]),
                customer_charges - provider_cost,
                "{row}"
            );
            (
                row["value"].as_str().unwrap(),
                (
                    row["jobs"].as_i64().unwrap(),
                    provider_cost,
                    customer_charges,
                ),
            )
        })
        .collect();
    assert_eq!(got, expected);
    let values: Vec<_> = rows.iter().map(|row| row["value"].clone()).collect();
    assert_eq!(values, [json!("alice"), json!("bob")], "sorted by value");

    // Each report is one statement, however many points or values it has.
    let (db, statements) = counted(&app.app.db);
    let scope = ReportScope::Tenant(acme.id);
    let series = reports::billing_series(&db, scope, from, to, SeriesInterval::Hour)
        .await
        .unwrap();
    assert_eq!(series.len(), 6);
    assert_eq!(statements.swap(0, Ordering::SeqCst), 1, "one grouped query");
    let window = Window::new(Some(from), Some(to)).unwrap();
    let labels = reports::billing_by_label(&db, scope, window, "customer")
        .await
        .unwrap();
    assert_eq!(labels.len(), 2);
    assert_eq!(statements.load(Ordering::SeqCst), 1, "one grouped query");
}
