//! Function tools (`tools`, `toolChoice`): they reach the provider as sent, in each
//! provider's shape; a reply's tool calls are the result, checked against the tools'
//! schemas (a bad call is INVALID_OUTPUT, retried on its own budget, charged by the
//! policy); they are bounded, part of the request a key names, and counted in the
//! hold.

use crate::helpers::{
    AppOptions, Backend, TestApp, TestTenant, decimal, error_code, job_input, spawn_app,
    spawn_app_with,
};
use crate::invariants::assert_billing_invariants;
use rust_decimal::Decimal;
use serde_json::{Value, json};
use std::time::Duration;

on_both_backends!(
    tools_and_parameters_reach_the_provider_in_each_shape,
    a_tool_call_is_the_result_in_each_shape_plain_and_streamed,
    a_tool_call_off_its_schema_is_invalid_output,
    a_call_of_a_tool_not_offered_is_invalid_output,
    bad_tools_are_refused_naming_the_field,
    tools_are_part_of_the_request_and_of_its_hold,
    batch_items_offer_the_batch_tools,
);

/// The two shapes a job's call can take, each with a model its app serves.
#[derive(Clone, Copy, Debug)]
enum Shape {
    OpenAi,
    Anthropic,
}

impl Shape {
    const BOTH: [Self; 2] = [Self::OpenAi, Self::Anthropic];

    fn model(self) -> &'static str {
        match self {
            Self::OpenAi => "gpt-4o-mini",
            Self::Anthropic => "claude-haiku-4-5",
        }
    }

    async fn app(self, backend: &Backend) -> TestApp {
        spawn_app_with(
            backend.clone(),
            AppOptions {
                anthropic_shape: matches!(self, Self::Anthropic),
                ..AppOptions::default()
            },
        )
        .await
    }
}

fn weather_tools() -> Value {
    json!([{
        "type": "function",
        "function": {
            "name": "weather",
            "description": "The weather in a city",
            "parameters": {
                "type": "object",
                "properties": {"city": {"type": "string"}},
                "required": ["city"],
                "additionalProperties": false,
            },
        },
    }])
}

fn tool_job(shape: Shape, key: &str, content: &str) -> Value {
    let mut input = job_input(key, content);
    input["model"] = json!(shape.model());
    input["tools"] = weather_tools();
    input
}

async fn run(app: &TestApp, tenant: &TestTenant, input: Value) -> Value {
    let id = app.create_job_ok(tenant, input).await;
    app.wait_until_finished(tenant, id, Duration::from_secs(60))
        .await
}

async fn tools_and_parameters_reach_the_provider_in_each_shape(backend: Backend) {
    for shape in Shape::BOTH {
        let app = shape.app(&backend).await;
        let tenant = app.funded_tenant("acme", "5").await;
        let mut input = tool_job(shape, "sent", "What is the weather in Oslo?");
        input["toolChoice"] = json!({"type": "function", "function": {"name": "weather"}});
        input["temperature"] = json!(0.25);
        input["topP"] = json!(0.5);
        input["stop"] = json!(["END"]);
        input["seed"] = json!(42);
        let job = run(&app, &tenant, input).await;
        assert_eq!(job["status"], "SUCCEEDED", "{shape:?}: {job}");
        let calls = app.simulator.calls();
        assert_eq!(calls.len(), 1, "{shape:?}");
        let sent = &calls[0].request;
        let schema = &weather_tools()[0]["function"]["parameters"];
        assert_eq!(sent["temperature"], 0.25, "{shape:?}: {sent}");
        match shape {
            Shape::OpenAi => {
                assert_eq!(sent["top_p"], 0.5, "{sent}");
                assert_eq!(sent["tools"], weather_tools(), "{sent}");
                assert_eq!(
                    sent["tool_choice"],
                    json!({"type": "function", "function": {"name": "weather"}})
                );
                assert_eq!(sent["stop"], json!(["END"]));
                assert_eq!(sent["seed"], 42);
            }
            Shape::Anthropic => {
                // Given both, only temperature: newer Claude models refuse the pair.
                assert!(sent.get("top_p").is_none(), "{sent}");
                assert_eq!(
                    sent["tools"],
                    json!([{"name": "weather", "description": "The weather in a city", "input_schema": schema}]),
                    "{sent}"
                );
                assert_eq!(
                    sent["tool_choice"],
                    json!({"type": "tool", "name": "weather"})
                );
                assert_eq!(sent["stop_sequences"], json!(["END"]));
                assert!(
                    sent.get("seed").is_none(),
                    "Anthropic takes no seed: {sent}"
                );
            }
        }
        // A job without tools sends none.
        let plain = job_input("plain", "Hello");
        let mut plain = plain;
        plain["model"] = json!(shape.model());
        run(&app, &tenant, plain).await;
        let sent = &app.simulator.calls()[1].request;
        assert!(sent.get("tools").is_none(), "{shape:?}: {sent}");
        assert!(sent.get("tool_choice").is_none(), "{shape:?}: {sent}");
        assert_billing_invariants(&app.app.db).await;
    }
}

