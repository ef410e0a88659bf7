//! A tenant's credit ledger, a page at a time.

use super::{Page, PageRequest, unknown_cursor};
use crate::error::ServiceError;
use entity::ledger_entries;
use sea_orm::{
    ColumnTrait, ConnectionTrait, EntityTrait, PaginatorTrait, QueryFilter, QueryOrder, QuerySelect,
};
use uuid::Uuid;

/// A tenant's ledger entries, newest first, a page at a time. `page.after` must be one
/// of the tenant's entries (else a validation error).
pub async fn credit_ledger(
    db: &impl ConnectionTrait,
    tenant_id: Uuid,
    page: PageRequest,
) -> Result<Page<ledger_entries::Model>, ServiceError> {
    let mut query =
        ledger_entries::Entity::find().filter(ledger_entries::Column::TenantId.eq(tenant_id));
    if let Some(after) = page.after {
        let known = ledger_entries::Entity::find()
            .filter(ledger_entries::Column::Id.eq(after))
            .filter(ledger_entries::Column::TenantId.eq(tenant_id))
            .count(db)
            .await?;
        if known == 0 {
            return Err(unknown_cursor());
        }
        query = query.filter(ledger_entries::Column::Id.lt(after));
    }
    let entries = query
        .order_by_desc(ledger_entries::Column::Id)
        .limit(page.first + 1)
        .all(db)
        .await?;
    Ok(Page::from_rows(entries, page.first))
}
