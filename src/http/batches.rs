//! `GET /batches/{id}/results`: a batch's items as JSON lines, streamed a page at a
//! time, for the batch's tenant or the admin.

use crate::accounts::Principal;
use crate::app::App;
use crate::error::ServiceError;
use crate::http::auth::{AuthError, credential, identify};
use crate::jobs::batches::{self, results};
use axum::body::Body;
use axum::extract::{Path, State};
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::{IntoResponse, Response};
use entity::batches as rows;
use futures_util::StreamExt;
use sea_orm::EntityTrait;
use uuid::Uuid;

/// The results of the batch `id`: 401 without a valid key, 404 for a batch the
/// caller cannot see, 503 when the database cannot say.
pub async fn results(
    State(app): State<App>,
    Path(id): Path<String>,
    headers: HeaderMap,
) -> Response {
    let presented = credential(headers.get(header::AUTHORIZATION));
    let identity = match presented {
        Ok(presented) => identify(&app, presented).await,
        Err(error) => Err(error),
    };
    let principal = match identity {
        Ok(Some(identity)) => identity.principal,
        Ok(None) | Err(AuthError::Malformed | AuthError::UnknownKey | AuthError::Expired) => {
            return (
                StatusCode::UNAUTHORIZED,
                [(header::WWW_AUTHENTICATE, "Bearer")],
                "a valid API key is required\n",
            )
                .into_response();
        }
        Err(AuthError::Database(error)) => {
            tracing::warn!(error = %error, "could not check an API key");
            return (StatusCode::SERVICE_UNAVAILABLE, "try again\n").into_response();
        }
    };
    // An id that is not a UUID names no batch anyone can see.
    let Ok(id) = Uuid::parse_str(&id) else {
        return not_found();
    };
    let found = match principal {
        Principal::Tenant { tenant_id } => batches::find_batch(&app.db, tenant_id, id).await,
        // A browser's token reads jobs, never a batch's results.
        Principal::Token(_) => Err(ServiceError::NotFound),
        Principal::Admin => rows::Entity::find_by_id(id)
            .one(&app.db)
            .await
            .map_err(ServiceError::from)
            .and_then(|batch| batch.ok_or(ServiceError::NotFound)),
    };
    let batch = match found {
        Ok(batch) => batch,
        Err(ServiceError::NotFound) => return not_found(),
        // Not a 404: the batch may well exist, and a client told so would give up on it.
        Err(error) => {
            tracing::warn!(batch.id = %id, error = %error, "could not read a batch");
            return (StatusCode::SERVICE_UNAVAILABLE, "try again\n").into_response();
        }
    };
    let lines = results::result_lines(app.db.clone(), batch.clone()).map(move |line| {
        line.map(axum::body::Bytes::from).map_err(|error| {
            // The status line is gone by now: the cut-off body tells the client.
            tracing::warn!(batch.id = %batch.id, error = %error, "a batch's results stopped mid-way");
            std::io::Error::other("database error")
        })
    });
    (
        [(header::CONTENT_TYPE, "application/x-ndjson")],
        Body::from_stream(lines),
    )
        .into_response()
}

fn not_found() -> Response {
    (StatusCode::NOT_FOUND, "no such batch\n").into_response()
}
