//! Compare mode: the headline numbers of A's and B's runs, averaged per binary over the
//! rounds, and their ratios A ÷ B (below 1: A needs less / is faster). Ratios are of the
//! means (not means of per-round ratios), so one round with a near-zero value can't dominate.

use serde_json::{Value, json};

use crate::Subject;

/// How a metric is printed.
#[derive(Clone, Copy)]
enum Unit {
    Bytes,
    Seconds,
    Count,
    Number,
}

/// The compared metrics: key in `ratios`, row title, JSON pointer into a run's result.
const METRICS: [(&str, &str, &str, Unit); 36] = [
    (
        "steady_rss",
        "steady RSS (median)",
        "/process/steady_rss_bytes",
        Unit::Bytes,
    ),
    (
        "peak_rss",
        "peak RSS (VmHWM)",
        "/process/peak_rss_bytes",
        Unit::Bytes,
    ),
    (
        "cpu_seconds_per_minute",
        "CPU s/min",
        "/process/cpu_seconds_per_minute",
        Unit::Number,
    ),
    (
        "shoot_requests_per_probe_run",
        "shoot requests / probe run",
        "/shoot_requests/per_probe_run",
        Unit::Number,
    ),
    (
        "shoot_response_bytes_per_probe_run",
        "shoot response bytes / probe run",
        "/response_bytes/shoot/watchdog_per_probe_run",
        Unit::Count,
    ),
    (
        "probe_lateness_p50",
        "probe lateness p50, s",
        "/probe_lateness_s/all_gaps/p50",
        Unit::Seconds,
    ),
    (
        "probe_lateness_p99",
        "probe lateness p99, s",
        "/probe_lateness_s/all_gaps/p99",
        Unit::Seconds,
    ),
    (
        "seed_requests_window",
        "seed requests (window)",
        "/seed_requests/total",
        Unit::Count,
    ),
    (
        "seed_requests_warmup",
        "seed requests (warm-up)",
        "/seed_requests/warmup_total",
        Unit::Count,
    ),
    (
        "seed_response_bytes_window",
        "seed response bytes (window)",
        "/response_bytes/seed/watchdog_total_bytes",
        Unit::Count,
    ),
    (
        "outage_seed_requests_affected_ns",
        "outage: seed requests in affected ns",
        "/outage/seed_requests_in_affected_namespaces/total",
        Unit::Count,
    ),
    (
        "scale_down_p50",
        "crossing → 0 p50, s",
        "/outage/scale_down_s/all/p50",
        Unit::Seconds,
    ),
    (
        "scale_down_p99",
        "crossing → 0 p99, s",
        "/outage/scale_down_s/all/p99",
        Unit::Seconds,
    ),
    (
        "restore_p50",
        "recovery → restored p50, s",
        "/outage/restore_s/all/p50",
        Unit::Seconds,
    ),
    (
        "restore_p99",
        "recovery → restored p99, s",
        "/outage/restore_s/all/p99",
        Unit::Seconds,
    ),
    (
        "storm_probe_lateness_p99",
        "storm: probe lateness p99, s",
        "/storm/probe_lateness_p99_s",
        Unit::Seconds,
    ),
    (
        "storm_probe_lateness_after_run_p99",
        "storm: probe lateness after the run p99, s",
        "/storm/probe_lateness_after_the_run_s/p99",
        Unit::Seconds,
    ),
    (
        "storm_restored_after_recovery_max",
        "storm: recovery → shoot restored max, s",
        "/storm/restored_after_recovery_s/max",
        Unit::Seconds,
    ),
    (
        "storm_shoots_over_restore_bound",
        "storm: shoots restored over the bound",
        "/storm/shoots_restored_over_bound",
        Unit::Count,
    ),
    (
        "storm_wasted_writes_could_know",
        "storm: scale-down writes after recovery (could know)",
        "/storm/wasted_scale_down_writes/after_the_watchdog_could_know",
        Unit::Count,
    ),
    (
        "storm_wasted_writes_before_knowing",
        "storm: scale-down writes after recovery (before knowing)",
        "/storm/wasted_scale_down_writes/before_the_watchdog_could_know",
        Unit::Count,
    ),
    (
        "storm_relapse_writes",
        "storm: scale-down writes after recovery to relapsed shoots",
        "/storm/relapse_scale_down_writes/count",
        Unit::Count,
    ),
    (
        "protection_scale_down_p50",
        "protection: crossing → shoot at 0 p50, s",
        "/outage/protection/scale_down/worst_target_per_shoot_s/p50",
        Unit::Seconds,
    ),
    (
        "protection_scale_down_p99",
        "protection: crossing → shoot at 0 p99, s",
        "/outage/protection/scale_down/worst_target_per_shoot_s/p99",
        Unit::Seconds,
    ),
    (
        "protection_scale_down_max",
        "protection: crossing → shoot at 0 max, s",
        "/outage/protection/scale_down/worst_target_per_shoot_s/max",
        Unit::Seconds,
    ),
    (
        "protection_scale_down_over_bound",
        "protection: shoots scaled down over the bound",
        "/outage/protection/scale_down/shoots_over_bound",
        Unit::Count,
    ),
    (
        "protection_restore_p99",
        "protection: recovery → shoot restored p99, s",
        "/outage/protection/restore/recovery_to_restored_s/p99",
        Unit::Seconds,
    ),
    (
        "protection_restore_max",
        "protection: recovery → shoot restored max, s",
        "/outage/protection/restore/recovery_to_restored_s/max",
        Unit::Seconds,
    ),
    (
        "protection_restore_over_bound",
        "protection: shoots restored over the bound",
        "/outage/protection/restore/shoots_over_bound",
        Unit::Count,
    ),
    (
        "level0_all_zero_s",
        "level 0 all at 0 after 1st crossing, s",
        "/outage/level0_all_zero_after_first_crossing_s",
        Unit::Seconds,
    ),
    (
        "weeder_deletion_p50",
        "weeder: ready → deleted p50, s",
        "/weeder/deletion_latency_s/p50",
        Unit::Seconds,
    ),
    (
        "weeder_deletion_p99",
        "weeder: ready → deleted p99, s",
        "/weeder/deletion_latency_s/p99",
        Unit::Seconds,
    ),
    (
        "weeder_deletion_max",
        "weeder: ready → deleted max, s",
        "/weeder/deletion_latency_s/max",
        Unit::Seconds,
    ),
    (
        "hostile_normal_max_gap",
        "hostile: normal shoots' max probe gap, s",
        "/hostile/normal/max_gap_s",
        Unit::Seconds,
    ),
    (
        "hostile_normal_missed_runs",
        "hostile: normal shoots' missed runs",
        "/hostile/normal/missed_runs",
        Unit::Count,
    ),
    (
        "weeder_deleted",
        "weeder: crash-looping pods deleted",
        "/weeder/crashlooping_deleted",
        Unit::Count,
    ),
];

