//! The text a PDF shows, bounded without rendering it: the bytes of the string
//! operands of the text-showing operators (`Tj`, `TJ`, `'`, `"`) in its content
//! streams. A provider that reads a document extracts that text (one character or
//! more per character code) and bills its tokens; every token covers at least one
//! UTF-8 byte, so these bytes, times the most UTF-8 bytes a `ToUnicode` map gives
//! one code ([`super::unicode`]), bound what the text can count.
//!
//! A shown byte of 0x80 or above is counted apart ([`TextBytes`]): a font without
//! a `ToUnicode` map may show it as three UTF-8 bytes.
//!
//! Some strings are text an extractor outputs though no operator shows them: a
//! marked-content `/ActualText`, an annotation's `/Contents`; they count too, by the
//! UTF-8 bytes they decode to ([`TextString`]). And a
//! font's `/Differences` may name a glyph that one code shows as several UTF-8 bytes
//! (`/f_f_i`, `/uni00660069`, `/Euro`; [`super::glyphs`]): the largest counts like a
//! `ToUnicode` map's.
//!
//! It also counts the stream's `Do`s by the name they draw: a form XObject's text
//! is shown again on every draw ([`super::forms`]).
//!
//! The counter reads bytes one at a time and keeps no more than an operator's
//! name, so a stream of any size is counted in chunks as it is inflated.

use super::forms::Draws;
use super::glyphs;
use super::shown::{Shown, TextBytes};
use super::text_string::TextString;
use super::unicode::UnicodeMap;

/// The longest operator the counter tells apart (`beginbfrange`); a longer run of
/// regular characters is no operator it acts on.
const LONGEST_OPERATOR: usize = 12;
/// The longest name kept as the operand of a `Do` (a PDF name has at most 127
/// bytes); a `Do` of a longer one draws a name not known.
const LONGEST_NAME: usize = 127;

/// Counts the shown text of every byte it is fed, in order, across chunks.
#[derive(Default)]
pub struct TextCounter {
    state: State,
    /// Regular characters of the token being read (a name, number or operator).
    token: Vec<u8>,
    /// The token is longer than any operator acted on.
    token_long: bool,
    /// Bytes of the string being read.
    string_bytes: u64,
    /// Bytes of 0x80 or above of the string being read: a raw byte of a literal, a
    /// byte of a hex string whose high digit is 8 or above.
    string_high: u64,
    /// Hex digits of the hex string being read.
    hex_digits: u64,
    /// String bytes among the operands since the last operator.
    pending: TextBytes,
    /// String bytes given to text-showing operators, and the UTF-8 bytes of the
    /// strings output as they are.
    shown: TextBytes,
    /// The `ToUnicode` map's `beginbfchar`/`beginbfrange` sections.
    map: UnicodeMap,
    /// The name operand since the last operator, `#xx` decoded; `None` when none,
    /// or when it was too long to keep.
    name: Option<Vec<u8>>,
    draws: Draws,
    marked: Draws,
    /// Regular characters of the token being read, however long.
    token_bytes: u64,
    /// The string that follows is output though no operator shows it (it follows
    /// `/ActualText` or `/Contents`, or an object's header).
    string_shown: bool,
    /// The string being read is output as it is: decoded to count its UTF-8 bytes.
    as_is: Option<TextString>,
    /// The name just read is `/Differences`: its array may follow.
    differences_next: bool,
    /// Inside a `/Differences` array.
    in_differences: bool,
    longest_glyph: u64,
    /// Inside an inline image's data (after `ID`): its bytes are pixels, not
    /// operators, so a `(` in them must not open a string that swallows the text
    /// after the image.
    image: Option<InlineImage>,
    /// Reads an image's data as operators: the shadow of one, which skips no
    /// image of its own (so that nested `ID`s cost no more than one reading).
    shadow: bool,
}

