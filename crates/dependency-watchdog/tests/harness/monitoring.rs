//! The binary's metrics as the shipped monitoring files must name them: the `/metrics` text of a
//! registry with a series in every family the tests can reach, and checks that PromQL in
//! alerts and dashboards names only those metrics (and label values). Shared by tests/rbac.rs
//! (`deploy/prober`'s alerts, `deploy/grafana`) and tests/seed_monitoring.rs (`deploy/gardener`'s
//! monitoring objects, the Plutono dashboard).

use std::collections::BTreeSet;
use std::path::Path;

use anyhow::{Context, Result, ensure};
use dependency_watchdog::memory_budget::{CauseLabels, Level, LevelLabels, NotMadeCause};
use dependency_watchdog::metrics::{
    ApiLabel, ApiLabels, DirectionLabel, EventLabels, EventOutcome, Metrics, Outcome,
    RequestLabels, RunLabels, RunResult, ScaleOpLabels, ServiceLabels, ShootDirectionLabels,
    ShootLabels,
};
use dependency_watchdog::process::leader::PROBER_LEASE;
use serde_json::Value;

use super::gardener::GARDEN;

/// A sample for every level and every cause of the run-memory families.
fn record_run_memory_samples(m: &Metrics) {
    for level in [Level::Pending, Level::Prompt, Level::Slow] {
        m.run_memory
            .waiting
            .get_or_create(&LevelLabels { level })
            .set(1);
    }
    for cause in [
        NotMadeCause::NoRoomInTime,
        NotMadeCause::EndedForRoom,
        NotMadeCause::ResponseRefused,
    ] {
        m.run_memory
            .not_made
            .get_or_create(&CauseLabels { cause })
            .inc();
    }
}

/// The `/metrics` text of a registry whose every family this test can reach has series (as
/// in production some time or other).
pub(crate) fn exported_metrics_text() -> String {
    let m = Metrics::default();
    let mut registry = prometheus_client::registry::Registry::default();
    m.register(&mut registry);
    let shoot = ShootLabels { shoot: "s".into() };
    m.active_probes.set(1);
    m.probe_runs
        .get_or_create(&RunLabels {
            result: RunResult::ScaleUp,
        })
        .inc();
    m.api_requests
        .get_or_create(&ApiLabels {
            api: ApiLabel::Seed,
        })
        .inc();
    m.throttled_responses
        .get_or_create(&ApiLabels {
            api: ApiLabel::Seed,
        })
        .inc();
    m.scale_operations
        .get_or_create(&ScaleOpLabels {
            direction: DirectionLabel::Down,
            target: "kube-controller-manager".into(),
            outcome: Outcome::Scaled,
        })
        .inc();
    m.shoot_probe_runs.get_or_create(&shoot).inc();
    m.api_server_probe_failures.get_or_create(&shoot).inc();
    m.lease_probe_failures.get_or_create(&shoot).inc();
    m.oversized_responses.get_or_create(&shoot).inc();
    m.expired_lease_fraction.get_or_create(&shoot).set(0.5);
    record_run_memory_samples(&m);
    m.scaling_attempts
        .get_or_create(&ShootDirectionLabels {
            shoot: "s".into(),
            direction: DirectionLabel::Down,
        })
        .inc();
    m.leader.set(1);
    m.probe_run_duration.0.observe(0.2);
    m.active_weeders.set(1);
    m.pods_deleted
        .get_or_create(&ServiceLabels {
            service: "etcd-main-client".into(),
        })
        .inc();
    m.reconciles.inc();
    m.reconcile_errors.inc();
    m.events
        .get_or_create(&EventLabels {
            outcome: EventOutcome::Published,
        })
        .inc();
    m.set_leading(PROBER_LEASE, true);
    m.rest_client_requests
        .0
        .get_or_create(&RequestLabels {
            code: "200".into(),
            method: "GET".into(),
            host: "seed:443".into(),
        })
        .inc();
    let mut text = String::new();
    prometheus_client::encoding::text::encode(&mut text, &registry).expect("encode metrics");
    text
}

