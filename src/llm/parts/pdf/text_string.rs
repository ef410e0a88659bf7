//! A text string an extractor outputs as it is (`/ActualText`, an annotation's
//! `/Contents`): UTF-16BE after a byte order mark, PDFDocEncoding otherwise. Its
//! bytes as written do not bound its UTF-8 bytes — a CJK character is two bytes of
//! UTF-16 and three of UTF-8, PDFDocEncoding's 0x80 is `•`, three — so it is
//! decoded, a byte at a time, and counted by the UTF-8 bytes it has.

/// The UTF-8 bytes of a text string, fed as written: a literal's bytes (escapes
/// undone here) or a hex string's digits.
#[derive(Default, PartialEq, Eq)]
pub struct TextString {
    escape: Escape,
    /// The high digit of a hex string's byte being read.
    nibble: Option<u8>,
    /// The string's first byte, until the second tells whether they are a byte
    /// order mark.
    first: Option<u8>,
    /// Bytes decoded so far.
    bytes: u64,
    /// UTF-16BE: the high byte of the unit being read.
    utf16: Option<Utf16>,
    utf8: u64,
}

/// Where a literal string is in an escape sequence.
#[derive(Clone, Copy, Default, PartialEq, Eq)]
enum Escape {
    #[default]
    None,
    /// After a backslash.
    Started,
    /// Octal digits of the value so far.
    Octal { value: u16, digits: u8 },
    /// After a backslash and a carriage return: a line feed continues the line too.
    LineEnd,
}

#[derive(Clone, Copy, Default, PartialEq, Eq)]
struct Utf16 {
    high_byte: Option<u8>,
    /// The last unit was a high surrogate: a low one completes the pair.
    after_high: bool,
}

impl TextString {
    /// A byte of a literal string as written, its closing parenthesis excluded.
    pub fn literal(&mut self, byte: u8) {
        match self.escape {
            Escape::None if byte == b'\\' => self.escape = Escape::Started,
            Escape::None => self.byte(byte),
            Escape::Started => {
                self.escape = Escape::None;
                match byte {
                    b'0'..=b'7' => {
                        self.escape = Escape::Octal {
                            value: u16::from(byte - b'0'),
                            digits: 1,
                        }
                    }
                    b'\r' => self.escape = Escape::LineEnd,
                    b'\n' => {}
                    b'n' => self.byte(b'\n'),
                    b'r' => self.byte(b'\r'),
                    b't' => self.byte(b'\t'),
                    b'b' => self.byte(0x08),
                    b'f' => self.byte(0x0c),
                    // `\(`, `\)`, `\\`, and a backslash before any other byte, which
                    // it leaves as it is.
                    _ => self.byte(byte),
                }
            }
            Escape::Octal { value, digits } => match byte {
                b'0'..=b'7' if digits < 3 => {
                    let value = value * 8 + u16::from(byte - b'0');
                    if digits == 2 {
                        self.escape = Escape::None;
                        self.byte(value as u8);
                    } else {
                        self.escape = Escape::Octal {
                            value,
                            digits: digits + 1,
                        };
                    }
                }
                _ => {
                    self.escape = Escape::None;
                    self.byte(value as u8);
                    self.literal(byte);
                }
            },
            Escape::LineEnd => {
                self.escape = Escape::None;
                if byte != b'\n' {
                    self.literal(byte);
                }
            }
        }
    }

    /// A hex digit of a hex string.
    pub fn hex_digit(&mut self, digit: u8) {
        let value = (digit as char).to_digit(16).unwrap_or(0) as u8;
        match self.nibble.take() {
            None => self.nibble = Some(value),
            Some(high) => self.byte(high << 4 | value),
        }
    }

    /// The UTF-8 bytes of the string read so far (it may end here).
    pub fn utf8(mut self) -> u64 {
        if let Escape::Octal { value, .. } = self.escape {
            self.byte(value as u8);
        }
        if let Some(high) = self.nibble.take() {
            // A missing last digit is a zero.
            self.byte(high << 4);
        }
        let mut utf8 = self.utf8;
        if let Some(first) = self.first {
            utf8 += pdf_doc_bytes(first);
        }
        if self.utf16.is_some_and(|utf16| utf16.high_byte.is_some()) {
            // An odd byte: a reader may show it as U+FFFD.
            utf8 += 3;
        }
        utf8
    }

