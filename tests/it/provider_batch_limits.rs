//! What bounds an item of a provider batch besides its results: a request the provider
//! keeps refusing with a rate limit fails by the item's `maxAttempts`, not after
//! provider batch upon provider batch; and a deadline that passes while the provider
//! batch runs cancels it, failing the items it had not run `DEADLINE_EXCEEDED`,
//! unbilled.

use crate::batches::{add_items, wait_until_finished};
use crate::helpers::Backend;
use crate::helpers::{RunningSimulator, spawn_app_beside};
use crate::provider_batches::{
    Setup, Shape, assert_settled_once, attempts_of, close, config, create_batch_of, items_of,
    mock_batches, options, rows_of, setup, unreachable_config, wait_for_rows,
};
use entity::{AttemptOutcome, JobErrorCode, JobStatus, ProviderBatchState};
use serde_json::{Value, json};
use std::collections::HashSet;
use std::time::Duration;

on_both_backends!(
    a_request_rate_limited_in_every_provider_batch_fails_by_its_attempts,
    a_deadline_passing_at_the_provider_cancels_the_provider_batch,
    a_deadline_passing_before_the_upload_fails_its_items_unsent,
    thousands_of_items_go_out_together,
);

fn item(n: usize, directive: &str) -> Value {
    json!({"customId": format!("doc-{n}"),
        "messages": [{"role": "user", "content": format!("document {n}: summarise it{directive}")}]})
}

/// A 429 in a result line is that request's refusal, not a pause of the model: the
/// item spends an attempt per provider batch and fails once its two are spent.
async fn a_request_rate_limited_in_every_provider_batch_fails_by_its_attempts(backend: Backend) {
    let shape = Shape::OpenAi;
    let Setup { app, tenant, .. } = setup(
        backend,
        Duration::from_millis(200),
        Duration::from_secs(3600),
    )
    .await;
    let id = create_batch_of(
        &app,
        &tenant.key,
        json!({"idempotencyKey": "pb-429", "mode": "PROVIDER_BATCH", "model": shape.model(),
            "maxOutputTokens": 50, "maxAttempts": 2}),
    )
    .await;
    let items = [item(0, " [mock:status=429]"), item(1, ""), item(2, "")];
    assert!(add_items(&app, &tenant, id, &items).await["errors"].is_null());
    close(&app, &tenant, id).await;
    let finished = wait_until_finished(&app, &tenant, id, Duration::from_secs(60)).await;
    assert_eq!(finished["counts"]["succeeded"], 2, "{finished}");
    assert_eq!(finished["counts"]["failed"], 1, "{finished}");
    assert_settled_once(&app, id, shape).await;
    let limited = items_of(&app, id)
        .await
        .into_iter()
        .find(|item| item.custom_id.as_deref() == Some("doc-0"))
        .unwrap();
    assert_eq!(limited.status, JobStatus::Failed);
    assert_eq!(limited.error_code, Some(JobErrorCode::ProviderUnavailable));
    let tried = attempts_of(&app, &[limited.id]).await;
    assert_eq!(tried.len(), 2, "one attempt per allowed attempt: {tried:?}");
    let batches: HashSet<_> = tried
        .iter()
        .map(|attempt| attempt.provider_batch_id)
        .collect();
    assert_eq!(
        batches.len(),
        2,
        "each in its own provider batch: {tried:?}"
    );
    for attempt in &tried {
        assert_eq!(
            attempt.outcome,
            AttemptOutcome::RetryableError,
            "{attempt:?}"
        );
        assert_eq!(attempt.provider_cost_nanos, Some(0), "{attempt:?}");
        assert_eq!(attempt.customer_charge_nanos, Some(0), "{attempt:?}");
    }
    // The first provider batch held all three; only the refused item went again.
    let mut sizes: Vec<Value> = mock_batches(&app)
        .await
        .into_iter()
        .map(|listed| listed["requests"].clone())
        .collect();
    sizes.sort_by_key(|size| size.as_u64());
    assert_eq!(sizes, [json!(1), json!(3)]);
}

/// The batch's deadline passes while the provider still holds its requests: the
/// provider batch is cancelled then, its items fail `DEADLINE_EXCEEDED`, and nothing
/// is charged for requests the provider never ran.
async fn a_deadline_passing_at_the_provider_cancels_the_provider_batch(backend: Backend) {
    let shape = Shape::Anthropic;
    let Setup { app, tenant, .. } =
        setup(backend, Duration::from_secs(40), Duration::from_secs(3600)).await;
    let deadline = chrono::Utc::now() + chrono::Duration::seconds(6);
    let id = create_batch_of(
        &app,
        &tenant.key,
        json!({"idempotencyKey": "pb-deadline", "mode": "PROVIDER_BATCH", "model": shape.model(),
            "maxOutputTokens": 50, "deadline": deadline.to_rfc3339()}),
    )
    .await;
    let items: Vec<Value> = (0..4).map(|n| item(n, "")).collect();
    assert!(add_items(&app, &tenant, id, &items).await["errors"].is_null());
    close(&app, &tenant, id).await;
    wait_for_rows(&app, id, |rows| {
        rows.iter()
            .any(|row| row.state == ProviderBatchState::Submitted)
    })
    .await;
    // Long before the provider would have run them (40 s).
    let finished = wait_until_finished(&app, &tenant, id, Duration::from_secs(30)).await;
    assert_eq!(finished["counts"]["failed"], 4, "{finished}");
    for item in items_of(&app, id).await {
        assert_eq!(
            item.error_code,
            Some(JobErrorCode::DeadlineExceeded),
            "{item:?}"
        );
    }
    let rows = rows_of(&app, id).await;
    assert_eq!(rows.len(), 1, "not sent again: {rows:?}");
    assert!(rows[0].cancel_sent, "{rows:?}");
    assert_eq!(mock_batches(&app).await[0]["status"], "ended");
    let attempts = assert_settled_once(&app, id, shape).await;
    // Recorded as a call the deadline kept from being made, not as a wait.
    assert!(
        attempts.iter().all(|attempt| {
            attempt.outcome == AttemptOutcome::Cancelled
                && attempt.error_code == Some(JobErrorCode::DeadlineExceeded)
        }),
        "{attempts:?}"
    );
    assert_eq!(
        crate::helpers::decimal(&app.balance(&tenant).await["charged"]),
        rust_decimal::Decimal::ZERO
    );
}

