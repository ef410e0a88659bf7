//! Job parameters (`temperature`, `topP`, `stop`, `seed`, `providerOptions`): they
//! reach the provider as sent, in each provider's shape; options that would change
//! what a call may cost are refused; and they are part of the request a key names —
//! a job's, and a batch's for each of its items.

use crate::helpers::{AppOptions, Backend, error_code, job_input, spawn_app, spawn_app_with};
use jobledger::llm::anthropic::AnthropicClient;
use jobledger::llm::simulator::Simulator;
use jobledger::llm::{ChatRequest, Message, Parameters, Provider, Role};
use serde_json::{Value, json};
use std::time::Duration;

on_both_backends!(
    parameters_reach_the_provider_as_sent,
    cost_changing_options_are_refused_before_anything_is_held,
    parameters_are_part_of_the_request_a_key_names,
    batch_items_are_called_with_the_batch_parameters,
    provider_options_are_checked_against_each_models_provider,
    values_out_of_each_providers_range_are_refused,
    openais_own_api_is_refused_what_it_answers_400_to,
);

fn with_parameters(key: &str) -> Value {
    let mut input = job_input(key, "Name three colours.");
    input["temperature"] = json!(0.25);
    input["topP"] = json!(0.5);
    input["stop"] = json!(["END", "\n\n"]);
    input["seed"] = json!(42);
    input["providerOptions"] = json!({"user": "end-user-7", "logit_bias": {"50256": -100}});
    input
}

async fn parameters_reach_the_provider_as_sent(backend: Backend) {
    let app = spawn_app(backend).await;
    let tenant = app.funded_tenant("acme", "5").await;
    let id = app.create_job_ok(&tenant, with_parameters("colours")).await;
    let job = app
        .wait_until_finished(&tenant, id, Duration::from_secs(30))
        .await;
    assert_eq!(job["status"], "SUCCEEDED", "{job}");
    let calls = app.simulator.calls();
    assert_eq!(calls.len(), 1, "one call");
    let sent = &calls[0].request;
    assert_eq!(sent["temperature"], 0.25);
    assert_eq!(sent["top_p"], 0.5);
    assert_eq!(sent["stop"], json!(["END", "\n\n"]));
    assert_eq!(sent["seed"], 42);
    assert_eq!(sent["user"], "end-user-7");
    assert_eq!(sent["logit_bias"], json!({"50256": -100}));
    // What jobledger sets is its own.
    assert_eq!(sent["messages"][0]["content"], "Name three colours.");
    // A job without parameters sends none: the provider's defaults apply.
    let plain = app
        .create_job_ok(&tenant, job_input("plain", "Name a colour."))
        .await;
    app.wait_until_finished(&tenant, plain, Duration::from_secs(30))
        .await;
    let sent = &app.simulator.calls()[1].request;
    for field in ["temperature", "top_p", "stop", "seed", "user"] {
        assert!(sent.get(field).is_none(), "{field} sent: {sent}");
    }
}

/// Anthropic's shape: `stop` is `stop_sequences`, it takes no seed, and of
/// `temperature` and `top_p` together (which its newer models refuse) only the first.
#[tokio::test]
async fn anthropic_calls_carry_the_parameters_in_its_shape() {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let address = listener.local_addr().unwrap();
    let simulator = Simulator::new();
    tokio::spawn(simulator.clone().serve(listener, std::future::pending()));
    let client = AnthropicClient::new(
        "anthropic",
        &format!("http://{address}/v1"),
        Some("k".into()),
    );
    let parameters = Parameters {
        temperature: Some(0.25),
        top_p: Some(0.5),
        stop: vec!["END".into()],
        seed: Some(42),
        provider_options: json!({"metadata": {"user_id": "u-7"}})
            .as_object()
            .unwrap()
            .clone(),
    };
    client
        .complete(&ChatRequest {
            model: "claude-sonnet-4-5".into(),
            messages: vec![Message::text(Role::User, "hello")],
            max_output_tokens: 50,
            response_schema: None,
            parameters,
            tools: Default::default(),
        })
        .await
        .unwrap();
    let sent = &simulator.calls()[0].request;
    assert_eq!(sent["temperature"], 0.25);
    assert!(sent.get("top_p").is_none(), "{sent}");
    assert_eq!(sent["stop_sequences"], json!(["END"]));
    assert!(sent.get("seed").is_none(), "{sent}");
    assert!(sent.get("stop").is_none(), "{sent}");
    assert_eq!(sent["metadata"], json!({"user_id": "u-7"}));
    assert_eq!(sent["max_tokens"], 50);
}

