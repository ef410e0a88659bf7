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
    anthropic_requests_missing_from_the_results_are_not_sent_again,
    a_failed_batch_spends_an_attempt,
    a_provider_that_never_answers_holds_up_only_its_own_batch,
    uploads_refused_as_too_large_go_out_smaller,
    openai_uploads_refused_as_too_large_go_out_smaller,
    an_openai_upload_searched_for_holds_up_no_other,
    a_slow_provider_holds_up_no_other_row,
    a_provider_stalled_on_more_rows_than_its_slots_holds_up_no_other,
    a_slow_first_upload_keeps_its_lease,
    a_cancel_during_the_upload_reaches_the_provider_when_it_is_answered,
    a_provider_refusing_to_cancel_is_not_silent,
    a_create_landing_after_its_time_bound_is_found_not_made_twice,
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
    /// Passes on only the first half of the lines of every results file (both
    /// shapes: OpenAI's output file, Anthropic's results, which the service reads at
    /// the gateway although the simulator's `results_url` names the simulator):
    /// well formed, and short.
    CutsResults,
    /// Reports every batch read (OpenAI) as `failed`, with no results, as OpenAI
    /// does when the account's enqueued-token limit is reached.
    FailsBatches,
    /// Holds every read of an OpenAI batch open and never answers it: a provider, or
    /// a connection, that takes a request and goes silent.
    StallsReads,
    /// Answers 413 to every request whose body is over [`BODY_LIMIT`] bytes, without
    /// forwarding it, as a proxy's body limit does.
    LimitsBodies,
    /// Drops the first create's connection without forwarding it, and answers every
    /// list of OpenAI's batches 500: the upload's answer is lost, and its search keeps
    /// failing.
    LosesTheAnswerAndLists,
    /// Holds the first create for as long as it says before forwarding it and
    /// answering.
    HoldsTheFirstCreate(Duration),
    /// Answers every cancel 500 without forwarding it; everything else passes.
    RefusesCancels,
}

