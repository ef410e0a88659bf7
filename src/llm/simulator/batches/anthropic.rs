//! Anthropic's Message Batches API: `POST /v1/messages/batches`
//! (`requests: [{custom_id, params}]`), `GET /v1/messages/batches` (newest
//! first, `limit`, `after_id`, `before_id`), `GET /v1/messages/batches/{id}`,
//! `POST /v1/messages/batches/{id}/cancel` and
//! `GET /v1/messages/batches/{id}/results` (JSONL, once ended).
//!
//! A batch is `in_progress` until it ends, `canceling` in a cancel's answer,
//! then `ended`; `results_url` is set once it has ended. Each result is
//! `succeeded` (with the message), `errored` (with the error body), `expired`
//! or `canceled`, in input order. Every request's `params` must be a body
//! `/v1/messages` would accept, and its `custom_id` 1 to 64 letters, digits,
//! `-` or `_`, unique in the batch; otherwise the whole batch is refused (400).

use std::collections::HashSet;

use axum::Json;
use axum::Router;
use axum::body::Body;
use axum::extract::{Path, Query, State};
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use chrono::{DateTime, SecondsFormat, Utc};
use serde::Deserialize;
use serde_json::value::RawValue;
use serde_json::{Value, json};

use super::super::anthropic::Anthropic;
use super::{
    ANTHROPIC_BATCH_BYTES, ANTHROPIC_BATCH_REQUESTS, Api, Batch, Outcome, Phase, Request,
    Simulator, page, page_size, refuse,
};

pub(super) fn router() -> Router<Simulator> {
    Router::new()
        .route("/v1/messages/batches", post(create).get(list))
        .route("/v1/messages/batches/{id}", get(retrieve))
        .route("/v1/messages/batches/{id}/cancel", post(cancel))
        .route("/v1/messages/batches/{id}/results", get(results))
}

fn refused(status: StatusCode, message: &str) -> Response {
    refuse::<Anthropic>(status, message)
}

#[derive(Deserialize)]
struct CreateBatch {
    requests: Vec<BatchRequest>,
}

#[derive(Deserialize)]
struct BatchRequest {
    custom_id: String,
    params: Box<RawValue>,
}

fn valid_custom_id(id: &str) -> bool {
    (1..=64).contains(&id.len())
        && id
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_')
}

/// The requests of a creation body, or why it is refused.
fn parse_requests(body: &[u8]) -> Result<Vec<Request>, String> {
    let request: CreateBatch =
        serde_json::from_slice(body).map_err(|error| format!("invalid request body: {error}"))?;
    if request.requests.is_empty() {
        return Err("requests: a batch needs at least one request".to_owned());
    }
    if request.requests.len() > ANTHROPIC_BATCH_REQUESTS {
        return Err(format!(
            "requests: a batch holds at most {ANTHROPIC_BATCH_REQUESTS} requests"
        ));
    }
    let mut seen = HashSet::new();
    let mut requests = Vec::with_capacity(request.requests.len());
    for (at, item) in request.requests.into_iter().enumerate() {
        if !valid_custom_id(&item.custom_id) || !seen.insert(item.custom_id.clone()) {
            return Err(format!(
                "requests.{at}.custom_id: {:?} must be 1 to 64 letters, digits, - or _, unique in the batch",
                item.custom_id
            ));
        }
        let body = item.params.get().as_bytes().to_vec();
        Api::Anthropic
            .prompt(&body)
            .map_err(|error| format!("requests.{at}.params: {error}"))?;
        requests.push(Request {
            custom_id: item.custom_id,
            body,
        });
    }
    Ok(requests)
}

async fn create(State(sim): State<Simulator>, headers: HeaderMap, body: Body) -> Response {
    // Read up to the bound and no further: a larger body is refused, never held.
    let body = match axum::body::to_bytes(body, ANTHROPIC_BATCH_BYTES).await {
        Ok(body) => body,
        Err(_) => {
            return refused(
                StatusCode::PAYLOAD_TOO_LARGE,
                &format!("a batch holds at most {ANTHROPIC_BATCH_BYTES} bytes here"),
            );
        }
    };
    let requests = match parse_requests(&body) {
        Ok(requests) => requests,
        Err(problem) => return refused(StatusCode::BAD_REQUEST, &problem),
    };
    match sim.create_batch(Api::Anthropic, requests, Value::Null, None) {
        Ok(id) => {
            let store = sim.store();
            let batch = store.batch(Api::Anthropic, &id).expect("just created");
            Json(batch_object(batch, &headers)).into_response()
        }
        Err(refusal) => refused(refusal.status(), &refusal.message()),
    }
}

