//! The HTML report: one self-contained file (inline CSS and SVG, no script, nothing fetched)
//! with a chart per shoot — the expired-lease fraction against the threshold, and each
//! controller's replicas, with the story's steps and the watchdog's decisions marked — and
//! the whole timeline as a table.

use std::fmt::Write as _;
use std::sync::Arc;

use crate::config::SandboxConfig;
use crate::journal::{Marker, MarkerKind, Record, ZoneSamples, time_column};
use crate::svg::{self, escape};

/// What the report says besides the recorded data.
pub(crate) struct ReportMeta {
    /// `Ok(summary)` when the run did what it should, `Err(what went wrong)` otherwise.
    pub outcome: Result<String, String>,
    /// Mode (`story` or `interactive`).
    pub mode: &'static str,
    /// `(short name, namespace, nodes)` per shoot.
    pub shoots: Vec<(String, String, usize)>,
    /// The configurations the watchdog ran.
    pub config: Arc<SandboxConfig>,
    /// How long setup took before the timeline's clock started.
    pub setup_seconds: Option<f64>,
    /// Log files worth a look.
    pub logs: Vec<String>,
    /// Whether the log files outlive the sandbox (`--keep`, or after a failure).
    pub logs_kept: bool,
    /// When the run started (local time, for the header).
    pub started: String,
}

const CONTROLLER_COLORS: [&str; 3] = ["#1f77b4", "#ff7f0e", "#2ca02c"];
/// Pixel offsets so controllers at the same replicas stay distinguishable.
const CONTROLLER_OFFSETS: [f64; 3] = [0.0, -3.5, 3.5];

fn marker_color(kind: MarkerKind) -> &'static str {
    match kind {
        MarkerKind::Step => "#555",
        MarkerKind::ScaleDown => "#d62728",
        MarkerKind::ScaleUp => "#2ca02c",
        MarkerKind::Weeder => "#9467bd",
    }
}

/// Geometry of one chart.
struct Frame {
    t0: f64,
    t1: f64,
    left: f64,
    width: f64,
}

impl Frame {
    /// The frame of a chart `width` wide showing `range`.
    fn new(range: (f64, f64), width: f64) -> Frame {
        Frame {
            t0: range.0,
            t1: range.1,
            left: 64.0,
            width: width - 64.0 - 24.0,
        }
    }

    fn x(&self, t: f64) -> f64 {
        let span = (self.t1 - self.t0).max(1.0);
        self.left + (t.clamp(self.t0, self.t1) - self.t0) / span * self.width
    }
}

/// Intervals `[from, to)` during which `active` holds, from change samples.
fn intervals<T: Copy>(
    samples: &[(f64, T)],
    end: f64,
    active: impl Fn(T) -> bool,
) -> Vec<(f64, f64, T)> {
    let mut out = Vec::new();
    for (i, (t, v)) in samples.iter().enumerate() {
        if active(*v) {
            let to = samples.get(i + 1).map_or(end, |(next, _)| *next);
            out.push((*t, to, *v));
        }
    }
    out
}

/// Markers for one shoot, without near-duplicates (two pods deleted at once → one line).
fn markers_for<'a>(record: &'a Record, shoot: &str) -> Vec<&'a Marker> {
    let mut out: Vec<&Marker> = Vec::new();
    for m in &record.markers {
        if m.shoot.as_deref().is_some_and(|s| s != shoot) {
            continue;
        }
        let duplicate = out
            .iter()
            .any(|o| o.kind == m.kind && o.label == m.label && (o.t - m.t).abs() < 1.5);
        if !duplicate {
            out.push(m);
        }
    }
    out
}

/// Grid lines with their labels at the fractions 0, 0.5 and 1 of a fraction panel (`y`
/// maps a fraction to its height).
fn fraction_grid(s: &mut String, frame: &Frame, y: impl Fn(f64) -> f64) {
    for f in [0.0, 0.5, 1.0] {
        let _ = write!(
            s,
            r##"<line x1="{:.1}" x2="{:.1}" y1="{yy:.1}" y2="{yy:.1}" stroke="#ddd"/><text x="{:.1}" y="{:.1}" text-anchor="end" fill="#555">{f:.1}</text>"##,
            frame.left,
            frame.left + frame.width,
            frame.left - 6.0,
            y(f) + 4.0,
            yy = y(f)
        );
    }
}

