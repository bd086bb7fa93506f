//! Kubernetes Events for what the watchdog decides and does (SPEC §5): every scaling decision
//! on the shoot's `Cluster`, every replica change (or failure) on each scaling target, every
//! crash-looping pod the weeder deletes — each with the reason in its message, so
//! `kubectl describe` / `kubectl get events` tells an operator why their control plane moved.
//!
//! Events are a side channel: they must never slow down or fail a probe, a scaling flow or a
//! weeder. So the callers only put an event on a bounded queue ([`Events`] never awaits) and a
//! single worker task writes them with kube-runtime's [`Recorder`], each write (including the
//! optional UID lookup) limited to [`PUBLISH_TIMEOUT`]. When the queue is full — a mass outage
//! on a seed with a thousand shoots, or a seed apiserver that does not answer — further events
//! are dropped and counted (`dwd_events_total{outcome="Dropped"}`), never buffered without
//! bound. Failed writes are counted too and logged, never retried.
//!
//! Repetitions are aggregated the `events.k8s.io/v1` way: the same event (same object, type,
//! reason *and message*) published again within six minutes becomes a series count on the
//! first one instead of a new object. kube's `Recorder` keys its series on the reason only, so
//! a later decision with a different fraction would be folded into the earlier event and its
//! message lost; the worker therefore keeps one `Recorder` per distinct message, as client-go
//! does.
//!
//! Events about cluster-scoped objects (the `Cluster`) go to the `default` namespace, as the
//! apiserver requires for them; `kubectl describe` finds events by the object's UID, so the
//! worker looks up UIDs the caller does not know (best effort: a failed lookup only means an
//! event without UID, still listed by `kubectl get events`).
//!
//! RBAC: `create` and `patch` on `events.k8s.io` `events` (patch for the series), `get` on
//! `extensions.gardener.cloud` `clusters` and on the targets' resources (UID lookups only; a
//! missing `get` leaves the UID out, nothing else).

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use dwd_core::Direction;
use k8s_openapi::api::core::v1::ObjectReference;
use kube::Client;
use kube::api::{Api, ApiResource, DynamicObject};
use kube::runtime::events::{Event, EventType, Recorder, Reporter};
use tokio::sync::mpsc;
use tokio::time::Instant;
use tracing::{debug, warn};

use crate::metrics::{EventLabels, EventOutcome, Metrics};
use crate::rate_limit::{Priority, with_priority};

/// Events waiting to be written; beyond this they are dropped (and counted).
pub const QUEUE_CAPACITY: usize = 1024;
/// Limit for writing one event, including the UID lookup.
pub const PUBLISH_TIMEOUT: Duration = Duration::from_secs(5);
/// How long a message's `Recorder` is kept for aggregating repetitions. kube-runtime's own
/// cache forgets an event after six minutes, so keeping the `Recorder` longer gains nothing.
const RECORDER_TTL: Duration = Duration::from_secs(6 * 60);
/// How often expired `Recorder`s are swept out.
const SWEEP_INTERVAL: Duration = Duration::from_secs(30);
/// `events.k8s.io/v1` limits: `note` ≤ 1 kB, `reportingInstance` ≤ 128 characters.
const NOTE_LIMIT: usize = 1024;
const INSTANCE_LIMIT: usize = 128;

/// `reason` of the decision event on the Cluster when the prober starts scaling down.
pub const REASON_SCALE_DOWN: &str = "ScaleDown";
/// `reason` of the decision event on the Cluster when the prober starts scaling up.
pub const REASON_SCALE_UP: &str = "ScaleUp";
/// `reason` of the event on a target whose replicas the prober set to 0.
pub const REASON_SCALED_DOWN: &str = "ScaledDown";
/// `reason` of the event on a target whose replicas the prober restored.
pub const REASON_SCALED_UP: &str = "ScaledUp";
/// `reason` of the Warning on a target that could not be scaled down after all attempts.
pub const REASON_SCALE_DOWN_FAILED: &str = "ScaleDownFailed";
/// `reason` of the Warning on a target that could not be scaled up after all attempts.
pub const REASON_SCALE_UP_FAILED: &str = "ScaleUpFailed";
/// `reason` of the event on a pod the weeder deleted.
pub const REASON_POD_DELETED: &str = "CrashLoopingPodDeleted";

