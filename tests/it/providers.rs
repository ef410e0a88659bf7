//! The provider clients over real HTTP: against wiremock for exact answers and error
//! classes, and against the simulator for its deterministic usage.

use std::net::SocketAddr;
use std::time::Duration;

use crate::helpers::{AppOptions, Backend, job_input, spawn_app_with};
use jobledger::llm::anthropic::AnthropicClient;
use jobledger::llm::openai::OpenAiClient;
use jobledger::llm::simulator::Simulator;
use jobledger::llm::{ChatRequest, Completion, Provider, ProviderError};
use jobledger::llm::{Message, Role, TokenUsage};
use serde_json::{Value, json};
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;
use wiremock::matchers::{body_json, body_string_contains, header, method, path};
use wiremock::{Mock, MockServer, ResponseTemplate};

const KEY: &str = "sk-ant-test";

fn request(messages: &[(Role, &str)]) -> ChatRequest {
    ChatRequest {
        model: "claude-sonnet-4-5".to_owned(),
        messages: messages
            .iter()
            .map(|(role, content)| Message {
                role: *role,
                content: (*content).to_owned(),
            })
            .collect(),
        max_output_tokens: 256,
        response_schema: None,
    }
}

fn hello() -> ChatRequest {
    request(&[(Role::User, "Hello")])
}

/// An Anthropic message answer with `usage`.
fn message(usage: Value) -> Value {
    json!({
        "id": "msg_body",
        "type": "message",
        "role": "assistant",
        "model": "claude-sonnet-4-5",
        "content": [{"type": "text", "text": "Hi there"}],
        "stop_reason": "end_turn",
        "stop_sequence": null,
        "usage": usage,
    })
}

fn anthropic_error(kind: &str, message: &str) -> Value {
    json!({"type": "error", "error": {"type": kind, "message": message}})
}

fn anthropic(server: &MockServer) -> AnthropicClient {
    AnthropicClient::new("anthropic", &server.uri(), Some(KEY.to_owned()))
}

/// Mounts one Anthropic answer for any well-formed messages call.
async fn answer_messages(server: &MockServer, response: ResponseTemplate) {
    Mock::given(method("POST"))
        .and(path("/v1/messages"))
        .and(header("x-api-key", KEY))
        .and(header("anthropic-version", "2023-06-01"))
        .and(header("content-type", "application/json"))
        .respond_with(response)
        .expect(1)
        .mount(server)
        .await;
}

/// An address where nothing listens: bound, then let go.
async fn closed_port() -> SocketAddr {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    listener.local_addr().unwrap()
}

#[tokio::test]
async fn anthropic_cache_reads_and_writes_count_as_input_once() {
    let server = MockServer::start().await;
    answer_messages(
        &server,
        ResponseTemplate::new(200)
            .insert_header("request-id", "req_header")
            .set_body_json(json!({
                "id": "msg_body",
                "type": "message",
                "role": "assistant",
                "model": "claude-sonnet-4-5",
                "content": [
                    {"type": "thinking", "thinking": "hmm", "signature": "sig"},
                    {"type": "text", "text": "Hello, "},
                    {"type": "text", "text": "world"},
                ],
                "stop_reason": "end_turn",
                "usage": {
                    "input_tokens": 12,
                    "output_tokens": 5,
                    "cache_read_input_tokens": 1000,
                    "cache_creation_input_tokens": 300,
                },
            })),
    )
    .await;

    let completion = anthropic(&server).complete(&hello()).await.unwrap();

    assert_eq!(
        completion,
        Completion {
            text: "Hello, world".to_owned(),
            usage: TokenUsage {
                input_tokens: 1312,
                cached_input_tokens: 1000,
                output_tokens: 5,
            },
            request_id: Some("req_header".to_owned()),
        }
    );
}

