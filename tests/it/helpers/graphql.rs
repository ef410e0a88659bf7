//! Speaking GraphQL to the app: contract operations and any document over POST,
//! subscriptions over WebSocket, and reading what the responses hold.

use super::app::TestApp;
use futures_util::{SinkExt, StreamExt};
use rust_decimal::Decimal;
use serde_json::{Value, json};
use std::str::FromStr;
use std::time::Duration;
use tokio_tungstenite::tungstenite::Message;
use tokio_tungstenite::tungstenite::client::IntoClientRequest;

impl TestApp {
    /// Sends one operation of the contract (`operations.graphql`) by name.
    pub async fn operation(&self, key: Option<&str>, name: &str, variables: Value) -> Value {
        self.graphql(key, &crate::contract::operation(name), variables)
            .await
    }

    /// Sends any GraphQL document over POST and returns the JSON body.
    pub async fn graphql(&self, key: Option<&str>, query: &str, variables: Value) -> Value {
        let mut request = self
            .http
            .post(format!("http://{}/graphql", self.address))
            .json(&json!({"query": query, "variables": variables}));
        if let Some(key) = key {
            request = request.bearer_auth(key);
        }
        request.send().await.unwrap().json().await.unwrap()
    }

    /// A `graphql-transport-ws` connection that has sent `connection_init` with `key`
    /// and one `subscribe` (id "1"), for the caller to read.
    pub async fn subscribed_socket(
        &self,
        key: &str,
        query: &str,
        variables: Value,
    ) -> tokio_tungstenite::WebSocketStream<tokio_tungstenite::MaybeTlsStream<tokio::net::TcpStream>>
    {
        let mut request = format!("ws://{}/graphql/ws", self.address)
            .into_client_request()
            .unwrap();
        request.headers_mut().insert(
            "sec-websocket-protocol",
            "graphql-transport-ws".parse().unwrap(),
        );
        let (mut socket, _) = tokio_tungstenite::connect_async(request).await.unwrap();
        let send = |value: Value| Message::Text(value.to_string().into());
        socket
            .send(send(json!({"type": "connection_init", "payload": {"authorization": format!("Bearer {key}")}})))
            .await
            .unwrap();
        socket
            .send(send(json!({"id": "1", "type": "subscribe", "payload": {"query": query, "variables": variables}})))
            .await
            .unwrap();
        socket
    }

    /// Subscribes over `graphql-transport-ws` and collects every `next` payload until
    /// the server completes the subscription (bounded by `limit`).
    pub async fn subscribe(
        &self,
        key: &str,
        query: &str,
        variables: Value,
        limit: Duration,
    ) -> Result<Vec<Value>, Value> {
        let mut socket = self.subscribed_socket(key, query, variables).await;
        let mut payloads = Vec::new();
        let collect = async {
            while let Some(message) = socket.next().await {
                let Message::Text(text) = message.unwrap() else {
                    continue;
                };
                let message: Value = serde_json::from_str(&text).unwrap();
                match message["type"].as_str().unwrap() {
                    "connection_ack" | "ping" | "pong" => {}
                    "next" => payloads.push(message["payload"].clone()),
                    "complete" => return Ok(()),
                    "error" => return Err(message["payload"].clone()),
                    other => panic!("unexpected message {other}: {message}"),
                }
            }
            panic!("the server closed the socket before completing");
        };
        tokio::time::timeout(limit, collect)
            .await
            .expect("the subscription did not complete in time")?;
        Ok(payloads)
    }
}

/// A decimal from a GraphQL `Decimal` string.
pub fn decimal(value: &Value) -> Decimal {
    Decimal::from_str(
        value
            .as_str()
            .unwrap_or_else(|| panic!("not a decimal: {value}")),
    )
    .unwrap()
}

/// The `extensions.code` of the first error.
pub fn error_code(response: &Value) -> &str {
    response["errors"][0]["extensions"]["code"]
        .as_str()
        .unwrap_or_else(|| panic!("no error code in {response}"))
}