/// The sample names of a `/metrics` text.
pub(crate) fn sample_names(text: &str) -> BTreeSet<String> {
    text.lines()
        .filter(|l| !l.starts_with('#') && !l.is_empty())
        .filter_map(|l| l.split(['{', ' ']).next())
        .map(str::to_string)
        .collect()
}

/// Per-shoot series only a running prober writes (their families are the crate's own, out of
/// this test's reach): the binary exports them once it has probed a shoot, which
/// [`prober_with_all_rules`] checks on the real binary's `/metrics`.
pub(crate) const RUNNING_PROBER_SERIES: &[&str] = &[
    "dwd_prober_expired_lease_fraction_timestamp_seconds",
    "dwd_prober_shoot_waiting_for_room",
    "dwd_prober_shoot_decision_pending",
];

/// Metric sample names the binary exports.
pub(crate) fn exported_sample_names() -> BTreeSet<String> {
    let mut names = sample_names(&exported_metrics_text());
    names.extend(RUNNING_PROBER_SERIES.iter().map(|n| n.to_string()));
    names
}

/// Prefixes of the metric families the binary exports: ours, and the standard ones of every
/// controller-runtime controller (process, leader election, client requests).
pub(crate) const METRIC_PREFIXES: &[&str] =
    &["dwd_", "process_", "leader_election_", "rest_client_"];

/// Every metric name in a string: a word starting with one of [`METRIC_PREFIXES`].
pub(crate) fn metric_names_in(text: &str) -> BTreeSet<String> {
    let is_word = |c: char| c.is_ascii_alphanumeric() || c == '_';
    let mut names = BTreeSet::new();
    for prefix in METRIC_PREFIXES {
        let mut from = 0;
        while let Some(at) = text[from..].find(prefix).map(|i| from + i) {
            let tail = &text[at..];
            let end = tail.find(|c: char| !is_word(c)).unwrap_or(tail.len());
            if !text[..at].ends_with(is_word) {
                names.insert(tail[..end].to_string());
            }
            from = at + end;
        }
    }
    names
}

/// The equality matchers (`label="value"`) of the selectors in a PromQL expression, with the
/// metric they select: `(metric, label, value)`. Values with a Grafana variable are left out.
pub(crate) fn equality_matchers(expr: &str) -> Vec<(String, String, String)> {
    let mut found = Vec::new();
    for name in metric_names_in(expr) {
        let mut from = 0;
        while let Some(at) = expr[from..].find(&format!("{name}{{")).map(|i| from + i) {
            let body_start = at + name.len() + 1;
            let Some(len) = expr[body_start..].find('}') else {
                break;
            };
            for matcher in expr[body_start..body_start + len].split(',') {
                let Some((label, value)) = matcher.split_once('=') else {
                    continue;
                };
                let (label, value) = (label.trim(), value.trim());
                // `=~`, `!=` and `!~` select by pattern or exclusion: not checked.
                if label.ends_with('!') || value.starts_with('~') || value.contains('$') {
                    continue;
                }
                found.push((
                    name.clone(),
                    label.to_string(),
                    value.trim_matches('"').to_string(),
                ));
            }
            from = body_start + len;
        }
    }
    found
}

/// Whether the brackets of a PromQL expression pair up (outside string literals).
pub(crate) fn brackets_balanced(expr: &str) -> bool {
    let mut open = Vec::new();
    let mut in_string = false;
    let mut escaped = false;
    for c in expr.chars() {
        if in_string {
            match c {
                _ if escaped => escaped = false,
                '\\' => escaped = true,
                '"' => in_string = false,
                _ => {}
            }
            continue;
        }
        match c {
            '"' => in_string = true,
            '(' | '[' | '{' => open.push(c),
            ')' | ']' | '}' => {
                let want = match c {
                    ')' => '(',
                    ']' => '[',
                    _ => '{',
                };
                if open.pop() != Some(want) {
                    return false;
                }
            }
            _ => {}
        }
    }
    open.is_empty() && !in_string
}