/// An inline image's data being skipped, up to the `EI` that ends it: `EI`
/// preceded by white space and followed by white space or the end of the data.
struct InlineImage {
    /// Bytes of the data so far, and of 0x80 or above.
    bytes: TextBytes,
    /// The data read as operators, as it was before it was skipped: when no `EI`
    /// ends the image, what a reader makes of it is not known, and it counts at
    /// least as much as it did then.
    shadow: Box<TextCounter>,
    /// The last byte was white space (the `ID` ends with one).
    after_space: bool,
    /// How much of `EI` follows that white space.
    matched: u8,
}

#[derive(Clone, Copy, Default, PartialEq, Eq)]
enum State {
    #[default]
    Between,
    /// After a `<`: a hex string, or a dictionary when another `<` follows.
    AfterLess,
    Literal {
        depth: u32,
        escaped: bool,
    },
    Hex,
    Comment,
}

impl TextCounter {
    /// A counter that starts reading just after an object's `N G obj` header: a
    /// string that is the object's whole value may be named by reference as an
    /// annotation's `/Contents` or an `/ActualText`, and is output as it is.
    pub fn at_object_start() -> Self {
        Self {
            string_shown: true,
            ..Self::default()
        }
    }

    /// Counts `bytes`, following on from what was fed before.
    pub fn feed(&mut self, bytes: &[u8]) {
        for &byte in bytes {
            self.step(byte);
        }
    }

    /// What the stream shows, once every byte is fed.
    pub fn finish(mut self) -> Shown {
        match self.image.take() {
            // The data ends with the image's `EI`.
            Some(image) if image.matched == 2 => {}
            // No `EI` ends the image: each of its bytes counts as text (no string
            // in it has more), and whatever else the bytes read as operators show.
            Some(image) => {
                let shadow = image.shadow.finish();
                // Its strings output as they are may decode to more than their bytes.
                self.shown = self.shown.plus(TextBytes {
                    all: image.bytes.all.max(shadow.bytes.all),
                    high: image.bytes.high.max(shadow.bytes.high),
                });
                self.map.longest = self.map.longest.max(shadow.longest_mapping);
                self.longest_glyph = self.longest_glyph.max(shadow.longest_glyph);
                self.draws.merge(shadow.draws);
            }
            // The data may end on an operator.
            None if self.state == State::Between => self.end_token(),
            // The data ends in a string. One output as it is, a reader takes to the
            // end. One that is an operand has no operator left to show it.
            None => {
                if let Some(string) = self.as_is.take() {
                    self.shown.all = self.shown.all.saturating_add(string.utf8());
                }
            }
        }
        Shown {
            bytes: self.shown,
            longest_mapping: self.map.longest,
            longest_glyph: self.longest_glyph,
            draws: self.draws,
            marked: self.marked,
        }
    }

    /// Between tokens, strings and images: a reading of other bytes that is here
    /// too reads the same from now on, when [`Self::agrees`] says so.
    pub fn settled(&self) -> bool {
        self.state == State::Between && self.token.is_empty() && self.image.is_none()
    }

    /// Both are settled, with the same operands pending and the same sections
    /// open: what follows counts the same for both.
    pub fn agrees(&self, other: &TextCounter) -> bool {
        self.settled()
            && other.settled()
            && self.pending == other.pending
            && self.string_shown == other.string_shown
            && self.differences_next == other.differences_next
            && self.in_differences == other.in_differences
            && self.name == other.name
            && self.map == other.map
    }