async fn cost_changing_options_are_refused_before_anything_is_held(backend: Backend) {
    let app = spawn_app_with(backend, AppOptions::no_workers()).await;
    let tenant = app.funded_tenant("acme", "5").await;
    let balance = app.balance(&tenant).await;
    let cases = [
        ("providerOptions", json!({"n": 4}), "\"n\""),
        ("providerOptions", json!({"best_of": 3}), "\"best_of\""),
        (
            "providerOptions",
            json!({"max_tokens": 100000}),
            "\"max_tokens\"",
        ),
        (
            "providerOptions",
            json!({"max_completion_tokens": 9}),
            "\"max_completion_tokens\"",
        ),
        (
            "providerOptions",
            json!({"logprobs": true, "top_logprobs": 5}),
            "log",
        ),
        (
            "providerOptions",
            json!({"service_tier": "priority"}),
            "\"service_tier\"",
        ),
        ("providerOptions", json!({"model": "gpt-4o"}), "\"model\""),
        ("providerOptions", json!("n=4"), "JSON object"),
        ("temperature", json!(2.5), "temperature"),
        ("topP", json!(0), "topP"),
        ("stop", json!(["a", "b", "c", "d", "e"]), "at most 4"),
    ];
    for (index, (field, value, reason)) in cases.into_iter().enumerate() {
        let mut input = job_input(&format!("bad-{index}"), "hello");
        input[field] = value.clone();
        let response = app.create_job(&tenant, input).await;
        assert_eq!(
            error_code(&response),
            "VALIDATION",
            "{field}={value}: {response}"
        );
        let message = response["errors"][0]["message"].as_str().unwrap();
        assert!(message.contains(reason), "{message:?} should say {reason}");
    }
    assert_eq!(app.balance(&tenant).await, balance, "nothing held");
}

async fn parameters_are_part_of_the_request_a_key_names(backend: Backend) {
    let app = spawn_app_with(backend, AppOptions::no_workers()).await;
    let tenant = app.funded_tenant("acme", "5").await;
    app.create_job_ok(&tenant, with_parameters("same-key"))
        .await;
    let replay = app.create_job(&tenant, with_parameters("same-key")).await;
    assert_eq!(replay["data"]["createJob"]["replayed"], true, "{replay}");
    for (field, value) in [
        ("temperature", json!(0.3)),
        ("seed", json!(43)),
        ("stop", json!(["END"])),
        ("providerOptions", json!({"user": "someone-else"})),
    ] {
        let mut changed = with_parameters("same-key");
        changed[field] = value;
        let response = app.create_job(&tenant, changed).await;
        assert_eq!(
            error_code(&response),
            "IDEMPOTENCY_CONFLICT",
            "{field}: {response}"
        );
    }
    // The job shows what it was created with.
    let input = app
        .graphql(
            Some(&tenant.key),
            "query($key: String!) { job(idempotencyKey: $key) { input } }",
            json!({"key": "same-key"}),
        )
        .await;
    assert_eq!(
        input["data"]["job"]["input"]["parameters"]["temperature"], 0.25,
        "{input}"
    );
}

/// A createBatch with every parameter of `with_parameters`, under `key`.
fn batch_with_parameters(key: &str) -> Value {
    let job = with_parameters(key);
    let mut input = json!({"idempotencyKey": key, "model": "gpt-4o-mini", "maxOutputTokens": 50});
    for field in ["temperature", "topP", "stop", "seed", "providerOptions"] {
        input[field] = job[field].clone();
    }
    json!({"input": input})
}

