//! Where each price version came from (`origin`: `built_in`, `config` or `import`), so
//! that a start does not put a built-in price back over one an operator imported, and
//! which provider family serves an imported model (`provider_family`: `openai` or
//! `anthropic`; null: by its name, as before). Existing rows are config rows when their
//! source names a config file, built-in ones otherwise.

use crate::steps::{add_columns, drop_columns};
use sea_orm_migration::{prelude::*, schema::*};

#[derive(DeriveMigrationName)]
pub struct Migration;

#[async_trait::async_trait]
impl MigrationTrait for Migration {
    async fn up(&self, manager: &SchemaManager) -> Result<(), DbErr> {
        let columns = [
            string(ModelPrices::Origin).default("built_in").take(),
            string_null(ModelPrices::ProviderFamily),
        ];
        add_columns(manager, ModelPrices::Table, columns).await?;
        manager
            .exec_stmt(
                Query::update()
                    .table(ModelPrices::Table)
                    .value(ModelPrices::Origin, "config")
                    .and_where(Expr::col(ModelPrices::Source).like("config file %"))
                    .to_owned(),
            )
            .await
    }

    async fn down(&self, manager: &SchemaManager) -> Result<(), DbErr> {
        let columns = [ModelPrices::ProviderFamily, ModelPrices::Origin];
        drop_columns(manager, ModelPrices::Table, columns).await
    }
}

#[derive(Clone, Copy, DeriveIden)]
enum ModelPrices {
    Table,
    Source,
    Origin,
    ProviderFamily,
}
