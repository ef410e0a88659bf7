//! An upload whose create answer is ambiguous — lost, or a 429 a gateway sent after
//! forwarding it — is searched for only once the create grace has passed since its
//! last send: a create the provider is still making is then listed, and found, instead
//! of being made a second time.

use crate::batches::{add_items, wait_until_finished};
use crate::helpers::{Backend, RunningSimulator, spawn_app_beside};
use crate::provider_batches::{
    Shape, assert_settled_once, close, config, create_provider_batch, items, mock_batches, options,
    rows_of,
};
use jobledger::llm::simulator::Simulator;
use serde_json::Value;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

on_both_backends!(
    a_create_made_late_after_a_lost_answer_is_found_not_made_twice,
    a_create_forwarded_before_a_429_is_found_not_made_twice,
    an_openai_create_made_late_after_a_lost_answer_is_found_not_made_twice,
    an_openai_create_forwarded_before_a_429_is_found_not_made_twice,
);

/// What the gateway does with the first create it is sent.
#[derive(Clone, Copy)]
enum Gateway {
    /// Drops the connection at once, and forwards the create to the provider a while
    /// later: the provider makes the batch after our answer was lost.
    LosesTheAnswer,
    /// Forwards the create, and answers 429 in place of the provider's answer.
    AnswersTooManyRequests,
}

/// How long the provider takes to make the batch after the answer was lost.
const LATE: Duration = Duration::from_secs(3);

/// One HTTP/1.1 request read off `stream`: its head and body.
async fn read_request(stream: &mut TcpStream) -> Option<(String, Vec<u8>)> {
    let mut buffer = Vec::new();
    let mut chunk = [0u8; 8192];
    let head_end = loop {
        if let Some(at) = buffer.windows(4).position(|w| w == b"\r\n\r\n") {
            break at + 4;
        }
        let read = stream.read(&mut chunk).await.ok()?;
        if read == 0 {
            return None;
        }
        buffer.extend_from_slice(&chunk[..read]);
    };
    let head = String::from_utf8_lossy(&buffer[..head_end]).into_owned();
    let length = head
        .lines()
        .find_map(|line| {
            let (name, value) = line.split_once(':')?;
            name.eq_ignore_ascii_case("content-length")
                .then(|| value.trim().parse::<usize>().ok())?
        })
        .unwrap_or(0);
    while buffer.len() < head_end + length {
        let read = stream.read(&mut chunk).await.ok()?;
        if read == 0 {
            return None;
        }
        buffer.extend_from_slice(&chunk[..read]);
    }
    Some((head, buffer[head_end..head_end + length].to_vec()))
}

/// Sends the request to the simulator, with its content type (OpenAI's file upload
/// is multipart); its status and body.
async fn forward(simulator: &str, head: &str, body: Vec<u8>) -> (u16, Vec<u8>) {
    let line = head.lines().next().unwrap_or_default();
    let mut parts = line.split(' ');
    let method = parts.next().unwrap_or("GET");
    let path = parts.next().unwrap_or("/");
    let content_type = head
        .lines()
        .find_map(|line| {
            let (name, value) = line.split_once(':')?;
            name.eq_ignore_ascii_case("content-type")
                .then(|| value.trim().to_owned())
        })
        .unwrap_or_else(|| "application/json".to_owned());
    let client = reqwest::Client::new();
    let request = client
        .request(method.parse().unwrap(), format!("http://{simulator}{path}"))
        .header("content-type", content_type)
        .body(body);
    let response = request.send().await.unwrap();
    let status = response.status().as_u16();
    (status, response.bytes().await.unwrap().to_vec())
}

async fn answer(stream: &mut TcpStream, status: u16, body: &[u8]) {
    let head = format!(
        "HTTP/1.1 {status} X\r\ncontent-type: application/json\r\ncontent-length: {}\r\nconnection: close\r\n\r\n",
        body.len()
    );
    let _ = stream.write_all(head.as_bytes()).await;
    let _ = stream.write_all(body).await;
    let _ = stream.shutdown().await;
}

