//! The summary table for people, rendered from the same JSON the machines get, so the two
//! can never disagree.

use serde_json::Value;

/// `p50 / p99 / max` of a summary object, or `-`.
fn cell(summary: &Value) -> String {
    match (
        summary["p50"].as_f64(),
        summary["p99"].as_f64(),
        summary["max"].as_f64(),
    ) {
        (Some(a), Some(b), Some(c)) => {
            format!("{a:.3} / {b:.3} / {c:.3}  (n={})", summary["count"])
        }
        _ => "-".into(),
    }
}

fn mib(v: &Value) -> String {
    v.as_u64()
        .map(|b| format!("{:.1} MiB", b as f64 / (1024.0 * 1024.0)))
        .unwrap_or_else(|| "-".into())
}

/// One row per entry of the JSON object `map`, its key after `prefix`.
pub(crate) fn counts(rows: &mut Vec<(String, String)>, prefix: &str, map: &Value) {
    if let Some(map) = map.as_object() {
        for (k, v) in map {
            rows.push((format!("{prefix}{k}"), v.to_string()));
        }
    }
}

/// What the run's config changed from Gardener's (`deploy/gardener/`), e.g.
/// `probeInterval 30s → 10s, initialDelay 30s (default) → 2s`.
fn gardener_changes(r: &Value) -> String {
    let config = &r["config"];
    let Some(c) = config
        .get("prober_config")
        .or_else(|| config.get("weeder_config"))
    else {
        return "-".into();
    };
    let changes: Vec<&str> = c["changed_from_gardener"]
        .as_array()
        .map(|a| a.iter().filter_map(Value::as_str).collect())
        .unwrap_or_default();
    if changes.is_empty() {
        "unchanged".into()
    } else {
        changes.join(", ")
    }
}

/// `rows` as two columns, the first as wide as its widest cell.
fn two_columns(rows: Vec<(String, String)>) -> String {
    let width = rows
        .iter()
        .map(|(k, _)| k.chars().count())
        .max()
        .unwrap_or(0);
    let mut out = String::new();
    for (k, v) in rows {
        out.push_str(&format!("{k:<width$}  {v}\n"));
    }
    out
}

/// Two-column table of the headline numbers.
pub(crate) fn table(r: &Value) -> String {
    let mut rows: Vec<(String, String)> = vec![
        (
            "binary".into(),
            r["label"].as_str().unwrap_or_default().to_string(),
        ),
        ("scenario / shape".into(), shape(r)),
        (
            "interval / qps / burst".into(),
            format!(
                "{} / {} / {}",
                num(&r["config"]["probe_interval_s"], |s| format!("{s}s")),
                r["config"]["kube_api_qps"],
                r["config"]["kube_api_burst"]
            ),
        ),
        ("config vs Gardener's".into(), gardener_changes(r)),
        (
            "setup (world, once)".into(),
            format!("{:.1}s", r["setup_s"].as_f64().unwrap_or(0.0)),
        ),
        (
            "measured window".into(),
            format!("{:.1}s", r["window"]["seconds"].as_f64().unwrap_or(0.0)),
        ),
        (
            "peak RSS (VmHWM)".into(),
            mib(&r["process"]["peak_rss_bytes"]),
        ),
        (
            "steady RSS (median)".into(),
            mib(&r["process"]["steady_rss_bytes"]),
        ),
        (
            "CPU s/min (window)".into(),
            format!(
                "{:.2}",
                r["process"]["cpu_seconds_per_minute"]
                    .as_f64()
                    .unwrap_or(0.0)
            ),
        ),
        (
            "seed requests (window)".into(),
            r["seed_requests"]["total"].to_string(),
        ),
    ];
    counts(&mut rows, "  seed/min ", &r["seed_requests"]["per_minute"]);
    rows.push((
        "seed requests during warm-up".into(),
        r["seed_requests"]["warmup_total"].to_string(),
    ));
    counts(
        &mut rows,
        "  warm-up ",
        &r["seed_requests"]["warmup_by_verb_resource"],
    );
    counts(
        &mut rows,
        "  seed failed HTTP ",
        &r["seed_requests"]["failures_by_code"],
    );
    rows.push((
        "seed response bytes (window, GET/LIST)".into(),
        bytes(&r["response_bytes"]["seed"]["watchdog_total_bytes"]),
    ));
    if r["shoot_requests"].is_object() {
        shoot_rows(&mut rows, r);
    }
    outage_rows(&mut rows, &r["outage"]);
    weeder_rows(&mut rows, &r["weeder"]);
    crate::hostile::rows(&mut rows, &r["hostile"]);
    two_columns(rows)
}