#[tokio::test]
async fn anthropic_request_id_falls_back_to_the_body_id() {
    let server = MockServer::start().await;
    // Older answers and compatible servers send the cache fields as null or not at all.
    answer_messages(
        &server,
        ResponseTemplate::new(200).set_body_json(message(json!({
            "input_tokens": 3,
            "output_tokens": 2,
            "cache_read_input_tokens": null,
        }))),
    )
    .await;

    let completion = anthropic(&server).complete(&hello()).await.unwrap();

    assert_eq!(completion.request_id.as_deref(), Some("msg_body"));
    assert_eq!(
        completion.usage,
        TokenUsage {
            input_tokens: 3,
            cached_input_tokens: 0,
            output_tokens: 2,
        }
    );
}

#[tokio::test]
async fn anthropic_system_and_developer_messages_go_to_system() {
    let server = MockServer::start().await;
    Mock::given(method("POST"))
        .and(path("/v1/messages"))
        .and(body_json(json!({
            "model": "claude-sonnet-4-5",
            "max_tokens": 256,
            "system": "Be terse.\n\nAnswer in English.",
            "messages": [
                {"role": "user", "content": "Summarise this."},
                {"role": "assistant", "content": "Which part?"},
                {"role": "user", "content": "All of it."},
            ],
        })))
        .respond_with(ResponseTemplate::new(200).set_body_json(message(json!({
            "input_tokens": 20,
            "output_tokens": 3,
        }))))
        .expect(1)
        .mount(&server)
        .await;
    // A base that already ends in /v1/ reaches the same path.
    let client = AnthropicClient::new("anthropic", &format!("{}/v1/", server.uri()), None);

    let completion = client
        .complete(&request(&[
            (Role::System, "Be terse."),
            (Role::User, "Summarise this."),
            (Role::Assistant, "Which part?"),
            (Role::Developer, "Answer in English."),
            (Role::User, "All of it."),
        ]))
        .await
        .unwrap();

    assert_eq!(completion.text, "Hi there");
}

#[tokio::test]
async fn anthropic_client_errors_are_permanent() {
    for (status, kind, sentence) in [
        (
            400,
            "invalid_request_error",
            "the provider refused the request as invalid",
        ),
        (
            401,
            "authentication_error",
            "the provider refused the service's credentials",
        ),
        (
            404,
            "not_found_error",
            "the provider does not know the model or the endpoint",
        ),
        (
            422,
            "invalid_request_error",
            "the provider could not process the request",
        ),
    ] {
        let server = MockServer::start().await;
        answer_messages(
            &server,
            ResponseTemplate::new(status)
                .insert_header("request-id", "req_refused")
                // A Retry-After on a refusal changes nothing: it stays permanent.
                .insert_header("retry-after", "5")
                .set_body_json(anthropic_error(kind, "no such thing")),
        )
        .await;

        let error = anthropic(&server).complete(&hello()).await.unwrap_err();

        match error {
            ProviderError::Permanent {
                status: got,
                message,
                request_id,
            } => {
                assert_eq!(got, status);
                assert_eq!(
                    message,
                    format!("{sentence} (provider request id req_refused)"),
                    "the tenant reads a fixed sentence, never the provider's text"
                );
                assert_eq!(request_id.as_deref(), Some("req_refused"));
            }
            other => panic!("{status}: expected Permanent, got {other:?}"),
        }
    }
}

#[tokio::test]
async fn anthropic_rate_limits_overload_and_server_errors_are_transient() {
    for (status, kind, retry_after, sentence) in [
        (
            429,
            "rate_limit_error",
            Some("7"),
            "rate limited by the provider",
        ),
        (500, "api_error", None, "the provider failed"),
        (
            529,
            "overloaded_error",
            Some("2"),
            "the provider is overloaded or unavailable",
        ),
    ] {
        let server = MockServer::start().await;
        let mut response = ResponseTemplate::new(status)
            .insert_header("request-id", "req_busy")
            .set_body_json(anthropic_error(kind, "try later"));
        if let Some(seconds) = retry_after {
            response = response.insert_header("retry-after", seconds);
        }
        answer_messages(&server, response).await;

        let error = anthropic(&server).complete(&hello()).await.unwrap_err();

        match error {
            ProviderError::Transient {
                status: got,
                message,
                retry_after: got_retry_after,
                request_id,
            } => {
                assert_eq!(got, status);
                assert_eq!(
                    message,
                    format!("{sentence} (provider request id req_busy)")
                );
                assert_eq!(
                    got_retry_after,
                    retry_after.map(|seconds| Duration::from_secs(seconds.parse().unwrap()))
                );
                assert_eq!(request_id.as_deref(), Some("req_busy"));
            }
            other => panic!("{status}: expected Transient, got {other:?}"),
        }
    }
}

