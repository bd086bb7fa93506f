//! Reading Prometheus text (an apiserver's or the watchdog's `/metrics`) in tests and tools,
//! on the `prometheus-parse` crate: one parser for the workspace instead of a hand-written one
//! per test file and tool. Its limits that matter here: a label value with an escaped quote
//! (`\"`) or a comma is not matched. The series read here are labelled with Kubernetes names
//! and label values, which contain neither.

use std::collections::BTreeMap;

/// One series of a scrape: a counter, gauge or untyped sample (a histogram's `_sum` and
/// `_count` are untyped samples of their own; its buckets are left out).
#[derive(Debug, Clone, PartialEq)]
pub struct Series {
    /// Metric name as exposed (`dwd_prober_probe_runs_total`).
    pub name: String,
    /// Label names and values, unescaped.
    pub labels: BTreeMap<String, String>,
    /// The value.
    pub value: f64,
}

impl Series {
    /// Whether the series carries every `(name, value)` of `labels`.
    pub fn has_labels(&self, labels: &[(&str, &str)]) -> bool {
        labels
            .iter()
            .all(|(k, v)| self.labels.get(*k).map(String::as_str) == Some(*v))
    }
}

/// Every counter, gauge and untyped series of `text`, in order; unparsable lines are skipped.
pub fn parse(text: &str) -> Vec<Series> {
    let lines = text.lines().map(|l| Ok(l.to_owned()));
    let Ok(scrape) = prometheus_parse::Scrape::parse(lines) else {
        return Vec::new();
    };
    scrape
        .samples
        .into_iter()
        .filter_map(|s| {
            let value = match s.value {
                prometheus_parse::Value::Counter(v)
                | prometheus_parse::Value::Gauge(v)
                | prometheus_parse::Value::Untyped(v) => v,
                prometheus_parse::Value::Histogram(_) | prometheus_parse::Value::Summary(_) => {
                    return None;
                }
            };
            let labels = s
                .labels
                .iter()
                .map(|(k, v)| (k.clone(), v.clone()))
                .collect();
            Some(Series {
                name: s.metric,
                labels,
                value,
            })
        })
        .collect()
}

/// The value of the first series `name` having all `labels`.
pub fn sample(text: &str, name: &str, labels: &[(&str, &str)]) -> Option<f64> {
    parse(text)
        .into_iter()
        .find(|s| s.name == name && s.has_labels(labels))
        .map(|s| s.value)
}

/// The sum of every series `name` having all `labels` (0 when none).
pub fn sum(text: &str, name: &str, labels: &[(&str, &str)]) -> f64 {
    parse(text)
        .into_iter()
        .filter(|s| s.name == name && s.has_labels(labels))
        .map(|s| s.value)
        .sum::<f64>()
        // An empty sum is -0.0; +0.0 makes it print as 0.
        + 0.0
}

#[cfg(test)]
mod tests {
    use super::*;

    /// What prometheus-client writes (OpenMetrics text, `# EOF` included).
    const TEXT: &str = r#"# HELP dwd_prober_probe_runs Probe runs.
# TYPE dwd_prober_probe_runs counter
dwd_prober_probe_runs_total{result="ScaleUp"} 3
dwd_prober_probe_runs_total{result="ScaleDown"} 1
# TYPE dwd_prober_zone_expired_lease_fraction gauge
dwd_prober_zone_expired_lease_fraction{shoot="s",zone="eu-1a"} 1.0
# TYPE dwd_prober_probe_run_duration_seconds histogram
dwd_prober_probe_run_duration_seconds_sum 0.5
dwd_prober_probe_run_duration_seconds_count 2
dwd_prober_probe_run_duration_seconds_bucket{le="0.005"} 1
dwd_prober_probe_run_duration_seconds_bucket{le="+Inf"} 2
apiserver_longrunning_requests{verb="WATCH",resource="leases"} 4
# EOF
"#;

    #[test]
    fn counters_gauges_histogram_totals_and_labels_are_read() {
        assert_eq!(sum(TEXT, "dwd_prober_probe_runs_total", &[]), 4.0);
        assert_eq!(
            sample(
                TEXT,
                "dwd_prober_probe_runs_total",
                &[("result", "ScaleDown")]
            ),
            Some(1.0)
        );
        assert_eq!(
            sample(
                TEXT,
                "dwd_prober_zone_expired_lease_fraction",
                &[("shoot", "s"), ("zone", "eu-1a")]
            ),
            Some(1.0)
        );
        assert_eq!(
            sample(TEXT, "dwd_prober_probe_run_duration_seconds_count", &[]),
            Some(2.0)
        );
        assert_eq!(
            sample(TEXT, "apiserver_longrunning_requests", &[("verb", "WATCH")]),
            Some(4.0)
        );
        assert_eq!(sample(TEXT, "missing", &[]), None);
        assert_eq!(sum(TEXT, "missing", &[]).to_string(), "0");
    }
}
