//! The text of the file outside its streams: annotations' `/Contents`, property
//! lists' `/ActualText`, the glyph names of encodings, … — read as one more run.
//!
//! Bytes a stream does not claim may still be binary junk (an image's data after
//! an `endstream` hidden in it), and a `(` in it would open a string that swallows
//! every object after it. So the reading restarts at each `N G obj` header, where a
//! reader starts an object afresh. A header may as well be text inside a string,
//! though: the reading it interrupts goes on too, until it reads the same as the
//! fresh one (at once, in a well-formed file), and both count — more than either,
//! which a bound may.

use super::glyphs;
use super::objects::headers;
use super::shown::{Shown, TextBytes};
use super::text::TextCounter;

/// Most interrupted readings followed at once. Past it, no reading restarts, and
/// every byte left counts as shown: no string in them has more. A glyph name a
/// fresh reading would have found in them may be as long as they are.
const MAX_READINGS: usize = 8;

/// What the bytes of `file` outside `streams` (ranges of stream data, in any
/// order, overlapping or not) show.
pub fn shown(file: &[u8], mut streams: Vec<(usize, usize)>) -> Shown {
    streams.sort_unstable();
    let mut readings = Readings::default();
    let mut restarts = headers(file).map(|(_, end)| end).peekable();
    let mut at = 0;
    for (start, end) in streams.into_iter().chain([(file.len(), file.len())]) {
        while at < start {
            let upto = match restarts.peek() {
                // A header inside a stream's data is none.
                Some(&restart) if restart < at => {
                    restarts.next();
                    continue;
                }
                Some(&restart) if restart == at => {
                    restarts.next();
                    readings.restart();
                    continue;
                }
                Some(&restart) => restart.min(start),
                None => start,
            };
            readings.feed(&file[at..upto]);
            at = upto;
        }
        at = at.max(end);
    }
    readings.finish()
}

/// The readings of one run: the one that restarted last, and those it interrupted.
#[derive(Default)]
struct Readings {
    main: TextCounter,
    interrupted: Vec<TextCounter>,
    /// What the readings dropped showed.
    done: Shown,
    /// Too many readings were interrupted: every byte from here counts.
    every_byte: bool,
    bytes_after: u64,
}

impl Readings {
    fn feed(&mut self, bytes: &[u8]) {
        if self.every_byte {
            self.bytes_after = self.bytes_after.saturating_add(bytes.len() as u64);
        }
        for &byte in bytes {
            self.main.step(byte);
            for reading in &mut self.interrupted {
                reading.step(byte);
            }
            if self.interrupted.is_empty() || !self.main.settled() {
                continue;
            }
            let mut index = 0;
            while index < self.interrupted.len() {
                if self.interrupted[index].agrees(&self.main) {
                    let reading = self.interrupted.swap_remove(index);
                    self.done.add(reading.finish());
                } else {
                    index += 1;
                }
            }
        }
    }

    /// A header ends: the reading starts afresh, unless it is between tokens,
    /// where it reads what a fresh one would.
    fn restart(&mut self) {
        if self.main.settled() || self.every_byte {
            return;
        }
        if self.interrupted.len() == MAX_READINGS {
            self.every_byte = true;
            return;
        }
        let fresh = TextCounter::at_object_start();
        self.interrupted
            .push(std::mem::replace(&mut self.main, fresh));
    }

    fn finish(mut self) -> Shown {
        self.done.add(self.main.finish());
        for reading in self.interrupted {
            self.done.add(reading.finish());
        }
        self.done.bytes = self.done.bytes.plus(TextBytes::any(self.bytes_after));
        if self.every_byte {
            self.done.longest_glyph = self
                .done
                .longest_glyph
                .max(glyphs::long_glyph_bytes(self.bytes_after));
        }
        self.done
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn bytes_shown(file: &[u8], streams: Vec<(usize, usize)>) -> u64 {
        shown(file, streams).bytes.all
    }

    #[test]
    fn a_string_open_in_junk_ends_at_the_next_object() {
        let file = b"1 0 obj\n<< >>\nendobj\n( junk\n2 0 obj\n<< /Contents (a note) >>\nendobj\n";
        assert_eq!(bytes_shown(file, Vec::new()), 6);
        // Text that only looks like a header is read both ways.
        let file = b"1 0 obj\n<< /Contents (see 2 0 obj here) >>\nendobj\n";
        assert_eq!(bytes_shown(file, Vec::new()), 16);
        // Streams' data is not read here.
        let file = b"1 0 obj\n<< >>\nstream\n(x) Tj\nendstream\n";
        let data = file.iter().position(|byte| *byte == b'(').unwrap();
        assert_eq!(bytes_shown(file, vec![(data, data + 6)]), 0);
    }

    /// Past the readings followed at once, an encoding's glyph names after them
    /// may be read by no reading left (each is in a string): they count as long as
    /// the bytes left.
    #[test]
    fn past_the_readings_followed_glyph_names_count_as_long_as_the_bytes_left() {
        let mut file = Vec::new();
        for number in 1..=MAX_READINGS + 2 {
            file.extend(format!("{number} 0 obj\n( junk\n").as_bytes());
        }
        let encoding = b"<< /Type /Encoding /Differences [1 /u1F600] >>\nendobj\n";
        file.extend(encoding);
        let shown = shown(&file, Vec::new());
        assert!(shown.longest_glyph >= 4, "{}", shown.longest_glyph);
        assert!(shown.bytes.all >= encoding.len() as u64);
    }

    /// An object whose value is a string may be an annotation's `/Contents` or an
    /// `/ActualText` given by reference (`/Contents 7 0 R`): it counts as shown.
    #[test]
    fn a_string_objects_text_counts() {
        let file =
            b"6 0 obj\n<< /Type /Annot /Contents 7 0 R >>\nendobj\n7 0 obj\n(a note)\nendobj\n";
        assert_eq!(bytes_shown(file, Vec::new()), 6);
        let file = b"7 0 obj <FEFF4E2D4E2D> endobj 8 0 obj<</A (x)>>endobj";
        assert_eq!(bytes_shown(file, Vec::new()), 6);
    }
}
