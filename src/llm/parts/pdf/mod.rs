//! What a PDF counts as, without rendering it: its pages, and a bound of the text
//! it shows.
//!
//! Pages are the larger of the page tree's `/Count` and the page objects found, in
//! the file and in its compressed streams (PDF 1.5 keeps objects inside them). The
//! text is the string operands of the text-showing operators of every stream, as a
//! reader decodes it ([`text`]), each stream on its own but a page's several content
//! streams joined ([`contents`]), and the strings of the file outside its streams
//! ([`between`]); a form's once per draw ([`forms`]), times the most
//! UTF-8 bytes the document's `ToUnicode` maps give one code ([`unicode`]). Both are
//! upper bounds of what a provider sees, which is what a hold needs; a document
//! whose text cannot be bounded is refused.
//!
//! Streams are inflated a chunk at a time and counted as they come, so memory stays
//! that of one chunk whatever a stream inflates to (object streams aside, kept up to
//! [`objects::MAX_KEPT_BYTES`] to look objects up in); the inflated bytes of all the
//! documents of one request are capped together ([`InflateBudget`]), and documents
//! above the cap (deflate bombs) are refused.

mod between;
mod contents;
mod decode;
mod forms;
mod glyphs;
mod marked;
mod objects;
mod pages;
mod shown;
mod streams;
mod text;
mod text_string;
mod unicode;

use decode::{decode, inflate};
use forms::{Bindings, Draws, Form};
use objects::Objects;
use pages::Pages;
use shown::{Shown, TextBytes};
use std::collections::HashSet;
use std::fmt;
use streams::{Encoding, Predictor, StreamStart, Value, value_of};
use text::TextCounter;

/// Most bytes the streams of all the documents of one request (a job, a quote, a
/// call adding batch items) may inflate to together.
pub const MAX_INFLATED_BYTES: u64 = 64 * 1024 * 1024;

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
    let found: Vec<StreamStart> = streams::streams(bytes).collect();
    // What each stream shows on its own, and where its data ends for a reader
    // that reads the file around it.
    let mut own: Vec<Option<Shown>> = Vec::with_capacity(found.len());
    let mut claimed = Vec::new();
    for stream in &found {
        let data = &bytes[stream.data..];
        let dictionary = stream.dictionary.unwrap_or_default();
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
        // Where a reader may read the file again: its text is read to where the
        // stream may end, and the file's from where it may.
        let end = match stream.encoding {
            Encoding::Plain => forms::plain_resumption(data, dictionary, &objects),
            // Not known to be a stream: the bytes are the file's.
            Encoding::Unknown => 0,
            _ => find(data, b"endstream").unwrap_or(data.len()),
        };
        claimed.push((stream.data, stream.data + end));
        let shown = match stream.encoding {
            Encoding::Plain | Encoding::Flate(Predictor::None | Predictor::Png { .. }) => {
                let plain = stream.encoding == Encoding::Plain;
                let mut counter = TextCounter::default();
                let mut pages_here = Pages::default();
                decode(stream, bytes, &objects, budget, false, |chunk| {
                    counter.feed(chunk);
                    // The file's own pages are counted in it.
                    if !plain {
                        pages_here.feed(chunk);
                    }
                    keep(chunk);
                })?;
                pages_here.finish();
                pages.add(&pages_here);
                Some(counter.finish())
            }
            // Pixels: the page's allowance counts them.
            Encoding::Image => None,
            Encoding::Unread(ref filters) => return Err(PdfError::Filter(filters.clone())),
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
        own.push(shown);
    }
    let mut text = between::shown(bytes, claimed);
    // The streams of a page's `/Contents` array are read joined, and not on their
    // own (but for a form, read on its own as it is drawn).
    let is_form = |stream: &StreamStart| forms::is_form(stream.dictionary.unwrap_or_default());
    let joinable = |stream: &StreamStart| {
        !is_form(stream)
            && matches!(
                stream.encoding,
                Encoding::Plain | Encoding::Flate(Predictor::None | Predictor::Png { .. })
            )
    };
    let mut joined = HashSet::new();
    for array in contents::arrays(bytes, &objects) {
        let mut counter = TextCounter::default();
        for number in array {
            for stream in found
                .iter()
                .filter(|stream| stream.object == Some(number) && joinable(stream))
            {
                decode(stream, bytes, &objects, budget, true, |chunk| {
                    counter.feed(chunk)
                })?;
                joined.insert(number);
            }
        }
        text.add(counter.finish());
    }
    let mut found_forms: Vec<(&[u8], Option<u32>, Shown)> = Vec::new();
    for (stream, shown) in found.iter().zip(own) {
        let Some(shown) = shown else { continue };
        if is_form(stream) {
            found_forms.push((stream.dictionary.unwrap_or_default(), stream.object, shown));
        } else if !(joinable(stream) && stream.object.is_some_and(|n| joined.contains(&n))) {
            text.add(shown);
        }
    }
    let properties = marked::Properties::everywhere(bytes, &objects);
    text.bytes = text
        .bytes
        .plus(TextBytes::low(properties.shown(&text.marked)));
    let forms: Vec<Form> = found_forms
        .into_iter()
        .map(|(dictionary, object, shown)| {
            text.longest_mapping = text.longest_mapping.max(shown.longest_mapping);
            text.longest_glyph = text.longest_glyph.max(shown.longest_glyph);
            Form {
                object,
                text: shown
                    .bytes
                    .plus(TextBytes::low(properties.shown(&shown.marked))),
                draws: shown.draws,
                bindings: Bindings::of_form(dictionary, &objects),
            }
        })
        .collect();
    let everywhere = Bindings::everywhere(bytes, &objects);
    // Each channel is bounded on its own: a draw of a name that may be one of
    // several forms counts the most of each.
    let drawn = |channel: fn(TextBytes) -> u64| {
        forms::drawn_bytes(&forms, &text.draws, everywhere.as_ref(), channel).ok_or(PdfError::Forms)
    };
    let drawn = TextBytes {
        all: drawn(|text| text.all)?,
        high: drawn(|text| text.high)?,
    };
    let count = pages.tree_count.max(pages.objects);
    if count == 0 {
        return Err(PdfError::NoPages);
    }
    Ok(Measure {
        pages: count,
        text_tokens: text.bytes.plus(drawn).tokens(text.multiplier()),
    })
}

