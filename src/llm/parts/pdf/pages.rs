//! The pages of a PDF, counted without a parser: the largest `/Count` of a page tree
//! node, and the `/Type /Page` dictionaries, in bytes fed a chunk at a time.

use super::{find, rfind, skip_space};

/// Bytes kept before and after a `/Type` to read its dictionary: a page tree node's
/// `/Count` is looked for within them.
const CONTEXT_BYTES: usize = 1024;

/// Counts the pages of bytes fed in chunks: each `/Type` is read once enough bytes
/// follow it, with the bytes before it kept from the chunk before.
#[derive(Default)]
pub struct Pages {
    /// The largest `/Count` of a `/Type /Pages` node: the root's is the document's.
    pub tree_count: u32,
    /// `/Type /Page` dictionaries seen.
    pub objects: u32,
    /// The bytes kept, and the offset in them from which `/Type` is still to be read.
    kept: Vec<u8>,
    unread: usize,
}

impl Pages {
    pub fn feed(&mut self, bytes: &[u8]) {
        self.kept.extend_from_slice(bytes);
        let readable = self.kept.len().saturating_sub(CONTEXT_BYTES);
        self.read_until(readable);
        let drop = self
            .kept
            .len()
            .saturating_sub(2 * CONTEXT_BYTES)
            .min(self.unread);
        self.kept.drain(..drop);
        self.unread -= drop;
    }

    /// Reads what is left: the bytes end here.
    pub fn finish(&mut self) {
        self.read_until(self.kept.len());
        self.kept = Vec::new();
        self.unread = 0;
    }

    pub fn add(&mut self, other: &Self) {
        self.tree_count = self.tree_count.max(other.tree_count);
        self.objects = self.objects.saturating_add(other.objects);
    }

    /// Reads every `/Type` that starts before `end`.
    fn read_until(&mut self, end: usize) {
        let bytes = &self.kept;
        let mut at = self.unread;
        while let Some(found) = find(&bytes[at..], b"/Type").filter(|found| at + found < end) {
            at += found + b"/Type".len();
            let rest = skip_space(&bytes[at..]);
            let Some(name) = rest.strip_prefix(b"/Page") else {
                continue;
            };
            if name.starts_with(b"s") {
                if let Some(count) = count_in_dictionary(bytes, at) {
                    self.tree_count = self.tree_count.max(count);
                }
            } else if !name.first().is_some_and(u8::is_ascii_alphanumeric) {
                self.objects = self.objects.saturating_add(1);
            }
        }
        self.unread = at.max(end.min(bytes.len()));
    }
}

/// The `/Count N` of the dictionary around `at`: looked for within the dictionary's
/// bounds (from the last `<<` before to the next `>>` after, each within
/// [`CONTEXT_BYTES`]; a page tree node holds no nested dictionary before its count in
/// practice, and a miss only loses the tree's count, never the page objects).
fn count_in_dictionary(bytes: &[u8], at: usize) -> Option<u32> {
    let from = at.saturating_sub(CONTEXT_BYTES);
    let start = from + rfind(&bytes[from..at], b"<<")?;
    let to = (at + CONTEXT_BYTES).min(bytes.len());
    let end = at + find(&bytes[at..to], b">>")?;
    let dictionary = &bytes[start..end];
    let position = find(dictionary, b"/Count")?;
    let digits: Vec<u8> = skip_space(&dictionary[position + b"/Count".len()..])
        .iter()
        .copied()
        .take_while(u8::is_ascii_digit)
        .collect();
    std::str::from_utf8(&digits).ok()?.parse().ok()
}