    /// Counts one more byte.
    pub fn step(&mut self, byte: u8) {
        if let Some(image) = &mut self.image {
            if image.matched == 2 && is_space(byte) {
                self.image = None;
                self.state = State::Between;
                return;
            }
            image.matched = match (image.matched, byte) {
                (0, b'E') if image.after_space => 1,
                (1, b'I') => 2,
                _ => 0,
            };
            image.after_space = is_space(byte);
            image.bytes = image.bytes.plus(TextBytes {
                all: 1,
                high: u64::from(byte >= 0x80),
            });
            image.shadow.step(byte);
            return;
        }
        match self.state {
            State::Literal { depth, escaped } => {
                if escaped {
                    self.state = State::Literal {
                        depth,
                        escaped: false,
                    };
                    self.string_byte(byte);
                    return;
                }
                let depth = match byte {
                    b'(' => depth + 1,
                    b')' => depth - 1,
                    _ => depth,
                };
                if depth == 0 {
                    self.end_string(self.string_bytes);
                    self.map.literal(self.string_bytes);
                    self.state = State::Between;
                } else {
                    // Raw bytes: an escape only shortens what it stands for (and
                    // one of a high byte is four).
                    self.string_byte(byte);
                    self.state = State::Literal {
                        depth,
                        escaped: byte == b'\\',
                    };
                }
            }
            State::Hex => match byte {
                b'>' => {
                    let bytes = self.hex_digits.div_ceil(2);
                    self.end_string(bytes);
                    self.map.hex_end();
                    self.state = State::Between;
                }
                byte if byte.is_ascii_hexdigit() => {
                    if self.hex_digits.is_multiple_of(2) && !matches!(byte, b'0'..=b'7') {
                        self.string_high += 1;
                    }
                    self.hex_digits += 1;
                    if let Some(string) = &mut self.as_is {
                        string.hex_digit(byte);
                    }
                    if self.map.active() {
                        self.map.digit(byte);
                    }
                }
                _ => {}
            },
            State::Comment => {
                if byte == b'\r' || byte == b'\n' {
                    self.state = State::Between;
                }
            }
            State::AfterLess => {
                if byte == b'<' {
                    // A dictionary, not the string an `/ActualText` would name.
                    self.string_shown = false;
                    self.state = State::Between;
                } else {
                    self.hex_digits = 0;
                    self.string_high = 0;
                    self.as_is = self.string_shown.then(TextString::default);
                    self.state = State::Hex;
                    self.step(byte);
                }
            }
            State::Between => self.between(byte),
        }
    }

    /// A byte of the literal string being read, as written.
    fn string_byte(&mut self, byte: u8) {
        self.string_bytes += 1;
        self.string_high += u64::from(byte >= 0x80);
        if let Some(string) = &mut self.as_is {
            string.literal(byte);
        }
    }

    /// A string of `bytes` bytes ends: an operand, or text output as it is.
    fn end_string(&mut self, bytes: u64) {
        self.pending = self.pending.plus(TextBytes {
            all: bytes,
            high: self.string_high,
        });
        self.string_shown = false;
        if let Some(string) = self.as_is.take() {
            self.shown.all = self.shown.all.saturating_add(string.utf8());
        }
    }

    fn between(&mut self, byte: u8) {
        let delimiter = matches!(
            byte,
            b'(' | b')' | b'<' | b'>' | b'[' | b']' | b'{' | b'}' | b'/' | b'%'
        ) || is_space(byte);
        if !delimiter {
            self.token_bytes += 1;
            let longest = if self.token.first() == Some(&b'/') {
                LONGEST_NAME + 1
            } else {
                LONGEST_OPERATOR
            };
            if self.token.len() < longest {
                self.token.push(byte);
            } else {
                self.token_long = true;
            }
            return;
        }
        self.end_token();
        if self.image.is_some() {
            // The white space that ends `ID`; the image's data follows.
            return;
        }
        match byte {
            b'(' => {
                self.string_bytes = 0;
                self.string_high = 0;
                self.as_is = self.string_shown.then(TextString::default);
                self.state = State::Literal {
                    depth: 1,
                    escaped: false,
                };
            }
            b'<' => self.state = State::AfterLess,
            b'[' => {
                self.in_differences = std::mem::take(&mut self.differences_next);
                self.string_shown = false;
                self.map.array(true);
            }
            b']' => {
                self.in_differences = false;
                self.map.array(false);
            }
            b'%' => self.state = State::Comment,
            // A name's characters follow its slash: its token starts with it.
            b'/' => self.token.push(byte),
            _ => {}
        }
    }

