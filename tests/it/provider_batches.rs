//! PROVIDER_BATCH batches end to end through the simulator's batch APIs, for both
//! provider shapes (a model routed to the OpenAI-compatible provider, one routed to
//! the Anthropic provider): nothing goes out before `closeBatch`; every item is
//! settled once from the provider's results at half the realtime cost; an errored
//! request fails its item unbilled, an expired one goes out again in the next
//! provider batch; a cancel charges what the provider finished; a provider that cannot be read gives
//! its items the unknown-outcome bound.

use crate::batches::{add_items, batch, wait_until_finished};
use crate::helpers::{
    AppOptions, Backend, RunningSimulator, TestApp, TestTenant, spawn_app_beside,
};
use crate::invariants::assert_billing_invariants;
use entity::{
    AttemptOutcome, JobErrorCode, JobStatus, ProviderBatchState, ReservationStatus, attempts,
    credit_reservations, jobs, provider_batches,
};
use jobledger::config::OperationsSettings;
use jobledger::jobs::provider_batches::ProviderBatchSettings;
use jobledger::llm::simulator::Simulator;
use sea_orm::{ColumnTrait, EntityTrait, QueryFilter};
use serde_json::{Value, json};
use std::collections::HashSet;
use std::time::{Duration, Instant};
use uuid::Uuid;

on_both_backends!(
    a_provider_batch_of_forty_settles_every_item_once_openai,
    a_provider_batch_of_forty_settles_every_item_once_anthropic,
    cancel_charges_what_the_provider_finished,
    a_cancel_reaches_the_provider_before_the_next_poll,
    a_cancel_after_the_provider_finished_charges_its_results,
    an_unreadable_provider_batch_ends_with_the_unknown_bound,
);

/// The two shapes, as the models the config file routes to them.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Shape {
    OpenAi,
    Anthropic,
}

impl Shape {
    pub(crate) fn model(self) -> &'static str {
        match self {
            Self::OpenAi => "sim-oai",
            Self::Anthropic => "sim-ant",
        }
    }

    /// The provider as `/_mock/batches` names it.
    pub(crate) fn api(self) -> &'static str {
        match self {
            Self::OpenAi => "openai",
            Self::Anthropic => "anthropic",
        }
    }
}

/// Realtime list price per million tokens (input, output) of both models, in
/// credits; their batch price is half of it.
const LIST: (i64, i64) = (1, 2);

/// A config file routing `sim-oai` to the simulator as an OpenAI-compatible provider
/// and `sim-ant` to it as an Anthropic provider, both with batch prices at half.
pub(crate) fn config(folder: &std::path::Path, simulator: &RunningSimulator) -> std::path::PathBuf {
    let path = folder.join("jobledger.toml");
    let text = format!(
        r#"
        [providers.oai]
        kind = "simulator"

        [providers.ant]
        kind = "anthropic"
        base_url = "http://{address}"

        [models."sim-oai"]
        provider = "oai"
        price = {{ input = "{input}", output = "{output}" }}
        batch_price = {{ input = "0.5", output = "1" }}

        [models."sim-ant"]
        provider = "ant"
        price = {{ input = "{input}", output = "{output}" }}
        batch_price = {{ input = "0.5", output = "1" }}
        "#,
        address = simulator.address,
        input = LIST.0,
        output = LIST.1,
    );
    std::fs::write(&path, text).unwrap();
    path
}

/// `reachable` with the simulator's address replaced by one nothing listens on: a
/// process started with it sends nothing to the provider.
pub(crate) fn unreachable_config(
    reachable: &std::path::Path,
    simulator: &RunningSimulator,
) -> std::path::PathBuf {
    let path = reachable.with_file_name("unreachable.toml");
    let text = std::fs::read_to_string(reachable).unwrap();
    std::fs::write(
        &path,
        text.replace(&simulator.address.to_string(), "127.0.0.1:9"),
    )
    .unwrap();
    path
}

