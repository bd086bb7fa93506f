//! Shadow mode (`--shadow`, docs/behaviour.md §5): run beside the acting watchdog (the
//! reference, or ours in normal mode), decide exactly as in normal operation, never act, and
//! report every disagreement.
//!
//! The prober and the weeder report what they *would* have done ([`Shadow::would`]) and what
//! the acting watchdog was seen doing in the seed ([`Shadow::reference_did`]): the
//! `meltdown-protection-active` annotation appearing on or leaving a shoot's targets, a
//! crash-looping dependant pod deleted. [`dwd_core::shadow::Comparator`] matches the two within
//! a window; each resolved comparison is counted (`dwd_shadow_comparisons_total{component,
//! action, verdict}`), logged, published as an Event about our own pod (the only write shadow
//! mode makes, besides its own leader-election Lease when `--enable-leader-election` is given)
//! and kept, the last [`RECORDS_KEPT`], for `GET /shadow` (text) and `GET /shadow.json` on the
//! metrics address. For something only the reference did, the record carries our own latest
//! finding for that shoot ([`Shadow::note_finding`]: the expired fraction and the per-node
//! verdicts, or that we run no probe for it), which is why we would not have.

use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::{Duration, SystemTime};

use dwd_core::shadow::{Agreement, Comparator, Comparison, ShadowAction, Side, Sighting};
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::Registry;
use serde::Serialize;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tracing::{info, warn};

use crate::observe::events::{Component, Events, Subject};

/// Comparisons kept for `/shadow`: enough for days of a seed's disagreements, bounded.
pub(crate) const RECORDS_KEPT: usize = 200;
/// Sightings waiting for their counterpart at most (past it the oldest resolves early).
pub(crate) const WAITING_LIMIT: usize = 10_000;
/// Longest evidence text kept per sighting or finding (per-node verdicts come from tenants).
pub(crate) const EVIDENCE_LIMIT: usize = 2_048;
/// How often waiting sightings are checked against the window.
const EXPIRY_TICK: Duration = Duration::from_secs(1);

/// Shadow mode's Event reasons, defined with every other reason in [`crate::observe::events`].
pub(crate) use crate::observe::events::{
    REASON_AGREEMENT, REASON_DISAGREEMENT, REASON_WOULD_DELETE_POD, REASON_WOULD_SCALE_DOWN,
    REASON_WOULD_SCALE_UP,
};
/// Our finding for a shoot the acting watchdog scaled but we run no probe for.
pub(crate) const NO_PROBE_FINDING: &str = "we run no probe for this shoot (hibernated, being created, \
    migrated or deleted, or no probe secret; `dependency-watchdog explain` says which)";

/// Label set `{component, action}`.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ActionLabels {
    /// `prober` or `weeder`.
    pub component: String,
    /// `scale_down`, `scale_up` or `delete_pod`.
    pub action: String,
}

/// Label set `{component, action, verdict}`.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ComparisonLabels {
    /// `prober` or `weeder`.
    pub component: String,
    /// `scale_down`, `scale_up` or `delete_pod`.
    pub action: String,
    /// `agree`, `only_us` or `only_reference`.
    pub verdict: String,
}

/// Shadow mode's metrics (registered only in shadow mode).
#[derive(Debug)]
pub struct ShadowMetrics {
    /// What we would have done.
    pub would: Family<ActionLabels, Counter>,
    /// What the acting watchdog was seen doing.
    pub reference: Family<ActionLabels, Counter>,
    /// Resolved comparisons by verdict.
    pub comparisons: Family<ComparisonLabels, Counter>,
    /// For agreements: how far apart the two acted, in seconds.
    pub(crate) agreement_gap: Family<ActionLabels, Histogram>,
    /// Sightings waiting for their counterpart now.
    pub waiting: Gauge,
}

impl Default for ShadowMetrics {
    fn default() -> Self {
        ShadowMetrics {
            would: Family::default(),
            reference: Family::default(),
            comparisons: Family::default(),
            agreement_gap: Family::new_with_constructor(|| {
                Histogram::new(exponential_buckets(0.25, 2.0, 12))
            }),
            waiting: Gauge::default(),
        }
    }
}