/// `scenario / N×M / K`, or `WeederStorm / n namespaces`.
pub(crate) fn shape(r: &Value) -> String {
    let scenario = r["scenario"].as_str().unwrap_or_default();
    if let Some(n) = r["shape"]["namespaces"].as_u64() {
        return format!("{scenario} / {n} namespaces");
    }
    format!(
        "{scenario} / N={} M={} K={}",
        r["shape"]["shoots"], r["shape"]["nodes_per_shoot"], r["shape"]["shoot_apiservers"]
    )
}

/// The number `v` as `write` writes it, `-` when there is none (not measured).
fn num(v: &Value, write: impl Fn(f64) -> String) -> String {
    v.as_f64().map(write).unwrap_or_else(|| "-".into())
}

/// A time in seconds to the millisecond, `-` when not measured.
fn seconds(v: &Value) -> String {
    num(v, |v| format!("{v:.3}"))
}

/// Bytes as a count with a unit that reads (`12.3 KiB`), or `-`.
fn bytes(v: &Value) -> String {
    match v.as_f64() {
        Some(b) if b >= 1024.0 * 1024.0 => format!("{:.2} MiB", b / (1024.0 * 1024.0)),
        Some(b) if b >= 1024.0 => format!("{:.1} KiB", b / 1024.0),
        Some(b) => format!("{b:.0} B"),
        None => "-".into(),
    }
}

/// The shoot-side rows of a prober run.
fn shoot_rows(rows: &mut Vec<(String, String)>, r: &Value) {
    rows.push((
        "shoot requests (window)".into(),
        r["shoot_requests"]["total"].to_string(),
    ));
    rows.push((
        "  probe runs (GET /version)".into(),
        r["shoot_requests"]["probe_runs"].to_string(),
    ));
    rows.push((
        "  shoot requests / probe run".into(),
        format!(
            "{:.2}",
            r["shoot_requests"]["per_probe_run"].as_f64().unwrap_or(0.0)
        ),
    ));
    counts(rows, "  shoot/min ", &r["shoot_requests"]["per_minute"]);
    counts(
        rows,
        "  shoot failed HTTP ",
        &r["shoot_requests"]["failures_by_code"],
    );
    let shoot_bytes = &r["response_bytes"]["shoot"];
    rows.push((
        "  shoot response bytes / probe run".into(),
        bytes(&shoot_bytes["watchdog_per_probe_run"]),
    ));
    if let Some(by) = shoot_bytes["watchdog_by_verb_resource"].as_object() {
        for (k, v) in by {
            rows.push((
                format!("    bytes {k}"),
                format!(
                    "{} ({})",
                    bytes(&v["bytes"]),
                    v["source"].as_str().unwrap_or_default()
                ),
            ));
        }
    }
    rows.push((
        "probe lateness s, all gaps (p50/p99/max)".into(),
        cell(&r["probe_lateness_s"]["all_gaps"]),
    ));
    rows.push((
        "probe lateness s, worst per shoot".into(),
        cell(&r["probe_lateness_s"]["worst_per_shoot"]),
    ));
    rows.push((
        "shoots never probed in window".into(),
        r["probe_lateness_s"]["shoots_never_probed_in_window"].to_string(),
    ));
    if !r["config"]["slow_shoot_apiserver"].is_null() {
        rows.push((
            "probe lateness s, slow apiserver's shoots".into(),
            cell(&r["probe_lateness_s"]["slow_apiserver_gaps"]),
        ));
    }
    if !r["config"]["stopped_shoot_apiserver"].is_null() {
        rows.push((
            "shoots on stopped apiserver (not timed)".into(),
            r["probe_lateness_s"]["shoots_on_stopped_apiserver"].to_string(),
        ));
    }
    let k = &r["kubelets"];
    if k.is_object() {
        rows.push((
            "kubelets: lease age at end p50/max / renew / valid".into(),
            format!(
                "{} / {} / {}s / {}s",
                num(&k["lease_age_at_end_s"]["p50"], |v| format!("{v:.1}s")),
                num(&k["lease_age_at_end_s"]["max"], |v| format!("{v:.1}s")),
                k["renew_interval_s"],
                k["lease_validity_s"]
            ),
        ));
    }
}

/// A latency's row (`label`: all targets), then one row per target.
fn by_target_rows(rows: &mut Vec<(String, String)>, label: &str, latency: &Value) {
    rows.push((label.into(), cell(&latency["all"])));
    if let Some(by) = latency["by_target"].as_object() {
        for (k, v) in by {
            rows.push((format!("    {k}"), cell(v)));
        }
    }
}

