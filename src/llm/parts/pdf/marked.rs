//! Marked content that names a property list (`/Tag /Name BDC`): the list is in
//! the resources' `/Properties`, and its `/ActualText` is output on every use of
//! the name — so it counts once per use, not once per document.

use super::objects::Objects;
use super::skip_space;
use super::streams::{name, raw_name_length};
use super::text::TextCounter;
use std::collections::HashMap;

/// The `/ActualText` bytes of the property lists of every `/Properties`
/// dictionary, by name: a name bound in several counts its largest.
pub struct Properties {
    by_name: HashMap<Vec<u8>, u64>,
    largest: u64,
}

impl Properties {
    /// Those of the file and of its object streams.
    pub fn everywhere(file: &[u8], objects: &Objects) -> Self {
        let mut by_name: HashMap<Vec<u8>, u64> = HashMap::new();
        for haystack in std::iter::once(file).chain(objects.streams()) {
            for at in memchr::memmem::find_iter(haystack, b"/Properties") {
                let rest = &haystack[at + b"/Properties".len()..];
                if raw_name_length(rest) > 0 {
                    continue;
                }
                for dictionary in objects.dictionaries(rest).unwrap_or_default() {
                    entries(dictionary, objects, &mut by_name);
                }
            }
        }
        let largest = by_name.values().copied().max().unwrap_or(0);
        Self { by_name, largest }
    }

    /// The `/ActualText` bytes the uses `marked` show: a name not bound anywhere
    /// read may be bound where a dictionary was not, and counts the largest.
    pub fn shown(&self, marked: &super::Draws) -> u64 {
        marked.total(
            |name| self.by_name.get(name).copied().unwrap_or(self.largest),
            self.largest,
        )
    }
}

/// Every `/Name` of `dictionary` whose value is a dictionary, given or by
/// reference, with the text it shows (its `/ActualText`).
fn entries(dictionary: &[u8], objects: &Objects, by_name: &mut HashMap<Vec<u8>, u64>) {
    let inner = &dictionary[2..dictionary.len().saturating_sub(2).max(2)];
    let mut at = 0;
    while let Some(found) = inner[at..].iter().position(|byte| *byte == b'/') {
        let start = at + found + 1;
        let rest = &inner[start..];
        let end = raw_name_length(rest);
        at = start + end;
        let value = skip_space(&rest[end..]);
        let Some(lists) = objects.dictionaries(value) else {
            continue;
        };
        for list in lists {
            let mut counter = TextCounter::default();
            counter.feed(list);
            // Only its strings output as they are show, counted in UTF-8.
            let bytes = counter.finish().bytes.all;
            let entry = by_name.entry(name(rest)).or_default();
            *entry = (*entry).max(bytes);
            if value.starts_with(b"<<") {
                // Its keys are no names of the resources.
                at = list.as_ptr() as usize - inner.as_ptr() as usize + list.len();
            }
        }
    }
}
