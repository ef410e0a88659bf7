//! Access tokens (`createAccessToken`): a browser's short-lived credential that reads,
//! creates or cancels only the jobs within its reach, holds no more than its
//! `maxSpend`, and stops working when it expires — over HTTP, WebSocket and SSE.

use crate::contract::operation;
use crate::helpers::{
    AppOptions, Backend, TestApp, TestTenant, decimal, error_code, job_input, spawn_app,
    spawn_app_with,
};
use crate::invariants::assert_billing_invariants;
use crate::socket::{GraphqlSocket, Received};
use rust_decimal::Decimal;
use serde_json::{Value, json};
use std::time::{Duration, Instant};
use uuid::Uuid;

on_both_backends!(
    a_token_reads_only_jobs_carrying_its_labels,
    a_token_does_only_what_its_scopes_say,
    a_token_creates_jobs_with_its_labels_and_cancels_within_them,
    a_token_for_listed_jobs_reaches_those_alone,
    tokens_are_minted_by_a_tenant_for_itself_or_by_the_admin,
    bad_token_requests_are_refused,
    concurrent_creates_never_hold_more_than_max_spend,
    an_expired_token_is_refused_and_its_streams_end,
    a_token_that_may_not_read_learns_nothing_from_what_it_does,
    a_token_dies_with_the_key_that_minted_it,
    a_token_cannot_take_its_tenants_live_connections,
    the_keys_of_a_tokens_jobs_are_its_labels_own,
);

/// Mints a token with `input` (scopes, labels, …) for `minter`; returns it as a
/// tenant of the same id whose key is the token, so the job helpers take it.
async fn mint(app: &TestApp, minter: &str, tenant: &TestTenant, input: Value) -> TestTenant {
    let response = app
        .operation(Some(minter), "CreateAccessToken", json!({"input": input}))
        .await;
    assert!(response["errors"].is_null(), "{response}");
    let token = response["data"]["createAccessToken"]["token"]
        .as_str()
        .unwrap()
        .to_owned();
    assert!(token.starts_with("jlt_"), "{token}");
    TestTenant {
        id: tenant.id,
        key: token,
    }
}

fn labelled(key: &str, labels: Value) -> Value {
    let mut input = job_input(key, "Summarise the document.");
    input["labels"] = labels;
    input
}

fn user(value: &str) -> Value {
    json!([{"key": "user", "value": value}])
}

async fn job_as(app: &TestApp, credential: &TestTenant, id: Uuid) -> Value {
    app.operation(Some(&credential.key), "Job", json!({"id": id}))
        .await
}

async fn listed_ids(app: &TestApp, credential: &TestTenant) -> Vec<String> {
    let response = app
        .operation(Some(&credential.key), "Jobs", json!({"first": 100}))
        .await;
    assert!(response["errors"].is_null(), "{response}");
    let mut ids: Vec<String> = response["data"]["jobs"]["edges"]
        .as_array()
        .unwrap()
        .iter()
        .map(|edge| edge["node"]["id"].as_str().unwrap().to_owned())
        .collect();
    ids.sort();
    ids
}

fn sorted(ids: &[Uuid]) -> Vec<String> {
    let mut ids: Vec<String> = ids.iter().map(Uuid::to_string).collect();
    ids.sort();
    ids
}

