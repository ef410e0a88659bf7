//! The provider clients over real HTTP: against wiremock for exact answers and error
//! classes, and against the simulator for its deterministic usage.

mod anthropic;
mod openai;
mod tenant_errors;

use jobledger::llm::ChatRequest;
use jobledger::llm::{Message, Role};
use std::net::SocketAddr;
use tokio::net::TcpListener;

fn request(messages: &[(Role, &str)]) -> ChatRequest {
    ChatRequest {
        model: "claude-sonnet-4-5".to_owned(),
        messages: messages
            .iter()
            .map(|(role, content)| Message::text(*role, *content))
            .collect(),
        max_output_tokens: 256,
        response_schema: None,
        parameters: Default::default(),
        tools: Default::default(),
    }
}

fn hello() -> ChatRequest {
    request(&[(Role::User, "Hello")])
}

/// An address where nothing listens: bound, then let go.
async fn closed_port() -> SocketAddr {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    listener.local_addr().unwrap()
}