/// `apiVersion` of Gardener's `Cluster`.
const CLUSTER_API_VERSION: &str = "extensions.gardener.cloud/v1alpha1";

/// Which part of the watchdog reports: the `reportingController` of its events.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Component {
    /// The prober (scaling decisions and targets).
    Prober,
    /// The weeder (deleted pods).
    Weeder,
}

impl Component {
    /// The `reportingController` name.
    pub fn controller(self) -> &'static str {
        match self {
            Component::Prober => "dependency-watchdog-prober",
            Component::Weeder => "dependency-watchdog-weeder",
        }
    }
}

/// Why an event could not be written.
#[derive(Debug, thiserror::Error)]
pub enum EventError {
    /// The apiserver rejected the event or could not be reached.
    #[error("writing {reason} event about {object}: {source}")]
    Publish {
        /// The event's reason.
        reason: &'static str,
        /// `Kind namespace/name` of the object the event is about.
        object: String,
        /// The client error.
        source: kube::Error,
    },
    /// Writing did not finish within [`PUBLISH_TIMEOUT`].
    #[error("writing {reason} event about {object}: timed out after {timeout:?}")]
    Timeout {
        /// The event's reason.
        reason: &'static str,
        /// `Kind namespace/name` of the object the event is about.
        object: String,
        /// The limit.
        timeout: Duration,
    },
}

/// A scaling target as the event should name it.
#[derive(Debug, Clone, Copy)]
pub struct TargetRef<'a> {
    /// The shoot namespace the target lives in.
    pub namespace: &'a str,
    /// `apiVersion` from the config (`apps/v1`).
    pub api_version: &'a str,
    /// `kind` from the config (`Deployment`).
    pub kind: &'a str,
    /// The target's name.
    pub name: &'a str,
    /// The target's UID when the caller knows it.
    pub uid: Option<&'a str>,
}

/// One event on the queue.
struct Queued {
    regarding: ObjectReference,
    /// Where to look up `regarding.uid` when it is unknown.
    resolve: Option<ApiResource>,
    type_: EventType,
    reason: &'static str,
    note: String,
}

/// The handle callers publish through: cheap to clone, never blocks, never fails.
#[derive(Clone)]
pub struct Events {
    tx: Option<mpsc::Sender<Queued>>,
    metrics: Arc<Metrics>,
    /// Set while the queue overflows, so the overflow is logged once, not per event.
    overflowing: Arc<AtomicBool>,
}

impl Events {
    /// Starts the worker writing `component`'s events through `client`. Needs a tokio runtime.
    pub fn start(client: Client, component: Component, metrics: Arc<Metrics>) -> Self {
        let (events, rx) = Self::with_queue(QUEUE_CAPACITY, metrics.clone());
        let worker = Worker {
            client,
            reporter: reporter(component),
            metrics,
            recorders: HashMap::new(),
            last_sweep: Instant::now(),
            failing: false,
            overflowing: events.overflowing.clone(),
        };
        // The worker ends when the last handle is dropped and the queue is drained.
        // Lowest priority on the seed budget: an event never delays a scaling write.
        tokio::spawn(with_priority(Priority::EVENTS, worker.run(rx)));
        events
    }

    /// A handle that publishes nothing: for tools that only evaluate (and unit tests).
    pub fn disabled(metrics: Arc<Metrics>) -> Self {
        Events {
            tx: None,
            metrics,
            overflowing: Arc::new(AtomicBool::new(false)),
        }
    }

    fn with_queue(capacity: usize, metrics: Arc<Metrics>) -> (Self, mpsc::Receiver<Queued>) {
        let (tx, rx) = mpsc::channel(capacity.max(1));
        let events = Events {
            tx: Some(tx),
            metrics,
            overflowing: Arc::new(AtomicBool::new(false)),
        };
        (events, rx)
    }