async fn a_tool_call_is_the_result_in_each_shape_plain_and_streamed(backend: Backend) {
    let arguments = r#"{"city": "Oslo"}"#;
    for shape in Shape::BOTH {
        let app = shape.app(&backend).await;
        let tenant = app.funded_tenant("acme", "5").await;
        for stream in [false, true] {
            let key = format!("call-{stream}");
            let content =
                format!("Weather in Oslo? [mock:tool_call=weather][mock:reply={arguments}]");
            let mut input = tool_job(shape, &key, &content);
            input["streamOutput"] = json!(stream);
            let job = run(&app, &tenant, input).await;
            assert_eq!(job["status"], "SUCCEEDED", "{shape:?} {stream}: {job}");
            let calls = job["result"]["toolCalls"].as_array().unwrap_or_else(|| {
                panic!("{shape:?} {stream}: no tool calls in {}", job["result"])
            });
            assert_eq!(calls.len(), 1, "{shape:?} {stream}: {job}");
            assert_eq!(calls[0]["name"], "weather");
            assert_eq!(calls[0]["arguments"], json!({"city": "Oslo"}));
            let prefix = match shape {
                Shape::OpenAi => "call_",
                Shape::Anthropic => "toolu_",
            };
            assert!(
                calls[0]["id"].as_str().unwrap().starts_with(prefix),
                "{shape:?} {stream}: the provider's call id is kept: {job}"
            );
            assert!(job["result"].get("text").is_none(), "{job}");
            // The arguments were the reply: that is what the output tokens count.
            let attempt = &job["attempts"][0];
            assert_eq!(
                attempt["outputTokens"],
                (arguments.len() as u64).div_ceil(4),
                "{job}"
            );
            assert!(decimal(&job["charge"]["amount"]) > Decimal::ZERO, "{job}");
        }
        assert_billing_invariants(&app.app.db).await;
    }
}

async fn a_tool_call_off_its_schema_is_invalid_output(backend: Backend) {
    for shape in Shape::BOTH {
        let app = shape.app(&backend).await;
        let tenant = app.funded_tenant("acme", "5").await;
        let mut input = tool_job(
            shape,
            "off-schema",
            r#"Weather? [mock:tool_call=weather][mock:reply={"city": 5}]"#,
        );
        input["maxAttempts"] = json!(10);
        let job = run(&app, &tenant, input).await;
        assert_eq!(job["status"], "FAILED", "{shape:?}: {job}");
        assert_eq!(job["error"]["code"], "INVALID_OUTPUT");
        assert_eq!(
            job["error"]["message"],
            "the arguments of a tool call do not match the tool's parameters"
        );
        let attempts = job["attempts"].as_array().unwrap();
        assert_eq!(
            attempts.len(),
            3,
            "{shape:?}: one try and two retries for invalid output: {job}"
        );
        for attempt in attempts {
            assert_eq!(attempt["outcome"], "INVALID_OUTPUT");
            assert!(
                decimal(&attempt["providerCost"]) > Decimal::ZERO,
                "a bad call is still paid for at the provider"
            );
        }
        assert!(job["charge"].is_null(), "no charge for rejected output");
        assert_eq!(job["reservation"]["status"], "RELEASED");
        assert_eq!(app.simulator.calls().len(), 3);
        assert_billing_invariants(&app.app.db).await;
    }
}

