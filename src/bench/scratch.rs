//! Databases that exist for one benchmark scenario: a SQLite file in the temporary
//! folder, or a PostgreSQL database created on the given server and dropped after.

use sea_orm::{ConnectionTrait, Database, DatabaseConnection, DbErr};
use uuid::Uuid;

/// Where scenarios make their databases.
#[derive(Clone, Debug)]
pub enum Engine {
    Sqlite,
    /// A server URL; each scenario creates and drops a database of its own there.
    Postgres(String),
}

impl Engine {
    /// The engine's name in reports.
    pub fn name(&self) -> &'static str {
        match self {
            Self::Sqlite => "sqlite",
            Self::Postgres(_) => "postgres",
        }
    }
}

/// A migrated database with the built-in prices, removed when dropped.
pub struct ScratchDatabase {
    pub url: String,
    pub db: DatabaseConnection,
    cleanup: Cleanup,
}

enum Cleanup {
    File(std::path::PathBuf),
    Database { server: String, name: String },
}

impl ScratchDatabase {
    /// A fresh, migrated database on `engine`.
    pub async fn create(engine: &Engine) -> Result<Self, DbErr> {
        let name = format!("jobledger_bench_{}", Uuid::new_v4().simple());
        let (url, cleanup) = match engine {
            Engine::Sqlite => {
                let path = std::env::temp_dir().join(format!("{name}.db"));
                (format!("sqlite:{}", path.display()), Cleanup::File(path))
            }
            Engine::Postgres(server) => {
                let admin = Database::connect(server).await?;
                admin
                    .execute_unprepared(&format!("CREATE DATABASE {name}"))
                    .await?;
                admin.close().await?;
                (
                    with_database(server, &name),
                    Cleanup::Database {
                        server: server.clone(),
                        name,
                    },
                )
            }
        };
        let db = crate::db::connect(&url).await?;
        crate::db::migrate(&db).await?;
        let markup =
            rust_decimal::Decimal::from_str_exact(crate::billing::prices::DEFAULT_CUSTOMER_MARKUP)
                .expect("the default markup is a decimal");
        crate::billing::prices::sync_prices(&db, &crate::billing::prices::built_in_prices(markup))
            .await?;
        Ok(Self { url, db, cleanup })
    }

    /// Closes the pool and removes the database.
    pub async fn remove(self) -> Result<(), DbErr> {
        self.db.close().await?;
        match self.cleanup {
            Cleanup::File(path) => {
                for suffix in ["", "-wal", "-shm"] {
                    let mut file = path.clone().into_os_string();
                    file.push(suffix);
                    let _ = std::fs::remove_file(file);
                }
            }
            Cleanup::Database { server, name } => {
                let admin = Database::connect(&server).await?;
                admin
                    .execute_unprepared(&format!("DROP DATABASE IF EXISTS {name} WITH (FORCE)"))
                    .await?;
                admin.close().await?;
            }
        }
        Ok(())
    }
}

/// `server` with its database name replaced by `name`.
fn with_database(server: &str, name: &str) -> String {
    let (base, query) = server
        .split_once('?')
        .map_or((server, None), |(base, query)| (base, Some(query)));
    let authority_end = base.find("://").map_or(0, |scheme| scheme + 3);
    let base = match base[authority_end..].find('/') {
        Some(slash) => &base[..authority_end + slash],
        None => base,
    };
    match query {
        Some(query) => format!("{base}/{name}?{query}"),
        None => format!("{base}/{name}"),
    }
}

#[cfg(test)]
mod tests {
    use super::with_database;

    #[test]
    fn the_database_name_is_replaced_or_added() {
        assert_eq!(
            with_database("postgres://u@h:5432/postgres", "x"),
            "postgres://u@h:5432/x"
        );
        assert_eq!(with_database("postgres://u@h", "x"), "postgres://u@h/x");
        assert_eq!(
            with_database("postgres://u@h/db?sslmode=disable", "x"),
            "postgres://u@h/x?sslmode=disable"
        );
    }
}