/// The red dashed line of a threshold at height `y`, labelled `label` and its value;
/// `attrs` (empty or ending in a space) go first into the line's element.
fn threshold_line(s: &mut String, frame: &Frame, y: f64, attrs: &str, label: &str, threshold: f64) {
    let _ = write!(
        s,
        r##"<line {attrs}x1="{:.1}" x2="{:.1}" y1="{y:.1}" y2="{y:.1}" stroke="#d62728" stroke-dasharray="6 4" stroke-width="1.5"/><text x="{:.1}" y="{:.1}" text-anchor="end" fill="#d62728">{label} {threshold:.2}</text>"##,
        frame.left,
        frame.left + frame.width,
        frame.left + frame.width - 4.0,
        y - 5.0,
    );
}

/// The time axis at height `axis_y`, ticked every 5, 10 or 20 s depending on the span.
fn time_axis(s: &mut String, frame: &Frame, axis_y: f64) {
    let range = (frame.t0, frame.t1);
    let span = range.1 - range.0;
    let step = if span > 120.0 {
        20.0
    } else if span > 40.0 {
        10.0
    } else {
        5.0
    };
    let _ = write!(
        s,
        r##"<line x1="{:.1}" x2="{:.1}" y1="{axis_y:.1}" y2="{axis_y:.1}" stroke="#333"/>"##,
        frame.left,
        frame.left + frame.width
    );
    let mut t = (range.0 / step).ceil() * step;
    while t <= range.1 {
        let x = frame.x(t);
        let _ = write!(
            s,
            r##"<line x1="{x:.1}" x2="{x:.1}" y1="{axis_y:.1}" y2="{:.1}" stroke="#333"/><text x="{x:.1}" y="{:.1}" text-anchor="middle" fill="#333">{t:.0}s</text>"##,
            axis_y + 4.0,
            axis_y + 16.0
        );
        t += step;
    }
}

/// One legend entry at `(lx, ly)`: a line in `color` (dashed if `dashed`) and `text`;
/// moves `lx` past it.
fn legend_entry(s: &mut String, lx: &mut f64, ly: f64, color: &str, text: &str, dashed: bool) {
    let dash = if dashed {
        r#" stroke-dasharray="6 4""#
    } else {
        ""
    };
    let _ = write!(
        s,
        r##"<line x1="{:.1}" x2="{:.1}" y1="{:.1}" y2="{:.1}" stroke="{color}" stroke-width="2.5"{dash}/><text x="{:.1}" y="{ly:.1}">{}</text>"##,
        *lx,
        *lx + 22.0,
        ly - 4.0,
        ly - 4.0,
        *lx + 27.0,
        escape(text)
    );
    *lx += 34.0 + text.chars().count() as f64 * 6.2;
}

/// Vertical geometry of a shoot's chart: the title, the rows of marker labels, panel A (the
/// expired-lease fraction) and panel B (replicas), then the time axis and the legend.
#[derive(Clone, Copy)]
struct ChartLayout {
    title_h: f64,
    row_h: f64,
    a_top: f64,
    a_h: f64,
    b_top: f64,
    b_h: f64,
    axis_y: f64,
    height: f64,
}

impl ChartLayout {
    /// The layout of a chart with `label_rows` rows of marker labels.
    fn new(label_rows: usize) -> ChartLayout {
        let title_h = 26.0;
        let row_h = 14.0;
        let labels_h = label_rows as f64 * row_h + 6.0;
        let a_top = title_h + labels_h;
        let a_h = 150.0;
        let b_top = a_top + a_h + 34.0;
        let b_h = 130.0;
        let axis_y = b_top + b_h;
        ChartLayout {
            title_h,
            row_h,
            a_top,
            a_h,
            b_top,
            b_h,
            axis_y,
            height: axis_y + 76.0,
        }
    }
}

