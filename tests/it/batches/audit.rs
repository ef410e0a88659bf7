//! One corruption per batch invariant: a batch row whose counts or money no longer
//! match its items is named by exactly that invariant.

use super::{add_items, create_batch, items};
use crate::audit::assert_only_violated;
use crate::helpers::{AppOptions, Backend, TestApp, spawn_app_with};
use crate::invariants::assert_billing_invariants;
use entity::batches;
use jobledger::billing::audit::{Invariant, Subject};
use sea_orm::sea_query::Expr;
use sea_orm::{ColumnTrait, EntityTrait, QueryFilter};
use uuid::Uuid;

on_both_backends!(
    a_miscounted_batch_breaks_batch_counts_match_items,
    a_batch_reserving_more_than_its_items_breaks_batch_reserved_matches_items,
    a_batch_cost_off_its_attempts_breaks_batch_provider_cost_matches_items,
    a_batch_bound_off_its_attempts_breaks_batch_cost_bound_matches_items,
    a_batch_charge_off_its_items_breaks_batch_charge_matches_items,
);

/// A batch of a few items whose jobs ran to the end, so every sum is non-zero.
async fn finished_batch(backend: Backend) -> (TestApp, Uuid) {
    let app = spawn_app_with(backend, AppOptions::default()).await;
    let tenant = app.funded_tenant("acme", "10").await;
    let id = create_batch(&app, &tenant, "b").await;
    assert!(add_items(&app, &tenant, id, &items("d", 0, 5)).await["errors"].is_null());
    let closed = app
        .operation(
            Some(&tenant.key),
            "CloseBatch",
            serde_json::json!({"id": id}),
        )
        .await;
    assert!(closed["errors"].is_null(), "{closed}");
    super::wait_until_finished(&app, &tenant, id, std::time::Duration::from_secs(60)).await;
    assert_billing_invariants(&app.app.db).await;
    (app, id)
}

async fn bump(app: &TestApp, id: Uuid, column: batches::Column, by: i64) {
    // Not imported at the top: in scope, its `is_null` shadows `serde_json::Value::is_null`.
    use sea_orm::sea_query::ExprTrait as _;
    batches::Entity::update_many()
        .col_expr(column, Expr::col(column).add(by))
        .filter(batches::Column::Id.eq(id))
        .exec(&app.app.db)
        .await
        .unwrap();
}

async fn a_miscounted_batch_breaks_batch_counts_match_items(backend: Backend) {
    let (app, id) = finished_batch(backend).await;
    bump(&app, id, batches::Column::Succeeded, -1).await;
    bump(&app, id, batches::Column::Failed, 1).await;
    assert_only_violated(&app, Invariant::BatchCountsMatchItems, Subject::Batch(id)).await;
}

async fn a_batch_reserving_more_than_its_items_breaks_batch_reserved_matches_items(
    backend: Backend,
) {
    let (app, id) = finished_batch(backend).await;
    bump(&app, id, batches::Column::ReservedNanos, 1).await;
    assert_only_violated(
        &app,
        Invariant::BatchReservedMatchesItems,
        Subject::Batch(id),
    )
    .await;
}

async fn a_batch_cost_off_its_attempts_breaks_batch_provider_cost_matches_items(backend: Backend) {
    let (app, id) = finished_batch(backend).await;
    bump(&app, id, batches::Column::ProviderCostNanos, -1).await;
    assert_only_violated(
        &app,
        Invariant::BatchProviderCostMatchesItems,
        Subject::Batch(id),
    )
    .await;
}

async fn a_batch_bound_off_its_attempts_breaks_batch_cost_bound_matches_items(backend: Backend) {
    let (app, id) = finished_batch(backend).await;
    bump(&app, id, batches::Column::UnknownBoundNanos, 1).await;
    assert_only_violated(
        &app,
        Invariant::BatchCostBoundMatchesItems,
        Subject::Batch(id),
    )
    .await;
}

async fn a_batch_charge_off_its_items_breaks_batch_charge_matches_items(backend: Backend) {
    let (app, id) = finished_batch(backend).await;
    bump(&app, id, batches::Column::CustomerChargeNanos, 7).await;
    assert_only_violated(&app, Invariant::BatchChargeMatchesItems, Subject::Batch(id)).await;
}
