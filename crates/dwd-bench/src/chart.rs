//! A self-contained SVG of the run's latency distributions: one CDF panel per metric, one
//! line per binary (rounds of the same binary pooled). Written by hand so the harness needs
//! no plotting dependency and the file opens in any browser.

use std::collections::BTreeMap;
use std::fmt::Write as _;

use crate::svg::{self, escape};

/// Raw samples by metric name, in seconds.
pub(crate) type Dists = BTreeMap<String, Vec<f64>>;

/// Probe lateness: gap between consecutive probes minus the interval.
pub(crate) const PROBE_LATENESS: &str = "probe lateness";
/// Outage: threshold crossing → target at 0.
pub(crate) const SCALE_DOWN: &str = "crossing → target 0";
/// Outage: recovery → target restored.
pub(crate) const RESTORE: &str = "recovery → target restored";
/// Weeder storm: slice ready → crash-looping pod deleted.
pub(crate) const WEEDER_DELETION: &str = "slice ready → pod deleted";

/// Panel order (metrics not measured in the run are left out).
const ORDER: [&str; 4] = [PROBE_LATENESS, SCALE_DOWN, RESTORE, WEEDER_DELETION];

/// Line colours, one per binary (colour-blind-safe Okabe–Ito).
const COLOURS: [&str; 6] = [
    "#0072B2", "#D55E00", "#009E73", "#CC79A7", "#E69F00", "#56B4E9",
];

const PANEL_W: f64 = 480.0;
const PANEL_H: f64 = 300.0;
const MARGIN_L: f64 = 56.0;
const MARGIN_R: f64 = 16.0;
const MARGIN_T: f64 = 34.0;
const MARGIN_B: f64 = 46.0;
const COLUMNS: usize = 2;

/// About five round tick values covering `[lo, hi]`.
fn ticks(lo: f64, hi: f64) -> Vec<f64> {
    let range = (hi - lo).max(1e-9);
    let raw = range / 5.0;
    let magnitude = 10f64.powf(raw.log10().floor());
    let step = [1.0, 2.0, 5.0, 10.0]
        .iter()
        .map(|m| m * magnitude)
        .find(|s| range / s <= 6.0)
        .unwrap_or(10.0 * magnitude);
    let first = (lo / step).ceil() as i64;
    let last = (hi / step).floor() as i64;
    (first..=last).map(|k| k as f64 * step).collect()
}

/// Formats a tick value without noise (`0.25`, `2`, `1500`).
fn tick_label(v: f64) -> String {
    let s = format!("{v:.3}");
    let s = s.trim_end_matches('0').trim_end_matches('.');
    if s == "-0" { "0".into() } else { s.into() }
}

/// A light grid line from `from` to `to`, its label at `label_at` (anchored `anchor`).
fn grid_line(
    svg: &mut String,
    from: (f64, f64),
    to: (f64, f64),
    label: &str,
    label_at: (f64, f64),
    anchor: &str,
) {
    let _ = writeln!(
        svg,
        r##"<line x1="{}" y1="{}" x2="{}" y2="{}" stroke="#eee"/><text x="{}" y="{}" text-anchor="{anchor}">{label}</text>"##,
        from.0, from.1, to.0, to.1, label_at.0, label_at.1
    );
}

