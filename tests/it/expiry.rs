//! Credit grants with an expiry: what is left of a grant leaves the balance at its
//! `expiresAt` through an `EXPIRY` ledger entry, never taking held credit, once, even
//! with several sweeps at once or a process that was down at the instant.

use crate::helpers::{
    ADMIN_TOKEN, AppOptions, Backend, TestApp, TestTenant, decimal, error_code, job_input,
    spawn_app, spawn_app_with,
};
use crate::invariants::assert_billing_invariants;
use crate::webhooks::{Receiver, create_webhook};
use chrono::{DateTime, Utc};
use entity::{LedgerEntryKind, Timestamp, credit_grants, ledger_entries};
use jobledger::billing::{Credits, grant_expiry};
use rust_decimal::Decimal;
use sea_orm::{ColumnTrait, EntityTrait, QueryFilter, QueryOrder};
use serde_json::{Value, json};
use std::str::FromStr;
use std::time::Duration;
use uuid::Uuid;

on_both_backends!(
    expiry_leaves_held_credit_intact_and_the_audit_clean,
    a_held_jobs_charge_comes_out_of_the_expiring_grant,
    a_partly_consumed_grant_expires_only_its_remainder,
    two_sweepers_at_once_expire_each_grant_once,
    a_process_down_at_the_instant_expires_late,
    credit_past_its_expiry_is_never_held,
    balance_low_fires_after_an_expiry_crossing,
    grants_refuse_expiries_in_the_past_or_too_far_ahead,
    a_hold_taken_after_the_instant_never_spends_expired_credit,
);

const GRANT: &str = "mutation Grant($input: GrantCreditsInput!) {
  grantCredits(input: $input) { id amount expiresAt consumed expired }
}";

const BALANCE: &str = "query { account { balance { granted held charged expired available } } }";

/// Grants `amount` expiring at `expires_at` (never when `None`); returns the grant.
async fn grant(
    app: &TestApp,
    tenant: &TestTenant,
    amount: &str,
    expires_at: Option<DateTime<Utc>>,
) -> Value {
    let response = app
        .graphql(
            Some(ADMIN_TOKEN),
            GRANT,
            json!({"input": {
                "tenantId": tenant.id,
                "amount": amount,
                "idempotencyKey": Uuid::new_v4().to_string(),
                "expiresAt": expires_at.map(|at| at.to_rfc3339()),
            }}),
        )
        .await;
    assert!(response["errors"].is_null(), "{response}");
    response["data"]["grantCredits"].clone()
}

/// The tenant's balance, each figure as a decimal.
async fn balance(app: &TestApp, tenant: &TestTenant) -> [Decimal; 5] {
    let response = app.graphql(Some(&tenant.key), BALANCE, json!({})).await;
    assert!(response["errors"].is_null(), "{response}");
    let balance = &response["data"]["account"]["balance"];
    ["granted", "held", "charged", "expired", "available"].map(|name| decimal(&balance[name]))
}

fn credits(amount: &str) -> Credits {
    Credits::from_decimal(Decimal::from_str(amount).unwrap()).unwrap()
}

fn as_decimal(credits: Credits) -> Decimal {
    credits.to_decimal()
}

/// An instant an hour ahead, whole microseconds (what the database keeps).
fn in_an_hour() -> DateTime<Utc> {
    Timestamp::from(Utc::now() + chrono::Duration::hours(1)).to_datetime()
}

/// The sweep as a process running at `at` would do it.
async fn sweep_at(app: &TestApp, at: DateTime<Utc>) -> Credits {
    grant_expiry::sweep(&app.app.db, Timestamp::from(at))
        .await
        .unwrap()
}

async fn grant_row(app: &TestApp, id: &Value) -> credit_grants::Model {
    let id: Uuid = id.as_str().unwrap().parse().unwrap();
    credit_grants::Entity::find_by_id(id)
        .one(&app.app.db)
        .await
        .unwrap()
        .unwrap()
}

