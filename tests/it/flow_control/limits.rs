//! Request limits of a model, a provider and a tenant across worker processes, and a 429 that pauses a model for every worker.

use super::*;

on_both_backends!(
    a_model_limit_holds_across_worker_processes,
    a_provider_limit_covers_every_model_it_serves,
    a_tenant_limit_paces_that_tenant_only,
    a_rate_limited_answer_pauses_the_model_for_every_worker,
);

async fn a_model_limit_holds_across_worker_processes(backend: Backend) {
    // One request a second, at most one at once: any 1-second window holds at most
    // two starts (one at each end).
    let (_folder, config) = config_file("[models.\"gpt-4o-mini\"]\nrequests_per_minute = 60\n");
    // Three worker processes, one call at a time each, every call 2.5 s long: with
    // the budget each second's job must go to whichever process is free, so all three
    // take part; without it all three would start at once.
    let one_at_a_time = AppOptions {
        worker: Some(WorkerSettings {
            concurrency: 1,
            ..test_worker_settings()
        }),
        ..with_config(&config)
    };
    let api = spawn_app_with(
        backend,
        AppOptions {
            worker: None,
            ..with_config(&config)
        },
    )
    .await;
    let mut workers = Vec::new();
    for _ in 0..3 {
        workers.push(api.another_process(one_at_a_time.clone()).await);
    }
    let tenant = api.funded_tenant("paced", "20").await;
    let ids = run_all(
        &api,
        &tenant,
        inputs("paced", 6, "hello [mock:delay_ms=2500]"),
    )
    .await;
    let attempts = attempts_of(&api, &ids).await;
    assert_eq!(attempts.len(), 6, "one attempt each");
    let starts: Vec<(Timestamp, f64)> = attempts.iter().map(|a| (a.started_at, 1.0)).collect();
    assert!(
        busiest_window(&starts, Duration::from_secs(1)) <= 2.0,
        "more than the bucket allows in one second: {:?}",
        starts.iter().map(|(at, _)| at.micros()).collect::<Vec<_>>()
    );
    let worker_ids: std::collections::BTreeSet<&str> =
        attempts.iter().map(|a| a.worker_id.as_str()).collect();
    assert_eq!(
        worker_ids.len(),
        3,
        "every process ran jobs: {worker_ids:?}"
    );
    assert_billing_invariants(&api.app.db).await;
}

async fn a_provider_limit_covers_every_model_it_serves(backend: Backend) {
    let (_folder, config) = config_file(
        "[providers.sim]\nkind = \"simulator\"\nrequests_per_minute = 60\n\n\
         [routes]\n\"gpt-*\" = \"sim\"\n",
    );
    let (api, _other) = two_worker_processes(backend, &config).await;
    let tenant = api.funded_tenant("two-models", "20").await;
    let mut all = inputs("mini", 3, "hello");
    for (index, mut input) in inputs("full", 3, "hello").into_iter().enumerate() {
        input["model"] = json!("gpt-4o");
        input["idempotencyKey"] = json!(format!("full-{index}"));
        all.push(input);
    }
    let ids = run_all(&api, &tenant, all).await;
    let attempts = attempts_of(&api, &ids).await;
    let starts: Vec<(Timestamp, f64)> = attempts.iter().map(|a| (a.started_at, 1.0)).collect();
    assert!(
        busiest_window(&starts, Duration::from_secs(1)) <= 2.0,
        "two models together passed their provider's limit: {:?}",
        starts.iter().map(|(at, _)| at.micros()).collect::<Vec<_>>()
    );
    assert_billing_invariants(&api.app.db).await;
}