async fn a_token_reads_only_jobs_carrying_its_labels(backend: Backend) {
    let app = spawn_app_with(backend, AppOptions::no_workers()).await;
    let tenant = app.funded_tenant("acme", "5").await;
    let mine = app
        .create_job_ok(
            &tenant,
            labelled(
                "mine",
                json!([{"key": "user", "value": "u1"}, {"key": "doc", "value": "d1"}]),
            ),
        )
        .await;
    let also_mine = app
        .create_job_ok(&tenant, labelled("also-mine", user("u1")))
        .await;
    let theirs = app
        .create_job_ok(&tenant, labelled("theirs", user("u2")))
        .await;
    let unlabelled = app
        .create_job_ok(&tenant, job_input("plain", "hello"))
        .await;
    let token = mint(
        &app,
        &tenant.key,
        &tenant,
        json!({"scopes": ["READ_JOBS"], "labels": user("u1")}),
    )
    .await;

    for id in [mine, also_mine] {
        let response = job_as(&app, &token, id).await;
        assert!(response["errors"].is_null(), "{response}");
        assert_eq!(response["data"]["job"]["id"], id.to_string());
    }
    for id in [theirs, unlabelled] {
        assert_eq!(error_code(&job_as(&app, &token, id).await), "NOT_FOUND");
    }
    assert_eq!(listed_ids(&app, &token).await, sorted(&[mine, also_mine]));
    // The client's own label filter narrows within the reach, never beyond it.
    let by_label = |key: &str, value: &str| json!({"key": key, "value": value, "first": 100});
    let narrowed = app
        .operation(Some(&token.key), "JobsByLabel", by_label("doc", "d1"))
        .await;
    let edges = narrowed["data"]["jobs"]["edges"]
        .as_array()
        .unwrap_or_else(|| panic!("{narrowed}"));
    assert_eq!(edges.len(), 1, "{narrowed}");
    assert_eq!(edges[0]["node"]["id"], mine.to_string());
    let outside = app
        .operation(Some(&token.key), "JobsByLabel", by_label("user", "u2"))
        .await;
    assert!(outside["errors"].is_null(), "{outside}");
    assert_eq!(
        outside.to_string().matches(&theirs.to_string()).count(),
        0,
        "{outside}"
    );
    // By idempotency key, too.
    let by_key = |key: &str| json!({"key": key});
    let found = app
        .operation(Some(&token.key), "JobByKey", by_key("mine"))
        .await;
    assert!(found["errors"].is_null(), "{found}");
    let hidden = app
        .operation(Some(&token.key), "JobByKey", by_key("theirs"))
        .await;
    assert_eq!(error_code(&hidden), "NOT_FOUND");

    // Live updates of a job within reach; a job out of reach is NOT_FOUND there too.
    let mut socket = GraphqlSocket::connect(app.address).await;
    socket.init_ok(&token.key).await;
    socket
        .subscribe("1", &operation("JobUpdates"), json!({"jobId": mine}))
        .await;
    match socket.next(Duration::from_secs(5)).await {
        Received::Message(message) => {
            assert_eq!(message["type"], "next", "{message}");
            assert_eq!(message["payload"]["data"]["jobUpdates"]["kind"], "CREATED");
        }
        other => panic!("the job's first event: {other:?}"),
    }
    socket
        .subscribe("2", &operation("JobUpdates"), json!({"jobId": theirs}))
        .await;
    let refused = loop {
        match socket.next(Duration::from_secs(5)).await {
            Received::Message(message) if message["id"] == "2" => break message,
            Received::Message(_) => {}
            other => panic!("an answer to the second subscription: {other:?}"),
        }
    };
    assert_eq!(
        refused["payload"]["errors"][0]["extensions"]["code"], "NOT_FOUND",
        "{refused}"
    );
    assert!(refused["payload"]["data"].is_null(), "{refused}");
}

