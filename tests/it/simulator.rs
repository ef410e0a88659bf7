//! End-to-end tests of the provider simulator over real HTTP.

use std::time::{Duration, Instant};

use jobledger::llm::simulator::{CallRecord, Simulator};
use reqwest::StatusCode;
use serde_json::{Value, json};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::oneshot;
use tokio::task::JoinHandle;

struct Server {
    base: String,
    addr: std::net::SocketAddr,
    sim: Simulator,
    stop: Option<oneshot::Sender<()>>,
    task: JoinHandle<std::io::Result<()>>,
}

impl Server {
    async fn start() -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let sim = Simulator::new();
        let (stop, stopped) = oneshot::channel::<()>();
        let task = tokio::spawn(sim.clone().serve(listener, async move {
            let _ = stopped.await;
        }));
        Self {
            base: format!("http://{addr}"),
            addr,
            sim,
            stop: Some(stop),
            task,
        }
    }

    fn url(&self, path: &str) -> String {
        format!("{}{path}", self.base)
    }

    async fn post(&self, path: &str, body: Value) -> reqwest::Response {
        reqwest::Client::new()
            .post(self.url(path))
            .json(&body)
            .send()
            .await
            .unwrap()
    }

    async fn openai(&self, body: Value) -> reqwest::Response {
        self.post("/v1/chat/completions", body).await
    }

    async fn anthropic(&self, body: Value) -> reqwest::Response {
        self.post("/v1/messages", body).await
    }

    async fn shutdown(mut self) -> std::io::Result<()> {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        tokio::time::timeout(Duration::from_secs(5), self.task)
            .await
            .expect("serve did not stop within 5 s")
            .unwrap()
    }
}

fn chat(content: &str) -> Value {
    json!({ "model": "gpt-test", "messages": [{ "role": "user", "content": content }] })
}

fn messages(content: &str) -> Value {
    json!({
        "model": "claude-test",
        "max_tokens": 1024,
        "messages": [{ "role": "user", "content": content }],
    })
}

fn ceil4(bytes: usize) -> u64 {
    bytes.div_ceil(4) as u64
}

/// Polls `check` against the call log until it holds (bounded: 5 s).
async fn wait_for_calls(sim: &Simulator, check: impl Fn(&[CallRecord]) -> bool) -> Vec<CallRecord> {
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        let calls = sim.calls();
        if check(&calls) {
            return calls;
        }
        assert!(
            Instant::now() < deadline,
            "call log never matched: {calls:?}"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// `(event name, data)` pairs of an SSE body.
fn parse_sse(body: &str) -> Vec<(Option<String>, String)> {
    body.split("\n\n")
        .filter(|block| !block.trim().is_empty())
        .map(|block| {
            let mut name = None;
            let mut data = Vec::new();
            for line in block.lines() {
                if let Some(value) = line.strip_prefix("event:") {
                    name = Some(value.trim().to_owned());
                } else if let Some(value) = line.strip_prefix("data:") {
                    data.push(value.strip_prefix(' ').unwrap_or(value));
                }
            }
            (name, data.join("\n"))
        })
        .collect()
}

fn header<'a>(response: &'a reqwest::Response, name: &str) -> Option<&'a str> {
    response
        .headers()
        .get(name)
        .and_then(|value| value.to_str().ok())
}

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
    let input = ceil4("You are terse.".len() + "Hello world".len());
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