async fn batch_items_are_called_with_the_batch_parameters(backend: Backend) {
    let app = spawn_app(backend).await;
    let tenant = app.funded_tenant("acme", "5").await;
    let created = app
        .operation(
            Some(&tenant.key),
            "CreateBatch",
            batch_with_parameters("params"),
        )
        .await;
    assert!(created["errors"].is_null(), "{created}");
    let batch: uuid::Uuid = created["data"]["createBatch"]["batch"]["id"]
        .as_str()
        .unwrap()
        .parse()
        .unwrap();
    // The parameters are part of the batch a key names.
    let replay = app
        .operation(
            Some(&tenant.key),
            "CreateBatch",
            batch_with_parameters("params"),
        )
        .await;
    assert_eq!(replay["data"]["createBatch"]["replayed"], true, "{replay}");
    for (field, value) in [("temperature", json!(0.3)), ("seed", json!(43))] {
        let mut changed = batch_with_parameters("params");
        changed["input"][field] = value;
        let response = app
            .operation(Some(&tenant.key), "CreateBatch", changed)
            .await;
        assert_eq!(
            error_code(&response),
            "IDEMPOTENCY_CONFLICT",
            "{field}: {response}"
        );
    }
    // They are checked as a job's.
    let mut refused = batch_with_parameters("refused");
    refused["input"]["providerOptions"] = json!({"n": 4});
    let response = app
        .operation(Some(&tenant.key), "CreateBatch", refused)
        .await;
    assert_eq!(error_code(&response), "VALIDATION", "{response}");
    let items = ["oslo", "lima"].map(|city| {
        json!({"customId": city, "messages": [{"role": "user", "content": format!("Weather in {city}?")}]})
    });
    let added = crate::batches::add_items(&app, &tenant, batch, &items).await;
    assert!(added["errors"].is_null(), "{added}");
    let closed = app
        .operation(Some(&tenant.key), "CloseBatch", json!({"id": batch}))
        .await;
    assert!(closed["errors"].is_null(), "{closed}");
    crate::batches::wait_until_finished(&app, &tenant, batch, Duration::from_secs(60)).await;
    let calls = app.simulator.calls();
    assert_eq!(calls.len(), 2, "one call per item");
    for call in &calls {
        let sent = &call.request;
        assert_eq!(sent["temperature"], 0.25, "{sent}");
        assert_eq!(sent["top_p"], 0.5, "{sent}");
        assert_eq!(sent["stop"], json!(["END", "\n\n"]), "{sent}");
        assert_eq!(sent["seed"], 42, "{sent}");
        assert_eq!(sent["user"], "end-user-7", "{sent}");
        assert_eq!(sent["logit_bias"], json!({"50256": -100}), "{sent}");
    }
}

