//! The OpenAI-compatible client's classification, against the same kind of answers.

use super::{closed_port, hello};
use jobledger::llm::TokenUsage;
use jobledger::llm::anthropic::AnthropicClient;
use jobledger::llm::openai::OpenAiClient;
use jobledger::llm::{Completion, Provider, ProviderError};
use serde_json::{Value, json};
use std::time::Duration;
use wiremock::matchers::{header, method, path};
use wiremock::{Mock, MockServer, ResponseTemplate};

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
            tool_calls: Vec::new(),
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
