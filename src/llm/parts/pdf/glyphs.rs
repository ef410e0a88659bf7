//! Glyph names of an `/Encoding /Differences` array: the most UTF-8 bytes an
//! extractor's text has for one code of a font that names its glyph so.
//!
//! A font without a `ToUnicode` map is read through its glyph names, by the Adobe
//! Glyph List's rules: components joined by `_`, each `uni` and groups of four hex
//! digits, `u` and four to six, or a name of the list; what follows a `.` is a
//! variant's suffix. Those are counted by the UTF-8 bytes of the code points they
//! name. The standard ligatures (`ff`, `fi`, `fl`, `ffi`, `ffl`) are one character
//! of three bytes (U+FB00…), or their letters when an extractor spells them out. Of
//! the list's other names, those of ASCII (`a`, `one`, `comma`) count one, so that
//! a plain Latin encoding stays tight, and the common ones above it their bytes;
//! any other name counts four, the most one code point has.

/// The most any one code point counts.
const UNKNOWN: u64 = 4;

/// The most UTF-8 bytes the glyph `name` (without its slash, `#xx` decoded) stands
/// for.
pub fn glyph_bytes(name: &[u8]) -> u64 {
    let name = name.split(|byte| *byte == b'.').next().unwrap_or_default();
    let bytes: u64 = name
        .split(|byte| *byte == b'_')
        .map(component_bytes)
        .fold(0, u64::saturating_add);
    bytes.max(1)
}

/// The most UTF-8 bytes a name of `length` bytes, too long to keep, stands for:
/// each component has a byte at least and no more than [`UNKNOWN`] bytes of text.
pub fn long_glyph_bytes(length: u64) -> u64 {
    length.saturating_mul(UNKNOWN)
}

fn component_bytes(component: &[u8]) -> u64 {
    if let Some(hex) = component.strip_prefix(b"uni")
        && !hex.is_empty()
        && hex.len() % 4 == 0
        && hex.iter().all(is_upper_hex)
    {
        return hex
            .chunks(4)
            .map(|group| code_point_bytes(parse_hex(group)))
            .sum();
    }
    if let Some(hex) = component.strip_prefix(b"u")
        && (4..=6).contains(&hex.len())
        && hex.iter().all(is_upper_hex)
    {
        return code_point_bytes(parse_hex(hex));
    }
    if component.is_empty() {
        return 0;
    }
    if component.len() == 1 && component[0].is_ascii_alphabetic() {
        return 1;
    }
    known_bytes(component).unwrap_or(UNKNOWN)
}

fn is_upper_hex(byte: &u8) -> bool {
    byte.is_ascii_digit() || (b'A'..=b'F').contains(byte)
}

fn parse_hex(digits: &[u8]) -> u32 {
    digits.iter().fold(0, |value, digit| {
        value * 16 + (*digit as char).to_digit(16).unwrap_or(0)
    })
}

/// A surrogate or a value past U+10FFFF names no character: a reader may show
/// U+FFFD (three bytes), or its own guess.
fn code_point_bytes(code: u32) -> u64 {
    match char::from_u32(code) {
        Some(character) => character.len_utf8() as u64,
        None => UNKNOWN,
    }
}

