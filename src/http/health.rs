//! Liveness and readiness probes, and the Prometheus scrape.

use crate::app::App;
use crate::jobs::observe;
use axum::extract::State;
use axum::http::{StatusCode, header};
use axum::response::IntoResponse;
use std::time::Duration;

/// How long the database may take to answer a readiness probe.
const READY_TIMEOUT: Duration = Duration::from_secs(1);

/// The process is up.
pub async fn healthz() -> &'static str {
    "ok"
}

/// One readiness check at a time in this process: probes arriving together wait for
/// their turn within their second, so a slow database never ties up more than one of
/// the pool's connections with probes.
static ONE_CHECK_AT_A_TIME: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

/// The database answers within a second and has every migration this binary knows:
/// 200 `ready`, or 503 with the reason.
pub async fn readyz(State(app): State<App>) -> (StatusCode, String) {
    let check = async {
        let _turn = ONE_CHECK_AT_A_TIME.lock().await;
        app.db.ping().await.map_err(|error| {
            tracing::warn!(error = %error, "readiness check failed");
            "database unreachable".to_owned()
        })?;
        match crate::db::pending_migrations(&app.db, READY_TIMEOUT).await {
            Ok(0) => Ok(()),
            Ok(pending) => Err(format!("{pending} migrations not applied")),
            Err(error) => {
                tracing::warn!(error = %error, "readiness check failed");
                Err(if crate::db::is_transient(&error) {
                    "database unreachable".to_owned()
                } else {
                    "migrations unreadable".to_owned()
                })
            }
        }
    };
    match tokio::time::timeout(READY_TIMEOUT, check).await {
        Ok(Ok(())) => (StatusCode::OK, "ready".to_owned()),
        Ok(Err(reason)) => (StatusCode::SERVICE_UNAVAILABLE, reason),
        Err(_) => (
            StatusCode::SERVICE_UNAVAILABLE,
            "database did not answer within 1 s".to_owned(),
        ),
    }
}

/// This process's metrics in the Prometheus text format. The gauges kept in the
/// database are those the background refresher read last: a scrape runs no query.
pub async fn metrics(State(app): State<App>) -> impl IntoResponse {
    let mut pools = vec![("api", app.db.clone())];
    pools.extend(app.worker_db.clone().map(|db| ("worker", db)));
    pools.extend(app.background_db.clone().map(|db| ("background", db)));
    app.metrics
        .set_live_state(&observe::live_state(&app.bus, &pools));
    (
        [(header::CONTENT_TYPE, "text/plain; version=0.0.4")],
        app.metrics.render(),
    )
}
