//! A connection's subscriptions counted as they arrive, before async-graphql reads them.
//!
//! async-graphql reads every message a socket has ready into its map of operations
//! before it runs any, and polls the whole map on each wake: the per-connection cap
//! applies only when a subscription runs, so a client that sends subscribe messages
//! faster than they run grew the map (and the process) without bound, each wake
//! costing more than the last. The tally sees each message first: it counts the
//! subscriptions the client started and has not seen end, and the bytes their
//! requests hold, and the socket is closed once either passes its bound.

use crate::graphql::MAX_SUBSCRIPTIONS_PER_CONNECTION;
use serde::Deserialize;
use std::collections::HashMap;
use std::sync::{Mutex, PoisonError};

/// Subscriptions a connection may have started and not ended: its cap, with room
/// for a few that will be refused (and completed) past it.
pub const MAX_OUTSTANDING_SUBSCRIPTIONS: usize = MAX_SUBSCRIPTIONS_PER_CONNECTION + 10;

/// Bytes of subscribe messages a connection may have outstanding at once: a
/// subscription request is a few hundred bytes, so this is hundreds of them.
pub const MAX_OUTSTANDING_BYTES: usize = 1024 * 1024;

/// Why a connection is closed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Overflow {
    Subscriptions,
    Bytes,
}

impl Overflow {
    /// The close frame's reason.
    pub fn reason(self) -> &'static str {
        match self {
            Self::Subscriptions => "too many subscriptions started at once on this connection",
            Self::Bytes => "too many bytes of subscriptions outstanding on this connection",
        }
    }
}

/// The outstanding subscriptions of one connection, by id, with their message sizes.
#[derive(Debug, Default)]
pub struct SubscriptionTally {
    outstanding: Mutex<Outstanding>,
}

#[derive(Debug, Default)]
struct Outstanding {
    sizes: HashMap<String, usize>,
    bytes: usize,
}

/// The part of a protocol message the tally reads; the payload is skipped, not kept.
#[derive(Deserialize)]
struct Envelope {
    #[serde(rename = "type")]
    kind: Option<String>,
    id: Option<String>,
}

impl SubscriptionTally {
    /// Notes a message from the client before async-graphql reads it: a subscribe
    /// (`start` in the legacy protocol) adds its id, a `complete` (`stop`) removes it.
    /// Refused when the connection would pass either bound. A message that is not a
    /// protocol message passes: async-graphql closes the socket for it.
    pub fn received(&self, message: &[u8]) -> Result<(), Overflow> {
        let Ok(Envelope {
            kind: Some(kind),
            id: Some(id),
        }) = serde_json::from_slice(message)
        else {
            return Ok(());
        };
        let mut outstanding = self.lock();
        match kind.as_str() {
            "subscribe" | "start" => {
                let replaced = outstanding.sizes.remove(&id).unwrap_or(0);
                outstanding.bytes -= replaced;
                if outstanding.sizes.len() >= MAX_OUTSTANDING_SUBSCRIPTIONS {
                    return Err(Overflow::Subscriptions);
                }
                if outstanding.bytes + message.len() > MAX_OUTSTANDING_BYTES {
                    return Err(Overflow::Bytes);
                }
                outstanding.bytes += message.len();
                outstanding.sizes.insert(id, message.len());
            }
            "complete" | "stop" => outstanding.end(&id),
            _ => {}
        }
        Ok(())
    }

    /// Notes a message async-graphql sends: `complete` ends a subscription (it
    /// finished, failed, or was refused).
    pub fn sent(&self, text: &str) {
        // async-graphql writes the tag first; only completions need parsing.
        if !text.starts_with(r#"{"type":"complete""#) {
            return;
        }
        if let Ok(Envelope { id: Some(id), .. }) = serde_json::from_str(text) {
            self.lock().end(&id);
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Outstanding> {
        self.outstanding
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
    }
}

impl Outstanding {
    fn end(&mut self, id: &str) {
        if let Some(size) = self.sizes.remove(id) {
            self.bytes -= size;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn subscribe(id: usize, padding: usize) -> Vec<u8> {
        format!(
            r#"{{"id":"{id}","type":"subscribe","payload":{{"query":"subscription {{ accountJobUpdates {{ jobId }} }}{}"}}}}"#,
            " ".repeat(padding)
        )
        .into_bytes()
    }

    #[test]
    fn started_subscriptions_count_until_they_end() {
        let tally = SubscriptionTally::default();
        for id in 0..MAX_OUTSTANDING_SUBSCRIPTIONS {
            tally.received(&subscribe(id, 0)).unwrap();
        }
        assert_eq!(
            tally.received(&subscribe(999, 0)),
            Err(Overflow::Subscriptions)
        );
        // The same id again replaces its subscription.
        tally.received(&subscribe(0, 0)).unwrap();
        tally.sent(r#"{"type":"complete","id":"1"}"#);
        tally.received(br#"{"id":"2","type":"complete"}"#).unwrap();
        tally.received(&subscribe(1000, 0)).unwrap();
        tally.received(&subscribe(1001, 0)).unwrap();
        assert!(tally.received(&subscribe(1002, 0)).is_err());
    }

    #[test]
    fn outstanding_bytes_are_bounded() {
        let tally = SubscriptionTally::default();
        let big = 60 * 1024;
        let fits = MAX_OUTSTANDING_BYTES / subscribe(0, big).len();
        for id in 0..fits {
            tally.received(&subscribe(id, big)).unwrap();
        }
        assert_eq!(tally.received(&subscribe(fits, big)), Err(Overflow::Bytes));
        tally.sent(r#"{"type":"complete","id":"0"}"#);
        tally.received(&subscribe(fits, big)).unwrap();
    }

    #[test]
    fn other_messages_pass() {
        let tally = SubscriptionTally::default();
        for message in [&b"not json"[..], br#"{"type":"ping"}"#, br#"[1,2]"#] {
            tally.received(message).unwrap();
        }
    }
}