/// Every operation outside the token's scopes, and every one that is not about jobs,
/// is FORBIDDEN: billing, the ledger, keys, webhooks, limits, tokens, batches, reruns.
async fn a_token_does_only_what_its_scopes_say(backend: Backend) {
    let app = spawn_app_with(backend, AppOptions::no_workers()).await;
    let tenant = app.funded_tenant("acme", "5").await;
    let job = app
        .create_job_ok(&tenant, labelled("mine", user("u1")))
        .await;
    let reader = mint(
        &app,
        &tenant.key,
        &tenant,
        json!({"scopes": ["READ_JOBS"], "labels": user("u1")}),
    )
    .await;
    let creator = mint(
        &app,
        &tenant.key,
        &tenant,
        json!({"scopes": ["CREATE_JOBS"], "labels": user("u1")}),
    )
    .await;
    let some_id = Uuid::now_v7();
    let window = json!({"from": "2026-01-01T00:00:00Z", "to": "2027-01-01T00:00:00Z"});
    let mut forbidden = vec![
        ("Account", json!({})),
        ("AccountLimits", json!({})),
        ("JobCosts", json!({})),
        ("BillingSummary", window.clone()),
        (
            "BillingSeries",
            json!({"from": window["from"], "to": window["to"], "interval": "DAY"}),
        ),
        (
            "BillingByLabel",
            json!({"from": window["from"], "to": window["to"], "key": "user"}),
        ),
        ("CreditLedger", json!({})),
        ("CreateApiKey", json!({"name": "stolen"})),
        ("RevokeApiKey", json!({"id": some_id})),
        ("ApiKeys", json!({})),
        (
            "CreateWebhook",
            json!({"input": {"url": "https://example.com/hook", "events": ["JOB_SUCCEEDED"]}}),
        ),
        ("DeleteWebhook", json!({"id": some_id})),
        ("Webhooks", json!({})),
        ("WebhookDeliveries", json!({})),
        ("CreateTenant", json!({"name": "mallory"})),
        (
            "GrantCredits",
            json!({"input": {"tenantId": tenant.id, "amount": "100", "idempotencyKey": "free"}}),
        ),
        (
            "SetTenantLimits",
            json!({"input": {"tenantId": tenant.id, "dailySpendLimit": null}}),
        ),
        (
            "CreateAccessToken",
            json!({"input": {"scopes": ["READ_JOBS", "CREATE_JOBS"]}}),
        ),
        ("RerunJob", json!({"id": job, "idempotencyKey": "again"})),
        (
            "CreateBatch",
            json!({"input": {"idempotencyKey": "b", "model": "sim-small", "maxOutputTokens": 16}}),
        ),
        ("Batches", json!({})),
        ("Batch", json!({"id": some_id})),
    ];
    for (name, variables) in forbidden.drain(..) {
        for token in [&reader, &creator] {
            let response = app
                .operation(Some(&token.key), name, variables.clone())
                .await;
            assert_eq!(error_code(&response), "FORBIDDEN", "{name}: {response}");
        }
    }
    // The scopes it lacks.
    let created = app
        .create_job(&reader, labelled("by-reader", user("u1")))
        .await;
    assert_eq!(error_code(&created), "FORBIDDEN", "{created}");
    let cancelled = app
        .operation(Some(&reader.key), "CancelJob", json!({"id": job}))
        .await;
    assert_eq!(error_code(&cancelled), "FORBIDDEN", "{cancelled}");
    assert_eq!(error_code(&job_as(&app, &creator, job).await), "FORBIDDEN");
    let account_stream = app
        .subscribe(
            &reader.key,
            &operation("AccountJobUpdates"),
            json!({}),
            Duration::from_secs(5),
        )
        .await
        .unwrap();
    assert_eq!(account_stream.len(), 1, "{account_stream:?}");
    assert_eq!(
        account_stream[0]["errors"][0]["extensions"]["code"],
        "FORBIDDEN"
    );
    // Nothing of that changed the job or the account.
    assert_eq!(app.job(&tenant, job).await["status"], "QUEUED");
    assert_billing_invariants(&app.app.db).await;
}

async fn a_token_creates_jobs_with_its_labels_and_cancels_within_them(backend: Backend) {
    let app = spawn_app_with(backend, AppOptions::no_workers()).await;
    let tenant = app.funded_tenant("acme", "5").await;
    let theirs = app
        .create_job_ok(&tenant, labelled("theirs", user("u2")))
        .await;
    let token = mint(
        &app,
        &tenant.key,
        &tenant,
        json!({"scopes": ["READ_JOBS", "CREATE_JOBS", "CANCEL_JOBS"], "labels": user("u1")}),
    )
    .await;

    // The job it creates carries its label, with the client's own ones.
    let created = app
        .create_job_ok(
            &token,
            labelled("by-token", json!([{"key": "doc", "value": "d9"}])),
        )
        .await;
    let labels = app
        .graphql(
            Some(&tenant.key),
            "query($id: UUID!) { job(id: $id) { labels { key value } } }",
            json!({"id": created}),
        )
        .await;
    assert_eq!(
        labels["data"]["job"]["labels"],
        json!([{"key": "doc", "value": "d9"}, {"key": "user", "value": "u1"}]),
        "{labels}"
    );
    // So it sees what it made; the same key again replays it.
    assert_eq!(listed_ids(&app, &token).await, sorted(&[created]));
    let replay = app
        .create_job(
            &token,
            labelled("by-token", json!([{"key": "doc", "value": "d9"}])),
        )
        .await;
    assert_eq!(replay["data"]["createJob"]["replayed"], true, "{replay}");
    // A label that would put the job out of its reach is refused.
    let escaping = app.create_job(&token, labelled("escape", user("u2"))).await;
    assert_eq!(error_code(&escaping), "VALIDATION", "{escaping}");

    let cancel = |id: Uuid| {
        let key = token.key.clone();
        let app = &app;
        async move {
            app.operation(Some(&key), "CancelJob", json!({"id": id}))
                .await
        }
    };
    assert_eq!(error_code(&cancel(theirs).await), "NOT_FOUND");
    assert_eq!(app.job(&tenant, theirs).await["status"], "QUEUED");
    let cancelled = cancel(created).await;
    assert!(cancelled["errors"].is_null(), "{cancelled}");
    assert_eq!(app.job(&tenant, created).await["status"], "CANCELLED");
    assert_billing_invariants(&app.app.db).await;
}

