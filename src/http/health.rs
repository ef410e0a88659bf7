//! Liveness and readiness probes.

use super::HttpState;
use axum::extract::State;
use axum::http::StatusCode;

/// The process is up.
pub async fn healthz() -> &'static str {
    "ok"
}

/// The database answers.
pub async fn readyz(State(state): State<HttpState>) -> (StatusCode, &'static str) {
    match state.app.db.ping().await {
        Ok(()) => (StatusCode::OK, "ready"),
        Err(error) => {
            tracing::warn!(error = %error, "readiness check failed");
            (StatusCode::SERVICE_UNAVAILABLE, "database unreachable")
        }
    }
}
