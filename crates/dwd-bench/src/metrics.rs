//! The apiservers' own Prometheus metrics (`/metrics`, read with the admin client): response
//! bytes by verb and resource (`apiserver_response_sizes_sum`/`_count`) and open watches
//! (`apiserver_longrunning_requests`). Recorded by the apiserver, so they hold for any binary.
//!
//! The apiserver records response sizes for GET and LIST only, per apiserver and not per
//! user: the simulator's, the bench's and the apiserver's own reads count too. The bench
//! therefore attributes bytes to the watchdog by its own request counts (audit log) times the
//! mean response size of that verb and resource in the window; see [`attribute`].

use std::collections::BTreeMap;

use anyhow::{Context, Result};
use kube::api::GetParams;
use serde_json::{Value, json};

use dwd_testenv::metrics::{Series, parse};

use crate::audit;

/// What the metric's non-resource series (`resource=""`) is called here.
const DISCOVERY: &str = "(aggregated discovery)";

/// Response bytes and responses of one `verb resource` (`list leases`).
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub(crate) struct Sizes {
    /// Sum of response bytes.
    pub bytes: f64,
    /// Number of responses.
    pub count: f64,
}

/// One reading of an apiserver's response-size counters, keyed like [`audit::Request::key`].
pub(crate) type Snapshot = BTreeMap<String, Sizes>;

/// Reads `/metrics` of the apiserver behind `client`.
pub(crate) async fn scrape_text(client: &kube::Client) -> Result<String> {
    let request = kube::core::Request::new("")
        .get("metrics", &GetParams::default())
        .context("build GET /metrics")?;
    client.request_text(request).await.context("GET /metrics")
}

/// Reads the response-size counters of the apiserver behind `client`.
pub(crate) async fn scrape(client: &kube::Client) -> Result<Snapshot> {
    Ok(response_sizes(&scrape_text(client).await?))
}

/// The size of the bench's own `GET path` response (for non-resource paths like
/// `/version`, which the apiserver does not record in `apiserver_response_sizes`).
pub(crate) async fn get_size(client: &kube::Client, path: &str) -> Result<usize> {
    let name = path.trim_start_matches('/');
    let request = kube::core::Request::new("")
        .get(name, &GetParams::default())
        .with_context(|| format!("build GET {path}"))?;
    let text = client
        .request_text(request)
        .await
        .with_context(|| format!("GET {path}"))?;
    Ok(text.len())
}

/// `verb resource[/subresource]` in the audit log's spelling (lower-case verb).
fn key_of(labels: &BTreeMap<String, String>) -> String {
    let get = |k: &str| labels.get(k).map(String::as_str).unwrap_or_default();
    let what = match (get("resource"), get("subresource")) {
        // The only non-resource GETs the apiserver instruments are its aggregated discovery
        // documents (`/api`, `/apis`); `/version` and legacy per-group discovery are not.
        ("", _) => DISCOVERY.to_string(),
        (r, "") => r.to_string(),
        (r, s) => format!("{r}/{s}"),
    };
    format!("{} {what}", get("verb").to_lowercase())
}

/// The `apiserver_response_sizes` sums and counts of a `/metrics` text, by verb and resource
/// (summed over groups, versions, scopes and components).
pub(crate) fn response_sizes(text: &str) -> Snapshot {
    let mut out = Snapshot::new();
    for Series {
        name,
        labels,
        value,
    } in parse(text)
    {
        let entry = match name.as_str() {
            "apiserver_response_sizes_sum" => &mut out.entry(key_of(&labels)).or_default().bytes,
            "apiserver_response_sizes_count" => &mut out.entry(key_of(&labels)).or_default().count,
            _ => continue,
        };
        *entry += value;
    }
    out
}

/// Open long-running requests (`apiserver_longrunning_requests`) of `verb` on `resource`.
pub(crate) fn longrunning(text: &str, verb: &str, resource: &str) -> f64 {
    parse(text)
        .into_iter()
        .filter(|s| {
            s.name == "apiserver_longrunning_requests"
                && s.labels
                    .get("verb")
                    .is_some_and(|v| v.eq_ignore_ascii_case(verb))
                && s.labels.get("resource").is_some_and(|r| r == resource)
        })
        .map(|s| s.value)
        .sum()
}

/// `after − before` per key (counters only grow while an apiserver runs; a key missing
/// before started at zero).
pub(crate) fn delta(before: &Snapshot, after: &Snapshot) -> Snapshot {
    after
        .iter()
        .map(|(k, a)| {
            let b = before.get(k).copied().unwrap_or_default();
            (
                k.clone(),
                Sizes {
                    bytes: (a.bytes - b.bytes).max(0.0),
                    count: (a.count - b.count).max(0.0),
                },
            )
        })
        .filter(|(_, d)| d.count > 0.0)
        .collect()
}

/// Adds `more` into `into`.
pub(crate) fn add(into: &mut Snapshot, more: &Snapshot) {
    for (k, s) in more {
        let e = into.entry(k.clone()).or_default();
        e.bytes += s.bytes;
        e.count += s.count;
    }
}

