//! Streaming: both clients read server-sent events into the same completion a plain
//! call gives, and a job that streams shows its text live as `OUTPUT_DELTA` events on
//! `jobUpdates`, in order, before its terminal event.

use crate::contract::operation;
use crate::helpers::{Backend, event_kinds, job_input, spawn_app};
use crate::invariants::assert_billing_invariants;
use jobledger::llm::anthropic::AnthropicClient;
use jobledger::llm::openai::OpenAiClient;
use jobledger::llm::simulator::Simulator;
use jobledger::llm::{ChatRequest, Provider, ProviderError};
use jobledger::llm::{Message, Role};
use serde_json::json;
use std::time::Duration;
use tokio_util::sync::CancellationToken;
use wiremock::matchers::{body_partial_json, method, path};
use wiremock::{Mock, MockServer, ResponseTemplate};

on_both_backends!(a_streaming_job_shows_its_text_live_and_in_order);

const REPLY: &str = "The quick brown fox jumps over the lazy dog, and then does it again.";

async fn a_streaming_job_shows_its_text_live_and_in_order(backend: Backend) {
    let app = spawn_app(backend).await;
    let tenant = app.funded_tenant("acme", "5").await;
    let mut input = job_input(
        "live-text",
        &format!("tell me [mock:reply={REPLY}][mock:chunk_delay_ms=150]"),
    );
    input["streamOutput"] = json!(true);
    let id = app.create_job_ok(&tenant, input).await;
    let document = operation("JobUpdates").replace("at }", "at delta }");
    let events = app
        .subscribe(
            &tenant.key,
            &document,
            json!({"jobId": id}),
            Duration::from_secs(30),
        )
        .await
        .unwrap();
    let events: Vec<_> = events
        .iter()
        .map(|payload| payload["data"]["jobUpdates"].clone())
        .collect();
    let kinds: Vec<_> = events
        .iter()
        .map(|event| event["kind"].as_str().unwrap())
        .collect();
    let deltas: Vec<_> = events
        .iter()
        .filter(|event| event["kind"] == "OUTPUT_DELTA")
        .collect();
    assert!(
        deltas.len() >= 2,
        "the text arrived in several pieces: {kinds:?}"
    );
    assert_eq!(kinds.first(), Some(&"CREATED"));
    assert_eq!(kinds.last(), Some(&"SUCCEEDED"));
    let started = kinds
        .iter()
        .position(|kind| *kind == "ATTEMPT_STARTED")
        .unwrap();
    let first_delta = kinds
        .iter()
        .position(|kind| *kind == "OUTPUT_DELTA")
        .unwrap();
    assert!(
        started < first_delta,
        "deltas follow the attempt's start: {kinds:?}"
    );
    for delta in &deltas {
        assert_eq!(
            delta["seq"], events[started]["seq"],
            "a delta carries the seq of the event it follows"
        );
        assert_eq!(delta["status"], "RUNNING");
    }
    let streamed: String = deltas
        .iter()
        .map(|delta| delta["delta"].as_str().unwrap())
        .collect();
    assert_eq!(streamed, REPLY, "the deltas, in order, are the reply");

    let job = app.job(&tenant, id).await;
    assert_eq!(job["result"], REPLY);
    let calls = app.simulator.calls();
    assert_eq!(
        job["attempts"][0]["inputTokens"], calls[0].input_tokens,
        "usage from the stream's last chunk"
    );
    assert_eq!(job["attempts"][0]["outputTokens"], calls[0].output_tokens);
    assert!(job["charge"]["amount"].is_string());
    // Deltas are not stored: the timeline keeps the stored events only.
    assert_eq!(
        event_kinds(&job),
        ["CREATED", "ATTEMPT_STARTED", "SUCCEEDED"]
    );
    assert_billing_invariants(&app.app.db).await;
}

fn request(model: &str, content: &str) -> ChatRequest {
    ChatRequest {
        model: model.to_owned(),
        messages: vec![
            Message::text(Role::System, "Be brief."),
            Message::text(Role::User, content),
        ],
        max_output_tokens: 256,
        response_schema: None,
        parameters: Default::default(),
        tools: Default::default(),
    }
}

