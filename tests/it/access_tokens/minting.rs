//! Who may mint a token, what a mint request may ask, and the spend cap under concurrent creates.

use super::*;

on_both_backends!(
    tokens_are_minted_by_a_tenant_for_itself_or_by_the_admin,
    bad_token_requests_are_refused,
    concurrent_creates_never_hold_more_than_max_spend,
);

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