#[tokio::test]
async fn status_and_retry_after() {
    let server = Server::start().await;
    let response = server
        .openai(chat("[mock:status=429][mock:retry_after=7] slow down"))
        .await;
    assert_eq!(response.status(), StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(header(&response, "retry-after"), Some("7"));
    let request_id = header(&response, "x-request-id").unwrap().to_owned();
    let body: Value = response.json().await.unwrap();
    assert_eq!(body["error"]["type"], "rate_limit_error");
    assert!(body["error"]["message"].is_string());

    let response = server.anthropic(messages("[mock:status=529] busy")).await;
    assert_eq!(response.status().as_u16(), 529);
    assert_eq!(header(&response, "retry-after"), None);
    assert!(header(&response, "request-id").is_some());
    let body: Value = response.json().await.unwrap();
    assert_eq!(body["type"], "error");
    assert_eq!(body["error"]["type"], "overloaded_error");
    assert!(body["error"]["message"].is_string());

    let calls = server.sim.calls();
    assert_eq!(calls[0].request_id, request_id);
    assert_eq!((calls[0].status, calls[0].billed), (429, false));
    assert_eq!(calls[0].output_tokens, 0);
    assert_eq!((calls[1].status, calls[1].billed), (529, false));
}

#[tokio::test]
async fn fail_first_counts_per_content() {
    let server = Server::start().await;
    let first = chat("[mock:fail_first=2] summarise report A");
    let other = chat("[mock:fail_first=2] summarise report B");
    assert_eq!(server.openai(first.clone()).await.status(), 500);
    assert_eq!(server.openai(first.clone()).await.status(), 500);
    assert_eq!(server.openai(other.clone()).await.status(), 500);
    let response = server.openai(first.clone()).await;
    assert_eq!(response.status(), 200);
    let body: Value = response.json().await.unwrap();
    assert_eq!(
        body["choices"][0]["message"]["content"],
        "Summary: summarise report A"
    );
    assert_eq!(server.openai(other.clone()).await.status(), 500);
    assert_eq!(server.openai(other).await.status(), 200);

    // With a status directive, that status is the failure.
    let custom = messages("[mock:fail_first=1][mock:status=503][mock:retry_after=2] x");
    let response = server.anthropic(custom.clone()).await;
    assert_eq!(response.status(), 503);
    assert_eq!(header(&response, "retry-after"), Some("2"));
    assert_eq!(server.anthropic(custom).await.status(), 200);

    let statuses: Vec<(u16, bool)> = server
        .sim
        .calls()
        .iter()
        .map(|call| (call.status, call.billed))
        .collect();
    assert_eq!(
        statuses,
        [
            (500, false),
            (500, false),
            (500, false),
            (200, true),
            (500, false),
            (200, true),
            (503, false),
            (200, true),
        ]
    );

    // Clearing the log resets the counters.
    let cleared = reqwest::Client::new()
        .delete(server.url("/_mock/calls"))
        .send()
        .await
        .unwrap();
    assert_eq!(cleared.status(), StatusCode::NO_CONTENT);
    assert_eq!(server.openai(first).await.status(), 500);
}

#[tokio::test]
async fn delay_ms_delays_plain_and_streamed_answers() {
    let server = Server::start().await;
    let started = Instant::now();
    let response = server.openai(chat("[mock:delay_ms=300] wait")).await;
    assert_eq!(response.status(), 200);
    assert!(started.elapsed() >= Duration::from_millis(300));

    let mut request = messages("[mock:delay_ms=250] wait");
    request["stream"] = json!(true);
    let started = Instant::now();
    let response = server.anthropic(request).await;
    assert!(started.elapsed() >= Duration::from_millis(250));
    assert!(response.text().await.unwrap().contains("message_stop"));
}

#[tokio::test]
async fn hang_is_logged_at_once_and_billed_when_the_client_gives_up() {
    let server = Server::start().await;
    let url = server.url("/v1/chat/completions");
    let client = tokio::spawn(async move {
        reqwest::Client::new()
            .post(url)
            .json(&chat("[mock:hang] are you there?"))
            .timeout(Duration::from_millis(800))
            .send()
            .await
    });

    let pending = wait_for_calls(&server.sim, |calls| calls.len() == 1).await;
    assert_eq!((pending[0].status, pending[0].billed), (0, false));
    let listed: Vec<CallRecord> = reqwest::get(server.url("/_mock/calls"))
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(listed, pending);

    let err = client.await.unwrap().unwrap_err();
    assert!(err.is_timeout(), "{err:?}");

    let calls = wait_for_calls(&server.sim, |calls| calls[0].billed).await;
    assert_eq!(calls[0].status, 0);
    assert_eq!(
        calls[0].input_tokens,
        ceil4("[mock:hang] are you there?".len())
    );
    assert_eq!(
        calls[0].output_tokens,
        ceil4("Summary: are you there?".len())
    );
}

#[tokio::test]
async fn shutdown_cuts_hung_connections() {
    let server = Server::start().await;
    let url = server.url("/v1/messages");
    let client = tokio::spawn(async move {
        reqwest::Client::new()
            .post(url)
            .json(&messages("[mock:hang] hold on"))
            .send()
            .await
    });
    wait_for_calls(&server.sim, |calls| calls.len() == 1).await;
    let sim = server.sim.clone();
    server.shutdown().await.unwrap();

    let err = client.await.unwrap().unwrap_err();
    assert!(err.status().is_none(), "{err:?}");
    let calls = wait_for_calls(&sim, |calls| calls[0].billed).await;
    assert_eq!(calls[0].status, 0);
}

#[tokio::test]
async fn drop_closes_the_connection_without_a_response() {
    let server = Server::start().await;
    let err = reqwest::Client::new()
        .post(server.url("/v1/chat/completions"))
        .json(&chat("[mock:drop] bye"))
        .timeout(Duration::from_secs(5))
        .send()
        .await
        .unwrap_err();
    assert!(err.status().is_none(), "{err:?}");
    assert!(!err.is_timeout(), "{err:?}");
    assert!(
        err.is_request() || err.is_connect() || err.is_body(),
        "{err:?}"
    );

    let calls = wait_for_calls(&server.sim, |calls| calls.len() == 1).await;
    assert_eq!((calls[0].status, calls[0].billed), (0, true));
    assert_eq!(calls[0].output_tokens, ceil4("Summary: bye".len()));

    // On the wire: the request is read, then the socket closes with zero bytes sent.
    let body = serde_json::to_string(&messages("[mock:drop] raw")).unwrap();
    let mut socket = TcpStream::connect(server.addr).await.unwrap();
    let request = format!(
        "POST /v1/messages HTTP/1.1\r\nhost: localhost\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\r\n{body}",
        body.len()
    );
    socket.write_all(request.as_bytes()).await.unwrap();
    let mut received = Vec::new();
    let read = tokio::time::timeout(Duration::from_secs(5), socket.read_to_end(&mut received))
        .await
        .expect("connection was not closed");
    // A reset is as good as a close; what matters is that nothing arrived.
    if let Err(err) = read {
        assert_eq!(err.kind(), std::io::ErrorKind::ConnectionReset);
    }
    assert!(
        received.is_empty(),
        "{:?}",
        String::from_utf8_lossy(&received)
    );
    let calls = wait_for_calls(&server.sim, |calls| calls.len() == 2).await;
    assert_eq!((calls[1].status, calls[1].billed), (0, true));
}

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

#[tokio::test]
async fn bad_requests_get_provider_shaped_400s() {
    let server = Server::start().await;
    let client = reqwest::Client::new();
    let response = client
        .post(server.url("/v1/chat/completions"))
        .header("content-type", "application/json")
        .body("{not json")
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), StatusCode::BAD_REQUEST);
    assert!(header(&response, "x-request-id").is_some());
    let body: Value = response.json().await.unwrap();
    assert_eq!(body["error"]["type"], "invalid_request_error");
    assert!(body["error"]["message"].is_string());

    // Valid JSON, but Anthropic requires max_tokens.
    let response = server
        .anthropic(json!({ "model": "claude-test", "messages": [] }))
        .await;
    assert_eq!(response.status(), StatusCode::BAD_REQUEST);
    let body: Value = response.json().await.unwrap();
    assert_eq!(body["type"], "error");
    assert_eq!(body["error"]["type"], "invalid_request_error");

    let calls = server.sim.calls();
    assert_eq!(calls.len(), 2);
    assert_eq!((calls[0].model.as_str(), calls[0].status), ("", 400));
    assert_eq!(
        (calls[1].model.as_str(), calls[1].status),
        ("claude-test", 400)
    );
    assert!(calls.iter().all(|call| !call.billed));
}