async fn simulator() -> (String, Simulator, CancellationToken) {
    let running = crate::helpers::RunningSimulator::start().await;
    (
        format!("http://{}", running.address),
        running.simulator,
        running.stop,
    )
}

/// Streams `request` and returns the completion with the pieces sent on the way.
async fn stream(
    provider: &dyn Provider,
    request: &ChatRequest,
) -> (
    Result<jobledger::llm::Completion, ProviderError>,
    Vec<String>,
) {
    let (sender, mut receiver) = tokio::sync::mpsc::unbounded_channel();
    let completion = provider.stream(request, &sender).await;
    drop(sender);
    let mut pieces = Vec::new();
    while let Some(piece) = receiver.recv().await {
        pieces.push(piece);
    }
    (completion, pieces)
}

#[tokio::test]
async fn both_clients_stream_the_simulators_answers_with_exact_usage() {
    let (base, simulator, stop) = simulator().await;
    let clients: [(&str, Box<dyn Provider>); 2] = [
        (
            "gpt-4o-mini",
            Box::new(OpenAiClient::new("openai", &format!("{base}/v1"), None)),
        ),
        (
            "claude-sonnet-4-5",
            Box::new(AnthropicClient::new("anthropic", &base, None)),
        ),
    ];
    for (model, client) in clients {
        let (completion, pieces) = stream(
            client.as_ref(),
            &request(model, &format!("hi [mock:reply={REPLY}]")),
        )
        .await;
        let completion = completion.unwrap();
        assert!(
            pieces.len() >= 2,
            "{model}: the reply came in pieces: {pieces:?}"
        );
        assert_eq!(pieces.concat(), REPLY, "{model}");
        assert_eq!(completion.text, REPLY, "{model}");
        let call = simulator.calls().pop().unwrap();
        assert_eq!(
            completion.request_id.as_deref(),
            Some(call.request_id.as_str()),
            "{model}"
        );
        assert_eq!(completion.usage.input_tokens, call.input_tokens, "{model}");
        assert_eq!(
            completion.usage.output_tokens, call.output_tokens,
            "{model}"
        );
    }
    stop.cancel();
}

#[tokio::test]
async fn an_openai_stream_with_cached_tokens_and_crlf_lines_is_read_exactly() {
    let server = MockServer::start().await;
    let body = concat!(
        "data: {\"id\":\"chatcmpl-1\",\"choices\":[{\"index\":0,\"delta\":{\"role\":\"assistant\",\"content\":\"\"}}]}\r\n\r\n",
        ": keep-alive comment\r\n\r\n",
        "data: {\"id\":\"chatcmpl-1\",\"choices\":[{\"index\":0,\"delta\":{\"content\":\"Hel\"}}]}\r\n\r\n",
        "data: {\"id\":\"chatcmpl-1\",\"choices\":[{\"index\":0,\"delta\":{\"content\":\"lo\"}}]}\n\n",
        "data: {\"id\":\"chatcmpl-1\",\"choices\":[],\"usage\":{\"prompt_tokens\":120,\"completion_tokens\":2,",
        "\"prompt_tokens_details\":{\"cached_tokens\":100},\"completion_tokens_details\":{\"reasoning_tokens\":0}}}\n\n",
        "data: [DONE]\n\n",
    );
    Mock::given(method("POST"))
        .and(path("/v1/chat/completions"))
        .and(body_partial_json(
            json!({"stream": true, "stream_options": {"include_usage": true}}),
        ))
        .respond_with(
            ResponseTemplate::new(200)
                .insert_header("content-type", "text/event-stream")
                .set_body_raw(body, "text/event-stream"),
        )
        .mount(&server)
        .await;
    let client = OpenAiClient::new(
        "openai",
        &format!("{}/v1", server.uri()),
        Some("key".into()),
    );
    let (completion, pieces) = stream(&client, &request("gpt-4o-mini", "hi")).await;
    let completion = completion.unwrap();
    assert_eq!(pieces, ["Hel", "lo"]);
    assert_eq!(completion.text, "Hello");
    assert_eq!(completion.usage.input_tokens, 120);
    assert_eq!(completion.usage.cached_input_tokens, 100);
    assert_eq!(completion.usage.output_tokens, 2);
    assert_eq!(completion.request_id.as_deref(), Some("chatcmpl-1"));
}

