//! The Anthropic client: against wiremock for exact answers and error classes, and
//! against the simulator for its deterministic usage.

use super::{closed_port, hello, request};
use jobledger::llm::anthropic::AnthropicClient;
use jobledger::llm::simulator::Simulator;
use jobledger::llm::{Completion, Provider, ProviderError};
use jobledger::llm::{Role, TokenUsage};
use serde_json::{Value, json};
use std::time::Duration;
use tokio_util::sync::CancellationToken;
use wiremock::matchers::{body_json, header, method, path};
use wiremock::{Mock, MockServer, ResponseTemplate};

const KEY: &str = "sk-ant-test";

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
            tool_calls: Vec::new(),
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