/// The UTF-8 bytes of a name of the Adobe Glyph List, for ASCII and the common
/// names of the standard Latin encodings above it, and Greek.
fn known_bytes(name: &[u8]) -> Option<u64> {
    let bytes = match name {
        b"space" | b"exclam" | b"quotedbl" | b"numbersign" | b"dollar" | b"percent"
        | b"ampersand" | b"quotesingle" | b"parenleft" | b"parenright" | b"asterisk" | b"plus"
        | b"comma" | b"hyphen" | b"period" | b"slash" | b"zero" | b"one" | b"two" | b"three"
        | b"four" | b"five" | b"six" | b"seven" | b"eight" | b"nine" | b"colon" | b"semicolon"
        | b"less" | b"equal" | b"greater" | b"question" | b"at" | b"bracketleft" | b"backslash"
        | b"bracketright" | b"asciicircum" | b"underscore" | b"grave" | b"braceleft" | b"bar"
        | b"braceright" | b"asciitilde" => 1,
        b"exclamdown" | b"cent" | b"sterling" | b"currency" | b"yen" | b"brokenbar"
        | b"section" | b"dieresis" | b"copyright" | b"ordfeminine" | b"guillemotleft"
        | b"logicalnot" | b"registered" | b"macron" | b"degree" | b"plusminus" | b"twosuperior"
        | b"threesuperior" | b"acute" | b"mu" | b"paragraph" | b"cedilla" | b"onesuperior"
        | b"ordmasculine" | b"guillemotright" | b"onequarter" | b"onehalf" | b"threequarters"
        | b"questiondown" | b"Agrave" | b"Aacute" | b"Acircumflex" | b"Atilde" | b"Adieresis"
        | b"Aring" | b"AE" | b"Ccedilla" | b"Egrave" | b"Eacute" | b"Ecircumflex"
        | b"Edieresis" | b"Igrave" | b"Iacute" | b"Icircumflex" | b"Idieresis" | b"Eth"
        | b"Ntilde" | b"Ograve" | b"Oacute" | b"Ocircumflex" | b"Otilde" | b"Odieresis"
        | b"multiply" | b"Oslash" | b"Ugrave" | b"Uacute" | b"Ucircumflex" | b"Udieresis"
        | b"Yacute" | b"Thorn" | b"germandbls" | b"agrave" | b"aacute" | b"acircumflex"
        | b"atilde" | b"adieresis" | b"aring" | b"ae" | b"ccedilla" | b"egrave" | b"eacute"
        | b"ecircumflex" | b"edieresis" | b"igrave" | b"iacute" | b"icircumflex" | b"idieresis"
        | b"eth" | b"ntilde" | b"ograve" | b"oacute" | b"ocircumflex" | b"otilde"
        | b"odieresis" | b"divide" | b"oslash" | b"ugrave" | b"uacute" | b"ucircumflex"
        | b"udieresis" | b"yacute" | b"thorn" | b"ydieresis" | b"OE" | b"oe" | b"Scaron"
        | b"scaron" | b"Zcaron" | b"zcaron" | b"Ydieresis" | b"florin" | b"circumflex"
        | b"tilde" | b"dotlessi" | b"Lslash" | b"lslash" | b"caron" | b"breve" | b"dotaccent"
        | b"ring" | b"ogonek" | b"hungarumlaut" => 2,
        // Greek, which TeX's text and math encodings name.
        b"Alpha" | b"Beta" | b"Gamma" | b"Epsilon" | b"Zeta" | b"Eta" | b"Theta" | b"Iota"
        | b"Kappa" | b"Lambda" | b"Mu" | b"Nu" | b"Xi" | b"Omicron" | b"Pi" | b"Rho" | b"Sigma"
        | b"Tau" | b"Upsilon" | b"Upsilon1" | b"Phi" | b"Chi" | b"Psi" | b"alpha" | b"beta"
        | b"gamma" | b"delta" | b"epsilon" | b"zeta" | b"eta" | b"theta" | b"theta1" | b"iota"
        | b"kappa" | b"lambda" | b"nu" | b"xi" | b"omicron" | b"pi" | b"rho" | b"sigma"
        | b"sigma1" | b"tau" | b"upsilon" | b"phi" | b"phi1" | b"chi" | b"psi" | b"omega"
        | b"omega1" | b"dotlessj" | b"Eng" | b"eng" | b"dcroat" | b"Dcroat" => 2,
        // The list gives these a second character of three bytes (U+2206, U+2126,
        // U+2219).
        b"Delta" | b"Omega" | b"periodcentered" => 3,
        // Three bytes as the one ligature character (U+FB00…), no more spelt out.
        b"ff" | b"fi" | b"fl" | b"ffi" | b"ffl" => 3,
        b"Euro" | b"quotesinglbase" | b"quotedblbase" | b"ellipsis" | b"dagger" | b"daggerdbl"
        | b"perthousand" | b"guilsinglleft" | b"guilsinglright" | b"quoteleft" | b"quoteright"
        | b"quotedblleft" | b"quotedblright" | b"bullet" | b"endash" | b"emdash" | b"trademark"
        | b"minus" | b"fraction" => 3,
        _ => return None,
    };
    Some(bytes)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_name_counts_the_utf8_bytes_of_what_it_names() {
        for (name, bytes) in [
            // ASCII stays one byte a code.
            ("a", 1),
            ("Z", 1),
            ("one", 1),
            ("comma", 1),
            ("a.sc", 1),
            // Latin-1 and the others of the standard encodings.
            ("eacute", 2),
            ("Euro", 3),
            ("quotedblleft", 3),
            ("endash", 3),
            ("Gamma", 2),
            ("alpha", 2),
            ("Omega", 3),
            // Ligatures: the one character, or their letters joined by `_`.
            ("fi", 3),
            ("ffl", 3),
            ("f_f", 2),
            ("f_f_i", 3),
            ("f_i.alt", 2),
            // Code points by their UTF-8 bytes: one or more groups, or one of 4–6.
            ("uni0041", 1),
            ("uni00E9", 2),
            ("uni20AC", 3),
            ("uni006600660069", 3),
            ("uni4E2D4E2D", 6),
            ("u1F600", 4),
            ("u20AC", 3),
            ("uniD83D", 4),
            ("u110000", 4),
            // Names of no known rule: the most one code point has.
            ("g123", 4),
            ("uni00e9", 4),
            ("a_g7", 5),
            (".notdef", 1),
        ] {
            assert_eq!(glyph_bytes(name.as_bytes()), bytes, "{name}");
        }
    }
}
