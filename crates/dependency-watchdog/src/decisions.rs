//! Where decision records go ([`dwd_core::record`]): one JSON log line each, and a ring of
//! the last [`RING_RECORDS`] per shoot, served read-only on the metrics port
//! (`/debug/decisions`).
//!
//! The log line is where operators already look: Gardener ships the prober's logs to its
//! logging stack, so a record is found there by shoot (`namespace`) and by decision id
//! (`decision_id`), long after the ring has moved on or the process restarted. Each line
//! carries the whole record as a JSON object in its field `record` (written raw, not as a
//! string: [`RECORD_FIELD`]); `dependency-watchdog explain --record` reads such lines back.
//!
//! The ring answers "what did it decide lately for this shoot" without a logging stack. It
//! holds each record as its compact JSON text; its memory is at most `shoots ×`
//! [`RING_RECORDS`] `×` [`record_bound`]`(targets)` bytes (README, "After the fact"), and in
//! practice a few KiB per shoot that had something to decide: a healthy shoot produces no
//! record. A removed shoot's ring is forgotten with its probe; its lines stay in the log.
//!
//! A record repeating the shoot's last one (the same reasons, decision, flow and outcome:
//! a zone disrupted for an hour, a hold that does not move) is not kept again; a verdict to
//! scale, a flow superseded and a flow's outcome always are.

use std::collections::{BTreeMap, VecDeque};
use std::hash::{DefaultHasher, Hash, Hasher};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

use chrono::{DateTime, Utc};
use dwd_core::record::{Because, DecisionRecord, RecordBody, record_bound};
use serde_json::json;
use tracing::info;

/// Records kept per shoot.
pub const RING_RECORDS: usize = 8;

/// The log field that carries a record's JSON object, written raw by the JSON and console
/// layouts.
pub use crate::observe::logging::RECORD_FIELD;

/// One shoot's last records.
#[derive(Default)]
struct Ring {
    /// Compact JSON, oldest first.
    records: VecDeque<Arc<str>>,
    /// The signature of the last record kept (see [`signature`]).
    last: Option<u64>,
}

/// The process's decision records (see the module docs).
pub struct DecisionLog {
    rings: Mutex<BTreeMap<String, Ring>>,
    /// Makes ids unique within a millisecond.
    sequence: AtomicU64,
    /// The most bytes one record may take, from the config's target count.
    bound: usize,
}

impl DecisionLog {
    /// An empty log for a config of `targets` targets.
    pub fn new(targets: usize) -> DecisionLog {
        DecisionLog {
            rings: Mutex::default(),
            sequence: AtomicU64::new(0),
            bound: record_bound(targets),
        }
    }

    fn rings(&self) -> MutexGuard<'_, BTreeMap<String, Ring>> {
        // Nothing panics while the lock is held; if something did, the rings are whole.
        self.rings.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// A new decision id for shoot `namespace`: `<namespace>/<unix ms>.<n>`, unique in this
    /// process and, through the time, across restarts.
    pub fn next_id(&self, namespace: &str, now: DateTime<Utc>) -> String {
        let n = self.sequence.fetch_add(1, Ordering::Relaxed);
        format!("{namespace}/{}.{n}", now.timestamp_millis())
    }

    /// Keeps `record` (logs it and puts it in its shoot's ring) unless it repeats the
    /// shoot's last one; returns whether it was kept.
    pub fn keep(&self, record: &DecisionRecord) -> bool {
        let signature = signature(record);
        let always = record.recorded_because.iter().any(|b| {
            matches!(
                b,
                Because::VerdictToScale | Because::Superseded | Because::FlowOutcome
            )
        });
        let text = match serde_json::to_string(record) {
            Ok(text) => text,
            // A record is plain data; if it could not be written, say so, keep nothing.
            Err(e) => {
                tracing::warn!(error = %e, decision_id = %record.id, "decision record not written");
                return false;
            }
        };
        {
            let mut rings = self.rings();
            let ring = rings.entry(record.namespace.clone()).or_default();
            if !always && ring.last == Some(signature) {
                return false;
            }
            ring.last = Some(signature);
            if ring.records.len() == RING_RECORDS {
                ring.records.pop_front();
            }
            ring.records.push_back(Arc::from(text.as_str()));
        }
        if text.len() > self.bound {
            // The bound is designed; a record past it is a bug to report, not to hide.
            tracing::warn!(bytes = text.len(), bound = self.bound, decision_id = %record.id,
                "decision record larger than its bound");
        }
        let because: Vec<String> = record
            .recorded_because
            .iter()
            .map(ToString::to_string)
            .collect();
        info!(decision_id = %record.id, namespace = %record.namespace, because = %because.join(", "),
            record = %text, "decision record");
        true
    }

