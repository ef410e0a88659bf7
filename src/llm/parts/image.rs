//! The dimensions of an image, read from its headers: PNG, JPEG, GIF and WebP. Only
//! the headers are looked at; nothing is decoded. Where a file may say more than one
//! size (a JPEG's frame headers, a GIF's frames), the largest counts: a reader may
//! take any of them.

/// The image formats a part may carry.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ImageFormat {
    Png,
    Jpeg,
    Gif,
    Webp,
}

impl ImageFormat {
    /// The IANA media type, as providers name it.
    pub fn media_type(self) -> &'static str {
        match self {
            Self::Png => "image/png",
            Self::Jpeg => "image/jpeg",
            Self::Gif => "image/gif",
            Self::Webp => "image/webp",
        }
    }

    /// The format of `media_type`, if it is one of these.
    pub fn of_media_type(media_type: &str) -> Option<Self> {
        [Self::Png, Self::Jpeg, Self::Gif, Self::Webp]
            .into_iter()
            .find(|format| format.media_type().eq_ignore_ascii_case(media_type))
    }
}

/// An image's format and size in pixels, from its header; `None` when the bytes are
/// not one of the four formats, or their header is cut short or says zero pixels.
pub fn read_header(bytes: &[u8]) -> Option<(ImageFormat, u32, u32)> {
    let (format, width, height) = if bytes.starts_with(b"\x89PNG\r\n\x1a\n") {
        // The IHDR chunk comes first: length, "IHDR", width, height (big-endian).
        (bytes.get(12..16)? == b"IHDR").then_some(())?;
        (ImageFormat::Png, be32(bytes, 16)?, be32(bytes, 20)?)
    } else if bytes.starts_with(b"GIF87a") || bytes.starts_with(b"GIF89a") {
        let (width, height) = gif_size(bytes)?;
        (ImageFormat::Gif, width, height)
    } else if bytes.starts_with(b"\xff\xd8") {
        let (width, height) = jpeg_size(bytes)?;
        (ImageFormat::Jpeg, width, height)
    } else if bytes.get(..4)? == b"RIFF" && bytes.get(8..12)? == b"WEBP" {
        let (width, height) = webp_size(bytes)?;
        (ImageFormat::Webp, width, height)
    } else {
        return None;
    };
    (width > 0 && height > 0).then_some((format, width, height))
}

fn be16(bytes: &[u8], at: usize) -> Option<u16> {
    Some(u16::from_be_bytes(bytes.get(at..at + 2)?.try_into().ok()?))
}

fn le16(bytes: &[u8], at: usize) -> Option<u16> {
    Some(u16::from_le_bytes(bytes.get(at..at + 2)?.try_into().ok()?))
}

fn be32(bytes: &[u8], at: usize) -> Option<u32> {
    Some(u32::from_be_bytes(bytes.get(at..at + 4)?.try_into().ok()?))
}

fn le24(bytes: &[u8], at: usize) -> Option<u32> {
    let b = bytes.get(at..at + 3)?;
    Some(u32::from(b[0]) | u32::from(b[1]) << 8 | u32::from(b[2]) << 16)
}

/// Walks the JPEG's segments, its scans' data included, to its end: the largest width
/// and height of its frame headers (SOF0 to SOF15, but DHT, JPG and DAC, which share
/// the range). A second frame header may say a larger size than the first.
fn jpeg_size(bytes: &[u8]) -> Option<(u32, u32)> {
    let mut at = 2;
    let mut size: Option<(u32, u32)> = None;
    loop {
        // Markers may be padded with any number of 0xFF bytes.
        while bytes.get(at) == Some(&0xff) && bytes.get(at + 1) == Some(&0xff) {
            at += 1;
        }
        let (Some(&0xff), Some(&marker)) = (bytes.get(at), bytes.get(at + 1)) else {
            // The data ends, or is not a marker where one should be.
            return size;
        };
        at += 2;
        // Markers without a length: TEM, the restarts, SOI.
        if marker == 0x01 || (0xd0..=0xd8).contains(&marker) {
            continue;
        }
        if marker == 0xd9 {
            return size;
        }
        let Some(length) = be16(bytes, at).map(usize::from) else {
            return size;
        };
        if (0xc0..=0xcf).contains(&marker) && ![0xc4, 0xc8, 0xcc].contains(&marker) {
            // Length, precision, then height and width.
            let (Some(height), Some(width)) = (be16(bytes, at + 3), be16(bytes, at + 5)) else {
                return size;
            };
            let (width, height) = (u32::from(width), u32::from(height));
            size = Some(size.map_or((width, height), |(w, h)| (w.max(width), h.max(height))));
        }
        if length < 2 {
            return size;
        }
        at += length;
        if marker == 0xda {
            // The scan's data: up to the next marker that is neither a stuffed 0xFF00
            // nor a restart.
            while let Some(&byte) = bytes.get(at) {
                let next = bytes.get(at + 1).copied();
                if byte == 0xff
                    && next.is_some_and(|next| next != 0 && !(0xd0..=0xd7).contains(&next))
                {
                    break;
                }
                at += 1;
            }
        }
    }
}