async fn expiry_entries(app: &TestApp, tenant: &TestTenant) -> Vec<ledger_entries::Model> {
    ledger_entries::Entity::find()
        .filter(ledger_entries::Column::TenantId.eq(tenant.id))
        .filter(ledger_entries::Column::Kind.eq(LedgerEntryKind::Expiry))
        .order_by_asc(ledger_entries::Column::Id)
        .all(&app.app.db)
        .await
        .unwrap()
}

async fn expiry_leaves_held_credit_intact_and_the_audit_clean(backend: Backend) {
    let app = spawn_app_with(backend, AppOptions::no_workers()).await;
    let tenant = app.create_tenant("acme").await;
    let expires_at = in_an_hour();
    let granted = grant(&app, &tenant, "1", Some(expires_at)).await;
    assert_eq!(
        granted["expiresAt"]
            .as_str()
            .unwrap()
            .parse::<DateTime<Utc>>()
            .unwrap(),
        expires_at
    );
    assert_eq!(decimal(&granted["expired"]), Decimal::ZERO);
    let job = app.create_job_ok(&tenant, job_input("held", "hello")).await;
    let [_, held, ..] = balance(&app, &tenant).await;
    assert!(held > Decimal::ZERO && held < Decimal::ONE);

    // Nothing is due before the instant.
    assert_eq!(
        sweep_at(&app, expires_at - chrono::Duration::seconds(1)).await,
        Credits::ZERO
    );
    // At it, what is available expires; the hold stays whole.
    let expired = sweep_at(&app, expires_at).await;
    assert_eq!(as_decimal(expired), Decimal::ONE - held);
    assert_eq!(
        balance(&app, &tenant).await,
        [
            Decimal::ONE,
            held,
            Decimal::ZERO,
            Decimal::ONE - held,
            Decimal::ZERO
        ]
    );
    assert_billing_invariants(&app.app.db).await;
    // Swept again: nothing more, the rest is held.
    assert_eq!(
        sweep_at(&app, expires_at + chrono::Duration::seconds(1)).await,
        Credits::ZERO
    );

    // The ledger shows the expiry, dated at the instant, about the grant.
    let ledger = app
        .operation(Some(&tenant.key), "CreditLedger", json!({"first": 10}))
        .await;
    let nodes: Vec<&Value> = ledger["data"]["creditLedger"]["edges"]
        .as_array()
        .unwrap()
        .iter()
        .map(|edge| &edge["node"])
        .collect();
    let expiry = nodes
        .iter()
        .find(|node| node["kind"] == "EXPIRY")
        .expect("an EXPIRY entry");
    assert_eq!(decimal(&expiry["amount"]), Decimal::ONE - held);
    assert_eq!(
        expiry["createdAt"]
            .as_str()
            .unwrap()
            .parse::<DateTime<Utc>>()
            .unwrap(),
        expires_at
    );
    let entries = expiry_entries(&app, &tenant).await;
    assert_eq!(entries.len(), 1);
    assert_eq!(
        entries[0].grant_id.map(|id| id.to_string()),
        granted["id"].as_str().map(str::to_owned)
    );

    // Released, the held part expires too: the grant is gone, the job never ran.
    let cancelled = app
        .operation(Some(&tenant.key), "CancelJob", json!({"id": job}))
        .await;
    assert_eq!(cancelled["data"]["cancelJob"]["status"], "CANCELLED");
    // Due at once: the app's own sweep may have carried it out before this one.
    sweep_at(&app, expires_at + chrono::Duration::seconds(2)).await;
    assert_eq!(
        balance(&app, &tenant).await,
        [
            Decimal::ONE,
            Decimal::ZERO,
            Decimal::ZERO,
            Decimal::ONE,
            Decimal::ZERO
        ]
    );
    let row = grant_row(&app, &granted["id"]).await;
    assert_eq!((row.consumed_nanos, row.expired_nanos), (0, 1_000_000_000));
    assert_billing_invariants(&app.app.db).await;
}

