//! A gateway between the service and the simulator that loses, refuses or rewrites
//! what the provider says. An upload whose create answer is ambiguous — lost, or a 429
//! a gateway sent after forwarding it — is searched for only once the create grace has
//! passed since its last send: a create the provider is still making is then listed,
//! and found, instead of being made a second time. Creates refused before reaching
//! the provider do not make the items' fates unknown. Results cut short, and batches
//! the provider failed, send no item out again for free.

use crate::batches::{add_items, wait_until_finished};
use crate::helpers::{Backend, RunningSimulator, spawn_app_beside};
use crate::provider_batches::{
    Shape, assert_settled_once, close, config, create_provider_batch, items, mock_batches, options,
    rows_of,
};
use jobledger::llm::simulator::Simulator;
use serde_json::Value;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

on_both_backends!(
    a_create_made_late_after_a_lost_answer_is_found_not_made_twice,
    a_create_forwarded_before_a_429_is_found_not_made_twice,
    an_openai_create_made_late_after_a_lost_answer_is_found_not_made_twice,
    an_openai_create_forwarded_before_a_429_is_found_not_made_twice,
    creates_refused_unsent_do_not_make_the_items_unknown,
    openai_creates_refused_unsent_do_not_make_the_items_unknown,
    requests_missing_from_the_results_are_not_sent_again,
    a_failed_batch_spends_an_attempt,
);

/// What the gateway does with the first create(s) it is sent.
#[derive(Clone, Copy, PartialEq)]
enum Gateway {
    /// Drops the connection at once, and forwards the create to the provider a while
    /// later: the provider makes the batch after our answer was lost.
    LosesTheAnswer,
    /// Forwards the create, and answers 429 in place of the provider's answer.
    AnswersTooManyRequests,
    /// Answers the first [`REFUSALS`] creates 503 without forwarding them: each is
    /// ambiguous to us, and each search after it finds nothing.
    RefusesUnsent,
    /// Passes on only the first half of the lines of every results file (OpenAI):
    /// well formed, and short.
    CutsResults,
    /// Reports every batch read (OpenAI) as `failed`, with no results, as OpenAI
    /// does when the account's enqueued-token limit is reached.
    FailsBatches,
}

/// Creates [`Gateway::RefusesUnsent`] refuses: spread over longer than
/// [`UNKNOWN_AFTER`] by the backoff between them.
const REFUSALS: usize = 3;
/// The unknown-fate bound of the refused-creates test: shorter than the refusals
/// last, longer than a search's round.
const UNKNOWN_AFTER: Duration = Duration::from_secs(3);

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
    let creates = Arc::new(AtomicUsize::new(0));
    tokio::spawn(async move {
        loop {
            let Ok((mut stream, _)) = listener.accept().await else {
                return;
            };
            let simulator = simulator.clone();
            let creates = creates.clone();
            tokio::spawn(async move {
                let Some((head, body)) = read_request(&mut stream).await else {
                    return;
                };
                let create = head.starts_with(create_line);
                let seen = if create {
                    creates.fetch_add(1, Ordering::SeqCst)
                } else {
                    usize::MAX
                };
                if gateway == Gateway::RefusesUnsent && seen < REFUSALS {
                    let refusal =
                        br#"{"type":"error","error":{"type":"api_error","message":"unavailable"}}"#;
                    answer(&mut stream, 503, refusal).await;
                    return;
                }
                if gateway == Gateway::CutsResults
                    && head.starts_with("GET /v1/files/")
                    && head.contains("/content ")
                {
                    let (status, answered) = forward(&simulator, &head, body).await;
                    let lines: Vec<&[u8]> = answered
                        .split(|byte| *byte == b'\n')
                        .filter(|line| !line.is_empty())
                        .collect();
                    let kept = lines[..lines.len() / 2].join(&b'\n');
                    answer(&mut stream, status, &kept).await;
                    return;
                }
                if gateway == Gateway::FailsBatches && head.starts_with("GET /v1/batches/batch_") {
                    let (status, answered) = forward(&simulator, &head, body).await;
                    let mut object: Value = serde_json::from_slice(&answered).unwrap();
                    object["status"] = "failed".into();
                    object["output_file_id"] = Value::Null;
                    object["error_file_id"] = Value::Null;
                    object["errors"] = serde_json::json!({"data": [{
                        "code": "token_limit_exceeded",
                        "message": "Enqueued token limit reached.",
                    }]});
                    answer(&mut stream, status, &serde_json::to_vec(&object).unwrap()).await;
                    return;
                }
                if seen == 0 {
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
                        Gateway::RefusesUnsent | Gateway::CutsResults | Gateway::FailsBatches => {
                            forward_and_answer(&simulator, &head, body, &mut stream).await;
                        }
                    }
                    return;
                }
                forward_and_answer(&simulator, &head, body, &mut stream).await;
            });
        }
    });
    address
}

