//! What a PROVIDER_BATCH batch's page reads beyond the contract: its uploads to the
//! provider's batch API (`Batch.providerBatches`) and its answers against the
//! realtime price (`Batch.realtimeComparison`), run through the simulator's batch API.

use crate::batches::add_items;
use crate::batches::wait_until_finished;
use crate::helpers::Backend;
use crate::provider_batches::{
    Setup, Shape, attempts_of, close, create_provider_batch, items, items_of, rows_of, setup,
};
use entity::{AttemptOutcome, attempts};
use sea_orm::EntityTrait;
use serde_json::{Value, json};
use std::time::Duration;
use uuid::Uuid;

on_both_backends!(a_provider_batch_shows_its_uploads_and_its_saving);

const BATCH_VIEW: &str = "query BatchView($id: UUID!) {
  batch(id: $id) {
    mode customerCharge
    providerBatches { id provider model state providerBatchId itemCount costBound outcomes { outcome count } }
    realtimeComparison { answers charged atRealtimePrice saving }
  }
}";

/// `Batch.providerBatches` are the batch's `provider_batches` rows with their
/// attempts by outcome, and `Batch.realtimeComparison` prices the accepted answers'
/// usage at the customer's realtime rates (read here from the price row itself):
/// about twice what the batch price charged. A REALTIME batch has neither.
async fn a_provider_batch_shows_its_uploads_and_its_saving(backend: Backend) {
    let shape = Shape::OpenAi;
    let Setup { app, tenant, .. } = setup(
        backend,
        Duration::from_millis(300),
        Duration::from_secs(3600),
    )
    .await;
    let id = create_provider_batch(&app, &tenant, shape).await;
    assert!(add_items(&app, &tenant, id, &items(12, true)).await["errors"].is_null());
    let view = |id: Uuid| {
        let app = &app;
        let key = tenant.key.clone();
        async move {
            let response = app.graphql(Some(&key), BATCH_VIEW, json!({"id": id})).await;
            assert!(response["errors"].is_null(), "{response}");
            response["data"]["batch"].clone()
        }
    };
    let open = view(id).await;
    assert_eq!(open["mode"], "PROVIDER_BATCH");
    assert_eq!(
        open["providerBatches"],
        json!([]),
        "nothing sent while open"
    );
    close(&app, &tenant, id).await;
    wait_until_finished(&app, &tenant, id, Duration::from_secs(60)).await;
    // The items end as their results are settled; their row ends just after.
    crate::provider_batches::wait_for_rows(&app, id, |rows| {
        rows.iter().all(|row| row.state.is_final())
    })
    .await;
    let seen = view(id).await;

    // One entry per row, in order, each with its attempts by outcome.
    let mut rows = rows_of(&app, id).await;
    rows.sort_by_key(|row| row.id);
    assert!(
        rows.len() >= 2,
        "the expired request went out again: {rows:?}"
    );
    let shown = seen["providerBatches"].as_array().unwrap();
    assert_eq!(shown.len(), rows.len(), "{seen}");
    let items = items_of(&app, id).await;
    let ids: Vec<Uuid> = items.iter().map(|item| item.id).collect();
    let attempts = attempts_of(&app, &ids).await;
    for (row, shown) in rows.iter().zip(shown) {
        assert_eq!(shown["id"], row.id.to_string());
        assert_eq!(shown["state"], "SETTLED", "{shown}");
        assert_eq!(shown["provider"], row.provider.as_str());
        assert_eq!(shown["model"], shape.model());
        assert_eq!(
            shown["providerBatchId"].as_str(),
            row.provider_batch_id.as_deref()
        );
        assert_eq!(shown["itemCount"], row.item_count);
        assert_eq!(
            crate::helpers::decimal(&shown["costBound"]),
            jobledger::billing::Credits::from_nanos(row.cost_bound_nanos).to_decimal()
        );
        let mine: Vec<&attempts::Model> = attempts
            .iter()
            .filter(|attempt| attempt.provider_batch_id == Some(row.id))
            .collect();
        let counted: i64 = shown["outcomes"]
            .as_array()
            .unwrap()
            .iter()
            .map(|outcome| outcome["count"].as_i64().unwrap())
            .sum();
        assert_eq!(counted, mine.len() as i64, "{shown}");
        let succeeded = mine
            .iter()
            .filter(|attempt| attempt.outcome == AttemptOutcome::Succeeded)
            .count() as i64;
        let shown_succeeded = shown["outcomes"]
            .as_array()
            .unwrap()
            .iter()
            .find(|outcome| outcome["outcome"] == "SUCCEEDED")
            .map_or(0, |outcome| outcome["count"].as_i64().unwrap());
        assert_eq!(shown_succeeded, succeeded, "{shown}");
    }

    // The saving: the answers' usage at the realtime customer rates of their price row.
    let answers: Vec<&attempts::Model> = attempts
        .iter()
        .filter(|attempt| attempt.outcome == AttemptOutcome::Succeeded)
        .collect();
    assert_eq!(answers.len(), 11, "every item but the refused one answered");
    let price = entity::model_prices::Entity::find_by_id(answers[0].model_price_id)
        .one(&app.app.db)
        .await
        .unwrap()
        .unwrap();
    assert!(
        answers
            .iter()
            .all(|attempt| attempt.model_price_id == price.id)
    );
    let total = |tokens: fn(&attempts::Model) -> i64| -> i128 {
        answers
            .iter()
            .map(|attempt| i128::from(tokens(attempt)))
            .sum()
    };
    let cost =
        |tokens: i128, rate: i64| (tokens * i128::from(rate) + 999_999).div_euclid(1_000_000);
    let cached = total(|attempt| attempt.cached_input_tokens.unwrap_or(0));
    let realtime = cost(
        total(|attempt| attempt.input_tokens.unwrap()) - cached,
        price.customer_input_nanos_per_million,
    ) + cost(cached, price.customer_cached_input_nanos_per_million)
        + cost(
            total(|attempt| attempt.output_tokens.unwrap()),
            price.customer_output_nanos_per_million,
        );
    let charged: i128 = answers
        .iter()
        .map(|attempt| i128::from(attempt.customer_charge_nanos.unwrap()))
        .sum();
    let nanos = |value: &Value| {
        let credits = crate::helpers::decimal(value) * rust_decimal::Decimal::from(1_000_000_000);
        credits.mantissa() / 10_i128.pow(credits.scale())
    };
    let comparison = &seen["realtimeComparison"];
    assert_eq!(comparison["answers"], 11, "{comparison}");
    assert_eq!(nanos(&comparison["charged"]), charged, "{comparison}");
    assert_eq!(
        crate::helpers::decimal(&comparison["charged"]),
        crate::helpers::decimal(&seen["customerCharge"]),
        "the refused and the expired requests were charged nothing"
    );
    assert_eq!(
        nanos(&comparison["atRealtimePrice"]),
        realtime,
        "{comparison}"
    );
    assert_eq!(
        nanos(&comparison["saving"]),
        realtime - charged,
        "{comparison}"
    );
    // Half price: the realtime charge is twice the batch charge, within rounding.
    assert!(
        (realtime - 2 * charged).abs() <= 100,
        "realtime {realtime}, charged {charged}"
    );

    let realtime_batch = app
        .operation(
            Some(&tenant.key),
            "CreateBatch",
            json!({"input": {"idempotencyKey": "rt", "model": shape.model(), "maxOutputTokens": 10}}),
        )
        .await;
    let realtime_id: Uuid = realtime_batch["data"]["createBatch"]["batch"]["id"]
        .as_str()
        .unwrap()
        .parse()
        .unwrap();
    let realtime_view = view(realtime_id).await;
    assert_eq!(realtime_view["mode"], "REALTIME");
    assert_eq!(realtime_view["providerBatches"], json!([]));
    assert!(realtime_view["realtimeComparison"].is_null());
}