#[tokio::test]
async fn anthropic_error_request_id_falls_back_to_the_error_body() {
    let server = MockServer::start().await;
    let mut body = anthropic_error("invalid_request_error", "max_tokens: required");
    body["request_id"] = json!("req_in_body");
    answer_messages(&server, ResponseTemplate::new(400).set_body_json(body)).await;

    let error = anthropic(&server).complete(&hello()).await.unwrap_err();

    assert!(matches!(
        error,
        ProviderError::Permanent { status: 400, .. }
    ));
    assert_eq!(error.request_id(), Some("req_in_body"));
}

#[tokio::test]
async fn anthropic_connection_refused_is_not_sent() {
    let address = closed_port().await;
    let client = AnthropicClient::new("anthropic", &format!("http://{address}"), None);

    let error = client.complete(&hello()).await.unwrap_err();

    assert!(
        matches!(error, ProviderError::NotSent { .. }),
        "expected NotSent, got {error:?}"
    );
}

#[tokio::test]
async fn anthropic_unreadable_or_usageless_success_is_an_unknown_outcome() {
    for response in [
        ResponseTemplate::new(200).set_body_string("this is not JSON {"),
        ResponseTemplate::new(200).set_body_json(json!({
            "id": "msg_1",
            "type": "message",
            "content": [{"type": "text", "text": "Hi"}],
        })),
    ] {
        let server = MockServer::start().await;
        answer_messages(&server, response).await;

        let error = anthropic(&server).complete(&hello()).await.unwrap_err();

        assert!(
            matches!(error, ProviderError::OutcomeUnknown { .. }),
            "expected OutcomeUnknown, got {error:?}"
        );
    }
}

/// The simulator on a random port, stopped when the returned token is cancelled.
async fn simulator() -> (String, Simulator, CancellationToken) {
    let running = crate::helpers::RunningSimulator::start().await;
    (
        format!("http://{}", running.address),
        running.simulator,
        running.stop,
    )
}

/// The simulator's tokenizer: one token per started 4 bytes of all input text.
fn simulator_tokens(texts: &[&str]) -> u64 {
    (texts.iter().map(|text| text.len()).sum::<usize>() as u64).div_ceil(4)
}

#[tokio::test]
async fn anthropic_usage_against_the_simulator() {
    let (base, simulator, stop) = simulator().await;
    let client = AnthropicClient::new("anthropic", &base, Some(KEY.to_owned()));

    let completion = client
        .complete(&request(&[
            (Role::System, "You are terse."),
            (Role::Developer, "Use English."),
            (Role::User, "Summarise: the quarter went well, héé."),
            (Role::Assistant, "Which quarter?"),
            (Role::User, "The third."),
        ]))
        .await
        .unwrap();

    // The client sends system and developer text as one system prompt.
    let input_tokens = simulator_tokens(&[
        "You are terse.\n\nUse English.",
        "Summarise: the quarter went well, héé.",
        "Which quarter?",
        "The third.",
    ]);
    let text = "Summary: The third.";
    assert_eq!(completion.text, text);
    assert_eq!(
        completion.usage,
        TokenUsage {
            input_tokens,
            cached_input_tokens: 0,
            output_tokens: simulator_tokens(&[text]),
        }
    );
    let calls = simulator.calls();
    assert_eq!(calls.len(), 1);
    assert_eq!(
        completion.request_id.as_deref(),
        Some(&*calls[0].request_id)
    );
    assert!(calls[0].request_id.starts_with("msg_"));
    assert_eq!(
        (calls[0].status, calls[0].billed, calls[0].input_tokens),
        (200, true, input_tokens)
    );
    stop.cancel();
}

