//! Where each price version came from (`origin`: `built_in`, `config` or `import`), so
//! that a start does not put a built-in price back over one an operator imported, and
//! which provider family serves an imported model (`provider_family`: `openai` or
//! `anthropic`; null: by its name, as before). Existing rows are config rows when their
//! source names a config file, built-in ones otherwise.

use sea_orm_migration::{prelude::*, schema::*};

#[derive(DeriveMigrationName)]
pub struct Migration;

#[async_trait::async_trait]
impl MigrationTrait for Migration {
    async fn up(&self, manager: &SchemaManager) -> Result<(), DbErr> {
        // One column per statement: SQLite alters a table one column at a time.
        manager
            .alter_table(
                Table::alter()
                    .table(ModelPrices::Table)
                    .add_column(string(ModelPrices::Origin).default("built_in"))
                    .to_owned(),
            )
            .await?;
        manager
            .alter_table(
                Table::alter()
                    .table(ModelPrices::Table)
                    .add_column(string_null(ModelPrices::ProviderFamily))
                    .to_owned(),
            )
            .await?;
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
        for column in [ModelPrices::ProviderFamily, ModelPrices::Origin] {
            manager
                .alter_table(
                    Table::alter()
                        .table(ModelPrices::Table)
                        .drop_column(column)
                        .to_owned(),
                )
                .await?;
        }
        Ok(())
    }
}

#[derive(Clone, Copy, DeriveIden)]
enum ModelPrices {
    Table,
    Source,
    Origin,
    ProviderFamily,
}