async fn a_token_for_listed_jobs_reaches_those_alone(backend: Backend) {
    let app = spawn_app_with(backend, AppOptions::no_workers()).await;
    let tenant = app.funded_tenant("acme", "5").await;
    let first = app.create_job_ok(&tenant, job_input("first", "a")).await;
    let second = app.create_job_ok(&tenant, job_input("second", "b")).await;
    let other = app.create_job_ok(&tenant, job_input("other", "c")).await;
    let token = mint(
        &app,
        &tenant.key,
        &tenant,
        json!({"scopes": ["READ_JOBS", "CANCEL_JOBS"], "jobIds": [first, second]}),
    )
    .await;
    assert_eq!(listed_ids(&app, &token).await, sorted(&[first, second]));
    assert!(job_as(&app, &token, second).await["errors"].is_null());
    assert_eq!(error_code(&job_as(&app, &token, other).await), "NOT_FOUND");
    let cancelled = app
        .operation(Some(&token.key), "CancelJob", json!({"id": other}))
        .await;
    assert_eq!(error_code(&cancelled), "NOT_FOUND");
    assert_eq!(app.job(&tenant, other).await["status"], "QUEUED");
}

async fn tokens_are_minted_by_a_tenant_for_itself_or_by_the_admin(backend: Backend) {
    let app = spawn_app_with(backend, AppOptions::no_workers()).await;
    let acme = app.funded_tenant("acme", "5").await;
    let globex = app.funded_tenant("globex", "5").await;
    let acme_job = app.create_job_ok(&acme, job_input("shared-key", "a")).await;
    let globex_job = app
        .create_job_ok(&globex, job_input("shared-key", "b"))
        .await;

    // A token of one tenant reaches nothing of another's, even with no labels at all.
    let globex_token = mint(&app, &globex.key, &globex, json!({"scopes": ["READ_JOBS"]})).await;
    assert_eq!(
        error_code(&job_as(&app, &globex_token, acme_job).await),
        "NOT_FOUND"
    );
    assert_eq!(listed_ids(&app, &globex_token).await, sorted(&[globex_job]));
    let named = app
        .graphql(
            Some(&globex_token.key),
            "query($id: UUID!, $tenant: UUID) { job(id: $id, tenantId: $tenant) { id } }",
            json!({"id": acme_job, "tenant": acme.id}),
        )
        .await;
    assert_eq!(error_code(&named), "FORBIDDEN", "{named}");

    // A tenant key may not mint for another tenant.
    let foreign = app
        .operation(
            Some(&globex.key),
            "CreateAccessToken",
            json!({"input": {"scopes": ["READ_JOBS"], "tenantId": acme.id}}),
        )
        .await;
    assert_eq!(error_code(&foreign), "FORBIDDEN", "{foreign}");
    // The admin mints for the tenant it names, and must name one.
    let admin = crate::helpers::ADMIN_TOKEN;
    let unnamed = app
        .operation(
            Some(admin),
            "CreateAccessToken",
            json!({"input": {"scopes": ["READ_JOBS"]}}),
        )
        .await;
    assert_eq!(error_code(&unnamed), "VALIDATION", "{unnamed}");
    let for_acme = mint(
        &app,
        admin,
        &acme,
        json!({"scopes": ["READ_JOBS"], "tenantId": acme.id}),
    )
    .await;
    assert_eq!(listed_ids(&app, &for_acme).await, sorted(&[acme_job]));
    // The answer says what the token may do and until when.
    let response = app
        .operation(
            Some(&acme.key),
            "CreateAccessToken",
            json!({"input": {"scopes": ["CANCEL_JOBS", "READ_JOBS", "READ_JOBS"], "ttlSeconds": 60}}),
        )
        .await;
    let minted = &response["data"]["createAccessToken"];
    assert_eq!(
        minted["scopes"],
        json!(["READ_JOBS", "CANCEL_JOBS"]),
        "{response}"
    );
    let expires_at: chrono::DateTime<chrono::Utc> =
        minted["expiresAt"].as_str().unwrap().parse().unwrap();
    let left = expires_at - chrono::Utc::now();
    assert!(
        left > chrono::Duration::seconds(50) && left <= chrono::Duration::seconds(60),
        "{left}"
    );
}