#[tokio::test]
async fn calls_endpoint_lists_in_order_and_delete_clears() {
    let server = Server::start().await;
    let first = server.openai(chat("one")).await;
    let first_id = header(&first, "x-request-id").unwrap().to_owned();
    let second = server.anthropic(messages("[mock:status=401] two")).await;
    let second_id = header(&second, "request-id").unwrap().to_owned();
    assert_ne!(first_id, second_id);

    let response = reqwest::get(server.url("/_mock/calls")).await.unwrap();
    assert_eq!(response.status(), StatusCode::OK);
    let raw: Value = response.json().await.unwrap();
    let fields: Vec<&String> = raw[0].as_object().unwrap().keys().collect();
    assert_eq!(
        fields,
        [
            "billed",
            "input_tokens",
            "model",
            "output_tokens",
            "received_at",
            "request_id",
            "status"
        ]
    );
    let listed: Vec<CallRecord> = serde_json::from_value(raw).unwrap();
    assert_eq!(listed, server.sim.calls());
    assert_eq!(listed.len(), 2);
    assert_eq!(listed[0].request_id, first_id);
    assert_eq!(listed[1].request_id, second_id);
    assert_eq!(
        (listed[1].model.as_str(), listed[1].status),
        ("claude-test", 401)
    );
    assert!(listed[0].received_at <= listed[1].received_at);

    let cleared = reqwest::Client::new()
        .delete(server.url("/_mock/calls"))
        .send()
        .await
        .unwrap();
    assert_eq!(cleared.status(), StatusCode::NO_CONTENT);
    let listed: Vec<CallRecord> = reqwest::get(server.url("/_mock/calls"))
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert!(listed.is_empty());
    assert!(server.sim.calls().is_empty());
}

#[tokio::test]
async fn a_router_mounted_elsewhere_still_serves_but_cannot_drop() {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let sim = Simulator::new();
    let app = sim.router();
    let server = tokio::spawn(async move { axum::serve(listener, app).await });
    let url = format!("http://{addr}/v1/chat/completions");
    let post = |content: &'static str| {
        let url = url.clone();
        async move {
            reqwest::Client::new()
                .post(url)
                .json(&chat(content))
                .send()
                .await
                .unwrap()
        }
    };
    assert_eq!(post("hello").await.status(), 200);
    let response = post("[mock:drop] bye").await;
    assert_eq!(response.status(), 500);
    let body: Value = response.json().await.unwrap();
    assert!(
        body["error"]["message"]
            .as_str()
            .unwrap()
            .contains("Simulator::serve")
    );
    assert_eq!(sim.calls().len(), 2);
    server.abort();
}