    /// The prober decided to scale shoot `cluster` in `dir` and starts a flow for `targets`;
    /// `reason` is the lease probe's summary ("4/5 node leases expired (0.80 ≥ 0.60)").
    /// `cluster_uid`, when known, saves looking the Cluster up.
    pub fn scaling_decision(
        &self,
        cluster: &str,
        cluster_uid: Option<&str>,
        dir: Direction,
        reason: &str,
        targets: &[&str],
    ) {
        let note = format!("{reason}: {} {}", verb(dir), targets.join(", "));
        self.enqueue(Queued {
            regarding: ObjectReference {
                api_version: Some(CLUSTER_API_VERSION.into()),
                kind: Some("Cluster".into()),
                name: Some(cluster.into()),
                uid: cluster_uid.map(Into::into),
                ..ObjectReference::default()
            },
            resolve: cluster_uid
                .is_none()
                .then(|| ApiResource::from_gvk(&crate::prober::controller::cluster_gvk())),
            type_: EventType::Normal,
            reason: match dir {
                Direction::Down => REASON_SCALE_DOWN,
                Direction::Up => REASON_SCALE_UP,
            },
            note,
        });
    }

    /// The prober changed `target`'s replicas from `from` to `to` for `reason`.
    pub fn target_scaled(
        &self,
        target: TargetRef<'_>,
        dir: Direction,
        from: i32,
        to: i32,
        reason: &str,
    ) {
        let done = match dir {
            Direction::Down => "scaled down",
            Direction::Up => "scaled up",
        };
        self.enqueue(Queued {
            regarding: target_reference(&target),
            // A successful write returned the object, so callers know the UID.
            resolve: None,
            type_: EventType::Normal,
            reason: match dir {
                Direction::Down => REASON_SCALED_DOWN,
                Direction::Up => REASON_SCALED_UP,
            },
            note: format!("{done} from {from} to {to}: {reason}"),
        });
    }

    /// Scaling `target` failed after `attempts` attempts with `error`; `resource` lets the
    /// worker look up the UID the failed writes did not return.
    pub fn target_failed(
        &self,
        target: TargetRef<'_>,
        resource: &ApiResource,
        dir: Direction,
        attempts: u32,
        error: &str,
        reason: &str,
    ) {
        let doing = match dir {
            Direction::Down => "scaling down",
            Direction::Up => "scaling up",
        };
        self.enqueue(Queued {
            regarding: target_reference(&target),
            resolve: target.uid.is_none().then(|| resource.clone()),
            type_: EventType::Warning,
            reason: match dir {
                Direction::Down => REASON_SCALE_DOWN_FAILED,
                Direction::Up => REASON_SCALE_UP_FAILED,
            },
            note: format!(
                "{doing} failed after {attempts} attempts: {error}; later levels are not run, \
                 the next probe run retries (reason for scaling: {reason})"
            ),
        });
    }

    /// The weeder deleted pod `namespace/pod` (UID `uid`) because `container` crash-loops
    /// and `service` is ready again.
    pub fn pod_deleted(
        &self,
        namespace: &str,
        pod: &str,
        uid: &str,
        service: &str,
        container: &str,
    ) {
        self.enqueue(Queued {
            regarding: ObjectReference {
                api_version: Some("v1".into()),
                kind: Some("Pod".into()),
                namespace: Some(namespace.into()),
                name: Some(pod.into()),
                uid: Some(uid.into()),
                ..ObjectReference::default()
            },
            resolve: None,
            type_: EventType::Normal,
            reason: REASON_POD_DELETED,
            note: format!(
                "deleted: container {container} in CrashLoopBackOff; service {service} is ready again"
            ),
        });
    }