    fn byte(&mut self, byte: u8) {
        self.bytes += 1;
        if let Some(utf16) = &mut self.utf16 {
            let Some(high) = utf16.high_byte.take() else {
                utf16.high_byte = Some(byte);
                return;
            };
            let unit = u16::from_be_bytes([high, byte]);
            let completes = utf16.after_high && (0xDC00..=0xDFFF).contains(&unit);
            // A pair's high surrogate counts three, as it does alone (a reader shows
            // U+FFFD); the low one that completes it, one more.
            self.utf8 += if completes { 1 } else { unit_bytes(unit) };
            utf16.after_high = (0xD800..=0xDBFF).contains(&unit);
            return;
        }
        match (self.bytes, self.first.take()) {
            (1, _) => self.first = Some(byte),
            (2, Some(0xFE)) if byte == 0xFF => self.utf16 = Some(Utf16::default()),
            (_, first) => {
                self.utf8 += first.map_or(0, pdf_doc_bytes) + pdf_doc_bytes(byte);
            }
        }
    }
}

/// The UTF-8 bytes of a UTF-16 unit (a lone surrogate is shown as U+FFFD, three).
fn unit_bytes(unit: u16) -> u64 {
    match unit {
        0..0x80 => 1,
        0x80..0x800 => 2,
        _ => 3,
    }
}

/// The most UTF-8 bytes of a PDFDocEncoding byte: ASCII one, the accents at
/// 0x18–0x1F two, and above 0x7F, where the punctuation (`•`, `…`, `€`) is three.
fn pdf_doc_bytes(byte: u8) -> u64 {
    match byte {
        0x18..=0x1f => 2,
        0x80.. => 3,
        _ => 1,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn literal(written: &[u8]) -> u64 {
        let mut string = TextString::default();
        written.iter().for_each(|byte| string.literal(*byte));
        string.utf8()
    }

    fn hex(digits: &[u8]) -> u64 {
        let mut string = TextString::default();
        digits.iter().for_each(|digit| string.hex_digit(*digit));
        string.utf8()
    }

    #[test]
    fn utf16_after_a_byte_order_mark_counts_its_utf8_bytes() {
        // "f": one byte, not the four written.
        assert_eq!(hex(b"FEFF0066"), 1);
        // Two CJK characters: three bytes each, more than the two written.
        assert_eq!(hex(b"FEFF4E2D6587"), 6);
        // A surrogate pair, four; a lone surrogate, three; an odd byte, three.
        assert_eq!(hex(b"FEFFD83DDE00"), 4);
        assert_eq!(hex(b"FEFFDE00"), 3);
        assert_eq!(hex(b"FEFF00410"), 1 + 3);
        // A literal, its escapes undone: octal, and the byte a backslash precedes.
        assert_eq!(literal(b"\\376\\377N-e\\207"), 6);
        assert_eq!(literal(b"\\376\\377\\000f"), 1);
        assert_eq!(literal(b"\xfe\xff\x4e\x2d"), 3);
    }

    #[test]
    fn pdf_doc_encoding_counts_high_bytes_three() {
        assert_eq!(literal(b"abc"), 3);
        assert_eq!(literal(b"a\x80b"), 5);
        assert_eq!(literal(b"\\200\\101"), 4);
        assert_eq!(hex(b"8041"), 4);
        assert_eq!(literal(b"\x18"), 2);
        // Escapes that stand for one byte, or none.
        assert_eq!(literal(b"a\\nb\\(\\)\\\\"), 6);
        assert_eq!(literal(b"a\\\r\nb\\\nc"), 3);
        // A string that ends on its first byte, or on an escape.
        assert_eq!(literal(b"\xfe"), 3);
        assert_eq!(literal(b"a\\12"), 2);
    }
}
