//! Text helpers shared by the modules that put our words into bounded places: Event notes,
//! metric label values, shadow-mode evidence.
//!
//! A module of its own so that `events`, `metrics` and `shadow` each depend on it instead of
//! on one another (they used to reach into `events` for this, which made a module cycle).

use std::borrow::Cow;

/// `text` cut to at most `limit` bytes on a character boundary, marked with `…` when cut.
pub(crate) fn truncate(text: &str, limit: usize) -> Cow<'_, str> {
    if text.len() <= limit {
        return text.into();
    }
    let ellipsis = '…';
    format!(
        "{}{ellipsis}",
        prefix(text, limit.saturating_sub(ellipsis.len_utf8()))
    )
    .into()
}

/// The longest start of `text` that is at most `limit` bytes and ends on a character boundary.
pub(crate) fn prefix(text: &str, limit: usize) -> &str {
    if text.len() <= limit {
        return text;
    }
    // `str::floor_char_boundary` does this from Rust 1.91; the workspace supports 1.89.
    let mut end = limit;
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    &text[..end]
}

/// `text` cut to at most `limit` bytes on a character boundary, marked with `…` and the
/// whole text's length when cut. Not [`truncate`]: that one counts its `…`
/// (3 bytes) within its limit, so `truncate(text, limit + 3)` would leave texts of `limit + 1`
/// to `limit + 3` bytes whole where this cuts them; both share [`prefix`].
pub(crate) fn cut(text: &str, limit: usize) -> String {
    if text.len() <= limit {
        return text.to_string();
    }
    format!("{}… ({} bytes)", prefix(text, limit), text.len())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn truncation_keeps_short_text_and_cuts_long_text_on_a_char_boundary() {
        assert_eq!(truncate("short", 10), "short");
        let long = "≥".repeat(600); // 3 bytes each
        let cut = truncate(&long, 1024);
        assert!(cut.len() <= 1024, "{}", cut.len());
        assert!(cut.ends_with('…'));
        // A limit inside a character backs off to the boundary before it.
        assert_eq!(truncate("ab≥≥", 6), "ab…");
    }
}
