//! The objects of a PDF as a reader finds them by number — in the file (`N G obj`)
//! and in its object streams (`/Type /ObjStm`, PDF 1.5) — enough to follow the
//! references of a form's `/Resources` to the forms it draws.
//!
//! Every definition of a number is kept (an update may define one again): what
//! follows a reference is the union of them all, which no reader exceeds.

use super::streams::{Value, dictionary_at, value_of};
use super::{find, skip_space};
use std::collections::HashMap;

/// Most bytes of object streams kept, inflated, to look objects up in. Past it the
/// objects of further streams are not known, and [`Objects::complete`] says so.
pub const MAX_KEPT_BYTES: usize = 16 * 1024 * 1024;

/// Where an object's body is in an object stream: the stream, and a range of it.
type Packed = (usize, usize, usize);

pub struct Objects<'a> {
    file: &'a [u8],
    /// Where the body of each object of the file starts.
    in_file: HashMap<u32, Vec<usize>>,
    /// The object streams kept, inflated.
    streams: Vec<Vec<u8>>,
    in_streams: HashMap<u32, Vec<Packed>>,
    kept_bytes: usize,
    /// No object stream went unread: every object a reader can find is known here.
    complete: bool,
}

impl<'a> Objects<'a> {
    /// The objects of the file itself; object streams are added as they are read.
    pub fn of_file(file: &'a [u8]) -> Self {
        let mut in_file: HashMap<u32, Vec<usize>> = HashMap::new();
        for (number, end) in headers(file) {
            in_file.entry(number).or_default().push(end);
        }
        Self {
            file,
            in_file,
            streams: Vec::new(),
            in_streams: HashMap::new(),
            kept_bytes: 0,
            complete: true,
        }
    }

    /// Every object a reader can find by number is known here.
    pub fn complete(&self) -> bool {
        self.complete
    }

    /// Bytes of object streams that may still be kept.
    pub fn room(&self) -> usize {
        MAX_KEPT_BYTES - self.kept_bytes
    }

    /// An object stream not kept: its objects are not known.
    pub fn missed(&mut self) {
        self.complete = false;
    }

    /// Adds the objects of an object stream, `data` inflated, under `dictionary`.
    pub fn add_stream(&mut self, dictionary: &[u8], data: Vec<u8>) {
        let number = |key: &[u8]| match value_of(dictionary, key) {
            Some(Value::Number(number)) => Some(number),
            _ => None,
        };
        let (Some(count), Some(first)) = (number(b"/N"), number(b"/First")) else {
            return self.missed();
        };
        let Some(header) = data.get(..first) else {
            return self.missed();
        };
        let numbers: Vec<usize> = header
            .split(|byte| byte.is_ascii_whitespace())
            .filter(|word| !word.is_empty())
            .map_while(|word| std::str::from_utf8(word).ok()?.parse().ok())
            .take(count.saturating_mul(2))
            .collect();
        if numbers.len() < count.saturating_mul(2) {
            return self.missed();
        }
        let stream = self.streams.len();
        for (index, pair) in numbers.chunks(2).enumerate() {
            let start = first.saturating_add(pair[1]).min(data.len());
            let end = numbers
                .get(2 * index + 3)
                .map_or(data.len(), |next| {
                    first.saturating_add(*next).min(data.len())
                })
                .max(start);
            if let Ok(number) = u32::try_from(pair[0]) {
                self.in_streams
                    .entry(number)
                    .or_default()
                    .push((stream, start, end));
            }
        }
        self.kept_bytes += data.len();
        self.streams.push(data);
    }

    /// The object streams kept, inflated.
    pub fn streams(&self) -> impl Iterator<Item = &[u8]> {
        self.streams.iter().map(Vec::as_slice)
    }

    /// The bodies of every definition of object `number`.
    pub fn bodies(&self, number: u32) -> Vec<&[u8]> {
        let in_file = self
            .in_file
            .get(&number)
            .into_iter()
            .flatten()
            .map(|start| {
                let body = &self.file[*start..];
                &body[..find(body, b"endobj").unwrap_or(body.len())]
            });
        let packed = self
            .in_streams
            .get(&number)
            .into_iter()
            .flatten()
            .map(|(stream, start, end)| &self.streams[*stream][*start..*end]);
        in_file.chain(packed).collect()
    }

