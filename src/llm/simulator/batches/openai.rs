//! OpenAI's Batch API: `POST /v1/files` (multipart, `purpose=batch`),
//! `GET /v1/files/{id}` and `/content`, `POST /v1/batches`, `GET /v1/batches`
//! (newest first, `limit` and `after`), `GET /v1/batches/{id}` and
//! `POST /v1/batches/{id}/cancel`.
//!
//! An input file is checked when it is uploaded (each line a JSON object with
//! a unique `custom_id`, `method` `POST`, a `url` and a `body` that
//! `/v1/chat/completions` would accept) and refused whole with 400 naming the
//! line, where OpenAI would let the batch fail while validating. A batch is
//! answered `validating` at creation, then reads `in_progress` until it ends:
//! `completed`, or `expired` when any request expired (the ones that did not
//! are in the output file all the same, as at OpenAI). A cancelled batch reads
//! `cancelling` in the cancel's answer, then `cancelled`. The output file holds
//! the succeeded requests, the error file the errored (`response` with the
//! error body), expired (`batch_expired`) and cancelled (`batch_cancelled`)
//! ones; either id is null when its file would be empty.

use std::collections::HashSet;

use axum::Json;
use axum::Router;
use axum::body::Bytes;
use axum::extract::{DefaultBodyLimit, Multipart, Path, Query, State};
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use chrono::{DateTime, Utc};
use serde::Deserialize;
use serde_json::value::RawValue;
use serde_json::{Value, json};
use uuid::Uuid;

use super::super::openai::OpenAi;
use super::{
    Api, Batch, OPENAI_FILE_BYTES, OPENAI_FILE_REQUESTS, OpenAiParts, Outcome, Phase, Request,
    Simulator, Store, page, page_size, refuse,
};

/// The one endpoint the simulator batches.
const ENDPOINT: &str = "/v1/chat/completions";
/// OpenAI's only completion window.
const WINDOW: &str = "24h";
/// Room for the multipart framing and the `purpose` field around the file.
const MULTIPART_SLACK: usize = 64 * 1024;

pub(super) fn router() -> Router<Simulator> {
    Router::new()
        .route(
            "/v1/files",
            post(upload)
                .get(list_files)
                .layer(DefaultBodyLimit::max(OPENAI_FILE_BYTES + MULTIPART_SLACK)),
        )
        .route("/v1/files/{id}", get(file))
        .route("/v1/files/{id}/content", get(file_content))
        .route("/v1/batches", post(create).get(list))
        .route("/v1/batches/{id}", get(retrieve))
        .route("/v1/batches/{id}/cancel", post(cancel))
}

fn refused(status: StatusCode, message: &str) -> Response {
    refuse::<OpenAi>(status, message)
}

/// One line of an input file.
#[derive(Deserialize)]
struct InputLine {
    custom_id: String,
    method: String,
    url: String,
    body: Box<RawValue>,
}

/// The requests of an input file, or why it is not one (with the line).
fn parse_input(bytes: &[u8]) -> Result<Vec<(String, Request)>, String> {
    let text = std::str::from_utf8(bytes).map_err(|_| "the file is not UTF-8".to_owned())?;
    let mut requests = Vec::new();
    let mut seen = HashSet::new();
    for (at, line) in text.lines().enumerate() {
        let number = at + 1;
        if line.trim().is_empty() {
            continue;
        }
        if requests.len() == OPENAI_FILE_REQUESTS {
            return Err(format!(
                "the file holds more than {OPENAI_FILE_REQUESTS} requests"
            ));
        }
        let line: InputLine =
            serde_json::from_str(line).map_err(|error| format!("line {number}: {error}"))?;
        if line.custom_id.is_empty() || !seen.insert(line.custom_id.clone()) {
            return Err(format!(
                "line {number}: custom_id {:?} is empty or not unique",
                line.custom_id
            ));
        }
        if line.method != "POST" {
            return Err(format!("line {number}: method must be POST"));
        }
        let body = line.body.get().as_bytes().to_vec();
        Api::OpenAi
            .prompt(&body)
            .map_err(|error| format!("line {number}: body: {error}"))?;
        requests.push((
            line.url,
            Request {
                custom_id: line.custom_id,
                body,
            },
        ));
    }
    if requests.is_empty() {
        return Err("the file holds no request".to_owned());
    }
    Ok(requests)
}