/// The watchdog's share of the response bytes in a window.
///
/// For each `verb resource` the watchdog used (its requests from the audit log), bytes =
/// its request count × the mean response size of all clients' responses of that key in the
/// window (the metrics' Δsum ÷ Δcount). Of the non-resource GETs only aggregated discovery
/// (`/api`, `/apis`) is in the metric (one series for both, so they share a mean); the
/// others (`/version`, legacy `/apis/<group>/<version>`) get the size of the bench's own GET
/// of that path from `non_resource_size` (exact for `/version`, which has one encoding).
/// Writes and watches are not measured (the apiserver records GET and LIST sizes only).
pub(crate) fn attribute(
    window: &Snapshot,
    requests: &BTreeMap<String, u64>,
    non_resource_size: &BTreeMap<String, usize>,
) -> (Value, f64) {
    let mut rows = serde_json::Map::new();
    let mut total = 0.0;
    for (key, &n) in requests {
        let (verb, what) = key.split_once(' ').unwrap_or((key.as_str(), ""));
        // `/api` and `/apis` are measured when served as aggregated discovery.
        let discovery = format!("get {DISCOVERY}");
        let measured_as = if verb == "get" && (what == "/api" || what == "/apis") {
            discovery.as_str()
        } else {
            key.as_str()
        };
        let row = if let Some(s) = window.get(measured_as).filter(|s| s.count > 0.0) {
            let bytes = n as f64 * s.bytes / s.count;
            total += bytes;
            json!({"requests": n, "bytes": bytes.round(), "mean_bytes": (s.bytes / s.count).round(),
                   "source": format!("apiserver_response_sizes {measured_as}")})
        } else if verb == "get" && what.starts_with('/') {
            match non_resource_size.get(what) {
                Some(&size) => {
                    let bytes = n as f64 * size as f64;
                    total += bytes;
                    json!({"requests": n, "bytes": bytes, "mean_bytes": size, "source": "estimate: size of the bench's own GET"})
                }
                None => json!({"requests": n, "bytes": null, "source": "not measured"}),
            }
        } else {
            json!({"requests": n, "bytes": null, "source": "not measured (only GET and LIST sizes are recorded)"})
        };
        rows.insert(key.clone(), row);
    }
    (Value::Object(rows), total)
}

/// Every non-resource path the watchdog GETs (`/version`, …), to be sized once.
pub(crate) fn non_resource_paths<'a>(
    requests: impl IntoIterator<Item = &'a audit::Request>,
) -> Vec<String> {
    let mut paths: Vec<String> = requests
        .into_iter()
        .filter(|r| r.verb == "get" && r.what.starts_with('/'))
        .map(|r| r.what.clone())
        .collect();
    paths.sort();
    paths.dedup();
    paths
}

/// A snapshot as JSON: `{key: {bytes, responses}}`.
pub(crate) fn to_json(s: &Snapshot) -> Value {
    s.iter()
        .map(|(k, v)| (k.clone(), json!({"bytes": v.bytes, "responses": v.count})))
        .collect::<serde_json::Map<_, _>>()
        .into()
}

#[cfg(test)]
mod tests {
    use super::*;

    const TEXT: &str = r#"# HELP apiserver_response_sizes [STABLE] Response size distribution
# TYPE apiserver_response_sizes histogram
apiserver_response_sizes_bucket{component="apiserver",group="",resource="nodes",scope="cluster",subresource="",verb="LIST",version="v1",le="1000"} 0
apiserver_response_sizes_sum{component="apiserver",group="",resource="nodes",scope="cluster",subresource="",verb="LIST",version="v1"} 12000
apiserver_response_sizes_count{component="apiserver",group="",resource="nodes",scope="cluster",subresource="",verb="LIST",version="v1"} 3
apiserver_response_sizes_sum{component="apiserver",group="apps",resource="deployments",scope="namespace",subresource="scale",verb="GET",version="v1"} 1.5e+03
apiserver_response_sizes_count{component="apiserver",group="apps",resource="deployments",scope="namespace",subresource="scale",verb="GET",version="v1"} 3
apiserver_response_sizes_sum{component="apiserver",group="",resource="",scope="",subresource="",verb="GET",version=""} 24000
apiserver_response_sizes_count{component="apiserver",group="",resource="",scope="",subresource="",verb="GET",version=""} 2
apiserver_longrunning_requests{component="apiserver",group="discovery.k8s.io",resource="endpointslices",scope="cluster",subresource="",verb="WATCH",version="v1"} 2
"#;

    #[test]
    fn parses_response_sizes() {
        let s = response_sizes(TEXT);
        assert_eq!(
            s.get("list nodes"),
            Some(&Sizes {
                bytes: 12000.0,
                count: 3.0
            })
        );
        assert_eq!(
            s.get("get deployments/scale").map(|v| v.bytes),
            Some(1500.0)
        );
        assert_eq!(longrunning(TEXT, "watch", "endpointslices"), 2.0);
        let discovery = BTreeMap::from([("get /apis".to_string(), 3)]);
        let (rows, total) = attribute(&s, &discovery, &BTreeMap::new());
        assert_eq!(total, 36000.0);
        assert_eq!(rows["get /apis"]["mean_bytes"], 12000.0);
        assert_eq!(longrunning(TEXT, "watch", "pods"), 0.0);
    }

    #[test]
    fn attributes_by_mean_size() {
        let before = response_sizes(TEXT);
        let mut after = before.clone();
        if let Some(n) = after.get_mut("list nodes") {
            n.bytes += 4000.0;
            n.count += 2.0;
        }
        let d = delta(&before, &after);
        assert_eq!(d.len(), 1);
        let requests = BTreeMap::from([
            ("list nodes".to_string(), 1),
            ("get /version".to_string(), 2),
        ]);
        let sizes = BTreeMap::from([("/version".to_string(), 300)]);
        let (rows, total) = attribute(&d, &requests, &sizes);
        assert_eq!(total, 2000.0 + 600.0);
        assert_eq!(rows["list nodes"]["bytes"], 2000.0);
    }
}
