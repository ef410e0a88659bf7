//! The dispatcher: a task in every `serve` and `worker` process that delivers due
//! rows of the outbox.
//!
//! Each delivery is claimed with a lease by a conditional UPDATE, so two processes
//! never send one delivery at the same time, and a process that dies mid-delivery
//! leaves a lease that simply runs out. Deliveries run as tasks of their own, at most
//! one per endpoint at a time in a process.
//!
//! Slots are fair per tenant, so that a tenant's slow or dead endpoints never delay
//! another tenant's deliveries: every tenant with a delivery due gets a slot of its
//! own, whatever the others have in flight; beyond that first one, tenants share
//! [`SHARED_SLOTS`], at most [`MAX_PER_TENANT`] in flight each, handed out one per
//! tenant per round.

use super::{address, signature};
use crate::backoff::{Backoff, Jitter};
use crate::metrics::{DeliveryResult, Metrics};
use entity::{Timestamp, WebhookDeliveryStatus, webhook_deliveries, webhooks};
use reqwest::Url;
use sea_orm::sea_query::Expr;
use sea_orm::{
    ColumnTrait, Condition, DatabaseConnection, DbErr, EntityTrait, QueryFilter, QueryOrder,
    QuerySelect,
};
use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tokio::sync::Notify;
use tokio::task::JoinSet;
use tokio_util::sync::CancellationToken;
use uuid::Uuid;

