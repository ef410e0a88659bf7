//! Finding an upload again after its answer was lost, without taking someone else's
//! batch for it. OpenAI's batches carry our id in their metadata; Anthropic's carry
//! nothing of ours before their results do, so a batch found there is a candidate
//! until its results name the row's attempts: never cancelled, never settled as ours,
//! and ruled out — the upload made again — when its results are someone else's.

use crate::batches::{add_items, wait_until_finished};
use crate::helpers::{Backend, RunningSimulator, spawn_app_beside};
use crate::provider_batches::{
    Setup, Shape, assert_settled_once, close, config, create_provider_batch, items, mock_batches,
    options, rows_of, setup, simulator_address, unreachable_config, wait_for_rows,
};
use entity::{ProviderBatchState, provider_batches};
use jobledger::llm::simulator::Simulator;
use sea_orm::{ColumnTrait, EntityTrait, QueryFilter};
use serde_json::{Value, json};
use std::time::Duration;
use uuid::Uuid;

on_both_backends!(
    a_lost_upload_answer_is_found_again_not_sent_twice_openai,
    a_lost_upload_answer_is_found_again_not_sent_twice_anthropic,
    a_lost_upload_is_told_from_a_foreign_batch_by_its_requests,
    a_foreign_batch_of_the_same_size_is_not_taken_for_a_lost_upload,
    a_cancel_never_reaches_a_batch_not_known_to_be_ours,
    two_batches_of_the_same_size_are_told_apart_by_their_results,
);

/// The process stops after the provider took the batch, and before the answer was
/// recorded (the row is put back to `uploading` without the provider's id, as a
/// crash between the two leaves it): the next process finds the upload at the
/// provider and settles it, and the provider holds one batch for those items.
///
/// `someone` else may use the key at the same time ([`Someone`]).
async fn a_lost_upload_answer_is_found_again_not_sent_twice(
    backend: Backend,
    shape: Shape,
    someone: Someone,
) {
    let Setup {
        app,
        tenant,
        config,
        _folder,
    } = setup(backend, Duration::from_secs(3), Duration::from_secs(3600)).await;
    let id = create_provider_batch(&app, &tenant, shape).await;
    assert!(add_items(&app, &tenant, id, &items(10, false)).await["errors"].is_null());
    let simulator = simulator_address(&app);
    let earlier = match someone {
        Someone::SameSizeJustBefore => Some(foreign_batch(&simulator, 10).await),
        _ => None,
    };
    close(&app, &tenant, id).await;
    let rows = wait_for_rows(&app, id, |rows| {
        rows.iter()
            .any(|row| row.state == ProviderBatchState::Submitted)
    })
    .await;
    let row = rows[0].clone();
    let db = app.app.db.clone();
    let lost = async move {
        if someone == Someone::SmallerAtOnce {
            foreign_batch(&simulator, 1).await;
        }
        left_uploading(&db, row.id, None).await;
    };
    let app = app
        .restart_after(
            options(&config, Duration::from_secs(3600), Duration::from_secs(1)),
            lost,
        )
        .await;
    let finished = wait_until_finished(&app, &tenant, id, Duration::from_secs(60)).await;
    assert_eq!(finished["counts"]["succeeded"], 10, "{finished}");
    let listed: Vec<Value> = mock_batches(&app)
        .await
        .into_iter()
        .filter(|listed| listed["requests"] == 10 && listed["id"].as_str() != earlier.as_deref())
        .collect();
    assert_eq!(
        listed.len(),
        1,
        "one provider batch for the items: {listed:?}"
    );
    let rows = rows_of(&app, id).await;
    assert_eq!(rows.len(), 1);
    assert_eq!(
        rows[0].provider_batch_id.as_deref(),
        listed[0]["id"].as_str()
    );
    if let Some(earlier) = earlier {
        // Taken first (the older of two alike), and ruled out by its results.
        assert_eq!(rows[0].ruled_out, Some(format!("[\"{earlier}\"]")));
    }
    let attempts = assert_settled_once(&app, id, shape).await;
    assert_eq!(attempts.len(), 10, "each item billed once");
}

