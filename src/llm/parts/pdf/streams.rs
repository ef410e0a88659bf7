//! The streams of a PDF as a reader decodes them: where each one's data starts, and
//! what its dictionary says of its filters and predictor.
//!
//! Nothing here trusts a stream's `/Length` or its `endstream`: a deflated stream is
//! inflated from where its data starts until the deflate data ends, as a reader
//! does, so data that hides an `endstream` cuts nothing short.

/// A stream's encoding, as its dictionary gives it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Encoding {
    /// No `/Filter`: the data is what a reader reads.
    Plain,
    /// `/FlateDecode`, alone, with the predictor its `/DecodeParms` names.
    Flate(Predictor),
    /// Ends in an image codec (`DCTDecode`, `JPXDecode`, `JBIG2Decode`,
    /// `CCITTFaxDecode`) and says it is an image: what it decodes to is pixels.
    Image,
    /// A filter, or a chain of filters, not read here: its name.
    Unread(String),
    /// A dictionary whose `/Filter` or `/DecodeParms` is not read here (not a direct
    /// name, array or dictionary).
    Unreadable,
    /// No dictionary precedes the keyword: most likely a word inside other data.
    Unknown,
}

/// How the rows of a deflated stream were transformed before deflating.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Predictor {
    None,
    /// PNG's per-row filters: `bytes_per_pixel` and the bytes of a row.
    Png {
        bytes_per_pixel: usize,
        row: usize,
    },
    /// Any other (TIFF's, or PNG's with rows too long to keep): not undone here.
    Other,
}

/// Rows longer than this are not undone: a PNG predictor keeps one row.
const MAX_ROW_BYTES: usize = 1024 * 1024;

/// Where a stream's data starts in the file, its encoding, its dictionary and the
/// number of the object it is (when `N G obj` precedes the dictionary).
pub struct StreamStart<'a> {
    pub data: usize,
    pub encoding: Encoding,
    pub dictionary: Option<&'a [u8]>,
    pub object: Option<u32>,
}

/// Every `stream` keyword of `bytes` that ends a line, with where its data starts
/// and what its dictionary says. A keyword no dictionary precedes is still given
/// (as [`Encoding::Unknown`]): only data that inflates counts for it.
pub fn streams(bytes: &[u8]) -> impl Iterator<Item = StreamStart<'_>> + '_ {
    let mut at = 0;
    std::iter::from_fn(move || {
        loop {
            let found = at + super::find(&bytes[at..], b"stream")?;
            at = found + b"stream".len();
            if bytes[..found].ends_with(b"end") {
                continue;
            }
            let data = match bytes.get(at..at + 2) {
                Some(b"\r\n") => at + 2,
                Some([b'\n', _]) | Some([b'\r', _]) => at + 1,
                Some([b'\n']) | Some([b'\r']) => at + 1,
                _ => continue,
            };
            let dictionary = dictionary_before(&bytes[..found]);
            let object = dictionary.and_then(|dictionary| {
                let start = dictionary.as_ptr() as usize - bytes.as_ptr() as usize;
                object_number_before(&bytes[..start])
            });
            return Some(StreamStart {
                data,
                encoding: dictionary.map_or(Encoding::Unknown, encoding),
                dictionary,
                object,
            });
        }
    })
}

/// The dictionary that ends right before the `stream` keyword: from its `>>` back
/// to the `<<` that opens it.
fn dictionary_before(bytes: &[u8]) -> Option<&[u8]> {
    let end = bytes.iter().rposition(|byte| !byte.is_ascii_whitespace())? + 1;
    if !bytes[..end].ends_with(b">>") {
        return None;
    }
    let mut depth = 0usize;
    let mut at = end;
    while at >= 2 {
        match &bytes[at - 2..at] {
            b">>" => {
                depth += 1;
                at -= 2;
            }
            b"<<" => {
                depth -= 1;
                at -= 2;
                if depth == 0 {
                    return Some(&bytes[at..end]);
                }
            }
            _ => at -= 1,
        }
    }
    None
}

/// The `N` of an `N G obj` that `bytes` ends with (whitespace aside).
pub fn object_number_before(bytes: &[u8]) -> Option<u32> {
    let before = trim_end(bytes).strip_suffix(b"obj")?;
    let (_, before) = trailing_digits(before)?;
    let (number, _) = trailing_digits(before)?;
    std::str::from_utf8(number).ok()?.parse().ok()
}

/// The digits `bytes` ends with, after whitespace, and what precedes them.
fn trailing_digits(bytes: &[u8]) -> Option<(&[u8], &[u8])> {
    let trimmed = trim_end(bytes);
    if trimmed.len() == bytes.len() {
        return None;
    }
    let start = trimmed
        .iter()
        .rposition(|byte| !byte.is_ascii_digit())
        .map_or(0, |at| at + 1);
    (start < trimmed.len()).then(|| (&trimmed[start..], &trimmed[..start]))
}