#[tokio::test]
async fn a_stream_that_ends_without_usage_is_an_unknown_outcome() {
    let server = MockServer::start().await;
    let body = "data: {\"id\":\"c\",\"choices\":[{\"index\":0,\"delta\":{\"content\":\"Hi\"}}]}\n\ndata: [DONE]\n\n";
    Mock::given(method("POST"))
        .respond_with(ResponseTemplate::new(200).set_body_raw(body, "text/event-stream"))
        .mount(&server)
        .await;
    let client = OpenAiClient::new("openai", &format!("{}/v1", server.uri()), None);
    let (completion, _) = stream(&client, &request("gpt-4o-mini", "hi")).await;
    assert!(
        matches!(completion, Err(ProviderError::OutcomeUnknown { .. })),
        "{completion:?}"
    );

    // An Anthropic stream cut before message_stop is unknown too.
    let server = MockServer::start().await;
    let body = concat!(
        "event: message_start\ndata: {\"type\":\"message_start\",\"message\":{\"id\":\"msg_1\",\"usage\":{\"input_tokens\":5,\"output_tokens\":1}}}\n\n",
        "event: content_block_delta\ndata: {\"type\":\"content_block_delta\",\"index\":0,\"delta\":{\"type\":\"text_delta\",\"text\":\"Hi\"}}\n\n",
    );
    Mock::given(method("POST"))
        .respond_with(ResponseTemplate::new(200).set_body_raw(body, "text/event-stream"))
        .mount(&server)
        .await;
    let client = AnthropicClient::new("anthropic", &server.uri(), None);
    let (completion, pieces) = stream(&client, &request("claude-sonnet-4-5", "hi")).await;
    assert_eq!(pieces, ["Hi"]);
    assert!(
        matches!(completion, Err(ProviderError::OutcomeUnknown { .. })),
        "{completion:?}"
    );
}

#[tokio::test]
async fn an_error_status_on_a_stream_is_classified_like_a_plain_call() {
    let server = MockServer::start().await;
    Mock::given(method("POST"))
        .respond_with(
            ResponseTemplate::new(429)
                .insert_header("retry-after", "3")
                .set_body_json(
                    json!({"error": {"message": "slow down", "type": "rate_limit_error"}}),
                ),
        )
        .mount(&server)
        .await;
    let client = OpenAiClient::new("openai", &format!("{}/v1", server.uri()), None);
    let (completion, pieces) = stream(&client, &request("gpt-4o-mini", "hi")).await;
    assert!(pieces.is_empty());
    match completion {
        Err(ProviderError::Transient {
            status: 429,
            retry_after,
            ..
        }) => assert_eq!(retry_after, Some(Duration::from_secs(3))),
        other => panic!("expected a transient error, got {other:?}"),
    }
}

#[tokio::test]
async fn an_exhausted_provider_quota_is_permanent_not_a_rate_limit() {
    let server = MockServer::start().await;
    Mock::given(method("POST"))
        .respond_with(ResponseTemplate::new(429).set_body_json(json!({"error": {
            "message": "You exceeded your current quota.",
            "type": "insufficient_quota",
            "code": "insufficient_quota"
        }})))
        .mount(&server)
        .await;
    let client = OpenAiClient::new("openai", &format!("{}/v1", server.uri()), None);
    for streaming in [false, true] {
        let completion = if streaming {
            stream(&client, &request("gpt-4o-mini", "hi")).await.0
        } else {
            client.complete(&request("gpt-4o-mini", "hi")).await
        };
        assert!(
            matches!(
                completion,
                Err(ProviderError::Permanent { status: 429, .. })
            ),
            "streaming {streaming}: {completion:?}"
        );
    }
}
