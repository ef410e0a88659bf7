//! Each batch's counts and money against its items, summed.

use super::report::{Invariant, Recorder, Subject, credits};
use entity::JobStatus;
use sea_orm::{ConnectionTrait, DbErr, FromQueryResult};
use uuid::Uuid;

/// A batch's row beside the sums over its items, a page of batches per statement.
#[derive(Debug, FromQueryResult)]
struct BatchSums {
    id: Uuid,
    item_count: i64,
    succeeded: i64,
    failed: i64,
    cancelled: i64,
    reserved_nanos: i64,
    provider_cost_nanos: i64,
    unknown_bound_nanos: i64,
    customer_charge_nanos: i64,
    items: i64,
    items_succeeded: i64,
    items_failed: i64,
    items_cancelled: i64,
    items_reserved: i64,
    items_cost: i64,
    items_bound: i64,
    items_charge: i64,
}

/// Each batch's counters beside what its items' rows add up to.
fn sums() -> String {
    format!(
        "
    SELECT b.id, b.item_count, b.succeeded, b.failed, b.cancelled, b.reserved_nanos,
           b.provider_cost_nanos, b.unknown_bound_nanos, b.customer_charge_nanos,
           (SELECT COUNT(*) FROM jobs j WHERE j.batch_id = b.id) AS items,
           (SELECT COUNT(*) FROM jobs j WHERE j.batch_id = b.id AND j.status = {succeeded})
               AS items_succeeded,
           (SELECT COUNT(*) FROM jobs j WHERE j.batch_id = b.id AND j.status = {failed})
               AS items_failed,
           (SELECT COUNT(*) FROM jobs j WHERE j.batch_id = b.id AND j.status = {cancelled})
               AS items_cancelled,
           (SELECT CAST(COALESCE(SUM(r.amount_nanos), 0) AS BIGINT)
              FROM credit_reservations r JOIN jobs j ON j.id = r.job_id
             WHERE j.batch_id = b.id AND r.status = 'held') AS items_reserved,
           (SELECT CAST(COALESCE(SUM(a.provider_cost_nanos), 0) AS BIGINT)
              FROM attempts a JOIN jobs j ON j.id = a.job_id
             WHERE j.batch_id = b.id) AS items_cost,
           (SELECT CAST(COALESCE(SUM(a.provider_cost_upper_bound_nanos), 0) AS BIGINT)
              FROM attempts a JOIN jobs j ON j.id = a.job_id
             WHERE j.batch_id = b.id AND a.provider_cost_nanos IS NULL) AS items_bound,
           (SELECT CAST(COALESCE(SUM(c.amount_nanos), 0) AS BIGINT)
              FROM charges c JOIN jobs j ON j.id = c.job_id
             WHERE j.batch_id = b.id) AS items_charge
    FROM batches b",
        succeeded = JobStatus::Succeeded.sql(),
        failed = JobStatus::Failed.sql(),
        cancelled = JobStatus::Cancelled.sql(),
    )
}

pub(super) async fn audit_batches(
    db: &impl ConnectionTrait,
    recorder: &mut Recorder,
    page_size: u64,
) -> Result<(), DbErr> {
    let backend = db.get_database_backend();
    let mut after: Option<Uuid> = None;
    loop {
        let mut parameters = crate::db::Binds::new(backend);
        let condition = match after {
            Some(after) => format!(" WHERE b.id > {}", parameters.bind(after)),
            None => String::new(),
        };
        let limit = parameters.bind(i64::try_from(page_size).unwrap_or(i64::MAX));
        let sql = format!("{}{condition} ORDER BY b.id LIMIT {limit}", sums());
        let page: Vec<BatchSums> = BatchSums::find_by_statement(parameters.statement(sql))
            .all(db)
            .await?;
        let Some(last) = page.last() else {
            return Ok(());
        };
        after = Some(last.id);
        for invariant in [
            Invariant::BatchCountsMatchItems,
            Invariant::BatchReservedMatchesItems,
            Invariant::BatchProviderCostMatchesItems,
            Invariant::BatchCostBoundMatchesItems,
            Invariant::BatchChargeMatchesItems,
        ] {
            recorder.checked(invariant, page.len() as u64);
        }
        for batch in &page {
            check(recorder, batch);
        }
        if (page.len() as u64) < page_size {
            return Ok(());
        }
    }
}

fn check(recorder: &mut Recorder, batch: &BatchSums) {
    let subject = Subject::Batch(batch.id);
    let row = [
        batch.item_count,
        batch.succeeded,
        batch.failed,
        batch.cancelled,
    ];
    let items = [
        batch.items,
        batch.items_succeeded,
        batch.items_failed,
        batch.items_cancelled,
    ];
    if row != items {
        recorder.violation(
            Invariant::BatchCountsMatchItems,
            subject,
            format!(
                "items, succeeded, failed, cancelled are {row:?} on the batch and {items:?} over its items"
            ),
        );
    }
    let money = [
        (
            Invariant::BatchReservedMatchesItems,
            "reserved",
            batch.reserved_nanos,
            batch.items_reserved,
        ),
        (
            Invariant::BatchProviderCostMatchesItems,
            "providerCost",
            batch.provider_cost_nanos,
            batch.items_cost,
        ),
        (
            Invariant::BatchCostBoundMatchesItems,
            "the bounds of unknown costs",
            batch.unknown_bound_nanos,
            batch.items_bound,
        ),
        (
            Invariant::BatchChargeMatchesItems,
            "customerCharge",
            batch.customer_charge_nanos,
            batch.items_charge,
        ),
    ];
    for (invariant, name, on_row, over_items) in money {
        if on_row != over_items {
            recorder.violation(
                invariant,
                subject,
                format!(
                    "{name} is {} on the batch and {} over its items",
                    credits(on_row),
                    credits(over_items)
                ),
            );
        }
    }
}
