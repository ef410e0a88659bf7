//! The ceiling a queue could reach with no billing at all: a bare table of jobs,
//! claimed one row (or 50 rows) at a time with `FOR UPDATE SKIP LOCKED` and completed
//! by a fenced UPDATE, on as many connections as jobledger's pool has. jobledger's
//! drain is reported as a ratio of it, measured in the same run on the same server.

use sea_orm::{ConnectionTrait, DatabaseConnection, DbBackend, DbErr, Statement};
use std::time::Instant;
use uuid::Uuid;

/// Completed jobs per second on `connections` concurrent connections, each claiming
/// `batch` rows per round trip until `jobs` are done.
pub async fn ceiling(
    db: &DatabaseConnection,
    jobs: u64,
    batch: u64,
    connections: usize,
) -> Result<f64, DbErr> {
    let backend = db.get_database_backend();
    // A table of its own per measurement: SQLite connections of the pool may still
    // see a dropped table's index for a moment.
    let table = format!("naive_queue_{batch}");
    db.execute_unprepared(&format!(
        "CREATE TABLE {table} (id BIGINT PRIMARY KEY, status INTEGER NOT NULL, token TEXT)"
    ))
    .await?;
    db.execute_unprepared(&format!(
        "CREATE INDEX ix_{table}_ready ON {table} (id) WHERE status = 0"
    ))
    .await?;
    db.execute_unprepared(&format!(
        "WITH RECURSIVE series(n) AS (SELECT 1 UNION ALL SELECT n + 1 FROM series WHERE n < {jobs})
         INSERT INTO {table} (id, status, token) SELECT n, 0, NULL FROM series"
    ))
    .await?;
    let lock = match backend {
        DbBackend::Postgres => "FOR UPDATE SKIP LOCKED",
        // One statement is atomic on SQLite: writers take turns.
        _ => "",
    };
    let p1 = match backend {
        DbBackend::Postgres => "$1",
        _ => "?1",
    };
    let claim = format!(
        "UPDATE {table} SET status = 1, token = {p1}
         WHERE id IN (SELECT id FROM {table} WHERE status = 0 ORDER BY id LIMIT {batch} {lock})
         RETURNING id"
    );
    let started = Instant::now();
    let workers = (0..connections).map(|_| {
        let db = db.clone();
        let claim = claim.clone();
        let table = table.clone();
        async move {
            loop {
                let token = Uuid::new_v4().to_string();
                let claimed = db
                    .query_all_raw(Statement::from_sql_and_values(
                        backend,
                        &claim,
                        [token.clone().into()],
                    ))
                    .await?;
                if claimed.is_empty() {
                    return Ok::<(), DbErr>(());
                }
                // The ids are numbers the database just returned: inline, by primary key.
                let ids: Vec<String> = claimed
                    .iter()
                    .map(|row| row.try_get_by_index::<i64>(0).map(|id| id.to_string()))
                    .collect::<Result<_, _>>()?;
                db.execute_raw(Statement::from_sql_and_values(
                    backend,
                    format!(
                        "UPDATE {table} SET status = 2 WHERE id IN ({}) AND token = {p1}",
                        ids.join(",")
                    ),
                    [token.into()],
                ))
                .await?;
            }
        }
    });
    for result in futures_util::future::join_all(workers).await {
        result?;
    }
    let elapsed = started.elapsed().as_secs_f64();
    db.execute_unprepared(&format!("DROP TABLE {table}"))
        .await?;
    Ok(jobs as f64 / elapsed)
}