/// Marker labels in rows above the panels, each in the first row where it fits: each marker
/// with its x and its row, and how many rows that takes.
fn place_marker_labels<'a>(
    markers: &[&'a Marker],
    frame: &Frame,
) -> (Vec<(&'a Marker, f64, usize)>, usize) {
    let mut rows: Vec<f64> = Vec::new();
    let mut placed = Vec::new();
    for m in markers.iter().copied() {
        let x = frame.x(m.t);
        let w = m.label.chars().count() as f64 * 6.4 + 6.0;
        let row = match rows.iter().position(|end| x > *end + 4.0) {
            Some(r) => r,
            None => {
                rows.push(f64::NEG_INFINITY);
                rows.len() - 1
            }
        };
        rows[row] = x + w;
        placed.push((m, x, row));
    }
    (placed, rows.len())
}

/// The backgrounds of both panels: silenced kubelets and etcd outages.
fn chart_backgrounds(
    record: &Record,
    shoot: &str,
    nodes: usize,
    frame: &Frame,
    layout: ChartLayout,
) -> String {
    let ChartLayout { a_top, axis_y, .. } = layout;
    let mut s = String::new();
    let silenced = record.silenced.get(shoot).cloned().unwrap_or_default();
    for (from, to, n) in intervals(&silenced, frame.t1, |n| n > 0) {
        let (x0, x1) = (frame.x(from), frame.x(to));
        let _ = write!(
            s,
            r##"<rect x="{x0:.1}" y="{a_top:.1}" width="{:.1}" height="{:.1}" fill="#ffe9cc"/><text x="{:.1}" y="{:.1}" fill="#a65c00">{n}/{nodes} kubelets silenced</text>"##,
            (x1 - x0).max(1.0),
            axis_y - a_top,
            x0 + 4.0,
            a_top + 12.0
        );
    }
    let etcd = record.etcd_ready.get(shoot).cloned().unwrap_or_default();
    for (from, to, _) in intervals(&etcd, frame.t1, |ready| !ready) {
        let (x0, x1) = (frame.x(from), frame.x(to));
        let _ = write!(
            s,
            r##"<rect x="{x0:.1}" y="{a_top:.1}" width="{:.1}" height="{:.1}" fill="#eadff5"/><text x="{:.1}" y="{:.1}" fill="#5b3a8c">etcd down</text>"##,
            (x1 - x0).max(1.0),
            axis_y - a_top,
            x0 + 4.0,
            a_top + 12.0
        );
    }
    s
}

/// Panel A: the expired-lease fraction the prober found and the one the leases say, against
/// the threshold.
fn fraction_panel(
    record: &Record,
    shoot: &str,
    threshold: f64,
    frame: &Frame,
    layout: ChartLayout,
) -> String {
    let ChartLayout { a_top, a_h, .. } = layout;
    let mut s = String::new();
    let ya = |f: f64| a_top + a_h - f.clamp(0.0, 1.0) * a_h;
    fraction_grid(&mut s, frame, ya);
    let _ = write!(
        s,
        r##"<text x="14" y="{:.1}" transform="rotate(-90 14 {:.1})" text-anchor="middle" fill="#333">expired leases</text>"##,
        a_top + a_h / 2.0,
        a_top + a_h / 2.0
    );
    threshold_line(&mut s, frame, ya(threshold), "", "threshold", threshold);
    let path_of = |samples: &[(f64, Option<f64>)]| step_path(frame, ya, samples);
    // What the leases say (the sandbox reads them), then what the prober found in its runs:
    // the gap between the two is the prober's reaction time.
    let truth = path_of(record.lease_truth.get(shoot).map_or(&[][..], Vec::as_slice));
    if !truth.is_empty() {
        let _ = write!(
            s,
            r##"<path d="{truth}" fill="none" stroke="#888" stroke-width="1.5" stroke-dasharray="3 3"/>"##
        );
    }
    let seen = path_of(record.fraction.get(shoot).map_or(&[][..], Vec::as_slice));
    if !seen.is_empty() {
        let _ = write!(
            s,
            r##"<path d="{seen}" fill="none" stroke="#1f4e9c" stroke-width="2"/>"##
        );
    }
    s
}

/// Panel B: each controller's replicas.
fn replicas_panel(
    record: &Record,
    config: &SandboxConfig,
    shoot: &str,
    frame: &Frame,
    layout: ChartLayout,
) -> String {
    let ChartLayout { b_top, b_h, .. } = layout;
    let mut s = String::new();
    let max_replicas = record
        .replicas
        .get(shoot)
        .into_iter()
        .flat_map(|m| m.values())
        .flat_map(|v| v.iter().map(|(_, r)| *r))
        .max()
        .unwrap_or(2)
        .max(2);
    let top = f64::from(max_replicas) + 0.5;
    let yb = |r: f64| b_top + b_h - r / top * b_h;
    for r in 0..=max_replicas {
        let y = yb(f64::from(r));
        let _ = write!(
            s,
            r##"<line x1="{:.1}" x2="{:.1}" y1="{y:.1}" y2="{y:.1}" stroke="#ddd"/><text x="{:.1}" y="{:.1}" text-anchor="end" fill="#555">{r}</text>"##,
            frame.left,
            frame.left + frame.width,
            frame.left - 6.0,
            y + 4.0
        );
    }
    let _ = write!(
        s,
        r##"<text x="14" y="{:.1}" transform="rotate(-90 14 {:.1})" text-anchor="middle" fill="#333">replicas</text>"##,
        b_top + b_h / 2.0,
        b_top + b_h / 2.0
    );
    for (i, controller) in config.controllers.iter().enumerate() {
        let Some(changes) = record
            .replicas
            .get(shoot)
            .and_then(|m| m.get(&controller.name))
        else {
            continue;
        };
        let i = i % CONTROLLER_COLORS.len();
        let mut path = String::new();
        for (j, (t, r)) in changes.iter().enumerate() {
            let (x, y) = (frame.x(*t), yb(f64::from(*r)) + CONTROLLER_OFFSETS[i]);
            if j == 0 {
                let _ = write!(path, "M{x:.1} {y:.1}");
            } else {
                let _ = write!(path, " H{x:.1} V{y:.1}");
            }
        }
        let _ = write!(path, " H{:.1}", frame.x(frame.t1));
        let _ = write!(
            s,
            r##"<path d="{path}" fill="none" stroke="{}" stroke-width="2.5"/>"##,
            CONTROLLER_COLORS[i]
        );
    }
    s
}

/// The markers: vertical lines from their label row down to the time axis.
fn marker_lines(placed: &[(&Marker, f64, usize)], layout: ChartLayout) -> String {
    let ChartLayout {
        title_h,
        row_h,
        axis_y,
        ..
    } = layout;
    let mut s = String::new();
    for (m, x, row) in placed {
        let color = marker_color(m.kind);
        let label_y = title_h + (*row as f64 + 1.0) * row_h;
        let dash = if m.kind == MarkerKind::Step {
            r#" stroke-dasharray="4 3""#
        } else {
            ""
        };
        let _ = write!(
            s,
            r##"<line x1="{x:.1}" x2="{x:.1}" y1="{:.1}" y2="{axis_y:.1}" stroke="{color}" stroke-width="1.2"{dash}/><text x="{:.1}" y="{label_y:.1}" fill="{color}">{}</text>"##,
            label_y - 10.0,
            x + 2.0,
            escape(&m.label)
        );
    }
    s
}

/// The legend below the time axis: the fraction lines, then the controllers on a line of
/// their own.
fn chart_legend(config: &SandboxConfig, frame: &Frame, layout: ChartLayout) -> String {
    let mut s = String::new();
    let ly = layout.axis_y + 36.0;
    let mut lx = frame.left;
    let mut legend = |s: &mut String, color: &str, text: &str, dashed: bool| {
        legend_entry(s, &mut lx, ly, color, text, dashed);
    };
    legend(
        &mut s,
        "#1f4e9c",
        "expired fraction the prober found",
        false,
    );
    legend(&mut s, "#888", "expired fraction of the leases now", true);
    legend(&mut s, "#d62728", "threshold", true);
    // Controllers on a second line: one line does not hold them all.
    let ly = ly + 17.0;
    let mut lx = frame.left;
    for (i, c) in config.controllers.iter().enumerate() {
        legend_entry(
            &mut s,
            &mut lx,
            ly,
            CONTROLLER_COLORS[i % CONTROLLER_COLORS.len()],
            &format!(
                "{} {} ({}down {}, up {})",
                c.short,
                c.name,
                if c.optional { "optional; " } else { "" },
                c.down,
                c.up
            ),
            false,
        );
    }
    let _ = write!(
        s,
        r##"<text x="{:.1}" y="{:.1}" fill="#555">vertical lines: story steps (grey), prober decisions (red: scale down, green: scale up), weeder deletions (purple)</text>"##,
        frame.left,
        ly + 16.0
    );
    s
}

/// The chart of one shoot as an inline SVG.
fn chart(
    record: &Record,
    config: &SandboxConfig,
    shoot: &str,
    namespace: &str,
    nodes: usize,
    range: (f64, f64),
) -> String {
    let width = 1100.0;
    let frame = Frame::new(range, width);
    let markers = markers_for(record, shoot);
    let (placed, label_rows) = place_marker_labels(&markers, &frame);
    let layout = ChartLayout::new(label_rows);
    let mut s = svg::open(width, layout.height);
    let _ = write!(
        s,
        r##"<text x="4" y="17" font-size="15" font-weight="bold">{}</text><text x="{:.0}" y="17" fill="#555">{} · {nodes} nodes</text>"##,
        escape(shoot),
        12.0 + shoot.len() as f64 * 9.0,
        escape(namespace)
    );
    s.push_str(&chart_backgrounds(record, shoot, nodes, &frame, layout));
    s.push_str(&fraction_panel(
        record,
        shoot,
        config.threshold(),
        &frame,
        layout,
    ));
    s.push_str(&replicas_panel(record, config, shoot, &frame, layout));
    s.push_str(&marker_lines(&placed, layout));
    time_axis(&mut s, &frame, layout.axis_y);
    s.push_str(&chart_legend(config, &frame, layout));
    s.push_str("</svg>");
    s
}

const ZONE_COLORS: [&str; 6] = [
    "#1f4e9c", "#e377c2", "#17becf", "#8c564b", "#bcbd22", "#7f7f7f",
];

/// `M x y H x V y …` of a step line through `(t, value)` samples; gaps where `None`.
fn step_path(frame: &Frame, y: impl Fn(f64) -> f64, samples: &[(f64, Option<f64>)]) -> String {
    let mut path = String::new();
    let mut pen_down = false;
    for (t, f) in samples {
        match f {
            Some(f) => {
                let (px, py) = (frame.x(*t), y(*f));
                if pen_down {
                    let _ = write!(path, " H{px:.1} V{py:.1}");
                } else {
                    let _ = write!(path, " M{px:.1} {py:.1}");
                    pen_down = true;
                }
            }
            None => pen_down = false,
        }
    }
    path
}

/// Each zone's step lines in its colour: dotted, the fraction its leases say; solid, the
/// fraction the prober reported (`y` maps a fraction to its height).
fn zone_paths(
    frame: &Frame,
    y: impl Fn(f64) -> f64,
    zones: &[&String],
    truth: Option<&ZoneSamples>,
    reported: Option<&ZoneSamples>,
) -> String {
    let mut s = String::new();
    for (i, zone) in zones.iter().enumerate() {
        let color = ZONE_COLORS[i % ZONE_COLORS.len()];
        // Zones at the same fraction stay distinguishable.
        let offset = i as f64 * 2.5;
        let shifted = |f: f64| y(f) - offset;
        if let Some(samples) = truth.and_then(|m| m.get(*zone)) {
            let d = step_path(frame, shifted, samples);
            if !d.is_empty() {
                let _ = write!(
                    s,
                    r##"<path d="{d}" fill="none" stroke="{color}" stroke-width="1.2" stroke-dasharray="3 3" opacity="0.7"/>"##
                );
            }
        }
        if let Some(samples) = reported.and_then(|m| m.get(*zone)) {
            let d = step_path(frame, shifted, samples);
            if !d.is_empty() {
                let _ = write!(
                    s,
                    r##"<path class="zone-fraction" data-zone="{}" d="{d}" fill="none" stroke="{color}" stroke-width="2"/>"##,
                    escape(zone)
                );
            }
        }
    }
    s
}

/// The per-zone chart of a shoot whose nodes are in zones: each zone's expired-lease fraction
/// as the prober reported it (`dwd_prober_zone_expired_lease_fraction`; dotted: from the
/// leases themselves) against `zoneLeaseFailureFraction`; `None` for a shoot without zones.
fn zone_chart(
    record: &Record,
    config: &SandboxConfig,
    shoot: &str,
    range: (f64, f64),
) -> Option<String> {
    let reported = record.zone_fraction.get(shoot);
    let truth = record.zone_truth.get(shoot);
    let mut zones: Vec<&String> = reported
        .into_iter()
        .flat_map(|m| m.keys())
        .chain(truth.into_iter().flat_map(|m| m.keys()))
        .collect();
    zones.sort();
    zones.dedup();
    if zones.is_empty() {
        return None;
    }
    let threshold = config.zone_threshold();
    let width = 1100.0;
    let frame = Frame::new(range, width);
    let top = 46.0;
    let h = 130.0;
    let axis_y = top + h;
    let height = axis_y + 58.0;
    let y = |f: f64| top + h - f.clamp(0.0, 1.0) * h;
    let mut s = svg::open(width, height);
    let _ = write!(
        s,
        r##"<text x="4" y="17" font-size="15" font-weight="bold">{} · zones</text><text x="4" y="32" fill="#555">expired-lease fraction per zone (node label topology.kubernetes.io/zone) against zoneLeaseFailureFraction {threshold:.2}; zonal scale-down {}</text>"##,
        escape(shoot),
        escape(&config.zonal_flow_text())
    );
    fraction_grid(&mut s, &frame, y);
    threshold_line(
        &mut s,
        &frame,
        y(threshold),
        r#"class="zone-threshold" "#,
        "zone threshold",
        threshold,
    );
    for m in markers_for(record, shoot) {
        let x = frame.x(m.t);
        let dash = if m.kind == MarkerKind::Step {
            r#" stroke-dasharray="4 3""#
        } else {
            ""
        };
        let _ = write!(
            s,
            r##"<line x1="{x:.1}" x2="{x:.1}" y1="{:.1}" y2="{axis_y:.1}" stroke="{}" stroke-width="1"{dash} opacity="0.6"/>"##,
            top - 8.0,
            marker_color(m.kind)
        );
    }
    s.push_str(&zone_paths(&frame, y, &zones, truth, reported));
    time_axis(&mut s, &frame, axis_y);
    let ly = axis_y + 38.0;
    let mut lx = frame.left;
    for (i, zone) in zones.iter().enumerate() {
        legend_entry(
            &mut s,
            &mut lx,
            ly,
            ZONE_COLORS[i % ZONE_COLORS.len()],
            &format!("zone {zone}"),
            false,
        );
    }
    let _ = write!(
        s,
        r##"<text x="{lx:.1}" y="{ly:.1}" fill="#555">solid: what the prober found; dotted: the zone's leases now; red dashed: zoneLeaseFailureFraction</text>"##
    );
    s.push_str("</svg>");
    Some(s)
}

/// The time range the charts show: from a little before the first probe result (setup is
/// empty air) to the last thing recorded.
fn chart_range(record: &Record) -> (f64, f64) {
    let first = record
        .fraction
        .values()
        .flat_map(|v| v.iter().filter(|(_, f)| f.is_some()).map(|(t, _)| *t))
        .fold(f64::INFINITY, f64::min);
    let last = record
        .entries
        .iter()
        .filter(|e| !e.setup)
        .map(|e| e.t)
        .chain(
            record
                .fraction
                .values()
                .flat_map(|v| v.iter().map(|(t, _)| *t)),
        )
        .fold(0.0, f64::max);
    let start = if first.is_finite() {
        (first - 2.0).max(0.0)
    } else {
        0.0
    };
    (start, last.max(start + 1.0))
}

/// The page's head and style, the run's title line, the configuration summary and the outcome.
fn write_header(h: &mut String, meta: &ReportMeta) {
    h.push_str(r#"<!DOCTYPE html><html lang="en"><head><meta charset="utf-8"><title>dependency-watchdog sandbox report</title><style>
body{font-family:sans-serif;margin:24px;color:#222;max-width:1160px}
h1{font-size:22px;margin-bottom:4px}h2{font-size:17px;margin-top:28px}
.ok{color:#1a7f37;font-weight:bold}.fail{color:#c62828;font-weight:bold}
.meta{color:#555}ul.config{color:#333;font-size:14px;padding-left:20px}table{border-collapse:collapse;width:100%;font-size:13px}
td,th{border-bottom:1px solid #eee;padding:3px 8px;text-align:left;vertical-align:top}
td.t{text-align:right;white-space:nowrap;font-variant-numeric:tabular-nums}
tr.step td{background:#f3f3f3;font-weight:bold}td.why{color:#555}
pre{background:#f7f7f7;padding:8px;font-size:12px;overflow:auto}
.chart{border:1px solid #e5e5e5;margin:8px 0 4px 0;padding:6px}
</style></head><body>"#);
    let _ = write!(
        h,
        "<h1>dependency-watchdog sandbox</h1><div class=\"meta\">{} run started {} · the real <code>dependency-watchdog prober</code> and <code>weeder</code> against a real seed and three shoot kube-apiservers with a simulated data plane",
        meta.mode,
        escape(&meta.started)
    );
    if let Some(setup) = meta.setup_seconds {
        let _ = write!(
            h,
            " · times count from the watchdog's start (t = 0 s), after {setup:.1} s of setup"
        );
    }
    h.push_str("</div>");
    let _ = write!(h, "<ul class=\"config\">");
    for line in meta.config.summary_lines() {
        let _ = write!(h, "<li>{}</li>", escape(&line));
    }
    h.push_str("</ul>");
    match &meta.outcome {
        Ok(summary) => {
            let _ = write!(h, "<p class=\"ok\">✔ {}</p>", escape(summary));
        }
        Err(error) => {
            let _ = write!(
                h,
                "<p class=\"fail\">✘ failed</p><pre>{}</pre>",
                escape(error)
            );
        }
    }
}

/// The shoots' section: what the charts show, then each shoot's chart (and zone chart).
fn write_shoots(h: &mut String, record: &Record, meta: &ReportMeta) {
    let config = &meta.config;
    let range = chart_range(record);
    let _ = write!(
        h,
        "<h2>Shoots</h2><p>Top: the fraction of the shoot's node leases the prober found expired in its probe runs (from its <code>/metrics</code>; dotted: the fraction expired according to the leases themselves, read by the sandbox; a lease counts as expired {}&nbsp;s after its last renewal, 0.75 × <code>kcmNodeMonitorGraceDuration</code>), against the threshold (<code>nodeLeaseFailureFraction</code> {:.2}): at or above it the prober scales the controllers down level by level ({}), below it restores them ({}). Bottom: each controller's <code>spec.replicas</code>. Shaded: silenced kubelets (orange), etcd down (purple). A shoot whose nodes are in zones has a second chart: each zone's expired fraction the prober found (<code>dwd_prober_zone_expired_lease_fraction</code>) against <code>zoneLeaseFailureFraction</code> {:.2}: a zone at or above it is disrupted, and with the whole shoot below its threshold the zonal protection scales down only {}. The prober reports zones once it lists the nodes, after a first lease expired; before that only the dotted lines (the zones' leases, read by the sandbox) show.</p>",
        config.lease_validity_seconds(),
        config.threshold(),
        escape(&config.flow_text(true)),
        escape(&config.flow_text(false)),
        config.zone_threshold(),
        escape(&config.zonal_flow_text())
    );
    for (name, namespace, nodes) in &meta.shoots {
        let _ = write!(
            h,
            "<div class=\"chart\">{}</div>",
            chart(record, config, name, namespace, *nodes, range)
        );
        if let Some(zones) = zone_chart(record, config, name, range) {
            let _ = write!(h, "<div class=\"chart zones\">{zones}</div>");
        }
    }
}

/// The timeline as a table, story steps in bold.
fn write_timeline(h: &mut String, record: &Record) {
    h.push_str("<h2>Timeline</h2><table><tr><th>time</th><th>shoot</th><th>what happened</th><th>why</th></tr>");
    for e in &record.entries {
        let class = if e.what.starts_with("──") {
            " class=\"step\""
        } else {
            ""
        };
        let _ = write!(
            h,
            "<tr{class}><td class=\"t\">{}</td><td>{}</td><td>{}</td><td class=\"why\">{}</td></tr>",
            escape(time_column(e).trim()),
            escape(&e.shoot),
            escape(e.what.trim_start_matches("── ")),
            escape(e.why.as_deref().unwrap_or(""))
        );
    }
    h.push_str("</table>");
}

/// The configuration the watchdog ran (Gardener's, what was shortened, what was added) and the
/// log files.
fn write_configuration_and_logs(h: &mut String, meta: &ReportMeta) {
    let config = &meta.config;
    let _ = write!(
        h,
        "<h2>Configuration</h2><p>Gardener's, as gardenlet generates it, with only these intervals shortened (Gardener's value → the sandbox's): {}.</p><p>Added on top, ours (Gardener's config has no zonal fields): zonal protection, {}; zoneLeaseFailureFraction {:.2} and minCandidatesPerZone {} are their defaults.</p><details><summary>prober (<code>--config-file</code>)</summary><pre>{}</pre></details><details><summary>weeder (<code>--config-file</code>)</summary><pre>{}</pre></details>",
        escape(&crate::gardener::changes_text(&config.changes())),
        escape(&crate::gardener::changes_text(config.additions())),
        config.zone_threshold(),
        config.min_candidates_per_zone(),
        escape(&config.prober.yaml),
        escape(&config.weeder.yaml)
    );
    if !meta.logs.is_empty() {
        h.push_str(if meta.logs_kept {
            "<h2>Logs</h2><ul>"
        } else {
            "<h2>Logs</h2><p>Removed when the sandbox exits; run it with <code>--keep</code> to keep them.</p><ul>"
        });
        for l in &meta.logs {
            let _ = write!(h, "<li><code>{}</code></li>", escape(l));
        }
        h.push_str("</ul>");
    }
}

/// Renders the whole report: the journal's `record`, the prober's `decisions` (from its log).
pub(crate) fn render(
    record: &Record,
    decisions: &[dwd_core::record::DecisionRecord],
    meta: &ReportMeta,
) -> String {
    let mut h = String::new();
    write_header(&mut h, meta);
    write_shoots(&mut h, record, meta);
    write_timeline(&mut h, record);
    h.push_str(&crate::decisions::html(decisions, &meta.shoots));
    write_configuration_and_logs(&mut h, meta);
    h.push_str("</body></html>\n");
    h
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::journal::Entry;

    /// A flow's record whose target name needs escaping.
    fn decision_with_an_odd_name() -> dwd_core::record::DecisionRecord {
        use dwd_core::record::*;
        DecisionRecord {
            schema: SCHEMA.into(),
            id: "shoot--sandbox--alpha/1.0".into(),
            namespace: "shoot--sandbox--alpha".into(),
            at: "2026-11-29T03:12:00.000Z".into(),
            mode: Mode::Acting,
            recorded_because: vec![Because::FlowOutcome],
            body: RecordBody::Flow(FlowRecord {
                decision: "shoot--sandbox--alpha/0.9".into(),
                flow: FlowName::of(dwd_core::Direction::Down, dwd_core::scaling::FlowScope::All),
                outcome: FlowOutcome::Finished,
                started_at: "2026-11-29T03:12:00.000Z".into(),
                failure: None,
                writes: vec![WriteRecord {
                    target: "kcm<x>".into(),
                    level: 0,
                    outcome: WriteOutcome::Scaled,
                    from: Some(2),
                    to: Some(0),
                    recorded_replicas: Some(2),
                    why: None,
                    at: "2026-11-29T03:12:01.000Z".into(),
                    budget_wait_seconds: 0.0,
                }],
            }),
        }
    }

    #[test]
    fn the_decisions_section_lists_each_record_with_its_names_escaped() {
        let shoots = vec![("alpha".into(), "shoot--sandbox--alpha".into(), 5)];
        let html = crate::decisions::html(&[decision_with_an_odd_name()], &shoots);
        assert!(html.contains("<h2>Decisions</h2>"));
        assert!(html.contains("<td>alpha</td>"), "{html}");
        assert!(html.contains("kcm&lt;x&gt; 2→0"), "{html}");
    }

    #[test]
    fn report_is_self_contained_and_escaped() {
        let mut record = Record::default();
        record.fraction.insert(
            "alpha".into(),
            vec![(1.0, Some(0.0)), (2.0, None), (3.0, Some(0.8))],
        );
        record.replicas.insert(
            "alpha".into(),
            [(
                "kube-controller-manager".to_string(),
                vec![(1.0, 2), (3.5, 0)],
            )]
            .into_iter()
            .collect(),
        );
        record
            .silenced
            .insert("alpha".into(), vec![(0.0, 0), (2.0, 4), (5.0, 0)]);
        record.zone_fraction.insert(
            "gamma".into(),
            [
                (
                    "eu-1a".to_string(),
                    vec![(1.0, Some(0.0)), (4.0, Some(1.0))],
                ),
                ("eu-1b".to_string(), vec![(1.0, Some(0.0))]),
            ]
            .into_iter()
            .collect(),
        );
        record.entries.push(Entry {
            t: 0.0,
            setup: true,
            shoot: "-".into(),
            what: "starting etcd".into(),
            why: None,
        });
        record.entries.push(Entry {
            t: 3.0,
            setup: false,
            shoot: "alpha".into(),
            what: "x < y & z".into(),
            why: None,
        });
        record.markers.push(Marker {
            t: 3.0,
            shoot: None,
            label: "2 NAT outage".into(),
            kind: MarkerKind::Step,
        });
        let meta = ReportMeta {
            outcome: Ok("fine".into()),
            mode: "story",
            shoots: vec![
                ("alpha".into(), "shoot--sandbox--alpha".into(), 5),
                ("gamma".into(), "shoot--sandbox--gamma".into(), 6),
            ],
            config: Arc::new(SandboxConfig::derive().expect("Gardener's config")),
            setup_seconds: Some(281.0),
            logs: vec![],
            logs_kept: false,
            started: "now".into(),
        };
        let html = render(&record, &[], &meta);
        assert!(html.contains("<svg"));
        assert!(html.contains("x &lt; y &amp; z"));
        assert!(html.contains("<td class=\"t\">setup</td>"));
        assert!(html.contains("after 281.0 s of setup"));
        assert!(html.contains("probeInterval 30s → 1s"));
        assert!(html.contains("MCM + CA (level 0) → KCM (level 1)"));
        assert!(html.contains("4/5 kubelets silenced"));
        // gamma's zones get their own chart with the zone threshold; alpha (no zones) none.
        assert_eq!(html.matches("class=\"chart zones\"").count(), 1);
        assert!(html.contains("zone threshold 0.60"));
        assert!(html.contains("data-zone=\"eu-1a\""));
        assert!(html.contains("zone eu-1b"));
        assert!(html.contains("cluster-autoscaler scaleDownOnZoneOutage false (default) → true"));
        assert!(!html.contains("<script"));
        assert!(!html.contains("http://") || html.contains("http://www.w3.org/2000/svg"));
    }

    #[test]
    fn intervals_follow_changes() {
        let s = [(0.0, 0usize), (2.0, 4), (5.0, 0), (7.0, 1)];
        let i = intervals(&s, 9.0, |n| n > 0);
        assert_eq!(i, vec![(2.0, 5.0, 4), (7.0, 9.0, 1)]);
    }
}