fn trim_end(bytes: &[u8]) -> &[u8] {
    let end = bytes
        .iter()
        .rposition(|byte| !byte.is_ascii_whitespace())
        .map_or(0, |at| at + 1);
    &bytes[..end]
}

fn encoding(dictionary: &[u8]) -> Encoding {
    let image = matches!(
        value_of(dictionary, b"/Subtype"),
        Some(Value::Names(names)) if names == [b"Image".to_vec()]
    );
    let filters = match value_of(dictionary, b"/Filter") {
        None => return Encoding::Plain,
        Some(Value::Names(names)) => names,
        Some(_) => return Encoding::Unreadable,
    };
    let is = |name: &[u8], full: &[u8], short: &[u8]| name == full || name == short;
    let codec = |name: &[u8]| {
        is(name, b"DCTDecode", b"DCT")
            || is(name, b"CCITTFaxDecode", b"CCF")
            || name == b"JPXDecode"
            || name == b"JBIG2Decode"
    };
    match filters.as_slice() {
        [] => Encoding::Plain,
        [.., last] if codec(last) && image => Encoding::Image,
        [only] if is(only, b"FlateDecode", b"Fl") => match predictor(dictionary) {
            Some(predictor) => Encoding::Flate(predictor),
            None => Encoding::Unreadable,
        },
        names => Encoding::Unread(
            names
                .iter()
                .map(|name| format!("/{}", String::from_utf8_lossy(name)))
                .collect::<Vec<_>>()
                .join(" "),
        ),
    }
}

/// The predictor of a deflated stream; `None` when its `/DecodeParms` is not read.
fn predictor(dictionary: &[u8]) -> Option<Predictor> {
    let parameters = match value_of(dictionary, b"/DecodeParms") {
        None => return Some(Predictor::None),
        Some(Value::Dictionary(parameters)) => parameters,
        Some(Value::Null) => return Some(Predictor::None),
        Some(Value::Names(_) | Value::Number(_) | Value::Other) => return None,
    };
    let number = |key: &[u8], default: usize| match value_of(parameters, key) {
        None => Some(default),
        Some(Value::Number(number)) => Some(number),
        Some(_) => None,
    };
    let kind = number(b"/Predictor", 1)?;
    let colors = number(b"/Colors", 1)?;
    let bits = number(b"/BitsPerComponent", 8)?;
    let columns = number(b"/Columns", 1)?;
    Some(match kind {
        0 | 1 => Predictor::None,
        10..=15 => {
            let pixel_bits = colors.checked_mul(bits)?;
            let row = pixel_bits.checked_mul(columns)?.div_ceil(8);
            if row == 0 || row > MAX_ROW_BYTES {
                Predictor::Other
            } else {
                Predictor::Png {
                    bytes_per_pixel: pixel_bits.div_ceil(8).max(1),
                    row,
                }
            }
        }
        _ => Predictor::Other,
    })
}

/// A dictionary value, as far as it matters here.
#[derive(Debug, PartialEq, Eq)]
pub enum Value<'a> {
    /// A name, or an array of names: without their slashes, `#xx` escapes decoded.
    Names(Vec<Vec<u8>>),
    Dictionary(&'a [u8]),
    Number(usize),
    Null,
    /// Anything else: an indirect reference, a string, …
    Other,
}

/// The value of `key` among the top-level entries of `dictionary` (`<< … >>`).
pub fn value_of<'a>(dictionary: &'a [u8], key: &[u8]) -> Option<Value<'a>> {
    value_at(dictionary, key).map(value)
}

/// The bytes from where the value of `key` starts, among the top-level entries of
/// `dictionary` (`<< … >>`), to the dictionary's end.
pub fn value_at<'a>(dictionary: &'a [u8], key: &[u8]) -> Option<&'a [u8]> {
    let inner = dictionary.strip_prefix(b"<<")?.strip_suffix(b">>")?;
    let mut depth = 0usize;
    let mut at = 0;
    while at < inner.len() {
        let rest = &inner[at..];
        if rest.starts_with(b"<<") || rest.starts_with(b"[") {
            depth += 1;
        } else if rest.starts_with(b">>") || rest.starts_with(b"]") {
            depth = depth.saturating_sub(1);
        } else if depth == 0
            && rest.starts_with(key)
            && !rest
                .get(key.len())
                .is_some_and(|byte| byte.is_ascii_alphanumeric())
        {
            return Some(&inner[at + key.len()..]);
        }
        at += if rest.starts_with(b"<<") || rest.starts_with(b">>") {
            2
        } else {
            1
        };
    }
    None
}

