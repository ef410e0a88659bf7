//! What a PDF counts as, without rendering it: its pages, and a bound of the text
//! it shows.
//!
//! Pages are the larger of the page tree's `/Count` and the page objects found, in
//! the file and in its compressed streams (PDF 1.5 keeps objects inside them). The
//! text is the string operands of the text-showing operators of every stream, as a
//! reader decodes it ([`text`]), a form's once per draw ([`forms`]), times the most
//! UTF-8 bytes the document's `ToUnicode` maps give one code ([`unicode`]). Both are
//! upper bounds of what a provider sees, which is what a hold needs; a document
//! whose text cannot be bounded is refused.
//!
//! Streams are inflated a chunk at a time and counted as they come, so memory stays
//! that of one chunk whatever a stream inflates to (object streams aside, kept up to
//! [`objects::MAX_KEPT_BYTES`] to look objects up in); the inflated bytes of all the
//! documents of one request are capped together ([`InflateBudget`]), and documents
//! above the cap (deflate bombs) are refused.

mod forms;
mod objects;
mod pages;
mod streams;
mod text;
mod unicode;

use forms::{Bindings, Draws, Form};
use objects::Objects;
use pages::Pages;
use std::fmt;
use std::io::Read;
use streams::{Encoding, PngRows, Predictor, Value, value_of};
use text::{Shown, TextCounter};

/// Most bytes the streams of all the documents of one request (a job, a quote, a
/// call adding batch items) may inflate to together.
pub const MAX_INFLATED_BYTES: u64 = 64 * 1024 * 1024;
/// Bytes inflated at a time.
const CHUNK_BYTES: usize = 64 * 1024;

/// The bytes the documents of one request may still inflate to: one budget is
/// shared by all of them, so twenty documents cost what one may.
pub struct InflateBudget {
    left: u64,
}

impl Default for InflateBudget {
    fn default() -> Self {
        Self {
            left: MAX_INFLATED_BYTES,
        }
    }
}

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
    /// The request's documents inflate to more than [`MAX_INFLATED_BYTES`].
    Inflated,
    /// Its forms draw each other in a cycle, or nest deeper than
    /// [`forms::MAX_FORM_DEPTH`], with text: what they show has no bound.
    Forms,
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
                "the request's PDFs inflate to more than {MAX_INFLATED_BYTES} bytes; at most {MAX_INFLATED_BYTES} are accepted per request, all documents together"
            ),
            Self::Forms => write!(
                f,
                "the PDF's forms draw each other in a cycle, or nest deeper than {} levels, with text; its text cannot be counted before the hold",
                forms::MAX_FORM_DEPTH
            ),
        }
    }
}