/// A Prometheus duration (`90s`, `1m30s`, `2h`: units from `y` down to `ms`, each at most
/// once, largest first) in milliseconds; `None` when it is not one.
pub(crate) fn prometheus_duration_ms(text: &str) -> Option<u64> {
    const UNITS: &[(&str, u64)] = &[
        ("y", 365 * 86_400_000),
        ("w", 7 * 86_400_000),
        ("d", 86_400_000),
        ("h", 3_600_000),
        ("ms", 1),
        ("m", 60_000),
        ("s", 1000),
    ];
    // Largest first; `ms` is the smallest although it is matched before `m`.
    let rank = |unit: &str| match unit {
        "ms" => UNITS.len(),
        _ => UNITS.iter().position(|(u, _)| *u == unit).unwrap_or(0),
    };
    let mut rest = text;
    let mut total = 0u64;
    let mut last_rank = None;
    while !rest.is_empty() {
        let digits = rest.find(|c: char| !c.is_ascii_digit())?;
        let number: u64 = rest[..digits].parse().ok()?;
        rest = &rest[digits..];
        let (unit, factor) = UNITS.iter().find(|(u, _)| rest.starts_with(u))?;
        if last_rank.is_some_and(|r| r >= rank(unit)) {
            return None;
        }
        last_rank = Some(rank(unit));
        total = total.checked_add(number.checked_mul(*factor)?)?;
        rest = &rest[unit.len()..];
    }
    last_rank.map(|_| total)
}

/// Checks the PrometheusRule `rule` of `component` (whose ServiceMonitor is `sm`): it is one,
/// every rule is an alert with a `for`, a severity, a summary and a description, and every
/// expression is balanced and names only metrics (and label values) the binary exports.
/// Returns the alerts' names.
pub(crate) fn check_prometheus_rule(
    component: &str,
    rule: &Value,
    sm: &Value,
    exported: &BTreeSet<String>,
    exported_text: &str,
) -> Result<BTreeSet<String>> {
    ensure!(rule["apiVersion"] == "monitoring.coreos.com/v1");
    ensure!(rule["kind"] == "PrometheusRule");
    ensure!(
        rule["metadata"]["namespace"] == GARDEN,
        "{component}: PrometheusRule namespace"
    );
    let labels = rule["metadata"]["labels"]
        .as_object()
        .context("PrometheusRule labels")?;
    let sm_labels = sm["metadata"]["labels"]
        .as_object()
        .context("ServiceMonitor labels")?;
    ensure!(
        labels == sm_labels,
        "{component}: PrometheusRule labels {labels:?}, ServiceMonitor {sm_labels:?}"
    );
    let groups = rule["spec"]["groups"]
        .as_array()
        .context("PrometheusRule spec.groups")?;
    ensure!(!groups.is_empty(), "{component}: no rule groups");
    let mut alerts = BTreeSet::new();
    for group in groups {
        let group_name = group["name"]
            .as_str()
            .context("a rule group without name")?;
        let rules = group["rules"]
            .as_array()
            .with_context(|| format!("group {group_name}: rules"))?;
        ensure!(!rules.is_empty(), "group {group_name}: no rules");
        for r in rules {
            let alert = r["alert"]
                .as_str()
                .with_context(|| format!("group {group_name}: a rule that is no alert: {r}"))?;
            ensure!(
                alerts.insert(alert.to_string()),
                "{component}: alert {alert} twice"
            );
            check_alert(alert, r, exported, exported_text)?;
        }
    }
    Ok(alerts)
}