impl ShadowMetrics {
    /// Registers the families under `dwd_shadow_`.
    pub fn register(&self, registry: &mut Registry) {
        let r = registry
            .sub_registry_with_prefix("dwd")
            .sub_registry_with_prefix("shadow");
        r.register(
            "would",
            "What shadow mode would have done (and did not), by action",
            self.would.clone(),
        );
        r.register(
            "reference_actions",
            "What the acting watchdog was seen doing in the seed, by action",
            self.reference.clone(),
        );
        r.register(
            "comparisons",
            "Resolved comparisons of shadow mode with the acting watchdog, by action and verdict (agree, only_us, only_reference)",
            self.comparisons.clone(),
        );
        r.register(
            "agreement_gap_seconds",
            "For agreements: seconds between our decision and the acting watchdog's action",
            self.agreement_gap.clone(),
        );
        r.register(
            "waiting_sightings",
            "Sightings of one side waiting for the other's (at most the window)",
            self.waiting.clone(),
        );
    }
}

/// One resolved comparison as `/shadow` shows it.
#[derive(Debug, Clone, Serialize)]
pub struct Record {
    /// `prober` or `weeder`.
    pub component: &'static str,
    /// Shoot namespace, or `namespace/pod (uid)`.
    pub key: String,
    /// `scale_down`, `scale_up`, `delete_pod`.
    pub action: &'static str,
    /// `agree`, `only_us`, `only_reference`.
    pub verdict: &'static str,
    /// When we would have acted (RFC 3339), if we would have.
    pub ours_at: Option<String>,
    /// When the acting watchdog was seen acting (RFC 3339), if it was.
    pub reference_at: Option<String>,
    /// For agreements: seconds the acting watchdog acted after us (negative: before).
    pub reference_lag_seconds: Option<f64>,
    /// Our evidence when we would have acted.
    pub ours: Option<String>,
    /// What was seen of the acting watchdog.
    pub reference: Option<String>,
    /// For `only_reference`: our latest finding for the key, i.e. why we would not have.
    pub our_latest_finding: Option<String>,
}

/// Which kept comparisons `/shadow` shows: `?last=N` (the newest N, default all kept) and
/// `?only=disagreements` (`only_us` and `only_reference`), e.g.
/// `/shadow?only=disagreements&last=20`. Unknown parameters are ignored.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Selection {
    /// At most this many, the newest.
    pub last: usize,
    /// Only disagreements.
    pub(crate) disagreements_only: bool,
}

impl Selection {
    /// The selection a query string asks for.
    pub fn parse(query: Option<&str>) -> Selection {
        let mut selection = Selection {
            last: RECORDS_KEPT,
            disagreements_only: false,
        };
        for pair in query.unwrap_or_default().split('&') {
            match pair.split_once('=') {
                Some(("last", n)) => {
                    if let Ok(n) = n.parse::<usize>() {
                        selection.last = n.min(RECORDS_KEPT);
                    }
                }
                Some(("only", "disagreements")) => selection.disagreements_only = true,
                _ => {}
            }
        }
        selection
    }
}

/// Shadow mode's book: the comparator, the kept records, our latest findings.
pub struct Shadow {
    component: Component,
    comparator: Mutex<Comparator>,
    records: Mutex<VecDeque<Record>>,
    /// Our latest finding per key (shoot namespace), for "we would not, because …".
    latest: Mutex<HashMap<String, String>>,
    /// The time origin of sightings, as a monotonic and a wall-clock instant.
    origin: (Instant, SystemTime),
    /// The shadow families.
    pub metrics: ShadowMetrics,
}

impl Shadow {
    /// A book for `component` matching sightings at most `window` apart.
    pub fn new(component: Component, window: Duration) -> Arc<Self> {
        Arc::new(Shadow {
            component,
            comparator: Mutex::new(Comparator::new(window, WAITING_LIMIT)),
            records: Mutex::new(VecDeque::new()),
            latest: Mutex::new(HashMap::new()),
            origin: (Instant::now(), SystemTime::now()),
            metrics: ShadowMetrics::default(),
        })
    }

    /// The matching window.
    pub fn window(&self) -> Duration {
        lock(&self.comparator).window()
    }

