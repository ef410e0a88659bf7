//! What keeps a provider batch's items safe while they wait, and what an operator
//! sees of them: a lapsed item lease is not taken back while its provider batch still
//! runs (that would send the item twice), and `/metrics` shows the provider batches
//! by state, the items waiting and how long they have waited.

use crate::batches::{add_items, wait_until_finished};
use crate::helpers::Backend;
use crate::operations::{sample, scrape, scrape_settled};
use crate::provider_batches::{
    Setup, Shape, assert_settled_once, close, create_provider_batch, items, items_of, mock_batches,
    rows_of, setup, wait_for_rows,
};
use entity::{AttemptOutcome, JobStatus, ProviderBatchState, Timestamp, attempts, jobs};
use rust_decimal::Decimal;
use sea_orm::sea_query::Expr;
use sea_orm::{ColumnTrait, EntityTrait, QueryFilter};
use std::collections::HashSet;
use std::time::Duration;

on_both_backends!(
    a_lapsed_lease_does_not_take_an_item_back_from_a_live_provider_batch,
    metrics_show_provider_batches_and_their_waiting_items,
);

/// The items' 48-hour leases lapse (as after a long outage of every worker) while
/// their provider batch is still running at the provider: the lease rescue leaves
/// them to the submitter and renews their leases, so that the provider holds one
/// batch for them and each is billed once.
async fn a_lapsed_lease_does_not_take_an_item_back_from_a_live_provider_batch(backend: Backend) {
    let shape = Shape::OpenAi;
    let Setup { app, tenant, .. } =
        setup(backend, Duration::from_secs(4), Duration::from_secs(3600)).await;
    let id = create_provider_batch(&app, &tenant, shape).await;
    assert!(add_items(&app, &tenant, id, &items(6, false)).await["errors"].is_null());
    close(&app, &tenant, id).await;
    wait_for_rows(&app, id, |rows| {
        rows.iter()
            .any(|row| row.state == ProviderBatchState::Submitted)
    })
    .await;
    let lapsed = Timestamp(Timestamp::now().micros() - 1_000_000);
    jobs::Entity::update_many()
        .col_expr(jobs::Column::LeaseUntil, Expr::value(lapsed))
        .filter(jobs::Column::BatchId.eq(id))
        .exec(&app.app.db)
        .await
        .unwrap();
    let notices = jobledger::jobs::queue::expire_leases(&app.app.db, &HashSet::new())
        .await
        .unwrap();
    assert!(notices.is_empty(), "items taken back: {notices:?}");
    let held = items_of(&app, id).await;
    let in_a_day = Timestamp::now().micros() + 24 * 3_600_000_000;
    for item in &held {
        assert_eq!(item.status, JobStatus::Running, "{item:?}");
        assert!(
            item.lease_until
                .is_some_and(|lease| lease.micros() > in_a_day),
            "the lease was not renewed: {item:?}"
        );
    }
    let ids: Vec<_> = held.iter().map(|item| item.id).collect();
    assert!(
        attempts::Entity::find()
            .filter(attempts::Column::JobId.is_in(ids))
            .all(&app.app.db)
            .await
            .unwrap()
            .iter()
            .all(|attempt| attempt.outcome == AttemptOutcome::Running)
    );
    let finished = wait_until_finished(&app, &tenant, id, Duration::from_secs(60)).await;
    assert_eq!(finished["counts"]["succeeded"], 6, "{finished}");
    assert_eq!(
        mock_batches(&app).await.len(),
        1,
        "the items went out twice"
    );
    let attempts = assert_settled_once(&app, id, shape).await;
    assert_eq!(attempts.len(), 6, "each item billed once");
}

fn gauge(text: &str, series: &str) -> Decimal {
    sample(text, series).unwrap_or_else(|| panic!("no series {series} in:\n{text}"))
}

const SUBMITTED: &str = "jobledger_provider_batches{state=\"submitted\"}";
const SETTLED: &str = "jobledger_provider_batches{state=\"settled\"}";
const WAITING: &str = "jobledger_provider_batch_items_waiting";
const ITEM_AGE: &str = "jobledger_provider_batch_oldest_waiting_item_age_seconds";
const OPEN_AGE: &str = "jobledger_provider_batch_oldest_open_age_seconds";

/// Nothing waits; a closed batch's five items wait in one submitted provider batch,
/// for a while; then every row is settled and nothing waits again.
async fn metrics_show_provider_batches_and_their_waiting_items(backend: Backend) {
    let shape = Shape::Anthropic;
    let Setup { app, tenant, .. } =
        setup(backend, Duration::from_secs(5), Duration::from_secs(3600)).await;
    let address = app.address;
    let idle = scrape_settled(address, &[(SUBMITTED, 0), (SETTLED, 0), (WAITING, 0)]).await;
    assert_eq!(gauge(&idle, ITEM_AGE), Decimal::ZERO);
    assert_eq!(gauge(&idle, OPEN_AGE), Decimal::ZERO);

    let id = create_provider_batch(&app, &tenant, shape).await;
    assert!(add_items(&app, &tenant, id, &items(5, false)).await["errors"].is_null());
    // An open batch's items do not wait for a provider batch yet.
    let open = scrape_settled(address, &[(WAITING, 0)]).await;
    assert_eq!(gauge(&open, ITEM_AGE), Decimal::ZERO);
    close(&app, &tenant, id).await;
    wait_for_rows(&app, id, |rows| {
        rows.iter()
            .any(|row| row.state == ProviderBatchState::Submitted)
    })
    .await;
    scrape_settled(address, &[(SUBMITTED, 1), (WAITING, 5)]).await;
    // The ages grow while the provider batch runs.
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    loop {
        let text = scrape(address).await;
        if gauge(&text, ITEM_AGE) >= Decimal::ONE && gauge(&text, OPEN_AGE) >= Decimal::ONE {
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "the ages did not grow:\n{text}"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }

    wait_until_finished(&app, &tenant, id, Duration::from_secs(60)).await;
    assert_eq!(rows_of(&app, id).await.len(), 1);
    let done = scrape_settled(address, &[(SUBMITTED, 0), (SETTLED, 1), (WAITING, 0)]).await;
    assert_eq!(gauge(&done, ITEM_AGE), Decimal::ZERO);
    assert_eq!(gauge(&done, OPEN_AGE), Decimal::ZERO);
    assert_eq!(items_of(&app, id).await.len(), 5);
}
