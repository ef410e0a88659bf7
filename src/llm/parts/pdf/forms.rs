//! Form XObjects: content drawn by `Do`, as often as a page (or another form)
//! likes, each draw showing the form's text again — a text extractor outputs it on
//! every draw. So a form's text counts once per draw, nested forms included:
//!
//! - a form's total is its own text plus, for each of its draws, the total of the
//!   form it draws;
//! - a `Do /Name` of a form is the objects its own `/Resources /XObject` binds the
//!   name to; any other `Do` (a page's, or a form's whose resources do not bind
//!   the name) is the objects any `/XObject` dictionary of the document binds it
//!   to — a reader finds it in one of them — or, when some dictionary or object
//!   stream could not be read, the largest form;
//! - an object no form is draws no text (an image), unless a form's object number
//!   could not be read, when it may be that form.
//!
//! Totals are computed a level of nesting at a time; forms that still grow after
//! [`MAX_FORM_DEPTH`] levels draw each other in a cycle (or nest that deep) with text
//! in it, and the document is refused. A cycle that shows no text settles at zero.

use super::objects::{Objects, reference};
use super::shown::TextBytes;
use super::streams::{name, raw_name_length, value_at};
use super::{find, skip_space};
use std::collections::HashMap;

/// Deepest nesting of forms accepted when the forms show text at every level.
pub const MAX_FORM_DEPTH: usize = 32;
/// Most names one stream's draws are told apart by; the draws of further names
/// count as draws of any form.
const MAX_NAMES: usize = 1024;

/// The `Do`s of a stream, by the name they draw.
#[derive(Default, Debug)]
pub struct Draws {
    named: HashMap<Vec<u8>, u64>,
    /// Draws whose name is not known: each may be of any form.
    unnamed: u64,
}

impl Draws {
    /// `count` draws of names not known.
    pub fn unnamed(count: u64) -> Self {
        Self {
            named: HashMap::new(),
            unnamed: count,
        }
    }

    pub fn add(&mut self, name: Option<Vec<u8>>) {
        self.add_many(name, 1);
    }

    fn add_many(&mut self, name: Option<Vec<u8>>, count: u64) {
        match name {
            Some(name) if self.named.len() < MAX_NAMES || self.named.contains_key(&name) => {
                let draws = self.named.entry(name).or_default();
                *draws = draws.saturating_add(count);
            }
            _ => self.unnamed = self.unnamed.saturating_add(count),
        }
    }

    /// The sum of `of_name` over every draw; a draw of a name not known, `any`.
    pub fn total(&self, of_name: impl Fn(&[u8]) -> u64, any: u64) -> u64 {
        let named = self.named.iter().fold(0u64, |sum, (name, count)| {
            sum.saturating_add(count.saturating_mul(of_name(name)))
        });
        named.saturating_add(self.unnamed.saturating_mul(any))
    }

    /// Adds the draws of `other`.
    pub fn merge(&mut self, other: Draws) {
        self.unnamed = self.unnamed.saturating_add(other.unnamed);
        for (name, count) in other.named {
            self.add_many(Some(name), count);
        }
    }
}

/// The objects the names of `/XObject` dictionaries draw.
#[derive(Default, Debug)]
pub struct Bindings(HashMap<Vec<u8>, Vec<u32>>);

impl Bindings {
    /// Every `/Name N G R` of `dictionary` (nested dictionaries' too: a binding more
    /// only adds a candidate).
    fn add_entries(&mut self, dictionary: &[u8]) {
        let mut at = 0;
        while let Some(found) = dictionary[at..].iter().position(|byte| *byte == b'/') {
            let start = at + found + 1;
            let rest = &dictionary[start..];
            let end = raw_name_length(rest);
            at = start + end;
            if let Some(number) = reference(&rest[end..]) {
                let objects = self.0.entry(name(rest)).or_default();
                if !objects.contains(&number) {
                    objects.push(number);
                }
            }
        }
    }

