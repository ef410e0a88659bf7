//! The stored buckets: locked and read by a claim, written back with what it took,
//! topped up by finished calls, and paused by a provider's 429.

use super::{Bucket, BucketKey, BucketScope};
use crate::db::{Binds, Values};
use entity::{Timestamp, rate_limit_buckets};
use sea_orm::{ColumnTrait, ConnectionTrait, DbBackend, DbErr, EntityTrait, QueryFilter};

/// Creates the buckets of `keys` that do not exist yet, full, each insert committed
/// at once (call it outside the claim's transaction, PostgreSQL only). An insert waits
/// for any other transaction that inserted the same key, or updated its row, and has
/// not committed, which `SKIP LOCKED` cannot pass over: were the rows created inside
/// claims, or existing ones met by the insert, one claim stalled after creating or
/// writing a bucket would stop every claim of every process that wants it.
pub async fn create_missing(
    db: &impl ConnectionTrait,
    keys: &[BucketKey],
    now: Timestamp,
) -> Result<(), DbErr> {
    if keys.is_empty() {
        return Ok(());
    }
    let mut parameters = Binds::new(db.get_database_backend());
    let rows = new_bucket_rows(&mut parameters, keys, now);
    // Only keys with no row are inserted: an insert that meets an existing row
    // waits for a transaction that updated it (a claim writing its levels back), and
    // the NOT EXISTS reads the row without waiting. Two processes creating the same
    // bucket at once still meet in ON CONFLICT, each insert committed at once.
    let sql = format!(
        "INSERT INTO rate_limit_buckets (scope, key, refilled_at)
         SELECT wanted.scope, wanted.key, wanted.refilled_at
         FROM (VALUES {}) AS wanted (scope, key, refilled_at)
         WHERE NOT EXISTS (
            SELECT 1 FROM rate_limit_buckets AS existing
            WHERE existing.scope = wanted.scope AND existing.key = wanted.key
         )
         ON CONFLICT (scope, key) DO NOTHING",
        rows.join(", ")
    );
    db.execute_raw(parameters.statement(sql)).await?;
    Ok(())
}

/// `(scope, key, refilled_at)` rows of full buckets for `keys`, refilled at `now`.
fn new_bucket_rows(parameters: &mut Binds, keys: &[BucketKey], now: Timestamp) -> Vec<String> {
    keys.iter()
        .map(|key| {
            parameters.row([
                key.scope.as_str().into(),
                key.key.clone().into(),
                now.into(),
            ])
        })
        .collect()
}

/// The buckets of `keys` (sorted and distinct) this claim now holds until its
/// transaction ends. On PostgreSQL the rows exist already ([`create_missing`]) and a
/// bucket another claim holds is skipped, not waited for (`SKIP LOCKED`): its jobs
/// wait for the next claim, and a stalled process holding a bucket cannot stall every
/// other worker. On SQLite the caller's transaction holds the database's write lock,
/// so every bucket is held, created full where missing.
pub async fn lock(
    transaction: &impl ConnectionTrait,
    keys: &[BucketKey],
    now: Timestamp,
) -> Result<Vec<rate_limit_buckets::Model>, DbErr> {
    if keys.is_empty() {
        return Ok(Vec::new());
    }
    debug_assert!(keys.windows(2).all(|pair| pair[0] < pair[1]));
    let backend = transaction.get_database_backend();
    let mut parameters = Binds::new(backend);
    let sql = if backend == DbBackend::Postgres {
        let rows: Vec<String> = keys
            .iter()
            .map(|key| parameters.row([key.scope.as_str().into(), key.key.clone().into()]))
            .collect();
        format!(
            "SELECT buckets.* FROM rate_limit_buckets AS buckets
             JOIN (VALUES {}) AS wanted (scope, key)
               ON buckets.scope = wanted.scope AND buckets.key = wanted.key
             FOR UPDATE OF buckets SKIP LOCKED",
            rows.join(", ")
        )
    } else {
        let rows = new_bucket_rows(&mut parameters, keys, now);
        // The no-op update returns an existing row beside the created ones.
        format!(
            "INSERT INTO rate_limit_buckets (scope, key, refilled_at) VALUES {}
             ON CONFLICT (scope, key) DO UPDATE SET scope = excluded.scope
             RETURNING *",
            rows.join(", ")
        )
    };
    rate_limit_buckets::Entity::find()
        .from_raw_sql(parameters.statement(sql))
        .all(transaction)
        .await
}