/// Polls every `poll`, and gives a batch up as unknown after `unknown_after`.
pub(crate) fn options(
    config: &std::path::Path,
    unknown_after: Duration,
    poll: Duration,
) -> AppOptions {
    AppOptions {
        config_file: Some(config.to_owned()),
        operations: OperationsSettings {
            provider_batches: ProviderBatchSettings {
                poll,
                unknown_after,
                // Short: a lost answer is searched for a second after its create.
                create_grace: Duration::from_secs(1),
                ..ProviderBatchSettings::default()
            },
            ..OperationsSettings::default()
        },
        ..AppOptions::default()
    }
}

pub(crate) struct Setup {
    pub(crate) app: TestApp,
    pub(crate) tenant: TestTenant,
    pub(crate) _folder: tempfile::TempDir,
    pub(crate) config: std::path::PathBuf,
}

/// A provider batch setup that polls every second.
pub(crate) async fn setup(
    backend: Backend,
    batch_delay: Duration,
    unknown_after: Duration,
) -> Setup {
    setup_polling(backend, batch_delay, unknown_after, Duration::from_secs(1)).await
}

async fn setup_polling(
    backend: Backend,
    batch_delay: Duration,
    unknown_after: Duration,
    poll: Duration,
) -> Setup {
    let simulator =
        RunningSimulator::start_with(Simulator::new().with_batch_delay(batch_delay)).await;
    let folder = tempfile::tempdir().unwrap();
    let config = config(folder.path(), &simulator);
    let app = spawn_app_beside(backend, simulator, options(&config, unknown_after, poll)).await;
    let tenant = app.funded_tenant("acme", "100").await;
    Setup {
        app,
        tenant,
        _folder: folder,
        config,
    }
}

pub(crate) async fn create_provider_batch(
    app: &TestApp,
    tenant: &TestTenant,
    shape: Shape,
) -> Uuid {
    let input = json!({"idempotencyKey": format!("pb-{}", shape.model()), "mode": "PROVIDER_BATCH",
        "model": shape.model(), "maxOutputTokens": 50});
    create_batch_of(app, &tenant.key, input).await
}

/// `CreateBatch` with `input`, which must succeed; the batch's id.
pub(crate) async fn create_batch_of(app: &TestApp, key: &str, input: Value) -> Uuid {
    let response = app
        .operation(Some(key), "CreateBatch", json!({"input": input}))
        .await;
    assert!(response["errors"].is_null(), "{response}");
    response["data"]["createBatch"]["batch"]["id"]
        .as_str()
        .unwrap()
        .parse()
        .unwrap()
}

/// `count` items; item 0 is refused by the provider inside the batch, item 1 expires
/// in the first provider batch that holds it, when asked.
pub(crate) fn items(count: usize, faults: bool) -> Vec<Value> {
    (0..count)
        .map(|n| {
            let fault = match n {
                0 if faults => " [mock:status=400]",
                1 if faults => " [mock:batch_expire]",
                _ => "",
            };
            json!({
                "customId": format!("doc-{n}"),
                "messages": [{"role": "user", "content": format!("document {n}: summarise it{fault}")}],
            })
        })
        .collect()
}

pub(crate) async fn mock_batches(app: &TestApp) -> Vec<Value> {
    let url = format!("http://{}/_mock/batches", simulator_address(app));
    reqwest::get(url).await.unwrap().json().await.unwrap()
}

pub(crate) fn simulator_address(app: &TestApp) -> String {
    app.simulator_url()
        .trim_start_matches("http://")
        .trim_end_matches("/v1")
        .to_owned()
}

pub(crate) async fn close(app: &TestApp, tenant: &TestTenant, id: Uuid) {
    let closed = app
        .operation(Some(&tenant.key), "CloseBatch", json!({"id": id}))
        .await;
    assert!(closed["errors"].is_null(), "{closed}");
}

pub(crate) async fn items_of(app: &TestApp, id: Uuid) -> Vec<jobs::Model> {
    jobs::Entity::find()
        .filter(jobs::Column::BatchId.eq(id))
        .all(&app.app.db)
        .await
        .unwrap()
}

