//! The steps migrations repeat. Each change is one statement, so that SQLite, which
//! alters one thing at a time, takes a step as PostgreSQL does.
//!
//! Migrations already applied call these: a step must go on writing exactly what it
//! writes now. A new need is a new step, never a changed one.

use sea_orm_migration::prelude::*;

/// Adds `columns` to `table`.
pub async fn add_columns(
    manager: &SchemaManager<'_>,
    table: impl IntoIden,
    columns: impl IntoIterator<Item = ColumnDef>,
) -> Result<(), DbErr> {
    let table = table.into_iden();
    for column in columns {
        manager
            .alter_table(
                Table::alter()
                    .table(table.clone())
                    .add_column(column)
                    .to_owned(),
            )
            .await?;
    }
    Ok(())
}

/// Drops `columns` from `table`, in the order given.
pub async fn drop_columns<C: IntoIden>(
    manager: &SchemaManager<'_>,
    table: impl IntoIden,
    columns: impl IntoIterator<Item = C>,
) -> Result<(), DbErr> {
    let table = table.into_iden();
    for column in columns {
        manager
            .alter_table(
                Table::alter()
                    .table(table.clone())
                    .drop_column(column)
                    .to_owned(),
            )
            .await?;
    }
    Ok(())
}

/// An index `name` on `columns` of `table`.
pub fn index<C: IntoIden>(
    name: &str,
    table: impl IntoIden,
    columns: impl IntoIterator<Item = C>,
) -> IndexCreateStatement {
    let mut index = Index::create();
    index.name(name).table(table);
    for column in columns {
        index.col(column);
    }
    index
}

/// Creates `index` (from [`index`], `.unique()` where it is one).
pub async fn create_index(
    manager: &SchemaManager<'_>,
    index: &mut IndexCreateStatement,
) -> Result<(), DbErr> {
    manager.create_index(index.take()).await
}

/// Drops the index `name` of `table`.
pub async fn drop_index(
    manager: &SchemaManager<'_>,
    name: &str,
    table: impl IntoIden,
) -> Result<(), DbErr> {
    manager
        .drop_index(Index::drop().name(name).table(table).to_owned())
        .await
}

/// Runs `statements` as written, in order: SQL both backends read alike (partial
/// indexes, data updates).
pub async fn execute(manager: &SchemaManager<'_>, statements: &[&str]) -> Result<(), DbErr> {
    let db = manager.get_connection();
    for statement in statements {
        db.execute_unprepared(statement).await?;
    }
    Ok(())
}

/// A foreign key from `table.column` to `target.target_column`, with no action on
/// delete or update.
pub fn foreign_key(
    (table, column): (impl IntoIden, impl IntoIden),
    (target, target_column): (impl IntoIden, impl IntoIden),
) -> ForeignKeyCreateStatement {
    ForeignKey::create()
        .from(table, column)
        .to(target, target_column)
        .to_owned()
}

/// Drops `table`.
pub async fn drop_table(manager: &SchemaManager<'_>, table: impl IntoIden) -> Result<(), DbErr> {
    manager
        .drop_table(Table::drop().table(table).to_owned())
        .await
}