#[tokio::test]
async fn anthropic_faults_from_the_simulator_are_classified() {
    let (base, simulator, stop) = simulator().await;
    let client = AnthropicClient::new("anthropic", &format!("{base}/v1"), None);

    let error = client
        .complete(&request(&[(
            Role::User,
            "[mock:status=529][mock:retry_after=3] busy",
        )]))
        .await
        .unwrap_err();
    match &error {
        ProviderError::Transient {
            status: 529,
            retry_after,
            request_id: Some(request_id),
            ..
        } => {
            assert_eq!(*retry_after, Some(Duration::from_secs(3)));
            assert_eq!(*request_id, simulator.calls()[0].request_id);
        }
        other => panic!("expected Transient 529, got {other:?}"),
    }

    // Dropped after the request was read and billed: the outcome is unknown.
    let error = client
        .complete(&request(&[(Role::User, "[mock:drop] gone")]))
        .await
        .unwrap_err();
    assert!(
        matches!(error, ProviderError::OutcomeUnknown { .. }),
        "expected OutcomeUnknown, got {error:?}"
    );
    assert!(simulator.calls()[1].billed);
    stop.cancel();
}

// The OpenAI-compatible client's classification, against the same kind of answers.

fn openai(server: &MockServer) -> OpenAiClient {
    OpenAiClient::new(
        "openai",
        &format!("{}/v1", server.uri()),
        Some("sk-test".into()),
    )
}

async fn answer_chat(server: &MockServer, response: ResponseTemplate) {
    Mock::given(method("POST"))
        .and(path("/v1/chat/completions"))
        .and(header("authorization", "Bearer sk-test"))
        .respond_with(response)
        .expect(1)
        .mount(server)
        .await;
}

fn chat_completion(usage: Value) -> Value {
    json!({
        "id": "chatcmpl-body",
        "object": "chat.completion",
        "choices": [{"index": 0, "message": {"role": "assistant", "content": "Hi"}, "finish_reason": "stop"}],
        "usage": usage,
    })
}

#[tokio::test]
async fn openai_cached_tokens_are_part_of_input() {
    let server = MockServer::start().await;
    answer_chat(
        &server,
        ResponseTemplate::new(200)
            .insert_header("x-request-id", "req_openai")
            .set_body_json(chat_completion(json!({
                "prompt_tokens": 1200,
                "completion_tokens": 9,
                "total_tokens": 1209,
                "prompt_tokens_details": {"cached_tokens": 1024},
            }))),
    )
    .await;

    let completion = openai(&server).complete(&hello()).await.unwrap();

    assert_eq!(
        completion,
        Completion {
            text: "Hi".to_owned(),
            usage: TokenUsage {
                input_tokens: 1200,
                cached_input_tokens: 1024,
                output_tokens: 9,
            },
            request_id: Some("req_openai".to_owned()),
        }
    );
}

#[tokio::test]
async fn openai_rate_limit_is_transient_with_retry_after() {
    let server = MockServer::start().await;
    answer_chat(
        &server,
        ResponseTemplate::new(429)
            .insert_header("retry-after", "1.5")
            .insert_header("x-request-id", "req_limited")
            .set_body_json(json!({"error": {"message": "slow down", "type": "rate_limit_error"}})),
    )
    .await;

    let error = openai(&server).complete(&hello()).await.unwrap_err();

    match error {
        ProviderError::Transient {
            status: 429,
            message,
            retry_after,
            request_id,
        } => {
            assert_eq!(
                message,
                "rate limited by the provider (provider request id req_limited)"
            );
            assert_eq!(retry_after, Some(Duration::from_millis(1500)));
            assert_eq!(request_id.as_deref(), Some("req_limited"));
        }
        other => panic!("expected Transient 429, got {other:?}"),
    }
}