async fn upload(State(sim): State<Simulator>, mut multipart: Multipart) -> Response {
    let mut purpose = None;
    let mut file = None;
    loop {
        let mut field = match multipart.next_field().await {
            Ok(Some(field)) => field,
            Ok(None) => break,
            Err(error) => return refused(error.status(), &error.body_text()),
        };
        match field.name() {
            Some("purpose") => match field.text().await {
                Ok(text) => purpose = Some(text),
                Err(error) => return refused(error.status(), &error.body_text()),
            },
            Some("file") => {
                let filename = field.file_name().unwrap_or("input.jsonl").to_owned();
                let mut bytes = Vec::new();
                loop {
                    match field.chunk().await {
                        Ok(Some(chunk)) => {
                            if bytes.len() + chunk.len() > OPENAI_FILE_BYTES {
                                return refused(
                                    StatusCode::PAYLOAD_TOO_LARGE,
                                    &format!(
                                        "a batch input file holds at most {OPENAI_FILE_BYTES} bytes here"
                                    ),
                                );
                            }
                            bytes.extend_from_slice(&chunk);
                        }
                        Ok(None) => break,
                        Err(error) => return refused(error.status(), &error.body_text()),
                    }
                }
                file = Some((filename, bytes));
            }
            _ => {}
        }
    }
    if purpose.as_deref() != Some("batch") {
        return refused(
            StatusCode::BAD_REQUEST,
            "purpose must be \"batch\": the simulator stores batch input only",
        );
    }
    let Some((filename, bytes)) = file else {
        return refused(StatusCode::BAD_REQUEST, "the `file` field is missing");
    };
    if let Err(problem) = parse_input(&bytes) {
        return refused(StatusCode::BAD_REQUEST, &problem);
    }
    match sim.store_file(filename, "batch", Bytes::from(bytes)) {
        Ok(id) => {
            let store = sim.store();
            Json(file_object(&store.files[&id])).into_response()
        }
        Err(refusal) => refused(refusal.status(), &refusal.message()),
    }
}

fn file_object(file: &super::File) -> Value {
    json!({
        "id": file.id,
        "object": "file",
        "bytes": file.bytes.len(),
        "created_at": file.created_at.timestamp(),
        "filename": file.filename,
        "purpose": file.purpose,
        "status": "processed",
    })
}

async fn file(State(sim): State<Simulator>, Path(id): Path<String>) -> Response {
    match sim.store().files.get(&id) {
        Some(file) => Json(file_object(file)).into_response(),
        None => no_file(&id),
    }
}

fn no_file(id: &str) -> Response {
    refused(StatusCode::NOT_FOUND, &format!("no such file: {id}"))
}

async fn file_content(State(sim): State<Simulator>, Path(id): Path<String>) -> Response {
    sim.advance_batches();
    match sim.store().files.get(&id) {
        Some(file) => (
            [(header::CONTENT_TYPE, "application/jsonl")],
            file.bytes.clone(),
        )
            .into_response(),
        None => no_file(&id),
    }
}

#[derive(Deserialize)]
struct CreateBatch {
    input_file_id: String,
    endpoint: String,
    completion_window: String,
    #[serde(default)]
    metadata: Option<Value>,
}

async fn create(State(sim): State<Simulator>, body: Bytes) -> Response {
    let request: CreateBatch = match serde_json::from_slice(&body) {
        Ok(request) => request,
        Err(error) => {
            return refused(
                StatusCode::BAD_REQUEST,
                &format!("invalid request body: {error}"),
            );
        }
    };
    if request.endpoint != ENDPOINT {
        return refused(
            StatusCode::BAD_REQUEST,
            &format!("endpoint must be {ENDPOINT:?}: the only one the simulator batches"),
        );
    }
    if request.completion_window != WINDOW {
        return refused(
            StatusCode::BAD_REQUEST,
            &format!("completion_window must be {WINDOW:?}"),
        );
    }
    if let Some(metadata) = &request.metadata
        && !metadata.is_object()
    {
        return refused(StatusCode::BAD_REQUEST, "metadata must be an object");
    }
    let bytes = match sim.store().files.get(&request.input_file_id) {
        Some(file) if file.purpose == "batch" => file.bytes.clone(),
        Some(_) => {
            return refused(
                StatusCode::BAD_REQUEST,
                "input_file_id names a file that is not batch input",
            );
        }
        None => return no_file(&request.input_file_id),
    };
    // Checked at upload; parsed again here rather than kept twice.
    let requests = match parse_input(&bytes) {
        Ok(requests) => requests,
        Err(problem) => return refused(StatusCode::BAD_REQUEST, &problem),
    };
    if let Some((url, _)) = requests.iter().find(|(url, _)| *url != request.endpoint) {
        return refused(
            StatusCode::BAD_REQUEST,
            &format!(
                "a request's url is {url:?}, not the batch's endpoint {:?}",
                request.endpoint
            ),
        );
    }
    let parts = OpenAiParts {
        input_file_id: request.input_file_id,
        endpoint: request.endpoint,
        completion_window: request.completion_window,
        output_file_id: None,
        error_file_id: None,
    };
    let requests = requests.into_iter().map(|(_, request)| request).collect();
    let metadata = request.metadata.unwrap_or(Value::Null);
    match sim.create_batch(Api::OpenAi, requests, metadata, Some(parts)) {
        Ok(id) => {
            let store = sim.store();
            let batch = store.batch(Api::OpenAi, &id).expect("just created");
            let mut object = batch_object(batch);
            // OpenAI answers the creation while it still validates the file.
            object["status"] = json!("validating");
            Json(object).into_response()
        }
        Err(refusal) => refused(refusal.status(), &refusal.message()),
    }
}