/// Held credit is backed by the soonest-expiring grant: the grant that never expires
/// survives a hold that spans the expiry, whether the job is charged or released.
async fn a_held_jobs_charge_comes_out_of_the_expiring_grant(backend: Backend) {
    let app = spawn_app_with(backend, AppOptions::no_workers()).await;
    let tenant = app.create_tenant("acme").await;
    let lasting = grant(&app, &tenant, "1", None).await;
    let expires_at = in_an_hour();
    let expiring = grant(&app, &tenant, "1", Some(expires_at)).await;
    let id = app
        .create_job_ok(&tenant, job_input("spans", "hello"))
        .await;
    let [_, held, ..] = balance(&app, &tenant).await;
    // The hold is backed by the expiring grant: only the rest of it expires, and the
    // lasting grant is all available.
    assert_eq!(
        as_decimal(sweep_at(&app, expires_at).await),
        Decimal::ONE - held
    );
    assert_eq!(balance(&app, &tenant).await[4], Decimal::ONE);
    // The job runs (another process's workers) and is charged from the expiring grant.
    let workers = app.another_process(AppOptions::default()).await;
    let job = app
        .wait_until_finished(&tenant, id, Duration::from_secs(30))
        .await;
    assert_eq!(job["status"], "SUCCEEDED", "{job}");
    drop(workers);
    let charge = decimal(&job["charge"]["amount"]);
    // What the hold released expires now (the settlement made it due at once, so the
    // app's own sweep may have carried it out already); the lasting grant is whole.
    sweep_at(&app, expires_at + chrono::Duration::seconds(1)).await;
    let [.., expired, available] = balance(&app, &tenant).await;
    assert_eq!((expired, available), (Decimal::ONE - charge, Decimal::ONE));
    let lasting = grant_row(&app, &lasting["id"]).await;
    let expiring = grant_row(&app, &expiring["id"]).await;
    assert_eq!((lasting.consumed_nanos, lasting.expired_nanos), (0, 0));
    assert_eq!(
        expiring.consumed_nanos + expiring.expired_nanos,
        1_000_000_000,
        "the expiring grant is used up"
    );
    assert_billing_invariants(&app.app.db).await;
}

async fn a_partly_consumed_grant_expires_only_its_remainder(backend: Backend) {
    let app = spawn_app(backend).await;
    let tenant = app.create_tenant("acme").await;
    let lasting = grant(&app, &tenant, "5", None).await;
    let run = |key: &'static str| {
        let (app, tenant) = (&app, &tenant);
        async move {
            let id = app.create_job_ok(tenant, job_input(key, "hello")).await;
            let job = app
                .wait_until_finished(tenant, id, Duration::from_secs(30))
                .await;
            assert_eq!(job["status"], "SUCCEEDED", "{job}");
            decimal(&job["charge"]["amount"])
        }
    };
    // Charged before the expiring grant existed: it consumed the lasting one.
    let before = run("before").await;
    let expires_at = in_an_hour();
    let expiring = grant(&app, &tenant, "1", Some(expires_at)).await;
    // Charged after: the soonest-expiring grant is consumed first.
    let after = run("after").await;
    assert!(before > Decimal::ZERO && after > Decimal::ZERO && after < Decimal::ONE);

    let expired = sweep_at(&app, expires_at).await;
    assert_eq!(
        as_decimal(expired),
        Decimal::ONE - after,
        "only the remainder expires"
    );
    let lasting = grant_row(&app, &lasting["id"]).await;
    let expiring = grant_row(&app, &expiring["id"]).await;
    let nanos = |amount: Decimal| credits(&amount.to_string()).nanos();
    assert_eq!(
        (lasting.consumed_nanos, lasting.expired_nanos),
        (nanos(before), 0)
    );
    assert_eq!(
        (expiring.consumed_nanos, expiring.expired_nanos),
        (nanos(after), 1_000_000_000 - nanos(after))
    );
    let [granted, held, charged, expired, available] = balance(&app, &tenant).await;
    assert_eq!(
        (granted, held, charged, expired),
        (
            Decimal::from(6),
            Decimal::ZERO,
            before + after,
            Decimal::ONE - after
        )
    );
    assert_eq!(
        available,
        Decimal::from(5) - before,
        "the lasting grant's remainder"
    );
    assert_billing_invariants(&app.app.db).await;
}