async fn bad_token_requests_are_refused(backend: Backend) {
    let app = spawn_app_with(backend, AppOptions::no_workers()).await;
    let tenant = app.funded_tenant("acme", "5").await;
    let job = app.create_job_ok(&tenant, job_input("a", "a")).await;
    let cases = [
        (json!({"scopes": []}), "at least one"),
        (
            json!({"scopes": ["READ_JOBS"], "ttlSeconds": 86_401}),
            "86400",
        ),
        (json!({"scopes": ["READ_JOBS"], "ttlSeconds": 0}), "86400"),
        (
            json!({"scopes": ["READ_JOBS"], "labels": user("u1"), "jobIds": [job]}),
            "not both",
        ),
        (json!({"scopes": ["READ_JOBS"], "jobIds": []}), "1 to 100"),
        (
            json!({"scopes": ["CREATE_JOBS"], "jobIds": [job]}),
            "CREATE_JOBS",
        ),
        (
            json!({"scopes": ["READ_JOBS"], "maxSpend": "1"}),
            "CREATE_JOBS",
        ),
        (
            json!({"scopes": ["CREATE_JOBS"], "maxSpend": "-1"}),
            "negative",
        ),
        (
            json!({"scopes": ["READ_JOBS"], "labels": [{"key": "user", "value": "a\u{200B}"}]}),
            "invisible",
        ),
    ];
    for (input, reason) in cases {
        let response = app
            .operation(
                Some(&tenant.key),
                "CreateAccessToken",
                json!({"input": input}),
            )
            .await;
        assert_eq!(error_code(&response), "VALIDATION", "{input}: {response}");
        let message = response["errors"][0]["message"].as_str().unwrap();
        assert!(message.contains(reason), "{message:?} should say {reason}");
    }
    // A token of the longest life is accepted.
    mint(
        &app,
        &tenant.key,
        &tenant,
        json!({"scopes": ["READ_JOBS"], "ttlSeconds": 86_400}),
    )
    .await;
    // No key, or a made-up token, is refused before any resolver runs.
    let made_up = app
        .graphql(
            Some("jlt_0123"),
            "{ jobs { edges { node { id } } } }",
            json!({}),
        )
        .await;
    assert_eq!(error_code(&made_up), "UNAUTHENTICATED");
}

/// Twenty creates at once under a token whose `maxSpend` covers exactly five holds:
/// five are admitted, the rest refused with SPEND_LIMIT_EXCEEDED, and replays count
/// nothing again.
async fn concurrent_creates_never_hold_more_than_max_spend(backend: Backend) {
    let app = spawn_app_with(backend, AppOptions::no_workers()).await;
    let tenant = app.funded_tenant("acme", "100").await;
    // The hold of one job of this input, measured with the tenant's key.
    let probe = app
        .create_job_ok(&tenant, job_input("probe", "same text"))
        .await;
    let probe_job = app.job(&tenant, probe).await;
    let hold = decimal(&probe_job["reservation"]["amount"]);
    assert!(hold > Decimal::ZERO, "{probe_job}");
    let max_spend = hold * Decimal::from(5);
    let token = mint(
        &app,
        &tenant.key,
        &tenant,
        json!({"scopes": ["CREATE_JOBS", "READ_JOBS"], "labels": user("u1"), "maxSpend": max_spend.to_string()}),
    )
    .await;
    let creates = (0..20).map(|index| {
        let app = &app;
        let token = &token;
        async move {
            app.create_job(token, job_input(&format!("burst-{index}"), "same text"))
                .await
        }
    });
    let responses = futures_util::future::join_all(creates).await;
    let admitted: Vec<&Value> = responses
        .iter()
        .filter(|response| response["errors"].is_null())
        .collect();
    let refused: Vec<&Value> = responses
        .iter()
        .filter(|response| !response["errors"].is_null())
        .collect();
    assert_eq!(admitted.len(), 5, "{responses:?}");
    for response in &refused {
        assert_eq!(error_code(response), "SPEND_LIMIT_EXCEEDED", "{response}");
        assert_eq!(response["errors"][0]["extensions"]["period"], "TOKEN");
    }
    // What the token's jobs hold adds up to at most its maxSpend.
    let ids = listed_ids(&app, &token).await;
    assert_eq!(ids.len(), 5);
    let mut held = Decimal::ZERO;
    for id in &ids {
        held += decimal(&app.job(&tenant, id.parse().unwrap()).await["reservation"]["amount"]);
    }
    assert!(held <= max_spend, "{held} > {max_spend}");
    // A replay of an admitted create is answered, and counts nothing again.
    let replayed_key = admitted[0]["data"]["createJob"]["job"]["idempotencyKey"]
        .as_str()
        .unwrap();
    let replay = app
        .create_job(&token, job_input(replayed_key, "same text"))
        .await;
    assert_eq!(replay["data"]["createJob"]["replayed"], true, "{replay}");
    // The tenant's own key is not bound by the token's cap.
    app.create_job_ok(&tenant, job_input("tenant-after", "same text"))
        .await;
    assert_billing_invariants(&app.app.db).await;
}