/// The pages and the text bound of `bytes`, its streams' inflated bytes taken from
/// `budget`.
pub fn measure(bytes: &[u8], budget: &mut InflateBudget) -> Result<Measure, PdfError> {
    if !bytes.starts_with(b"%PDF-") {
        return Err(PdfError::NoPages);
    }
    if find(bytes, b"/Encrypt").is_some() {
        return Err(PdfError::Encrypted);
    }
    let mut pages = Pages::default();
    pages.feed(bytes);
    pages.finish();
    let mut objects = Objects::of_file(bytes);
    let mut text = Text::default();
    // The file as it is: its unfiltered streams, wherever they end.
    let mut whole = TextCounter::default();
    whole.feed(bytes);
    text.add(whole.finish());
    // The forms, with their dictionaries: their bindings are read once every object
    // stream is.
    let mut found_forms: Vec<(&[u8], Option<u32>, Shown)> = Vec::new();
    for stream in streams::streams(bytes) {
        let data = &bytes[stream.data..];
        let dictionary = stream.dictionary.unwrap_or_default();
        let form = forms::is_form(dictionary);
        let mut kept = match value_of(dictionary, b"/Type") {
            None => None,
            Some(Value::Names(names)) if names != [b"ObjStm".to_vec()] => None,
            Some(Value::Names(_)) => Some(Vec::new()),
            // Perhaps an object stream: its objects cannot be known.
            Some(_) => {
                objects.missed();
                None
            }
        };
        let room = objects.room();
        let mut keep = |chunk: &[u8]| {
            if let Some(data) = &mut kept {
                if data.len() + chunk.len() > room {
                    kept = None;
                } else {
                    data.extend_from_slice(chunk);
                }
            }
        };
        let shown = match stream.encoding {
            Encoding::Plain => {
                let end = forms::plain_extent(data, dictionary, &objects);
                keep(&data[..end]);
                // Read above, with the rest of the file; a form is read again on its
                // own, as it is shown on every draw.
                form.then(|| {
                    let mut counter = TextCounter::default();
                    counter.feed(&data[..end]);
                    counter.finish()
                })
            }
            // Pixels: the page's allowance counts them.
            Encoding::Image => None,
            Encoding::Unread(filters) => return Err(PdfError::Filter(filters)),
            Encoding::Flate(Predictor::None) => {
                let mut counter = TextCounter::default();
                let mut pages_here = Pages::default();
                inflate(data, budget, |chunk| {
                    counter.feed(chunk);
                    pages_here.feed(chunk);
                    keep(chunk);
                })?;
                pages_here.finish();
                pages.add(&pages_here);
                Some(counter.finish())
            }
            Encoding::Flate(Predictor::Png {
                bytes_per_pixel,
                row,
            }) => {
                let mut counter = TextCounter::default();
                let mut pages_here = Pages::default();
                let mut rows = PngRows::new(bytes_per_pixel, row);
                inflate(data, budget, |chunk| {
                    rows.feed(chunk, &mut |row| {
                        counter.feed(row);
                        pages_here.feed(row);
                        keep(row);
                    });
                })?;
                pages_here.finish();
                pages.add(&pages_here);
                Some(counter.finish())
            }
            // What a reader makes of it is not known here — a predictor not undone, a
            // keyword in other data, a stream whose dictionary is hidden: every byte
            // it inflates to counts, which no text it shows exceeds (one that does not
            // inflate is plain, and read above).
            Encoding::Unknown => {
                let inflated = inflate(data, budget, |_| {})?;
                Some(unread(inflated, false))
            }
            Encoding::Flate(Predictor::Other) => {
                let inflated = inflate(data, budget, |_| {})?;
                Some(unread(inflated, true))
            }
            // Likewise; and one that does not inflate is encoded some other way.
            Encoding::Unreadable => match inflate(data, budget, |_| {})? {
                0 => return Err(PdfError::Filter("filters given indirectly".into())),
                inflated => Some(unread(inflated, true)),
            },
        };
        match kept {
            Some(data) if !matches!(stream.encoding, Encoding::Image) => {
                objects.add_stream(dictionary, data)
            }
            // An object stream not read, or too large to keep.
            Some(_) => objects.missed(),
            None if value_of(dictionary, b"/Type")
                == Some(Value::Names(vec![b"ObjStm".to_vec()])) =>
            {
                objects.missed()
            }
            None => {}
        }
        match shown {
            Some(shown) if form => found_forms.push((dictionary, stream.object, shown)),
            Some(shown) => text.add(shown),
            None => {}
        }
    }
    let forms: Vec<Form> = found_forms
        .into_iter()
        .map(|(dictionary, object, shown)| {
            text.longest_mapping = text.longest_mapping.max(shown.longest_mapping);
            text.longest_glyph = text.longest_glyph.max(shown.longest_glyph);
            Form {
                object,
                text: shown.bytes,
                draws: shown.draws,
                bindings: Bindings::of_form(dictionary, &objects),
            }
        })
        .collect();
    let everywhere = Bindings::everywhere(bytes, &objects);
    let drawn =
        forms::drawn_bytes(&forms, &text.draws, everywhere.as_ref()).ok_or(PdfError::Forms)?;
    let count = pages.tree_count.max(pages.objects);
    if count == 0 {
        return Err(PdfError::NoPages);
    }
    Ok(Measure {
        pages: count,
        text_tokens: text
            .bytes
            .saturating_add(drawn)
            .saturating_mul(text.longest_mapping.max(text.longest_glyph).max(1)),
    })
}

/// What the streams that are not forms show, together.
#[derive(Default)]
struct Text {
    bytes: u64,
    /// The document's: a font's map applies wherever the font is used.
    longest_mapping: u64,
    longest_glyph: u64,
    draws: Draws,
}

impl Text {
    fn add(&mut self, shown: Shown) {
        self.bytes = self.bytes.saturating_add(shown.bytes);
        self.longest_mapping = self.longest_mapping.max(shown.longest_mapping);
        self.longest_glyph = self.longest_glyph.max(shown.longest_glyph);
        self.draws.merge(shown.draws);
    }
}

/// What a stream inflated to `inflated` bytes not read may show: each byte, a
/// draw every four (`/ Do`), and — when a reader may take it for a `ToUnicode` map
/// or an object stream holding an encoding (`mapped`: it has a dictionary) — codes
/// mapped to a string of all its bytes (three UTF-8 bytes each two, as a literal
/// destination counts), glyph names as long as it.
fn unread(inflated: u64, mapped: bool) -> Shown {
    Shown {
        bytes: inflated,
        longest_mapping: if mapped {
            inflated.div_ceil(2).saturating_mul(3)
        } else {
            0
        },
        longest_glyph: if mapped { inflated } else { 0 },
        draws: Draws::unnamed(inflated / 4),
    }
}

