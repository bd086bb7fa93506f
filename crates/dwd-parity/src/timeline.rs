//! The timeline of one run and its recorder.
//!
//! The recorder polls the seed past its front door (so a throttled or conflicting front door
//! never hides what happened) every [`SAMPLE`]: each Deployment's `spec.replicas` and
//! dependency-watchdog annotations, the pods (one that disappears was deleted: nothing else
//! deletes them in the simulated seed), and the leader-election Lease. Warnings come from the
//! binary's log afterwards (both binaries write zap-style JSON with `level` and `ts`). Times
//! are seconds after the binary was started.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::Pod;
use kube::ResourceExt;
use kube::api::{Api, ListParams};
use serde_json::Value;

/// The recorder's sampling period (a recording resolution, not a wait for a condition).
pub const SAMPLE: Duration = Duration::from_millis(100);

/// What happened.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub enum Event {
    /// The scenario did something (same in both columns).
    Action(String),
    /// A Deployment's `spec.replicas` is now this.
    Replicas(String, i32),
    /// A Deployment's annotation `.1` is now `.2` (`None`: removed).
    Annotation(String, String, Option<String>),
    /// A pod is gone.
    PodDeleted(String),
    /// The leader-election Lease's holder: `true` held, `false` released or absent.
    LeaseHeld(bool),
    /// The process ended with this code (`None`: by a signal).
    Exit(Option<i32>),
    /// A log line at warn level or above: `level: msg`.
    Warning(String),
}

impl Event {
    /// Whether two runs' events are compared one to one (warnings are worded differently by
    /// the two programs; they are counted instead).
    pub fn compared(&self) -> bool {
        !matches!(self, Event::Warning(_))
    }
}

impl std::fmt::Display for Event {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Event::Action(a) => write!(f, "» {a}"),
            Event::Replicas(d, r) => write!(f, "{} replicas {r}", short(d)),
            Event::Annotation(d, k, v) => {
                let k = k.rsplit('/').next().unwrap_or(k);
                match v {
                    Some(v) => write!(f, "{} {k}={v:?}", short(d)),
                    None => write!(f, "{} {k} removed", short(d)),
                }
            }
            Event::PodDeleted(p) => write!(f, "pod {p} deleted"),
            Event::LeaseHeld(true) => write!(f, "leader lease held"),
            Event::LeaseHeld(false) => write!(f, "leader lease released"),
            Event::Exit(Some(c)) => write!(f, "exit code {c}"),
            Event::Exit(None) => write!(f, "killed by a signal"),
            Event::Warning(w) => write!(f, "{w}"),
        }
    }
}

/// KCM/MCM/CA for Gardener's targets, else the name.
pub fn short(deployment: &str) -> &str {
    match deployment {
        crate::scenario::KCM => "KCM",
        crate::scenario::MCM => "MCM",
        crate::scenario::CA => "CA",
        other => other,
    }
}

/// The events of one run, in time order.
#[derive(Debug, Clone, Default)]
pub struct Timeline {
    /// `(seconds after start, event)`.
    pub events: Vec<(f64, Event)>,
}

impl Timeline {
    /// Sorts by time (stable: simultaneous events keep their recording order).
    pub fn sort(&mut self) {
        self.events.sort_by(|a, b| a.0.total_cmp(&b.0));
    }

    /// The first time `deployment`'s replicas change to `replicas` (the first observation,
    /// the world as built, is not a change).
    pub fn first_replicas(&self, deployment: &str, replicas: i32) -> Option<f64> {
        self.events
            .iter()
            .filter_map(|(t, e)| match e {
                Event::Replicas(d, r) if d == deployment => Some((*t, *r)),
                _ => None,
            })
            .skip(1)
            .find_map(|(t, r)| (r == replicas).then_some(t))
    }

    /// The last recorded replicas of `deployment`.
    pub fn last_replicas(&self, deployment: &str) -> Option<i32> {
        self.events.iter().rev().find_map(|(_, e)| match e {
            Event::Replicas(d, r) if d == deployment => Some(*r),
            _ => None,
        })
    }

    /// The last recorded value of an annotation (`None`: absent or never seen).
    pub fn last_annotation(&self, deployment: &str, key: &str) -> Option<String> {
        self.events
            .iter()
            .rev()
            .find_map(|(_, e)| match e {
                Event::Annotation(d, k, v) if d == deployment && k == key => Some(v.clone()),
                _ => None,
            })
            .flatten()
    }

    /// When the pod was deleted.
    pub fn pod_deleted(&self, pod: &str) -> Option<f64> {
        self.events.iter().find_map(|(t, e)| match e {
            Event::PodDeleted(p) if p == pod => Some(*t),
            _ => None,
        })
    }

    /// The exit code, if the process ended (`Some(None)`: by a signal).
    pub fn exit(&self) -> Option<Option<i32>> {
        self.events.iter().find_map(|(_, e)| match e {
            Event::Exit(c) => Some(*c),
            _ => None,
        })
    }

