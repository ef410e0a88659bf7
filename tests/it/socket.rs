//! A `graphql-transport-ws` client that shows each message as it comes, for tests
//! that watch a connection over time (caps, revocation, close codes).

use futures_util::{SinkExt, StreamExt};
use serde_json::{Value, json};
use std::net::SocketAddr;
use std::time::Duration;
use tokio::net::TcpStream;
use tokio_tungstenite::tungstenite::Message;
use tokio_tungstenite::tungstenite::client::IntoClientRequest;
use tokio_tungstenite::{MaybeTlsStream, WebSocketStream};

/// What the server said next.
#[derive(Debug)]
pub enum Received {
    /// A protocol message (`connection_ack`, `next`, `error`, `complete`, …).
    Message(Value),
    /// A close frame's code and reason.
    Closed(u16, String),
    /// The connection ended without a close frame.
    Dropped,
}

/// One WebSocket connection to `/graphql/ws`.
pub struct GraphqlSocket {
    socket: WebSocketStream<MaybeTlsStream<TcpStream>>,
}

impl GraphqlSocket {
    /// Connects with the `graphql-transport-ws` subprotocol.
    pub async fn connect(address: SocketAddr) -> Self {
        let mut request = format!("ws://{address}/graphql/ws")
            .into_client_request()
            .unwrap();
        request.headers_mut().insert(
            "sec-websocket-protocol",
            "graphql-transport-ws".parse().unwrap(),
        );
        let (socket, _) = tokio_tungstenite::connect_async(request).await.unwrap();
        Self { socket }
    }

    /// Sends one protocol message.
    pub async fn send(&mut self, message: Value) {
        self.socket
            .send(Message::Text(message.to_string().into()))
            .await
            .unwrap();
    }

    /// Sends raw text, whatever it holds.
    pub async fn send_text(&mut self, text: String) -> Result<(), String> {
        self.socket
            .send(Message::Text(text.into()))
            .await
            .map_err(|error| error.to_string())
    }

    /// `connection_init` with `key`, then waits for the answer.
    pub async fn init(&mut self, key: &str) -> Received {
        self.send(json!({"type": "connection_init", "payload": {"authorization": format!("Bearer {key}")}}))
            .await;
        self.next(Duration::from_secs(10)).await
    }

    /// `connection_init` that must be acknowledged.
    pub async fn init_ok(&mut self, key: &str) {
        match self.init(key).await {
            Received::Message(message) if message["type"] == "connection_ack" => {}
            other => panic!("connection_init was not acknowledged: {other:?}"),
        }
    }

    /// Starts subscription `id`.
    pub async fn subscribe(&mut self, id: &str, query: &str, variables: Value) {
        self.send(json!({"id": id, "type": "subscribe", "payload": {"query": query, "variables": variables}}))
            .await;
    }

    /// The next protocol message, close or drop, ignoring pings; panics after `limit`.
    pub async fn next(&mut self, limit: Duration) -> Received {
        tokio::time::timeout(limit, self.next_unbounded())
            .await
            .unwrap_or_else(|_| panic!("nothing came from the server within {limit:?}"))
    }

    /// Like `next`, but `None` when nothing came within `limit`.
    pub async fn next_within(&mut self, limit: Duration) -> Option<Received> {
        tokio::time::timeout(limit, self.next_unbounded())
            .await
            .ok()
    }

    async fn next_unbounded(&mut self) -> Received {
        loop {
            match self.socket.next().await {
                Some(Ok(Message::Text(text))) => {
                    let message: Value = serde_json::from_str(&text).unwrap();
                    if message["type"] == "ping" {
                        self.send(json!({"type": "pong"})).await;
                        continue;
                    }
                    return Received::Message(message);
                }
                Some(Ok(Message::Close(frame))) => {
                    return frame.map_or(Received::Closed(1005, String::new()), |frame| {
                        Received::Closed(frame.code.into(), frame.reason.to_string())
                    });
                }
                Some(Ok(_)) => continue,
                Some(Err(_)) | None => return Received::Dropped,
            }
        }
    }

    /// Waits for the close frame, skipping any message before it; its code.
    pub async fn closed_code(&mut self, limit: Duration) -> u16 {
        let wait = async {
            loop {
                match self.next_unbounded().await {
                    Received::Message(_) => continue,
                    Received::Closed(code, _) => return code,
                    Received::Dropped => panic!("the connection dropped without a close frame"),
                }
            }
        };
        tokio::time::timeout(limit, wait)
            .await
            .unwrap_or_else(|_| panic!("the connection stayed open for {limit:?}"))
    }
}