    fn component_label(&self) -> &'static str {
        match self.component {
            Component::Prober => "prober",
            Component::Weeder => "weeder",
        }
    }

    fn now(&self) -> Duration {
        Instant::now().saturating_duration_since(self.origin.0)
    }

    fn wall(&self, at: Duration) -> String {
        let time: chrono::DateTime<chrono::Utc> = (self.origin.1 + at).into();
        time.to_rfc3339_opts(chrono::SecondsFormat::Millis, true)
    }

    /// How often `side` did (the acting watchdog) or would have done (we) `action`: the
    /// counters behind `dwd_shadow_would_total` and `dwd_shadow_reference_actions_total`.
    pub fn count(&self, side: Side, action: ShadowAction) -> u64 {
        let family = match side {
            Side::Ours => &self.metrics.would,
            Side::Reference => &self.metrics.reference,
        };
        family.get_or_create(&self.labels(action)).get()
    }

    fn labels(&self, action: ShadowAction) -> ActionLabels {
        ActionLabels {
            component: self.component_label().into(),
            action: action.label().into(),
        }
    }

    /// `side` did (the acting watchdog) or would have done (we) `action` on `subject` now,
    /// because `evidence`. Ours is logged, counted, noted in an Event about our pod; the
    /// acting watchdog's is logged and counted. Either becomes a sighting for the comparator,
    /// keyed by the subject ([`key_of`]).
    pub fn record(
        &self,
        side: Side,
        events: &Events,
        subject: &Subject<'_>,
        action: ShadowAction,
        evidence: &str,
    ) {
        let (key, evidence) = (key_of(subject), cut(evidence));
        let labels = self.labels(action);
        match side {
            Side::Ours => {
                info!(key, %action, evidence = %evidence, "shadow mode: would {action} (not done)");
                self.metrics.would.get_or_create(&labels).inc();
                let reason = match action {
                    ShadowAction::ScaleDown => REASON_WOULD_SCALE_DOWN,
                    ShadowAction::ScaleUp => REASON_WOULD_SCALE_UP,
                    ShadowAction::DeletePod => REASON_WOULD_DELETE_POD,
                };
                events.shadow_note(
                    subject,
                    false,
                    reason,
                    format!("shadow mode, not done: would {action}: {evidence}"),
                );
            }
            Side::Reference => {
                info!(key, %action, evidence = %evidence, "shadow mode: the acting watchdog did {action}");
                self.metrics.reference.get_or_create(&labels).inc();
            }
        }
        self.sight(events, subject, &key, action, side, evidence);
    }

    /// Our latest finding for `key` (a shoot namespace): what `/shadow` shows when the acting
    /// watchdog did something we would not have.
    pub(crate) fn note_finding(&self, key: &str, finding: &str) {
        lock(&self.latest).insert(key.to_string(), cut(finding));
    }

    /// Forgets our finding for `key` (its probe was removed).
    pub fn forget(&self, key: &str) {
        lock(&self.latest).remove(key);
    }

    fn sight(
        &self,
        events: &Events,
        subject: &Subject<'_>,
        key: &str,
        action: ShadowAction,
        side: Side,
        evidence: String,
    ) {
        let resolved = lock(&self.comparator).observe(Sighting {
            key: key.to_string(),
            action,
            side,
            at: self.now(),
            evidence,
        });
        self.metrics.waiting.set(self.waiting() as i64);
        for comparison in resolved {
            // A full comparator may resolve another key's sighting to make room.
            let subject = (comparison.key == key).then_some(subject);
            self.resolve(events, subject, comparison);
        }
    }

    fn waiting(&self) -> usize {
        lock(&self.comparator).waiting()
    }

    /// Starts [`Shadow::run_expiry`] as the critical task "shadow comparisons" of `tasks`
    /// (the prober's and the weeder's supervised set).
    pub(crate) fn spawn_expiry(
        self: &Arc<Self>,
        events: Events,
        tasks: &mut tokio::task::JoinSet<&'static str>,
        shutdown: CancellationToken,
    ) {
        let shadow = self.clone();
        tasks.spawn(async move {
            shadow.run_expiry(events, shutdown).await;
            "shadow comparisons"
        });
    }

    /// Resolves every sighting that waited longer than the window, until `shutdown`.
    pub(crate) async fn run_expiry(&self, events: Events, shutdown: CancellationToken) {
        let mut tick = tokio::time::interval(EXPIRY_TICK);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                _ = shutdown.cancelled() => return,
                _ = tick.tick() => {}
            }
            let resolved = lock(&self.comparator).expire(self.now());
            self.metrics.waiting.set(self.waiting() as i64);
            for comparison in resolved {
                self.resolve(&events, None, comparison);
            }
        }
    }

    fn resolve(&self, events: &Events, subject: Option<&Subject<'_>>, c: Comparison) {
        let labels = ComparisonLabels {
            component: self.component_label().into(),
            action: c.action.label().into(),
            verdict: c.verdict.label().into(),
        };
        self.metrics.comparisons.get_or_create(&labels).inc();
        let lag = c.reference_lag_seconds();
        if let Some(lag) = lag {
            self.metrics
                .agreement_gap
                .get_or_create(&self.labels(c.action))
                .observe(lag.abs());
        }
        let our_latest_finding = match (c.verdict, self.component) {
            (Agreement::OnlyReference, Component::Prober) => Some(
                lock(&self.latest)
                    .get(&c.key)
                    .cloned()
                    .unwrap_or_else(|| NO_PROBE_FINDING.to_string()),
            ),
            _ => None,
        };
        let record = Record {
            component: self.component_label(),
            key: c.key.clone(),
            action: c.action.label(),
            verdict: c.verdict.label(),
            ours_at: c.ours_at.map(|at| self.wall(at)),
            reference_at: c.reference_at.map(|at| self.wall(at)),
            reference_lag_seconds: lag,
            ours: c.ours_evidence.clone(),
            reference: c.reference_evidence.clone(),
            our_latest_finding,
        };
        let summary = summary(&record, self.window());
        match c.verdict {
            Agreement::Agree => {
                info!(key = %c.key, action = c.action.label(), verdict = "agree", lag_seconds = ?lag, "shadow mode: {summary}")
            }
            _ => {
                warn!(key = %c.key, action = c.action.label(), verdict = c.verdict.label(), "shadow mode: {summary}")
            }
        }
        // Expired sightings carry no subject: name the key's Cluster or pod from the key.
        let fallback;
        let subject = match subject {
            Some(subject) => subject,
            None => {
                fallback = subject_of_key(&c.key, c.action);
                &fallback
            }
        };
        let (warning, reason) = match c.verdict {
            Agreement::Agree => (false, REASON_AGREEMENT),
            _ => (true, REASON_DISAGREEMENT),
        };
        events.shadow_note(subject, warning, reason, summary);
        let mut records = lock(&self.records);
        if records.len() >= RECORDS_KEPT {
            records.pop_front();
        }
        records.push_back(record);
    }

    /// The last `n` resolved comparisons, oldest first.
    pub fn records(&self, n: usize) -> Vec<Record> {
        self.select(&Selection {
            last: n,
            disagreements_only: false,
        })
    }

    /// The kept comparisons `selection` asks for, oldest first.
    pub fn select(&self, selection: &Selection) -> Vec<Record> {
        let records = lock(&self.records);
        let chosen: Vec<&Record> = records
            .iter()
            .filter(|r| !selection.disagreements_only || r.verdict != Agreement::Agree.label())
            .collect();
        chosen
            .iter()
            .skip(chosen.len().saturating_sub(selection.last))
            .map(|r| (*r).clone())
            .collect()
    }

    /// `GET /shadow`: the kept comparisons `selection` asks for, for people, newest last,
    /// each with its evidence.
    pub fn render_text(&self, selection: &Selection) -> String {
        use std::fmt::Write;
        let records = self.select(selection);
        let mut out = String::new();
        // Totals since start, from the counters (the records keep only the last ones).
        let totals = |verdict: Agreement| -> u64 {
            [
                ShadowAction::ScaleDown,
                ShadowAction::ScaleUp,
                ShadowAction::DeletePod,
            ]
            .into_iter()
            .map(|action| {
                self.metrics
                    .comparisons
                    .get_or_create(&ComparisonLabels {
                        component: self.component_label().into(),
                        action: action.label().into(),
                        verdict: verdict.label().into(),
                    })
                    .get()
            })
            .sum()
        };
        let _ = writeln!(
            out,
            "shadow mode ({}), since start: agree {}, only us {}, only the acting watchdog {}; window {:?}; {} sightings waiting; the last {} {}:",
            self.component_label(),
            totals(Agreement::Agree),
            totals(Agreement::OnlyUs),
            totals(Agreement::OnlyReference),
            self.window(),
            self.waiting(),
            records.len(),
            if selection.disagreements_only {
                "disagreements"
            } else {
                "comparisons"
            },
        );
        for r in &records {
            let _ = writeln!(out, "\n{}", summary(r, self.window()));
            if let Some(ours) = &r.ours {
                let _ = writeln!(out, "  ours: {ours}");
            }
            if let Some(reference) = &r.reference {
                let _ = writeln!(out, "  acting watchdog: {reference}");
            }
            if let Some(finding) = &r.our_latest_finding {
                let _ = writeln!(out, "  our latest finding: {finding}");
            }
        }
        out
    }

    /// `GET /shadow.json`: the kept comparisons `selection` asks for, for machines.
    pub(crate) fn render_json(&self, selection: &Selection) -> String {
        serde_json::to_string_pretty(&self.select(selection))
            .unwrap_or_else(|e| format!("{{\"error\": \"encoding: {e}\"}}"))
    }
}

