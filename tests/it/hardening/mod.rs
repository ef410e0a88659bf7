//! The public API under hostile or careless clients: documents that cost more than
//! they look (fragment bombs, alias floods, big pages multiplied), responses too
//! large to build, sockets left half open, bodies that are not GraphQL requests, key
//! guessing, one tenant flooding its own requests, subscribe floods, keyless sockets,
//! sockets without subscriptions, live connections per tenant and per process,
//! fan-out bursts, introspection floods and keyless request rates. Each scenario was
//! reproduced against the release binary before its fix.

mod bystanders;
mod cheap_refusals;
mod client_limits;
mod connections;
mod documents;
mod live_connections;
mod measuring;
mod protocol;
mod sockets;

use crate::helpers::TestApp;
use reqwest::StatusCode;
use serde_json::{Value, json};
use std::time::Duration;

const GRAPHQL_RESPONSE_JSON: &str = "application/graphql-response+json";

/// Held by each test that loads the server on purpose and measures latency under it:
/// two of them at once on a 2-core box would measure each other.
static LOAD_TEST: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

impl TestApp {
    /// POSTs `query` asking for `application/graphql-response+json`; the status and
    /// the body.
    async fn post_strict(&self, key: Option<&str>, query: &str) -> (StatusCode, Value) {
        let mut request = self
            .http
            .post(self.url())
            .header("accept", GRAPHQL_RESPONSE_JSON)
            .json(&json!({"query": query}));
        if let Some(key) = key {
            request = request.bearer_auth(key);
        }
        let response = request.send().await.unwrap();
        let status = response.status();
        (status, response.json().await.unwrap())
    }
}

/// `/healthz` answers within `limit`, every 20 ms until `until` completes.
async fn healthz_keeps_answering(app: &TestApp, limit: Duration, until: impl Future<Output = ()>) {
    let client = reqwest::Client::new();
    let url = format!("http://{}/healthz", app.address);
    let probes = async {
        loop {
            let response = tokio::time::timeout(limit, client.get(&url).send())
                .await
                .unwrap_or_else(|_| panic!("/healthz did not answer within {limit:?}"))
                .unwrap();
            assert_eq!(response.status(), 200);
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    };
    tokio::select! {
        () = until => {}
        () = probes => {}
    }
}