async fn forward_and_answer(simulator: &str, head: &str, body: Vec<u8>, stream: &mut TcpStream) {
    let (status, answered) = forward(simulator, head, body).await;
    answer(stream, status, &answered).await;
}

/// The service with both shapes' providers behind a gateway doing `gateway`, and a
/// closed provider batch of ten items on `shape`'s model.
async fn closed_batch_through(
    backend: Backend,
    shape: Shape,
    gateway: Gateway,
) -> (
    crate::helpers::TestApp,
    crate::helpers::TestTenant,
    uuid::Uuid,
    tempfile::TempDir,
) {
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
    let options = if gateway == Gateway::RefusesUnsent {
        // Every search finds nothing: the provider was read each time, so the
        // refusals are no silence of the provider's.
        options(&path, UNKNOWN_AFTER, Duration::from_secs(1))
    } else {
        let mut options = options(&path, Duration::from_secs(3600), Duration::from_secs(1));
        // Past the late create, which a search a second after the lost answer misses.
        options.operations.provider_batches.create_grace = LATE * 2;
        options
    };
    let app = spawn_app_beside(backend, simulator, options).await;
    let tenant = app.funded_tenant("acme", "100").await;
    let id = create_provider_batch(&app, &tenant, shape).await;
    assert!(add_items(&app, &tenant, id, &items(10, false)).await["errors"].is_null());
    close(&app, &tenant, id).await;
    (app, tenant, id, folder)
}

async fn an_ambiguous_create_is_not_made_twice(backend: Backend, shape: Shape, gateway: Gateway) {
    let (app, tenant, id, _folder) = closed_batch_through(backend, shape, gateway).await;
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

/// Results cut short: the requests they do not mention may have run and been billed,
/// so they end with an unknown outcome and are never sent again.
async fn requests_missing_from_the_results_are_not_sent_again(backend: Backend) {
    let shape = Shape::OpenAi;
    let (app, tenant, id, _folder) =
        closed_batch_through(backend, shape, Gateway::CutsResults).await;
    let finished = wait_until_finished(&app, &tenant, id, Duration::from_secs(60)).await;
    assert_eq!(finished["counts"]["succeeded"], 5, "{finished}");
    assert_eq!(finished["counts"]["failed"], 5, "{finished}");
    let made: Vec<Value> = mock_batches(&app).await;
    assert_eq!(made.len(), 1, "nothing sent again: {made:?}");
    let items = crate::provider_batches::items_of(&app, id).await;
    let ids: Vec<uuid::Uuid> = items.iter().map(|item| item.id).collect();
    let attempts = crate::provider_batches::attempts_of(&app, &ids).await;
    assert_eq!(attempts.len(), 10, "one attempt an item: {attempts:?}");
    let unknown = attempts
        .iter()
        .filter(|attempt| attempt.outcome == entity::AttemptOutcome::Unknown)
        .count();
    assert_eq!(unknown, 5, "{attempts:?}");
    let billed = app
        .simulator
        .calls()
        .into_iter()
        .filter(|call| call.billed && call.batch_id.is_some())
        .count();
    assert_eq!(billed, 10, "each request billed once");
    crate::invariants::assert_billing_invariants(&app.app.db).await;
}

/// A batch the provider reports `failed` spends an attempt of each item: the items
/// fail by their `maxAttempts` rather than go out in batch after batch.
async fn a_failed_batch_spends_an_attempt(backend: Backend) {
    let shape = Shape::OpenAi;
    let (app, tenant, id, _folder) =
        closed_batch_through(backend, shape, Gateway::FailsBatches).await;
    let finished = wait_until_finished(&app, &tenant, id, Duration::from_secs(90)).await;
    assert_eq!(finished["counts"]["failed"], 10, "{finished}");
    let items = crate::provider_batches::items_of(&app, id).await;
    for item in &items {
        let attempts = crate::provider_batches::attempts_of(&app, &[item.id]).await;
        assert_eq!(
            attempts.len(),
            item.max_attempts as usize,
            "each try of {} spent an attempt: {attempts:?}",
            item.id
        );
    }
    crate::invariants::assert_billing_invariants(&app.app.db).await;
}

async fn creates_refused_unsent_do_not_make_the_items_unknown(backend: Backend) {
    an_ambiguous_create_is_not_made_twice(backend, Shape::Anthropic, Gateway::RefusesUnsent).await;
}

async fn openai_creates_refused_unsent_do_not_make_the_items_unknown(backend: Backend) {
    an_ambiguous_create_is_not_made_twice(backend, Shape::OpenAi, Gateway::RefusesUnsent).await;
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
