//! Token limits: jobs admitted by their token bound, unused tokens given back (or not, for a provider that counts requested tokens), and a large job not starved by small ones.

use super::*;

on_both_backends!(
    a_tokens_limit_admits_jobs_by_their_token_bound,
    a_finished_call_gives_back_the_tokens_it_did_not_use,
    a_provider_counting_requested_tokens_gets_nothing_back,
    a_large_job_is_not_starved_by_a_stream_of_small_ones,
);

/// A job's token bound as the claim counts it.
async fn token_bounds(app: &TestApp, ids: &[Uuid]) -> std::collections::HashMap<Uuid, f64> {
    entity::jobs::Entity::find()
        .filter(entity::jobs::Column::Id.is_in(ids.iter().copied()))
        .all(&app.app.db)
        .await
        .unwrap()
        .into_iter()
        .map(|job| {
            (
                job.id,
                job.token_bound.expect("new jobs carry a bound") as f64,
            )
        })
        .collect()
}

async fn a_tokens_limit_admits_jobs_by_their_token_bound(backend: Backend) {
    // 12,000 tokens a minute: a bucket of 200, refilled at 200 a second. Each job's
    // bound is about 120 tokens (prompt and 100 of output), so the bucket admits one
    // job, then another after a moment: requests alone would let all start at once.
    // The calls last longer than it takes to start them all, so no finished call
    // gives unused tokens back in between: every start takes its whole bound.
    let (_folder, config) = config_file("[models.\"gpt-4o-mini\"]\ntokens_per_minute = 12000\n");
    let (api, _other) = two_worker_processes(backend, &config).await;
    let tenant = api.funded_tenant("tokens", "20").await;
    let ids = run_all(
        &api,
        &tenant,
        inputs("tokens", 6, "hi [mock:delay_ms=4000]"),
    )
    .await;
    let bounds = token_bounds(&api, &ids).await;
    let attempts = attempts_of(&api, &ids).await;
    let starts: Vec<(Timestamp, f64)> = attempts
        .iter()
        .map(|a| (a.started_at, bounds[&a.job_id]))
        .collect();
    assert!(
        bounds.values().all(|bound| *bound < 200.0),
        "each job fits the bucket: {bounds:?}"
    );
    // What one second can hold: the full bucket, one second of refill, and the call
    // that took the bucket into debt.
    let largest = bounds.values().copied().fold(0.0, f64::max);
    let busiest = busiest_window(&starts, Duration::from_secs(1));
    assert!(
        busiest <= 400.0 + largest,
        "{busiest} tokens started within one second: {starts:?}"
    );
    assert_billing_invariants(&api.app.db).await;
}

/// Runs a job with a bound of over 4,000 tokens that the provider refuses (400).
async fn run_refused(app: &TestApp, tenant: &TestTenant) -> Uuid {
    let mut refused = job_input("refused", "no [mock:status=400]");
    refused["maxOutputTokens"] = json!(4_000);
    refused["maxAttempts"] = json!(1);
    let refused = app.create_job_ok(tenant, refused).await;
    let job = app
        .wait_until_finished(tenant, refused, Duration::from_secs(30))
        .await;
    assert_eq!(job["status"], "FAILED", "{job}");
    refused
}

