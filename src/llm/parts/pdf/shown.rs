//! What a stream shows, added up over the streams of a document: its text bytes,
//! the multipliers its fonts' maps and glyph names give them, and its draws.

use super::forms::Draws;

/// The most UTF-8 bytes a byte of 0x80 or above of a font without a `ToUnicode`
/// map is extracted as: every standard single-byte encoding (WinAnsi, MacRoman,
/// Standard, PDFDoc) maps it into the BMP, and WinAnsi's 0x80 is `€`.
const HIGH_BYTE_UTF8: u64 = 3;

/// String bytes, and how many of them are 0x80 or above.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct TextBytes {
    pub all: u64,
    pub high: u64,
}

impl TextBytes {
    /// `all` bytes of which none is high.
    pub fn low(all: u64) -> Self {
        Self { all, high: 0 }
    }

    /// `all` bytes that may each be high.
    pub fn any(all: u64) -> Self {
        Self { all, high: all }
    }

    pub fn plus(self, other: Self) -> Self {
        Self {
            all: self.all.saturating_add(other.all),
            high: self.high.saturating_add(other.high),
        }
    }

    /// The UTF-8 bytes (so the tokens) these string bytes may be extracted as, when
    /// a `ToUnicode` map or a glyph name gives one code at most `multiplier`: each
    /// byte that many, and a high byte of a font without a map up to three.
    pub fn tokens(self, multiplier: u64) -> u64 {
        let multiplier = multiplier.max(1);
        self.all.saturating_mul(multiplier).saturating_add(
            self.high
                .saturating_mul(HIGH_BYTE_UTF8.saturating_sub(multiplier)),
        )
    }
}

/// What a stream shows: its shown string bytes, the most UTF-8 bytes its
/// `ToUnicode` sections map one code to and the most UTF-8 bytes a glyph of its
/// `/Differences` stands for (which multiply the text of every stream that uses the
/// font, so the document's largest counts), and its draws.
#[derive(Default)]
pub struct Shown {
    pub bytes: TextBytes,
    pub longest_mapping: u64,
    pub longest_glyph: u64,
    pub draws: Draws,
    /// The `/Name BDC`s, by name: each shows its property list's `/ActualText`.
    pub marked: Draws,
}

impl Shown {
    /// Adds what `other` shows: the bytes of both, the larger multipliers.
    pub fn add(&mut self, other: Shown) {
        self.bytes = self.bytes.plus(other.bytes);
        self.longest_mapping = self.longest_mapping.max(other.longest_mapping);
        self.longest_glyph = self.longest_glyph.max(other.longest_glyph);
        self.draws.merge(other.draws);
        self.marked.merge(other.marked);
    }

    /// The most UTF-8 bytes one code of the document's fonts is extracted as.
    pub fn multiplier(&self) -> u64 {
        self.longest_mapping.max(self.longest_glyph).max(1)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn high_bytes_count_three_unless_a_map_gives_more() {
        let text = TextBytes { all: 10, high: 4 };
        assert_eq!(text.tokens(1), 6 + 4 * 3);
        assert_eq!(text.tokens(2), 6 * 2 + 4 * 3);
        assert_eq!(text.tokens(3), 10 * 3);
        assert_eq!(text.tokens(4), 10 * 4);
        assert_eq!(TextBytes::low(10).tokens(1), 10);
    }
}