    /// The dictionaries `value` (the bytes where a value starts) is, as it is or by
    /// reference; `None` when it is neither, or names no dictionary known here.
    pub fn dictionaries<'b>(&'b self, value: &'b [u8]) -> Option<Vec<&'b [u8]>> {
        let value = skip_space(value);
        if value.starts_with(b"<<") {
            return dictionary_at(value).map(|dictionary| vec![dictionary]);
        }
        let found: Vec<&[u8]> = self
            .bodies(reference(value)?)
            .into_iter()
            .filter_map(|body| dictionary_at(skip_space(body)))
            .collect();
        (!found.is_empty()).then_some(found)
    }

    /// The numbers `value` is, as it is or by reference (a stream's `/Length`).
    pub fn numbers(&self, value: &[u8]) -> Vec<usize> {
        let direct = |bytes: &[u8]| -> Option<usize> {
            let bytes = skip_space(bytes);
            let digits = bytes
                .iter()
                .take_while(|byte| byte.is_ascii_digit())
                .count();
            std::str::from_utf8(&bytes[..digits]).ok()?.parse().ok()
        };
        match reference(value) {
            Some(number) => self.bodies(number).into_iter().filter_map(direct).collect(),
            None => direct(value).into_iter().collect(),
        }
    }
}

/// Every `N G obj` header of `file`, in order: its number, and where it ends.
pub fn headers(file: &[u8]) -> impl Iterator<Item = (u32, usize)> + '_ {
    memchr::memmem::find_iter(file, b"obj").filter_map(|at| {
        let end = at + b"obj".len();
        // `obj` ends a token: followed by a delimiter, a space or the end.
        if file
            .get(end)
            .is_some_and(|byte| !byte.is_ascii_whitespace() && !b"<[(/%".contains(byte))
        {
            return None;
        }
        super::streams::object_number_before(&file[..end]).map(|number| (number, end))
    })
}

/// The object number of the reference `N G R` at the start of `bytes`.
pub fn reference(bytes: &[u8]) -> Option<u32> {
    let digits = |bytes: &[u8]| {
        bytes
            .iter()
            .take_while(|byte| byte.is_ascii_digit())
            .count()
    };
    let bytes = skip_space(bytes);
    let number = digits(bytes);
    let rest = &bytes[number..];
    let generation_at = skip_space(rest);
    if number == 0 || generation_at.len() == rest.len() {
        return None;
    }
    let generation = digits(generation_at);
    let rest = &generation_at[generation..];
    let r = skip_space(rest);
    if generation == 0 || r.len() == rest.len() || !r.starts_with(b"R") {
        return None;
    }
    if r.get(1).is_some_and(u8::is_ascii_alphanumeric) {
        return None;
    }
    std::str::from_utf8(&bytes[..number]).ok()?.parse().ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn references_are_read() {
        assert_eq!(reference(b" 12 0 R >>"), Some(12));
        assert_eq!(reference(b"12 0 R/Next"), Some(12));
        assert_eq!(reference(b"12 0 obj"), None);
        assert_eq!(reference(b"12 R"), None);
        assert_eq!(reference(b"/Name"), None);
    }

    #[test]
    fn objects_are_found_in_the_file_and_in_object_streams() {
        let file = b"%PDF-1.5\n3 0 obj\n<< /A 1 >>\nendobj\n4 0 obj<</B 2>>endobj\n";
        let mut objects = Objects::of_file(file);
        assert_eq!(objects.bodies(3), vec![&b"\n<< /A 1 >>\n"[..]]);
        assert_eq!(objects.dictionaries(b"4 0 R"), Some(vec![&b"<</B 2>>"[..]]));
        assert_eq!(objects.dictionaries(b"5 0 R"), None);
        let packed = b"7 0 8 11 << /C 3 >> 42".to_vec();
        objects.add_stream(b"<< /Type /ObjStm /N 2 /First 9 >>", packed);
        assert!(objects.complete());
        assert_eq!(
            objects.dictionaries(b"7 0 R"),
            Some(vec![&b"<< /C 3 >>"[..]])
        );
        assert_eq!(objects.numbers(b"8 0 R"), vec![42]);
        objects.add_stream(b"<< /Type /ObjStm /N 2 >>", Vec::new());
        assert!(!objects.complete());
    }
}