/// Checks one alert `r`: its expression is balanced and names only metrics (and label values)
/// the binary exports, and it has a positive `for`, a known severity, a summary and a description.
fn check_alert(
    alert: &str,
    r: &Value,
    exported: &BTreeSet<String>,
    exported_text: &str,
) -> Result<()> {
    let expr = r["expr"]
        .as_str()
        .with_context(|| format!("{alert}: expr is no string"))?;
    ensure!(!expr.trim().is_empty(), "{alert}: empty expr");
    ensure!(
        brackets_balanced(expr),
        "{alert}: unbalanced brackets in {expr}"
    );
    let r#for = r["for"]
        .as_str()
        .with_context(|| format!("{alert}: no `for`"))?;
    ensure!(
        prometheus_duration_ms(r#for).is_some_and(|ms| ms > 0),
        "{alert}: `for: {for}` is no positive Prometheus duration"
    );
    let severity = r["labels"]["severity"].as_str().unwrap_or_default();
    ensure!(
        ["critical", "warning", "info"].contains(&severity),
        "{alert}: severity {severity:?}"
    );
    for annotation in ["summary", "description"] {
        ensure!(
            r["annotations"][annotation]
                .as_str()
                .is_some_and(|s| !s.trim().is_empty()),
            "{alert}: no {annotation}"
        );
    }
    // Metric names in the expression and in the annotations (an operator looks them
    // up) are exported; so is every label value the expression selects by equality.
    let mut text = expr.to_string();
    for value in r["annotations"].as_object().into_iter().flatten() {
        text.push('\n');
        text.push_str(value.1.as_str().unwrap_or_default());
    }
    let named = metric_names_in(expr);
    ensure!(!named.is_empty(), "{alert}: names no metric of the binary");
    let unknown: Vec<String> = metric_names_in(&text)
        .difference(exported)
        .cloned()
        .collect();
    ensure!(
        unknown.is_empty(),
        "{alert} names unknown metrics {unknown:?}; exported: {exported:?}"
    );
    check_label_values(alert, expr, exported_text)?;
    Ok(())
}

/// Every label value `expr` selects by equality appears on a series of that metric in
/// `exported_text` (labels the deployment adds, like `job` and `pod`, are not the binary's).
pub(crate) fn check_label_values(what: &str, expr: &str, exported_text: &str) -> Result<()> {
    for (metric, label, value) in equality_matchers(expr) {
        if ["job", "pod", "namespace", "instance", "service"].contains(&label.as_str()) {
            continue;
        }
        let wanted = format!("{label}=\"{value}\"");
        ensure!(
            exported_text
                .lines()
                .any(|l| l.starts_with(&format!("{metric}{{")) && l.contains(&wanted)),
            "{what}: selects {metric}{{{wanted}}}, a series the binary never exports"
        );
    }
    Ok(())
}

/// The Grafana dashboard `deploy/grafana/dependency-watchdog.json`.
pub(crate) fn grafana_dashboard() -> Result<Value> {
    let path =
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../../deploy/grafana/dependency-watchdog.json");
    serde_json::from_str(&std::fs::read_to_string(&path)?)
        .with_context(|| format!("{} is not JSON", path.display()))
}

/// The dashboard (`what`) queries only metrics the binary exports, and every one of them.
pub(crate) fn check_dashboard(
    what: &str,
    dashboard: &Value,
    exported: &BTreeSet<String>,
    exported_text: &str,
) -> Result<()> {
    let panels = dashboard["panels"].as_array().context("panels")?;
    let exprs: Vec<String> = panels
        .iter()
        .flat_map(|p| p["targets"].as_array().cloned().unwrap_or_default())
        .filter_map(|t| t["expr"].as_str().map(str::to_string))
        .collect();
    ensure!(!exprs.is_empty(), "{what}: no queries");
    for expr in &exprs {
        ensure!(
            brackets_balanced(expr),
            "{what}: unbalanced brackets in {expr}"
        );
        check_label_values(what, expr, exported_text)?;
    }
    let queried: BTreeSet<String> = exprs.iter().flat_map(|e| metric_names_in(e)).collect();
    // The panels' descriptions name metrics too (an operator looks them up).
    let described: BTreeSet<String> = panels
        .iter()
        .filter_map(|p| p["description"].as_str())
        .flat_map(metric_names_in)
        .collect();
    let unknown: Vec<&String> = queried
        .union(&described)
        .filter(|n| !exported.contains(*n))
        .collect();
    ensure!(
        unknown.is_empty(),
        "{what} names unknown metrics {unknown:?}; exported: {exported:?}"
    );
    let missing: Vec<&String> = exported.difference(&queried).collect();
    ensure!(missing.is_empty(), "{what} lacks {missing:?}");
    Ok(())
}
