//! Usage as the simulator counts it: bytes over four, replies capped at the token limit.

use super::{Server, ceil4, chat, header, messages};
use reqwest::StatusCode;
use serde_json::{Value, json};

#[tokio::test]
async fn openai_usage_is_bytes_over_four() {
    let server = Server::start().await;
    let response = server
        .openai(json!({
            "model": "gpt-test",
            "max_tokens": 100,
            "messages": [
                { "role": "system", "content": "You are terse." },
                { "role": "user", "content": [
                    { "type": "text", "text": "Hello " },
                    { "type": "image_url", "image_url": { "url": "data:," } },
                    { "type": "text", "text": "world" },
                ]},
            ],
        }))
        .await;
    assert_eq!(response.status(), StatusCode::OK);
    let request_id = header(&response, "x-request-id").unwrap().to_owned();
    let body: Value = response.json().await.unwrap();

    assert_eq!(body["id"], request_id);
    assert!(request_id.starts_with("chatcmpl-"));
    assert_eq!(body["object"], "chat.completion");
    assert_eq!(body["model"], "gpt-test");
    assert!(body["created"].is_i64());
    let choice = &body["choices"][0];
    assert_eq!(choice["index"], 0);
    assert_eq!(choice["message"]["role"], "assistant");
    assert_eq!(choice["message"]["content"], "Summary: Hello world");
    assert_eq!(choice["finish_reason"], "stop");
    // The text at a quarter of its bytes; the image, whose bytes are not at hand, at
    // the most an image counts for a model OpenAI's rules do not name (768 × 2048
    // after resizing, eight tiles, by the dearest rule: 2833 + 5667 × 8).
    let input = ceil4("You are terse.".len() + "Hello world".len()) + 2833 + 5667 * 8;
    let output = ceil4("Summary: Hello world".len());
    assert_eq!(
        body["usage"],
        json!({
            "prompt_tokens": input,
            "completion_tokens": output,
            "total_tokens": input + output,
            "prompt_tokens_details": { "cached_tokens": 0 },
            "completion_tokens_details": { "reasoning_tokens": 0 },
        })
    );

    let calls = server.sim.calls();
    assert_eq!(calls.len(), 1);
    assert_eq!(calls[0].request_id, request_id);
    assert_eq!(calls[0].model, "gpt-test");
    assert_eq!((calls[0].status, calls[0].billed), (200, true));
    assert_eq!(
        (calls[0].input_tokens, calls[0].output_tokens),
        (input, output)
    );
}

#[tokio::test]
async fn anthropic_usage_is_bytes_over_four() {
    let server = Server::start().await;
    let response = server
        .anthropic(json!({
            "model": "claude-test",
            "system": "Be brief.",
            "max_tokens": 256,
            "messages": [
                { "role": "user", "content": "Tell me about jobledger please" },
                { "role": "assistant", "content": [{ "type": "text", "text": "Sure." }] },
                { "role": "user", "content": [{ "type": "text", "text": "Go on [mock:unknown=1]" }] },
            ],
        }))
        .await;
    assert_eq!(response.status(), StatusCode::OK);
    let request_id = header(&response, "request-id").unwrap().to_owned();
    let body: Value = response.json().await.unwrap();

    let input = ceil4(
        "Be brief.".len()
            + "Tell me about jobledger please".len()
            + "Sure.".len()
            + "Go on [mock:unknown=1]".len(),
    );
    // Unknown directives are ignored, but still stripped from the echo.
    let output = ceil4("Summary: Go on".len());
    assert_eq!(
        body,
        json!({
            "id": request_id,
            "type": "message",
            "role": "assistant",
            "model": "claude-test",
            "content": [{ "type": "text", "text": "Summary: Go on" }],
            "stop_reason": "end_turn",
            "stop_sequence": null,
            "usage": {
                "input_tokens": input,
                "output_tokens": output,
                "cache_read_input_tokens": 0,
                "cache_creation_input_tokens": 0,
            },
        })
    );
    assert!(request_id.starts_with("msg_"));
    let calls = server.sim.calls();
    assert_eq!(calls[0].request_id, request_id);
    assert_eq!(
        (calls[0].input_tokens, calls[0].output_tokens),
        (input, output)
    );
}

#[tokio::test]
async fn reply_is_capped_at_max_tokens_on_a_char_boundary() {
    let server = Server::start().await;
    // 3 tokens = 12 bytes: "Summary: " (9) + "é" (2) fits, a second "é" would not.
    let mut request = chat("éééééé");
    request["max_completion_tokens"] = json!(3);
    let body: Value = server.openai(request).await.json().await.unwrap();
    assert_eq!(body["choices"][0]["message"]["content"], "Summary: é");
    assert_eq!(body["choices"][0]["finish_reason"], "length");
    assert_eq!(body["usage"]["completion_tokens"], 3);

    let mut request = messages("anything at all");
    request["max_tokens"] = json!(1);
    let body: Value = server.anthropic(request).await.json().await.unwrap();
    assert_eq!(body["content"][0]["text"], "Summ");
    assert_eq!(body["stop_reason"], "max_tokens");
    assert_eq!(body["usage"]["output_tokens"], 1);
}