/// Who else creates batches with the key while an upload's answer is lost.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Someone {
    Nobody,
    /// A batch of one request, at the same time: told apart by its size.
    SmallerAtOnce,
    /// A batch of as many requests, just before the upload: the older candidate,
    /// which its results rule out.
    SameSizeJustBefore,
}

async fn a_lost_upload_answer_is_found_again_not_sent_twice_openai(backend: Backend) {
    a_lost_upload_answer_is_found_again_not_sent_twice(backend, Shape::OpenAi, Someone::Nobody)
        .await;
}

async fn a_lost_upload_answer_is_found_again_not_sent_twice_anthropic(backend: Backend) {
    let shape = Shape::Anthropic;
    a_lost_upload_answer_is_found_again_not_sent_twice(backend, shape, Someone::Nobody).await;
}

async fn a_lost_upload_is_told_from_a_foreign_batch_by_its_requests(backend: Backend) {
    let shape = Shape::Anthropic;
    a_lost_upload_answer_is_found_again_not_sent_twice(backend, shape, Someone::SmallerAtOnce)
        .await;
}

async fn two_batches_of_the_same_size_are_told_apart_by_their_results(backend: Backend) {
    let shape = Shape::Anthropic;
    let someone = Someone::SameSizeJustBefore;
    a_lost_upload_answer_is_found_again_not_sent_twice(backend, shape, someone).await;
}

/// Leaves the row `uploading` with no provider batch recorded and no owner, as a
/// process that died between its create and recording the answer leaves it; with
/// `uploading_at`, as if the create went out then.
async fn left_uploading(
    db: &sea_orm::DatabaseConnection,
    id: Uuid,
    uploading_at: Option<entity::Timestamp>,
) {
    use sea_orm::sea_query::Expr;
    let mut update = provider_batches::Entity::update_many()
        .col_expr(
            provider_batches::Column::State,
            Expr::value(ProviderBatchState::Uploading),
        )
        .col_expr(
            provider_batches::Column::ProviderBatchId,
            Expr::value(Option::<String>::None),
        )
        .col_expr(
            provider_batches::Column::InputFileId,
            Expr::value(Option::<String>::None),
        )
        .col_expr(
            provider_batches::Column::RunToken,
            Expr::value(Option::<Uuid>::None),
        )
        .col_expr(
            provider_batches::Column::LeaseUntil,
            Expr::value(Option::<entity::Timestamp>::None),
        );
    if let Some(at) = uploading_at {
        update = update.col_expr(provider_batches::Column::UploadingAt, Expr::value(at));
    }
    update
        .filter(provider_batches::Column::Id.eq(id))
        .exec(db)
        .await
        .unwrap();
}

/// Someone else's message batch of `requests` requests, each refused by the provider
/// (so nothing of it is billed); its id.
async fn foreign_batch(simulator: &str, requests: usize) -> String {
    let requests: Vec<Value> = (0..requests)
        .map(|n| {
            json!({"custom_id": format!("someone-else-{n}"),
            "params": {"model": "claude-haiku-4-5", "max_tokens": 5,
                "messages": [{"role": "user", "content": "not ours [mock:status=400]"}]}})
        })
        .collect();
    let created: Value = reqwest::Client::new()
        .post(format!("http://{simulator}/v1/messages/batches"))
        .json(&json!({ "requests": requests }))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    created["id"].as_str().unwrap().to_owned()
}

