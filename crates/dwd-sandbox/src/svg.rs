//! What every hand-written SVG chart of the tools starts with: text escaped for HTML and SVG,
//! and the root element. The sandbox's report and the bench's latency chart (which compiles
//! this module in, as it does `gardener`) write their charts by hand so neither needs a
//! plotting dependency; this module keeps their common ground in one place.

/// Escapes text for HTML and SVG, in element content and in quoted attribute values.
pub(crate) fn escape(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for c in s.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&#39;"),
            c => out.push(c),
        }
    }
    out
}

/// The opening tag of a chart's SVG, `width` × `height` (the height rounded to whole pixels).
pub(crate) fn open(width: f64, height: f64) -> String {
    format!(
        r#"<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height:.0}" viewBox="0 0 {width} {height:.0}" font-family="sans-serif" font-size="11">"#
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn escape_covers_markup_and_both_quotes() {
        assert_eq!(
            escape(r#"a<b> & "c" 'd'"#),
            "a&lt;b&gt; &amp; &quot;c&quot; &#39;d&#39;"
        );
    }

    #[test]
    fn open_rounds_the_height() {
        assert!(open(480.0, 354.4).contains(r#"width="480" height="354" viewBox="0 0 480 354""#));
    }
}
