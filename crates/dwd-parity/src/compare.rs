//! Two timelines side by side, differences marked.
//!
//! Events other than warnings are paired one to one (the k-th occurrence of an event in one
//! timeline with the k-th occurrence of the same event in the other); a pair further apart
//! than the tolerance is marked `~`, an event only one binary produced `≠`. Warnings are worded differently by the two programs, so
//! they are listed per binary with counts, not aligned.

use std::collections::BTreeMap;

use crate::timeline::{Event, Timeline};

/// The rendering and the number of marked rows.
#[derive(Debug, Clone)]
pub struct SideBySide {
    /// The text to print.
    pub text: String,
    /// Rows marked `~` or `≠`.
    pub differences: usize,
}

const COLUMN: usize = 46;

/// One row of the alignment: ours, the reference's (either may be missing).
type Row<'a> = (Option<&'a (f64, Event)>, Option<&'a (f64, Event)>);

/// Renders `a` and `b` side by side; `tolerance`: seconds two matched events may lie apart.
pub fn side_by_side(
    label_a: &str,
    a: &Timeline,
    label_b: &str,
    b: &Timeline,
    tolerance: f64,
) -> SideBySide {
    let ea: Vec<&(f64, Event)> = a.events.iter().filter(|(_, e)| e.compared()).collect();
    let eb: Vec<&(f64, Event)> = b.events.iter().filter(|(_, e)| e.compared()).collect();
    let pairs = align(&ea, &eb);
    let mut text = format!(
        "   {:>6}  {:<COLUMN$} │ {:>6}  {}\n",
        "time", label_a, "time", label_b
    );
    let mut differences = 0;
    for (x, y) in pairs {
        let cell = |e: Option<&&(f64, Event)>| match e {
            Some((t, ev)) => (format!("{t:6.1}"), clip(&ev.to_string())),
            None => (String::new(), String::new()),
        };
        let mark = match (x, y) {
            (Some((ta, _)), Some((tb, _))) if (ta - tb).abs() > tolerance => "~",
            (Some(_), Some(_)) => " ",
            _ => "≠",
        };
        if mark != " " {
            differences += 1;
        }
        let (ta, sa) = cell(x.as_ref());
        let (tb, sb) = cell(y.as_ref());
        text.push_str(&format!("{mark}  {ta:>6}  {sa:<COLUMN$} │ {tb:>6}  {sb}\n"));
    }
    text.push_str(&warnings_summary(label_a, a));
    text.push_str(&warnings_summary(label_b, b));
    SideBySide { text, differences }
}

/// Pairs the k-th occurrence of an event in `a` with the k-th occurrence of the same event in
/// `b` (so "KCM replicas 0" is paired with "KCM replicas 0" however far apart in time, and a
/// scenario action with itself); rows in time order (a pair at its earlier time).
fn align<'a>(a: &[&'a (f64, Event)], b: &[&'a (f64, Event)]) -> Vec<Row<'a>> {
    let mut used = vec![false; b.len()];
    let mut rows: Vec<(f64, usize, Row<'a>)> = Vec::new();
    for (i, x) in a.iter().enumerate() {
        let partner = b
            .iter()
            .enumerate()
            .find(|(j, y)| !used[*j] && y.1 == x.1)
            .map(|(j, _)| j);
        match partner {
            Some(j) => {
                used[j] = true;
                rows.push((x.0.min(b[j].0), i, (Some(*x), Some(b[j]))));
            }
            None => rows.push((x.0, i, (Some(*x), None))),
        }
    }
    for (j, y) in b.iter().enumerate().filter(|(j, _)| !used[*j]) {
        rows.push((y.0, a.len() + j, (None, Some(*y))));
    }
    // Stable by time, then by recording order.
    rows.sort_by(|p, q| p.0.total_cmp(&q.0).then(p.1.cmp(&q.1)));
    rows.into_iter().map(|(_, _, r)| r).collect()
}

fn clip(s: &str) -> String {
    if s.chars().count() <= COLUMN {
        s.to_string()
    } else {
        let mut out: String = s.chars().take(COLUMN - 1).collect();
        out.push('…');
        out
    }
}

/// `label: N warning/error lines`, then each distinct text with its count and first time.
fn warnings_summary(label: &str, tl: &Timeline) -> String {
    let mut distinct: BTreeMap<&str, (usize, f64)> = BTreeMap::new();
    for (t, e) in &tl.events {
        if let Event::Warning(w) = e {
            let entry = distinct.entry(w.as_str()).or_insert((0, *t));
            entry.0 += 1;
        }
    }
    let total: usize = distinct.values().map(|(n, _)| n).sum();
    let mut out = format!("   {label}: {total} warning/error lines\n");
    let mut rows: Vec<_> = distinct.into_iter().collect();
    rows.sort_by(|x, y| x.1.1.total_cmp(&y.1.1));
    for (text, (n, t)) in rows {
        let mut line: String = text.chars().take(150).collect();
        if text.chars().count() > 150 {
            line.push('…');
        }
        out.push_str(&format!("     {t:6.1}  {n:>3}×  {line}\n"));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tl(events: &[(f64, Event)]) -> Timeline {
        Timeline {
            events: events.to_vec(),
        }
    }

    #[test]
    fn equal_events_align_and_time_or_presence_differences_are_marked() {
        let r = |d: &str, n| Event::Replicas(d.to_string(), n);
        let a = tl(&[(0.0, r("a", 1)), (5.0, r("a", 0)), (6.0, r("b", 0))]);
        let b = tl(&[(0.0, r("a", 1)), (9.0, r("a", 0)), (9.5, r("c", 0))]);
        let out = side_by_side("ours", &a, "reference", &b, 1.0);
        // a→0 four seconds apart (~), b→0 only in ours, c→0 only in the reference (≠ twice).
        assert_eq!(out.differences, 3, "{}", out.text);
        assert!(out.text.lines().any(|l| l.starts_with('~')), "{}", out.text);
    }

    #[test]
    fn warnings_are_counted_not_aligned() {
        let a = tl(&[(1.0, Event::Warning("warn: x".into()))]);
        let b = tl(&[]);
        let out = side_by_side("ours", &a, "reference", &b, 1.0);
        assert_eq!(out.differences, 0);
        assert!(
            out.text.contains("ours: 1 warning/error lines"),
            "{}",
            out.text
        );
    }
}