/// The rows of the outage's protection verdict (`p`, its `protection` object; nothing without
/// one): crossing → shoot at 0 and recovery → restored against their bounds.
fn protection_rows(rows: &mut Vec<(String, String)>, p: &Value) {
    if !p.is_object() {
        return;
    }
    let b = &p["bound"];
    let d = &p["scale_down"];
    let u = &p["restore"];
    rows.push((
        "  protection: crossing → shoot at 0 (worst target), s".into(),
        cell(&d["worst_target_per_shoot_s"]),
    ));
    rows.push((
        "    bound / over it / not scaled down".into(),
        format!(
            "{} s / {} / {}",
            num(&b["scale_down_s"], |v| format!("{v:.1}")),
            d["shoots_over_bound"],
            d["shoots_not_scaled_down"]
        ),
    ));
    rows.push((
        "  protection: recovery → shoot restored, s".into(),
        cell(&u["recovery_to_restored_s"]),
    ));
    rows.push((
        "    bound / over it / not restored".into(),
        format!(
            "{} s / {} / {}",
            num(&b["restore_s"], |v| format!("{v:.1}")),
            u["shoots_over_bound"],
            u["shoots_not_restored"]
        ),
    ));
    rows.push(("  protection: met".into(), p["met"].to_string()));
}

/// The outage rows (nothing when the run had no outage).
fn outage_rows(rows: &mut Vec<(String, String)>, o: &Value) {
    if o.is_object() {
        rows.push((
            "outage: affected shoots".into(),
            o["affected_shoots"].to_string(),
        ));
        by_target_rows(
            rows,
            "  crossing → target 0, s (p50/p99/max)",
            &o["scale_down_s"],
        );
        rows.push((
            "    seen by the bench's watch later by, s".into(),
            cell(&o["scale_down_seen_by_bench_watch_late_s"]["summary"]),
        ));
        by_target_rows(rows, "  recovery → target restored, s", &o["restore_s"]);
        let opt = |v: &Value| num(v, |v| format!("{v:.1}"));
        rows.push((
            "  last renewals written / crossing spread, s".into(),
            format!(
                "{} / {}",
                opt(&o["last_renewals_written_after_silence_s"]),
                opt(&o["crossing_spread_s"])
            ),
        ));
        rows.push((
            "  targets never down / never up".into(),
            format!(
                "{} / {}",
                o["targets_missing_down"], o["targets_missing_up"]
            ),
        ));
        // The bound is the mass-outage target; for one shoot it would only confuse.
        if o["affected_shoots"].as_u64().unwrap_or(0) > 1 {
            rows.push((
                "  level 0 all at 0 after 1st crossing / bound".into(),
                format!(
                    "{} s / {:.1} s",
                    o["level0_all_zero_after_first_crossing_s"]
                        .as_f64()
                        .map(|v| format!("{v:.3}"))
                        .unwrap_or_else(|| match o["level0_targets_never_down"].as_u64() {
                            Some(n) if n > 0 => format!("never ({n} level-0 targets not at 0)"),
                            _ => "-".into(),
                        }),
                    o["level0_bound_s"].as_f64().unwrap_or(0.0)
                ),
            ));
        }
        protection_rows(rows, &o["protection"]);
        rows.push((
            "  seed requests in affected ns (outage)".into(),
            o["seed_requests_in_affected_namespaces"]["total"].to_string(),
        ));
        counts(
            rows,
            "    ",
            &o["seed_requests_in_affected_namespaces"]["by_verb_resource"],
        );
    }
}

/// The weeder storm rows (nothing for prober runs).
fn weeder_rows(rows: &mut Vec<(String, String)>, w: &Value) {
    if !w.is_object() {
        return;
    }
    rows.push((
        "weeder: namespaces / watching before flip".into(),
        format!("{} / {}", w["namespaces"], w["watching_before_flip"]),
    ));
    rows.push(("  all slices ready within, s".into(), seconds(&w["flip_s"])));
    rows.push((
        "  slice ready → pod deleted, s (p50/p99/max)".into(),
        cell(&w["deletion_latency_s"]),
    ));
    rows.push((
        "  deleted / within 5 s / all deleted".into(),
        format!(
            "{} / {} / {}",
            w["crashlooping_deleted"], w["deleted_within_5s"], w["all_deleted"]
        ),
    ));
    rows.push((
        "  last deletion after first slice ready, s".into(),
        seconds(&w["last_deletion_after_first_ready_s"]),
    ));
    rows.push((
        "  healthy pods deleted / kept".into(),
        format!("{} / {}", w["healthy_deleted"], w["healthy_kept"]),
    ));
}
