//! GraphQL subscriptions over WebSocket, with the API key in `connection_init`.

use super::HttpState;
use super::auth::authenticate;
use async_graphql::Data;
use async_graphql::http::ALL_WEBSOCKET_PROTOCOLS;
use async_graphql_axum::{GraphQLProtocol, GraphQLWebSocket};
use axum::extract::{State, WebSocketUpgrade};
use axum::response::Response;
use std::time::Duration;

/// How long a client may leave a keep-alive ping unanswered (legacy protocol).
const KEEPALIVE_TIMEOUT: Duration = Duration::from_secs(30);

/// Accepts `graphql-transport-ws` and the legacy `graphql-ws` subprotocol.
pub async fn upgrade(
    State(state): State<HttpState>,
    protocol: GraphQLProtocol,
    upgrade: WebSocketUpgrade,
) -> Response {
    upgrade
        .protocols(ALL_WEBSOCKET_PROTOCOLS)
        .on_upgrade(move |socket| {
            let app = state.app.clone();
            GraphQLWebSocket::new(socket, state.schema.clone(), protocol)
                .on_connection_init(move |payload| async move {
                    let credential = payload
                        .get("authorization")
                        .or_else(|| payload.get("Authorization"))
                        .and_then(|value| value.as_str());
                    let mut data = Data::default();
                    match authenticate(&app, credential).await {
                        Ok(Some(principal)) => data.insert(principal),
                        Ok(None) => {}
                        Err(error) => return Err(async_graphql::Error::new(error.to_string())),
                    }
                    Ok(data)
                })
                .keepalive_timeout(KEEPALIVE_TIMEOUT)
                .serve()
        })
}