    /// The bindings of a form: those of its own `/Resources /XObject`, as far as
    /// they are found (a name not found is drawn as any `Do` of the page is).
    pub fn of_form(dictionary: &[u8], objects: &Objects) -> Self {
        let mut bindings = Self::default();
        let Some(resources) = value_at(dictionary, b"/Resources") else {
            return bindings;
        };
        for resources in objects.dictionaries(resources).unwrap_or_default() {
            let Some(xobjects) = value_at(resources, b"/XObject") else {
                continue;
            };
            for xobjects in objects.dictionaries(xobjects).unwrap_or_default() {
                bindings.add_entries(xobjects);
            }
        }
        bindings
    }

    /// The bindings of every `/XObject` dictionary of the document, in the file and
    /// in its object streams; `None` when one could not be read (or an object
    /// stream was not), so that a name could be bound where it is not seen.
    pub fn everywhere(file: &[u8], objects: &Objects) -> Option<Self> {
        if !objects.complete() {
            return None;
        }
        let mut bindings = Self::default();
        for haystack in std::iter::once(file).chain(objects.streams()) {
            for at in memchr::memmem::find_iter(haystack, b"/XObject") {
                let rest = &haystack[at + b"/XObject".len()..];
                if raw_name_length(rest) > 0 {
                    continue;
                }
                let value = skip_space(rest);
                // `/Type /XObject`: the name is a value there, not a key.
                if value.starts_with(b"/") || value.starts_with(b">>") {
                    continue;
                }
                for dictionary in objects.dictionaries(value)? {
                    bindings.add_entries(dictionary);
                }
            }
        }
        Some(bindings)
    }
}

/// A form XObject: its number, its own text (string bytes), draws and bindings.
pub struct Form {
    pub object: Option<u32>,
    pub text: TextBytes,
    pub draws: Draws,
    pub bindings: Bindings,
}

/// Whether a stream of `dictionary` may be drawn as a form: it says so, or its
/// `/Subtype` is not a name given directly.
pub fn is_form(dictionary: &[u8]) -> bool {
    let Some(subtype) = value_at(dictionary, b"/Subtype") else {
        return false;
    };
    match skip_space(subtype).strip_prefix(b"/") {
        Some(subtype) => name(subtype) == b"Form",
        None => true,
    }
}

/// The string bytes every draw shows, of the `channel` of the forms' text: each form
/// once on its own (an annotation's appearance is drawn without a `Do`), and the
/// forms drawn by `pages` (the draws of every stream that is not a form) and by each
/// other, per draw. `None` when forms still grow after [`MAX_FORM_DEPTH`] levels.
pub fn drawn_bytes(
    forms: &[Form],
    pages: &Draws,
    everywhere: Option<&Bindings>,
    channel: fn(TextBytes) -> u64,
) -> Option<u64> {
    let mut by_object: HashMap<u32, Vec<usize>> = HashMap::new();
    for (index, form) in forms.iter().enumerate() {
        if let Some(object) = form.object {
            by_object.entry(object).or_default().push(index);
        }
    }
    let unnumbered = forms.iter().any(|form| form.object.is_none());
    let mut values = vec![0u64; forms.len()];
    let mut settled = false;
    // Round k gives each form its total with k - 1 levels of nesting below it.
    for _ in 0..=MAX_FORM_DEPTH {
        let totals = Totals::new(&values, &by_object, unnumbered, everywhere);
        let next: Vec<u64> = forms
            .iter()
            .map(|form| {
                channel(form.text)
                    .saturating_add(totals.of_draws(&form.draws, Some(&form.bindings)))
            })
            .collect();
        if next == values {
            settled = true;
            break;
        }
        values = next;
    }
    if !settled {
        return None;
    }
    let totals = Totals::new(&values, &by_object, unnumbered, everywhere);
    let alone = values
        .iter()
        .fold(0u64, |sum, value| sum.saturating_add(*value));
    Some(alone.saturating_add(totals.of_draws(pages, None)))
}

/// The totals of the forms at one level of nesting, and what a draw of a name
/// counts with them.
struct Totals<'a> {
    values: &'a [u64],
    by_object: &'a HashMap<u32, Vec<usize>>,
    unnumbered: bool,
    everywhere: Option<&'a Bindings>,
    /// The largest form's.
    any: u64,
}