/// Renders `runs` (label, samples by metric) as an SVG document; `None` when no run has any
/// sample to draw.
pub(crate) fn render(title: &str, runs: &[(String, &Dists)]) -> Option<String> {
    // Pool rounds: label → metric → samples.
    let mut labels: Vec<String> = Vec::new();
    let mut pooled: BTreeMap<&str, BTreeMap<String, Vec<f64>>> = BTreeMap::new();
    for (label, dists) in runs {
        if !labels.contains(label) {
            labels.push(label.clone());
        }
        for (metric, values) in dists.iter() {
            let finite = values.iter().copied().filter(|v| v.is_finite());
            pooled
                .entry(metric.as_str())
                .or_default()
                .entry(label.clone())
                .or_default()
                .extend(finite);
        }
    }
    let panels: Vec<(&str, &BTreeMap<String, Vec<f64>>)> = ORDER
        .iter()
        .filter_map(|m| pooled.get_key_value(m).map(|(k, v)| (*k, v)))
        .filter(|(_, by_label)| by_label.values().any(|v| !v.is_empty()))
        .collect();
    if panels.is_empty() {
        return None;
    }
    let rows = panels.len().div_ceil(COLUMNS);
    let legend_h = 24.0;
    let width = PANEL_W * COLUMNS.min(panels.len()) as f64;
    let height = 30.0 + legend_h + PANEL_H * rows as f64;
    let mut svg = svg::open(width, height);
    svg.push('\n');
    let _ = writeln!(
        svg,
        r#"<rect width="100%" height="100%" fill="white"/><text x="10" y="20" font-size="14" font-weight="bold">{}</text>"#,
        escape(title)
    );
    // Legend: one swatch per binary.
    let mut x = 10.0;
    for (i, label) in labels.iter().enumerate() {
        let colour = COLOURS[i % COLOURS.len()];
        let _ = writeln!(
            svg,
            r#"<line x1="{x}" y1="{y}" x2="{x2}" y2="{y}" stroke="{colour}" stroke-width="3"/><text x="{tx}" y="{ty}">{}</text>"#,
            escape(label),
            y = 38.0,
            x2 = x + 20.0,
            tx = x + 25.0,
            ty = 42.0
        );
        x += 40.0 + 7.0 * label.chars().count() as f64;
    }
    for (p, (metric, by_label)) in panels.iter().enumerate() {
        let ox = PANEL_W * (p % COLUMNS) as f64;
        let oy = 30.0 + legend_h + PANEL_H * (p / COLUMNS) as f64;
        panel(&mut svg, ox, oy, metric, by_label, &labels);
    }
    svg.push_str("</svg>\n");
    Some(svg)
}

/// The fraction axis of a panel: grid lines at 0, ¼, ½, ¾ and 1, and a dashed line at p99
/// (the issue's targets are p99s, so its level gets a line of its own).
fn fraction_grid(svg: &mut String, x0: f64, w: f64, sy: impl Fn(f64) -> f64) {
    let _ = writeln!(
        svg,
        r##"<line x1="{x0}" y1="{y}" x2="{xr}" y2="{y}" stroke="#bbb" stroke-dasharray="4 3"/><text x="{tx}" y="{ty}" text-anchor="end" fill="#888">p99</text>"##,
        y = sy(0.99),
        xr = x0 + w,
        tx = x0 + w - 3.0,
        ty = sy(0.99) + 11.0
    );
    for f in [0.0, 0.25, 0.5, 0.75, 1.0] {
        let y = sy(f);
        grid_line(
            svg,
            (x0, y),
            (x0 + w, y),
            &tick_label(f),
            (x0 - 4.0, y + 4.0),
            "end",
        );
    }
}

/// The polyline points of `values`' CDF between `lo` and `hi`: a step function, flat until
/// each sample, then up by 1/n.
fn cdf_points(
    values: &[f64],
    sx: impl Fn(f64) -> f64,
    sy: impl Fn(f64) -> f64,
    (lo, hi): (f64, f64),
) -> String {
    let mut v = values.to_vec();
    v.sort_by(f64::total_cmp);
    let n = v.len() as f64;
    let mut points = format!("{:.1},{:.1}", sx(lo), sy(0.0));
    for (k, value) in v.iter().enumerate() {
        let _ = write!(
            points,
            " {:.1},{:.1} {:.1},{:.1}",
            sx(*value),
            sy(k as f64 / n),
            sx(*value),
            sy((k + 1) as f64 / n)
        );
    }
    let _ = write!(points, " {:.1},{:.1}", sx(hi), sy(1.0));
    points
}