    fn enqueue(&self, event: Queued) {
        let Some(tx) = &self.tx else {
            return;
        };
        let (reason, object) = (event.reason, describe(&event.regarding));
        match tx.try_send(event) {
            Ok(()) => {}
            Err(mpsc::error::TrySendError::Full(_)) => {
                self.count(EventOutcome::Dropped);
                if !self.overflowing.swap(true, Ordering::Relaxed) {
                    warn!(capacity = QUEUE_CAPACITY, %reason, %object,
                        "event queue full; dropping events until it drains (counted in dwd_events_total{{outcome=\"Dropped\"}})");
                } else {
                    debug!(%reason, %object, "event queue full; event dropped");
                }
            }
            Err(mpsc::error::TrySendError::Closed(_)) => {
                self.count(EventOutcome::Dropped);
                debug!(%reason, %object, "event worker gone; event dropped");
            }
        }
    }

    fn count(&self, outcome: EventOutcome) {
        self.metrics
            .events
            .get_or_create(&EventLabels { outcome })
            .inc();
    }
}

/// The words for a flow in `dir`.
fn verb(dir: Direction) -> &'static str {
    match dir {
        Direction::Down => "scaling down",
        Direction::Up => "scaling up",
    }
}

fn target_reference(target: &TargetRef<'_>) -> ObjectReference {
    ObjectReference {
        api_version: Some(target.api_version.into()),
        kind: Some(target.kind.into()),
        namespace: Some(target.namespace.into()),
        name: Some(target.name.into()),
        uid: target.uid.map(Into::into),
        ..ObjectReference::default()
    }
}

/// `Kind namespace/name` (or `Kind name`) for logs and errors.
fn describe(r: &ObjectReference) -> String {
    let kind = r.kind.as_deref().unwrap_or("object");
    let name = r.name.as_deref().unwrap_or("");
    match r.namespace.as_deref() {
        Some(ns) => format!("{kind} {ns}/{name}"),
        None => format!("{kind} {name}"),
    }
}

/// `controller` with this replica as instance: the pod name when the Deployment passes it in
/// `POD_NAME`, else the hostname (which is the pod name in a pod anyway).
fn reporter(component: Component) -> Reporter {
    let mut reporter = Reporter::from(component.controller());
    if let Some(pod) = std::env::var("POD_NAME").ok().filter(|p| !p.is_empty()) {
        reporter.instance = Some(pod);
    }
    reporter.instance = reporter
        .instance
        .map(|i| truncate(&i, INSTANCE_LIMIT).into_owned());
    reporter
}

/// `text` cut to at most `limit` bytes on a character boundary, marked with `…` when cut.
fn truncate(text: &str, limit: usize) -> std::borrow::Cow<'_, str> {
    if text.len() <= limit {
        return text.into();
    }
    let ellipsis = '…';
    let mut end = limit.saturating_sub(ellipsis.len_utf8());
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}{ellipsis}", &text[..end]).into()
}

/// What makes two events "the same" for aggregation: object, type, reason and message.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
struct SeriesKey {
    api_version: Option<String>,
    kind: Option<String>,
    namespace: Option<String>,
    name: Option<String>,
    uid: Option<String>,
    warning: bool,
    reason: &'static str,
    note: String,
}

/// Writes queued events, one at a time.
struct Worker {
    client: Client,
    reporter: Reporter,
    metrics: Arc<Metrics>,
    /// One `Recorder` per distinct event, with when it was last used.
    recorders: HashMap<SeriesKey, (Recorder, Instant)>,
    last_sweep: Instant,
    /// Whether the last write failed, so a failing apiserver is reported once at warn level.
    failing: bool,
    overflowing: Arc<AtomicBool>,
}

impl Worker {
    async fn run(mut self, mut rx: mpsc::Receiver<Queued>) {
        while let Some(event) = rx.recv().await {
            let (reason, object) = (event.reason, describe(&event.regarding));
            let written = tokio::time::timeout(PUBLISH_TIMEOUT, self.publish(event)).await;
            let result = match written {
                Ok(result) => result,
                Err(_) => Err(EventError::Timeout {
                    reason,
                    object,
                    timeout: PUBLISH_TIMEOUT,
                }),
            };
            match result {
                Ok(()) => {
                    self.count(EventOutcome::Published);
                    self.failing = false;
                }
                Err(error) => {
                    self.count(EventOutcome::Failed);
                    if self.failing {
                        debug!(%error, "event not written");
                    } else {
                        warn!(%error, "event not written (further failures are logged at debug level until one succeeds)");
                    }
                    self.failing = true;
                }
            }
            if rx.is_empty() {
                self.overflowing.store(false, Ordering::Relaxed);
            }
        }
    }