    /// Forgets shoot `namespace`'s ring (its probe was removed).
    pub fn forget(&self, namespace: &str) {
        self.rings().remove(namespace);
    }

    /// Shoot `namespace`'s records, oldest first.
    pub fn records(&self, namespace: &str) -> Vec<Arc<str>> {
        self.rings()
            .get(namespace)
            .map(|r| r.records.iter().cloned().collect())
            .unwrap_or_default()
    }

    /// Bytes the rings hold (their records' JSON text).
    pub fn bytes(&self) -> usize {
        self.rings()
            .values()
            .flat_map(|r| r.records.iter())
            .map(|t| t.len())
            .sum()
    }

    /// `/debug/decisions?shoot=NS[&id=ID]`: the shoot's records (one, with `id`) as a JSON
    /// array, oldest first; without `shoot`, each shoot with records and how many, and the
    /// rings' bytes. Names and counts only: a record carries no tenant text beyond names.
    pub fn render(&self, query: Option<&str>) -> (bool, String) {
        let params = parse_query(query.unwrap_or(""));
        let Some(shoot) = params.get("shoot") else {
            let rings = self.rings();
            let shoots: Vec<_> = rings
                .iter()
                .map(|(ns, r)| json!({"shoot": ns, "records": r.records.len()}))
                .collect();
            drop(rings);
            return (
                true,
                json!({"shoots": shoots, "bytes": self.bytes(), "records_per_shoot": RING_RECORDS})
                    .to_string(),
            );
        };
        let records = self.records(shoot);
        let wanted = params.get("id");
        let mut body = String::from("[");
        let mut first = true;
        for text in &records {
            if let Some(id) = wanted
                && !has_id(text, id)
            {
                continue;
            }
            if !first {
                body.push(',');
            }
            first = false;
            body.push_str(text);
        }
        body.push(']');
        (wanted.is_none() || !first, body)
    }
}

/// Whether record `text` has id `id` (parsed: an id is matched as a whole value).
fn has_id(text: &str, id: &str) -> bool {
    serde_json::from_str::<serde_json::Value>(text)
        .ok()
        .is_some_and(|v| v.get("id").and_then(|x| x.as_str()) == Some(id))
}

/// `a=b&c=d`, percent-decoded (a decision id has a `/`, sent as `%2F`).
fn parse_query(query: &str) -> BTreeMap<String, String> {
    form_urlencoded::parse(query.as_bytes())
        .map(|(k, v)| (k.into_owned(), v.into_owned()))
        .collect()
}

/// What makes a record the same as the shoot's last: its reasons, and its run's decision,
/// flow and outcome (or its not-made cause); never the same for a flow's outcome.
fn signature(record: &DecisionRecord) -> u64 {
    let mut h = DefaultHasher::new();
    record.recorded_because.hash(&mut h);
    match &record.body {
        RecordBody::Run(run) => {
            if let Some(f) = &run.finding {
                format!("{:?}", f.decision).hash(&mut h);
                f.zones
                    .iter()
                    .filter(|z| z.disrupted)
                    .for_each(|z| z.zone.hash(&mut h));
            }
            if let Some(v) = &run.verdict {
                format!("{:?}{:?}{}", v.asked, v.streak, v.acts).hash(&mut h);
            }
            if let Some(n) = &run.not_made {
                (n.cause.as_str(), n.decision_pending).hash(&mut h);
            }
            format!("{:?}", run.taken).hash(&mut h);
        }
        RecordBody::Flow(_) => record.id.hash(&mut h),
    }
    h.finish()
}