async fn two_sweepers_at_once_expire_each_grant_once(backend: Backend) {
    let app = spawn_app_with(backend, AppOptions::no_workers()).await;
    let other = app.another_process(AppOptions::no_workers()).await;
    let expires_at = in_an_hour();
    let mut tenants = Vec::new();
    for name in ["a", "b", "c", "d"] {
        let tenant = app.create_tenant(name).await;
        grant(&app, &tenant, "1", Some(expires_at)).await;
        grant(&app, &tenant, "0.5", None).await;
        tenants.push(tenant);
    }
    for round in 0..3 {
        let at = Timestamp::from(expires_at + chrono::Duration::milliseconds(round));
        let (first, second, third, fourth) = tokio::join!(
            grant_expiry::sweep(&app.app.db, at),
            grant_expiry::sweep(&other.app.db, at),
            grant_expiry::sweep(&app.app.db, at),
            grant_expiry::sweep(&other.app.db, at),
        );
        let total = first.unwrap() + second.unwrap() + third.unwrap() + fourth.unwrap();
        let wanted = if round == 0 {
            credits("4")
        } else {
            Credits::ZERO
        };
        assert_eq!(total, wanted, "round {round}");
    }
    for tenant in &tenants {
        let entries = expiry_entries(&app, tenant).await;
        assert_eq!(entries.len(), 1, "one expiry per grant: {entries:?}");
        assert_eq!(entries[0].amount_nanos, 1_000_000_000);
        let [.., expired, available] = balance(&app, tenant).await;
        assert_eq!((expired, available), (Decimal::ONE, Decimal::new(5, 1)));
    }
    assert_billing_invariants(&app.app.db).await;
}

