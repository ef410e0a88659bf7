//! Streamed output: the text of a streaming attempt batched into `OUTPUT_DELTA`
//! notices small enough for a NOTIFY payload.

use crate::bus::relay;
use crate::bus::{EventBus, EventNotice};
use entity::EventKind;
use sea_orm::DatabaseConnection;
use std::time::Duration;

/// How long text may wait to be batched into one delta notice.
const DELTA_WINDOW: Duration = Duration::from_millis(50);
/// Most bytes of a delta's text once escaped as JSON: the notice travels as a NOTIFY
/// payload, which PostgreSQL caps at 8000 bytes, and escaping can make a control
/// character six bytes.
const MAX_DELTA_BYTES: usize = 2_000;

/// Batches the text of a streaming attempt into `OutputDelta` notices that follow the
/// attempt's `AttemptStarted` event, until the call drops its sender. Returns how many
/// bytes of text it delivered, which the charging policy prices when the call ends
/// without usage.
pub(super) async fn forward_deltas(
    db: DatabaseConnection,
    bus: EventBus,
    started: EventNotice,
    mut pieces: tokio::sync::mpsc::UnboundedReceiver<String>,
) -> u64 {
    let mut delivered = 0;
    while let Some(first) = pieces.recv().await {
        let mut text = first;
        let mut closed = false;
        let window = tokio::time::sleep(DELTA_WINDOW);
        tokio::pin!(window);
        while text.len() < MAX_DELTA_BYTES {
            tokio::select! {
                piece = pieces.recv() => match piece {
                    Some(piece) => text.push_str(&piece),
                    None => {
                        closed = true;
                        break;
                    }
                },
                _ = &mut window => break,
            }
        }
        delivered += text.len() as u64;
        for piece in pieces_that_fit(&text, MAX_DELTA_BYTES) {
            let notice = EventNotice {
                kind: EventKind::OutputDelta,
                delta: Some(piece.to_owned()),
                stored: None,
                ..started.clone()
            };
            relay::broadcast(&db, &bus, notice).await;
        }
        if closed {
            break;
        }
    }
    delivered
}

/// `text` cut at character boundaries into pieces whose JSON-escaped size is at most
/// `limit` bytes (a piece holds at least one character).
fn pieces_that_fit(text: &str, limit: usize) -> Vec<&str> {
    let escaped_size = |character: char| match character {
        '"' | '\\' | '\u{8}' | '\u{c}' | '\n' | '\r' | '\t' => 2,
        control if (control as u32) < 0x20 => 6,
        other => other.len_utf8(),
    };
    let mut pieces = Vec::new();
    let (mut start, mut size) = (0, 0);
    for (index, character) in text.char_indices() {
        let grown = size + escaped_size(character);
        if grown > limit && index > start {
            pieces.push(&text[start..index]);
            start = index;
            size = escaped_size(character);
        } else {
            size = grown;
        }
    }
    if start < text.len() {
        pieces.push(&text[start..]);
    }
    pieces
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn delta_pieces_fit_a_notify_payload_once_escaped() {
        let controls = "\u{1}".repeat(1_999);
        let pieces = pieces_that_fit(&controls, MAX_DELTA_BYTES);
        assert_eq!(pieces.concat(), controls);
        for piece in &pieces {
            assert!(serde_json::to_string(piece).unwrap().len() <= MAX_DELTA_BYTES + 2);
        }
        let words = "héllo \"world\" ".repeat(500);
        let pieces = pieces_that_fit(&words, 100);
        assert_eq!(pieces.concat(), words);
        assert!(
            pieces
                .iter()
                .all(|piece| serde_json::to_string(piece).unwrap().len() <= 102)
        );
        assert_eq!(pieces_that_fit("", 10), Vec::<&str>::new());
    }
}
