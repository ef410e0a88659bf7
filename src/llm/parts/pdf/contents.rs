//! Pages drawn by several content streams (a `/Contents` array): a reader reads
//! them as one, so a string may open in one stream and close in the next. Read
//! one at a time, that string would count in neither; they are read joined.

use super::objects::{Objects, reference};
use super::skip_space;
use super::streams::raw_name_length;
use std::collections::HashSet;

/// The object numbers of every `/Contents` array of more than one stream — given
/// directly or by reference, in the file and in its object streams — each once.
pub fn arrays(file: &[u8], objects: &Objects) -> Vec<Vec<u32>> {
    let mut found = HashSet::new();
    for haystack in std::iter::once(file).chain(objects.streams()) {
        for at in memchr::memmem::find_iter(haystack, b"/Contents") {
            let rest = &haystack[at + b"/Contents".len()..];
            if raw_name_length(rest) > 0 {
                continue;
            }
            let value = skip_space(rest);
            let arrays = match reference(value) {
                Some(number) => objects.bodies(number).into_iter().map(skip_space).collect(),
                None => vec![value],
            };
            for array in arrays {
                let numbers = references(array);
                if numbers.len() > 1 {
                    found.insert(numbers);
                }
            }
        }
    }
    found.into_iter().collect()
}

/// The object numbers of the references of the array at the start of `bytes`.
fn references(bytes: &[u8]) -> Vec<u32> {
    let Some(array) = bytes.strip_prefix(b"[") else {
        return Vec::new();
    };
    let array = &array[..array
        .iter()
        .position(|byte| *byte == b']')
        .unwrap_or(array.len())];
    let words: Vec<&[u8]> = array
        .split(|byte| byte.is_ascii_whitespace())
        .filter(|word| !word.is_empty())
        .collect();
    words
        .windows(3)
        .filter(|words| words[2] == b"R")
        .filter_map(|words| std::str::from_utf8(words[0]).ok()?.parse().ok())
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn arrays_of_several_streams_are_found() {
        let file = b"3 0 obj << /Contents [4 0 R 5 0 R] >> endobj \
                     6 0 obj << /Contents 7 0 R >> endobj 7 0 obj [8 0 R 9 0 R] endobj \
                     10 0 obj << /Contents [11 0 R] /Annots [<< /Contents (x) >>] >> endobj";
        let objects = Objects::of_file(file);
        let mut found = arrays(file, &objects);
        found.sort();
        assert_eq!(found, vec![vec![4, 5], vec![8, 9]]);
    }
}