async fn an_expired_token_is_refused_and_its_streams_end(backend: Backend) {
    let app = spawn_app(backend).await;
    let tenant = app.funded_tenant("acme", "5").await;
    // Scheduled far ahead, so that the job's stream stays open.
    let mut input = job_input("later", "hello");
    input["runAt"] = json!((chrono::Utc::now() + chrono::Duration::days(30)).to_rfc3339());
    let job = app.create_job_ok(&tenant, input).await;
    let token = mint(
        &app,
        &tenant.key,
        &tenant,
        json!({"scopes": ["READ_JOBS"], "ttlSeconds": 2}),
    )
    .await;
    let minted_at = Instant::now();
    let mut socket = GraphqlSocket::connect(app.address).await;
    socket.init_ok(&token.key).await;
    socket
        .subscribe("1", &operation("JobUpdates"), json!({"jobId": job}))
        .await;
    let sse = {
        let address = app.address;
        let http = app.http.clone();
        let key = token.key.clone();
        tokio::spawn(async move {
            http.post(format!("http://{address}/graphql/sse"))
                .bearer_auth(&key)
                .json(&json!({"query": operation("JobUpdates"), "variables": {"jobId": job}}))
                .send()
                .await
                .unwrap()
                .text()
                .await
                .unwrap()
        })
    };
    assert!(job_as(&app, &token, job).await["errors"].is_null());

    assert_eq!(socket.closed_code(Duration::from_secs(7)).await, 4403);
    let closed_after = minted_at.elapsed();
    assert!(
        closed_after >= Duration::from_millis(1_500) && closed_after < Duration::from_secs(7),
        "closed {closed_after:?} after minting"
    );
    let body = tokio::time::timeout(Duration::from_secs(5), sse)
        .await
        .expect("the SSE stream ended soon after the expiry")
        .unwrap();
    assert!(body.contains("the access token has expired"), "{body}");
    assert!(body.contains("event: complete"), "{body}");

    let response = app
        .http
        .post(format!("http://{}/graphql", app.address))
        .bearer_auth(&token.key)
        .json(&json!({"query": operation("Job"), "variables": {"id": job}}))
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 401);
    let body: Value = response.json().await.unwrap();
    assert_eq!(error_code(&body), "UNAUTHENTICATED");
    // A new connection with it is refused at its handshake.
    let mut late = GraphqlSocket::connect(app.address).await;
    match late.init(&token.key).await {
        Received::Closed(code, reason) => {
            assert_eq!(code, 4403);
            assert!(reason.contains("expired"), "{reason}");
        }
        other => panic!("an expired token must be refused: {other:?}"),
    }
}