/// Inflates the deflate data at the start of `data` into `each`, a chunk at a time,
/// until it ends or is broken; the bytes inflated are taken from `budget`. Data that
/// is not deflated inflates to nothing.
fn inflate(
    data: &[u8],
    budget: &mut InflateBudget,
    mut each: impl FnMut(&[u8]),
) -> Result<u64, PdfError> {
    let mut decoder = flate2::read::ZlibDecoder::new(data);
    let mut chunk = vec![0; CHUNK_BYTES];
    let mut inflated = 0u64;
    loop {
        let read = match decoder.read(&mut chunk) {
            Ok(0) | Err(_) => return Ok(inflated),
            Ok(read) => read,
        };
        budget.left = budget
            .left
            .checked_sub(read as u64)
            .ok_or(PdfError::Inflated)?;
        inflated += read as u64;
        each(&chunk[..read]);
    }
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

    fn measured(bytes: &[u8]) -> Result<Measure, PdfError> {
        measure(bytes, &mut InflateBudget::default())
    }

    fn pages(bytes: &[u8]) -> Option<u32> {
        measured(bytes).ok().map(|measure| measure.pages)
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
        assert_eq!(measured(b"\x89PNG\r\n"), Err(PdfError::NoPages));
        assert_eq!(measured(b"%PDF-1.4\n%%EOF\n"), Err(PdfError::NoPages));
    }

    #[test]
    fn the_text_of_every_content_stream_counts() {
        let text = "x".repeat(100_000);
        let content = format!("BT /F1 1 Tf ({text}) Tj ET");
        let plain = pdf_with_content(content.as_bytes());
        assert_eq!(measured(&plain).unwrap().text_tokens, 100_000);
        let flate = with_stream("<< /Filter /FlateDecode >>", &deflated(content.as_bytes()));
        assert_eq!(measured(&flate).unwrap().text_tokens, 100_000);
        // Whatever the dictionary claims, what a reader would show counts.
        let disguised = with_stream(
            "<< /Subtype /Image /Filter /FlateDecode >>",
            &deflated(content.as_bytes()),
        );
        assert_eq!(measured(&disguised).unwrap().text_tokens, 100_000);
        // An `endstream` inside the data cuts nothing.
        let cut = format!("(endstream\nendobj\n) Tj {content}");
        assert_eq!(
            measured(&pdf_with_content(cut.as_bytes()))
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
        assert_eq!(measured(&predicted).unwrap().text_tokens, 100_000);
        // A predictor not undone: every inflated byte.
        let tiff = with_stream(
            "<< /Filter /FlateDecode /DecodeParms << /Predictor 2 >> >>",
            &deflated(content.as_bytes()),
        );
        // It may be a `ToUnicode` map too, or hold an encoding's glyph names: one
        // code may map to a string of all its bytes, three UTF-8 bytes each two.
        let bytes = content.len() as u64;
        assert_eq!(
            measured(&tiff).unwrap().text_tokens,
            bytes * bytes.div_ceil(2) * 3
        );
    }

    #[test]
    fn a_unicode_map_multiplies_the_text_of_every_stream() {
        // The font's map is a stream of its own, as it is in practice.
        let mut file = with_stream(
            "<< /Filter /FlateDecode >>",
            &deflated(b"1 beginbfchar <01> <006600660069> endbfchar"),
        );
        file.truncate(file.len() - b"%%EOF\n".len());
        file.extend(b"10 0 obj\n<< /Filter /FlateDecode >>\nstream\n");
        file.extend(deflated(b"BT (\x01\x01) Tj ET"));
        file.extend(b"\nendstream\nendobj\n%%EOF\n");
        assert_eq!(measured(&file).unwrap().text_tokens, 2 * 3);
        // A rare BMP character is three tokens (o200k's `꒢`, 299 for 100): 10,000 of
        // them were held at 13,008 when a unit counted one.
        let mut file = with_stream(
            "<< /Filter /FlateDecode >>",
            &deflated(b"1 beginbfchar <01> <A4A2> endbfchar"),
        );
        file.truncate(file.len() - b"%%EOF\n".len());
        file.extend(b"10 0 obj\n<< /Filter /FlateDecode >>\nstream\n");
        let content = format!("BT ({}) Tj ET", "\x01".repeat(10_000));
        file.extend(deflated(content.as_bytes()));
        file.extend(b"\nendstream\nendobj\n%%EOF\n");
        assert_eq!(measured(&file).unwrap().text_tokens, 30_000);
    }

    #[test]
    fn images_count_no_text() {
        let photo = with_stream(
            "<< /Type /XObject /Subtype /Image /Filter /DCTDecode >>",
            b"\xff\xd8\xff\xe0(x) (y)",
        );
        assert_eq!(measured(&photo).unwrap().text_tokens, 0);
        let pixels = with_stream(
            "<< /Subtype /Image /Filter /FlateDecode >>",
            &deflated(&[0x28; 10_000]),
        );
        assert_eq!(measured(&pixels).unwrap().text_tokens, 0);
    }

    #[test]
    fn what_cannot_be_bounded_is_refused() {
        let lzw = with_stream("<< /Filter /LZWDecode >>", b"\x80\x0b");
        assert_eq!(measured(&lzw), Err(PdfError::Filter("/LZWDecode".into())));
        let indirect = with_stream("<< /Filter 12 0 R >>", b"not deflated");
        assert!(matches!(measured(&indirect), Err(PdfError::Filter(_))));
        let mut encrypted = pdf(1);
        encrypted.extend(b"trailer\n<< /Encrypt 5 0 R >>\n");
        assert_eq!(measured(&encrypted), Err(PdfError::Encrypted));
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
        assert_eq!(measured(&bomb), Err(PdfError::Inflated));
        assert!(
            PdfError::Inflated
                .to_string()
                .contains(&MAX_INFLATED_BYTES.to_string())
        );
    }
}