/// Writes back the levels of the buckets a claim took from (locked by [`lock`]).
pub async fn store(
    transaction: &impl ConnectionTrait,
    taken: &[(&BucketKey, &Bucket)],
) -> Result<(), DbErr> {
    if taken.is_empty() {
        return Ok(());
    }
    let mut values = Values::new(
        transaction.get_database_backend(),
        "v",
        ["scope", "key", "requests", "tokens", "refilled_at"],
    );
    for (key, bucket) in taken {
        values.push([
            key.scope.as_str().into(),
            key.key.clone().into(),
            bucket.requests().into(),
            bucket.tokens().into(),
            bucket.refilled_at().into(),
        ]);
    }
    let sql = "UPDATE rate_limit_buckets SET
            requests = v.requests, tokens = v.tokens, refilled_at = v.refilled_at
         FROM v
         WHERE rate_limit_buckets.scope = v.scope AND rate_limit_buckets.key = v.key";
    transaction.execute_raw(values.statement(sql)).await?;
    Ok(())
}

/// Gives `tokens` back to the token budget of `key`: what a finished call did not use
/// of the bound it was admitted by. The level may pass the bucket's size here; a read
/// counts anything above it as full. One row per statement, so a top-up never holds
/// one bucket while waiting for another.
pub async fn give_back(
    db: &impl ConnectionTrait,
    key: &BucketKey,
    tokens: f64,
) -> Result<(), DbErr> {
    let mut parameters = Binds::new(db.get_database_backend());
    let sql = format!(
        "UPDATE rate_limit_buckets SET tokens = tokens + {tokens}
         WHERE scope = {scope} AND key = {key} AND tokens IS NOT NULL",
        tokens = parameters.bind(tokens),
        scope = parameters.bind(key.scope.as_str()),
        key = parameters.bind(key.key.clone()),
    );
    db.execute_raw(parameters.statement(sql)).await?;
    Ok(())
}

/// Pauses `model` for every worker until `until` (a later pause already set wins).
pub async fn pause_model(
    db: &impl ConnectionTrait,
    model: &str,
    until: Timestamp,
    now: Timestamp,
) -> Result<(), DbErr> {
    let backend = db.get_database_backend();
    let larger = if backend == DbBackend::Postgres {
        "GREATEST"
    } else {
        "MAX"
    };
    let mut parameters = Binds::new(backend);
    let sql = format!(
        "INSERT INTO rate_limit_buckets (scope, key, refilled_at, paused_until)
         VALUES ({scope}, {key}, {now}, {until})
         ON CONFLICT (scope, key) DO UPDATE SET paused_until =
            {larger}(COALESCE(rate_limit_buckets.paused_until, excluded.paused_until), excluded.paused_until)",
        scope = parameters.bind(BucketScope::Model.as_str()),
        key = parameters.bind(model),
        now = parameters.bind(now),
        until = parameters.bind(until),
    );
    db.execute_raw(parameters.statement(sql)).await?;
    Ok(())
}

/// The pauses in force at `now` on any of `models`: each paused model with until when.
pub async fn paused_models(
    db: &impl ConnectionTrait,
    models: &[String],
    now: Timestamp,
) -> Result<Vec<(String, Timestamp)>, DbErr> {
    Ok(rate_limit_buckets::Entity::find()
        .filter(rate_limit_buckets::Column::Scope.eq(BucketScope::Model))
        .filter(rate_limit_buckets::Column::Key.is_in(models.iter().cloned()))
        .filter(rate_limit_buckets::Column::PausedUntil.gt(now))
        .all(db)
        .await?
        .into_iter()
        .filter_map(|bucket| Some((bucket.key, bucket.paused_until?)))
        .collect())
}
