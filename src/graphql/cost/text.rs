//! The check of a request's raw text, before it is parsed: parsing takes time and
//! memory that grow with tokens and nesting.

use super::{CostError, QueryBudget};

/// Checks the raw text in one pass that stops at the first limit passed: its length,
/// its tokens (punctuators, names, numbers, strings, as the GraphQL lexer would cut
/// them, close enough to budget by) and how deeply brackets nest. Run before parsing,
/// whose time and memory grow with tokens and nesting.
pub fn check_text(query: &str, budget: &QueryBudget) -> Result<(), CostError> {
    if query.len() > budget.bytes {
        return Err(CostError::TooLong {
            bytes: query.len(),
            limit: budget.bytes,
        });
    }
    let bytes = query.as_bytes();
    let mut index = 0;
    let mut tokens = 0;
    let mut depth = 0_usize;
    while index < bytes.len() {
        match bytes[index] {
            b' ' | b'\t' | b'\n' | b'\r' | b',' => {
                index += 1;
                continue;
            }
            b'#' => {
                while index < bytes.len() && !matches!(bytes[index], b'\n' | b'\r') {
                    index += 1;
                }
                continue;
            }
            b'"' if bytes[index..].starts_with(b"\"\"\"") => {
                index = block_string_end(bytes, index + 3);
            }
            b'"' => index = string_end(bytes, index + 1),
            b'{' | b'[' | b'(' => {
                depth += 1;
                if depth > budget.nesting {
                    return Err(CostError::TooDeep {
                        limit: budget.nesting,
                    });
                }
                index += 1;
            }
            b'}' | b']' | b')' => {
                depth = depth.saturating_sub(1);
                index += 1;
            }
            b'.' if bytes[index..].starts_with(b"...") => index += 3,
            byte if is_word_byte(byte) => {
                while index < bytes.len() && is_word_byte(bytes[index]) {
                    index += 1;
                }
            }
            // Any other punctuator (`!`, `$`, `:`, `=`, `@`, `|`, `&`), or a byte the
            // parser will refuse.
            _ => index += 1,
        }
        tokens += 1;
        if tokens > budget.tokens {
            return Err(CostError::TooManyTokens {
                limit: budget.tokens,
            });
        }
    }
    Ok(())
}

/// Names, numbers and anything non-ASCII (refused by the parser, counted here).
fn is_word_byte(byte: u8) -> bool {
    byte.is_ascii_alphanumeric() || matches!(byte, b'_' | b'-' | b'+' | b'.') || byte >= 0x80
}

/// The index after the `"` that closes a string whose contents start at `index`, or
/// the end of the line when it never closes (the parser reports that).
fn string_end(bytes: &[u8], mut index: usize) -> usize {
    while index < bytes.len() {
        match bytes[index] {
            b'\\' => index += 2,
            b'"' => return index + 1,
            b'\n' | b'\r' => return index,
            _ => index += 1,
        }
    }
    bytes.len()
}

/// The index after the `"""` that closes a block string whose contents start at
/// `index` (`\"""` inside does not close it).
fn block_string_end(bytes: &[u8], mut index: usize) -> usize {
    while index < bytes.len() {
        if bytes[index..].starts_with(b"\\\"\"\"") {
            index += 4;
        } else if bytes[index..].starts_with(b"\"\"\"") {
            return index + 3;
        } else {
            index += 1;
        }
    }
    bytes.len()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_text_check_counts_tokens_strings_as_one_and_nesting() {
        let budget = QueryBudget {
            tokens: 8,
            nesting: 2,
            ..QueryBudget::ANONYMOUS
        };
        // { a ( x : "…long…" ) } — 8 tokens, the string one of them.
        let long = format!("{{ a(x: \"{}\") }}", "y\\\"".repeat(1000));
        assert_eq!(check_text(&long, &budget), Ok(()));
        assert_eq!(
            check_text("{ a b c d e f g h }", &budget),
            Err(CostError::TooManyTokens { limit: 8 })
        );
        assert_eq!(
            check_text("{a{b{c}}}", &budget),
            Err(CostError::TooDeep { limit: 2 })
        );
        assert_eq!(
            check_text("# { { { {\n{ a }", &budget),
            Ok(()),
            "comments are skipped"
        );
        assert_eq!(
            check_text("{ a(x: \"\"\" { { { \\\"\"\" { \"\"\") }", &budget),
            Ok(()),
            "block strings are one token"
        );
    }
}
