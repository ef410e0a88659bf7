//! Faults on demand: statuses, failures per content, delays, hangs and dropped
//! connections.

use super::{Server, ceil4, chat, header, messages, wait_for_calls};
use std::time::{Duration, Instant};

use jobledger::llm::simulator::{CallRecord, Simulator};
use reqwest::StatusCode;
use serde_json::{Value, json};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

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
    assert_eq!(server.clear_calls().await, StatusCode::NO_CONTENT);
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
    let listed: Vec<CallRecord> = server.listed_calls().await;
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
