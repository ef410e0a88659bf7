//! `ToUnicode` maps: the most UTF-8 bytes one character code of a font maps to.
//!
//! A provider bills the text it extracts, and no tokenizer makes more tokens of a
//! text than it has UTF-8 bytes — but a rare BMP character is three bytes and may be
//! three tokens (o200k's `꒢`), so counting characters or UTF-16 units under-holds.
//! A map's destinations are UTF-16BE: a unit below U+0080 is one byte, below U+0800
//! two, any other three, and a surrogate pair four. A map to ASCII stays at one.

/// Reads the `beginbfchar`/`beginbfrange` sections of a stream, a token at a time,
/// as [`super::text::TextCounter`] meets them.
#[derive(Default, PartialEq, Eq)]
pub struct UnicodeMap {
    section: Option<Section>,
    /// Strings (or numbers) of the entry being read: a `bfchar` entry is a code and
    /// its destination, a `bfrange` one a low code, a high code and a destination (or
    /// an array of them).
    entry: u8,
    /// Inside a `bfrange` destination array: each string is a code's destination.
    in_array: bool,
    /// The hex string being read.
    string: Utf16,
    /// The low code of the range being read, when it was a hex string short enough.
    low: Option<u64>,
    /// The high code less the low one, when both are known.
    span: Option<u64>,
    /// The most UTF-8 bytes one code maps to.
    pub longest: u64,
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum Section {
    Char,
    Range,
}

impl UnicodeMap {
    pub fn active(&self) -> bool {
        self.section.is_some()
    }

    /// `beginbfchar` (`range` false) or `beginbfrange`.
    pub fn begin(&mut self, range: bool) {
        self.section = Some(if range { Section::Range } else { Section::Char });
        self.entry = 0;
        self.in_array = false;
    }

    pub fn end(&mut self) {
        self.section = None;
    }

    /// A hex digit of the hex string being read.
    pub fn digit(&mut self, digit: u8) {
        self.string.digit(digit);
    }

    /// The hex string being read ends.
    pub fn hex_end(&mut self) {
        let string = std::mem::take(&mut self.string);
        let value = string.value;
        self.operand(value, |span| string.utf8(span));
    }

    /// A literal string of `raw_bytes` bytes as written: a reader takes it as a
    /// code or a destination too. Its escapes are not undone here, so each two of
    /// its bytes count as a unit of three.
    pub fn literal(&mut self, raw_bytes: u64) {
        self.operand(None, |_| raw_bytes.div_ceil(2).saturating_mul(3));
    }

    /// A number: a reader takes one for a destination's single character.
    pub fn number(&mut self) {
        self.operand(None, |_| 3);
    }

    /// `[` or `]`: a `bfrange` destination array opens or closes.
    pub fn array(&mut self, open: bool) {
        match self.section {
            Some(Section::Range) if open && self.entry == 2 => self.in_array = true,
            Some(Section::Range) if !open && self.in_array => {
                self.in_array = false;
                self.entry = 0;
            }
            _ => {}
        }
    }

    /// An operand of `value` (a code, when known) whose UTF-8 bytes as a
    /// destination are `utf8` of the span of codes it is the first of.
    fn operand(&mut self, value: Option<u64>, utf8: impl FnOnce(Option<u64>) -> u64) {
        let destination = match self.section {
            None => return,
            Some(Section::Range) if self.in_array => Some(utf8(Some(0))),
            Some(Section::Char) if self.entry == 0 => {
                self.entry = 1;
                None
            }
            Some(Section::Char) => {
                self.entry = 0;
                Some(utf8(Some(0)))
            }
            Some(Section::Range) => match self.entry {
                0 => {
                    self.low = value;
                    self.entry = 1;
                    None
                }
                1 => {
                    self.span = value
                        .zip(self.low)
                        .map(|(high, low)| high.saturating_sub(low));
                    self.entry = 2;
                    None
                }
                _ => {
                    self.entry = 0;
                    Some(utf8(self.span))
                }
            },
        };
        if let Some(bytes) = destination {
            self.longest = self.longest.max(bytes);
        }
    }
}

/// A UTF-16BE hex string, read a digit at a time.
#[derive(Default, PartialEq, Eq)]
struct Utf16 {
    digits: u64,
    /// The high digit of the byte being read.
    nibble: u8,
    /// The high byte of the unit being read.
    high_byte: u8,
    bytes: u64,
    units: u64,
    utf8: u64,
    /// The last unit was a high surrogate: a low one completes the pair.
    after_high: bool,
    /// The last unit, and whether it completed a pair.
    last: Option<(u16, bool)>,
    /// The string as a number, while it fits.
    value: Option<u64>,
}

impl Utf16 {
    fn digit(&mut self, digit: u8) {
        let nibble = (digit as char).to_digit(16).unwrap_or(0) as u8;
        self.digits += 1;
        if self.digits % 2 == 1 {
            self.nibble = nibble;
        } else {
            self.byte(self.nibble << 4 | nibble);
        }
    }