    /// The warning lines.
    pub fn warnings(&self) -> Vec<&str> {
        self.events
            .iter()
            .filter_map(|(_, e)| match e {
                Event::Warning(w) => Some(w.as_str()),
                _ => None,
            })
            .collect()
    }

    /// The time of the scenario's SIGTERM, if it sent one.
    pub fn terminated_at(&self) -> Option<f64> {
        self.events.iter().find_map(|(t, e)| match e {
            Event::Action(a) if a.starts_with("SIGTERM") => Some(*t),
            _ => None,
        })
    }

    /// The first time the lease was seen released at or after `t`.
    pub fn lease_released_after(&self, t: f64) -> Option<f64> {
        self.events.iter().find_map(|(at, e)| match e {
            Event::LeaseHeld(false) if *at >= t => Some(*at),
            _ => None,
        })
    }

    /// One line per event, for logs and failures.
    pub fn render(&self) -> String {
        self.events
            .iter()
            .map(|(t, e)| format!("  {t:6.1}  {e}\n"))
            .collect()
    }
}

/// A running recorder; [`Recorder::finish`] stops it and hands back the events.
pub struct Recorder {
    events: Arc<Mutex<Vec<(f64, Event)>>>,
    task: tokio::task::JoinHandle<()>,
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// The dependency-watchdog annotations the recorder follows.
fn watched_annotation(key: &str) -> bool {
    key.starts_with("dependency-watchdog.gardener.cloud/")
}

impl Recorder {
    /// Starts polling `namespace` through `client` (past the front door); `lease`: the
    /// leader-election Lease `(namespace, name)` to follow. `start` is the timeline's zero.
    pub fn start(
        client: kube::Client,
        namespace: &str,
        lease: Option<(String, String)>,
        start: Instant,
    ) -> Recorder {
        let events = Arc::new(Mutex::new(Vec::new()));
        let deployments: Api<Deployment> = Api::namespaced(client.clone(), namespace);
        let pods: Api<Pod> = Api::namespaced(client.clone(), namespace);
        let leases = lease.map(|(ns, name)| (Api::<Lease>::namespaced(client, &ns), name));
        let task = tokio::spawn({
            let events = events.clone();
            async move {
                let mut replicas: BTreeMap<String, i32> = BTreeMap::new();
                let mut annotations: BTreeMap<(String, String), Option<String>> = BTreeMap::new();
                let mut live_pods: Option<Vec<String>> = None;
                let mut held: Option<bool> = None;
                loop {
                    let mut new = Vec::new();
                    if let Ok(list) = deployments.list(&ListParams::default()).await {
                        let t = start.elapsed().as_secs_f64();
                        for d in list.items {
                            let name = d.name_any();
                            let r = d.spec.as_ref().and_then(|s| s.replicas).unwrap_or(1);
                            if replicas.insert(name.clone(), r) != Some(r) {
                                new.push((t, Event::Replicas(name.clone(), r)));
                            }
                            let now: BTreeMap<String, String> = d
                                .annotations()
                                .iter()
                                .filter(|(k, _)| watched_annotation(k))
                                .map(|(k, v)| (k.clone(), v.clone()))
                                .collect();
                            // Keys seen before on this Deployment and gone now were removed.
                            let known: Vec<String> = annotations
                                .keys()
                                .filter(|(dn, _)| *dn == name)
                                .map(|(_, k)| k.clone())
                                .collect();
                            for k in known.iter().chain(now.keys()) {
                                let v = now.get(k).cloned();
                                let key = (name.clone(), k.clone());
                                if annotations.get(&key) != Some(&v) {
                                    annotations.insert(key, v.clone());
                                    new.push((t, Event::Annotation(name.clone(), k.clone(), v)));
                                }
                            }
                        }
                    }
                    if let Ok(list) = pods.list(&ListParams::default()).await {
                        let t = start.elapsed().as_secs_f64();
                        let names: Vec<String> = list.items.iter().map(|p| p.name_any()).collect();
                        if let Some(before) = &live_pods {
                            for p in before.iter().filter(|p| !names.contains(p)) {
                                new.push((t, Event::PodDeleted(p.clone())));
                            }
                        }
                        live_pods = Some(names);
                    }
                    if let Some((api, name)) = &leases
                        && let Ok(lease) = api.get_opt(name).await
                    {
                        let t = start.elapsed().as_secs_f64();
                        let h = lease
                            .and_then(|l| l.spec)
                            .and_then(|s| s.holder_identity)
                            .is_some_and(|h| !h.is_empty());
                        // "Released" only after it was held: before the first election the
                        // Lease does not exist yet.
                        if held != Some(h) && (h || held.is_some()) {
                            held = Some(h);
                            new.push((t, Event::LeaseHeld(h)));
                        }
                    }
                    lock(&events).extend(new);
                    tokio::time::sleep(SAMPLE).await;
                }
            }
        });
        Recorder { events, task }
    }

    /// Adds an event now (actions, the exit).
    pub fn note(&self, t: f64, event: Event) {
        lock(&self.events).push((t, event));
    }