/// Mean of `pointer` over the runs of `label` that have it.
fn mean(runs: &[Value], label: &str, pointer: &str) -> Option<f64> {
    let values: Vec<f64> = runs
        .iter()
        .filter(|r| r["label"].as_str() == Some(label))
        .filter_map(|r| r.pointer(pointer).and_then(Value::as_f64))
        .collect();
    (!values.is_empty()).then(|| values.iter().sum::<f64>() / values.len() as f64)
}

/// `{labels, means: {A: {...}, B: {...}}, ratios: {...}}` over the runs of both binaries.
pub(crate) fn summarise(subjects: &[Subject], runs: &[Value]) -> Value {
    let (a, b) = match subjects {
        [a, b, ..] => (a.label.as_str(), b.label.as_str()),
        _ => return Value::Null,
    };
    let mut means_a = serde_json::Map::new();
    let mut means_b = serde_json::Map::new();
    let mut ratios = serde_json::Map::new();
    for (key, _, pointer, _) in METRICS {
        let (ma, mb) = (mean(runs, a, pointer), mean(runs, b, pointer));
        if ma.is_none() && mb.is_none() {
            continue;
        }
        means_a.insert(key.into(), json!(ma));
        means_b.insert(key.into(), json!(mb));
        let ratio = match (ma, mb) {
            (Some(x), Some(y)) if y != 0.0 => json!(x / y),
            _ => Value::Null,
        };
        ratios.insert(key.into(), ratio);
    }
    json!({
        "labels": {"a": a, "b": b},
        "ratio": format!("{a} ÷ {b}, of the means over the rounds"),
        "means": {a: means_a, b: means_b},
        "ratios": ratios,
    })
}

