//! What a token reaches: the jobs carrying its labels or listed by id, the scopes it holds, and nothing it may not read.

use super::*;

on_both_backends!(
    a_token_reads_only_jobs_carrying_its_labels,
    a_token_does_only_what_its_scopes_say,
    a_token_creates_jobs_with_its_labels_and_cancels_within_them,
    a_token_for_listed_jobs_reaches_those_alone,
    a_token_that_may_not_read_learns_nothing_from_what_it_does,
    the_keys_of_a_tokens_jobs_are_its_labels_own,
);

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