fn value(bytes: &[u8]) -> Value<'_> {
    let bytes = super::skip_space(bytes);
    if bytes.starts_with(b"/") {
        return Value::Names(vec![name(&bytes[1..])]);
    }
    if bytes.starts_with(b"<<") {
        return dictionary_at(bytes).map_or(Value::Other, Value::Dictionary);
    }
    if let Some(array) = bytes.strip_prefix(b"[") {
        let Some(end) = array.iter().position(|byte| *byte == b']') else {
            return Value::Other;
        };
        let array = &array[..end];
        let mut names = Vec::new();
        let mut rest = super::skip_space(array);
        while let Some(after) = rest.strip_prefix(b"/") {
            let name = name(after);
            rest = super::skip_space(&after[raw_name_length(after)..]);
            names.push(name);
        }
        if !rest.is_empty() {
            // Parameters in an array (`[<< … >>]`) or a mix: not read here.
            if let Some(inner) = dictionary_at(rest).filter(|inner| {
                names.is_empty() && super::skip_space(&rest[inner.len()..]).is_empty()
            }) {
                return Value::Dictionary(inner);
            }
            return Value::Other;
        }
        return Value::Names(names);
    }
    if bytes.starts_with(b"null") {
        return Value::Null;
    }
    let digits = bytes
        .iter()
        .take_while(|byte| byte.is_ascii_digit())
        .count();
    let after = super::skip_space(&bytes[digits..]);
    // `12 0 R` is a reference, not the number 12.
    let reference = after.first().is_some_and(u8::is_ascii_digit);
    match std::str::from_utf8(&bytes[..digits])
        .ok()
        .and_then(|d| d.parse().ok())
    {
        Some(number) if !reference => Value::Number(number),
        _ => Value::Other,
    }
}

/// The balanced `<< … >>` at the start of `bytes`.
pub fn dictionary_at(bytes: &[u8]) -> Option<&[u8]> {
    let mut depth = 0usize;
    let mut at = 0;
    while at + 2 <= bytes.len() {
        match &bytes[at..at + 2] {
            b"<<" => {
                depth += 1;
                at += 2;
            }
            b">>" => {
                depth = depth.checked_sub(1)?;
                at += 2;
                if depth == 0 {
                    return Some(&bytes[..at]);
                }
            }
            _ => at += 1,
        }
    }
    None
}

pub fn raw_name_length(bytes: &[u8]) -> usize {
    bytes
        .iter()
        .position(|byte| byte.is_ascii_whitespace() || b"()<>[]{}/%".contains(byte))
        .unwrap_or(bytes.len())
}

/// A name's characters, its `#xx` escapes decoded (`/Fl#61teDecode` is `FlateDecode`).
pub fn name(bytes: &[u8]) -> Vec<u8> {
    let raw = &bytes[..raw_name_length(bytes)];
    let mut name = Vec::with_capacity(raw.len());
    let mut at = 0;
    while at < raw.len() {
        let escaped = (raw[at] == b'#')
            .then(|| raw.get(at + 1..at + 3))
            .flatten()
            .and_then(|hex| std::str::from_utf8(hex).ok())
            .and_then(|hex| u8::from_str_radix(hex, 16).ok());
        match escaped {
            Some(byte) => {
                name.push(byte);
                at += 3;
            }
            None => {
                name.push(raw[at]);
                at += 1;
            }
        }
    }
    name
}

/// Undoes PNG's row filters of a deflated stream, one row at a time.
pub struct PngRows {
    bytes_per_pixel: usize,
    /// The row being read: its filter byte, then its data.
    current: Vec<u8>,
    previous: Vec<u8>,
    row: usize,
}

impl PngRows {
    pub fn new(bytes_per_pixel: usize, row: usize) -> Self {
        Self {
            bytes_per_pixel,
            current: Vec::with_capacity(row + 1),
            previous: vec![0; row],
            row,
        }
    }

    /// Feeds inflated bytes; `out` gets each row as it is completed.
    pub fn feed(&mut self, mut bytes: &[u8], out: &mut impl FnMut(&[u8])) {
        while !bytes.is_empty() {
            let take = (self.row + 1 - self.current.len()).min(bytes.len());
            self.current.extend_from_slice(&bytes[..take]);
            bytes = &bytes[take..];
            if self.current.len() == self.row + 1 {
                self.unfilter();
                out(&self.previous);
                self.current.clear();
            }
        }
    }