/// The status OpenAI reports for `batch`.
pub(super) fn status(batch: &Batch) -> &'static str {
    match batch.phase() {
        Phase::InProgress => "in_progress",
        Phase::Cancelling => "cancelling",
        Phase::Ended if batch.cancel_requested_at.is_some() => "cancelled",
        Phase::Ended if batch.counts().expired > 0 => "expired",
        Phase::Ended => "completed",
    }
}

fn batch_object(batch: &Batch) -> Value {
    let parts = batch
        .openai
        .as_ref()
        .expect("an OpenAI batch has its parts");
    let seconds = |at: Option<DateTime<Utc>>| at.map(|at| at.timestamp());
    let status = status(batch);
    let ended = batch.ended_at;
    let when = |wanted: &str| {
        if status == wanted {
            seconds(ended)
        } else {
            None
        }
    };
    let counts = batch.counts();
    let (completed, failed) = if batch.phase() == Phase::Ended {
        (counts.succeeded, batch.total - counts.succeeded)
    } else {
        (0, 0)
    };
    json!({
        "id": batch.id,
        "object": "batch",
        "endpoint": parts.endpoint,
        "errors": null,
        "input_file_id": parts.input_file_id,
        "completion_window": parts.completion_window,
        "status": status,
        "output_file_id": parts.output_file_id,
        "error_file_id": parts.error_file_id,
        "created_at": batch.created_at.timestamp(),
        "in_progress_at": batch.created_at.timestamp(),
        "expires_at": (batch.created_at + chrono::Duration::hours(24)).timestamp(),
        "finalizing_at": if batch.cancel_requested_at.is_none() { seconds(ended) } else { None },
        "completed_at": when("completed"),
        "failed_at": null,
        "expired_at": when("expired"),
        "cancelling_at": seconds(batch.cancel_requested_at),
        "cancelled_at": when("cancelled"),
        "request_counts": { "total": batch.total, "completed": completed, "failed": failed },
        "metadata": batch.metadata,
    })
}

/// Writes the output and error files of the batch at `index`, which has just ended.
pub(super) fn write_result_files(store: &mut Store, index: usize) {
    let batch = &store.batches[index];
    let mut output = Vec::new();
    let mut errors = Vec::new();
    for (custom_id, outcome) in &batch.results {
        let id = format!("batch_req_{}", Uuid::new_v4().simple());
        let (file, response, error) = match outcome {
            Outcome::Succeeded { request_id, body } => (
                &mut output,
                json!({ "status_code": 200, "request_id": request_id, "body": body }),
                Value::Null,
            ),
            Outcome::Errored {
                status,
                request_id,
                body,
            } => (
                &mut errors,
                json!({ "status_code": status.as_u16(), "request_id": request_id, "body": body }),
                Value::Null,
            ),
            Outcome::Expired => (
                &mut errors,
                Value::Null,
                json!({
                    "code": "batch_expired",
                    "message": "This request could not be executed before the completion window expired.",
                }),
            ),
            Outcome::Cancelled => (
                &mut errors,
                Value::Null,
                json!({
                    "code": "batch_cancelled",
                    "message": "This request was not executed because the batch was cancelled.",
                }),
            ),
        };
        let line =
            json!({ "id": id, "custom_id": custom_id, "response": response, "error": error });
        serde_json::to_writer(&mut *file, &line).expect("a result line serializes");
        file.push(b'\n');
    }
    let batch_id = batch.id.clone();
    let mut file_id = |bytes: Vec<u8>, suffix: &str| {
        (!bytes.is_empty()).then(|| {
            store.add_file(
                format!("{batch_id}_{suffix}.jsonl"),
                "batch_output",
                Bytes::from(bytes),
            )
        })
    };
    let output_file_id = file_id(output, "output");
    let error_file_id = file_id(errors, "error");
    if let Some(parts) = store.batches[index].openai.as_mut() {
        parts.output_file_id = output_file_id;
        parts.error_file_id = error_file_id;
    }
}