/// The deadline passes while the provider batch is still to be sent (here: the
/// provider cannot be reached, so each try goes back to `preparing`): the items fail
/// `DEADLINE_EXCEEDED` at the next try, nothing of them is ever sent, nothing charged.
async fn a_deadline_passing_before_the_upload_fails_its_items_unsent(backend: Backend) {
    let shape = Shape::Anthropic;
    let simulator = RunningSimulator::start().await;
    let folder = tempfile::tempdir().unwrap();
    let unreachable = unreachable_config(&config(folder.path(), &simulator), &simulator);
    let hour = Duration::from_secs(3600);
    let poll = Duration::from_secs(1);
    let app = spawn_app_beside(backend, simulator, options(&unreachable, hour, poll)).await;
    let tenant = app.funded_tenant("acme", "100").await;
    let deadline = chrono::Utc::now() + chrono::Duration::seconds(4);
    let id = create_batch_of(
        &app,
        &tenant.key,
        json!({"idempotencyKey": "pb-late", "mode": "PROVIDER_BATCH", "model": shape.model(),
            "maxOutputTokens": 50, "deadline": deadline.to_rfc3339()}),
    )
    .await;
    let items: Vec<Value> = (0..3).map(|n| item(n, "")).collect();
    assert!(add_items(&app, &tenant, id, &items).await["errors"].is_null());
    close(&app, &tenant, id).await;
    wait_for_rows(&app, id, |rows| {
        rows.iter().any(|row| row.last_error.is_some())
    })
    .await;
    let finished = wait_until_finished(&app, &tenant, id, Duration::from_secs(30)).await;
    assert_eq!(finished["counts"]["failed"], 3, "{finished}");
    for item in items_of(&app, id).await {
        assert_eq!(
            item.error_code,
            Some(JobErrorCode::DeadlineExceeded),
            "{item:?}"
        );
    }
    // The row ends just after its items.
    let rows = wait_for_rows(&app, id, |rows| {
        rows.iter()
            .all(|row| row.state == ProviderBatchState::Abandoned)
    })
    .await;
    assert_eq!(rows.len(), 1, "{rows:?}");
    assert!(mock_batches(&app).await.is_empty());
    assert_settled_once(&app, id, shape).await;
    assert_eq!(
        crate::helpers::decimal(&app.balance(&tenant).await["charged"]),
        rust_decimal::Decimal::ZERO
    );
}

/// A batch of a few thousand items is claimed into provider batches as large as the
/// backend lets one transaction start (10,000 on PostgreSQL, 500 on SQLite): a claim
/// of more attempts than PostgreSQL takes in one statement's parameters or select
/// list is started in several statements of one transaction, and every item is
/// settled once.
async fn thousands_of_items_go_out_together(backend: Backend) {
    const ITEMS: usize = 3_000;
    let shape = Shape::OpenAi;
    let postgres = matches!(backend, Backend::Postgres(_));
    let Setup { app, tenant, .. } = setup(
        backend,
        Duration::from_millis(200),
        Duration::from_secs(3600),
    )
    .await;
    let id = create_batch_of(
        &app,
        &tenant.key,
        json!({"idempotencyKey": "pb-thousands", "mode": "PROVIDER_BATCH", "model": shape.model(),
            "maxOutputTokens": 20}),
    )
    .await;
    let items: Vec<Value> = (0..ITEMS).map(|n| item(n, "")).collect();
    for some in items.chunks(1_000) {
        let added = add_items(&app, &tenant, id, some).await;
        assert!(added["errors"].is_null(), "{added}");
    }
    close(&app, &tenant, id).await;
    let finished = wait_until_finished(&app, &tenant, id, Duration::from_secs(120)).await;
    assert_eq!(finished["counts"]["succeeded"], ITEMS, "{finished}");
    let made = mock_batches(&app).await;
    let rows = rows_of(&app, id).await;
    assert_eq!(rows.len(), made.len(), "{made:?}");
    if postgres {
        assert_eq!(made.len(), 1, "one provider batch: {made:?}");
    }
    let attempts = assert_settled_once(&app, id, shape).await;
    assert_eq!(attempts.len(), ITEMS, "each item billed once");
    crate::invariants::assert_billing_invariants(&app.app.db).await;
}