/// The largest of a GIF's logical screen and the extent of each of its frames (a
/// frame may reach past the screen).
fn gif_size(bytes: &[u8]) -> Option<(u32, u32)> {
    let mut width = u32::from(le16(bytes, 6)?);
    let mut height = u32::from(le16(bytes, 8)?);
    let colour_table = |flags: u8| {
        if flags & 0x80 != 0 {
            3 << ((flags & 0x07) + 1)
        } else {
            0
        }
    };
    let mut at = 13 + colour_table(*bytes.get(10)?);
    // Skips a run of sub-blocks, the last of size zero.
    let sub_blocks = |mut at: usize| {
        while let Some(&size) = bytes.get(at) {
            at += 1 + usize::from(size);
            if size == 0 {
                return Some(at);
            }
        }
        None
    };
    while let Some(&block) = bytes.get(at) {
        match block {
            // An extension: its label, then sub-blocks.
            0x21 => at = sub_blocks(at + 2).unwrap_or(bytes.len()),
            // A frame: left, top, width, height, flags, its colour table, the LZW code
            // size, then sub-blocks.
            0x2c => {
                let (Some(left), Some(top), Some(frame_width), Some(frame_height), Some(&flags)) = (
                    le16(bytes, at + 1),
                    le16(bytes, at + 3),
                    le16(bytes, at + 5),
                    le16(bytes, at + 7),
                    bytes.get(at + 9),
                ) else {
                    break;
                };
                width = width.max(u32::from(left) + u32::from(frame_width));
                height = height.max(u32::from(top) + u32::from(frame_height));
                at = sub_blocks(at + 10 + colour_table(flags) + 1).unwrap_or(bytes.len());
            }
            _ => break,
        }
    }
    Some((width, height))
}

/// The canvas of a WebP: its first chunk is a lossy (`VP8 `), lossless (`VP8L`) or
/// extended (`VP8X`) one, each with the size in its own layout.
fn webp_size(bytes: &[u8]) -> Option<(u32, u32)> {
    match bytes.get(12..16)? {
        b"VP8 " => {
            // A key frame's tag (3 bytes), the start code, then 14-bit sizes.
            (bytes.get(23..26)? == b"\x9d\x01\x2a").then_some(())?;
            Some((
                u32::from(le16(bytes, 26)? & 0x3fff),
                u32::from(le16(bytes, 28)? & 0x3fff),
            ))
        }
        b"VP8L" => {
            (*bytes.get(20)? == 0x2f).then_some(())?;
            let bits = u32::from_le_bytes(bytes.get(21..25)?.try_into().ok()?);
            Some(((bits & 0x3fff) + 1, ((bits >> 14) & 0x3fff) + 1))
        }
        b"VP8X" => Some((le24(bytes, 24)? + 1, le24(bytes, 27)? + 1)),
        _ => None,
    }
}

#[cfg(test)]
pub(crate) mod samples {
    //! The smallest headers of each format, with a given size: what tests send.

    /// A PNG header (signature and IHDR) of `width` × `height`.
    pub fn png(width: u32, height: u32) -> Vec<u8> {
        let mut bytes = b"\x89PNG\r\n\x1a\n\x00\x00\x00\x0dIHDR".to_vec();
        bytes.extend(width.to_be_bytes());
        bytes.extend(height.to_be_bytes());
        bytes.extend([8, 6, 0, 0, 0, 0, 0, 0, 0]);
        bytes
    }

    pub fn gif(width: u16, height: u16) -> Vec<u8> {
        let mut bytes = b"GIF89a".to_vec();
        bytes.extend(width.to_le_bytes());
        bytes.extend(height.to_le_bytes());
        bytes.extend([0, 0, 0]);
        bytes
    }