/// A token that may create or cancel but not read gets back what it did (the job's id,
/// status, hold) and nothing of the job's contents: not through `cancelJob`'s answer,
/// nor through a replayed `createJob`.
async fn a_token_that_may_not_read_learns_nothing_from_what_it_does(backend: Backend) {
    let app = spawn_app(backend).await;
    let tenant = app.funded_tenant("acme", "5").await;
    let mut input = labelled("secret", user("u1"));
    input["metadata"] = json!({"secret": "s3cr3t"});
    let job = app.create_job_ok(&tenant, input.clone()).await;
    app.wait_until_finished(&tenant, job, Duration::from_secs(30))
        .await;
    let canceller = mint(
        &app,
        &tenant.key,
        &tenant,
        json!({"scopes": ["CANCEL_JOBS"], "labels": user("u1")}),
    )
    .await;
    let answer = app
        .graphql(
            Some(&canceller.key),
            "mutation($id: UUID!) { cancelJob(id: $id) { id status result input } }",
            json!({"id": job}),
        )
        .await;
    assert_eq!(error_code(&answer), "FORBIDDEN", "{answer}");
    assert!(!answer.to_string().contains("s3cr3t"), "{answer}");
    assert!(!answer.to_string().contains("Summ"), "{answer}");
    let plain = app
        .operation(Some(&canceller.key), "CancelJob", json!({"id": job}))
        .await;
    assert!(plain["errors"].is_null(), "{plain}");
    assert_eq!(plain["data"]["cancelJob"]["status"], "SUCCEEDED");

    let creator = mint(
        &app,
        &tenant.key,
        &tenant,
        json!({"scopes": ["CREATE_JOBS"], "labels": user("u1")}),
    )
    .await;
    let replayed = app
        .graphql(
            Some(&creator.key),
            "mutation($input: CreateJobInput!) { createJob(input: $input) { replayed job { id status input result events { kind } } } }",
            json!({"input": input}),
        )
        .await;
    assert_eq!(error_code(&replayed), "FORBIDDEN", "{replayed}");
    assert!(!replayed.to_string().contains("s3cr3t"), "{replayed}");
    // The contract's own createJob answer (id, status, key, model, hold) is its own.
    let contract = app.create_job(&creator, labelled("made", user("u1"))).await;
    assert!(contract["errors"].is_null(), "{contract}");
}

/// Revoking the key that minted a token ends the token: over HTTP at once, and on its
/// open sockets as for the key itself.
async fn a_token_dies_with_the_key_that_minted_it(backend: Backend) {
    let app = spawn_app_with(backend, AppOptions::no_workers()).await;
    let tenant = app.funded_tenant("acme", "5").await;
    let created = app
        .operation(
            Some(&tenant.key),
            "CreateApiKey",
            json!({"name": "backend"}),
        )
        .await;
    let backend_key = created["data"]["createApiKey"]["apiKey"]
        .as_str()
        .unwrap()
        .to_owned();
    let key_id = created["data"]["createApiKey"]["key"]["id"].clone();
    let job = app
        .create_job_ok(&tenant, job_input("queued", "hello"))
        .await;
    let token = mint(
        &app,
        &backend_key,
        &tenant,
        json!({"scopes": ["READ_JOBS"]}),
    )
    .await;
    let admin_minted = mint(
        &app,
        crate::helpers::ADMIN_TOKEN,
        &tenant,
        json!({"scopes": ["READ_JOBS"], "tenantId": tenant.id}),
    )
    .await;
    let mut socket = GraphqlSocket::connect(app.address).await;
    socket.init_ok(&token.key).await;
    socket
        .subscribe("1", &operation("JobUpdates"), json!({"jobId": job}))
        .await;
    assert!(job_as(&app, &token, job).await["errors"].is_null());

    let revoked = app
        .operation(Some(&tenant.key), "RevokeApiKey", json!({"id": key_id}))
        .await;
    assert!(revoked["errors"].is_null(), "{revoked}");
    assert_eq!(socket.closed_code(Duration::from_secs(5)).await, 4403);
    assert_eq!(
        error_code(&job_as(&app, &token, job).await),
        "UNAUTHENTICATED"
    );
    // Tokens of other keys, and the admin's, live on.
    assert!(job_as(&app, &admin_minted, job).await["errors"].is_null());
}