/// What a stream inflated to `inflated` bytes not read may show: each byte (each
/// perhaps 0x80 or above), a draw every four (`/ Do`), and — when a reader may take it for a `ToUnicode` map
/// or an object stream holding an encoding (`mapped`: it has a dictionary) — codes
/// mapped to a string of all its bytes (three UTF-8 bytes each two, as a literal
/// destination counts), a glyph name as long as it.
fn unread(inflated: u64, mapped: bool) -> Shown {
    Shown {
        bytes: TextBytes::any(inflated),
        longest_mapping: if mapped {
            inflated.div_ceil(2).saturating_mul(3)
        } else {
            0
        },
        longest_glyph: if mapped {
            glyphs::long_glyph_bytes(inflated)
        } else {
            0
        },
        draws: Draws::unnamed(inflated / 4),
        marked: Draws::unnamed(inflated / 4),
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
        let padding = " ".repeat(decode::CHUNK_BYTES / 3);
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
        // An `endstream` inside the data cuts nothing; what follows it is read as
        // the file's too, as a reader that ends the stream there reads it.
        let cut = format!("(endstream\nendobj\n) Tj {content}");
        assert_eq!(
            measured(&pdf_with_content(cut.as_bytes()))
                .unwrap()
                .text_tokens,
            100_017 + 100_000
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
        // code may map to a string of all its bytes (three UTF-8 bytes each two),
        // or be named by all of them (four UTF-8 bytes each, the larger).
        let bytes = content.len() as u64;
        assert_eq!(measured(&tiff).unwrap().text_tokens, bytes * bytes * 4);
    }

    #[test]
    fn a_string_split_across_a_pages_streams_counts() {
        // A reader joins the streams of a page's `/Contents`: the string opens in one
        // and is shown in the next.
        let mut file = b"%PDF-1.4\n1 0 obj\n<< /Type /Catalog /Pages 2 0 R >>\nendobj\n2 0 obj\n<< /Type /Pages /Kids [3 0 R] /Count 1 >>\nendobj\n3 0 obj\n<< /Type /Page /Parent 2 0 R /Contents [4 0 R 5 0 R] >>\nendobj\n".to_vec();
        let text = "x".repeat(1_000);
        let (first, second) = text.split_at(400);
        for (number, content) in [(4, format!("BT ({first}")), (5, format!("{second}) Tj ET"))] {
            file.extend(format!("{number} 0 obj\n<< /Filter /FlateDecode >>\nstream\n").as_bytes());
            file.extend(deflated(content.as_bytes()));
            file.extend(b"\nendstream\nendobj\n");
        }
        file.extend(b"trailer\n<< /Root 1 0 R >>\n%%EOF\n");
        assert_eq!(measured(&file).unwrap().text_tokens, 1_000);
    }

    #[test]
    fn a_string_open_in_an_images_data_hides_no_object() {
        // An `endstream` in the pixels, and a `(` after it: read as the file's, the
        // string would take the annotation after the image.
        let mut file = with_stream(
            "<< /Type /XObject /Subtype /Image /Filter /DCTDecode >>",
            b"\xff\xd8 endstream ( \xff\xd9",
        );
        file.truncate(file.len() - b"%%EOF\n".len());
        let note = "y".repeat(1_000);
        file.extend(
            format!(
                "10 0 obj\n<< /Type /Annot /Subtype /Text /Contents ({note}) >>\nendobj\n%%EOF\n"
            )
            .as_bytes(),
        );
        assert_eq!(measured(&file).unwrap().text_tokens, 1_000);
    }

    #[test]
    fn a_named_property_lists_actual_text_counts_per_use() {
        let text = "z".repeat(1_000);
        let file = String::from_utf8(pdf_with_content(&b"/Span /MC0 BDC EMC\n".repeat(5)))
            .unwrap()
            .replace(
                "/Contents 4 0 R",
                &format!("/Contents 4 0 R /Resources << /Properties << /MC0 << /ActualText ({text}) >> >> >>"),
            );
        let tokens = measured(file.as_bytes()).unwrap().text_tokens;
        // Each use, and the list once where it is written.
        assert_eq!(tokens, 6 * 1_000);
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
