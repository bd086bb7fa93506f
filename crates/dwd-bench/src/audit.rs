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

/// When the seed completed the write that took Deployment `name` in `ns` to 0 in a storm
/// (its audit log's `stageTimestamp`): the watchdog's first successful write of its `scale`
/// subresource received at or after `after` when it makes one (the reference patches the
/// replicas annotation first, then updates the scale), else its first successful write of the
/// object (ours, for apps/v1: one merge patch with the replicas and the annotations). In a
/// storm the only writes the watchdog makes to a target that is up are its scale-down's, so
/// this is when the seed took it to 0; the bench's own watch of the Deployments stamps the
/// change on arrival, late by as much as the bench is short of CPU.
pub(crate) fn first_write_completed(
    seed_requests: &[Request],
    (ns, name): (&str, &str),
    after: DateTime<Utc>,
) -> Option<DateTime<Utc>> {
    let first = |what: &str| {
        seed_requests
            .iter()
            .filter(|r| {
                matches!(r.verb.as_str(), "patch" | "update")
                    && r.what == what
                    && r.namespace.as_deref() == Some(ns)
                    && r.name.as_deref() == Some(name)
                    && (200..300).contains(&r.code)
                    && r.received >= after
            })
            .map(|r| r.completed.unwrap_or(r.received))
            .min()
    };
    first("deployments/scale").or_else(|| first("deployments"))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(s: i64) -> DateTime<Utc> {
        DateTime::from_timestamp(1_000_000 + s, 0).unwrap_or_default()
    }

    fn write(
        verb: &str,
        what: &str,
        name: &str,
        received: i64,
        completed: i64,
        code: i64,
    ) -> Request {
        Request {
            user: "dependency-watchdog".into(),
            verb: verb.into(),
            what: what.into(),
            namespace: Some("shoot--a".into()),
            name: Some(name.into()),
            received: at(received),
            completed: Some(at(completed)),
            code,
        }
    }

    #[test]
    fn a_targets_scale_down_is_its_first_successful_scale_write_after_the_silence_else_its_object_write()
     {
        let requests = [
            // Before the silence: not the storm's.
            write("patch", "deployments", "kcm", 5, 6, 200),
            // A conflict wrote nothing.
            write("patch", "deployments", "kcm", 20, 21, 409),
            // Another target, an event, a read.
            write("patch", "deployments", "mcm", 22, 23, 200),
            write("patch", "events", "kcm", 24, 25, 200),
            write("get", "deployments", "kcm", 26, 26, 200),
            write("patch", "deployments", "kcm", 30, 32, 200),
            write("patch", "deployments/scale", "kcm", 40, 41, 200),
        ];
        // The scale subresource's write is the one that changes the replicas.
        assert_eq!(
            first_write_completed(&requests, ("shoot--a", "kcm"), at(10)),
            Some(at(41))
        );
        // Without one, the object's first write.
        assert_eq!(
            first_write_completed(&requests[..6], ("shoot--a", "kcm"), at(10)),
            Some(at(32))
        );
        assert_eq!(
            first_write_completed(&requests, ("shoot--a", "ca"), at(10)),
            None
        );
        assert_eq!(
            first_write_completed(&requests, ("shoot--b", "kcm"), at(10)),
            None
        );
    }
}