/// `providerOptions` are checked against the provider of each model of the chain, by
/// name and by type, before anything is held: a field Anthropic does not take, or a
/// value of the wrong type, would be a 400 on every attempt. The message names the
/// field and the model.
async fn provider_options_are_checked_against_each_models_provider(backend: Backend) {
    let options = AppOptions {
        anthropic_shape: true,
        openai_endpoint: true,
        ..AppOptions::default()
    };
    let app = spawn_app_with(backend, options).await;
    let tenant = app.funded_tenant("acme", "5").await;
    let balance = app.balance(&tenant).await;
    let job = |key: &str, model: &str, fallbacks: Value, options: Value| {
        let mut input = job_input(key, "hello");
        input["model"] = json!(model);
        input["fallbackModels"] = fallbacks;
        input["providerOptions"] = options;
        input
    };
    let claude = "claude-haiku-4-5";
    for (index, (model, fallbacks, options, says)) in [
        (
            "gpt-4o-mini",
            json!([]),
            json!({"store": "yes"}),
            "providerOptions.store",
        ),
        (
            claude,
            json!([]),
            json!({"store": true}),
            "providerOptions.store",
        ),
        (
            claude,
            json!([]),
            json!({"user": "u-1"}),
            "providerOptions.user",
        ),
        (
            claude,
            json!([]),
            json!({"metadata": {"tenant": "t-1"}}),
            "providerOptions.metadata",
        ),
        (
            "gpt-4o-mini",
            json!([]),
            json!({"top_k": "5"}),
            "providerOptions.top_k",
        ),
        (
            "gpt-4o-mini",
            json!([claude]),
            json!({"store": true}),
            claude,
        ),
    ]
    .into_iter()
    .enumerate()
    {
        let response = app
            .create_job(
                &tenant,
                job(&format!("bad-{index}"), model, fallbacks, options.clone()),
            )
            .await;
        assert_eq!(error_code(&response), "VALIDATION", "{options}: {response}");
        let message = response["errors"][0]["message"].as_str().unwrap();
        assert!(
            message.contains(says),
            "{options}: {message:?} should name {says}"
        );
    }
    assert_eq!(app.balance(&tenant).await, balance, "nothing was held");
    // Each provider's own options, of their types, pass.
    for (index, (model, options)) in [
        (
            "gpt-4o-mini",
            json!({"store": true, "user": "u-1", "metadata": {"tenant": "t-1"}}),
        ),
        (claude, json!({"metadata": {"user_id": "u-1"}, "top_k": 5})),
    ]
    .into_iter()
    .enumerate()
    {
        let response = app
            .create_job(
                &tenant,
                job(&format!("good-{index}"), model, json!([]), options),
            )
            .await;
        assert!(response["errors"].is_null(), "{response}");
    }
    // A batch's options reach every item: checked against its model's provider.
    let mut batch =
        json!({"idempotencyKey": "claude-batch", "model": claude, "maxOutputTokens": 50});
    batch["providerOptions"] = json!({"store": true});
    let response = app
        .operation(Some(&tenant.key), "CreateBatch", json!({"input": batch}))
        .await;
    assert_eq!(error_code(&response), "VALIDATION", "{response}");
    assert!(
        response["errors"][0]["message"]
            .as_str()
            .unwrap()
            .contains("providerOptions.store"),
        "{response}"
    );
}

/// Each value is checked against the range its model's provider takes, before
/// anything is held: the message names the field and the range.
async fn values_out_of_each_providers_range_are_refused(backend: Backend) {
    let options = AppOptions {
        anthropic_shape: true,
        openai_endpoint: true,
        worker: None,
        ..AppOptions::default()
    };
    let app = spawn_app_with(backend, options).await;
    let tenant = app.funded_tenant("acme", "5").await;
    let balance = app.balance(&tenant).await;
    let claude = "claude-haiku-4-5";
    let job = |key: &str, model: &str, field: &str, value: &Value| {
        let mut input = job_input(key, "hello");
        input["model"] = json!(model);
        input[field] = value.clone();
        input
    };
    for (index, (model, field, value, says)) in [
        (
            claude,
            "temperature",
            json!(1.5),
            "temperature must be 0 to 1",
        ),
        (
            "gpt-4o-mini",
            "providerOptions",
            json!({"presence_penalty": 3}),
            "a number from -2 to 2",
        ),
        (
            "gpt-4o-mini",
            "providerOptions",
            json!({"frequency_penalty": -2.5}),
            "providerOptions.frequency_penalty",
        ),
        (
            "gpt-4o-mini",
            "providerOptions",
            json!({"logit_bias": {"50256": 150}}),
            "numbers from -100 to 100",
        ),
        (
            "gpt-4o-mini",
            "providerOptions",
            json!({"logit_bias": {"hello": 1}}),
            "token ids",
        ),
        (
            claude,
            "providerOptions",
            json!({"top_k": -1}),
            "a whole number of at least 0",
        ),
    ]
    .into_iter()
    .enumerate()
    {
        let response = app
            .create_job(&tenant, job(&format!("bad-{index}"), model, field, &value))
            .await;
        assert_eq!(error_code(&response), "VALIDATION", "{value}: {response}");
        let message = response["errors"][0]["message"].as_str().unwrap();
        assert!(
            message.contains(says),
            "{value}: {message:?} should say {says}"
        );
    }
    assert_eq!(app.balance(&tenant).await, balance, "nothing was held");
    for (index, (model, field, value)) in [
        (claude, "temperature", json!(1.0)),
        ("gpt-4o-mini", "temperature", json!(1.5)),
        (
            "gpt-4o-mini",
            "providerOptions",
            json!({"presence_penalty": -2, "frequency_penalty": 2, "logit_bias": {"50256": -100}}),
        ),
        (claude, "providerOptions", json!({"top_k": 0})),
    ]
    .into_iter()
    .enumerate()
    {
        let response = app
            .create_job(&tenant, job(&format!("good-{index}"), model, field, &value))
            .await;
        assert!(response["errors"].is_null(), "{value}: {response}");
    }
}

