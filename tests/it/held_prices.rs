//! A job keeps the price it was held at: a price changed between its create and its
//! start charges the customer what it was quoted, and bills the provider cost at the
//! price in force when the call ran — the operator absorbs a rise, keeps a fall.

use crate::helpers::{
    AppOptions, Backend, TestApp, TestTenant, decimal, job_input, spawn_app_with,
    test_worker_settings,
};
use crate::invariants::assert_billing_invariants;
use entity::{AttemptOutcome, PriceOrigin, Timestamp, attempts, jobs};
use jobledger::billing::Credits;
use jobledger::billing::prices::{
    self, BatchPrice, BatchRates, ConfiguredPrice, ModelPrice, PricePerMillion, Rates,
};
use jobledger::llm::TokenUsage;
use rust_decimal::Decimal;
use sea_orm::{ActiveValue::Set, ColumnTrait, EntityTrait, QueryFilter, QueryOrder};
use serde_json::{Value, json};
use std::time::Duration;
use uuid::Uuid;

on_both_backends!(
    a_price_raised_before_the_start_charges_the_held_price,
    a_price_lowered_before_the_start_charges_the_held_price,
    a_job_without_held_prices_says_its_hold_does_not_cover_the_call,
    provider_batch_items_keep_the_batch_price_they_were_held_at,
);

const MODEL: &str = "gpt-4o-mini";
const LIMIT: Duration = Duration::from_secs(20);

/// `rates` times `numerator / denominator`.
fn scaled(rates: Rates, numerator: i64, denominator: i64) -> Rates {
    let rate = |rate: PricePerMillion| {
        PricePerMillion(Credits::from_nanos(
            rate.0.nanos() * numerator / denominator,
        ))
    };
    Rates {
        input: rate(rates.input),
        cached_input: rate(rates.cached_input),
        output: rate(rates.output),
    }
}

/// Stores a new version of the model's price at `numerator / denominator` times the
/// one in force, as an imported price map would (a restart's built-in prices do not
/// replace it); returns the version in force before and the new one.
async fn change_price(app: &TestApp, numerator: i64, denominator: i64) -> (ModelPrice, ModelPrice) {
    change_price_of(app, MODEL, PriceOrigin::Import, numerator, denominator).await
}

/// [`change_price`] of `model`, batch price included, stored as from `origin`.
async fn change_price_of(
    app: &TestApp,
    model: &str,
    origin: PriceOrigin,
    numerator: i64,
    denominator: i64,
) -> (ModelPrice, ModelPrice) {
    let db = &app.app.db;
    let before = prices::price_at(db, model, Timestamp::now())
        .await
        .unwrap()
        .unwrap();
    let batch = |rates: BatchRates| {
        let scaled = scaled(
            Rates {
                input: rates.input,
                cached_input: rates.input,
                output: rates.output,
            },
            numerator,
            denominator,
        );
        BatchRates {
            input: scaled.input,
            output: scaled.output,
        }
    };
    let changed = ConfiguredPrice {
        model: model.to_owned(),
        provider: scaled(before.provider, numerator, denominator),
        customer: scaled(before.customer, numerator, denominator),
        batch: before.batch.map(|price| BatchPrice {
            provider: batch(price.provider),
            customer: batch(price.customer),
        }),
        limits: before.limits,
        source: "a changed price".to_owned(),
        origin,
        family: None,
    };
    let stored = prices::store_price(db, &changed, Timestamp::now())
        .await
        .unwrap();
    assert!(
        matches!(stored, prices::Stored::NewVersion(_)),
        "{stored:?}"
    );
    let after = prices::price_at(db, model, Timestamp::now())
        .await
        .unwrap()
        .unwrap();
    assert_ne!(after.id, before.id);
    (before, after)
}

/// A job created while no worker runs, so that its price can change before it starts.
/// `fallbacks`: its `fallbackModels`.
async fn queued_job(
    backend: Backend,
    key: &str,
    fallbacks: &[&str],
) -> (TestApp, TestTenant, Uuid) {
    let app = spawn_app_with(backend, AppOptions::no_workers()).await;
    let tenant = app.funded_tenant("quoted", "5").await;
    let mut input = job_input(key, "what does it cost?");
    input["maxAttempts"] = json!(3);
    if !fallbacks.is_empty() {
        input["fallbackModels"] = json!(fallbacks);
    }
    let id = app.create_job_ok(&tenant, input).await;
    (app, tenant, id)
}