fn format(v: Option<f64>, unit: Unit) -> String {
    match v {
        None => "-".into(),
        Some(v) => match unit {
            Unit::Bytes => format!("{:.1} MiB", v / (1024.0 * 1024.0)),
            Unit::Seconds => format!("{v:.3}"),
            Unit::Count => {
                if v.fract() == 0.0 {
                    format!("{v:.0}")
                } else {
                    format!("{v:.1}")
                }
            }
            Unit::Number => format!("{v:.2}"),
        },
    }
}

/// Side-by-side table: one row per metric measured, A's mean, B's mean, A ÷ B.
pub(crate) fn table(summary: &Value, runs: &[Value]) -> String {
    let a = summary["labels"]["a"].as_str().unwrap_or("A");
    let b = summary["labels"]["b"].as_str().unwrap_or("B");
    let rounds = runs
        .iter()
        .filter(|r| r["label"].as_str() == Some(a))
        .count();
    let first = runs.first().cloned().unwrap_or(Value::Null);
    let mut rows: Vec<[String; 4]> = vec![
        [
            "metric".into(),
            a.to_string(),
            b.to_string(),
            format!("{a} ÷ {b}"),
        ],
        [
            "scenario / shape".into(),
            crate::report::shape(&first),
            format!("rounds: {rounds}"),
            String::new(),
        ],
    ];
    for (key, title, pointer, unit) in METRICS {
        let Some(ratio) = summary["ratios"].get(key) else {
            continue;
        };
        let (ma, mb) = (mean(runs, a, pointer), mean(runs, b, pointer));
        rows.push([
            title.to_string(),
            format(ma, unit),
            format(mb, unit),
            ratio
                .as_f64()
                .map(|r| format!("{r:.3}"))
                .unwrap_or_else(|| "-".into()),
        ]);
    }
    // Yes/no outcomes that must hold for both: shown, not divided.
    for (title, pointer) in [
        ("outage: all scaled down / restored", "/outage"),
        ("weeder: all deleted / healthy kept", "/weeder"),
    ] {
        let cell = |label: &str| -> Option<String> {
            let per_run: Vec<String> = runs
                .iter()
                .filter(|r| r["label"].as_str() == Some(label))
                .filter_map(|r| r.pointer(pointer).filter(|v| v.is_object()))
                .map(|o| {
                    let (x, y) = if pointer == "/outage" {
                        (&o["all_scaled_down"], &o["all_restored"])
                    } else {
                        (&o["all_deleted"], &o["healthy_kept"])
                    };
                    format!("{x}/{y}")
                })
                .collect();
            (!per_run.is_empty()).then(|| per_run.join(", "))
        };
        if let (Some(x), Some(y)) = (cell(a), cell(b)) {
            rows.push([title.to_string(), x, y, String::new()]);
        }
    }
    let widths: Vec<usize> = (0..4)
        .map(|c| rows.iter().map(|r| r[c].chars().count()).max().unwrap_or(0))
        .collect();
    let mut out = String::new();
    for r in rows {
        out.push_str(&format!(
            "{:<w0$}  {:>w1$}  {:>w2$}  {:>w3$}\n",
            r[0],
            r[1],
            r[2],
            r[3],
            w0 = widths[0],
            w1 = widths[1],
            w2 = widths[2],
            w3 = widths[3]
        ));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ratios_are_of_means_and_skip_missing() {
        let subjects = [
            Subject {
                label: "ours".into(),
                bin: "a".into(),
            },
            Subject {
                label: "ref".into(),
                bin: "b".into(),
            },
        ];
        let run = |label: &str, rss: u64, cpu: f64| json!({"label": label, "process": {"steady_rss_bytes": rss, "cpu_seconds_per_minute": cpu}});
        let runs = [
            run("ours", 10, 1.0),
            run("ref", 100, 4.0),
            run("ours", 30, 1.0),
            run("ref", 100, 0.0),
        ];
        let s = summarise(&subjects, &runs);
        assert_eq!(s["ratios"]["steady_rss"], json!(0.2));
        assert_eq!(s["ratios"]["cpu_seconds_per_minute"], json!(0.5));
        assert!(s["ratios"].get("restore_p99").is_none());
        let t = table(&s, &runs);
        assert!(t.contains("ours ÷ ref"));
        assert!(t.contains("0.200"));
    }
}
