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
//! holds each record as its compact JSON text: at most [`RING_RECORDS`] per shoot, and at
//! most [`RING_BYTES`] in all (the fullest ring gives up its oldest record first), so its
//! memory is `min(shoots × RING_RECORDS × record_bound(targets), RING_BYTES)` plus a
//! shoot's name per shoot (README, "After the fact"); in practice a few KiB per shoot that
//! had something to decide: a healthy shoot produces no record. A removed shoot's ring is
//! forgotten with its probe; its lines stay in the log.
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

/// The most bytes all rings hold together: past it, the fullest ring gives up its oldest
/// record. About 6,500 records of 2.5 KiB (a typical shoot's), eight for each of 800 shoots
/// with something to decide at once; a healthy shoot holds none.
pub const RING_BYTES: usize = 16 << 20;

/// The log field that carries a record's JSON object, written raw by the JSON and console
/// layouts.
pub use crate::observe::logging::RECORD_FIELD;

/// One shoot's last records.
#[derive(Default)]
struct Ring {
    /// Compact JSON, oldest first.
    records: VecDeque<Arc<str>>,
    /// Their bytes.
    bytes: usize,
    /// The signature of the last record kept (see [`signature`]).
    last: Option<u64>,
}

/// The process's decision records (see the module docs).
pub struct DecisionLog {
    rings: Mutex<Rings>,
    /// Makes ids unique within a millisecond.
    sequence: AtomicU64,
    /// The most bytes one record may take, from the config's target count.
    bound: usize,
}

impl DecisionLog {
    /// An empty log for a config of `targets` targets.
    pub fn new(targets: usize) -> DecisionLog {
        DecisionLog {
            rings: Mutex::new(Rings {
                by_shoot: BTreeMap::new(),
                bytes: 0,
                limit: RING_BYTES,
            }),
            sequence: AtomicU64::new(0),
            bound: record_bound(targets),
        }
    }

    /// [`DecisionLog::new`] holding at most `limit` bytes.
    #[cfg(test)]
    fn with_limit(targets: usize, limit: usize) -> DecisionLog {
        let log = DecisionLog::new(targets);
        log.rings().limit = limit;
        log
    }

    fn rings(&self) -> MutexGuard<'_, Rings> {
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
        if !self
            .rings()
            .push(&record.namespace, &text, signature, always)
        {
            return false;
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
        let mut rings = self.rings();
        if let Some(ring) = rings.by_shoot.remove(namespace) {
            rings.bytes -= ring.bytes;
        }
    }

    /// Shoot `namespace`'s records, oldest first.
    pub fn records(&self, namespace: &str) -> Vec<Arc<str>> {
        self.rings()
            .by_shoot
            .get(namespace)
            .map(|r| r.records.iter().cloned().collect())
            .unwrap_or_default()
    }

    /// Bytes the rings hold (their records' JSON text).
    pub fn bytes(&self) -> usize {
        self.rings().bytes
    }

    /// `/debug/decisions?shoot=NS[&id=ID]`: the shoot's records (one, with `id`) as a JSON
    /// array, oldest first; without `shoot`, each shoot with records and how many, and the
    /// rings' bytes. Names and counts only: a record carries no tenant text beyond names.
    pub fn render(&self, query: Option<&str>) -> (bool, String) {
        let params = parse_query(query.unwrap_or(""));
        let Some(shoot) = params.get("shoot") else {
            let rings = self.rings();
            let shoots: Vec<_> = rings
                .by_shoot
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

/// Every shoot's ring, and their bytes against [`RING_BYTES`].
struct Rings {
    by_shoot: BTreeMap<String, Ring>,
    bytes: usize,
    limit: usize,
}

impl Rings {
    /// Puts `text` (its `signature`) in `namespace`'s ring unless it repeats the ring's last
    /// record and is not `always` kept; the oldest record goes past [`RING_RECORDS`], and
    /// the fullest ring's oldest while all hold more than the limit.
    fn push(&mut self, namespace: &str, text: &str, signature: u64, always: bool) -> bool {
        let ring = self.by_shoot.entry(namespace.to_owned()).or_default();
        if !always && ring.last == Some(signature) {
            return false;
        }
        ring.last = Some(signature);
        let mut freed = 0;
        if ring.records.len() == RING_RECORDS
            && let Some(old) = ring.records.pop_front()
        {
            freed += old.len();
        }
        ring.records.push_back(Arc::from(text));
        ring.bytes = ring.bytes + text.len() - freed;
        self.bytes = self.bytes + text.len() - freed;
        while self.bytes > self.limit {
            let Some(fullest) = self.by_shoot.values_mut().max_by_key(|r| r.bytes) else {
                break;
            };
            let Some(old) = fullest.records.pop_front() else {
                break;
            };
            fullest.bytes -= old.len();
            self.bytes -= old.len();
        }
        true
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
    fn past_the_byte_limit_the_fullest_ring_gives_up_its_oldest_record() {
        let size = serde_json::to_string(&flow("shoot--p--a/1.0"))
            .unwrap()
            .len();
        let log = DecisionLog::with_limit(3, 5 * size);
        let in_b = |i: usize| DecisionRecord {
            namespace: "shoot--p--b".into(),
            ..flow(&format!("shoot--p--b/1.{i}"))
        };
        for i in 0..4 {
            log.keep(&flow(&format!("shoot--p--a/1.{i}")));
        }
        log.keep(&in_b(0));
        assert_eq!(log.bytes(), 5 * size);
        log.keep(&in_b(1));
        assert!(log.bytes() <= 5 * size);
        let a = log.records("shoot--p--a");
        assert_eq!(a.len(), 3, "a, the fullest, gave up its oldest");
        assert!(a[0].contains("shoot--p--a/1.1"));
        assert_eq!(log.records("shoot--p--b").len(), 2);
        log.forget("shoot--p--a");
        assert_eq!(log.bytes(), 2 * size);
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