/// Waits until the stored token level of gpt-4o-mini's bucket is `expected`.
async fn wait_for_model_tokens(app: &TestApp, expected: f64) {
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    loop {
        let bucket = rate_limit_buckets::Entity::find_by_id((
            entity::BucketScope::Model,
            "gpt-4o-mini".to_owned(),
        ))
        .one(&app.app.db)
        .await
        .unwrap()
        .expect("the claim wrote the model's bucket");
        if bucket.tokens == Some(expected) {
            return;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "{bucket:?}, expected {expected}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

async fn a_finished_call_gives_back_the_tokens_it_did_not_use(backend: Backend) {
    // A bucket of 1,000 tokens; the job may use 4,000 (its bound) and uses a few.
    let (_folder, config) = config_file("[models.\"gpt-4o-mini\"]\ntokens_per_minute = 60000\n");
    let app = spawn_app_with(backend, with_config(&config)).await;
    let tenant = app.funded_tenant("gives-back", "20").await;
    let mut input = job_input("large-bound", "short answer please");
    input["maxOutputTokens"] = json!(4_000);
    let ids = run_all(&app, &tenant, vec![input]).await;
    let attempt = attempts_of(&app, &ids).await.remove(0);
    let used = attempt.input_tokens.unwrap() + attempt.output_tokens.unwrap();
    // Admitted by a full bucket (1,000) at its bound, then given back all it did not
    // use (written back within a moment): what stays taken is exactly what it used.
    wait_for_model_tokens(&app, 1_000.0 - used as f64).await;
    // A call the provider refuses cannot have been billed: it gives its whole bound
    // back, and the bucket (full again when this claim read it) stays full.
    run_refused(&app, &tenant).await;
    wait_for_model_tokens(&app, 1_000.0).await;
    assert_billing_invariants(&app.app.db).await;
}

async fn a_provider_counting_requested_tokens_gets_nothing_back(backend: Backend) {
    // The provider says it counts what a request may use, answered or refused (as
    // OpenAI does): the model's bucket, which counts as its provider does, keeps every
    // call's whole bound.
    let (_folder, config) = config_file(
        "[providers.sim]\nkind = \"simulator\"\ntokens_counted = \"requested\"\n\n\
         [routes]\n\"gpt-*\" = \"sim\"\n\n\
         [models.\"gpt-4o-mini\"]\ntokens_per_minute = 60000\n",
    );
    let app = spawn_app_with(backend, with_config(&config)).await;
    let tenant = app.funded_tenant("requested", "20").await;
    let mut input = job_input("large-bound", "short answer please");
    input["maxOutputTokens"] = json!(4_000);
    let answered = run_all(&app, &tenant, vec![input]).await;
    let bound = token_bounds(&app, &answered).await[&answered[0]];
    let attempt = attempts_of(&app, &answered).await.remove(0);
    assert!(
        attempt.input_tokens.unwrap() + attempt.output_tokens.unwrap() < 100,
        "the call used a few tokens of its bound: {attempt:?}"
    );
    // A bucket of 1,000 admitted the call by its bound; returns are written every
    // 250 ms, so after a second one would be on record.
    tokio::time::sleep(Duration::from_secs(1)).await;
    wait_for_model_tokens(&app, 1_000.0 - bound).await;
    // Refill (1,000 tokens a second) pays the debt back and fills the bucket again
    // within five seconds, so the refused job is admitted from a full bucket.
    tokio::time::sleep(Duration::from_secs(5)).await;
    let refused = run_refused(&app, &tenant).await;
    let refused_bound = token_bounds(&app, &[refused]).await[&refused];
    tokio::time::sleep(Duration::from_secs(1)).await;
    wait_for_model_tokens(&app, 1_000.0 - refused_bound).await;
    assert_billing_invariants(&app.app.db).await;
}

async fn a_large_job_is_not_starved_by_a_stream_of_small_ones(backend: Backend) {
    // 100 tokens a second, nothing given back: the small jobs (a bound of a few dozen
    // tokens) keep the bucket from ever filling while they last. A job of several
    // hundred tokens, created after them, must still start before they are all done.
    let (_folder, config) = config_file(
        "[models.\"gpt-4o-mini\"]\ntokens_per_minute = 6000\ntokens_counted = \"requested\"\n",
    );
    // The small jobs are queued before the workers start, so the stream is there from
    // the first claim.
    let api = spawn_app_with(
        backend,
        AppOptions {
            config_file: Some(config.clone()),
            ..AppOptions::no_workers()
        },
    )
    .await;
    let mut small = Vec::new();
    let mut waits = Vec::new();
    for tenant_index in 0..3 {
        let tenant = api
            .funded_tenant(&format!("small-{tenant_index}"), "20")
            .await;
        for index in 0..10 {
            // The output allowance gives each a bound of a few dozen tokens: with
            // tight prompt counts, "hi" alone would be two, and thirty of those never
            // empty the bucket.
            let mut input = job_input(&format!("small-{index}"), "hi");
            input["maxOutputTokens"] = json!(24);
            let id = api.create_job_ok(&tenant, input).await;
            small.push(id);
            waits.push((tenant.clone(), id));
        }
    }
    let large_tenant = api.funded_tenant("large", "20").await;
    let _workers = [
        api.another_process(with_config(&config)).await,
        api.another_process(with_config(&config)).await,
    ];
    // The large job arrives once the stream runs, when the bucket is no longer full.
    while attempts_of(&api, &small).await.len() < 5 {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let mut input = job_input("large", "hi");
    input["maxOutputTokens"] = json!(400);
    let large = api.create_job_ok(&large_tenant, input).await;
    waits.push((large_tenant, large));
    for (tenant, id) in &waits {
        let job = api
            .wait_until_finished(tenant, *id, Duration::from_secs(90))
            .await;
        assert_eq!(job["status"], "SUCCEEDED", "{job}");
    }
    // The stream must outlast the bucket, or there is nothing to be starved by.
    let bounds = token_bounds(&api, &small).await;
    let stream: f64 = bounds.values().sum();
    assert!(
        stream > 300.0,
        "the small jobs ask for {stream} tokens in all"
    );
    let large_started = attempts_of(&api, &[large]).await.remove(0).started_at;
    let small_after = attempts_of(&api, &small)
        .await
        .iter()
        .filter(|attempt| attempt.started_at > large_started)
        .count();
    // Waiting for a full bucket, it would start after every small job.
    assert!(
        small_after >= 5,
        "the large job started after {} of 30 small jobs",
        30 - small_after
    );
    assert_billing_invariants(&api.app.db).await;
}