#[tokio::test]
async fn openai_bad_request_is_permanent() {
    let server = MockServer::start().await;
    answer_chat(
        &server,
        ResponseTemplate::new(400).set_body_json(
            json!({"error": {"message": "unknown model", "type": "invalid_request_error"}}),
        ),
    )
    .await;

    let error = openai(&server).complete(&hello()).await.unwrap_err();

    match error {
        ProviderError::Permanent {
            status: 400,
            message,
            ..
        } => assert_eq!(message, "the provider refused the request as invalid"),
        other => panic!("expected Permanent 400, got {other:?}"),
    }
}

#[tokio::test]
async fn openai_success_without_usage_is_an_unknown_outcome() {
    let server = MockServer::start().await;
    let mut body = chat_completion(Value::Null);
    body.as_object_mut().unwrap().remove("usage");
    answer_chat(&server, ResponseTemplate::new(200).set_body_json(body)).await;

    let error = openai(&server).complete(&hello()).await.unwrap_err();

    assert!(
        matches!(error, ProviderError::OutcomeUnknown { .. }),
        "expected OutcomeUnknown, got {error:?}"
    );
}

#[tokio::test]
async fn openai_connection_refused_is_not_sent() {
    let address = closed_port().await;
    let client = OpenAiClient::new("openai", &format!("http://{address}/v1"), None);

    let error = client.complete(&hello()).await.unwrap_err();

    match error {
        // The transport's own words (and the address) stay in the log.
        ProviderError::NotSent { message } => assert_eq!(
            message,
            "the provider could not be reached; nothing was sent"
        ),
        other => panic!("expected NotSent, got {other:?}"),
    }
}

#[tokio::test]
async fn a_provider_slow_to_answer_hits_the_first_byte_timeout_as_an_unknown_outcome() {
    let server = MockServer::start().await;
    Mock::given(method("POST"))
        .respond_with(ResponseTemplate::new(200).set_delay(Duration::from_secs(5)))
        .mount(&server)
        .await;
    let timeouts = jobledger::llm::Timeouts {
        connect: Duration::from_secs(5),
        first_byte: Some(Duration::from_millis(200)),
    };
    let clients: [Box<dyn Provider>; 2] = [
        Box::new(
            OpenAiClient::new("openai", &format!("{}/v1", server.uri()), None)
                .with_timeouts(timeouts),
        ),
        Box::new(AnthropicClient::new("anthropic", &server.uri(), None).with_timeouts(timeouts)),
    ];
    for client in clients {
        match client.complete(&hello()).await {
            Err(ProviderError::OutcomeUnknown { message }) => {
                assert!(
                    message.contains("first-byte"),
                    "{}: {message}",
                    client.name()
                )
            }
            other => panic!(
                "{}: expected an unknown outcome, got {other:?}",
                client.name()
            ),
        }
    }
}

// ---- What a tenant reads of a provider's error, through the whole service ----

/// Everything a tenant can read about a job that ends in a provider error.
const JOB_AS_THE_TENANT_SEES_IT: &str = r#"
query ($id: UUID!) {
  job(id: $id) {
    status
    error { code message }
    attempts { outcome errorCode errorMessage provider providerRequestId }
    events { seq kind status data }
  }
}
"#;

/// A config file sending every `gpt-*` model to the OpenAI-compatible `server`.
fn routed_to(server: &MockServer) -> (tempfile::TempDir, AppOptions) {
    let folder = tempfile::tempdir().unwrap();
    let path = folder.path().join("jobledger.toml");
    let text = format!(
        "[providers.upstream]\nkind = \"openai\"\nbase_url = \"{}/v1\"\n\n[routes]\n\"gpt-*\" = \"upstream\"\n",
        server.uri()
    );
    std::fs::write(&path, text).unwrap();
    let options = AppOptions {
        config_file: Some(path),
        ..AppOptions::default()
    };
    (folder, options)
}

/// Answers chat calls whose prompt contains `marker` with `response`.
async fn answer_prompts_with(server: &MockServer, marker: &str, response: ResponseTemplate) {
    Mock::given(method("POST"))
        .and(path("/v1/chat/completions"))
        .and(body_string_contains(marker))
        .respond_with(response)
        .mount(server)
        .await;
}

on_both_backends!(a_providers_error_text_never_reaches_the_tenant);