#[cfg(test)]
mod tests {
    use dwd_core::record::{
        FlowName, FlowOutcome, FlowRecord, Mode, NotMadeRecord, RunRecord, SCHEMA, SettingsRecord,
    };

    use super::*;

    fn not_made(id: &str, pending: bool) -> DecisionRecord {
        DecisionRecord {
            schema: SCHEMA.into(),
            id: id.into(),
            namespace: "shoot--p--a".into(),
            at: "2026-11-29T03:12:00.000Z".into(),
            mode: Mode::Acting,
            recorded_because: vec![Because::NotMadeForRoom],
            body: RecordBody::Run(Box::new(RunRecord {
                settings: SettingsRecord {
                    node_lease_failure_fraction: 0.6,
                    zone_lease_failure_fraction: 0.6,
                    min_candidates_per_zone: 3,
                    success_threshold: 1,
                    failure_threshold: 1,
                    grace_seconds: 40.0,
                },
                finding: None,
                not_made: Some(NotMadeRecord {
                    cause: "no_room_in_time".into(),
                    decision_pending: pending,
                }),
                verdict: None,
                targets: Vec::new(),
                intent: None,
                taken: None,
            })),
        }
    }

    fn flow(id: &str) -> DecisionRecord {
        DecisionRecord {
            recorded_because: vec![Because::FlowOutcome],
            body: RecordBody::Flow(FlowRecord {
                decision: "shoot--p--a/1.0".into(),
                flow: FlowName::of(dwd_core::Direction::Down, dwd_core::scaling::FlowScope::All),
                outcome: FlowOutcome::Finished,
                started_at: "2026-11-29T03:12:00.000Z".into(),
                failure: None,
                writes: Vec::new(),
            }),
            ..not_made(id, true)
        }
    }

    #[test]
    fn a_repeat_of_the_last_record_is_not_kept_a_flow_always_is_and_the_ring_keeps_eight() {
        let log = DecisionLog::new(3);
        assert!(log.keep(&not_made("shoot--p--a/1.1", true)));
        assert!(
            !log.keep(&not_made("shoot--p--a/1.2", true)),
            "the same again"
        );
        assert!(log.keep(&not_made("shoot--p--a/1.3", false)), "changed");
        for i in 0..10 {
            assert!(log.keep(&flow(&format!("shoot--p--a/2.{i}"))));
        }
        let kept = log.records("shoot--p--a");
        assert_eq!(kept.len(), RING_RECORDS);
        assert!(kept[0].contains("shoot--p--a/2.2"), "oldest dropped first");
        assert_eq!(log.bytes(), kept.iter().map(|t| t.len()).sum::<usize>());
        log.forget("shoot--p--a");
        assert!(log.records("shoot--p--a").is_empty());
    }

    #[test]
    fn the_endpoint_lists_shoots_serves_a_shoots_records_and_finds_one_by_its_encoded_id() {
        let log = DecisionLog::new(3);
        log.keep(&not_made("shoot--p--a/1.1", true));
        log.keep(&flow("shoot--p--a/1.2"));
        let (found, index) = log.render(None);
        let index: serde_json::Value = serde_json::from_str(&index).expect("json");
        assert!(found);
        assert_eq!(index["shoots"][0]["shoot"], "shoot--p--a");
        assert_eq!(index["shoots"][0]["records"], 2);
        let (_, all) = log.render(Some("shoot=shoot--p--a"));
        let all: Vec<DecisionRecord> = serde_json::from_str(&all).expect("records");
        assert_eq!(all.len(), 2);
        let (found, one) = log.render(Some("shoot=shoot--p--a&id=shoot--p--a%2F1.2"));
        let one: Vec<DecisionRecord> = serde_json::from_str(&one).expect("records");
        assert!(found);
        assert_eq!(one.len(), 1);
        assert_eq!(one[0].id, "shoot--p--a/1.2");
        let (found, none) = log.render(Some("shoot=shoot--p--a&id=nope"));
        assert!(!found);
        assert_eq!(none, "[]");
        assert_eq!(log.render(Some("shoot=other")).1, "[]");
    }
}