/// One line about a record: "shoot--p--a: scale down: both; the acting watchdog 12.0 s after
/// us (ours 2026-…, acting 2026-…)".
fn summary(r: &Record, window: Duration) -> String {
    let action = r.action.replace('_', " ");
    match r.verdict {
        "agree" => {
            let lag = r.reference_lag_seconds.unwrap_or(0.0);
            let when = if lag >= 0.0 {
                format!("the acting watchdog {lag:.1} s after us")
            } else {
                format!("the acting watchdog {:.1} s before us", -lag)
            };
            format!(
                "{}: {action}: both agree; {when} (ours {}, acting {})",
                r.key,
                r.ours_at.as_deref().unwrap_or("-"),
                r.reference_at.as_deref().unwrap_or("-")
            )
        }
        "only_us" => format!(
            "{}: {action}: we would have at {}; the acting watchdog did not within {window:?}",
            r.key,
            r.ours_at.as_deref().unwrap_or("-"),
        ),
        _ => format!(
            "{}: {action}: the acting watchdog did at {}; we would not have within {window:?}",
            r.key,
            r.reference_at.as_deref().unwrap_or("-"),
        ),
    }
}

/// The subject a key names: a shoot namespace for scaling, `namespace/name (uid)` for pods.
fn subject_of_key(key: &str, action: ShadowAction) -> Subject<'_> {
    if action == ShadowAction::DeletePod
        && let Some((namespace, rest)) = key.split_once('/')
    {
        let (name, uid) = match rest.split_once(" (") {
            Some((name, uid)) => (name, uid.trim_end_matches(')')),
            None => (rest, ""),
        };
        return Subject::Pod {
            namespace,
            name,
            uid,
        };
    }
    Subject::Cluster(key)
}

