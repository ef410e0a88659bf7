//! The dispatcher: a task in every `serve` and `worker` process that delivers due
//! rows of the outbox.
//!
//! Each delivery is claimed with a lease by a conditional UPDATE, so two processes
//! never send one delivery at the same time, and a process that dies mid-delivery
//! leaves a lease that simply runs out. Deliveries run as tasks of their own, at most
//! one per endpoint at a time in a process: a slow or dead endpoint holds one slot
//! for at most the timeout, and never delays another endpoint's deliveries.

use super::{address, signature};
use crate::metrics::{DeliveryResult, Metrics};
use entity::{Timestamp, WebhookDeliveryStatus, webhook_deliveries, webhooks};
use rand::Rng;
use reqwest::Url;
use sea_orm::sea_query::Expr;
use sea_orm::{
    ColumnTrait, Condition, DatabaseConnection, DbErr, EntityTrait, QueryFilter, QueryOrder,
    QuerySelect,
};
use std::collections::HashSet;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tokio::sync::Notify;
use tokio::task::JoinSet;
use tokio_util::sync::CancellationToken;
use uuid::Uuid;

/// How often the outbox is looked at when nothing wakes the dispatcher earlier.
const POLL_INTERVAL: Duration = Duration::from_secs(1);
/// Deliveries one process sends at once, across all endpoints.
const MAX_IN_FLIGHT: usize = 32;
/// Longest one try may take, connecting included.
const DELIVERY_TIMEOUT: Duration = Duration::from_secs(10);
/// How long a claim owns a delivery: well past the timeout.
const LEASE_SECONDS: i64 = 60;
/// The first retry comes after about this long (±25 %), each next one after twice as
/// long, up to [`MAX_BACKOFF_SECONDS`].
const FIRST_BACKOFF_SECONDS: f64 = 5.0;
const MAX_BACKOFF_SECONDS: f64 = 3600.0;
/// A delivery that still fails this long after it was queued is given up.
const RETRY_FOR_HOURS: i64 = 24;
/// Bytes of a failed response's body kept in `last_error`.
const EXCERPT_BYTES: usize = 256;

/// Delivers the webhook outbox of the database it is given.
pub struct Dispatcher {
    db: DatabaseConnection,
    allow_private: bool,
    metrics: Metrics,
}

/// A claimed delivery and the token of its lease.
struct Claimed {
    delivery: webhook_deliveries::Model,
    token: Uuid,
}

/// How one try ended.
struct TryOutcome {
    status_code: Option<u16>,
    /// An excerpt of what went wrong; `None` on a 2xx.
    error: Option<String>,
}

impl Dispatcher {
    /// A dispatcher; `allow_private` lets it reach loopback and private addresses.
    /// Every try is counted in `metrics`.
    pub fn new(db: DatabaseConnection, allow_private: bool, metrics: Metrics) -> Self {
        Self {
            db,
            allow_private,
            metrics,
        }
    }

    /// Delivers until `stop` is cancelled, then lets the tries under way finish (each
    /// bounded by the timeout).
    pub async fn run(self, stop: CancellationToken) {
        let busy: Arc<Mutex<HashSet<Uuid>>> = Arc::default();
        let wake = Arc::new(Notify::new());
        let mut tasks = JoinSet::new();
        loop {
            while tasks.try_join_next().is_some() {}
            let room = MAX_IN_FLIGHT.saturating_sub(tasks.len());
            if room > 0 {
                let endpoints_busy: Vec<Uuid> = busy
                    .lock()
                    .expect("the busy set is never poisoned")
                    .iter()
                    .copied()
                    .collect();
                match claim(&self.db, room, &endpoints_busy).await {
                    Ok(claimed) => {
                        for claimed in claimed {
                            busy.lock()
                                .expect("the busy set is never poisoned")
                                .insert(claimed.delivery.webhook_id);
                            let (db, busy, wake) = (self.db.clone(), busy.clone(), wake.clone());
                            let (allow_private, metrics) =
                                (self.allow_private, self.metrics.clone());
                            tasks.spawn(async move {
                                let webhook_id = claimed.delivery.webhook_id;
                                if let Err(error) = deliver(&db, claimed, allow_private, &metrics).await {
                                    tracing::warn!(error = %error, webhook.id = %webhook_id, "recording a webhook delivery failed; its lease will run out");
                                }
                                busy.lock()
                                    .expect("the busy set is never poisoned")
                                    .remove(&webhook_id);
                                wake.notify_one();
                            });
                        }
                    }
                    Err(error) => {
                        tracing::warn!(error = %error, "claiming webhook deliveries failed")
                    }
                }
            }
            tokio::select! {
                () = stop.cancelled() => break,
                () = tokio::time::sleep(POLL_INTERVAL) => {}
                () = wake.notified() => {}
            }
        }
        while tasks.join_next().await.is_some() {}
    }
}