/// The upload's create never reached the provider, and its answer was lost (the row
/// is left `uploading`, as a crash after sending leaves it) while someone else using
/// the key created a batch of as many requests. The search finds that batch; its
/// results, naming none of the row's attempts, rule it out, and the upload is made
/// again: the row ends with its own batch, every item billed once.
///
/// With `cancel`, the tenant cancels while the foreign batch is the row's candidate:
/// it is not cancelled at the provider, and the items end cancelled, nothing charged.
async fn a_foreign_batch_of_the_same_size(backend: Backend, cancel: bool) {
    let simulator =
        RunningSimulator::start_with(Simulator::new().with_batch_delay(Duration::from_secs(3)))
            .await;
    let folder = tempfile::tempdir().unwrap();
    let reachable = config(folder.path(), &simulator);
    // The first process reaches no provider: its creates are never sent.
    let unreachable = unreachable_config(&reachable, &simulator);
    let poll = Duration::from_secs(1);
    let hour = Duration::from_secs(3600);
    let app = spawn_app_beside(backend, simulator, options(&unreachable, hour, poll)).await;
    let tenant = app.funded_tenant("acme", "100").await;
    let shape = Shape::Anthropic;
    let id = create_provider_batch(&app, &tenant, shape).await;
    assert!(add_items(&app, &tenant, id, &items(10, false)).await["errors"].is_null());
    close(&app, &tenant, id).await;
    let row = wait_for_rows(&app, id, |rows| {
        rows.iter()
            .any(|row| row.state == ProviderBatchState::Preparing && row.last_error.is_some())
    })
    .await[0]
        .clone();
    let db = app.app.db.clone();
    let address = simulator_address(&app);
    let foreign = std::sync::Arc::new(std::sync::Mutex::new(String::new()));
    let lost = {
        let foreign = foreign.clone();
        let address = address.clone();
        async move {
            *foreign.lock().unwrap() = foreign_batch(&address, 10).await;
            // As if its create had just been sent and its answer lost.
            left_uploading(&db, row.id, Some(entity::Timestamp::now())).await;
        }
    };
    let app = app
        .restart_after(options(&reachable, hour, poll), lost)
        .await;
    let foreign = foreign.lock().unwrap().clone();
    if cancel {
        // The foreign batch is the row's candidate: the cancel cannot be sent to it.
        wait_for_rows(&app, id, |rows| {
            rows.iter()
                .any(|row| row.provider_batch_id.as_deref() == Some(foreign.as_str()))
        })
        .await;
        let cancelled = app
            .operation(Some(&tenant.key), "CancelBatch", json!({"id": id}))
            .await;
        assert!(cancelled["errors"].is_null(), "{cancelled}");
    }
    let finished = wait_until_finished(&app, &tenant, id, Duration::from_secs(60)).await;
    let read: Value = reqwest::Client::new()
        .get(format!("http://{address}/v1/messages/batches/{foreign}"))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(read["processing_status"], "ended", "{read}");
    assert!(
        read["cancel_initiated_at"].is_null(),
        "someone else's batch was cancelled: {read}"
    );
    assert_eq!(read["request_counts"]["errored"], 10, "{read}");
    let rows = rows_of(&app, id).await;
    assert_eq!(rows.len(), 1, "the items stayed in their row: {rows:?}");
    let row = &rows[0];
    assert_eq!(
        row.ruled_out.as_deref(),
        Some(format!("[\"{foreign}\"]").as_str())
    );
    let ours: Vec<Value> = mock_batches(&app)
        .await
        .into_iter()
        .filter(|listed| listed["id"] != foreign.as_str())
        .collect();
    if cancel {
        assert_eq!(finished["counts"]["cancelled"], 10, "{finished}");
        assert_eq!(row.state, ProviderBatchState::Abandoned, "{row:?}");
        assert_eq!(row.provider_batch_id, None, "{row:?}");
        assert!(
            ours.is_empty(),
            "nothing was uploaded for a cancelled batch: {ours:?}"
        );
        assert_eq!(
            crate::helpers::decimal(&app.balance(&tenant).await["charged"]),
            rust_decimal::Decimal::ZERO
        );
    } else {
        assert_eq!(finished["counts"]["succeeded"], 10, "{finished}");
        assert_eq!(ours.len(), 1, "one upload of the items: {ours:?}");
        assert_eq!(row.provider_batch_id.as_deref(), ours[0]["id"].as_str());
        assert!(row.attributed, "{row:?}");
        assert_eq!(row.state, ProviderBatchState::Settled);
    }
    let attempts = assert_settled_once(&app, id, shape).await;
    assert_eq!(attempts.len(), 10, "one attempt an item");
}

async fn a_foreign_batch_of_the_same_size_is_not_taken_for_a_lost_upload(backend: Backend) {
    a_foreign_batch_of_the_same_size(backend, false).await;
}

async fn a_cancel_never_reaches_a_batch_not_known_to_be_ours(backend: Backend) {
    a_foreign_batch_of_the_same_size(backend, true).await;
}
