//! The database engines tests run on, and a database of its own for each test.

use std::io::Write;
use std::sync::Once;
use uuid::Uuid;

/// The database engine a test runs against.
#[derive(Clone, Debug)]
pub enum Backend {
    Sqlite,
    /// The URL of a server on which each test creates its own database.
    Postgres(String),
}

static POSTGRES_SKIPPED: Once = Once::new();

impl Backend {
    /// PostgreSQL from `TEST_DATABASE_URL`, or `None` after a loud warning.
    pub fn postgres() -> Option<Self> {
        match std::env::var("TEST_DATABASE_URL") {
            Ok(url) if !url.trim().is_empty() => Some(Self::Postgres(url)),
            _ => {
                POSTGRES_SKIPPED.call_once(|| {
                    // Written straight to stderr: the test harness captures print macros.
                    let _ = writeln!(
                        std::io::stderr(),
                        "\n*** WARNING: TEST_DATABASE_URL is not set: every PostgreSQL test is SKIPPED (passes without running). ***\n"
                    );
                });
                None
            }
        }
    }
}

/// A database that exists for one test only.
pub struct TestDatabase {
    pub url: String,
    _directory: Option<tempfile::TempDir>,
    /// The server and database name to drop at the end, on PostgreSQL.
    postgres: Option<(String, String)>,
}

impl Drop for TestDatabase {
    fn drop(&mut self) {
        let Some((server_url, name)) = self.postgres.take() else {
            return;
        };
        // Drop cannot await; a short-lived runtime on its own thread does the work.
        let dropped = std::thread::spawn(move || {
            let runtime = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()?;
            runtime
                .block_on(async {
                    use sea_orm::ConnectionTrait;
                    let admin = sea_orm::Database::connect(&server_url).await?;
                    admin
                        .execute_unprepared(&format!("DROP DATABASE IF EXISTS {name} WITH (FORCE)"))
                        .await?;
                    admin.close().await
                })
                .map_err(std::io::Error::other)
        })
        .join();
        if !matches!(dropped, Ok(Ok(()))) {
            let _ = writeln!(
                std::io::stderr(),
                "could not drop a test database: {dropped:?}"
            );
        }
    }
}

impl TestDatabase {
    /// A new, empty database: a file in a temporary folder, or a PostgreSQL database
    /// with a unique name.
    pub async fn create(backend: &Backend) -> Self {
        match backend {
            Backend::Sqlite => {
                let directory = tempfile::tempdir().expect("a temporary folder");
                let url = format!("sqlite:{}", directory.path().join("test.db").display());
                Self {
                    url,
                    _directory: Some(directory),
                    postgres: None,
                }
            }
            Backend::Postgres(server_url) => {
                let name = format!("jobledger_test_{}", Uuid::new_v4().simple());
                let admin = sea_orm::Database::connect(server_url)
                    .await
                    .expect("TEST_DATABASE_URL must reach a PostgreSQL server");
                use sea_orm::ConnectionTrait;
                admin
                    .execute_unprepared(&format!("CREATE DATABASE {name}"))
                    .await
                    .expect("creating a test database");
                admin.close().await.ok();
                Self {
                    url: replace_database_name(server_url, &name),
                    _directory: None,
                    postgres: Some((server_url.clone(), name)),
                }
            }
        }
    }
}

/// `postgres://user@host:port/old?params` with `name` as its database.
fn replace_database_name(url: &str, name: &str) -> String {
    let (base, query) = url
        .split_once('?')
        .map_or((url, None), |(b, q)| (b, Some(q)));
    let scheme_end = base.find("://").map_or(0, |index| index + 3);
    let path_start = base[scheme_end..]
        .find('/')
        .map_or(base.len(), |index| scheme_end + index);
    let mut result = format!("{}/{}", &base[..path_start], name);
    if let Some(query) = query {
        result.push('?');
        result.push_str(query);
    }
    result
}