/// One CDF panel at `(ox, oy)`.
fn panel(
    svg: &mut String,
    ox: f64,
    oy: f64,
    metric: &str,
    by_label: &BTreeMap<String, Vec<f64>>,
    labels: &[String],
) {
    let all = by_label.values().flatten().copied();
    let (mut lo, mut hi) = all.fold((f64::INFINITY, f64::NEG_INFINITY), |(a, b), v| {
        (a.min(v), b.max(v))
    });
    lo = lo.min(0.0);
    if hi <= lo {
        hi = lo + 1.0;
    }
    // Room on the right so the last step is not hidden in the frame.
    hi += (hi - lo) * 0.04;
    let (x0, y0) = (ox + MARGIN_L, oy + MARGIN_T);
    let (w, h) = (PANEL_W - MARGIN_L - MARGIN_R, PANEL_H - MARGIN_T - MARGIN_B);
    let sx = |v: f64| x0 + (v - lo) / (hi - lo) * w;
    let sy = |f: f64| y0 + h - f * h;
    let counts: Vec<String> = labels
        .iter()
        .filter_map(|l| by_label.get(l).map(|v| format!("{l} n={}", v.len())))
        .collect();
    let _ = writeln!(
        svg,
        r#"<text x="{}" y="{}" font-size="12" font-weight="bold">{} (CDF; {})</text>"#,
        x0,
        oy + 20.0,
        escape(metric),
        escape(&counts.join(", "))
    );
    let _ = writeln!(
        svg,
        r##"<rect x="{x0}" y="{y0}" width="{w}" height="{h}" fill="none" stroke="#888"/>"##
    );
    for t in ticks(lo, hi) {
        let x = sx(t);
        let label_at = (x, y0 + h + 14.0);
        grid_line(
            svg,
            (x, y0),
            (x, y0 + h),
            &tick_label(t),
            label_at,
            "middle",
        );
    }
    fraction_grid(svg, x0, w, sy);
    let _ = writeln!(
        svg,
        r#"<text x="{}" y="{}" text-anchor="middle">seconds</text>"#,
        x0 + w / 2.0,
        y0 + h + 32.0
    );
    let _ = writeln!(
        svg,
        r#"<text x="{x}" y="{y}" text-anchor="middle" transform="rotate(-90 {x} {y})">fraction ≤ x</text>"#,
        x = ox + 14.0,
        y = y0 + h / 2.0
    );
    for (i, label) in labels.iter().enumerate() {
        let Some(values) = by_label.get(label).filter(|v| !v.is_empty()) else {
            continue;
        };
        let points = cdf_points(values, sx, sy, (lo, hi));
        let _ = writeln!(
            svg,
            r#"<polyline points="{points}" fill="none" stroke="{}" stroke-width="1.8"/>"#,
            COLOURS[i % COLOURS.len()]
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ticks_are_round() {
        assert_eq!(ticks(0.0, 10.0), vec![0.0, 2.0, 4.0, 6.0, 8.0, 10.0]);
        assert_eq!(tick_label(0.25), "0.25");
        assert_eq!(tick_label(2.0), "2");
    }

    #[test]
    fn renders_one_panel_per_metric_present() {
        let mut a = Dists::new();
        a.insert(PROBE_LATENESS.into(), vec![0.1, 0.2, 0.3]);
        let mut b = Dists::new();
        b.insert(PROBE_LATENESS.into(), vec![0.5, 1.0]);
        b.insert(SCALE_DOWN.into(), Vec::new());
        let svg = render("t <1>", &[("ours".into(), &a), ("ref".into(), &b)]).unwrap_or_default();
        assert!(svg.starts_with("<svg"));
        assert_eq!(svg.matches("<polyline").count(), 2);
        assert!(svg.contains("t &lt;1&gt;"));
        assert!(render("x", &[("a".into(), &Dists::new())]).is_none());
    }
}