/// The comparator's key of a subject: the shoot namespace, or [`pod_key`] (read back by
/// `subject_of_key`).
pub fn key_of(subject: &Subject<'_>) -> String {
    match subject {
        Subject::Cluster(namespace) => (*namespace).to_string(),
        Subject::Pod {
            namespace,
            name,
            uid,
        } => pod_key(namespace, name, uid),
    }
}

/// The key of a pod: `namespace/name (uid)`.
pub fn pod_key(namespace: &str, name: &str, uid: &str) -> String {
    format!("{namespace}/{name} ({uid})")
}

fn cut(text: &str) -> String {
    crate::text::truncate(text, EVIDENCE_LIMIT).into_owned()
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::metrics::Metrics;

    /// The book of [`an_agreement_and_an_expired_sighting_are_counted_kept_and_rendered`], as
    /// text and JSON, whole and selected.
    fn check_rendered(shadow: &Shadow) {
        let text = shadow.render_text(&Selection::parse(None));
        assert!(
            text.contains(
                "shoot--p--a: scale down: both agree; the acting watchdog 7.0 s after us"
            ),
            "{text}"
        );
        assert!(
            text.contains("our latest finding: 0/3 node leases expired"),
            "{text}"
        );
        assert!(
            shadow
                .render_json(&Selection::parse(None))
                .contains("\"only_reference\"")
        );
        // The disagreements alone, the newest first cut to `last`.
        let only = shadow.render_text(&Selection::parse(Some("only=disagreements&last=5")));
        assert!(only.contains("the last 1 disagreements:"), "{only}");
        assert!(!only.contains("both agree"), "{only}");
        let json = shadow.render_json(&Selection::parse(Some("last=1")));
        assert!(
            json.contains("only_reference") && !json.contains("\"agree\""),
            "{json}"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn an_agreement_and_an_expired_sighting_are_counted_kept_and_rendered() {
        let shadow = Shadow::new(Component::Prober, Duration::from_secs(60));
        let events = Events::disabled(Arc::new(Metrics::default()));
        let shutdown = CancellationToken::new();
        let expiry = tokio::spawn({
            let (shadow, events, shutdown) = (shadow.clone(), events.clone(), shutdown.clone());
            async move { shadow.run_expiry(events, shutdown).await }
        });
        let a = Subject::Cluster("shoot--p--a");
        shadow.record(
            Side::Ours,
            &events,
            &a,
            ShadowAction::ScaleDown,
            "4/5 node leases expired",
        );
        tokio::time::sleep(Duration::from_secs(7)).await;
        shadow.record(
            Side::Reference,
            &events,
            &a,
            ShadowAction::ScaleDown,
            "meltdown-protection-active on kube-controller-manager",
        );
        shadow.note_finding("shoot--p--b", "0/3 node leases expired: no scaling");
        let b = Subject::Cluster("shoot--p--b");
        shadow.record(
            Side::Reference,
            &events,
            &b,
            ShadowAction::ScaleDown,
            "meltdown-protection-active on machine-controller-manager",
        );
        tokio::time::sleep(Duration::from_secs(62)).await;

        let records = shadow.records(10);
        assert_eq!(records.len(), 2, "{records:?}");
        assert_eq!(
            (records[0].verdict, records[0].reference_lag_seconds),
            ("agree", Some(7.0))
        );
        assert_eq!(records[1].verdict, "only_reference");
        assert_eq!(
            records[1].our_latest_finding.as_deref(),
            Some("0/3 node leases expired: no scaling")
        );
        check_rendered(&shadow);
        let count = |verdict: &str| {
            shadow
                .metrics
                .comparisons
                .get_or_create(&ComparisonLabels {
                    component: "prober".into(),
                    action: "scale_down".into(),
                    verdict: verdict.into(),
                })
                .get()
        };
        assert_eq!(
            (count("agree"), count("only_reference"), count("only_us")),
            (1, 1, 0)
        );
        shutdown.cancel();
        let _ = expiry.await;
    }

    #[test]
    fn pod_keys_name_their_pod_again() {
        let key = pod_key("shoot--p--a", "kube-apiserver-1", "u-1");
        assert_eq!(
            subject_of_key(&key, ShadowAction::DeletePod),
            Subject::Pod {
                namespace: "shoot--p--a",
                name: "kube-apiserver-1",
                uid: "u-1"
            }
        );
        assert_eq!(
            subject_of_key("shoot--p--a", ShadowAction::ScaleDown),
            Subject::Cluster("shoot--p--a")
        );
    }

    #[test]
    fn kept_records_are_bounded() {
        let shadow = Shadow::new(Component::Weeder, Duration::from_secs(1));
        let events = Events::disabled(Arc::new(Metrics::default()));
        for i in 0..(RECORDS_KEPT + 5) {
            shadow.resolve(
                &events,
                None,
                Comparison {
                    key: pod_key("ns", &format!("p{i}"), "u"),
                    action: ShadowAction::DeletePod,
                    verdict: Agreement::OnlyUs,
                    ours_at: Some(Duration::ZERO),
                    reference_at: None,
                    ours_evidence: Some("crash-looping".into()),
                    reference_evidence: None,
                },
            );
        }
        let records = shadow.records(usize::MAX);
        assert_eq!(records.len(), RECORDS_KEPT);
        assert_eq!(records[0].key, "ns/p5 (u)");
    }
}