/// How often the outbox is looked at when nothing wakes the dispatcher earlier.
const POLL_INTERVAL: Duration = Duration::from_secs(1);
/// Deliveries one process sends at once beyond each tenant's first.
const SHARED_SLOTS: usize = 32;
/// Most deliveries of one tenant in flight in one process.
const MAX_PER_TENANT: usize = 4;
/// Due deliveries read per claim, from which the fair share is picked.
const CANDIDATES: u64 = 256;
/// Longest one try may take, connecting included.
const DELIVERY_TIMEOUT: Duration = Duration::from_secs(10);
/// How long a claim owns a delivery: well past the timeout.
const LEASE_SECONDS: i64 = 60;
/// The first retry comes after about 5 s (±25 %), each next one after twice as long,
/// up to an hour: endpoints coming back are not hit by every retry at once.
const RETRY_BACKOFF: Backoff = Backoff {
    first: Duration::from_secs(5),
    cap: Duration::from_secs(3600),
    jitter: Jitter::Spread(0.25),
};
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
        let in_flight: Arc<Mutex<InFlight>> = Arc::default();
        let wake = Arc::new(Notify::new());
        let mut tasks = JoinSet::new();
        loop {
            while tasks.try_join_next().is_some() {}
            let snapshot = in_flight
                .lock()
                .expect("the in-flight set is never poisoned")
                .clone();
            let claimed = match claim(&self.db, &snapshot).await {
                Ok(claimed) => claimed,
                Err(error) => {
                    tracing::warn!(error = %error, "claiming webhook deliveries failed");
                    Vec::new()
                }
            };
            let claimed_any = !claimed.is_empty();
            for claimed in claimed {
                in_flight
                    .lock()
                    .expect("the in-flight set is never poisoned")
                    .start(&claimed.delivery);
                let (db, in_flight, wake) = (self.db.clone(), in_flight.clone(), wake.clone());
                let (allow_private, metrics) = (self.allow_private, self.metrics.clone());
                tasks.spawn(async move {
                    let delivery = claimed.delivery.clone();
                    if let Err(error) = deliver(&db, claimed, allow_private, &metrics).await {
                        tracing::warn!(error = %error, webhook.id = %delivery.webhook_id, "recording a webhook delivery failed; its lease will run out");
                    }
                    in_flight
                        .lock()
                        .expect("the in-flight set is never poisoned")
                        .finish(&delivery);
                    wake.notify_one();
                });
            }
            // A claim that took something may have left due deliveries of tenants it
            // excluded or did not read: look again at once.
            if claimed_any {
                continue;
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

/// What a process has in flight: endpoints, and deliveries per tenant.
#[derive(Clone, Debug, Default)]
struct InFlight {
    endpoints: HashSet<Uuid>,
    per_tenant: HashMap<Uuid, usize>,
}

impl InFlight {
    fn start(&mut self, delivery: &webhook_deliveries::Model) {
        self.endpoints.insert(delivery.webhook_id);
        *self.per_tenant.entry(delivery.tenant_id).or_default() += 1;
    }

    fn finish(&mut self, delivery: &webhook_deliveries::Model) {
        self.endpoints.remove(&delivery.webhook_id);
        if let Some(count) = self.per_tenant.get_mut(&delivery.tenant_id) {
            *count -= 1;
            if *count == 0 {
                self.per_tenant.remove(&delivery.tenant_id);
            }
        }
    }

    /// Shared slots in use: every tenant's deliveries beyond its first.
    fn shared_in_use(&self) -> usize {
        self.per_tenant.values().map(|count| count - 1).sum()
    }

    /// Tenants that may not start another delivery now: those at their own cap, and,
    /// when the shared slots are all taken, every tenant with one in flight already.
    fn tenants_full(&self) -> Vec<Uuid> {
        let shared_full = self.shared_in_use() >= SHARED_SLOTS;
        self.per_tenant
            .iter()
            .filter(|(_, count)| shared_full || **count >= MAX_PER_TENANT)
            .map(|(tenant_id, _)| *tenant_id)
            .collect()
    }
}

/// Picks from due deliveries (oldest due first) what `in_flight` leaves room for:
/// one per endpoint, round-robin over tenants — each tenant's first delivery in
/// every round before anyone's second — within each tenant's cap and the shared
/// slots.
fn fair_share(
    candidates: Vec<webhook_deliveries::Model>,
    in_flight: &InFlight,
) -> Vec<webhook_deliveries::Model> {
    let mut queues: Vec<(Uuid, std::collections::VecDeque<webhook_deliveries::Model>)> = Vec::new();
    let mut endpoints = in_flight.endpoints.clone();
    for delivery in candidates {
        // One per endpoint: a second delivery to an endpoint waits for the first.
        if !endpoints.insert(delivery.webhook_id) {
            continue;
        }
        match queues
            .iter_mut()
            .find(|(tenant_id, _)| *tenant_id == delivery.tenant_id)
        {
            Some((_, queue)) => queue.push_back(delivery),
            None => queues.push((delivery.tenant_id, [delivery].into())),
        }
    }
    let mut per_tenant = in_flight.per_tenant.clone();
    let mut shared_left = SHARED_SLOTS.saturating_sub(in_flight.shared_in_use());
    let mut picked = Vec::new();
    loop {
        let mut progressed = false;
        for (tenant_id, queue) in &mut queues {
            let count = per_tenant.entry(*tenant_id).or_default();
            let room = *count < MAX_PER_TENANT && (*count == 0 || shared_left > 0);
            if !room {
                continue;
            }
            let Some(delivery) = queue.pop_front() else {
                continue;
            };
            if *count > 0 {
                shared_left -= 1;
            }
            *count += 1;
            picked.push(delivery);
            progressed = true;
        }
        if !progressed {
            return picked;
        }
    }
}

/// Claims the due deliveries [`fair_share`] picks, given what this process has in
/// flight.
async fn claim(db: &DatabaseConnection, in_flight: &InFlight) -> Result<Vec<Claimed>, DbErr> {
    let now = Timestamp::now();
    let lease_free = Condition::any()
        .add(webhook_deliveries::Column::LeaseUntil.is_null())
        .add(webhook_deliveries::Column::LeaseUntil.lt(now));
    let mut query = webhook_deliveries::Entity::find()
        .filter(webhook_deliveries::Column::Status.eq(WebhookDeliveryStatus::Pending))
        .filter(webhook_deliveries::Column::NextAttemptAt.lte(now))
        .filter(lease_free.clone());
    if !in_flight.endpoints.is_empty() {
        query = query.filter(
            webhook_deliveries::Column::WebhookId.is_not_in(in_flight.endpoints.iter().copied()),
        );
    }
    let tenants_full = in_flight.tenants_full();
    if !tenants_full.is_empty() {
        query = query.filter(webhook_deliveries::Column::TenantId.is_not_in(tenants_full));
    }
    let candidates = query
        .order_by_asc(webhook_deliveries::Column::NextAttemptAt)
        .limit(CANDIDATES)
        .all(db)
        .await?;
    let mut claimed = Vec::new();
    for delivery in fair_share(candidates, in_flight) {
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
    // No proxy, whatever HTTP(S)_PROXY say: a proxy would resolve the name again
    // and could reach an address the check above refused.
    let mut client = reqwest::Client::builder()
        .no_proxy()
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

/// The wait before the next try after `attempts` failed ones ([`RETRY_BACKOFF`]).
fn backoff(attempts: i32) -> chrono::Duration {
    let wait = RETRY_BACKOFF.delay(u32::try_from(attempts).unwrap_or(0));
    chrono::Duration::milliseconds(i64::try_from(wait.as_millis()).unwrap_or(i64::MAX))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn due(tenant_id: Uuid, webhook_id: Uuid) -> webhook_deliveries::Model {
        webhook_deliveries::Model {
            id: Uuid::now_v7(),
            tenant_id,
            webhook_id,
            event_type: entity::WebhookEvent::JobSucceeded,
            payload: "{}".to_owned(),
            status: WebhookDeliveryStatus::Pending,
            attempts: 0,
            next_attempt_at: Timestamp::now(),
            lease_until: None,
            lease_token: None,
            last_status_code: None,
            last_error: None,
            created_at: Timestamp::now(),
            delivered_at: None,
        }
    }

    fn count_per_tenant(picked: &[webhook_deliveries::Model]) -> HashMap<Uuid, usize> {
        let mut counts = HashMap::new();
        for delivery in picked {
            *counts.entry(delivery.tenant_id).or_default() += 1;
        }
        counts
    }

    #[test]
    fn a_tenant_with_nothing_in_flight_gets_a_slot_whatever_the_others_hold() {
        let (noisy, quiet) = (Uuid::now_v7(), Uuid::now_v7());
        // Every shared slot taken by tenants with hanging endpoints.
        let mut in_flight = InFlight::default();
        while in_flight.shared_in_use() < SHARED_SLOTS {
            let tenant = Uuid::now_v7();
            for _ in 0..MAX_PER_TENANT {
                in_flight.start(&due(tenant, Uuid::now_v7()));
            }
        }
        let mut candidates: Vec<_> = (0..40).map(|_| due(noisy, Uuid::now_v7())).collect();
        candidates.push(due(quiet, Uuid::now_v7()));
        let picked = fair_share(candidates, &in_flight);
        let counts = count_per_tenant(&picked);
        assert_eq!(counts.get(&quiet), Some(&1));
        assert_eq!(
            counts.get(&noisy),
            Some(&1),
            "its first only: no shared slot is free"
        );
    }

    #[test]
    fn shared_slots_go_round_robin_up_to_each_tenants_cap_one_per_endpoint() {
        let (first, second, third) = (Uuid::now_v7(), Uuid::now_v7(), Uuid::now_v7());
        let endpoint = Uuid::now_v7();
        let mut candidates: Vec<_> = (0..20).map(|_| due(first, Uuid::now_v7())).collect();
        candidates.extend((0..20).map(|_| due(second, Uuid::now_v7())));
        // Three deliveries to one endpoint: one at a time.
        candidates.extend((0..3).map(|_| due(third, endpoint)));
        let picked = fair_share(candidates, &InFlight::default());
        let counts = count_per_tenant(&picked);
        assert_eq!(counts[&first], MAX_PER_TENANT);
        assert_eq!(counts[&second], MAX_PER_TENANT);
        assert_eq!(counts[&third], 1);
        // Round-robin: the third tenant's only delivery comes in the first round.
        assert!(
            picked[..3]
                .iter()
                .any(|delivery| delivery.tenant_id == third)
        );
    }

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