/// A browser's token holds at most 16 live connections of its own, so that it cannot
/// fill its tenant's 256 and shut out the tenant's backend and other users.
async fn a_token_cannot_take_its_tenants_live_connections(backend: Backend) {
    let app = spawn_app_with(backend, AppOptions::no_workers()).await;
    let tenant = app.funded_tenant("acme", "5").await;
    let token = mint(&app, &tenant.key, &tenant, json!({"scopes": ["READ_JOBS"]})).await;
    let mut held = Vec::new();
    for _ in 0..16 {
        let mut socket = GraphqlSocket::connect(app.address).await;
        socket.init_ok(&token.key).await;
        held.push(socket);
    }
    let mut refused = GraphqlSocket::connect(app.address).await;
    match refused.init(&token.key).await {
        Received::Closed(code, reason) => {
            assert_eq!(code, 4429);
            assert!(reason.contains("access token"), "{reason}");
        }
        other => panic!("a 17th connection of one token must be refused: {other:?}"),
    }
    // The tenant's own key, and another token of it, still connect.
    let mut backend_socket = GraphqlSocket::connect(app.address).await;
    backend_socket.init_ok(&tenant.key).await;
    let other = mint(&app, &tenant.key, &tenant, json!({"scopes": ["READ_JOBS"]})).await;
    let mut other_socket = GraphqlSocket::connect(app.address).await;
    other_socket.init_ok(&other.key).await;
    // A place is given back when its connection closes.
    drop(held.pop());
    tokio::time::sleep(Duration::from_millis(300)).await;
    let mut again = GraphqlSocket::connect(app.address).await;
    again.init_ok(&token.key).await;
}

/// Idempotency keys of labelled tokens live in a namespace of their labels: one user's
/// page can neither learn that another user's key exists nor take it before them, and a
/// page's retry with a fresh token of the same labels still replays.
async fn the_keys_of_a_tokens_jobs_are_its_labels_own(backend: Backend) {
    let app = spawn_app_with(backend, AppOptions::no_workers()).await;
    let tenant = app.funded_tenant("acme", "5").await;
    let scopes = json!(["READ_JOBS", "CREATE_JOBS"]);
    let alice = mint(
        &app,
        &tenant.key,
        &tenant,
        json!({"scopes": scopes, "labels": user("alice")}),
    )
    .await;
    let bob = mint(
        &app,
        &tenant.key,
        &tenant,
        json!({"scopes": scopes, "labels": user("bob")}),
    )
    .await;
    let document = |text: &str| job_input("upload-42", text);

    // Bob takes the key first, with another request: Alice's create is her own job,
    // not a conflict that tells her the key is used.
    let squatted = app
        .create_job_ok(&bob, document("Bob's version of the request."))
        .await;
    let hers = app.create_job(&alice, document("Summarise it.")).await;
    assert!(hers["errors"].is_null(), "{hers}");
    assert_eq!(hers["data"]["createJob"]["replayed"], false, "{hers}");
    let hers: Uuid = hers["data"]["createJob"]["job"]["id"]
        .as_str()
        .unwrap()
        .parse()
        .unwrap();
    assert_ne!(hers, squatted);
    // The backend's own key of that name is a third job.
    let backend_job = app
        .create_job_ok(&tenant, document("The backend's request."))
        .await;
    assert!(![hers, squatted].contains(&backend_job));

    // A fresh token of Alice's labels replays her job, by create and by lookup.
    let alice_again = mint(
        &app,
        &tenant.key,
        &tenant,
        json!({"scopes": scopes, "labels": user("alice")}),
    )
    .await;
    let replay = app
        .create_job(&alice_again, document("Summarise it."))
        .await;
    assert_eq!(replay["data"]["createJob"]["replayed"], true, "{replay}");
    assert_eq!(
        replay["data"]["createJob"]["job"]["id"],
        json!(hers.to_string())
    );
    let by_key = |credential: &TestTenant| {
        let key = credential.key.clone();
        let app = &app;
        async move {
            app.operation(Some(&key), "JobByKey", json!({"key": "upload-42"}))
                .await
        }
    };
    assert_eq!(
        by_key(&alice_again).await["data"]["job"]["id"],
        json!(hers.to_string())
    );
    assert_eq!(
        by_key(&bob).await["data"]["job"]["id"],
        json!(squatted.to_string())
    );
    assert_eq!(
        by_key(&tenant).await["data"]["job"]["id"],
        json!(backend_job.to_string())
    );
    // Nobody names a token's namespace by hand.
    let forged = app
        .create_job(&tenant, job_input("reach/0123456789abcdef/upload-42", "x"))
        .await;
    assert_eq!(error_code(&forged), "VALIDATION", "{forged}");
    assert_billing_invariants(&app.app.db).await;
}