    fn count(&self, outcome: EventOutcome) {
        self.metrics
            .events
            .get_or_create(&EventLabels { outcome })
            .inc();
    }

    async fn publish(&mut self, queued: Queued) -> Result<(), EventError> {
        let Queued {
            mut regarding,
            resolve,
            type_,
            reason,
            note,
        } = queued;
        if let (None, Some(resource)) = (&regarding.uid, &resolve) {
            regarding.uid = self.lookup_uid(&regarding, resource).await;
        }
        let note = truncate(&note, NOTE_LIMIT).into_owned();
        let key = SeriesKey {
            api_version: regarding.api_version.clone(),
            kind: regarding.kind.clone(),
            namespace: regarding.namespace.clone(),
            name: regarding.name.clone(),
            uid: regarding.uid.clone(),
            warning: type_ == EventType::Warning,
            reason,
            note: note.clone(),
        };
        let event = Event {
            type_,
            reason: reason.into(),
            note: Some(note),
            action: action_of(reason).into(),
            secondary: None,
        };
        self.sweep();
        let now = Instant::now();
        let (recorder, repeated) = match self.recorders.get_mut(&key) {
            Some((recorder, used)) => {
                *used = now;
                (recorder.clone(), true)
            }
            None => {
                let recorder = Recorder::new(self.client.clone(), self.reporter.clone());
                self.recorders.insert(key.clone(), (recorder.clone(), now));
                (recorder, false)
            }
        };
        let error = match recorder.publish(&event, &regarding).await {
            Ok(()) => return Ok(()),
            Err(error) => error,
        };
        // Forget the Recorder, so the next identical event starts a fresh series.
        self.recorders.remove(&key);
        // A repetition patches the earlier event; when that one is gone (expired, namespace
        // re-created), create a new one right away instead of losing this occurrence.
        if repeated && matches!(&error, kube::Error::Api(s) if s.code == 404) {
            let recorder = Recorder::new(self.client.clone(), self.reporter.clone());
            if recorder.publish(&event, &regarding).await.is_ok() {
                self.recorders.insert(key, (recorder, Instant::now()));
                return Ok(());
            }
        }
        Err(EventError::Publish {
            reason,
            object: describe(&regarding),
            source: error,
        })
    }

    /// The UID of `regarding`, or `None` when it cannot be read (logged; the event is still
    /// worth writing without it).
    async fn lookup_uid(
        &self,
        regarding: &ObjectReference,
        resource: &ApiResource,
    ) -> Option<String> {
        let name = regarding.name.as_deref()?;
        let api: Api<DynamicObject> = match regarding.namespace.as_deref() {
            Some(ns) => Api::namespaced_with(self.client.clone(), ns, resource),
            None => Api::all_with(self.client.clone(), resource),
        };
        match api.get_metadata_opt(name).await {
            Ok(found) => found.and_then(|m| m.metadata.uid),
            Err(error) => {
                debug!(object = %describe(regarding), %error, "cannot read UID for event; writing it without");
                None
            }
        }
    }

    /// Drops `Recorder`s unused for longer than kube-runtime would aggregate anyway.
    fn sweep(&mut self) {
        if self.last_sweep.elapsed() < SWEEP_INTERVAL {
            return;
        }
        self.last_sweep = Instant::now();
        self.recorders
            .retain(|_, (_, used)| used.elapsed() < RECORDER_TTL);
    }
}