impl<'a> Totals<'a> {
    fn new(
        values: &'a [u64],
        by_object: &'a HashMap<u32, Vec<usize>>,
        unnumbered: bool,
        everywhere: Option<&'a Bindings>,
    ) -> Self {
        Self {
            values,
            by_object,
            unnumbered,
            everywhere,
            any: values.iter().copied().max().unwrap_or(0),
        }
    }

    fn of_draws(&self, draws: &Draws, own: Option<&Bindings>) -> u64 {
        let named = draws.named.iter().fold(0u64, |sum, (name, count)| {
            sum.saturating_add(count.saturating_mul(self.of_name(name, own)))
        });
        named.saturating_add(draws.unnamed.saturating_mul(self.any))
    }

    fn of_name(&self, name: &[u8], own: Option<&Bindings>) -> u64 {
        if let Some(objects) = own.and_then(|own| own.0.get(name)) {
            return self.of_objects(objects);
        }
        match self.everywhere {
            // Bound nowhere: a reader finds nothing to draw.
            Some(everywhere) => everywhere
                .0
                .get(name)
                .map_or(0, |objects| self.of_objects(objects)),
            None => self.any,
        }
    }

    fn of_objects(&self, objects: &[u32]) -> u64 {
        objects
            .iter()
            .map(|object| match self.by_object.get(object) {
                Some(forms) => forms
                    .iter()
                    .map(|form| self.values[*form])
                    .max()
                    .unwrap_or(0),
                None if self.unnumbered => self.any,
                None => 0,
            })
            .max()
            .unwrap_or(0)
    }
}

/// Where the data of an unfiltered stream (from `data`) may end for a reader: at
/// its `/Length` (direct or by reference) or its first `endstream`, whichever is
/// later; at the end of the file when its length is not known.
pub fn plain_extent(data: &[u8], dictionary: &[u8], objects: &Objects) -> usize {
    let keyword = find(data, b"endstream").unwrap_or(data.len());
    let lengths =
        value_at(dictionary, b"/Length").map_or_else(Vec::new, |value| objects.numbers(value));
    match lengths.into_iter().max() {
        Some(length) => keyword.max(length.min(data.len())),
        None => data.len(),
    }
}

/// Where a reader may read the file again after an unfiltered stream (from
/// `data`): at its first `endstream` or its `/Length`, whichever is earlier. The
/// bytes from there to [`plain_extent`] are the stream's for one reader and the
/// file's for another, so they are read both ways.
pub fn plain_resumption(data: &[u8], dictionary: &[u8], objects: &Objects) -> usize {
    let keyword = find(data, b"endstream").unwrap_or(data.len());
    let lengths =
        value_at(dictionary, b"/Length").map_or_else(Vec::new, |value| objects.numbers(value));
    lengths
        .into_iter()
        .map(|length| length.min(data.len()))
        .fold(keyword, usize::min)
}

#[cfg(test)]
mod tests {
    use super::super::{InflateBudget, PdfError, measure};
    use std::io::Write;

    fn deflated(bytes: &[u8]) -> Vec<u8> {
        let mut deflate =
            flate2::write::ZlibEncoder::new(Vec::new(), flate2::Compression::default());
        deflate.write_all(bytes).unwrap();
        deflate.finish().unwrap()
    }