/// Claims up to `limit` due deliveries, at most one per endpoint and none of the
/// endpoints in `busy`.
async fn claim(
    db: &DatabaseConnection,
    limit: usize,
    busy: &[Uuid],
) -> Result<Vec<Claimed>, DbErr> {
    let now = Timestamp::now();
    let lease_free = Condition::any()
        .add(webhook_deliveries::Column::LeaseUntil.is_null())
        .add(webhook_deliveries::Column::LeaseUntil.lt(now));
    let mut query = webhook_deliveries::Entity::find()
        .filter(webhook_deliveries::Column::Status.eq(WebhookDeliveryStatus::Pending))
        .filter(webhook_deliveries::Column::NextAttemptAt.lte(now))
        .filter(lease_free.clone());
    if !busy.is_empty() {
        query = query.filter(webhook_deliveries::Column::WebhookId.is_not_in(busy.iter().copied()));
    }
    let candidates = query
        .order_by_asc(webhook_deliveries::Column::NextAttemptAt)
        .limit(limit as u64 * 4)
        .all(db)
        .await?;
    let mut endpoints = HashSet::new();
    let mut claimed = Vec::new();
    for delivery in candidates {
        if claimed.len() == limit {
            break;
        }
        if !endpoints.insert(delivery.webhook_id) {
            continue;
        }
        let token = Uuid::new_v4();
        // The conditions again: another process may have claimed it since the read.
        let updated = webhook_deliveries::Entity::update_many()
            .col_expr(
                webhook_deliveries::Column::LeaseUntil,
                Expr::value(now.plus(chrono::Duration::seconds(LEASE_SECONDS))),
            )
            .col_expr(webhook_deliveries::Column::LeaseToken, Expr::value(token))
            .filter(webhook_deliveries::Column::Id.eq(delivery.id))
            .filter(webhook_deliveries::Column::Status.eq(WebhookDeliveryStatus::Pending))
            .filter(lease_free.clone())
            .exec(db)
            .await?;
        if updated.rows_affected == 1 {
            claimed.push(Claimed { delivery, token });
        }
    }
    Ok(claimed)
}

/// Sends one try of a claimed delivery and records how it ended.
async fn deliver(
    db: &DatabaseConnection,
    claimed: Claimed,
    allow_private: bool,
    metrics: &Metrics,
) -> Result<(), DbErr> {
    let delivery = &claimed.delivery;
    let webhook = webhooks::Entity::find_by_id(delivery.webhook_id)
        .one(db)
        .await?
        .filter(|webhook| webhook.deleted_at.is_none());
    let started = Instant::now();
    let outcome = match &webhook {
        Some(webhook) => send(webhook, delivery, allow_private).await,
        None => TryOutcome {
            status_code: None,
            error: Some("the webhook was deleted".to_owned()),
        },
    };
    let duration_ms = started.elapsed().as_millis() as u64;
    metrics.webhook_delivered(match outcome.error {
        None => DeliveryResult::Success,
        Some(_) => DeliveryResult::Failure,
    });
    match (&outcome.error, outcome.status_code) {
        (None, status) => tracing::info!(
            webhook.id = %delivery.webhook_id, delivery.id = %delivery.id, tenant.id = %delivery.tenant_id,
            status = ?status, duration_ms, "webhook delivered"
        ),
        (Some(error), status) => tracing::warn!(
            webhook.id = %delivery.webhook_id, delivery.id = %delivery.id, tenant.id = %delivery.tenant_id,
            status = ?status, error = %error, attempt = delivery.attempts + 1, duration_ms, "webhook delivery failed"
        ),
    }
    record(db, &claimed, outcome, webhook.is_none()).await
}