    /// Decodes the completed row into `previous`.
    fn unfilter(&mut self) {
        let kind = self.current[0];
        let step = self.bytes_per_pixel;
        for index in 0..self.row {
            let raw = self.current[index + 1];
            let left = if index >= step {
                self.previous_decoded(index - step)
            } else {
                0
            };
            let up = self.previous[index];
            let up_left = if index >= step {
                self.up_left(index - step)
            } else {
                0
            };
            let decoded = match kind {
                1 => raw.wrapping_add(left),
                2 => raw.wrapping_add(up),
                3 => raw.wrapping_add(((u16::from(left) + u16::from(up)) / 2) as u8),
                4 => raw.wrapping_add(paeth(left, up, up_left)),
                _ => raw,
            };
            // `current[index + 1]` now holds the decoded byte; `previous` still the
            // row above until the whole row is done.
            self.current[index + 1] = decoded;
        }
        self.previous.copy_from_slice(&self.current[1..]);
    }

    fn previous_decoded(&self, index: usize) -> u8 {
        self.current[index + 1]
    }

    fn up_left(&self, index: usize) -> u8 {
        self.previous[index]
    }
}

fn paeth(left: u8, up: u8, up_left: u8) -> u8 {
    let estimate = i16::from(left) + i16::from(up) - i16::from(up_left);
    let to_left = (estimate - i16::from(left)).abs();
    let to_up = (estimate - i16::from(up)).abs();
    let to_up_left = (estimate - i16::from(up_left)).abs();
    if to_left <= to_up && to_left <= to_up_left {
        left
    } else if to_up <= to_up_left {
        up
    } else {
        up_left
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn encoding_of(dictionary: &str) -> Encoding {
        let file = format!("1 0 obj\n{dictionary}\nstream\nDATA\nendstream\n");
        let mut found = streams(file.as_bytes());
        let stream = found.next().unwrap();
        assert!(found.next().is_none());
        assert_eq!(&file.as_bytes()[stream.data..stream.data + 4], b"DATA");
        stream.encoding
    }

    #[test]
    fn dictionaries_say_how_a_stream_is_read() {
        assert_eq!(encoding_of("<< /Length 4 >>"), Encoding::Plain);
        assert_eq!(
            encoding_of("<< /Length 4 /Filter /FlateDecode >>"),
            Encoding::Flate(Predictor::None)
        );
        assert_eq!(
            encoding_of("<</Filter[/Fl#61teDecode]/Length 4>>"),
            Encoding::Flate(Predictor::None)
        );
        assert_eq!(
            encoding_of(
                "<< /Filter /FlateDecode /DecodeParms << /Predictor 15 /Colors 3 /Columns 10 >> >>"
            ),
            Encoding::Flate(Predictor::Png {
                bytes_per_pixel: 3,
                row: 30
            })
        );
        assert_eq!(
            encoding_of("<< /Filter /FlateDecode /DecodeParms << /Predictor 2 >> >>"),
            Encoding::Flate(Predictor::Other)
        );
        assert_eq!(
            encoding_of("<< /Filter /FlateDecode /DecodeParms 7 0 R >>"),
            Encoding::Unreadable
        );
        assert_eq!(encoding_of("<< /Filter 5 0 R >>"), Encoding::Unreadable);
        assert_eq!(
            encoding_of("<< /Subtype /Image /Filter [/FlateDecode /DCTDecode] >>"),
            Encoding::Image
        );
        // A codec's stream that does not say it is an image is not taken for one.
        assert_eq!(
            encoding_of("<< /Filter /DCTDecode >>"),
            Encoding::Unread("/DCTDecode".into())
        );
        assert_eq!(
            encoding_of("<< /Filter [/ASCII85Decode /FlateDecode] >>"),
            Encoding::Unread("/ASCII85Decode /FlateDecode".into())
        );
        // A nested dictionary's keys are not the stream's.
        assert_eq!(
            encoding_of("<< /Resources << /Filter /LZWDecode >> >>"),
            Encoding::Plain
        );
    }

    #[test]
    fn a_keyword_without_a_dictionary_is_of_unknown_encoding() {
        let file = b"(upstream\nmore) Tj endstream\n";
        let found: Vec<_> = streams(file).collect();
        assert_eq!(found.len(), 1);
        assert_eq!(found[0].encoding, Encoding::Unknown);
    }

    #[test]
    fn png_rows_are_unfiltered() {
        // Two rows of three bytes: "up" over "sub".
        let mut rows = PngRows::new(1, 3);
        let mut out: Vec<u8> = Vec::new();
        rows.feed(&[1, 10, 1, 1, 2, 1, 1, 1], &mut |row| out.extend(row));
        assert_eq!(out, [10, 11, 12, 11, 12, 13]);
    }
}