    /// A one-page PDF: the page (object 3) with `resources`, its deflated content
    /// (object 4), then `objects` — a number, a dictionary, and a stream's data to
    /// deflate when it is one.
    fn document(resources: &str, content: &str, objects: &[(u32, &str, Option<&str>)]) -> Vec<u8> {
        let mut file = format!(
            "%PDF-1.5\n1 0 obj\n<< /Type /Catalog /Pages 2 0 R >>\nendobj\n2 0 obj\n<< /Type /Pages /Kids [3 0 R] /Count 1 >>\nendobj\n3 0 obj\n<< /Type /Page /Parent 2 0 R /Resources {resources} /Contents 4 0 R >>\nendobj\n"
        )
        .into_bytes();
        let object =
            |file: &mut Vec<u8>, number: u32, dictionary: &str, data: Option<&[u8]>| match data {
                Some(data) => {
                    let data = deflated(data);
                    let dictionary = dictionary.replacen(
                        "<<",
                        &format!("<< /Filter /FlateDecode /Length {}", data.len()),
                        1,
                    );
                    file.extend(format!("{number} 0 obj\n{dictionary}\nstream\n").as_bytes());
                    file.extend(data);
                    file.extend(b"\nendstream\nendobj\n");
                }
                None => file.extend(format!("{number} 0 obj\n{dictionary}\nendobj\n").as_bytes()),
            };
        object(&mut file, 4, "<< >>", Some(content.as_bytes()));
        for (number, dictionary, data) in objects {
            object(&mut file, *number, dictionary, data.map(str::as_bytes));
        }
        file.extend(b"trailer\n<< /Root 1 0 R >>\n%%EOF\n");
        file
    }

    fn text_tokens(file: &[u8]) -> Result<u64, PdfError> {
        measure(file, &mut InflateBudget::default()).map(|measure| measure.text_tokens)
    }

    /// A content stream showing `bytes` bytes of text.
    fn shows(bytes: usize) -> String {
        format!("BT /F1 1 Tf ({}) Tj ET\n", "x".repeat(bytes))
    }

    fn form(resources: &str) -> String {
        format!("<< /Type /XObject /Subtype /Form /BBox [0 0 10 10] /Resources {resources} >>")
    }

    const TEXT: usize = 2_000;

    #[test]
    fn a_form_counts_once_per_draw() {
        let draws = 200;
        let file = document(
            "<< /XObject << /Fm0 10 0 R >> >>",
            &"q /Fm0 Do Q\n".repeat(draws),
            &[(10, &form("<< >>"), Some(&shows(TEXT)))],
        );
        let tokens = text_tokens(&file).unwrap();
        // Every draw, and the form once on its own.
        assert!(tokens >= (draws * TEXT) as u64, "{tokens}");
        assert!(tokens <= ((draws + 2) * TEXT) as u64, "{tokens}");
    }

    /// A form's bytes of 0x80 or above count three UTF-8 bytes on every draw, as a
    /// font without a `ToUnicode` map may show them.
    #[test]
    fn a_forms_high_bytes_count_three_per_draw() {
        let draws = 10;
        let high = format!("BT /F1 1 Tf <{}> Tj ET\n", "80".repeat(TEXT));
        let file = document(
            "<< /XObject << /Fm0 10 0 R >> >>",
            &"/Fm0 Do\n".repeat(draws),
            &[(10, &form("<< >>"), Some(&high))],
        );
        let tokens = text_tokens(&file).unwrap();
        assert!(tokens >= (3 * draws * TEXT) as u64, "{tokens}");
        assert!(tokens <= (3 * (draws + 2) * TEXT) as u64, "{tokens}");
    }

    /// A plain stream whose `/Length` runs past its first `endstream` (or stops
    /// short of it): a reader that ends it at the other reads the bytes between as
    /// the file's, where an annotation's text may be, which the stream's own
    /// reading swallows in a string it leaves open.
    #[test]
    fn the_bytes_a_plain_streams_length_disputes_are_read_as_the_files_too() {
        let annotation = "9 0 obj\n<< /Type /Annot /Contents (hidden note) >>\nendobj\n";
        let past = format!("BT (xendstream\nendobj\n{annotation}");
        let short = format!("BT (x\nendobj\n{annotation}");
        for (length, data) in [(past.len(), past), (5, short)] {
            let mut file = format!(
                "%PDF-1.4\n1 0 obj\n<< /Type /Catalog /Pages 2 0 R >>\nendobj\n2 0 obj\n<< /Type /Pages /Kids [3 0 R] /Count 1 >>\nendobj\n3 0 obj\n<< /Type /Page /Parent 2 0 R /Contents 4 0 R >>\nendobj\n4 0 obj\n<< /Length {length} >>\nstream\n{data}"
            );
            file.push_str("\nendstream\nendobj\ntrailer\n<< /Root 1 0 R >>\n%%EOF\n");
            let tokens = text_tokens(file.as_bytes()).unwrap();
            assert!(tokens >= "hidden note".len() as u64, "{length}: {tokens}");
        }
    }