pub(crate) async fn attempts_of(app: &TestApp, job_ids: &[Uuid]) -> Vec<attempts::Model> {
    attempts::Entity::find()
        .filter(attempts::Column::JobId.is_in(job_ids.iter().copied()))
        .all(&app.app.db)
        .await
        .unwrap()
}

pub(crate) async fn rows_of(app: &TestApp, id: Uuid) -> Vec<provider_batches::Model> {
    provider_batches::Entity::find()
        .filter(provider_batches::Column::BatchId.eq(id))
        .all(&app.app.db)
        .await
        .unwrap()
}

/// Waits until `done` holds of the batch's provider batch rows (bounded: 30 s).
pub(crate) async fn wait_for_rows(
    app: &TestApp,
    id: Uuid,
    done: impl Fn(&[provider_batches::Model]) -> bool,
) -> Vec<provider_batches::Model> {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let rows = rows_of(app, id).await;
        if done(&rows) {
            return rows;
        }
        assert!(
            Instant::now() < deadline,
            "the rows never got there: {rows:?}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Every item terminal, every hold resolved within what it held, every billed batch
/// request an attempt with its exact cost (and no other attempt billed), every
/// succeeded attempt at half the realtime cost of its usage, every row settled, and
/// the audit clean.
pub(crate) async fn assert_settled_once(
    app: &TestApp,
    id: Uuid,
    shape: Shape,
) -> Vec<attempts::Model> {
    // The items end as their results are settled; their rows end just after.
    wait_for_rows(app, id, |rows| rows.iter().all(|row| row.state.is_final())).await;
    let items = items_of(app, id).await;
    assert!(
        items.iter().all(|item| item.status.is_terminal()),
        "{:?}",
        items.iter().map(|item| item.status).collect::<Vec<_>>()
    );
    let ids: Vec<Uuid> = items.iter().map(|item| item.id).collect();
    let attempts = attempts_of(app, &ids).await;
    assert!(
        attempts
            .iter()
            .all(|attempt| attempt.outcome != AttemptOutcome::Running)
    );
    assert!(
        attempts
            .iter()
            .all(|attempt| attempt.provider_batch_id.is_some())
    );
    let reservations = credit_reservations::Entity::find()
        .filter(credit_reservations::Column::JobId.is_in(ids.iter().copied()))
        .all(&app.app.db)
        .await
        .unwrap();
    assert_eq!(reservations.len(), items.len());
    for hold in &reservations {
        assert_ne!(hold.status, ReservationStatus::Held, "{hold:?}");
        assert!(hold.settled_amount_nanos <= hold.amount_nanos, "{hold:?}");
    }
    // The simulator's billed batch requests are exactly the attempts with a cost.
    let billed: HashSet<String> = app
        .simulator
        .calls()
        .into_iter()
        .filter(|call| call.billed && call.batch_id.is_some())
        .map(|call| call.request_id)
        .collect();
    let with_cost: HashSet<String> = attempts
        .iter()
        .filter(|attempt| attempt.provider_cost_nanos.unwrap_or(0) > 0)
        .map(|attempt| {
            attempt
                .provider_request_id
                .clone()
                .expect("a billed attempt has its request id")
        })
        .collect();
    assert_eq!(billed, with_cost);
    for attempt in attempts
        .iter()
        .filter(|attempt| attempt.outcome == AttemptOutcome::Succeeded)
    {
        let input = attempt.input_tokens.unwrap();
        let output = attempt.output_tokens.unwrap();
        // LIST per million, in nano-credits per token: 1,000 per credit.
        let realtime = input * LIST.0 * 1_000 + output * LIST.1 * 1_000;
        assert_eq!(
            attempt.provider_cost_nanos.unwrap() * 2,
            realtime,
            "{attempt:?}"
        );
        assert!(attempt.customer_charge_nanos.unwrap() > 0);
    }
    let rows = rows_of(app, id).await;
    assert!(!rows.is_empty());
    for row in &rows {
        assert!(row.state.is_final(), "{row:?}");
        // A row has its provider batch, or never made one: abandoned (nothing sent,
        // or an upload too large that went out again smaller), or refused by the
        // provider, which says why.
        assert!(
            row.provider_batch_id.is_some()
                || row.state == ProviderBatchState::Abandoned
                || (row.state == ProviderBatchState::Settled && row.last_error.is_some()),
            "{row:?}"
        );
    }
    let listed = mock_batches(app).await;
    assert!(
        listed
            .iter()
            .all(|listed| listed["provider"] == shape.api()),
        "{listed:?}"
    );
    assert_billing_invariants(&app.app.db).await;
    attempts
}

async fn a_provider_batch_of_forty_settles_every_item_once(backend: Backend, shape: Shape) {
    let Setup { app, tenant, .. } = setup(
        backend,
        Duration::from_millis(300),
        Duration::from_secs(3600),
    )
    .await;
    let id = create_provider_batch(&app, &tenant, shape).await;
    let added = add_items(&app, &tenant, id, &items(40, true)).await;
    assert!(added["errors"].is_null(), "{added}");
    // The submitter looks every second: nothing goes out while the batch is open.
    tokio::time::sleep(Duration::from_millis(2_500)).await;
    assert!(mock_batches(&app).await.is_empty());
    assert!(app.simulator.calls().is_empty());
    assert!(rows_of(&app, id).await.is_empty());
    assert!(
        items_of(&app, id)
            .await
            .iter()
            .all(|item| item.status == JobStatus::Queued)
    );

    close(&app, &tenant, id).await;
    let finished = wait_until_finished(&app, &tenant, id, Duration::from_secs(60)).await;
    assert_eq!(finished["counts"]["succeeded"], 39, "{finished}");
    assert_eq!(finished["counts"]["failed"], 1, "{finished}");
    let attempts = assert_settled_once(&app, id, shape).await;
    let items = items_of(&app, id).await;
    let item = |custom: &str| {
        items
            .iter()
            .find(|item| item.custom_id.as_deref() == Some(custom))
            .unwrap()
    };
    let of = |job: &jobs::Model| {
        let mut mine: Vec<&attempts::Model> = attempts
            .iter()
            .filter(|attempt| attempt.job_id == job.id)
            .collect();
        mine.sort_by_key(|attempt| attempt.number);
        mine
    };
    // The errored request: failed, one attempt, nothing billed.
    let errored = item("doc-0");
    assert_eq!(errored.status, JobStatus::Failed);
    assert_eq!(
        errored.error_code,
        Some(entity::JobErrorCode::ProviderRejected)
    );
    let tried = of(errored);
    assert_eq!(tried.len(), 1);
    assert_eq!(tried[0].provider_cost_nanos, Some(0));
    assert_eq!(tried[0].customer_charge_nanos, Some(0));
    // The expired one: not billed the first time, succeeded in a second provider batch.
    let expired = item("doc-1");
    assert_eq!(expired.status, JobStatus::Succeeded);
    let tried = of(expired);
    assert_eq!(tried.len(), 2, "{tried:?}");
    assert_eq!(tried[0].provider_cost_nanos, Some(0));
    assert_eq!(tried[1].outcome, AttemptOutcome::Succeeded);
    assert_ne!(tried[0].provider_batch_id, tried[1].provider_batch_id);
    assert_eq!(expired.attempt_count, 1, "an expiry spends no attempt");
    assert!(mock_batches(&app).await.len() >= 2);
    let balance = app.balance(&tenant).await;
    assert_eq!(
        crate::helpers::decimal(&balance["held"]),
        rust_decimal::Decimal::ZERO
    );
    assert_eq!(
        crate::helpers::decimal(&balance["charged"]),
        crate::helpers::decimal(&batch(&app, &tenant, id).await["customerCharge"])
    );
}

async fn a_provider_batch_of_forty_settles_every_item_once_openai(backend: Backend) {
    a_provider_batch_of_forty_settles_every_item_once(backend, Shape::OpenAi).await;
}

async fn a_provider_batch_of_forty_settles_every_item_once_anthropic(backend: Backend) {
    a_provider_batch_of_forty_settles_every_item_once(backend, Shape::Anthropic).await;
}

/// `cancelBatch` while the provider batch runs: the provider is asked to cancel, what
/// it had not run comes back cancelled and is released, nothing is left held.
async fn cancel_charges_what_the_provider_finished(backend: Backend) {
    let shape = Shape::Anthropic;
    let Setup { app, tenant, .. } =
        setup(backend, Duration::from_secs(4), Duration::from_secs(3600)).await;
    let id = create_provider_batch(&app, &tenant, shape).await;
    assert!(add_items(&app, &tenant, id, &items(8, false)).await["errors"].is_null());
    close(&app, &tenant, id).await;
    wait_for_rows(&app, id, |rows| {
        rows.iter()
            .any(|row| row.state == ProviderBatchState::Submitted)
    })
    .await;
    let cancelled = app
        .operation(Some(&tenant.key), "CancelBatch", json!({"id": id}))
        .await;
    assert!(cancelled["errors"].is_null(), "{cancelled}");
    let finished = wait_until_finished(&app, &tenant, id, Duration::from_secs(60)).await;
    assert_eq!(finished["counts"]["cancelled"], 8, "{finished}");
    let listed = mock_batches(&app).await;
    assert_eq!(listed.len(), 1);
    assert_eq!(listed[0]["status"], "ended", "{listed:?}");
    let rows = rows_of(&app, id).await;
    assert!(rows[0].cancel_sent);
    let attempts = assert_settled_once(&app, id, shape).await;
    // Recorded as cancelled, not as a wait for another provider batch.
    assert!(
        attempts.iter().all(|attempt| {
            attempt.outcome == AttemptOutcome::Cancelled
                && attempt.error_code == Some(JobErrorCode::Cancelled)
        }),
        "{attempts:?}"
    );
    assert_eq!(
        crate::helpers::decimal(&app.balance(&tenant).await["charged"]),
        rust_decimal::Decimal::ZERO
    );
}

/// With a poll interval longer than the provider takes, a cancel still reaches the
/// provider at once: nothing it finishes after the cancel is charged.
async fn a_cancel_reaches_the_provider_before_the_next_poll(backend: Backend) {
    let shape = Shape::OpenAi;
    let Setup { app, tenant, .. } = setup_polling(
        backend,
        Duration::from_secs(15),
        Duration::from_secs(3600),
        Duration::from_secs(60),
    )
    .await;
    let id = create_provider_batch(&app, &tenant, shape).await;
    assert!(add_items(&app, &tenant, id, &items(8, false)).await["errors"].is_null());
    close(&app, &tenant, id).await;
    wait_for_rows(&app, id, |rows| {
        rows.iter()
            .any(|row| row.state == ProviderBatchState::Submitted)
    })
    .await;
    let cancelled_at = Instant::now();
    let cancelled = app
        .operation(Some(&tenant.key), "CancelBatch", json!({"id": id}))
        .await;
    assert!(cancelled["errors"].is_null(), "{cancelled}");
    wait_for_rows(&app, id, |rows| rows.iter().all(|row| row.cancel_sent)).await;
    assert!(
        cancelled_at.elapsed() < Duration::from_secs(10),
        "the cancel reached the provider {:?} after cancelBatch, before the provider finished (15 s) but not at once",
        cancelled_at.elapsed()
    );
    let finished = wait_until_finished(&app, &tenant, id, Duration::from_secs(90)).await;
    assert_eq!(finished["counts"]["cancelled"], 8, "{finished}");
    assert_settled_once(&app, id, shape).await;
    assert_eq!(
        crate::helpers::decimal(&app.balance(&tenant).await["charged"]),
        rust_decimal::Decimal::ZERO
    );
}

/// A cancel that reaches the provider after its batch completed (OpenAI refuses it,
/// 409): the results are read and charged like any others, not retried for ever.
async fn a_cancel_after_the_provider_finished_charges_its_results(backend: Backend) {
    let shape = Shape::OpenAi;
    let Setup { app, tenant, .. } = setup_polling(
        backend,
        Duration::from_millis(300),
        Duration::from_secs(3600),
        Duration::from_secs(6),
    )
    .await;
    let id = create_provider_batch(&app, &tenant, shape).await;
    assert!(add_items(&app, &tenant, id, &items(8, false)).await["errors"].is_null());
    close(&app, &tenant, id).await;
    wait_for_rows(&app, id, |rows| {
        rows.iter()
            .any(|row| row.state == ProviderBatchState::Submitted)
    })
    .await;
    // The provider finishes long before the next poll.
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    while mock_batches(&app).await[0]["status"] != "completed" {
        assert!(
            std::time::Instant::now() < deadline,
            "{:?}",
            mock_batches(&app).await
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let cancelled = app
        .operation(Some(&tenant.key), "CancelBatch", json!({"id": id}))
        .await;
    assert!(cancelled["errors"].is_null(), "{cancelled}");
    let finished = wait_until_finished(&app, &tenant, id, Duration::from_secs(60)).await;
    assert_eq!(finished["counts"]["succeeded"], 8, "{finished}");
    assert!(rows_of(&app, id).await[0].cancel_sent);
    assert_settled_once(&app, id, shape).await;
    assert!(
        crate::helpers::decimal(&app.balance(&tenant).await["charged"])
            > rust_decimal::Decimal::ZERO
    );
}

/// A provider batch the provider stops answering about (the simulator forgets it)
/// for longer than the bound: its items end with the unknown-outcome bound, within
/// their holds, and are not sent again.
async fn an_unreadable_provider_batch_ends_with_the_unknown_bound(backend: Backend) {
    let shape = Shape::OpenAi;
    let Setup { app, tenant, .. } =
        setup(backend, Duration::from_secs(30), Duration::from_secs(3)).await;
    let id = create_provider_batch(&app, &tenant, shape).await;
    assert!(add_items(&app, &tenant, id, &items(5, false)).await["errors"].is_null());
    close(&app, &tenant, id).await;
    wait_for_rows(&app, id, |rows| {
        rows.iter()
            .any(|row| row.state == ProviderBatchState::Submitted)
    })
    .await;
    // The provider loses the batch: every read of it is a 404 from now on.
    let cleared = reqwest::Client::new()
        .delete(format!("http://{}/_mock/batches", simulator_address(&app)))
        .send()
        .await
        .unwrap();
    assert!(cleared.status().is_success());
    let finished = wait_until_finished(&app, &tenant, id, Duration::from_secs(60)).await;
    assert_eq!(finished["counts"]["failed"], 5, "{finished}");
    let rows = rows_of(&app, id).await;
    assert_eq!(rows.len(), 1);
    assert_eq!(rows[0].state, ProviderBatchState::Unknown);
    let items = items_of(&app, id).await;
    let ids: Vec<Uuid> = items.iter().map(|item| item.id).collect();
    let attempts = attempts_of(&app, &ids).await;
    assert_eq!(attempts.len(), 5, "not sent again");
    for attempt in &attempts {
        assert_eq!(attempt.outcome, AttemptOutcome::Unknown);
        assert!(attempt.provider_cost_nanos.is_none());
        assert!(attempt.provider_cost_upper_bound_nanos.unwrap() > 0);
    }
    for item in &items {
        assert_eq!(item.error_code, Some(entity::JobErrorCode::OutcomeUnknown));
    }
    // The batch carries the bounds, and the audit is clean.
    assert!(
        crate::helpers::decimal(&finished["providerCostUpperBound"]) > rust_decimal::Decimal::ZERO
    );
    assert_billing_invariants(&app.app.db).await;
}
