//! A batch's results as JSON lines, in the order the items were added, read a page at
//! a time: the server holds one page, never the batch.

use crate::billing::Credits;
use entity::{JobStatus, batches, charges, jobs};
use futures_util::Stream;
use sea_orm::{
    ColumnTrait, DatabaseConnection, DbErr, EntityTrait, QueryFilter, QueryOrder, QuerySelect,
};
use serde_json::{Value, json};
use std::collections::HashMap;
use uuid::Uuid;

/// Items read per page.
const PAGE: u64 = 500;

/// Each item of `batch` as one line of JSON (newline included).
pub fn result_lines(
    db: DatabaseConnection,
    batch: batches::Model,
) -> impl Stream<Item = Result<String, DbErr>> + Send + 'static {
    async_stream::try_stream! {
        let mut after: Option<Uuid> = None;
        loop {
            let mut page = jobs::Entity::find()
                .select_only()
                .columns([
                    jobs::Column::Id,
                    jobs::Column::CustomId,
                    jobs::Column::Status,
                    jobs::Column::Result,
                    jobs::Column::ErrorCode,
                    jobs::Column::ErrorMessage,
                ])
                .filter(jobs::Column::BatchId.eq(batch.id))
                .filter(jobs::Column::TenantId.eq(batch.tenant_id));
            if let Some(after) = after {
                page = page.filter(jobs::Column::Id.gt(after));
            }
            let rows: Vec<ItemRow> = page
                .order_by_asc(jobs::Column::Id)
                .limit(PAGE)
                .into_tuple()
                .all(&db)
                .await?;
            let Some(last) = rows.last() else { break };
            after = Some(last.0);
            let charged: HashMap<Uuid, i64> = charges::Entity::find()
                .select_only()
                .columns([charges::Column::JobId, charges::Column::AmountNanos])
                .filter(charges::Column::JobId.is_in(rows.iter().map(|row| row.0)))
                .into_tuple::<(Uuid, i64)>()
                .all(&db)
                .await?
                .into_iter()
                .collect();
            let full = rows.len() as u64 == PAGE;
            for row in rows {
                let charge = charged.get(&row.0).copied().unwrap_or(0);
                yield line(row, Credits::from_nanos(charge));
            }
            if !full {
                break;
            }
        }
    }
}

/// id, customId, status, result, error code, error message.
type ItemRow = (
    Uuid,
    Option<String>,
    JobStatus,
    Option<entity::JsonText>,
    Option<String>,
    Option<String>,
);

fn line((job_id, custom_id, status, result, code, message): ItemRow, charge: Credits) -> String {
    let error = code.map(|code| json!({"code": code, "message": message}));
    let mut text = json!({
        "customId": custom_id,
        "jobId": job_id,
        "status": status.api_name(),
        "result": result.map_or(Value::Null, entity::JsonText::into_value),
        "error": error,
        "customerCharge": charge.to_string(),
    })
    .to_string();
    text.push('\n');
    text
}
