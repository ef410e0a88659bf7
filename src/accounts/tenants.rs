//! Creating and reading tenants.

use super::api_keys::{self, ApiKey};
use crate::error::ServiceError;
use crate::page::{Page, PageRequest};
use entity::{Timestamp, tenants};
use sea_orm::{
    ActiveValue::Set, ColumnTrait, ConnectionTrait, EntityTrait, QueryFilter, QueryOrder,
    QuerySelect,
};
use uuid::Uuid;

/// Longest tenant name accepted.
const MAX_NAME_LENGTH: usize = 200;

/// Creates a tenant with a zero balance and its first API key.
pub async fn create_tenant(
    db: &impl ConnectionTrait,
    name: &str,
) -> Result<(tenants::Model, ApiKey), ServiceError> {
    let name = name.trim();
    if name.is_empty() || name.chars().count() > MAX_NAME_LENGTH {
        return Err(ServiceError::validation(format!(
            "name must be 1 to {MAX_NAME_LENGTH} characters"
        )));
    }
    crate::validation::single_line("name", name)?;
    let row = tenants::ActiveModel {
        id: Set(Uuid::now_v7()),
        name: Set(name.to_owned()),
        granted_nanos: Set(0),
        held_nanos: Set(0),
        charged_nanos: Set(0),
        expired_nanos: Set(0),
        attributed_nanos: Set(0),
        next_expiry_at: Set(None),
        created_at: Set(Timestamp::now()),
        spend_day_starts_at: Set(Timestamp(0)),
        spend_day_nanos: Set(0),
        spend_month_starts_at: Set(Timestamp(0)),
        spend_month_nanos: Set(0),
    };
    let tenant = tenants::Entity::insert(row).exec_with_returning(db).await?;
    let (_, key) = api_keys::create_tenant_key(db, tenant.id, "").await?;
    Ok((tenant, key))
}

/// The tenant with this id.
pub async fn find_tenant(
    db: &impl ConnectionTrait,
    tenant_id: Uuid,
) -> Result<tenants::Model, ServiceError> {
    tenants::Entity::find_by_id(tenant_id)
        .one(db)
        .await?
        .ok_or(ServiceError::NotFound)
}

/// At most `first` tenants created before the tenant `after`, newest first. Ids are
/// version-7 UUIDs, so ordering by id is ordering by creation.
pub async fn list_tenants(
    db: &impl ConnectionTrait,
    page: PageRequest,
) -> Result<Page<tenants::Model>, ServiceError> {
    let mut query = tenants::Entity::find();
    if let Some(after) = page.after {
        query = query.filter(tenants::Column::Id.lt(after));
    }
    let tenants = query
        .order_by_desc(tenants::Column::Id)
        .limit(page.first + 1)
        .all(db)
        .await?;
    Ok(Page::from_rows(tenants, page.first))
}