/// A gateway in front of the simulator: every request is forwarded, one per
/// connection; the first batch create of `shape` as `gateway` says. Its address.
async fn start_gateway(simulator: String, shape: Shape, gateway: Gateway) -> String {
    let create_line = match shape {
        Shape::OpenAi => "POST /v1/batches ",
        Shape::Anthropic => "POST /v1/messages/batches ",
    };
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let address = listener.local_addr().unwrap().to_string();
    let first = Arc::new(AtomicBool::new(true));
    tokio::spawn(async move {
        loop {
            let Ok((mut stream, _)) = listener.accept().await else {
                return;
            };
            let simulator = simulator.clone();
            let first = first.clone();
            tokio::spawn(async move {
                let Some((head, body)) = read_request(&mut stream).await else {
                    return;
                };
                let create = head.starts_with(create_line);
                if create && first.swap(false, Ordering::SeqCst) {
                    match gateway {
                        Gateway::LosesTheAnswer => {
                            drop(stream);
                            tokio::time::sleep(LATE).await;
                            forward(&simulator, &head, body).await;
                        }
                        Gateway::AnswersTooManyRequests => {
                            forward(&simulator, &head, body).await;
                            let refusal = br#"{"type":"error","error":{"type":"rate_limit_error","message":"slow down"}}"#;
                            answer(&mut stream, 429, refusal).await;
                        }
                    }
                    return;
                }
                let (status, answered) = forward(&simulator, &head, body).await;
                answer(&mut stream, status, &answered).await;
            });
        }
    });
    address
}

async fn an_ambiguous_create_is_not_made_twice(backend: Backend, shape: Shape, gateway: Gateway) {
    let simulator =
        RunningSimulator::start_with(Simulator::new().with_batch_delay(Duration::from_secs(1)))
            .await;
    let folder = tempfile::tempdir().unwrap();
    let direct = config(folder.path(), &simulator);
    let simulator_address = simulator.address.to_string();
    let through = start_gateway(simulator_address.clone(), shape, gateway).await;
    let path = direct.with_file_name("gateway.toml");
    let text = std::fs::read_to_string(&direct).unwrap();
    // Both shapes through the gateway: the OpenAI provider as an OpenAI-compatible
    // endpoint at the gateway rather than the simulator in the process.
    let text = text.replace(&simulator_address, &through).replace(
        r#"kind = "simulator""#,
        &format!("kind = \"openai\"\n        base_url = \"http://{through}/v1\""),
    );
    std::fs::write(&path, text).unwrap();
    let mut options = options(&path, Duration::from_secs(3600), Duration::from_secs(1));
    // Past the late create, which a search a second after the lost answer misses.
    options.operations.provider_batches.create_grace = LATE * 2;
    let app = spawn_app_beside(backend, simulator, options).await;
    let tenant = app.funded_tenant("acme", "100").await;
    let id = create_provider_batch(&app, &tenant, shape).await;
    assert!(add_items(&app, &tenant, id, &items(10, false)).await["errors"].is_null());
    close(&app, &tenant, id).await;
    let finished = wait_until_finished(&app, &tenant, id, Duration::from_secs(60)).await;
    assert_eq!(finished["counts"]["succeeded"], 10, "{finished}");
    let made: Vec<Value> = mock_batches(&app).await;
    assert_eq!(made.len(), 1, "one provider batch for the items: {made:?}");
    let rows = rows_of(&app, id).await;
    assert_eq!(rows.len(), 1);
    assert_eq!(rows[0].provider_batch_id.as_deref(), made[0]["id"].as_str());
    let attempts = assert_settled_once(&app, id, shape).await;
    assert_eq!(attempts.len(), 10, "each item billed once");
    crate::invariants::assert_billing_invariants(&app.app.db).await;
}

async fn a_create_made_late_after_a_lost_answer_is_found_not_made_twice(backend: Backend) {
    an_ambiguous_create_is_not_made_twice(backend, Shape::Anthropic, Gateway::LosesTheAnswer).await;
}

async fn an_openai_create_made_late_after_a_lost_answer_is_found_not_made_twice(backend: Backend) {
    an_ambiguous_create_is_not_made_twice(backend, Shape::OpenAi, Gateway::LosesTheAnswer).await;
}

async fn an_openai_create_forwarded_before_a_429_is_found_not_made_twice(backend: Backend) {
    an_ambiguous_create_is_not_made_twice(backend, Shape::OpenAi, Gateway::AnswersTooManyRequests)
        .await;
}

async fn a_create_forwarded_before_a_429_is_found_not_made_twice(backend: Backend) {
    an_ambiguous_create_is_not_made_twice(
        backend,
        Shape::Anthropic,
        Gateway::AnswersTooManyRequests,
    )
    .await;
}