    /// Acts on the regular token just read: a name or a number is an operand, any
    /// other token an operator, which takes the operands before it.
    fn end_token(&mut self) {
        if self.token.is_empty() {
            return;
        }
        let token = std::mem::take(&mut self.token);
        let long = std::mem::take(&mut self.token_long);
        let token_bytes = std::mem::take(&mut self.token_bytes);
        self.differences_next = false;
        self.string_shown = false;
        let operand = token[0] == b'/'
            || token
                .iter()
                .all(|byte| byte.is_ascii_digit() || matches!(byte, b'+' | b'-' | b'.'));
        if operand {
            if token[0] == b'/' {
                let name = super::streams::name(&token[1..]);
                if self.in_differences {
                    let bytes = if long {
                        glyphs::long_glyph_bytes(token_bytes)
                    } else {
                        glyphs::glyph_bytes(&name)
                    };
                    self.longest_glyph = self.longest_glyph.max(bytes);
                }
                self.string_shown = matches!(name.as_slice(), b"ActualText" | b"Contents");
                self.differences_next = name == b"Differences";
                self.name = (!long).then_some(name);
            } else {
                self.map.number();
            }
            return;
        }
        let name = self.name.take();
        if !long {
            match token.as_slice() {
                b"Tj" | b"TJ" | b"'" | b"\"" => self.shown = self.shown.plus(self.pending),
                b"Do" => self.draws.add(name),
                b"BDC" => self.marked.add(name),
                b"ID" if !self.shadow => {
                    self.image = Some(InlineImage {
                        bytes: TextBytes::default(),
                        shadow: Box::new(TextCounter {
                            shadow: true,
                            ..TextCounter::default()
                        }),
                        after_space: false,
                        matched: 0,
                    })
                }
                b"beginbfchar" => self.map.begin(false),
                b"beginbfrange" => self.map.begin(true),
                b"endbfchar" | b"endbfrange" => self.map.end(),
                _ => {}
            }
        }
        self.pending = TextBytes::default();
    }
}

fn is_space(byte: u8) -> bool {
    matches!(byte, b' ' | b'\t' | b'\r' | b'\n' | b'\x0c' | b'\0')
}

#[cfg(test)]
mod tests {
    use super::*;

    fn shown(chunks: &[&[u8]]) -> Shown {
        let mut counter = TextCounter::default();
        for chunk in chunks {
            counter.feed(chunk);
        }
        counter.finish()
    }

    fn count(chunks: &[&[u8]]) -> u64 {
        let shown = shown(chunks);
        shown.bytes.tokens(shown.multiplier())
    }

    #[test]
    fn the_operands_of_text_showing_operators_count() {
        assert_eq!(count(&[b"BT /F1 12 Tf 72 712 Td (Hello) Tj ET"]), 5);
        // An array of strings and kerning numbers.
        assert_eq!(count(&[b"[(Hel) -20 (lo)] TJ"]), 5);
        // The next-line operators; a hex string is half its digits.
        assert_eq!(count(&[b"(ab) ' 1 2 (cde) \" <48656C6C6F> Tj"]), 10);
        // Nested parentheses and escapes count as written.
        assert_eq!(count(&[b"(a(b)c\\)d) Tj"]), 8);
    }

    #[test]
    fn strings_no_text_operator_shows_count_nothing() {
        assert_eq!(count(&[b"/Span << /Alt (x) >> BDC (hidden) Td EMC"]), 0);
        assert_eq!(count(&[b"% (a comment) Tj\n"]), 0);
        assert_eq!(count(&[b"(Tj)"]), 0);
    }