    /// Stops recording; the events so far.
    pub fn finish(self) -> Vec<(f64, Event)> {
        self.task.abort();
        std::mem::take(&mut *lock(&self.events))
    }
}

impl Drop for Recorder {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// The warning/error lines of a zap-style JSON log, with their times relative to `start`
/// (a line without a readable `ts` is put at `fallback`). Non-JSON lines (a Go panic, a plain
/// `Error: …`) count as errors.
pub fn log_warnings(
    log: &str,
    start: chrono::DateTime<chrono::Utc>,
    fallback: f64,
) -> Vec<(f64, Event)> {
    let mut out = Vec::new();
    for line in log.lines().filter(|l| !l.trim().is_empty()) {
        match serde_json::from_str::<Value>(line) {
            Ok(v) => {
                // The first `level` key is the log level: a structured field of the same name
                // written later in the line (a scaling level) would shadow it in `v`.
                let level = first_string_field(line, "level")
                    .or_else(|| v["level"].as_str().map(str::to_string))
                    .unwrap_or_default()
                    .to_ascii_lowercase();
                if !matches!(
                    level.as_str(),
                    "warn" | "warning" | "error" | "dpanic" | "panic" | "fatal"
                ) {
                    continue;
                }
                let ts = first_string_field(line, "ts").map_or(v["ts"].clone(), Value::String);
                let t = log_time(&ts)
                    .map(|ts| (ts - start).num_milliseconds() as f64 / 1000.0)
                    .unwrap_or(fallback);
                let mut text = format!("{level}: {}", v["msg"].as_str().unwrap_or_default());
                for key in ["error", "err"] {
                    if let Some(e) = v[key].as_str() {
                        text.push_str(&format!(" ({e})"));
                    }
                }
                out.push((t, Event::Warning(text)));
            }
            Err(_) if line.contains(" INFO: ") || klog_severity(line) == Some('I') => {
                // Go's standard logger and klog at info level (the reference's runtime
                // metrics, client-go's leader election).
            }
            Err(_) => {
                // Go panics and plain lines: errors worth seeing (first 200 bytes).
                let mut text = line.trim().to_string();
                if text.len() > 200 {
                    let mut cut = 200;
                    while !text.is_char_boundary(cut) {
                        cut -= 1;
                    }
                    text.truncate(cut);
                }
                out.push((fallback, Event::Warning(format!("text: {text}"))));
            }
        }
    }
    out
}

/// The severity letter of a klog text line (`I1123 12:28:42.055876 …`), if it is one.
fn klog_severity(line: &str) -> Option<char> {
    let mut chars = line.chars();
    let severity = chars
        .next()
        .filter(|c| matches!(c, 'I' | 'W' | 'E' | 'F'))?;
    let digits: String = chars.take(4).collect();
    (digits.len() == 4 && digits.chars().all(|c| c.is_ascii_digit())).then_some(severity)
}

/// The string value of the first `"key":"…"` in a JSON line (no escapes in the value), or
/// `None`.
fn first_string_field(line: &str, key: &str) -> Option<String> {
    let needle = format!("\"{key}\":\"");
    let start = line.find(&needle)? + needle.len();
    let rest = &line[start..];
    let end = rest.find('"')?;
    let value = &rest[..end];
    (!value.contains('\\')).then(|| value.to_string())
}

/// A zap `ts`: RFC 3339 text or epoch seconds.
fn log_time(ts: &Value) -> Option<chrono::DateTime<chrono::Utc>> {
    if let Some(s) = ts.as_str() {
        return chrono::DateTime::parse_from_rfc3339(s)
            .ok()
            .map(|t| t.with_timezone(&chrono::Utc));
    }
    let secs = ts.as_f64()?;
    chrono::DateTime::from_timestamp_micros((secs * 1e6) as i64)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_log_level_is_the_first_level_key_not_a_later_field() {
        let start = chrono::DateTime::parse_from_rfc3339("2026-01-01T00:00:00Z")
            .map(|t| t.with_timezone(&chrono::Utc))
            .expect("time");
        let log = concat!(
            r#"{"level":"warn","ts":"2026-01-01T00:00:02Z","msg":"unusable","level":0}"#,
            "\n",
            r#"{"level":"info","ts":"2026-01-01T00:00:03Z","msg":"scaled","level":1}"#,
            "\n",
            r#"{"level":"error","ts":1767225604.5,"msg":"go"}"#,
            "\n",
            "I1123 12:28:42.055876   17907 leaderelection.go:258] \"Attempting to acquire\"\n",
            "2026/11/23 12:28:42 INFO: metrics: disable exposing PSI metrics\n",
            "E1123 12:28:43.000000   17907 leaderelection.go:300] \"Failed to release lock\"\n",
        );
        let w = log_warnings(log, start, 99.0);
        assert_eq!(w.len(), 3, "{w:?}");
        assert!(matches!(&w[2], (t, Event::Warning(x)) if *t == 99.0 && x.contains("release")));
        assert_eq!(w[0], (2.0, Event::Warning("warn: unusable".into())));
        assert_eq!(w[1], (4.5, Event::Warning("error: go".into())));
    }
}
