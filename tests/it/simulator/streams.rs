//! Streamed answers in each provider's event format.

use super::{Server, ceil4, chat, header, messages, parse_sse};
use reqwest::StatusCode;
use serde_json::{Value, json};

#[tokio::test]
async fn openai_stream_deltas_and_usage_chunk() {
    let server = Server::start().await;
    let mut request = chat("Stream me a fairly long sentence, please");
    request["stream"] = json!(true);
    request["stream_options"] = json!({ "include_usage": true });
    let response = server.openai(request).await;
    assert_eq!(response.status(), StatusCode::OK);
    assert!(
        header(&response, "content-type")
            .unwrap()
            .starts_with("text/event-stream")
    );
    let request_id = header(&response, "x-request-id").unwrap().to_owned();
    let events = parse_sse(&response.text().await.unwrap());

    assert_eq!(events.last().unwrap().1, "[DONE]");
    let chunks: Vec<Value> = events[..events.len() - 1]
        .iter()
        .map(|(_, data)| serde_json::from_str(data).unwrap())
        .collect();
    for chunk in &chunks {
        assert_eq!(chunk["id"], request_id);
        assert_eq!(chunk["object"], "chat.completion.chunk");
    }
    assert_eq!(chunks[0]["choices"][0]["delta"]["role"], "assistant");
    let content_deltas: Vec<&str> = chunks
        .iter()
        .filter_map(|chunk| chunk["choices"][0]["delta"]["content"].as_str())
        .filter(|piece| !piece.is_empty())
        .collect();
    let reply = "Summary: Stream me a fairly long sentence, please";
    assert!(content_deltas.len() > 1, "{content_deltas:?}");
    assert_eq!(content_deltas.concat(), reply);

    let (usage_chunk, others) = chunks.split_last().unwrap();
    assert_eq!(usage_chunk["choices"], json!([]));
    let input = ceil4("Stream me a fairly long sentence, please".len());
    let output = ceil4(reply.len());
    assert_eq!(usage_chunk["usage"]["prompt_tokens"], input);
    assert_eq!(usage_chunk["usage"]["completion_tokens"], output);
    assert_eq!(usage_chunk["usage"]["total_tokens"], input + output);
    assert!(others.iter().all(|chunk| chunk["usage"].is_null()));
    assert_eq!(
        others.last().unwrap()["choices"][0]["finish_reason"],
        "stop"
    );

    let calls = server.sim.calls();
    assert_eq!((calls[0].status, calls[0].billed), (200, true));
    assert_eq!(calls[0].output_tokens, output);
}

#[tokio::test]
async fn openai_stream_without_usage_has_no_usage_chunk() {
    let server = Server::start().await;
    let mut request = chat("hi");
    request["stream"] = json!(true);
    let text = server.openai(request).await.text().await.unwrap();
    let events = parse_sse(&text);
    assert_eq!(events.last().unwrap().1, "[DONE]");
    for (_, data) in &events[..events.len() - 1] {
        let chunk: Value = serde_json::from_str(data).unwrap();
        assert!(chunk.get("usage").is_none());
        assert_eq!(chunk["choices"].as_array().unwrap().len(), 1);
    }
}

#[tokio::test]
async fn anthropic_stream_events() {
    let server = Server::start().await;
    let mut request = messages("Stream me a fairly long sentence, please");
    request["stream"] = json!(true);
    let response = server.anthropic(request).await;
    assert_eq!(response.status(), StatusCode::OK);
    let request_id = header(&response, "request-id").unwrap().to_owned();
    let events = parse_sse(&response.text().await.unwrap());

    let names: Vec<&str> = events
        .iter()
        .map(|(name, _)| name.as_deref().unwrap())
        .collect();
    let deltas = names
        .iter()
        .filter(|name| **name == "content_block_delta")
        .count();
    assert!(deltas > 1);
    let mut expected = vec!["message_start", "content_block_start"];
    expected.extend(std::iter::repeat_n("content_block_delta", deltas));
    expected.extend(["content_block_stop", "message_delta", "message_stop"]);
    assert_eq!(names, expected);

    let data: Vec<Value> = events
        .iter()
        .map(|(_, data)| serde_json::from_str(data).unwrap())
        .collect();
    for (name, value) in names.iter().zip(&data) {
        assert_eq!(value["type"], *name);
    }
    let reply = "Summary: Stream me a fairly long sentence, please";
    let text: String = data
        .iter()
        .filter_map(|event| event["delta"]["text"].as_str())
        .collect();
    assert_eq!(text, reply);
    assert_eq!(data[0]["message"]["id"], request_id);
    assert_eq!(
        data[0]["message"]["usage"]["input_tokens"],
        ceil4("Stream me a fairly long sentence, please".len())
    );
    let message_delta = &data[data.len() - 2];
    assert_eq!(message_delta["usage"]["output_tokens"], ceil4(reply.len()));
    assert_eq!(message_delta["delta"]["stop_reason"], "end_turn");
}