async fn a_call_of_a_tool_not_offered_is_invalid_output(backend: Backend) {
    let app = spawn_app(backend).await;
    let tenant = app.funded_tenant("acme", "5").await;
    let mut input = tool_job(
        Shape::OpenAi,
        "not-offered",
        r#"[mock:tool_call=launch_rockets][mock:reply={"city": "Oslo"}]"#,
    );
    input["maxAttempts"] = json!(1);
    let job = run(&app, &tenant, input).await;
    assert_eq!(job["error"]["code"], "INVALID_OUTPUT", "{job}");
    assert_eq!(
        job["error"]["message"],
        "the reply calls a tool that was not offered"
    );
    assert!(
        !job.to_string().contains("launch_rockets"),
        "the reply does not leak through the error: {job}"
    );
    // Not JSON at all: invalid too.
    let mut input = tool_job(
        Shape::OpenAi,
        "not-json",
        "[mock:tool_call=weather][mock:reply=city: Oslo]",
    );
    input["maxAttempts"] = json!(1);
    let job = run(&app, &tenant, input).await;
    assert_eq!(
        job["error"]["message"], "the arguments of a tool call are not JSON",
        "{job}"
    );
    // A job offering no tools whose reply calls one is as wrong.
    let mut input = job_input("no-tools", "[mock:tool_call=weather]");
    input["maxAttempts"] = json!(1);
    let job = run(&app, &tenant, input).await;
    assert_eq!(job["error"]["code"], "INVALID_OUTPUT", "{job}");
    assert_billing_invariants(&app.app.db).await;
}

async fn bad_tools_are_refused_naming_the_field(backend: Backend) {
    let app = spawn_app_with(backend, AppOptions::no_workers()).await;
    let tenant = app.funded_tenant("acme", "5").await;
    let balance = app.balance(&tenant).await;
    let function = |name: &str| json!({"type": "function", "function": {"name": name}});
    let many: Vec<Value> = (0..129).map(|n| function(&format!("t{n}"))).collect();
    let cases = [
        (
            "tools",
            json!({"weather": {}}),
            "tools must be a JSON array",
        ),
        ("tools", json!([{"type": "web_search"}]), "tools[0]"),
        ("tools", json!([function("a b")]), "function.name"),
        ("tools", json!([function("a"), function("a")]), "tools[1]"),
        ("tools", json!(many), "at most 128"),
        (
            "tools",
            json!([{"type": "function", "function": {"name": "a", "parameters": {"type": "object", "properties": {"x": {"type": 7}}}}}]),
            "function.parameters",
        ),
        (
            "tools",
            json!([{"type": "function", "function": {"name": "a", "description": "x".repeat(70_000)}}]),
            "bytes",
        ),
        ("toolChoice", json!("always"), "toolChoice"),
        (
            "toolChoice",
            json!({"type": "function", "function": {"name": "other"}}),
            "toolChoice",
        ),
    ];
    for (index, (field, value, reason)) in cases.into_iter().enumerate() {
        let mut input = tool_job(Shape::OpenAi, &format!("bad-{index}"), "hello");
        input[field] = value;
        let response = app.create_job(&tenant, input).await;
        assert_eq!(error_code(&response), "VALIDATION", "{field}: {response}");
        let message = response["errors"][0]["message"].as_str().unwrap();
        assert!(message.contains(reason), "{message:?} should say {reason}");
    }
    let mut input = job_input("choice-alone", "hello");
    input["toolChoice"] = json!("auto");
    let response = app.create_job(&tenant, input).await;
    assert_eq!(error_code(&response), "VALIDATION", "{response}");
    assert_eq!(app.balance(&tenant).await, balance, "nothing held");
}