    #[test]
    fn chunks_split_anywhere_count_as_one_stream() {
        let whole = b"BT [(Hello) 5 <776f726c64>] TJ (again) Tj ET";
        for cut in 0..whole.len() {
            let (first, second) = whole.split_at(cut);
            assert_eq!(count(&[first, second]), 15, "cut at {cut}");
        }
    }

    #[test]
    fn a_unicode_map_that_gives_a_code_many_characters_multiplies_the_text() {
        // One code mapped to three UTF-16 units (a ligature "ffi").
        let map = b"1 beginbfchar <01> <006600660069> endbfchar";
        assert_eq!(count(&[map, b" (\x01\x01) Tj"]), 2 * 3);
        // A rare BMP character: one unit, three UTF-8 bytes, as many tokens.
        let map = b"1 beginbfchar <01> <A4A2> endbfchar";
        assert_eq!(count(&[map, b" (\x01\x01) Tj"]), 2 * 3);
        // A map to ASCII keeps one token per byte.
        assert_eq!(
            count(&[b"1 beginbfrange <00> <5e> <0021> endbfrange (abc) Tj"]),
            3
        );
    }

    #[test]
    fn text_output_without_an_operator_counts() {
        // Marked content's replacement text, literal or hex (UTF-16).
        assert_eq!(
            count(&[b"/Span << /ActualText (ffi) >> BDC (\x01) Tj EMC"]),
            4
        );
        assert_eq!(count(&[b"/Span <</ActualText<FEFF0066>>> BDC EMC"]), 1);
        // An annotation's text; a page's `/Contents` is a reference, and counts none.
        assert_eq!(
            count(&[b"<< /Type /Annot /Subtype /Text /Contents (a note) >>"]),
            6
        );
        assert_eq!(count(&[b"<< /Type /Page /Contents 4 0 R >> (x)"]), 0);
        assert_eq!(count(&[b"<< /Contents [4 0 R] >> (x)"]), 0);
        assert_eq!(count(&[b"<< /Contents << /A (x) >> >>"]), 0);
    }

    #[test]
    fn an_inline_image_is_skipped_to_its_end() {
        // A `(` in the pixels opened a string that took the text after the image.
        let image = b"BI /W 1 /H 1 /BPC 8 /CS /G ID ((((\nEI (after) Tj";
        assert_eq!(count(&[image]), 5);
        for cut in 0..image.len() {
            let (first, second) = image.split_at(cut);
            assert_eq!(count(&[first, second]), 5, "cut at {cut}");
        }
        // `EI` inside the data, not after white space, does not end it.
        assert_eq!(count(&[b"BI ID xEI ( EI (ab) Tj"]), 2);
        // The image ends the data.
        assert_eq!(count(&[b"(ab) Tj BI ID ( EI"]), 2);
        // No `EI` ends it: every byte after `ID ` counts, and what its operators
        // show would exceed no more.
        let data: &[u8] = b"((cd) Tj";
        assert_eq!(count(&[b"(ab) Tj BI ID ", data]), 2 + data.len() as u64);
        let data: &[u8] = b"1 beginbfchar <01> <006600660069> endbfchar";
        assert_eq!(count(&[b"BI ID ", data]), data.len() as u64 * 3);
    }