async fn a_process_down_at_the_instant_expires_late(backend: Backend) {
    let app = spawn_app_with(backend, AppOptions::no_workers()).await;
    let tenant = app.create_tenant("acme").await;
    grant(&app, &tenant, "0.25", None).await;
    let expires_at = Timestamp::from(Utc::now() + chrono::Duration::seconds(2)).to_datetime();
    grant(&app, &tenant, "1", Some(expires_at)).await;
    // Down from before the instant until after it.
    let app = app
        .restart_after(AppOptions::no_workers(), async move {
            while Utc::now() <= expires_at + chrono::Duration::milliseconds(200) {
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        })
        .await;
    // The new process's sweep expires it, late, dated at the instant.
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    while balance(&app, &tenant).await[3] != Decimal::ONE {
        assert!(std::time::Instant::now() < deadline, "never expired");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let entries = expiry_entries(&app, &tenant).await;
    assert_eq!(entries.len(), 1);
    assert_eq!(entries[0].created_at.to_datetime(), expires_at);
    let (seconds, nanos) = entries[0].id.get_timestamp().unwrap().to_unix();
    let written = DateTime::from_timestamp(seconds as i64, nanos).unwrap();
    assert!(
        written > expires_at,
        "written after the restart, at {written}"
    );
    assert_eq!(balance(&app, &tenant).await[4], Decimal::new(25, 2));
    assert_billing_invariants(&app.app.db).await;
}

async fn credit_past_its_expiry_is_never_held(backend: Backend) {
    let app = spawn_app_with(backend, AppOptions::no_workers()).await;
    let tenant = app.create_tenant("acme").await;
    let expires_at = Timestamp::from(Utc::now() + chrono::Duration::seconds(2)).to_datetime();
    grant(&app, &tenant, "1", Some(expires_at)).await;
    let first = app.create_job(&tenant, job_input("before", "hello")).await;
    let hold = decimal(&first["data"]["createJob"]["job"]["reservation"]["amount"]);
    let cancelled = app
        .operation(
            Some(&tenant.key),
            "CancelJob",
            json!({"id": first["data"]["createJob"]["job"]["id"]}),
        )
        .await;
    assert_eq!(cancelled["data"]["cancelJob"]["status"], "CANCELLED");
    // Half a hold more, to the nano-credit a grant takes.
    let lasting = hold + (hold / Decimal::from(2)).round_dp(9);
    grant(&app, &tenant, &lasting.to_string(), None).await;
    while Utc::now() <= expires_at {
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    // The hold carries out the expiry due before it holds anything, whether the sweep
    // got there first or not: when it is admitted, the grant has expired.
    app.create_job_ok(&tenant, job_input("after", "hello"))
        .await;
    let [.., expired, available] = balance(&app, &tenant).await;
    assert_eq!((expired, available), (Decimal::ONE, lasting - hold));
    let refused = app.create_job(&tenant, job_input("refused", "hello")).await;
    assert_eq!(error_code(&refused), "INSUFFICIENT_CREDITS", "{refused}");
    assert_billing_invariants(&app.app.db).await;
}

async fn balance_low_fires_after_an_expiry_crossing(backend: Backend) {
    let receiver = Receiver::start(0, 500).await;
    let app = spawn_app_with(backend, AppOptions::no_workers()).await;
    let tenant = app.create_tenant("acme").await;
    let created = create_webhook(&app, &tenant, &receiver.url(), json!(["BALANCE_LOW"])).await;
    assert!(created["errors"].is_null(), "{created}");
    let set = app
        .operation(
            Some(ADMIN_TOKEN),
            "SetTenantLimits",
            json!({"input": {"tenantId": tenant.id, "lowBalanceThreshold": "2"}}),
        )
        .await;
    assert!(set["errors"].is_null(), "{set}");
    grant(&app, &tenant, "1", None).await;
    let expires_at = in_an_hour();
    grant(&app, &tenant, "5", Some(expires_at)).await;
    assert_eq!(sweep_at(&app, expires_at).await, credits("5"));
    let received = receiver.wait_for(1, Duration::from_secs(15)).await;
    let body: Value = serde_json::from_str(&received[0].body).unwrap();
    assert_eq!(body["type"], "balance.low");
    assert_eq!(decimal(&body["data"]["available"]), Decimal::ONE);
    assert_eq!(decimal(&body["data"]["threshold"]), Decimal::from(2));
    // Once per crossing: a later sweep with nothing to expire sends nothing.
    assert_eq!(
        sweep_at(&app, expires_at + chrono::Duration::minutes(1)).await,
        Credits::ZERO
    );
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert_eq!(receiver.received().len(), 1);
    assert_billing_invariants(&app.app.db).await;
}

async fn grants_refuse_expiries_in_the_past_or_too_far_ahead(backend: Backend) {
    let app = spawn_app_with(backend, AppOptions::no_workers()).await;
    let tenant = app.create_tenant("acme").await;
    let attempt = |expires_at: Value, key: &'static str, amount: &'static str| {
        let app = &app;
        let tenant = &tenant;
        async move {
            app.graphql(
                Some(ADMIN_TOKEN),
                GRANT,
                json!({"input": {
                    "tenantId": tenant.id, "amount": amount, "idempotencyKey": key,
                    "expiresAt": expires_at,
                }}),
            )
            .await
        }
    };
    for (expires_at, why) in [
        (Utc::now() - chrono::Duration::seconds(1), "in the past"),
        (DateTime::UNIX_EPOCH, "long past"),
        (
            Utc::now() + chrono::Duration::days(36_600),
            "past a hundred years",
        ),
        (
            "9999-12-31T23:59:59Z".parse().unwrap(),
            "the last instant of RFC 3339",
        ),
    ] {
        let refused = attempt(json!(expires_at.to_rfc3339()), "bad", "1").await;
        assert_eq!(error_code(&refused), "VALIDATION", "{why}: {refused}");
    }
    for malformed in [
        "tomorrow",
        "",
        "2026-13-01T00:00:00Z",
        "2026-01-01T00:00:00\u{0}Z",
        "+262142-12-31T23:59:59Z",
    ] {
        let refused = attempt(json!(malformed), "bad", "1").await;
        assert!(!refused["errors"].is_null(), "{malformed:?}: {refused}");
    }
    // One key, one grant: the same expiry replays it, another is a conflict.
    let expires_at = json!(in_an_hour().to_rfc3339());
    let first = attempt(expires_at.clone(), "once", "1").await;
    assert!(first["errors"].is_null(), "{first}");
    let replayed = attempt(expires_at, "once", "1").await;
    assert_eq!(
        replayed["data"]["grantCredits"]["id"],
        first["data"]["grantCredits"]["id"]
    );
    let other = attempt(json!(in_an_hour().to_rfc3339()), "once", "1").await;
    // `in_an_hour` moved on by at least a microsecond: another expiry.
    assert_eq!(error_code(&other), "IDEMPOTENCY_CONFLICT", "{other}");
    let never = attempt(Value::Null, "once", "1").await;
    assert_eq!(error_code(&never), "IDEMPOTENCY_CONFLICT", "{never}");
    let [granted, ..] = balance(&app, &tenant).await;
    assert_eq!(granted, Decimal::ONE);
    assert_billing_invariants(&app.app.db).await;
}

/// A hold open at a grant's instant keeps the grant's credit it backs; holds taken
/// after the instant are funded by other grants and never inherit that backing, so
/// when the old hold is released everything left of the expired grant expires.
/// (Re-matching held credit at every sweep let ten later jobs spend expired credit.)
async fn a_hold_taken_after_the_instant_never_spends_expired_credit(backend: Backend) {
    let app = spawn_app(backend).await;
    let tenant = app.create_tenant("acme").await;
    grant(&app, &tenant, "5", None).await;
    let expires_at = Timestamp::from(Utc::now() + chrono::Duration::seconds(3)).to_datetime();
    let expiring = grant(&app, &tenant, "5", Some(expires_at)).await;
    let mut parked = job_input("parked", "hello");
    parked["maxOutputTokens"] = json!(4000);
    parked["runAt"] = json!((Utc::now() + chrono::Duration::days(1)).to_rfc3339());
    let parked = app.create_job_ok(&tenant, parked).await;
    let [_, held, ..] = balance(&app, &tenant).await;
    assert!(held > Decimal::ZERO && held < Decimal::from(5), "{held}");

    // Past the instant, ten jobs run: their holds and charges come from the lasting
    // grant, whatever the parked hold still backs of the expired one.
    let wait = (expires_at - Utc::now()).to_std().unwrap_or_default();
    tokio::time::sleep(wait + Duration::from_millis(1500)).await;
    let mut charged = Decimal::ZERO;
    for n in 0..10 {
        let id = app
            .create_job_ok(&tenant, job_input(&format!("after-{n}"), "hello"))
            .await;
        let job = app
            .wait_until_finished(&tenant, id, Duration::from_secs(30))
            .await;
        assert_eq!(job["status"], "SUCCEEDED", "{job}");
        charged += decimal(&job["charge"]["amount"]);
    }
    let cancelled = app
        .operation(Some(&tenant.key), "CancelJob", json!({"id": parked}))
        .await;
    assert_eq!(cancelled["data"]["cancelJob"]["status"], "CANCELLED");
    sweep_at(&app, Utc::now()).await;

    let [granted, held, charged_total, expired, available] = balance(&app, &tenant).await;
    assert_eq!(
        (granted, held, charged_total, expired, available),
        (
            Decimal::from(10),
            Decimal::ZERO,
            charged,
            Decimal::from(5),
            Decimal::from(5) - charged
        ),
        "all of the expired grant expired; the later jobs paid from the lasting one"
    );
    let row = grant_row(&app, &expiring["id"]).await;
    assert_eq!((row.consumed_nanos, row.expired_nanos), (0, 5_000_000_000));
    assert_billing_invariants(&app.app.db).await;
}
