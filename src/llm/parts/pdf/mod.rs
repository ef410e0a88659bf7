//! What a PDF counts as, without rendering it: its pages, and a bound of the text
//! it shows.
//!
//! Pages are the larger of the page tree's `/Count` and the page objects found, in
//! the file and in its compressed streams (PDF 1.5 keeps objects inside them). The
//! text is the string operands of the text-showing operators of every stream, as a
//! reader decodes it ([`text`]). Both are upper bounds of what a provider sees, which
//! is what a hold needs; a document whose text cannot be bounded is refused.
//!
//! Streams are inflated a chunk at a time and counted as they come, so memory stays
//! that of one chunk whatever a stream inflates to; the inflated bytes of the whole
//! document are capped, and a document above the cap (a deflate bomb) is refused.

mod streams;
mod text;

use std::fmt;
use std::io::Read;
use streams::{Encoding, PngRows, Predictor};
use text::TextCounter;

/// Most bytes all of a document's streams may inflate to.
pub const MAX_INFLATED_BYTES: u64 = 64 * 1024 * 1024;
/// Bytes inflated at a time.
const CHUNK_BYTES: usize = 64 * 1024;

/// What a PDF counts as.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Measure {
    pub pages: u32,
    /// No provider's reading of the document's text counts more tokens.
    pub text_tokens: u64,
}

/// Why a PDF is not measured.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum PdfError {
    /// Not a PDF, or no page is found.
    NoPages,
    /// Its strings and streams are encrypted: its text cannot be read.
    Encrypted,
    /// A stream is encoded with filters not read here, so its text is not bounded.
    Filter(String),
    /// Its streams inflate to more than [`MAX_INFLATED_BYTES`].
    Inflated,
}

impl fmt::Display for PdfError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::NoPages => f.write_str("data is not a PDF with pages"),
            Self::Encrypted => {
                f.write_str("the PDF is encrypted; its text cannot be counted before the hold")
            }
            Self::Filter(filters) => write!(
                f,
                "the PDF has a stream encoded with {filters}, which is not read; its text cannot be counted before the hold"
            ),
            Self::Inflated => write!(
                f,
                "the PDF's streams inflate to more than {MAX_INFLATED_BYTES} bytes; at most {MAX_INFLATED_BYTES} are accepted"
            ),
        }
    }
}

/// The pages and the text bound of `bytes`.
pub fn measure(bytes: &[u8]) -> Result<Measure, PdfError> {
    if !bytes.starts_with(b"%PDF-") {
        return Err(PdfError::NoPages);
    }
    if find(bytes, b"/Encrypt").is_some() {
        return Err(PdfError::Encrypted);
    }
    let mut pages = Pages::default();
    pages.feed(bytes);
    pages.finish();
    // The file as it is: its unfiltered streams, wherever they end.
    let mut shown = TextCounter::default();
    shown.feed(bytes);
    let mut text_tokens = shown.finish();
    let mut budget = MAX_INFLATED_BYTES;
    for stream in streams::streams(bytes) {
        let data = &bytes[stream.data..];
        match stream.encoding {
            // Read above, with the rest of the file.
            Encoding::Plain => {}
            // Pixels: the page's allowance counts them.
            Encoding::Image => {}
            Encoding::Unread(filters) => return Err(PdfError::Filter(filters)),
            Encoding::Flate(Predictor::None) => {
                let mut counter = TextCounter::default();
                let mut pages_here = Pages::default();
                inflate(data, &mut budget, |chunk| {
                    counter.feed(chunk);
                    pages_here.feed(chunk);
                })?;
                pages_here.finish();
                pages.add(&pages_here);
                text_tokens = text_tokens.saturating_add(counter.finish());
            }
            Encoding::Flate(Predictor::Png {
                bytes_per_pixel,
                row,
            }) => {
                let mut counter = TextCounter::default();
                let mut pages_here = Pages::default();
                let mut rows = PngRows::new(bytes_per_pixel, row);
                inflate(data, &mut budget, |chunk| {
                    rows.feed(chunk, &mut |row| {
                        counter.feed(row);
                        pages_here.feed(row);
                    });
                })?;
                pages_here.finish();
                pages.add(&pages_here);
                text_tokens = text_tokens.saturating_add(counter.finish());
            }
            // What a reader makes of it is not known here — a predictor not undone, a
            // keyword in other data, a stream whose dictionary is hidden: every byte
            // it inflates to counts, which no text it shows exceeds (one that does not
            // inflate is plain, and read above).
            Encoding::Flate(Predictor::Other) | Encoding::Unknown => {
                let inflated = inflate(data, &mut budget, |_| {})?;
                text_tokens = text_tokens.saturating_add(inflated);
            }
            // Likewise; and one that does not inflate is encoded some other way.
            Encoding::Unreadable => match inflate(data, &mut budget, |_| {})? {
                0 => return Err(PdfError::Filter("filters given indirectly".into())),
                inflated => text_tokens = text_tokens.saturating_add(inflated),
            },
        }
    }
    let count = pages.tree_count.max(pages.objects);
    if count == 0 {
        return Err(PdfError::NoPages);
    }
    Ok(Measure {
        pages: count,
        text_tokens,
    })
}