async fn stored_job(app: &TestApp, id: Uuid) -> jobs::Model {
    jobs::Entity::find_by_id(id)
        .one(&app.app.db)
        .await
        .unwrap()
        .unwrap()
}

async fn stored_attempts(app: &TestApp, id: Uuid) -> Vec<attempts::Model> {
    attempts::Entity::find()
        .filter(attempts::Column::JobId.eq(id))
        .order_by_asc(attempts::Column::Number)
        .all(&app.app.db)
        .await
        .unwrap()
}

fn usage_of(attempt: &attempts::Model) -> TokenUsage {
    TokenUsage {
        input_tokens: attempt.input_tokens.unwrap() as u64,
        cached_input_tokens: attempt.cached_input_tokens.unwrap_or(0) as u64,
        output_tokens: attempt.output_tokens.unwrap() as u64,
    }
}

/// Runs the queued job to its end with workers, and checks that it succeeded in one
/// call charged at `held` and billed at `in_force`, within its hold, the audit clean.
async fn runs_at(
    app: TestApp,
    tenant: &TestTenant,
    id: Uuid,
    held: &ModelPrice,
    in_force: &ModelPrice,
) -> (TestApp, Value) {
    let app = app
        .restart(AppOptions::workers(test_worker_settings()))
        .await;
    let job = app.wait_until_finished(tenant, id, LIMIT).await;
    assert_eq!(job["status"], "SUCCEEDED", "{job}");
    let [attempt] = <[_; 1]>::try_from(stored_attempts(&app, id).await).unwrap();
    let usage = usage_of(&attempt);
    assert_eq!(
        attempt.model_price_id, in_force.id,
        "billed at the price in force"
    );
    assert_eq!(
        attempt.customer_price_id,
        Some(held.id),
        "charged at the held one"
    );
    assert_eq!(
        attempt.provider_cost_nanos,
        Some(in_force.provider_cost(&usage).nanos()),
        "the provider bills the price in force"
    );
    let charge = held.customer_charge(&usage);
    assert_eq!(attempt.customer_charge_nanos, Some(charge.nanos()));
    assert_eq!(
        decimal(&job["charge"]["amount"]),
        Decimal::new(charge.nanos(), 9),
        "{job}"
    );
    assert!(
        decimal(&job["charge"]["amount"]) <= decimal(&job["reservation"]["amount"]),
        "{job}"
    );
    assert_billing_invariants(&app.app.db).await;
    (app, job)
}

/// The attack of #24 M2: an admin raises the price between a job's create and its
/// start. The first call's customer bound at the new price is three times the hold;
/// the job still makes its call, charged at the price it was quoted.
async fn a_price_raised_before_the_start_charges_the_held_price(backend: Backend) {
    // Without fallbacks: the hold is one call of this model at its price.
    let (app, tenant, id) = queued_job(backend, "raised", &[]).await;
    let (held, raised) = change_price(&app, 3, 1).await;
    runs_at(app, &tenant, id, &held, &raised).await;
}

/// A price lowered before the start: the customer still pays what it was quoted
/// (never more), the provider cost is the lower price's.
async fn a_price_lowered_before_the_start_charges_the_held_price(backend: Backend) {
    let (app, tenant, id) = queued_job(backend, "lowered", &["gpt-4o"]).await;
    // Each model of the chain keeps the version it was quoted at.
    let fallback = prices::price_at(&app.app.db, "gpt-4o", Timestamp::now())
        .await
        .unwrap()
        .unwrap();
    let (held, lowered) = change_price(&app, 1, 2).await;
    assert_eq!(
        stored_job(&app, id).await.held_prices.map(|held| held.0),
        Some(json!({MODEL: held.id, "gpt-4o": fallback.id})),
    );
    let (app, job) = runs_at(app, &tenant, id, &held, &lowered).await;
    let [attempt] = <[_; 1]>::try_from(stored_attempts(&app, id).await).unwrap();
    assert!(
        lowered.customer_charge(&usage_of(&attempt)) < decimal_nanos(&job["charge"]["amount"]),
        "charged the quote, not the new price: {job}"
    );
}