/// The `action` of an event with `reason`: what the watchdog did to the object.
fn action_of(reason: &str) -> &'static str {
    if reason == REASON_POD_DELETED {
        "Delete"
    } else {
        "Scale"
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn metrics() -> Arc<Metrics> {
        Arc::new(Metrics::default())
    }

    fn count(m: &Metrics, outcome: EventOutcome) -> u64 {
        m.events.get_or_create(&EventLabels { outcome }).get()
    }

    #[test]
    fn truncation_keeps_short_text_and_cuts_long_text_on_a_char_boundary() {
        assert_eq!(truncate("short", 10), "short");
        let long = "≥".repeat(600); // 3 bytes each
        let cut = truncate(&long, NOTE_LIMIT);
        assert!(cut.len() <= NOTE_LIMIT, "{}", cut.len());
        assert!(cut.ends_with('…'));
    }

    #[tokio::test]
    async fn a_full_queue_drops_and_counts_instead_of_waiting() {
        let m = metrics();
        let (events, mut rx) = Events::with_queue(2, m.clone());
        for i in 0..5 {
            events.pod_deleted("ns", &format!("pod-{i}"), "uid", "etcd", "c");
        }
        assert_eq!(count(&m, EventOutcome::Dropped), 3);
        let first = rx.recv().await.expect("queued event");
        assert_eq!(first.regarding.name.as_deref(), Some("pod-0"));
        assert_eq!(first.reason, REASON_POD_DELETED);
        drop(rx);
        events.pod_deleted("ns", "late", "uid", "etcd", "c");
        assert_eq!(count(&m, EventOutcome::Dropped), 4);
    }

    #[tokio::test]
    async fn messages_carry_the_reason() {
        let (events, mut rx) = Events::with_queue(8, metrics());
        let reason = "4/5 node leases expired (0.80 ≥ 0.60)";
        events.scaling_decision(
            "shoot--p--s",
            None,
            Direction::Down,
            reason,
            &["kube-controller-manager", "machine-controller-manager"],
        );
        let target = TargetRef {
            namespace: "shoot--p--s",
            api_version: "apps/v1",
            kind: "Deployment",
            name: "kube-controller-manager",
            uid: Some("u1"),
        };
        events.target_scaled(target, Direction::Down, 3, 0, reason);
        let resource = ApiResource::erase::<k8s_openapi::api::apps::v1::Deployment>(&());
        events.target_failed(
            TargetRef {
                uid: None,
                ..target
            },
            &resource,
            Direction::Up,
            3,
            "boom",
            reason,
        );
        events.pod_deleted(
            "shoot--p--s",
            "kapi-0",
            "u2",
            "etcd-main-client",
            "kube-apiserver",
        );

        let cluster = rx.recv().await.expect("cluster event");
        assert_eq!(cluster.reason, REASON_SCALE_DOWN);
        assert_eq!(
            cluster.note,
            "4/5 node leases expired (0.80 ≥ 0.60): scaling down kube-controller-manager, machine-controller-manager"
        );
        assert_eq!(cluster.regarding.namespace, None);
        assert_eq!(cluster.regarding.kind.as_deref(), Some("Cluster"));
        assert!(cluster.resolve.is_some());

        let scaled = rx.recv().await.expect("target event");
        assert_eq!(scaled.reason, REASON_SCALED_DOWN);
        assert_eq!(
            scaled.note,
            "scaled down from 3 to 0: 4/5 node leases expired (0.80 ≥ 0.60)"
        );
        assert_eq!(scaled.regarding.uid.as_deref(), Some("u1"));
        assert!(scaled.resolve.is_none());

        let failed = rx.recv().await.expect("failure event");
        assert_eq!(failed.reason, REASON_SCALE_UP_FAILED);
        assert_eq!(failed.type_, EventType::Warning);
        assert!(
            failed
                .note
                .starts_with("scaling up failed after 3 attempts: boom")
        );
        assert!(failed.resolve.is_some());

        let pod = rx.recv().await.expect("pod event");
        assert_eq!(
            pod.note,
            "deleted: container kube-apiserver in CrashLoopBackOff; service etcd-main-client is ready again"
        );
    }

    #[test]
    fn a_disabled_handle_publishes_nothing_and_counts_nothing() {
        let m = metrics();
        Events::disabled(m.clone()).pod_deleted("ns", "p", "u", "s", "c");
        assert_eq!(count(&m, EventOutcome::Dropped), 0);
    }
}