/// The `processing_status` Anthropic reports for `batch`.
pub(super) fn status(batch: &Batch) -> &'static str {
    match batch.phase() {
        Phase::InProgress => "in_progress",
        Phase::Cancelling => "canceling",
        Phase::Ended => "ended",
    }
}

fn batch_object(batch: &Batch, headers: &HeaderMap) -> Value {
    let time = |at: DateTime<Utc>| at.to_rfc3339_opts(SecondsFormat::Millis, true);
    let counts = batch.counts();
    let processing = if batch.phase() == Phase::Ended {
        0
    } else {
        batch.total
    };
    // Absolute, as Anthropic's is: the host the client reached.
    let results_url = batch.ended_at.map(|_| {
        let host = headers
            .get(header::HOST)
            .and_then(|host| host.to_str().ok())
            .unwrap_or("127.0.0.1");
        format!("http://{host}/v1/messages/batches/{}/results", batch.id)
    });
    json!({
        "id": batch.id,
        "type": "message_batch",
        "processing_status": status(batch),
        "request_counts": {
            "processing": processing,
            "succeeded": counts.succeeded,
            "errored": counts.errored,
            "canceled": counts.cancelled,
            "expired": counts.expired,
        },
        "ended_at": batch.ended_at.map(time),
        "created_at": time(batch.created_at),
        "expires_at": time(batch.created_at + chrono::Duration::hours(24)),
        "archived_at": null,
        "cancel_initiated_at": batch.cancel_requested_at.map(time),
        "results_url": results_url,
    })
}

fn no_batch(id: &str) -> Response {
    refused(
        StatusCode::NOT_FOUND,
        &format!("no such message batch: {id}"),
    )
}

async fn retrieve(
    State(sim): State<Simulator>,
    headers: HeaderMap,
    Path(id): Path<String>,
) -> Response {
    sim.advance_batches();
    match sim.store().batch(Api::Anthropic, &id) {
        Some(batch) => Json(batch_object(batch, &headers)).into_response(),
        None => no_batch(&id),
    }
}

async fn cancel(
    State(sim): State<Simulator>,
    headers: HeaderMap,
    Path(id): Path<String>,
) -> Response {
    sim.advance_batches();
    let mut store = sim.store();
    let Some(batch) = store.batch_mut(Api::Anthropic, &id) else {
        return no_batch(&id);
    };
    // Cancelling an ended batch changes nothing, as at Anthropic.
    if batch.phase() == Phase::InProgress {
        batch.cancel_requested_at = Some(Utc::now());
    }
    Json(batch_object(batch, &headers)).into_response()
}

async fn results(State(sim): State<Simulator>, Path(id): Path<String>) -> Response {
    sim.advance_batches();
    let store = sim.store();
    let Some(batch) = store.batch(Api::Anthropic, &id) else {
        return no_batch(&id);
    };
    if batch.phase() != Phase::Ended {
        return refused(
            StatusCode::BAD_REQUEST,
            "the batch has not ended: its results are not available yet",
        );
    }
    let mut lines = Vec::new();
    for (custom_id, outcome) in &batch.results {
        let result = match outcome {
            Outcome::Succeeded { body, .. } => json!({ "type": "succeeded", "message": body }),
            Outcome::Errored { body, .. } => json!({ "type": "errored", "error": body }),
            Outcome::Expired => json!({ "type": "expired" }),
            Outcome::Cancelled => json!({ "type": "canceled" }),
        };
        let line = json!({ "custom_id": custom_id, "result": result });
        serde_json::to_writer(&mut lines, &line).expect("a result line serializes");
        lines.push(b'\n');
    }
    ([(header::CONTENT_TYPE, "application/x-jsonl")], lines).into_response()
}

#[derive(Deserialize)]
struct ListQuery {
    limit: Option<usize>,
    after_id: Option<String>,
    before_id: Option<String>,
}

async fn list(
    State(sim): State<Simulator>,
    headers: HeaderMap,
    Query(query): Query<ListQuery>,
) -> Response {
    sim.advance_batches();
    let store = sim.store();
    let (batches, has_more) = page(
        store.newest_first(Api::Anthropic),
        |batch| batch.id.as_str(),
        page_size(query.limit),
        query.after_id.as_deref(),
        query.before_id.as_deref(),
    );
    let data: Vec<Value> = batches
        .iter()
        .map(|batch| batch_object(batch, &headers))
        .collect();
    Json(json!({
        "data": data,
        "has_more": has_more,
        "first_id": batches.first().map(|batch| &batch.id),
        "last_id": batches.last().map(|batch| &batch.id),
    }))
    .into_response()
}
