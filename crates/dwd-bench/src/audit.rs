//! The apiservers' audit logs (JSON lines, `Metadata` level): who asked what, and when —
//! recorded by the apiserver, so the numbers hold for any binary under test.

use std::collections::{BTreeMap, HashMap};
use std::io::{BufRead, BufReader};
use std::path::Path;

use anyhow::{Context, Result};
use chrono::{DateTime, Utc};
use serde_json::Value;

/// One request as the audit log tells it.
#[derive(Debug, Clone)]
pub(crate) struct Request {
    /// Authenticated user name.
    pub user: String,
    /// `get`, `list`, `watch`, `patch`, …
    pub verb: String,
    /// `deployments/scale`, `leases`, or the path of a non-resource request (`/version`).
    pub what: String,
    /// Namespace of the object, if any.
    pub namespace: Option<String>,
    /// Name of the object, if any.
    pub name: Option<String>,
    /// When the apiserver received it.
    pub received: DateTime<Utc>,
    /// When the apiserver had sent the whole response (the event's `stageTimestamp`), if
    /// recorded.
    pub completed: Option<DateTime<Utc>>,
    /// HTTP status code (0 when not recorded).
    pub code: i64,
}

impl Request {
    /// `verb what`, the key requests are counted under.
    pub(crate) fn key(&self) -> String {
        format!("{} {}", self.verb, self.what)
    }
}

/// Reads the `ResponseComplete`/`Panic` events of `path` whose user `keep` accepts, received
/// at or after `since`. Lines that aren't audit events are skipped: a log cut mid-line by
/// teardown must not lose the rest.
pub(crate) fn read(
    path: &Path,
    since: DateTime<Utc>,
    keep: impl Fn(&str) -> bool,
) -> Result<Vec<Request>> {
    let file = match std::fs::File::open(path) {
        Ok(f) => f,
        // No request at all yet: the apiserver creates the file lazily.
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(e) => return Err(e).with_context(|| format!("open {}", path.display())),
    };
    let mut out = Vec::new();
    for line in BufReader::new(file).lines() {
        let line = line.with_context(|| format!("read {}", path.display()))?;
        let Ok(event) = serde_json::from_str::<Value>(&line) else {
            continue;
        };
        let user = event["user"]["username"].as_str().unwrap_or_default();
        if !keep(user) {
            continue;
        }
        let stage = event["stage"].as_str().unwrap_or_default();
        if stage != "ResponseComplete" && stage != "Panic" {
            continue;
        }
        let Some(received) = event["requestReceivedTimestamp"]
            .as_str()
            .and_then(|t| DateTime::parse_from_rfc3339(t).ok())
            .map(|t| t.with_timezone(&Utc))
        else {
            continue;
        };
        if received < since {
            continue;
        }
        let object = &event["objectRef"];
        let what = match object["resource"].as_str() {
            Some(resource) => match object["subresource"].as_str() {
                Some(sub) => format!("{resource}/{sub}"),
                None => resource.to_string(),
            },
            None => {
                let uri = event["requestURI"].as_str().unwrap_or_default();
                uri.split('?').next().unwrap_or_default().to_string()
            }
        };
        out.push(Request {
            user: user.to_string(),
            verb: event["verb"].as_str().unwrap_or_default().to_string(),
            what,
            namespace: object["namespace"].as_str().map(str::to_string),
            name: object["name"].as_str().map(str::to_string),
            received,
            completed: event["stageTimestamp"]
                .as_str()
                .and_then(|t| DateTime::parse_from_rfc3339(t).ok())
                .map(|t| t.with_timezone(&Utc)),
            code: event["responseStatus"]["code"].as_i64().unwrap_or(0),
        });
    }
    Ok(out)
}

/// Requests counted by `verb what`.
pub(crate) fn by_key<'a>(requests: impl IntoIterator<Item = &'a Request>) -> BTreeMap<String, u64> {
    let mut counts = BTreeMap::new();
    for r in requests {
        *counts.entry(r.key()).or_insert(0) += 1;
    }
    counts
}

/// Requests that did not succeed, counted by HTTP code.
pub(crate) fn failures_by_code<'a>(
    requests: impl IntoIterator<Item = &'a Request>,
) -> BTreeMap<String, u64> {
    let mut counts = BTreeMap::new();
    for r in requests {
        if !(200..300).contains(&r.code) {
            *counts.entry(r.code.to_string()).or_insert(0) += 1;
        }
    }
    counts
}

/// Per user, the receive times of `GET /version` (the API server probe), sorted.
pub(crate) fn version_probes(requests: &[Request]) -> HashMap<String, Vec<DateTime<Utc>>> {
    received_by_user(
        requests
            .iter()
            .filter(|r| r.verb == "get" && r.what == "/version"),
    )
}

/// A request's receive and completion times at the apiserver.
pub(crate) type Span = (DateTime<Utc>, DateTime<Utc>);

/// Per user, each request's receive and completion times (completion as receive when not
/// recorded), sorted by receive time.
pub(crate) fn spans_by_user<'a>(
    requests: impl Iterator<Item = &'a Request>,
) -> HashMap<String, Vec<Span>> {
    let mut by_user: HashMap<String, Vec<_>> = HashMap::new();
    for r in requests {
        let completed = r.completed.unwrap_or(r.received).max(r.received);
        by_user
            .entry(r.user.clone())
            .or_default()
            .push((r.received, completed));
    }
    for spans in by_user.values_mut() {
        spans.sort();
    }
    by_user
}

/// Per user, the receive times of all of `requests`, sorted.
pub(crate) fn received_by_user<'a>(
    requests: impl Iterator<Item = &'a Request>,
) -> HashMap<String, Vec<DateTime<Utc>>> {
    spans_by_user(requests)
        .into_iter()
        .map(|(user, spans)| (user, spans.into_iter().map(|(r, _)| r).collect()))
        .collect()
}
