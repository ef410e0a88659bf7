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

/// Characters that change how text around them is shown without showing themselves.
fn is_invisible_format(character: char) -> bool {
    matches!(
        character,
        '\u{200B}'..='\u{200F}'
            | '\u{202A}'..='\u{202E}'
            | '\u{2060}'..='\u{2064}'
            | '\u{2066}'..='\u{2069}'
            | '\u{FEFF}'
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
}