/// A config file with OpenAI's own API (`api.openai.com`) serving `gpt-4o` and
/// `o3-mini`, and an OpenAI-compatible server `gpt-4o-mini`. Nothing is called: the
/// app has no workers.
fn openai_and_a_compatible_server() -> (tempfile::TempDir, AppOptions) {
    let folder = tempfile::tempdir().unwrap();
    let path = folder.path().join("jobledger.toml");
    std::fs::write(
        &path,
        "[providers.openai]\nkind = \"openai\"\nbase_url = \"https://api.openai.com/v1\"\n\n\
         [providers.vllm]\nkind = \"openai\"\nbase_url = \"http://127.0.0.1:9/v1\"\n\n\
         [routes]\n\"gpt-4o\" = \"openai\"\n\"o3-mini\" = \"openai\"\n\"gpt-4o-mini\" = \"vllm\"\n",
    )
    .unwrap();
    let options = AppOptions {
        config_file: Some(path),
        ..AppOptions::no_workers()
    };
    (folder, options)
}

/// OpenAI's own API answers 400 to the sampling fields of other servers and to
/// `reasoning_effort` for a model that does not reason, on every attempt: a job is
/// refused them at create, naming the field, while a compatible server takes them.
async fn openais_own_api_is_refused_what_it_answers_400_to(backend: Backend) {
    let (_folder, options) = openai_and_a_compatible_server();
    let app = spawn_app_with(backend, options).await;
    let tenant = app.funded_tenant("acme", "5").await;
    let balance = app.balance(&tenant).await;
    let job = |key: &str, model: &str, options: &Value| {
        let mut input = job_input(key, "hello");
        input["model"] = json!(model);
        input["providerOptions"] = options.clone();
        input
    };
    for (index, (model, options, says)) in [
        ("gpt-4o", json!({"top_k": 40}), "providerOptions.top_k"),
        ("gpt-4o", json!({"min_p": 0.05}), "providerOptions.min_p"),
        (
            "gpt-4o",
            json!({"repetition_penalty": 1.1}),
            "providerOptions.repetition_penalty",
        ),
        (
            "gpt-4o",
            json!({"reasoning_effort": "low"}),
            "only for its reasoning models",
        ),
    ]
    .into_iter()
    .enumerate()
    {
        let response = app
            .create_job(&tenant, job(&format!("bad-{index}"), model, &options))
            .await;
        assert_eq!(error_code(&response), "VALIDATION", "{options}: {response}");
        let message = response["errors"][0]["message"].as_str().unwrap();
        assert!(
            message.contains(says) && message.contains("OpenAI's API"),
            "{options}: {message:?} should say {says}"
        );
    }
    assert_eq!(app.balance(&tenant).await, balance, "nothing was held");
    for (index, (model, options)) in [
        ("o3-mini", json!({"reasoning_effort": "low"})),
        ("gpt-4o", json!({"store": true, "presence_penalty": 1})),
        (
            "gpt-4o-mini",
            json!({"top_k": 40, "min_p": 0.05, "repetition_penalty": 1.1, "reasoning_effort": "low"}),
        ),
    ]
    .into_iter()
    .enumerate()
    {
        let response = app
            .create_job(&tenant, job(&format!("good-{index}"), model, &options))
            .await;
        assert!(response["errors"].is_null(), "{options}: {response}");
    }
}