async fn send(
    webhook: &webhooks::Model,
    delivery: &webhook_deliveries::Model,
    allow_private: bool,
) -> TryOutcome {
    let failed = |status_code: Option<u16>, error: String| TryOutcome {
        status_code,
        error: Some(error),
    };
    let Ok(url) = Url::parse(&webhook.url) else {
        return failed(None, "the URL no longer parses".to_owned());
    };
    // Checked again at every try: the name may resolve elsewhere now. The connection
    // goes to the address checked here, not to a second lookup.
    let address = match address::resolve(&url, allow_private).await {
        Ok(address) => address,
        Err(error) => return failed(None, error.to_string()),
    };
    let mut client = reqwest::Client::builder()
        .redirect(reqwest::redirect::Policy::none())
        .timeout(DELIVERY_TIMEOUT);
    if let Some(host) = url.host_str() {
        client = client.resolve(host, address);
    }
    let client = match client.build() {
        Ok(client) => client,
        Err(error) => return failed(None, format!("no HTTP client: {error}")),
    };
    let id = delivery.id.to_string();
    let timestamp = chrono::Utc::now().timestamp();
    let signature = signature::sign(&webhook.secret, &id, timestamp, &delivery.payload);
    let response = client
        .post(url)
        .header("content-type", "application/json")
        .header("user-agent", "jobledger-webhooks")
        .header("webhook-id", &id)
        .header("webhook-timestamp", timestamp.to_string())
        .header("webhook-signature", signature)
        .body(delivery.payload.clone())
        .send()
        .await;
    let mut response = match response {
        Ok(response) => response,
        Err(error) if error.is_timeout() => {
            return failed(None, "no answer within 10 s".to_owned());
        }
        Err(error) if error.is_connect() => {
            return failed(None, "the endpoint could not be reached".to_owned());
        }
        Err(_) => return failed(None, "the connection broke".to_owned()),
    };
    let status = response.status();
    if status.is_success() {
        return TryOutcome {
            status_code: Some(status.as_u16()),
            error: None,
        };
    }
    // Only the start of the body is read and kept.
    let mut excerpt = Vec::new();
    while excerpt.len() < EXCERPT_BYTES {
        match response.chunk().await {
            Ok(Some(chunk)) => excerpt.extend_from_slice(&chunk),
            _ => break,
        }
    }
    excerpt.truncate(EXCERPT_BYTES);
    let body = String::from_utf8_lossy(&excerpt);
    failed(
        Some(status.as_u16()),
        format!("HTTP {}: {}", status.as_u16(), body.trim()),
    )
}

/// Records a try, only while this claim still holds the lease.
async fn record(
    db: &DatabaseConnection,
    claimed: &Claimed,
    outcome: TryOutcome,
    endpoint_gone: bool,
) -> Result<(), DbErr> {
    let delivery = &claimed.delivery;
    let now = Timestamp::now();
    let attempts = delivery.attempts.saturating_add(1);
    let mut update = webhook_deliveries::Entity::update_many()
        .col_expr(webhook_deliveries::Column::Attempts, Expr::value(attempts))
        .col_expr(
            webhook_deliveries::Column::LastStatusCode,
            Expr::value(outcome.status_code.map(i32::from)),
        )
        .col_expr(
            webhook_deliveries::Column::LastError,
            Expr::value(outcome.error.clone()),
        )
        .col_expr(
            webhook_deliveries::Column::LeaseUntil,
            Expr::value(Option::<Timestamp>::None),
        )
        .col_expr(
            webhook_deliveries::Column::LeaseToken,
            Expr::value(Option::<Uuid>::None),
        );
    update = if outcome.error.is_none() {
        update
            .col_expr(
                webhook_deliveries::Column::Status,
                Expr::value(WebhookDeliveryStatus::Delivered),
            )
            .col_expr(webhook_deliveries::Column::DeliveredAt, Expr::value(now))
    } else {
        let given_up = endpoint_gone
            || now
                >= delivery
                    .created_at
                    .plus(chrono::Duration::hours(RETRY_FOR_HOURS));
        let status = if given_up {
            WebhookDeliveryStatus::Failed
        } else {
            WebhookDeliveryStatus::Pending
        };
        update
            .col_expr(webhook_deliveries::Column::Status, Expr::value(status))
            .col_expr(
                webhook_deliveries::Column::NextAttemptAt,
                Expr::value(now.plus(backoff(attempts))),
            )
    };
    update
        .filter(webhook_deliveries::Column::Id.eq(delivery.id))
        .filter(webhook_deliveries::Column::LeaseToken.eq(claimed.token))
        .exec(db)
        .await?;
    Ok(())
}

/// The wait before the next try after `attempts` failed ones: exponential, capped,
/// with ±25 % jitter so that endpoints coming back are not hit by every retry at once.
fn backoff(attempts: i32) -> chrono::Duration {
    let exponent = attempts.saturating_sub(1).clamp(0, 30);
    let base = (FIRST_BACKOFF_SECONDS * 2_f64.powi(exponent)).min(MAX_BACKOFF_SECONDS);
    let jittered = base * rand::rng().random_range(0.75..=1.25);
    chrono::Duration::milliseconds((jittered * 1000.0) as i64)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_first_retry_comes_within_ten_seconds_and_retries_go_on_for_a_day() {
        for _ in 0..100 {
            assert!(backoff(1) <= chrono::Duration::seconds(10));
            assert!(backoff(1) >= chrono::Duration::seconds(3));
            assert!(backoff(40) <= chrono::Duration::seconds(4500));
        }
        // Even with every wait at its shortest, a day of retries takes a bounded
        // number of tries, and none of them waits past the cap.
        let mut total = chrono::Duration::zero();
        let mut attempts = 0;
        while total < chrono::Duration::hours(RETRY_FOR_HOURS) {
            attempts += 1;
            total += backoff(attempts);
        }
        assert!(attempts < 60, "{attempts} tries in a day");
    }
}