fn decimal_nanos(value: &Value) -> Credits {
    Credits::from_decimal(decimal(value)).unwrap()
}

/// A job that holds no versions (one created before they were recorded) runs at the
/// price in force, as it always did: after a rise its call does not fit in its hold
/// and is not made — and the message says that, not that it made too many calls.
async fn a_job_without_held_prices_says_its_hold_does_not_cover_the_call(backend: Backend) {
    let (app, tenant, id) = queued_job(backend, "unheld", &[]).await;
    jobs::Entity::update(jobs::ActiveModel {
        id: Set(id),
        held_prices: Set(None),
        ..Default::default()
    })
    .exec(&app.app.db)
    .await
    .unwrap();
    change_price(&app, 3, 1).await;
    let app = app
        .restart(AppOptions::workers(test_worker_settings()))
        .await;
    let job = app.wait_until_finished(&tenant, id, LIMIT).await;
    assert_eq!(job["status"], "FAILED", "{job}");
    assert_eq!(job["error"]["code"], "PAID_CALL_LIMIT", "{job}");
    let message = job["error"]["message"].as_str().unwrap();
    assert!(
        message.contains("hold does not cover") && !message.contains("as many"),
        "{message}"
    );
    assert_eq!(app.billed_calls(), 0, "no call was made");
    assert_billing_invariants(&app.app.db).await;
}

/// A PROVIDER_BATCH item is held at the batch price when it is added: a price raised
/// (batch price too) before the batch goes out charges every answer at the batch
/// price it was held at and bills it at the one in force; the realtime comparison
/// prices the answers at the realtime rates of the version they were charged at.
async fn provider_batch_items_keep_the_batch_price_they_were_held_at(backend: Backend) {
    use crate::provider_batches::{Shape, close, create_provider_batch, items, items_of, setup};
    let shape = Shape::OpenAi;
    let setup = setup(
        backend,
        Duration::from_millis(300),
        Duration::from_secs(3600),
    )
    .await;
    let (app, tenant) = (&setup.app, &setup.tenant);
    let id = create_provider_batch(app, tenant, shape).await;
    let added = crate::batches::add_items(app, tenant, id, &items(4, false)).await;
    assert!(added["errors"].is_null(), "{added}");
    // The config file prices the model: its own origin replaces it.
    let (held, raised) = change_price_of(app, shape.model(), PriceOrigin::Config, 3, 1).await;
    close(app, tenant, id).await;
    let finished =
        crate::batches::wait_until_finished(app, tenant, id, Duration::from_secs(60)).await;
    assert_eq!(finished["counts"]["succeeded"], 4, "{finished}");
    let item_ids: Vec<Uuid> = items_of(app, id).await.iter().map(|item| item.id).collect();
    let answers = crate::provider_batches::attempts_of(app, &item_ids).await;
    let (held_batch, raised_batch) = (held.batch_view().unwrap(), raised.batch_view().unwrap());
    let mut total = TokenUsage::default();
    for attempt in answers
        .iter()
        .filter(|attempt| attempt.outcome == AttemptOutcome::Succeeded)
    {
        let usage = usage_of(attempt);
        assert_eq!(attempt.model_price_id, raised.id);
        assert_eq!(attempt.customer_price_id, Some(held.id));
        assert_eq!(
            attempt.provider_cost_nanos,
            Some(raised_batch.provider_cost(&usage).nanos())
        );
        assert_eq!(
            attempt.customer_charge_nanos,
            Some(held_batch.customer_charge(&usage).nanos())
        );
        total.input_tokens += usage.input_tokens;
        total.cached_input_tokens += usage.cached_input_tokens;
        total.output_tokens += usage.output_tokens;
    }
    let response = app
        .graphql(
            Some(&tenant.key),
            "query($id: UUID!) { batch(id: $id) { realtimeComparison { answers atRealtimePrice } } }",
            json!({"id": id}),
        )
        .await;
    assert!(response["errors"].is_null(), "{response}");
    let comparison = &response["data"]["batch"]["realtimeComparison"];
    assert_eq!(comparison["answers"], 4, "{comparison}");
    assert_eq!(
        decimal(&comparison["atRealtimePrice"]),
        held.customer_charge(&total).to_decimal(),
        "{comparison}"
    );
    assert_billing_invariants(&app.app.db).await;
}
