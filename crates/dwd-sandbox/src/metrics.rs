//! Reading the watchdog's Prometheus endpoint with the workspace's one GET (`dwd_testenv::http`)
//! and Prometheus text reader (`dwd_testenv::metrics`), searchable for the series the sandbox
//! charts and narrates.
//!
//! The sandbox talks to the real binary from the outside, as an operator's Prometheus would,
//! so it depends on nothing but the documented metric names.

use std::net::SocketAddr;
use std::time::Duration;

use anyhow::{Result, bail};

/// One series and its current value (the workspace's one Prometheus text reader,
/// `dwd_testenv::metrics`, on `prometheus-parse`).
pub(crate) use dwd_testenv::metrics::Series;

/// A whole scrape, searchable by name and labels.
#[derive(Debug, Clone, Default)]
pub(crate) struct Scrape {
    series: Vec<Series>,
}

impl Scrape {
    /// Parses a scrape; lines that are no sample (comments, garbage) are skipped.
    pub(crate) fn parse(text: &str) -> Scrape {
        Scrape {
            series: dwd_testenv::metrics::parse(text),
        }
    }

    /// The value of `name` whose labels include every `(label, value)` pair in `labels`.
    pub(crate) fn value(&self, name: &str, labels: &[(&str, &str)]) -> Option<f64> {
        self.all(name, labels).next().map(|s| s.value)
    }

    /// Every series of `name` whose labels include every pair in `labels`.
    pub(crate) fn all<'a>(
        &'a self,
        name: &'a str,
        labels: &'a [(&'a str, &'a str)],
    ) -> impl Iterator<Item = &'a Series> + 'a {
        self.series
            .iter()
            .filter(move |s| s.name == name && s.has_labels(labels))
    }

    /// The sum over every series of `name` (e.g. a counter over all its label values).
    pub(crate) fn sum(&self, name: &str) -> f64 {
        self.series
            .iter()
            .filter(|s| s.name == name)
            .map(|s| s.value)
            .sum()
    }
}

/// `GET path` on a loopback HTTP server; returns `(status code, body)` (the workspace's one
/// HTTP GET, `dwd_testenv::http`).
pub(crate) async fn http_get(
    addr: SocketAddr,
    path: &str,
    timeout: Duration,
) -> Result<(u16, String)> {
    Ok(dwd_testenv::http::get(addr, path, timeout).await?)
}

/// Scrapes `/metrics` at `addr`.
pub(crate) async fn scrape(addr: SocketAddr) -> Result<Scrape> {
    let (status, body) = http_get(addr, "/metrics", Duration::from_secs(2)).await?;
    if status != 200 {
        bail!("GET /metrics from {addr}: HTTP {status}");
    }
    Ok(Scrape::parse(&body))
}

#[cfg(test)]
mod tests {
    use super::*;

    const TEXT: &str = r#"# HELP dwd_prober_expired_lease_fraction Last expired node-lease fraction per shoot.
# TYPE dwd_prober_expired_lease_fraction gauge
dwd_prober_expired_lease_fraction{shoot="shoot--sandbox--alpha"} 0.8
dwd_prober_expired_lease_fraction{shoot="shoot--sandbox--beta"} 0.0
dwd_prober_scaling_attempts_total{shoot="shoot--sandbox--alpha",direction="Down"} 1
dwd_weeder_active_weeders 2
dwd_odd{msg="a value"} 3
# EOF
"#;

    #[test]
    fn finds_series_by_name_and_labels() {
        let s = Scrape::parse(TEXT);
        assert_eq!(
            s.value(
                "dwd_prober_expired_lease_fraction",
                &[("shoot", "shoot--sandbox--alpha")]
            ),
            Some(0.8)
        );
        assert_eq!(
            s.value(
                "dwd_prober_scaling_attempts_total",
                &[("shoot", "shoot--sandbox--alpha"), ("direction", "Down")]
            ),
            Some(1.0)
        );
        assert_eq!(
            s.value(
                "dwd_prober_scaling_attempts_total",
                &[("shoot", "shoot--sandbox--alpha"), ("direction", "Up")]
            ),
            None
        );
        assert_eq!(s.value("dwd_weeder_active_weeders", &[]), Some(2.0));
        assert_eq!(s.value("dwd_odd", &[("msg", "a value")]), Some(3.0));
        assert_eq!(s.sum("dwd_prober_expired_lease_fraction"), 0.8);
        assert_eq!(
            s.all("dwd_prober_expired_lease_fraction", &[])
                .map(|s| s.value)
                .collect::<Vec<_>>(),
            [0.8, 0.0]
        );
    }

    #[test]
    fn garbage_lines_are_skipped() {
        let s = Scrape::parse("not a metric line at all\nx{broken 1\ny 2\n");
        assert_eq!(s.value("y", &[]), Some(2.0));
        assert_eq!(s.value("x", &[]), None);
    }
}