async fn a_tenant_limit_paces_that_tenant_only(backend: Backend) {
    let options = AppOptions::workers(test_worker_settings());
    let api = spawn_app_with(backend, options).await;
    let _other = api
        .another_process(AppOptions::workers(test_worker_settings()))
        .await;
    let paced = api.funded_tenant("paced", "20").await;
    let free = api.funded_tenant("free", "20").await;
    let limits = api
        .operation(
            Some(crate::helpers::ADMIN_TOKEN),
            "SetTenantLimits",
            json!({"input": {"tenantId": paced.id, "requestsPerMinute": 60}}),
        )
        .await;
    assert!(limits["errors"].is_null(), "{limits}");
    let mut paced_ids = Vec::new();
    let mut free_ids = Vec::new();
    for index in 0..5 {
        paced_ids.push(
            api.create_job_ok(&paced, job_input(&format!("paced-{index}"), "hello"))
                .await,
        );
        free_ids.push(
            api.create_job_ok(&free, job_input(&format!("free-{index}"), "hello"))
                .await,
        );
    }
    for (tenant, ids) in [(&paced, &paced_ids), (&free, &free_ids)] {
        for id in ids {
            let job = api
                .wait_until_finished(tenant, *id, Duration::from_secs(60))
                .await;
            assert_eq!(job["status"], "SUCCEEDED", "{job}");
        }
    }
    let paced_attempts = attempts_of(&api, &paced_ids).await;
    let starts: Vec<(Timestamp, f64)> =
        paced_attempts.iter().map(|a| (a.started_at, 1.0)).collect();
    assert!(
        busiest_window(&starts, Duration::from_secs(1)) <= 2.0,
        "the tenant's limit did not hold: {starts:?}"
    );
    // The other tenant is not held back by it: all its jobs started before the paced
    // tenant's last one.
    let free_attempts = attempts_of(&api, &free_ids).await;
    let last_paced = paced_attempts.last().unwrap().started_at;
    assert!(
        free_attempts.iter().all(|a| a.started_at < last_paced),
        "the free tenant waited for the paced one"
    );
    assert_billing_invariants(&api.app.db).await;
}

async fn a_rate_limited_answer_pauses_the_model_for_every_worker(backend: Backend) {
    let api = spawn_app_with(backend, AppOptions::default()).await;
    let _other = api.another_process(AppOptions::default()).await;
    let tenant = api.funded_tenant("throttled", "20").await;
    let first = api
        .create_job_ok(
            &tenant,
            job_input(
                "first",
                "hello [mock:status=429][mock:retry_after=4][mock:fail_first=1]",
            ),
        )
        .await;
    // Wait for the 429 to be recorded: its retry event says until when the model waits.
    let paused_until = loop {
        let response = api
            .graphql(
                Some(&tenant.key),
                "query($id: UUID!) { job(id: $id) { events { kind data } } }",
                json!({"id": first}),
            )
            .await;
        let retry = response["data"]["job"]["events"]
            .as_array()
            .unwrap_or_else(|| panic!("{response}"))
            .iter()
            .find(|event| event["kind"] == "RETRY_SCHEDULED")
            .cloned();
        if let Some(retry) = retry {
            let until = retry["data"]["modelPausedUntil"]
                .as_str()
                .unwrap_or_else(|| panic!("no pause in {retry}"));
            break Timestamp::from(
                chrono::DateTime::parse_from_rfc3339(until)
                    .unwrap()
                    .to_utc(),
            );
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    // The same model waits on every worker; another model does not.
    let mut other = job_input("other-model", "hello");
    other["model"] = json!("gpt-4o");
    let mut all = inputs("same-model", 6, "hello");
    all.push(other);
    let mut same_model = run_all(&api, &tenant, all).await;
    let other_model = vec![same_model.pop().unwrap()];
    for attempt in attempts_of(&api, &same_model).await {
        assert!(
            attempt.started_at >= paused_until,
            "a job of the paused model started at {:?}, before {paused_until:?}",
            attempt.started_at
        );
    }
    // Then the model ramps back up from one call a second: the eight free slots of
    // the two processes do not all call the provider the moment the pause ends.
    same_model.push(first);
    let first_second = attempts_of(&api, &same_model)
        .await
        .iter()
        .filter(|attempt| {
            attempt.started_at >= paused_until
                && attempt.started_at.micros() < paused_until.micros() + 1_000_000
        })
        .count();
    assert!(
        first_second <= 1,
        "{first_second} calls started in the first second after the pause"
    );
    let other_attempt = attempts_of(&api, &other_model).await.remove(0);
    assert!(
        other_attempt.started_at < paused_until,
        "another model was held back too"
    );
    let job = api
        .wait_until_finished(&tenant, first, Duration::from_secs(30))
        .await;
    assert_eq!(job["status"], "SUCCEEDED", "{job}");
    let pauses: f64 = [&api, &_other]
        .iter()
        .map(|app| {
            app.app
                .metrics
                .render()
                .lines()
                .filter(|line| {
                    line.starts_with("jobledger_model_pauses_total{model=\"gpt-4o-mini\"}")
                })
                .filter_map(|line| line.rsplit(' ').next()?.parse::<f64>().ok())
                .sum::<f64>()
        })
        .sum();
    assert_eq!(pauses, 1.0, "one 429, one pause");
    assert_billing_invariants(&api.app.db).await;
}