    fn byte(&mut self, byte: u8) {
        self.value = match self.bytes {
            0 => Some(byte.into()),
            _ => self
                .value
                .and_then(|value| value.checked_mul(256))
                .map(|value| value | u64::from(byte)),
        };
        self.bytes += 1;
        if self.bytes % 2 == 1 {
            self.high_byte = byte;
            return;
        }
        let unit = u16::from_be_bytes([self.high_byte, byte]);
        let completes = self.after_high && (0xDC00..=0xDFFF).contains(&unit);
        // A pair's high surrogate counts three, as it does alone (a reader shows
        // U+FFFD); the low one that completes it, one more.
        self.utf8 += if completes {
            1
        } else {
            utf8_bytes(unit.into())
        };
        self.after_high = (0xD800..=0xDBFF).contains(&unit);
        self.last = Some((unit, completes));
        self.units += 1;
    }

    /// The most UTF-8 bytes the string maps a code to, as the destination of `span`
    /// codes more than the first (each one's last unit the previous one's plus one,
    /// as readers carry it); a span not known may take the last unit anywhere.
    fn utf8(mut self, span: Option<u64>) -> u64 {
        if self.digits % 2 == 1 {
            // A missing last digit is a zero.
            self.byte(self.nibble << 4);
        }
        // An odd byte may be taken for a unit of its own.
        let odd = if self.bytes % 2 == 1 { 3 } else { 0 };
        let anywhere = self.units.saturating_mul(3) + odd;
        let Some((last, completes)) = self.last else {
            return odd;
        };
        let Some(span) = span else {
            return anywhere;
        };
        let top = u64::from(last).saturating_add(span);
        if top > 0xFFFF {
            // It carries into the units before it.
            return anywhere;
        }
        let before = self.utf8
            - if completes {
                1
            } else {
                utf8_bytes(last.into())
            };
        let last = match completes {
            true if top <= 0xDFFF => 1,
            _ => utf8_bytes(top),
        };
        before + last + odd
    }
}

/// The UTF-8 bytes of a BMP unit (a lone surrogate is shown as U+FFFD, three).
fn utf8_bytes(unit: u64) -> u64 {
    match unit {
        0..0x80 => 1,
        0x80..0x800 => 2,
        _ => 3,
    }
}

#[cfg(test)]
mod tests {
    use super::super::text::TextCounter;

    /// The most UTF-8 bytes the map `sections` gives a code, its tokens fed as a
    /// content stream's counter feeds them.
    fn longest(sections: &[u8]) -> u64 {
        let mut counter = TextCounter::default();
        counter.feed(sections);
        counter.finish().longest_mapping
    }

    #[test]
    fn destinations_count_their_utf8_bytes() {
        assert_eq!(longest(b"1 beginbfchar <01> <0041> endbfchar"), 1);
        assert_eq!(longest(b"1 beginbfchar <0001> <00E9> endbfchar"), 2);
        // A rare BMP character, three bytes.
        assert_eq!(longest(b"1 beginbfchar <01> <A4A2> endbfchar"), 3);
        // A surrogate pair, four; a lone surrogate, three.
        assert_eq!(longest(b"1 beginbfchar <01> <D83DDE00> endbfchar"), 4);
        assert_eq!(longest(b"1 beginbfchar <01> <DE00D83D> endbfchar"), 6);
        // Codes are no destinations: a two-byte code above U+07FF maps to ASCII.
        assert_eq!(
            longest(b"2 beginbfchar <FFFF> <0041> <EEEE> <0042> endbfchar"),
            1
        );
        // An odd byte, and a literal destination.
        assert_eq!(longest(b"1 beginbfchar <01> <004100> endbfchar"), 4);
        assert_eq!(longest(b"1 beginbfchar <01> (ab) endbfchar"), 3);
    }

    #[test]
    fn a_range_counts_the_last_code_it_maps() {
        // Codes 0x21..0x7E to ASCII.
        assert_eq!(longest(b"1 beginbfrange <21> <7E> <0021> endbfrange"), 1);
        // 0x41 + 0xFF reaches U+0140, two bytes.
        assert_eq!(longest(b"1 beginbfrange <00> <FF> <0041> endbfrange"), 2);
        assert_eq!(
            longest(b"1 beginbfrange <0000> <0800> <0041> endbfrange"),
            3
        );
        // Past U+FFFF the last unit carries into the one before.
        assert_eq!(
            longest(b"1 beginbfrange <0000> <0002> <0041FFFF> endbfrange"),
            6
        );
        // An array gives each code its own.
        assert_eq!(
            longest(b"1 beginbfrange <00> <01> [<0041> <A4A2>] endbfrange"),
            3
        );
        // A code not read as a number: the last unit may be anything.
        assert_eq!(longest(b"1 beginbfrange (a) <7E> <0021> endbfrange"), 3);
    }
}