/// Inflates the deflate data at the start of `data` into `each`, a chunk at a time,
/// until it ends or is broken; the bytes inflated are taken from `budget`. Data that
/// is not deflated inflates to nothing.
fn inflate(data: &[u8], budget: &mut u64, mut each: impl FnMut(&[u8])) -> Result<u64, PdfError> {
    let mut decoder = flate2::read::ZlibDecoder::new(data);
    let mut chunk = vec![0; CHUNK_BYTES];
    let mut inflated = 0u64;
    loop {
        let read = match decoder.read(&mut chunk) {
            Ok(0) | Err(_) => return Ok(inflated),
            Ok(read) => read,
        };
        *budget = budget.checked_sub(read as u64).ok_or(PdfError::Inflated)?;
        inflated += read as u64;
        each(&chunk[..read]);
    }
}

/// Bytes kept before and after a `/Type` to read its dictionary: a page tree node's
/// `/Count` is looked for within them.
const CONTEXT_BYTES: usize = 1024;

/// Counts the pages of bytes fed in chunks: each `/Type` is read once enough bytes
/// follow it, with the bytes before it kept from the chunk before.
#[derive(Default)]
struct Pages {
    /// The largest `/Count` of a `/Type /Pages` node: the root's is the document's.
    tree_count: u32,
    /// `/Type /Page` dictionaries seen.
    objects: u32,
    /// The bytes kept, and the offset in them from which `/Type` is still to be read.
    kept: Vec<u8>,
    unread: usize,
}