    /// SOI, an APP0 segment, then a baseline frame header.
    pub fn jpeg(width: u16, height: u16) -> Vec<u8> {
        let mut bytes = vec![0xff, 0xd8, 0xff, 0xe0, 0x00, 0x10];
        bytes.extend(b"JFIF\x00\x01\x01\x00\x00\x01\x00\x01\x00\x00");
        bytes.extend([0xff, 0xc0, 0x00, 0x11, 0x08]);
        bytes.extend(height.to_be_bytes());
        bytes.extend(width.to_be_bytes());
        bytes.extend([3, 1, 0x22, 0, 2, 0x11, 1, 3, 0x11, 1]);
        bytes
    }

    pub fn webp_lossy(width: u16, height: u16) -> Vec<u8> {
        let mut bytes = b"RIFF\x00\x00\x00\x00WEBPVP8 \x00\x00\x00\x00".to_vec();
        bytes.extend([0x10, 0x02, 0x00, 0x9d, 0x01, 0x2a]);
        bytes.extend(width.to_le_bytes());
        bytes.extend(height.to_le_bytes());
        bytes
    }

    pub fn webp_lossless(width: u32, height: u32) -> Vec<u8> {
        let mut bytes = b"RIFF\x00\x00\x00\x00WEBPVP8L\x00\x00\x00\x00\x2f".to_vec();
        let bits = (width - 1) | (height - 1) << 14;
        bytes.extend(bits.to_le_bytes());
        bytes
    }

    pub fn webp_extended(width: u32, height: u32) -> Vec<u8> {
        let mut bytes = b"RIFF\x00\x00\x00\x00WEBPVP8X\x0a\x00\x00\x00\x00\x00\x00\x00".to_vec();
        bytes.extend(&(width - 1).to_le_bytes()[..3]);
        bytes.extend(&(height - 1).to_le_bytes()[..3]);
        bytes
    }
}

#[cfg(test)]
mod tests {
    use super::samples::*;
    use super::*;

    #[test]
    fn every_format_tells_its_size() {
        assert_eq!(
            read_header(&png(1024, 768)),
            Some((ImageFormat::Png, 1024, 768))
        );
        assert_eq!(
            read_header(&gif(300, 200)),
            Some((ImageFormat::Gif, 300, 200))
        );
        assert_eq!(
            read_header(&jpeg(4032, 3024)),
            Some((ImageFormat::Jpeg, 4032, 3024))
        );
        assert_eq!(
            read_header(&webp_lossy(640, 480)),
            Some((ImageFormat::Webp, 640, 480))
        );
        assert_eq!(
            read_header(&webp_lossless(16383, 2)),
            Some((ImageFormat::Webp, 16383, 2))
        );
        assert_eq!(
            read_header(&webp_extended(5000, 70)),
            Some((ImageFormat::Webp, 5000, 70))
        );
    }

    #[test]
    fn what_is_not_an_image_header_is_refused() {
        assert_eq!(read_header(b"%PDF-1.7"), None);
        assert_eq!(read_header(b"hello"), None);
        assert_eq!(read_header(&png(10, 10)[..18]), None, "cut short");
        assert_eq!(read_header(&png(0, 10)), None, "no pixels");
        // A JPEG whose scan starts before any frame header.
        assert_eq!(read_header(&[0xff, 0xd8, 0xff, 0xda, 0, 2]), None);
        assert_eq!(
            read_header(&[0xff, 0xd8, 0xff, 0xe0, 0, 0]),
            None,
            "a zero length"
        );
    }

    #[test]
    fn the_largest_size_a_file_says_counts() {
        // A second frame header, after a scan, larger than the first.
        let mut two_frames = jpeg(16, 16);
        two_frames.extend([
            0xff, 0xda, 0x00, 0x02, 0x12, 0xff, 0x00, 0x34, 0xff, 0xd0, 0x56,
        ]);
        two_frames.extend(&jpeg(4000, 3000)[20..]);
        assert_eq!(
            read_header(&two_frames),
            Some((ImageFormat::Jpeg, 4000, 3000))
        );
        // A frame reaching past a 10 × 10 logical screen, after an extension.
        let mut frame = gif(10, 10);
        frame.extend([0x21, 0xf9, 0x04, 0, 0, 0, 0, 0x00]);
        frame.extend([0x2c, 5, 0, 0, 0]);
        frame.extend(3000u16.to_le_bytes());
        frame.extend(2000u16.to_le_bytes());
        frame.extend([0x00, 0x02, 0x02, 0x4c, 0x01, 0x00, 0x3b]);
        assert_eq!(read_header(&frame), Some((ImageFormat::Gif, 3005, 2000)));
    }
}