async fn tools_are_part_of_the_request_and_of_its_hold(backend: Backend) {
    let app = spawn_app_with(backend, AppOptions::no_workers()).await;
    let tenant = app.funded_tenant("acme", "5").await;
    let hold =
        |response: &Value| decimal(&response["data"]["createJob"]["job"]["reservation"]["amount"]);
    let first = app
        .create_job(&tenant, tool_job(Shape::OpenAi, "same-key", "hello"))
        .await;
    assert!(first["errors"].is_null(), "{first}");
    let replay = app
        .create_job(&tenant, tool_job(Shape::OpenAi, "same-key", "hello"))
        .await;
    assert_eq!(replay["data"]["createJob"]["replayed"], true, "{replay}");
    let mut other_tools = tool_job(Shape::OpenAi, "same-key", "hello");
    other_tools["tools"][0]["function"]["description"] = json!("Another description");
    let mut with_choice = tool_job(Shape::OpenAi, "same-key", "hello");
    with_choice["toolChoice"] = json!("required");
    let mut without = tool_job(Shape::OpenAi, "same-key", "hello");
    without.as_object_mut().unwrap().remove("tools");
    for changed in [other_tools, with_choice, without] {
        let response = app.create_job(&tenant, changed).await;
        assert_eq!(error_code(&response), "IDEMPOTENCY_CONFLICT", "{response}");
    }

    // The definitions are input the provider bills: the hold covers them as the
    // provider serving the model counts them (here the simulator: a token per four
    // bytes), at the input price (gpt-4o-mini: 0.15 per million, marked up 1.25), and
    // more.
    let plain = app.create_job(&tenant, job_input("plain", "hello")).await;
    let extra = hold(&first) - hold(&plain);
    let definitions = weather_tools().to_string().len() as i64;
    let per_token = Decimal::new(15, 8) * Decimal::new(125, 2);
    assert!(
        extra >= Decimal::from((definitions + 3) / 4) * per_token,
        "the hold grew by {extra} for {definitions} bytes of tools"
    );
    assert_billing_invariants(&app.app.db).await;
}

async fn batch_items_offer_the_batch_tools(backend: Backend) {
    let app = spawn_app(backend).await;
    let tenant = app.funded_tenant("acme", "5").await;
    let response = app
        .operation(
            Some(&tenant.key),
            "CreateBatch",
            json!({"input": {
                "idempotencyKey": "tools", "model": "gpt-4o-mini", "maxOutputTokens": 50,
                "tools": weather_tools(), "toolChoice": "required",
            }}),
        )
        .await;
    assert!(response["errors"].is_null(), "{response}");
    let batch: uuid::Uuid = response["data"]["createBatch"]["batch"]["id"]
        .as_str()
        .unwrap()
        .parse()
        .unwrap();
    let items = [json!({
        "customId": "oslo",
        "messages": [{"role": "user", "content": r#"[mock:tool_call=weather][mock:reply={"city": "Oslo"}]"#}],
    })];
    let added = crate::batches::add_items(&app, &tenant, batch, &items).await;
    assert!(added["errors"].is_null(), "{added}");
    let closed = app
        .operation(Some(&tenant.key), "CloseBatch", json!({"id": batch}))
        .await;
    assert!(closed["errors"].is_null(), "{closed}");
    crate::batches::wait_until_finished(&app, &tenant, batch, Duration::from_secs(60)).await;
    let sent = &app.simulator.calls()[0].request;
    assert_eq!(sent["tools"], weather_tools(), "{sent}");
    assert_eq!(sent["tool_choice"], "required", "{sent}");
    let (_, results) = crate::batches::results(&app, &tenant.key, batch).await;
    assert_eq!(results.len(), 1);
    assert_eq!(
        results[0]["result"]["toolCalls"][0]["arguments"],
        json!({"city": "Oslo"}),
        "{}",
        results[0]
    );
    assert_billing_invariants(&app.app.db).await;
}