    #[test]
    fn ligature_glyph_names_multiply_the_text() {
        let text = b" (\x01\x02) Tj";
        let encoding = |differences: &[u8]| {
            let mut chunk = b"<< /Type /Encoding /Differences [".to_vec();
            chunk.extend(differences);
            chunk.extend(b"] >>");
            count(&[&chunk, text])
        };
        assert_eq!(encoding(b"1 /a /b"), 2);
        assert_eq!(encoding(b"1 /f_f_i /a"), 2 * 3);
        assert_eq!(encoding(b"1/a_b_c_d.alt/e"), 2 * 4);
        assert_eq!(encoding(b"1 /uni006600660069006C"), 2 * 4);
        assert_eq!(encoding(b"1 /ffl"), 2 * 3);
        // Each by the UTF-8 bytes of what it names, not its characters.
        assert_eq!(encoding(b"1 /Euro /a"), 2 * 3);
        assert_eq!(encoding(b"1 /quotedblleft"), 2 * 3);
        assert_eq!(encoding(b"1 /uni4E2D"), 2 * 3);
        assert_eq!(encoding(b"1 /u1F600"), 2 * 4);
        // A name of no known rule: the most one code point has.
        assert_eq!(encoding(b"1 /g12"), 2 * 4);
        // A Latin encoding of ASCII names stays at one byte a code.
        assert_eq!(encoding(b"32 /space /exclam 48 /zero /one 65 /A /B"), 2);
        // A name too long to keep counts the most its bytes may name.
        let long = format!("1 /{}", "a_".repeat(100));
        assert_eq!(encoding(long.as_bytes()), 2 * 200 * 4);
        // Names outside the array are no glyphs.
        assert_eq!(count(&[b"/f_f_i /a_b_c [/x] ", text]), 2);
    }

    /// A font without a `ToUnicode` map shows a byte of 0x80 or above as up to three
    /// UTF-8 bytes (WinAnsi's 0x80 is `€`); a map that gives more multiplies it alone.
    #[test]
    fn high_bytes_count_three() {
        assert_eq!(count(&[b"(a\x80b) Tj"]), 1 + 3 + 1);
        assert_eq!(count(&[b"<80C0FF41> Tj"]), 3 * 3 + 1);
        assert_eq!(count(&[b"<8> Tj"]), 3);
        // An escape of one is written in four bytes, counted as such.
        assert_eq!(count(&[b"(\\200) Tj"]), 4);
        // A map of three bytes a code covers them.
        let map = b"1 beginbfchar <01> <A4A2> endbfchar";
        assert_eq!(count(&[map, b" (\x80\x01) Tj"]), 2 * 3);
        // Strings no operator shows count none, high or not.
        assert_eq!(count(&[b"(\x80\x80) Td"]), 0);
        // ASCII text stays at one a byte.
        assert_eq!(count(&[b"(Hello) Tj <48656C6C6F> Tj"]), 10);
    }

    /// Text output as it is counts its UTF-8 bytes: UTF-16 after a byte order mark
    /// decoded (a CJK character is two bytes there, three in UTF-8), PDFDocEncoding's
    /// bytes above 0x7F three.
    #[test]
    fn text_output_as_it_is_counts_its_utf8_bytes() {
        let actual = |string: &[u8]| {
            let mut content = b"/Span << /ActualText ".to_vec();
            content.extend(string);
            content.extend(b" >> BDC EMC");
            count(&[&content])
        };
        assert_eq!(actual(b"<FEFF4E2D4E2D4E2D4E2D>"), 4 * 3);
        assert_eq!(actual(b"(\xfe\xffN-N-N-N-)"), 4 * 3);
        assert_eq!(actual(b"(\\376\\377N-N-N-N-)"), 4 * 3);
        assert_eq!(actual(b"(\x80\x80)"), 2 * 3);
        assert_eq!(actual(b"(plain)"), 5);
        assert_eq!(
            count(&[b"<< /Type /Annot /Contents <FEFF4E2D4E2D4E2D> >>"]),
            3 * 3
        );
    }

    /// A stream that ends in a string output as it is: a reader takes the string to
    /// the end. An operand string left open shows nothing, no operator following it
    /// (a font program read as operators ends in one as often as not).
    #[test]
    fn a_string_output_as_it_is_open_at_the_end_counts() {
        assert_eq!(count(&[b"/Span << /ActualText (abc"]), 3);
        assert_eq!(count(&[b"/Span << /ActualText <FEFF4E2D4E2D"]), 6);
        assert_eq!(count(&[b"<< /Contents (a (nested) note"]), 15);
        assert_eq!(count(&[b"BT (abc"]), 0);
    }
}
