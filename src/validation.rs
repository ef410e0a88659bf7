//! Checks shared by every service that stores text a client sent.
//!
//! PostgreSQL's `text` cannot hold a NUL character: a statement carrying one fails
//! with an internal error. Text is checked at the edge instead, so a client learns
//! which field to fix (`VALIDATION`) and SQLite and PostgreSQL accept the same inputs.

use crate::error::ServiceError;

/// A name, key or identifier: no control characters at all, nor the invisible
/// characters that would let one name pass for another in a listing (direction
/// overrides and isolates, zero-width characters).
pub fn single_line(field: &str, text: &str) -> Result<(), ServiceError> {
    if text.chars().any(char::is_control) {
        return Err(ServiceError::validation(format!(
            "{field} must not contain control characters"
        )));
    }
    if text.chars().any(is_invisible_format) {
        return Err(ServiceError::validation(format!(
            "{field} must not contain invisible formatting characters (direction overrides, zero-width characters)"
        )));
    }
    Ok(())
}

/// Characters that change how text around them is shown, or show as nothing: Unicode's
/// format characters (direction marks and overrides, zero-width characters, soft
/// hyphens, tags), line and paragraph separators, variation selectors, and the letters
/// that render blank.
fn is_invisible_format(character: char) -> bool {
    matches!(
        character,
        '\u{00AD}'
            | '\u{034F}'
            | '\u{0600}'..='\u{0605}'
            | '\u{061C}'
            | '\u{06DD}'
            | '\u{070F}'
            | '\u{08E2}'
            | '\u{115F}'..='\u{1160}'
            | '\u{17B4}'..='\u{17B5}'
            | '\u{180B}'..='\u{180F}'
            | '\u{200B}'..='\u{200F}'
            | '\u{2028}'..='\u{202E}'
            | '\u{2060}'..='\u{206F}'
            | '\u{2800}'
            | '\u{3164}'
            | '\u{FE00}'..='\u{FE0F}'
            | '\u{FEFF}'
            | '\u{FFA0}'
            | '\u{FFF9}'..='\u{FFFB}'
            | '\u{110BD}'
            | '\u{110CD}'
            | '\u{1BCA0}'..='\u{1BCA3}'
            | '\u{1D173}'..='\u{1D17A}'
            | '\u{E0000}'..='\u{E0FFF}'
    )
}

/// Free text (a reason, a note): line breaks and tabs are fine; NUL and the other
/// control characters are not.
pub fn free_text(field: &str, text: &str) -> Result<(), ServiceError> {
    if text
        .chars()
        .any(|character| character.is_control() && !matches!(character, '\n' | '\r' | '\t'))
    {
        return Err(ServiceError::validation(format!(
            "{field} must not contain control characters other than line breaks and tabs"
        )));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nul_is_refused_everywhere_and_line_breaks_only_in_names() {
        assert!(single_line("model", "gpt-4o").is_ok());
        assert!(single_line("model", "gpt\u{0}4o").is_err());
        assert!(single_line("name", "a\nb").is_err());
        assert!(free_text("note", "first line\nsecond\tline").is_ok());
        assert!(free_text("note", "a\u{0}b").is_err());
        assert!(free_text("note", "bell\u{7}").is_err());
    }

    #[test]
    fn names_refuse_characters_that_show_as_nothing_or_turn_text_around() {
        for invisible in [
            '\u{202E}',
            '\u{200B}',
            '\u{061C}',
            '\u{2028}',
            '\u{00AD}',
            '\u{180E}',
            '\u{034F}',
            '\u{E0041}',
            '\u{FE0F}',
            '\u{180B}',
            '\u{3164}',
            '\u{FFA0}',
            '\u{2800}',
            '\u{FFF9}',
            '\u{0600}',
            '\u{070F}',
            '\u{1BCA0}',
            '\u{1D173}',
            '\u{FEFF}',
        ] {
            let name = format!("acme{invisible}corp");
            assert!(
                single_line("name", &name).is_err(),
                "U+{:04X}",
                invisible as u32
            );
        }
        for visible in ["Zoë's team", "株式会社", "acme 🚀", "Ωmega-1"] {
            assert!(single_line("name", visible).is_ok(), "{visible}");
        }
    }
}
