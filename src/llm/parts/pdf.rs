//! The page count of a PDF, without rendering it: the larger of the page tree's
//! `/Count` and the page objects found, in the file and in its compressed streams
//! (PDF 1.5 keeps objects inside them). An upper bound of the pages a provider sees,
//! which is what a hold needs.

use std::io::Read;

/// Decompressed bytes read from one stream at most: a bomb stops here.
const MAX_INFLATED_BYTES: u64 = 64 * 1024 * 1024;

/// The pages of `bytes`, or `None` when they are not a PDF or no page is found.
pub fn page_count(bytes: &[u8]) -> Option<u32> {
    if !bytes.starts_with(b"%PDF-") {
        return None;
    }
    let mut pages = Pages::default();
    pages.scan(bytes);
    let mut budget = MAX_INFLATED_BYTES;
    for stream in streams(bytes) {
        if budget == 0 {
            break;
        }
        let mut inflated = Vec::new();
        let read = flate2::read::ZlibDecoder::new(stream)
            .take(budget)
            .read_to_end(&mut inflated);
        // A stream that is not deflated, or is cut, still gives what it inflated.
        let _ = read;
        budget = budget.saturating_sub(inflated.len() as u64);
        pages.scan(&inflated);
    }
    let count = pages.tree_count.max(pages.objects);
    (count > 0).then_some(count)
}

#[derive(Default)]
struct Pages {
    /// The largest `/Count` of a `/Type /Pages` node: the root's is the document's.
    tree_count: u32,
    /// `/Type /Page` dictionaries seen.
    objects: u32,
}

impl Pages {
    fn scan(&mut self, bytes: &[u8]) {
        let mut at = 0;
        while let Some(found) = find(&bytes[at..], b"/Type") {
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
    }
}

/// The `/Count N` of the dictionary around `at`: looked for within the dictionary's
/// bounds (from the last `<<` before to the next `>>` after; a page tree node holds
/// no nested dictionary before its count in practice, and a miss only loses the
/// tree's count, never the page objects).
fn count_in_dictionary(bytes: &[u8], at: usize) -> Option<u32> {
    let start = rfind(&bytes[..at], b"<<")?;
    let end = at + find(&bytes[at..], b">>")?;
    let dictionary = &bytes[start..end];
    let position = find(dictionary, b"/Count")?;
    let digits: Vec<u8> = skip_space(&dictionary[position + b"/Count".len()..])
        .iter()
        .copied()
        .take_while(u8::is_ascii_digit)
        .collect();
    std::str::from_utf8(&digits).ok()?.parse().ok()
}

/// The data of each `stream … endstream` in `bytes`.
fn streams(bytes: &[u8]) -> impl Iterator<Item = &[u8]> {
    let mut at = 0;
    std::iter::from_fn(move || {
        let start = at + find(&bytes[at..], b"stream")? + b"stream".len();
        let data_start = match bytes.get(start..start + 2) {
            Some(b"\r\n") => start + 2,
            Some([b'\n', _]) | Some([b'\r', _]) => start + 1,
            _ => start,
        };
        let end = data_start + find(&bytes[data_start..], b"endstream")?;
        at = end + b"endstream".len();
        Some(&bytes[data_start..end])
    })
}

fn find(haystack: &[u8], needle: &[u8]) -> Option<usize> {
    haystack
        .windows(needle.len())
        .position(|window| window == needle)
}

fn rfind(haystack: &[u8], needle: &[u8]) -> Option<usize> {
    haystack
        .windows(needle.len())
        .rposition(|window| window == needle)
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
}

#[cfg(test)]
mod tests {
    use super::samples::pdf;
    use super::*;
    use std::io::Write;

    #[test]
    fn pages_are_counted_by_the_tree_and_the_page_objects() {
        assert_eq!(page_count(&pdf(1)), Some(1));
        assert_eq!(page_count(&pdf(7)), Some(7));
        // A tree that claims more pages than there are objects: the larger counts.
        let claims_more = String::from_utf8(pdf(2))
            .unwrap()
            .replace("/Count 2", "/Count 9");
        assert_eq!(page_count(claims_more.as_bytes()), Some(9));
    }

    #[test]
    fn pages_inside_compressed_object_streams_count() {
        let objects = b"<< /Type /Pages /Kids [3 0 R 4 0 R 5 0 R] /Count 3 >> \
                        << /Type /Page /Parent 2 0 R >> << /Type /Page /Parent 2 0 R >> \
                        << /Type /Page /Parent 2 0 R >>";
        let mut deflate =
            flate2::write::ZlibEncoder::new(Vec::new(), flate2::Compression::default());
        deflate.write_all(objects).unwrap();
        let mut file =
            b"%PDF-1.7\n6 0 obj\n<< /Type /ObjStm /Filter /FlateDecode >>\nstream\n".to_vec();
        file.extend(deflate.finish().unwrap());
        file.extend(b"\nendstream\nendobj\n%%EOF\n");
        assert_eq!(page_count(&file), Some(3));
    }

    #[test]
    fn what_is_not_a_pdf_with_pages_is_refused() {
        assert_eq!(page_count(b"\x89PNG\r\n"), None);
        assert_eq!(page_count(b"%PDF-1.4\n%%EOF\n"), None);
    }
}