/// The body limit of [`Gateway::LimitsBodies`]: a few requests of the test's items.
const BODY_LIMIT: usize = 900;

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
                if gateway == Gateway::LimitsBodies && body.len() > BODY_LIMIT {
                    let refusal = br#"{"error":{"type":"invalid_request_error","message":"request entity too large"}}"#;
                    answer(&mut stream, 413, refusal).await;
                    return;
                }
                if gateway == Gateway::RefusesCancels && head.contains("/cancel ") {
                    let refusal = br#"{"error":{"type":"server_error","message":"try later"}}"#;
                    answer(&mut stream, 500, refusal).await;
                    return;
                }
                if gateway == Gateway::LosesTheAnswerAndLists
                    && head.starts_with("GET /v1/batches?")
                {
                    let failure = br#"{"error":{"type":"server_error","message":"unavailable"}}"#;
                    answer(&mut stream, 500, failure).await;
                    return;
                }
                if gateway == Gateway::StallsReads && head.starts_with("GET /v1/batches/batch_") {
                    tokio::time::sleep(Duration::from_secs(3600)).await;
                    return;
                }
                let results = (head.starts_with("GET /v1/files/") && head.contains("/content "))
                    || (head.starts_with("GET /v1/messages/batches/")
                        && head.contains("/results "));
                if gateway == Gateway::CutsResults && results {
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
                        Gateway::LosesTheAnswerAndLists => drop(stream),
                        Gateway::HoldsTheFirstCreate(held) => {
                            tokio::time::sleep(held).await;
                            forward_and_answer(&simulator, &head, body, &mut stream).await;
                        }
                        Gateway::AnswersTooManyRequests => {
                            forward(&simulator, &head, body).await;
                            let refusal = br#"{"type":"error","error":{"type":"rate_limit_error","message":"slow down"}}"#;
                            answer(&mut stream, 429, refusal).await;
                        }
                        Gateway::RefusesUnsent
                        | Gateway::RefusesCancels
                        | Gateway::CutsResults
                        | Gateway::FailsBatches
                        | Gateway::StallsReads
                        | Gateway::LimitsBodies => {
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

/// The service with both shapes' providers behind a gateway doing `gateway` (to the
/// creates of `shape`), its options as `configure` leaves them, and a funded tenant.
async fn through_gateway(
    backend: Backend,
    shape: Shape,
    gateway: Gateway,
    configure: impl FnOnce(&mut crate::helpers::AppOptions),
) -> (
    crate::helpers::TestApp,
    crate::helpers::TestTenant,
    tempfile::TempDir,
) {
    through_gateway_taking(backend, shape, gateway, Duration::from_secs(1), configure).await
}

/// [`through_gateway`] with a provider that takes `batch_delay` to run a batch.
async fn through_gateway_taking(
    backend: Backend,
    shape: Shape,
    gateway: Gateway,
    batch_delay: Duration,
    configure: impl FnOnce(&mut crate::helpers::AppOptions),
) -> (
    crate::helpers::TestApp,
    crate::helpers::TestTenant,
    tempfile::TempDir,
) {
    let simulator =
        RunningSimulator::start_with(Simulator::new().with_batch_delay(batch_delay)).await;
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
    let mut options = if gateway == Gateway::RefusesUnsent {
        // Every search finds nothing: the provider was read each time, so the
        // refusals are no silence of the provider's.
        options(&path, UNKNOWN_AFTER, Duration::from_secs(1))
    } else {
        let mut options = options(&path, Duration::from_secs(3600), Duration::from_secs(1));
        // Past the late create, which a search a second after the lost answer misses.
        options.operations.provider_batches.create_grace = LATE * 2;
        options
    };
    configure(&mut options);
    let app = spawn_app_beside(backend, simulator, options).await;
    let tenant = app.funded_tenant("acme", "100").await;
    (app, tenant, folder)
}

/// A closed provider batch of `items` on `shape`'s model; its id.
async fn closed_batch(
    app: &crate::helpers::TestApp,
    tenant: &crate::helpers::TestTenant,
    shape: Shape,
    items: &[Value],
) -> uuid::Uuid {
    let id = create_provider_batch(app, tenant, shape).await;
    let added = add_items(app, tenant, id, items).await;
    assert!(added["errors"].is_null(), "{added}");
    close(app, tenant, id).await;
    id
}

/// [`through_gateway`] with a closed provider batch of ten items on `shape`'s model.
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
    let (app, tenant, folder) = through_gateway(backend, shape, gateway, |_| {}).await;
    let id = closed_batch(&app, &tenant, shape, &items(10, false)).await;
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
    missing_results_are_not_sent_again(backend, Shape::OpenAi).await;
}

/// As for OpenAI. The simulator's `results_url` names the simulator, not the gateway
/// the service was configured with: the results are read at the configured base all
/// the same (the API key goes nowhere else), so the gateway cuts them.
async fn anthropic_requests_missing_from_the_results_are_not_sent_again(backend: Backend) {
    missing_results_are_not_sent_again(backend, Shape::Anthropic).await;
}

async fn missing_results_are_not_sent_again(backend: Backend, shape: Shape) {
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

/// A provider that takes a read and never answers it holds up neither the other
/// provider batches of the process nor its own fate: each read is given up after the
/// call timeout, the other shape's batch runs meanwhile, and the silent one ends
/// unknown once the provider has been silent past the bound.
async fn a_provider_that_never_answers_holds_up_only_its_own_batch(backend: Backend) {
    let unknown_after = Duration::from_secs(8);
    let (app, tenant, _folder) =
        through_gateway(backend, Shape::OpenAi, Gateway::StallsReads, |options| {
            options.operations.provider_batches.call_timeout = Duration::from_secs(2);
            options.operations.provider_batches.unknown_after = unknown_after;
        })
        .await;
    let silent = closed_batch(&app, &tenant, Shape::OpenAi, &items(4, false)).await;
    crate::provider_batches::wait_for_rows(&app, silent, |rows| {
        rows.iter()
            .any(|row| row.state == entity::ProviderBatchState::Submitted)
    })
    .await;
    let answered = closed_batch(&app, &tenant, Shape::Anthropic, &items(4, false)).await;
    let finished = wait_until_finished(&app, &tenant, answered, Duration::from_secs(30)).await;
    assert_eq!(finished["counts"]["succeeded"], 4, "{finished}");
    let finished = wait_until_finished(&app, &tenant, silent, Duration::from_secs(60)).await;
    assert_eq!(finished["counts"]["failed"], 4, "{finished}");
    let items = crate::provider_batches::items_of(&app, silent).await;
    let ids: Vec<uuid::Uuid> = items.iter().map(|item| item.id).collect();
    let attempts = crate::provider_batches::attempts_of(&app, &ids).await;
    assert_eq!(attempts.len(), 4, "never sent again: {attempts:?}");
    assert!(
        attempts
            .iter()
            .all(|attempt| attempt.outcome == entity::AttemptOutcome::Unknown),
        "{attempts:?}"
    );
    let rows = rows_of(&app, silent).await;
    assert_eq!(rows.len(), 1);
    assert_eq!(rows[0].state, entity::ProviderBatchState::Unknown);
    crate::invariants::assert_billing_invariants(&app.app.db).await;
}

/// A read the provider takes a minute to answer (within the call bound) holds up its
/// own row alone: the other shape's batch, closed while the read waits, is submitted,
/// polled and settled meanwhile, as each row's step runs on its own.
async fn a_slow_provider_holds_up_no_other_row(backend: Backend) {
    let (app, tenant, _folder) =
        through_gateway(backend, Shape::OpenAi, Gateway::StallsReads, |options| {
            options.operations.provider_batches.call_timeout = Duration::from_secs(60);
        })
        .await;
    let slow = closed_batch(&app, &tenant, Shape::OpenAi, &items(4, false)).await;
    crate::provider_batches::wait_for_rows(&app, slow, |rows| {
        rows.iter()
            .any(|row| row.state == entity::ProviderBatchState::Submitted)
    })
    .await;
    // Past the row's first read, which the gateway holds.
    tokio::time::sleep(Duration::from_secs(2)).await;
    let answered = closed_batch(&app, &tenant, Shape::Anthropic, &items(4, false)).await;
    let finished = wait_until_finished(&app, &tenant, answered, Duration::from_secs(20)).await;
    assert_eq!(finished["counts"]["succeeded"], 4, "{finished}");
    let rows = rows_of(&app, slow).await;
    assert_eq!(
        rows[0].state,
        entity::ProviderBatchState::Submitted,
        "still waiting on its read"
    );
    let items = crate::provider_batches::items_of(&app, answered).await;
    let ids: Vec<uuid::Uuid> = items.iter().map(|item| item.id).collect();
    let attempts = crate::provider_batches::attempts_of(&app, &ids).await;
    assert_eq!(attempts.len(), 4, "one attempt an item: {attempts:?}");
    assert!(
        attempts.iter().all(|attempt| {
            attempt.outcome == entity::AttemptOutcome::Succeeded
                && attempt.provider_cost_nanos.unwrap_or(0) > 0
        }),
        "{attempts:?}"
    );
}

/// Ten OpenAI rows whose reads the gateway holds fill every slot OpenAI has (eight);
/// an Anthropic batch closed then still goes out and settles at once, in slots of
/// its own.
async fn a_provider_stalled_on_more_rows_than_its_slots_holds_up_no_other(backend: Backend) {
    let (app, tenant, _folder) =
        through_gateway(backend, Shape::OpenAi, Gateway::StallsReads, |options| {
            options.operations.provider_batches.call_timeout = Duration::from_secs(60);
        })
        .await;
    let mut stalled = Vec::new();
    for n in 0..10 {
        let input = serde_json::json!({"idempotencyKey": format!("stalled-{n}"), "mode": "PROVIDER_BATCH",
            "model": Shape::OpenAi.model(), "maxOutputTokens": 50});
        let id = crate::provider_batches::create_batch_of(&app, &tenant.key, input).await;
        let added = add_items(&app, &tenant, id, &items(1, false)).await;
        assert!(added["errors"].is_null(), "{added}");
        close(&app, &tenant, id).await;
        stalled.push(id);
    }
    for &batch in &stalled {
        crate::provider_batches::wait_for_rows(&app, batch, |rows| {
            rows.iter()
                .any(|row| row.state == entity::ProviderBatchState::Submitted)
        })
        .await;
    }
    // Past the rows' first reads, which the gateway holds.
    tokio::time::sleep(Duration::from_secs(2)).await;
    let answered = closed_batch(&app, &tenant, Shape::Anthropic, &items(2, false)).await;
    let finished = wait_until_finished(&app, &tenant, answered, Duration::from_secs(20)).await;
    assert_eq!(finished["counts"]["succeeded"], 2, "{finished}");
    for &batch in &stalled {
        let rows = rows_of(&app, batch).await;
        assert_eq!(
            rows[0].state,
            entity::ProviderBatchState::Submitted,
            "still waiting on its read"
        );
    }
}

/// Behind a proxy that takes bodies of [`BODY_LIMIT`] bytes at most, an upload refused
/// 413 (which created nothing) goes out again in smaller provider batches, halving
/// until they pass; a request too large on its own fails, by the provider's refusal,
/// rather than go out for ever. Every other item succeeds, billed once.
async fn uploads_refused_as_too_large_go_out_smaller(backend: Backend) {
    too_large_uploads_go_out_smaller(backend, Shape::Anthropic).await;
}

async fn openai_uploads_refused_as_too_large_go_out_smaller(backend: Backend) {
    too_large_uploads_go_out_smaller(backend, Shape::OpenAi).await;
}

async fn too_large_uploads_go_out_smaller(backend: Backend, shape: Shape) {
    let (app, tenant, _folder) =
        through_gateway(backend, shape, Gateway::LimitsBodies, |_| {}).await;
    let mut sent = items(10, false);
    sent.push(serde_json::json!({
        "customId": "too-large",
        "messages": [{"role": "user", "content": "x".repeat(BODY_LIMIT)}],
    }));
    let id = closed_batch(&app, &tenant, shape, &sent).await;
    let finished = wait_until_finished(&app, &tenant, id, Duration::from_secs(90)).await;
    assert_eq!(finished["counts"]["succeeded"], 10, "{finished}");
    assert_eq!(finished["counts"]["failed"], 1, "{finished}");
    let items = crate::provider_batches::items_of(&app, id).await;
    let large = items
        .iter()
        .find(|item| item.custom_id.as_deref() == Some("too-large"))
        .unwrap();
    assert_eq!(large.status, entity::JobStatus::Failed);
    let made: Vec<Value> = mock_batches(&app).await;
    assert!(
        made.len() > 1,
        "the items went out in smaller batches: {made:?}"
    );
    let attempts = assert_settled_once(&app, id, shape).await;
    let billed = app
        .simulator
        .calls()
        .into_iter()
        .filter(|call| call.billed && call.batch_id.is_some())
        .count();
    assert_eq!(billed, 10, "each request that fits billed once");
    assert_eq!(
        attempts
            .iter()
            .filter(|attempt| attempt.provider_cost_nanos.is_some_and(|cost| cost > 0))
            .count(),
        10,
        "{attempts:?}"
    );
    crate::invariants::assert_billing_invariants(&app.app.db).await;
}

/// An OpenAI upload whose answer was lost, searched for while the provider's list of
/// batches fails, holds up no other upload of the provider: OpenAI's search finds our
/// id in the batch's metadata, so its rows do not take the provider's one upload slot
/// (which Anthropic's need, to tell uploads apart by when they were made).
async fn an_openai_upload_searched_for_holds_up_no_other(backend: Backend) {
    let shape = Shape::OpenAi;
    let (app, tenant, _folder) =
        through_gateway(backend, shape, Gateway::LosesTheAnswerAndLists, |_| {}).await;
    let lost = closed_batch(&app, &tenant, shape, &items(4, false)).await;
    crate::provider_batches::wait_for_rows(&app, lost, |rows| {
        rows.iter()
            .any(|row| row.state == entity::ProviderBatchState::Uploading && row.sent_at.is_some())
    })
    .await;
    let input = serde_json::json!({"idempotencyKey": "pb-next", "mode": "PROVIDER_BATCH",
        "model": shape.model(), "maxOutputTokens": 50});
    let next = crate::provider_batches::create_batch_of(&app, &tenant.key, input).await;
    let added = add_items(&app, &tenant, next, &items(4, false)).await;
    assert!(added["errors"].is_null(), "{added}");
    close(&app, &tenant, next).await;
    let finished = wait_until_finished(&app, &tenant, next, Duration::from_secs(30)).await;
    assert_eq!(finished["counts"]["succeeded"], 4, "{finished}");
    let rows = rows_of(&app, lost).await;
    assert_eq!(rows.len(), 1);
    assert_eq!(
        rows[0].state,
        entity::ProviderBatchState::Uploading,
        "still searching for its upload: {:?}",
        rows[0]
    );
    let attempts = assert_settled_once(&app, next, shape).await;
    assert_eq!(attempts.len(), 4, "each item billed once");
    crate::invariants::assert_billing_invariants(&app.app.db).await;
}

/// An upload slower than a row's lease (30 s) keeps its row all the while: the lease
/// is renewed through the create, so no other process takes the row for a lost one
/// and makes the upload a second time.
async fn a_slow_first_upload_keeps_its_lease(backend: Backend) {
    let shape = Shape::Anthropic;
    let held = Gateway::HoldsTheFirstCreate(Duration::from_secs(40));
    let (app, tenant, id, _folder) = closed_batch_through(backend, shape, held).await;
    crate::provider_batches::wait_for_rows(&app, id, |rows| {
        rows.iter()
            .any(|row| row.state == entity::ProviderBatchState::Uploading)
    })
    .await;
    tokio::time::sleep(Duration::from_secs(35)).await;
    let rows = rows_of(&app, id).await;
    assert_eq!(rows[0].state, entity::ProviderBatchState::Uploading);
    let lease = rows[0].lease_until.expect("owned while it uploads");
    assert!(
        lease > entity::Timestamp::now(),
        "the lease lapsed during the upload: {:?}",
        rows[0]
    );
    let finished = wait_until_finished(&app, &tenant, id, Duration::from_secs(60)).await;
    assert_eq!(finished["counts"]["succeeded"], 10, "{finished}");
    assert_eq!(mock_batches(&app).await.len(), 1, "uploaded once");
    assert_settled_once(&app, id, shape).await;
}

/// A cancel that comes while the upload is on its way reaches the provider as soon as
/// the upload is answered, not a poll interval later: the provider runs nothing of it.
async fn a_cancel_during_the_upload_reaches_the_provider_when_it_is_answered(backend: Backend) {
    let shape = Shape::Anthropic;
    let (app, tenant, _folder) = through_gateway_taking(
        backend,
        shape,
        Gateway::HoldsTheFirstCreate(Duration::from_secs(3)),
        Duration::from_secs(10),
        |options| options.operations.provider_batches.poll = Duration::from_secs(30),
    )
    .await;
    let id = closed_batch(&app, &tenant, shape, &items(4, false)).await;
    crate::provider_batches::wait_for_rows(&app, id, |rows| {
        rows.iter()
            .any(|row| row.state == entity::ProviderBatchState::Uploading)
    })
    .await;
    let cancelled = app
        .operation(
            Some(&tenant.key),
            "CancelBatch",
            serde_json::json!({"id": id}),
        )
        .await;
    assert!(cancelled["errors"].is_null(), "{cancelled}");
    let finished = wait_until_finished(&app, &tenant, id, Duration::from_secs(25)).await;
    assert_eq!(finished["counts"]["cancelled"], 4, "{finished}");
    assert_settled_once(&app, id, shape).await;
    assert_eq!(
        crate::helpers::decimal(&app.balance(&tenant).await["charged"]),
        rust_decimal::Decimal::ZERO
    );
}

/// A provider that reads a batch but refuses to cancel it is answering: the row is
/// not silent, does not end with an unknown fate, and is settled from its results
/// when the batch ends (its items charged: the cancel never took).
async fn a_provider_refusing_to_cancel_is_not_silent(backend: Backend) {
    let shape = Shape::OpenAi;
    let (app, tenant, _folder) = through_gateway_taking(
        backend,
        shape,
        Gateway::RefusesCancels,
        Duration::from_secs(12),
        |options| options.operations.provider_batches.unknown_after = Duration::from_secs(4),
    )
    .await;
    let id = closed_batch(&app, &tenant, shape, &items(4, false)).await;
    crate::provider_batches::wait_for_rows(&app, id, |rows| {
        rows.iter()
            .any(|row| row.state == entity::ProviderBatchState::Submitted)
    })
    .await;
    let cancelled = app
        .operation(
            Some(&tenant.key),
            "CancelBatch",
            serde_json::json!({"id": id}),
        )
        .await;
    assert!(cancelled["errors"].is_null(), "{cancelled}");
    let finished = wait_until_finished(&app, &tenant, id, Duration::from_secs(60)).await;
    assert_eq!(finished["counts"]["succeeded"], 4, "{finished}");
    let rows = rows_of(&app, id).await;
    assert_eq!(
        rows[0].state,
        entity::ProviderBatchState::Settled,
        "{:?}",
        rows[0]
    );
    assert_settled_once(&app, id, shape).await;
}

/// A create the provider gets only after the service gave it up (held in the network
/// past the upload's time bound) is found by the search, not made a second time: the
/// create grace counts from when the call was given up, not from when it was sent.
async fn a_create_landing_after_its_time_bound_is_found_not_made_twice(backend: Backend) {
    let shape = Shape::Anthropic;
    let held = Gateway::HoldsTheFirstCreate(Duration::from_secs(8));
    let (app, tenant, _folder) = through_gateway(backend, shape, held, |options| {
        // An upload's bound is twice this: the held create is given up at about 4 s.
        options.operations.provider_batches.call_timeout = Duration::from_secs(2);
    })
    .await;
    let id = closed_batch(&app, &tenant, shape, &items(10, false)).await;
    let finished = wait_until_finished(&app, &tenant, id, Duration::from_secs(60)).await;
    assert_eq!(finished["counts"]["succeeded"], 10, "{finished}");
    let made = mock_batches(&app).await;
    assert_eq!(made.len(), 1, "one provider batch for the items: {made:?}");
    assert_settled_once(&app, id, shape).await;
    crate::invariants::assert_billing_invariants(&app.app.db).await;
}
