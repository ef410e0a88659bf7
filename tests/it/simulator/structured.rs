//! Replies for structured output: JSON on demand or by default, and broken JSON.

use super::{Server, ceil4, chat, messages};
use serde_json::{Value, json};

#[tokio::test]
async fn reply_directive_may_carry_json() {
    let server = Server::start().await;
    let response = server
        .openai(chat(
            r#"Extract. [mock:reply={"a":1,"b":[1,{"c":"x]y"}]}] thanks"#,
        ))
        .await;
    let body: Value = response.json().await.unwrap();
    let content = body["choices"][0]["message"]["content"].as_str().unwrap();
    let parsed: Value = serde_json::from_str(content).unwrap();
    assert_eq!(parsed, json!({ "a": 1, "b": [1, { "c": "x]y" }] }));
    assert_eq!(body["usage"]["completion_tokens"], ceil4(content.len()));

    let body: Value = server
        .anthropic(messages("[mock:reply=plain words]"))
        .await
        .json()
        .await
        .unwrap();
    assert_eq!(body["content"][0]["text"], "plain words");
}

#[tokio::test]
async fn invalid_json_directive_breaks_structured_output() {
    let server = Server::start().await;
    let mut request = chat("[mock:invalid_json] give me JSON");
    request["response_format"] = json!({ "type": "json_object" });
    let body: Value = server.openai(request).await.json().await.unwrap();
    let content = body["choices"][0]["message"]["content"].as_str().unwrap();
    assert!(serde_json::from_str::<Value>(content).is_err(), "{content}");
}

#[tokio::test]
async fn json_response_formats_get_json_by_default() {
    let server = Server::start().await;
    let mut request = chat("give me JSON");
    request["response_format"] = json!({ "type": "json_object" });
    let body: Value = server.openai(request).await.json().await.unwrap();
    let content = body["choices"][0]["message"]["content"].as_str().unwrap();
    assert_eq!(
        serde_json::from_str::<Value>(content).unwrap(),
        json!({ "summary": "give me JSON" })
    );

    let mut request = chat("classify this");
    request["response_format"] = json!({
        "type": "json_schema",
        "json_schema": {
            "name": "verdict",
            "strict": true,
            "schema": {
                "type": "object",
                "properties": {
                    "label": { "type": "string", "enum": ["spam", "ham"] },
                    "score": { "type": "number" },
                    "reason": { "type": "string" },
                },
                "required": ["label", "score", "reason"],
            },
        },
    });
    let body: Value = server.openai(request).await.json().await.unwrap();
    let content = body["choices"][0]["message"]["content"].as_str().unwrap();
    assert_eq!(
        serde_json::from_str::<Value>(content).unwrap(),
        json!({ "label": "spam", "score": 0, "reason": "classify this" })
    );
}
