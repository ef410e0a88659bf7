//! A stream's data as a reader decodes it: unfiltered, or inflated a chunk at a
//! time, PNG predictors undone.

use super::forms;
use super::objects::Objects;
use super::streams::{Encoding, PngRows, Predictor, StreamStart};
use super::{InflateBudget, PdfError};
use std::io::Read;

/// Bytes inflated at a time.
pub const CHUNK_BYTES: usize = 64 * 1024;

/// Feeds the data of `stream` (unfiltered, or deflated with no predictor or PNG's)
/// to `each` as a reader decodes it, the bytes inflated taken from the budget — and
/// the bytes of an unfiltered one too when it is read `again` (as a page's streams
/// are, joined), so that many pages listing one stream cost what inflating does.
pub fn decode(
    stream: &StreamStart,
    file: &[u8],
    objects: &Objects,
    budget: &mut InflateBudget,
    again: bool,
    mut each: impl FnMut(&[u8]),
) -> Result<(), PdfError> {
    let data = &file[stream.data..];
    match stream.encoding {
        Encoding::Plain => {
            let end = forms::plain_extent(data, stream.dictionary.unwrap_or_default(), objects);
            if again {
                budget.left = budget
                    .left
                    .checked_sub(end as u64)
                    .ok_or(PdfError::Inflated)?;
            }
            each(&data[..end]);
        }
        Encoding::Flate(Predictor::Png {
            bytes_per_pixel,
            row,
        }) => {
            let mut rows = PngRows::new(bytes_per_pixel, row);
            inflate(data, budget, |chunk| rows.feed(chunk, &mut each))?;
        }
        _ => {
            inflate(data, budget, each)?;
        }
    }
    Ok(())
}

/// Inflates the deflate data at the start of `data` into `each`, a chunk at a time,
/// until it ends or is broken; the bytes inflated are taken from `budget`. Data that
/// is not deflated inflates to nothing.
pub fn inflate(
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