/// A 429 that names our OpenAI organisation and a gateway's 502 page that names an
/// internal host: the tenant reads a fixed sentence per class with the provider's
/// request id — on the job, its attempts and its events — and none of the provider's
/// words. A context-window refusal is told apart by its error code.
async fn a_providers_error_text_never_reaches_the_tenant(backend: Backend) {
    let server = MockServer::start().await;
    answer_prompts_with(
        &server,
        "rate-limited",
        ResponseTemplate::new(429)
            .insert_header("x-request-id", "req_429_abc")
            .set_body_json(json!({"error": {
                "message": "Rate limit reached for gpt-4o-mini in organization org-SECRET123 on requests per min (RPM): Limit 3, Used 3.",
                "type": "requests",
                "code": "rate_limit_exceeded",
            }})),
    )
    .await;
    answer_prompts_with(
        &server,
        "behind-a-gateway",
        ResponseTemplate::new(502)
            .insert_header("x-request-id", "req_502_def")
            .insert_header("content-type", "text/html")
            .set_body_string(
                "<html><head><title>502 Bad Gateway</title></head><body><h1>Bad Gateway</h1><p>upstream internal-gw-7.corp:8443 did not answer</p></body></html>",
            ),
    )
    .await;
    answer_prompts_with(
        &server,
        "far-too-long",
        ResponseTemplate::new(400)
            .insert_header("x-request-id", "req_400_ghi")
            .set_body_json(json!({"error": {
                "message": "This model's maximum context length is 128000 tokens. However, your messages resulted in 912345 tokens (see org-SECRET123 usage).",
                "type": "invalid_request_error",
                "param": "messages",
                "code": "context_length_exceeded",
            }})),
    )
    .await;
    let (_config, options) = routed_to(&server);
    let app = spawn_app_with(backend, options).await;
    let tenant = app.funded_tenant("acme", "5").await;

    for (prompt, request_id, code, sentence) in [
        (
            "rate-limited",
            "req_429_abc",
            "PROVIDER_UNAVAILABLE",
            "provider answered 429: rate limited by the provider",
        ),
        (
            "behind-a-gateway",
            "req_502_def",
            "PROVIDER_UNAVAILABLE",
            "provider answered 502: the provider failed",
        ),
        (
            "far-too-long",
            "req_400_ghi",
            "PROVIDER_REJECTED",
            "provider refused the request with 400: the prompt exceeds the model's context window",
        ),
    ] {
        let mut input = job_input(prompt, prompt);
        // One attempt: the job fails on the provider's first answer.
        input["maxAttempts"] = json!(1);
        let id = app.create_job_ok(&tenant, input).await;
        app.wait_until_finished(&tenant, id, Duration::from_secs(15))
            .await;
        let response = app
            .graphql(
                Some(&tenant.key),
                JOB_AS_THE_TENANT_SEES_IT,
                json!({"id": id}),
            )
            .await;
        assert!(response["errors"].is_null(), "{response}");
        let job = &response["data"]["job"];
        let seen = job.to_string();
        for secret in ["org-SECRET123", "internal-gw-7.corp", "Bad Gateway", "RPM"] {
            assert!(!seen.contains(secret), "{prompt}: {secret} leaked in {job}");
        }
        assert_eq!(job["status"], "FAILED", "{job}");
        assert_eq!(job["error"]["code"], code, "{job}");
        let expected = format!("{sentence} (provider request id {request_id})");
        assert_eq!(job["error"]["message"], expected.as_str(), "{job}");
        let attempt = &job["attempts"][0];
        assert_eq!(attempt["errorMessage"], expected.as_str(), "{job}");
        assert_eq!(attempt["providerRequestId"], request_id, "{job}");
        assert_eq!(attempt["provider"], "upstream", "{job}");
        let failed = job["events"]
            .as_array()
            .unwrap()
            .iter()
            .find(|event| event["kind"] == "FAILED")
            .unwrap_or_else(|| panic!("no FAILED event in {job}"));
        assert!(
            failed["data"].to_string().contains(request_id),
            "the event names the request id: {failed}"
        );
    }
}