impl Pages {
    fn feed(&mut self, bytes: &[u8]) {
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
    fn finish(&mut self) {
        self.read_until(self.kept.len());
        self.kept = Vec::new();
        self.unread = 0;
    }

    fn add(&mut self, other: &Self) {
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

fn find(haystack: &[u8], needle: &[u8]) -> Option<usize> {
    memchr::memmem::find(haystack, needle)
}

fn rfind(haystack: &[u8], needle: &[u8]) -> Option<usize> {
    memchr::memmem::rfind(haystack, needle)
}

fn skip_space(bytes: &[u8]) -> &[u8] {
    let start = bytes
        .iter()
        .position(|byte| !byte.is_ascii_whitespace())
        .unwrap_or(bytes.len());
    &bytes[start..]
}

#[cfg(test)]
pub(crate) mod samples {
    /// A PDF of `pages` empty pages, its objects in plain text.
    pub fn pdf(pages: u32) -> Vec<u8> {
        let kids: Vec<String> = (0..pages).map(|page| format!("{} 0 R", page + 3)).collect();
        let mut text = format!(
            "%PDF-1.4\n1 0 obj\n<< /Type /Catalog /Pages 2 0 R >>\nendobj\n2 0 obj\n<< /Type /Pages /Kids [{}] /Count {pages} >>\nendobj\n",
            kids.join(" ")
        );
        for page in 0..pages {
            text.push_str(&format!(
                "{} 0 obj\n<< /Type /Page /Parent 2 0 R /MediaBox [0 0 612 792] >>\nendobj\n",
                page + 3
            ));
        }
        text.push_str("trailer\n<< /Root 1 0 R >>\n%%EOF\n");
        text.into_bytes()
    }

    /// A one-page PDF whose page's content stream is `content`, unfiltered.
    pub fn pdf_with_content(content: &[u8]) -> Vec<u8> {
        let mut file = format!(
            "%PDF-1.4\n1 0 obj\n<< /Type /Catalog /Pages 2 0 R >>\nendobj\n2 0 obj\n<< /Type /Pages /Kids [3 0 R] /Count 1 >>\nendobj\n3 0 obj\n<< /Type /Page /Parent 2 0 R /MediaBox [0 0 612 792] /Contents 4 0 R >>\nendobj\n4 0 obj\n<< /Length {} >>\nstream\n",
            content.len()
        )
        .into_bytes();
        file.extend(content);
        file.extend(b"\nendstream\nendobj\ntrailer\n<< /Root 1 0 R >>\n%%EOF\n");
        file
    }
}

#[cfg(test)]
mod tests {
    use super::samples::{pdf, pdf_with_content};
    use super::*;
    use std::io::Write;

    fn deflated(bytes: &[u8]) -> Vec<u8> {
        let mut deflate =
            flate2::write::ZlibEncoder::new(Vec::new(), flate2::Compression::default());
        deflate.write_all(bytes).unwrap();
        deflate.finish().unwrap()
    }

    fn pages(bytes: &[u8]) -> Option<u32> {
        measure(bytes).ok().map(|measure| measure.pages)
    }

    /// A one-page PDF whose content is `data` under `dictionary`.
    fn with_stream(dictionary: &str, data: &[u8]) -> Vec<u8> {
        let mut file = pdf(1);
        file.truncate(file.len() - b"%%EOF\n".len());
        file.extend(format!("9 0 obj\n{dictionary}\nstream\n").as_bytes());
        file.extend(data);
        file.extend(b"\nendstream\nendobj\n%%EOF\n");
        file
    }

    #[test]
    fn pages_are_counted_by_the_tree_and_the_page_objects() {
        assert_eq!(pages(&pdf(1)), Some(1));
        assert_eq!(pages(&pdf(7)), Some(7));
        // A tree that claims more pages than there are objects: the larger counts.
        let claims_more = String::from_utf8(pdf(2))
            .unwrap()
            .replace("/Count 2", "/Count 9");
        assert_eq!(pages(claims_more.as_bytes()), Some(9));
    }

    #[test]
    fn pages_inside_compressed_object_streams_count() {
        let objects = b"<< /Type /Pages /Kids [3 0 R 4 0 R 5 0 R] /Count 3 >> \
                        << /Type /Page /Parent 2 0 R >> << /Type /Page /Parent 2 0 R >> \
                        << /Type /Page /Parent 2 0 R >>";
        let mut file =
            b"%PDF-1.7\n6 0 obj\n<< /Type /ObjStm /Filter /FlateDecode >>\nstream\n".to_vec();
        file.extend(deflated(objects));
        file.extend(b"\nendstream\nendobj\n%%EOF\n");
        assert_eq!(pages(&file), Some(3));
    }

    #[test]
    fn pages_are_counted_across_chunks() {
        // Page objects far apart, inflated in many chunks.
        let padding = " ".repeat(CHUNK_BYTES / 3);
        let objects: String = (0..10)
            .map(|_| format!("<< /Type /Page /Parent 2 0 R >>{padding}"))
            .collect();
        let objects = format!("<< /Type /Pages /Count 4 >>{objects}");
        let file = with_stream(
            "<< /Type /ObjStm /Filter /FlateDecode >>",
            &deflated(objects.as_bytes()),
        );
        // One page in the file itself, ten in the stream.
        assert_eq!(pages(&file), Some(11));
    }

    #[test]
    fn what_is_not_a_pdf_with_pages_is_refused() {
        assert_eq!(measure(b"\x89PNG\r\n"), Err(PdfError::NoPages));
        assert_eq!(measure(b"%PDF-1.4\n%%EOF\n"), Err(PdfError::NoPages));
    }

    #[test]
    fn the_text_of_every_content_stream_counts() {
        let text = "x".repeat(100_000);
        let content = format!("BT /F1 1 Tf ({text}) Tj ET");
        let plain = pdf_with_content(content.as_bytes());
        assert_eq!(measure(&plain).unwrap().text_tokens, 100_000);
        let flate = with_stream("<< /Filter /FlateDecode >>", &deflated(content.as_bytes()));
        assert_eq!(measure(&flate).unwrap().text_tokens, 100_000);
        // Whatever the dictionary claims, what a reader would show counts.
        let disguised = with_stream(
            "<< /Subtype /Image /Filter /FlateDecode >>",
            &deflated(content.as_bytes()),
        );
        assert_eq!(measure(&disguised).unwrap().text_tokens, 100_000);
        // An `endstream` inside the data cuts nothing.
        let cut = format!("(endstream\nendobj\n) Tj {content}");
        assert_eq!(
            measure(&pdf_with_content(cut.as_bytes()))
                .unwrap()
                .text_tokens,
            100_017
        );
        // Rows of a PNG predictor are undone before they are read.
        let mut rows = Vec::new();
        for row in content.as_bytes().chunks(10) {
            rows.push(0);
            rows.extend(row);
            rows.extend(std::iter::repeat_n(b' ', 10 - row.len()));
        }
        let predicted = with_stream(
            "<< /Filter /FlateDecode /DecodeParms << /Predictor 12 /Columns 10 >> >>",
            &deflated(&rows),
        );
        assert_eq!(measure(&predicted).unwrap().text_tokens, 100_000);
        // A predictor not undone: every inflated byte.
        let tiff = with_stream(
            "<< /Filter /FlateDecode /DecodeParms << /Predictor 2 >> >>",
            &deflated(content.as_bytes()),
        );
        assert_eq!(measure(&tiff).unwrap().text_tokens, content.len() as u64);
    }

    #[test]
    fn images_count_no_text() {
        let photo = with_stream(
            "<< /Type /XObject /Subtype /Image /Filter /DCTDecode >>",
            b"\xff\xd8\xff\xe0(x) (y)",
        );
        assert_eq!(measure(&photo).unwrap().text_tokens, 0);
        let pixels = with_stream(
            "<< /Subtype /Image /Filter /FlateDecode >>",
            &deflated(&[0x28; 10_000]),
        );
        assert_eq!(measure(&pixels).unwrap().text_tokens, 0);
    }

    #[test]
    fn what_cannot_be_bounded_is_refused() {
        let lzw = with_stream("<< /Filter /LZWDecode >>", b"\x80\x0b");
        assert_eq!(measure(&lzw), Err(PdfError::Filter("/LZWDecode".into())));
        let indirect = with_stream("<< /Filter 12 0 R >>", b"not deflated");
        assert!(matches!(measure(&indirect), Err(PdfError::Filter(_))));
        let mut encrypted = pdf(1);
        encrypted.extend(b"trailer\n<< /Encrypt 5 0 R >>\n");
        assert_eq!(measure(&encrypted), Err(PdfError::Encrypted));
    }

    #[test]
    fn a_deflate_bomb_is_refused_at_the_cap() {
        // 100 MiB of zeros deflate to some 100 KB; inflating stops at the cap.
        let mut deflate = flate2::write::ZlibEncoder::new(Vec::new(), flate2::Compression::fast());
        let zeros = vec![0; 1024 * 1024];
        for _ in 0..100 {
            deflate.write_all(&zeros).unwrap();
        }
        let bomb = with_stream("<< /Filter /FlateDecode >>", &deflate.finish().unwrap());
        assert_eq!(measure(&bomb), Err(PdfError::Inflated));
        assert!(
            PdfError::Inflated
                .to_string()
                .contains(&MAX_INFLATED_BYTES.to_string())
        );
    }
}
