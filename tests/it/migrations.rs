//! The migrations, read back from each backend's own catalog: undone one by one to
//! nothing they leave no table behind, and applied again they write the very schema
//! they wrote the first time. Every `down` runs here, so a migration that cannot be
//! undone (or undoes too little) fails this test, not an operator's rollback.

use crate::helpers::{Backend, TestDatabase};
use migration::{Migrator, MigratorTrait};
use sea_orm::{ConnectionTrait, DatabaseConnection, DbBackend, Statement};

on_both_backends!(undone_to_nothing_and_applied_again_they_write_the_same_schema);

async fn undone_to_nothing_and_applied_again_they_write_the_same_schema(backend: Backend) {
    let database = TestDatabase::create(&backend).await;
    let db = jobledger::db::connect(&database.url).await.unwrap();
    let names: Vec<String> = Migrator::migrations()
        .iter()
        .map(|migration| migration.name().to_owned())
        .collect();
    // The schema after each migration, applied one at a time.
    let mut after = vec![schema(&db).await];
    for _ in &names {
        Migrator::up(&db, Some(1)).await.unwrap();
        after.push(schema(&db).await);
    }
    assert!(
        after[names.len()]
            .iter()
            .any(|line| line.contains("provider_batches")),
        "the catalog read shows the newest tables: {:#?}",
        after[names.len()]
    );
    assert!(
        after[0].is_empty(),
        "a new database has nothing: {:#?}",
        after[0]
    );

    // Undoing each gives back exactly the schema from before it.
    for (index, name) in names.iter().enumerate().rev() {
        Migrator::down(&db, Some(1))
            .await
            .unwrap_or_else(|error| panic!("undoing {name}: {error}"));
        assert_eq!(schema(&db).await, after[index], "undoing {name}");
    }

    Migrator::up(&db, None).await.unwrap();
    assert_eq!(
        schema(&db).await,
        after[names.len()],
        "applied again, the same schema"
    );
}

/// Every table, column, index and constraint but the migrator's own table, one line
/// each, sorted.
async fn schema(db: &DatabaseConnection) -> Vec<String> {
    let backend = db.get_database_backend();
    let queries: &[&str] = match backend {
        // Quotes dropped: an index made again by hand-written SQL quotes no names.
        DbBackend::Sqlite => &[
            "SELECT type || ' ' || name || ': ' || REPLACE(COALESCE(sql, ''), '\"', '') AS line
             FROM sqlite_master
             WHERE name NOT LIKE 'sqlite_%' AND tbl_name <> 'seaql_migrations'",
        ],
        _ => &[
            "SELECT table_name || '.' || column_name || ' ' || data_type || ' ' || is_nullable
                 || ' ' || COALESCE(column_default, '') || ' #' || ordinal_position AS line
             FROM information_schema.columns
             WHERE table_schema = 'public' AND table_name <> 'seaql_migrations'",
            "SELECT indexname || ': ' || indexdef AS line FROM pg_indexes
             WHERE schemaname = 'public' AND tablename <> 'seaql_migrations'",
            "SELECT conrelid::regclass::text || ' ' || conname || ': '
                 || pg_get_constraintdef(oid) AS line
             FROM pg_constraint
             WHERE connamespace = 'public'::regnamespace
               AND conrelid::regclass::text <> 'seaql_migrations'",
        ],
    };
    let mut lines = Vec::new();
    for query in queries {
        for row in db
            .query_all_raw(Statement::from_string(backend, *query))
            .await
            .unwrap()
        {
            lines.push(row.try_get::<String>("", "line").unwrap());
        }
    }
    lines.sort();
    lines
}