async fn retrieve(State(sim): State<Simulator>, Path(id): Path<String>) -> Response {
    sim.advance_batches();
    match sim.store().batch(Api::OpenAi, &id) {
        Some(batch) => Json(batch_object(batch)).into_response(),
        None => no_batch(&id),
    }
}

fn no_batch(id: &str) -> Response {
    refused(StatusCode::NOT_FOUND, &format!("no such batch: {id}"))
}

async fn cancel(State(sim): State<Simulator>, Path(id): Path<String>) -> Response {
    sim.advance_batches();
    let mut store = sim.store();
    let Some(batch) = store.batch_mut(Api::OpenAi, &id) else {
        return no_batch(&id);
    };
    match batch.phase() {
        Phase::InProgress => batch.cancel_requested_at = Some(Utc::now()),
        Phase::Cancelling => {}
        Phase::Ended => {
            let message = format!("cannot cancel a batch that is {}", status(batch));
            return refused(StatusCode::CONFLICT, &message);
        }
    }
    Json(batch_object(batch)).into_response()
}

#[derive(Deserialize)]
struct ListQuery {
    limit: Option<usize>,
    after: Option<String>,
}

async fn list(State(sim): State<Simulator>, Query(query): Query<ListQuery>) -> Response {
    sim.advance_batches();
    let store = sim.store();
    let (batches, has_more) = page(
        store.newest_first(Api::OpenAi),
        |batch| batch.id.as_str(),
        page_size(query.limit),
        query.after.as_deref(),
        None,
    );
    let data: Vec<Value> = batches.iter().map(|batch| batch_object(batch)).collect();
    Json(json!({
        "object": "list",
        "first_id": batches.first().map(|batch| &batch.id),
        "last_id": batches.last().map(|batch| &batch.id),
        "has_more": has_more,
        "data": data,
    }))
    .into_response()
}

/// The query of `GET /v1/files`, as OpenAI reads it.
#[derive(Deserialize)]
struct FileListQuery {
    purpose: Option<String>,
    /// 1 to 10,000; 10,000 when not given (OpenAI's).
    limit: Option<usize>,
    /// `desc` (newest first, the default) or `asc`.
    order: Option<String>,
    after: Option<String>,
}

/// `GET /v1/files`: the stored files (uploads and results), of one purpose if asked,
/// in pages after the file `after` — what a client that lost track of an upload
/// (it crashed before reading the answer) finds it by.
async fn list_files(State(sim): State<Simulator>, Query(query): Query<FileListQuery>) -> Response {
    if let Some(order) = query.order.as_deref()
        && !matches!(order, "asc" | "desc")
    {
        return refused(StatusCode::BAD_REQUEST, "order must be \"asc\" or \"desc\"");
    }
    let store = sim.store();
    let mut files: Vec<&super::File> = store
        .files
        .values()
        .filter(|file| {
            query
                .purpose
                .as_deref()
                .is_none_or(|purpose| file.purpose == purpose)
        })
        .collect();
    files.sort_by(|a, b| {
        b.created_at
            .cmp(&a.created_at)
            .then_with(|| b.id.cmp(&a.id))
    });
    if query.order.as_deref() == Some("asc") {
        files.reverse();
    }
    let (files, has_more) = page(
        files,
        |file| file.id.as_str(),
        query.limit.unwrap_or(10_000).clamp(1, 10_000),
        query.after.as_deref(),
        None,
    );
    let data: Vec<Value> = files.iter().map(|file| file_object(file)).collect();
    Json(json!({
        "object": "list",
        "first_id": files.first().map(|file| &file.id),
        "last_id": files.last().map(|file| &file.id),
        "has_more": has_more,
        "data": data,
    }))
    .into_response()
}
