//! Reading the watchdog's Prometheus endpoint: a minimal HTTP/1.0 GET and a parser for the
//! text exposition format, enough for the series the sandbox charts and narrates.
//!
//! The sandbox talks to the real binary from the outside, as an operator's Prometheus would,
//! so it depends on nothing but the documented metric names.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::time::Duration;

use anyhow::{Context, Result, bail};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// One series and its current value.
#[derive(Debug, Clone, PartialEq)]
pub struct Series {
    /// Metric name as exposed (counters carry `_total`).
    pub name: String,
    /// Label name → value.
    pub labels: BTreeMap<String, String>,
    /// The value.
    pub value: f64,
}

/// A whole scrape, searchable by name and labels.
#[derive(Debug, Clone, Default)]
pub struct Scrape {
    series: Vec<Series>,
}

impl Scrape {
    /// Parses a scrape; lines that are no sample (comments, garbage) are skipped.
    pub fn parse(text: &str) -> Scrape {
        Scrape {
            series: text.lines().filter_map(parse_line).collect(),
        }
    }

    /// The value of `name` whose labels include every `(label, value)` pair in `labels`.
    pub fn value(&self, name: &str, labels: &[(&str, &str)]) -> Option<f64> {
        self.series
            .iter()
            .find(|s| {
                s.name == name
                    && labels
                        .iter()
                        .all(|(k, v)| s.labels.get(*k).is_some_and(|x| x == v))
            })
            .map(|s| s.value)
    }

    /// Every series of `name` whose labels include every pair in `labels`.
    pub fn all<'a>(
        &'a self,
        name: &'a str,
        labels: &'a [(&'a str, &'a str)],
    ) -> impl Iterator<Item = &'a Series> + 'a {
        self.series.iter().filter(move |s| {
            s.name == name
                && labels
                    .iter()
                    .all(|(k, v)| s.labels.get(*k).is_some_and(|x| x == v))
        })
    }

    /// The sum over every series of `name` (e.g. a counter over all its label values).
    pub fn sum(&self, name: &str) -> f64 {
        self.series
            .iter()
            .filter(|s| s.name == name)
            .map(|s| s.value)
            .sum()
    }
}

/// Parses `name{k="v",…} value` or `name value`.
fn parse_line(line: &str) -> Option<Series> {
    let line = line.trim();
    if line.is_empty() || line.starts_with('#') {
        return None;
    }
    let (name, labels, rest) = match line.find('{') {
        Some(open) => {
            let (labels, after) = parse_labels(&line[open + 1..])?;
            (&line[..open], labels, after)
        }
        None => {
            let (name, rest) = line.split_once(' ')?;
            (name, BTreeMap::new(), rest)
        }
    };
    // The value is the first field; an optional timestamp may follow.
    let value = rest.split_whitespace().next()?;
    let value = match value {
        "+Inf" => f64::INFINITY,
        "-Inf" => f64::NEG_INFINITY,
        v => v.parse().ok()?,
    };
    Some(Series {
        name: name.to_string(),
        labels,
        value,
    })
}

/// Parses `k="v",k2="v2"}` (after the opening brace); returns the labels and what follows `}`.
fn parse_labels(s: &str) -> Option<(BTreeMap<String, String>, &str)> {
    let mut labels = BTreeMap::new();
    let mut rest = s;
    loop {
        rest = rest.trim_start_matches([',', ' ']);
        if let Some(after) = rest.strip_prefix('}') {
            return Some((labels, after));
        }
        let eq = rest.find('=')?;
        let key = rest[..eq].trim().to_string();
        let mut chars = rest[eq + 1..].char_indices();
        if chars.next()?.1 != '"' {
            return None;
        }
        let mut value = String::new();
        let mut end = None;
        let mut escaped = false;
        for (i, c) in chars {
            match (escaped, c) {
                (true, 'n') => {
                    value.push('\n');
                    escaped = false;
                }
                (true, c) => {
                    value.push(c);
                    escaped = false;
                }
                (false, '\\') => escaped = true,
                (false, '"') => {
                    end = Some(eq + 1 + i + 1);
                    break;
                }
                (false, c) => value.push(c),
            }
        }
        labels.insert(key, value);
        rest = &rest[end?..];
    }
}

/// `GET path` on a loopback HTTP server; returns `(status code, body)`.
///
/// HTTP/1.0 without keep-alive: the server closes the connection after the answer, so reading
/// to the end is the whole response and no connection outlives one poll.
pub async fn http_get(addr: SocketAddr, path: &str, timeout: Duration) -> Result<(u16, String)> {
    let exchange = async {
        let mut stream = tokio::net::TcpStream::connect(addr)
            .await
            .with_context(|| format!("connect to {addr}"))?;
        let request = format!("GET {path} HTTP/1.0\r\nHost: {addr}\r\nConnection: close\r\n\r\n");
        stream
            .write_all(request.as_bytes())
            .await
            .with_context(|| format!("send GET {path} to {addr}"))?;
        let mut raw = Vec::new();
        stream
            .read_to_end(&mut raw)
            .await
            .with_context(|| format!("read GET {path} from {addr}"))?;
        let text = String::from_utf8_lossy(&raw).into_owned();
        let Some((head, body)) = text.split_once("\r\n\r\n") else {
            bail!("GET {path} from {addr}: no HTTP header in the answer");
        };
        let status = head
            .split_whitespace()
            .nth(1)
            .and_then(|s| s.parse::<u16>().ok())
            .with_context(|| format!("GET {path} from {addr}: bad status line"))?;
        Ok((status, body.to_string()))
    };
    tokio::time::timeout(timeout, exchange)
        .await
        .with_context(|| format!("GET {path} from {addr}: no answer within {timeout:?}"))?
}

/// Scrapes `/metrics` at `addr`.
pub async fn scrape(addr: SocketAddr) -> Result<Scrape> {
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
dwd_odd{msg="a \"quoted\", value"} 3
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
        assert_eq!(
            s.value("dwd_odd", &[("msg", "a \"quoted\", value")]),
            Some(3.0)
        );
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
