//! Reading one member of a stored JSON document in the database, so that a small part
//! of a large column (a job's metadata inside its input of up to megabytes) crosses
//! the connection alone.

use entity::jobs;
use sea_orm::sea_query::{Expr, Query};
use sea_orm::{ColumnTrait, ConnectionTrait, DbBackend, DbErr, FromQueryResult, StatementBuilder};
use serde_json::Value;
use std::collections::HashMap;
use uuid::Uuid;

/// The `metadata` a client gave each of `job_ids` (jobs without any are absent), of
/// `tenant_id`'s jobs only when one is named (`None`: ids the caller read from rows it
/// holds). Metadata is at most 64 KiB each.
pub async fn job_metadata(
    db: &impl ConnectionTrait,
    tenant_id: Option<Uuid>,
    job_ids: &[Uuid],
) -> Result<HashMap<Uuid, Value>, DbErr> {
    if job_ids.is_empty() {
        return Ok(HashMap::new());
    }
    // Both give the member as JSON text, whatever its type: PostgreSQL's `->` of the
    // column read as jsonb, SQLite's `->` (since 3.38) of the text itself.
    let member = match db.get_database_backend() {
        DbBackend::Postgres => "CAST(CAST(input AS jsonb) -> 'metadata' AS TEXT)",
        _ => "input -> '$.metadata'",
    };
    let mut select = Query::select();
    select
        .column(jobs::Column::Id)
        .expr_as(Expr::cust(member), "metadata")
        .from(jobs::Entity)
        .and_where(jobs::Column::Id.is_in(job_ids.iter().copied()));
    if let Some(tenant_id) = tenant_id {
        select.and_where(jobs::Column::TenantId.eq(tenant_id));
    }
    #[derive(FromQueryResult)]
    struct Row {
        id: Uuid,
        metadata: Option<String>,
    }
    let rows = Row::find_by_statement(StatementBuilder::build(&select, &db.get_database_backend()))
        .all(db)
        .await?;
    Ok(rows
        .into_iter()
        .filter_map(|row| {
            let value = serde_json::from_str(&row.metadata?).ok()?;
            Some((row.id, value))
        })
        .collect())
}
