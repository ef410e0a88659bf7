//! The dimensions of an image, read from its header: PNG, JPEG, GIF and WebP. Only
//! the first bytes are looked at; nothing is decoded.

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
        (
            ImageFormat::Gif,
            u32::from(le16(bytes, 6)?),
            u32::from(le16(bytes, 8)?),
        )
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

/// Walks the JPEG's segments to its frame header (SOF0 to SOF15, but DHT, JPG and
/// DAC, which share the range), which holds the height and the width.
fn jpeg_size(bytes: &[u8]) -> Option<(u32, u32)> {
    let mut at = 2;
    loop {
        // Markers may be padded with any number of 0xFF bytes.
        while *bytes.get(at)? == 0xff && *bytes.get(at + 1)? == 0xff {
            at += 1;
        }
        if *bytes.get(at)? != 0xff {
            return None;
        }
        let marker = *bytes.get(at + 1)?;
        at += 2;
        // Markers without a length: TEM, the restarts, SOI.
        if marker == 0x01 || (0xd0..=0xd8).contains(&marker) {
            continue;
        }
        // End of image or start of scan before any frame header: not an image.
        if marker == 0xd9 || marker == 0xda {
            return None;
        }
        let length = usize::from(be16(bytes, at)?);
        if (0xc0..=0xcf).contains(&marker) && ![0xc4, 0xc8, 0xcc].contains(&marker) {
            // Length, precision, then height and width.
            let height = be16(bytes, at + 3)?;
            let width = be16(bytes, at + 5)?;
            return Some((u32::from(width), u32::from(height)));
        }
        if length < 2 {
            return None;
        }
        at += length;
    }
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
}