    #[test]
    fn nested_forms_count_per_draw_of_each_level() {
        // The page draws form 10 three times, which draws form 11 four times: the
        // text of form 11 is shown twelve times.
        let inner = form("<< /XObject << /Fm0 11 0 R >> >>");
        let file = document(
            "<< /XObject << /Fm0 10 0 R >> >>",
            &"/Fm0 Do\n".repeat(3),
            &[
                (10, &inner, Some(&"/Fm0 Do\n".repeat(4))),
                (11, &form("<< >>"), Some(&shows(TEXT))),
            ],
        );
        let tokens = text_tokens(&file).unwrap();
        assert!(tokens >= (12 * TEXT) as u64, "{tokens}");
        assert!(tokens <= (20 * TEXT) as u64, "{tokens}");
    }

    #[test]
    fn resources_in_object_streams_are_followed() {
        // The form's resources (object 21), and the page's (20), are packed.
        let packed =
            "20 0 21 40 << /XObject << /Fm0 10 0 R >> >>        << /XObject << /Fm1 11 0 R >> >>";
        let file = document(
            "20 0 R",
            &"/Fm0 Do\n".repeat(3),
            &[
                (30, "<< /Type /ObjStm /N 2 /First 11 >>", Some(packed)),
                (10, &form("21 0 R"), Some(&"/Fm1 Do\n".repeat(4))),
                (11, &form("<< >>"), Some(&shows(TEXT))),
            ],
        );
        let tokens = text_tokens(&file).unwrap();
        assert!(tokens >= (12 * TEXT) as u64, "{tokens}");
        assert!(tokens <= (20 * TEXT) as u64, "{tokens}");
    }

    #[test]
    fn a_draw_not_resolved_counts_the_largest_form() {
        // The page's `/XObject` names an object not found: any of its draws may be
        // of the form.
        let draws = 50;
        let file = document(
            "<< /XObject 40 0 R >>",
            &"/Unknown Do\n".repeat(draws),
            &[(10, &form("<< >>"), Some(&shows(TEXT)))],
        );
        assert!(text_tokens(&file).unwrap() >= (draws * TEXT) as u64);
    }

    #[test]
    fn images_drawn_show_no_text() {
        let file = document(
            "<< /XObject << /Im0 12 0 R /Fm0 10 0 R >> >>",
            &format!("{}/Fm0 Do\n", "/Im0 Do\n".repeat(100)),
            &[
                (10, &form("<< >>"), Some(&shows(TEXT))),
                (12, "<< /Subtype /Image /Width 1 /Height 1 >>", Some("\0")),
            ],
        );
        let tokens = text_tokens(&file).unwrap();
        assert!(
            tokens >= (2 * TEXT) as u64 && tokens <= (3 * TEXT) as u64,
            "{tokens}"
        );
    }

    #[test]
    fn a_form_that_draws_itself_is_bounded_or_refused() {
        let itself = form("<< /XObject << /Fm0 10 0 R >> >>");
        let with_text = document(
            "<< /XObject << /Fm0 10 0 R >> >>",
            "/Fm0 Do",
            &[(
                10,
                &itself,
                Some(&format!("{}/Fm0 Do /Fm0 Do", shows(TEXT))),
            )],
        );
        assert_eq!(text_tokens(&with_text), Err(PdfError::Forms));
        // Drawing itself shows nothing more when it shows nothing.
        let without = document(
            "<< /XObject << /Fm0 10 0 R >> >>",
            "/Fm0 Do",
            &[(10, &itself, Some("/Fm0 Do /Fm0 Do"))],
        );
        assert_eq!(text_tokens(&without), Ok(0));
        assert!(PdfError::Forms.to_string().contains("cycle"));
    }
}
