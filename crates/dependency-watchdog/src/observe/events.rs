//! Kubernetes Events for what the watchdog decides and does (docs/behaviour.md §4.4): every scaling
//! decision on the shoot's `Cluster`, every replica change (or failure) on each scaling target,
//! every crash-looping pod the weeder deletes — each with the reason in its message, so `kubectl
//! describe` / `kubectl get events` tells an operator why their control plane moved.
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
//! Every event is written twice (in shadow mode only the second, [`Events::start_own_pod_only`]):
//! as an `events.k8s.io/v1` Event about the object it concerns
//! (Cluster, target, pod), and as a core/v1 Event about the watchdog's own pod in its own
//! namespace ([`PodRef`]), whose message names the object. Gardener's RBAC allows only the
//! second (core/v1 events in `garden`), so in a Gardener seed `kubectl -n garden get events`
//! tells the whole story; with RBAC that allows both, `kubectl describe` on the Cluster or the
//! target shows it too. A write refused by authorization (403) is counted
//! (`dwd_events_total{outcome="Refused"}`), logged once per kind of event, and that kind is not
//! tried again for [`REFUSAL_PAUSE`]: a refusal is a matter of RBAC, which a retry loop cannot
//! change, and each refused write would cost a request of the seed budget.
//!
//! RBAC: `create` and `patch` on `events.k8s.io` `events` (patch for the series), `create` and
//! `patch` on core `events` in the watchdog's namespace, `get` on `extensions.gardener.cloud`
//! `clusters` and on the targets' resources (UID lookups only; a missing `get` leaves the UID
//! out, nothing else).

use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use dwd_core::Direction;
use k8s_openapi::api::core::v1::{Event as CoreEvent, EventSource, ObjectReference};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, Time};
use k8s_openapi::jiff::Timestamp;
use kube::Client;
use kube::api::{Api, ApiResource, DynamicObject, Patch, PatchParams, PostParams};
use kube::runtime::events::{Event, EventType, Recorder, Reporter};
use tokio::sync::mpsc;
use tokio::time::Instant;
use tracing::{debug, warn};

use crate::client::rate_limit::{Priority, prioritized};
use crate::metrics::{EventLabels, EventOutcome, Metrics};
use crate::text::truncate;

/// Events waiting to be written; beyond this they are dropped (and counted).
pub(crate) const QUEUE_CAPACITY: usize = 1024;
/// Limit for writing one event, including the UID lookup.
pub(crate) const PUBLISH_TIMEOUT: Duration = Duration::from_secs(5);
/// How long a message's `Recorder` is kept for aggregating repetitions. kube-runtime's own
/// cache forgets an event after six minutes, so keeping the `Recorder` longer gains nothing.
const RECORDER_TTL: Duration = Duration::from_secs(6 * 60);
/// How often expired `Recorder`s are swept out.
const SWEEP_INTERVAL: Duration = Duration::from_secs(30);
/// How long a kind of event whose write was refused (403) is not tried again.
pub(crate) const REFUSAL_PAUSE: Duration = Duration::from_secs(10 * 60);
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
pub(crate) const REASON_SCALE_DOWN_FAILED: &str = "ScaleDownFailed";
/// `reason` of the Warning on a target that could not be scaled up after all attempts.
pub(crate) const REASON_SCALE_UP_FAILED: &str = "ScaleUpFailed";
/// `reason` of the Warning on the Cluster when a zone of the shoot becomes disrupted.
pub const REASON_ZONE_DISRUPTED: &str = "ZoneDisrupted";
/// `reason` of the event on the Cluster when a disrupted zone recovers.
pub const REASON_ZONE_RECOVERED: &str = "ZoneRecovered";
/// `reason` of the event on a pod the weeder deleted.
pub const REASON_POD_DELETED: &str = "CrashLoopingPodDeleted";
/// `reason` of the Event about our pod when we would have scaled a shoot down.
pub(crate) const REASON_WOULD_SCALE_DOWN: &str = "WouldScaleDown";
/// `reason` of the Event about our pod when we would have scaled a shoot up.
pub(crate) const REASON_WOULD_SCALE_UP: &str = "WouldScaleUp";
/// `reason` of the Event about our pod when we would have deleted a crash-looping pod.
pub(crate) const REASON_WOULD_DELETE_POD: &str = "WouldDeleteCrashLoopingPod";
/// `reason` of the Event when both watchdogs did the same within the window.
pub(crate) const REASON_AGREEMENT: &str = "ShadowAgreement";
/// `reason` of the (Warning) Event when only one of them did.
pub(crate) const REASON_DISAGREEMENT: &str = "ShadowDisagreement";

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

/// The watchdog's own pod, which its core/v1 Events are about.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PodRef {
    /// The pod's namespace (Gardener: `garden`).
    pub namespace: String,
    /// The pod's name.
    pub name: String,
}

/// Where the in-cluster ServiceAccount volume says which namespace the pod runs in.
const SERVICE_ACCOUNT_NAMESPACE_FILE: &str =
    "/var/run/secrets/kubernetes.io/serviceaccount/namespace";

impl PodRef {
    /// This process's pod: the name from `POD_NAME`, else `HOSTNAME`, else the kernel's host
    /// name (a pod's host name is its name); the namespace from `POD_NAMESPACE`, else the
    /// ServiceAccount volume's `namespace` file, else `fallback_namespace` (the
    /// leader-election namespace, `garden` by default). Gardener's Deployment sets neither
    /// variable, so in a seed the name is the host name and the namespace comes from the file.
    pub(crate) fn discover(fallback_namespace: &str) -> PodRef {
        let from_env = |name: &str| {
            std::env::var(name)
                .ok()
                .map(|v| v.trim().to_string())
                .filter(|v| !v.is_empty())
        };
        let from_file = |path: &str| {
            std::fs::read_to_string(path)
                .ok()
                .map(|v| v.trim().to_string())
                .filter(|v| !v.is_empty())
        };
        let name = from_env("POD_NAME")
            .or_else(|| from_env("HOSTNAME"))
            .or_else(|| from_file("/proc/sys/kernel/hostname"))
            .unwrap_or_else(|| "dependency-watchdog".to_string());
        let namespace = from_env("POD_NAMESPACE")
            .or_else(|| from_file(SERVICE_ACCOUNT_NAMESPACE_FILE))
            .unwrap_or_else(|| fallback_namespace.to_string());
        PodRef { namespace, name }
    }
}

/// The two kinds of event write, each refused or allowed by RBAC as a whole.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
enum Sink {
    /// `events.k8s.io/v1` about the object concerned.
    Object,
    /// core/v1 about the watchdog's own pod.
    OwnPod,
}

/// The kinds of event write whose last attempt failed. Per kind, because every event is written
/// once of each kind: with one kind failing (its namespace missing, say) and the other written,
/// a single flag was reset by every success and logged every failure at warn level, a line per
/// event (1,278 in a 16-minute mass outage of the bench, whose seed has no `garden` namespace).
#[derive(Debug, Default)]
struct Failing(HashSet<Sink>);

impl Failing {
    /// Records whether a write of `sink` was done; true for a failure that is news (the first
    /// since that kind was last written), which is worth a warning.
    fn record(&mut self, sink: Sink, written: bool) -> bool {
        if written {
            self.0.remove(&sink);
            false
        } else {
            self.0.insert(sink)
        }
    }
}

impl Sink {
    fn describe(self) -> &'static str {
        match self {
            Sink::Object => "events.k8s.io/v1 Events about Clusters, targets and pods",
            Sink::OwnPod => "core/v1 Events about the watchdog's own pod",
        }
    }
}

/// Why an event could not be written.
#[derive(Debug, thiserror::Error)]
pub(crate) enum EventError {
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
    /// The apiserver rejected the core/v1 event about the watchdog's pod.
    #[error("writing {reason} event about pod {about}: {source}")]
    PublishOnPod {
        /// The event's reason.
        reason: &'static str,
        /// `namespace/name` of the watchdog's pod and, in parentheses, `Kind namespace/name`
        /// of the object the event is about.
        about: String,
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

impl EventError {
    /// Whether authorization refused the write (403): RBAC, not a passing failure.
    fn refused(&self) -> bool {
        match self {
            EventError::Publish { source, .. } | EventError::PublishOnPod { source, .. } => {
                matches!(source, kube::Error::Api(s) if s.code == 403)
            }
            EventError::Timeout { .. } => false,
        }
    }

    /// The apiserver's own words for a refusal (`… cannot patch resource "events" in API group
    /// …`), logged as a field of its own: inside the whole error, after the object's name, it
    /// can fall past the log's per-value cut ([`crate::observe::logging::LOG_VALUE_LIMIT`]), and it is
    /// the part an operator needs to fix the RBAC.
    fn denial(&self) -> Option<&str> {
        match self {
            EventError::Publish { source, .. } | EventError::PublishOnPod { source, .. } => {
                match source {
                    kube::Error::Api(s) if s.code == 403 => Some(s.message.as_str()),
                    _ => None,
                }
            }
            EventError::Timeout { .. } => None,
        }
    }
}

/// A scaling target as the event should name it.
#[derive(Debug, Clone, Copy)]
pub(crate) struct TargetRef<'a> {
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

/// What a shadow-mode note is about.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Subject<'a> {
    /// A shoot: its Cluster (= its namespace in the seed).
    Cluster(&'a str),
    /// A pod the weeder would delete or saw deleted.
    Pod {
        /// Namespace.
        namespace: &'a str,
        /// Name.
        name: &'a str,
        /// UID.
        uid: &'a str,
    },
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
    /// Starts the worker writing `component`'s events through `client`, each also as a core/v1
    /// Event about `own_pod`. Needs a tokio runtime.
    pub fn start(
        client: Client,
        component: Component,
        own_pod: PodRef,
        metrics: Arc<Metrics>,
    ) -> Self {
        Self::start_with(client, component, own_pod, metrics, true)
    }

    /// Like [`Events::start`], but writes only the core/v1 copies about `own_pod`, in its
    /// namespace: shadow mode (`--shadow`) writes nothing about the objects it watches.
    pub(crate) fn start_own_pod_only(
        client: Client,
        component: Component,
        own_pod: PodRef,
        metrics: Arc<Metrics>,
    ) -> Self {
        Self::start_with(client, component, own_pod, metrics, false)
    }

    fn start_with(
        client: Client,
        component: Component,
        own_pod: PodRef,
        metrics: Arc<Metrics>,
        about_objects: bool,
    ) -> Self {
        let (events, rx) = Self::with_queue(QUEUE_CAPACITY, metrics.clone());
        let mut reporter = reporter(component);
        if reporter.instance.is_none() {
            reporter.instance = Some(truncate(&own_pod.name, INSTANCE_LIMIT).into_owned());
        }
        let worker = Worker {
            // Lowest priority on the seed budget: an event never delays a scaling write.
            client: prioritized(&client, Priority::EVENTS),
            reporter,
            metrics,
            recorders: HashMap::new(),
            own_pod,
            about_objects,
            pod_series: HashMap::new(),
            paused: HashMap::new(),
            refusal_logged: HashSet::new(),
            last_sweep: Instant::now(),
            failing: Failing::default(),
            overflowing: events.overflowing.clone(),
        };
        // The worker ends when the last handle is dropped and the queue is drained.
        tokio::spawn(worker.run(rx));
        events
    }

    /// A handle that publishes nothing: for tools that only evaluate (and unit tests).
    #[cfg(test)]
    pub(crate) fn disabled(metrics: Arc<Metrics>) -> Self {
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
    /// `cluster_uid`, when known, saves looking the Cluster up. `decision`, the id of the
    /// decision's record, ends the note (`… (decision <id>)`), after the targets, so the
    /// note keeps its `reason: verb targets` shape.
    pub fn scaling_decision(
        &self,
        cluster: &str,
        cluster_uid: Option<&str>,
        dir: Direction,
        reason: &str,
        targets: &[&str],
        decision: Option<&str>,
    ) {
        let id = decision
            .map(|d| format!(" (decision {d})"))
            .unwrap_or_default();
        let note = format!("{reason}: {} {}{id}", verb(dir), targets.join(", "));
        let reason = match dir {
            Direction::Down => REASON_SCALE_DOWN,
            Direction::Up => REASON_SCALE_UP,
        };
        self.cluster_event(cluster, cluster_uid, EventType::Normal, reason, note);
    }

    /// A zone of shoot `cluster` became disrupted (`disrupted`) or recovered; `note` says
    /// which, with its leases and what was done about it (docs/behaviour.md §2.19).
    pub(crate) fn zone_changed(
        &self,
        cluster: &str,
        cluster_uid: Option<&str>,
        disrupted: bool,
        note: String,
    ) {
        let (type_, reason) = if disrupted {
            (EventType::Warning, REASON_ZONE_DISRUPTED)
        } else {
            (EventType::Normal, REASON_ZONE_RECOVERED)
        };
        self.cluster_event(cluster, cluster_uid, type_, reason, note);
    }

    fn cluster_event(
        &self,
        cluster: &str,
        cluster_uid: Option<&str>,
        type_: EventType,
        reason: &'static str,
        note: String,
    ) {
        self.enqueue(Queued {
            regarding: ObjectReference {
                api_version: Some(crate::gardener::cluster_gvk().api_version()),
                kind: Some("Cluster".into()),
                name: Some(cluster.into()),
                uid: cluster_uid.map(Into::into),
                ..ObjectReference::default()
            },
            resolve: cluster_uid
                .is_none()
                .then(|| ApiResource::from_gvk(&crate::gardener::cluster_gvk())),
            type_,
            reason,
            note,
        });
    }

    /// The prober changed `target`'s replicas from `from` to `to` for `reason`.
    pub(crate) fn target_scaled(
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
    pub(crate) fn target_failed(
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

    /// A note of shadow mode (`--shadow`; the `shadow` module keeps the book) about `subject`: what we would
    /// have done, or how that compared with what the acting watchdog did.
    pub(crate) fn shadow_note(
        &self,
        subject: &Subject<'_>,
        warning: bool,
        reason: &'static str,
        note: String,
    ) {
        let regarding = match subject {
            Subject::Cluster(name) => ObjectReference {
                api_version: Some(crate::gardener::cluster_gvk().api_version()),
                kind: Some("Cluster".into()),
                name: Some((*name).into()),
                ..ObjectReference::default()
            },
            Subject::Pod {
                namespace,
                name,
                uid,
            } => ObjectReference {
                api_version: Some("v1".into()),
                kind: Some("Pod".into()),
                namespace: Some((*namespace).into()),
                name: Some((*name).into()),
                uid: Some((*uid).into()),
                ..ObjectReference::default()
            },
        };
        self.enqueue(Queued {
            regarding,
            resolve: None,
            type_: if warning {
                EventType::Warning
            } else {
                EventType::Normal
            },
            reason,
            note,
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
    /// The pod the core/v1 copies of the events are about.
    own_pod: PodRef,
    /// Whether the `events.k8s.io/v1` Events about the objects are written too (not in shadow
    /// mode, whose only writes are the events about its own pod).
    about_objects: bool,
    /// core/v1 events written recently, for aggregating repetitions the way client-go does
    /// (a repetition raises `count` and `lastTimestamp` of the first): name, count, last use.
    pod_series: HashMap<SeriesKey, (String, i32, Instant)>,
    /// Kinds of event refused by RBAC, with when to try them again.
    paused: HashMap<Sink, Instant>,
    /// Kinds of event whose refusal was logged (once per process).
    refusal_logged: HashSet<Sink>,
    last_sweep: Instant,
    /// Kinds of event whose last write failed, so each is reported once at warn level.
    failing: Failing,
    overflowing: Arc<AtomicBool>,
}

impl Worker {
    async fn run(mut self, mut rx: mpsc::Receiver<Queued>) {
        while let Some(event) = rx.recv().await {
            self.sweep();
            let (reason, object) = (event.reason, describe(&event.regarding));
            let timed_out = || EventError::Timeout {
                reason,
                object: object.clone(),
                timeout: PUBLISH_TIMEOUT,
            };
            // First the copy Gardener's RBAC allows, so that it is never held back by the other.
            if self.may_write(Sink::OwnPod) {
                let written = tokio::time::timeout(PUBLISH_TIMEOUT, self.publish_on_pod(&event))
                    .await
                    .unwrap_or_else(|_| Err(timed_out()));
                self.settle(Sink::OwnPod, written);
            } else {
                self.count(EventOutcome::Refused);
            }
            if !self.about_objects {
                // Shadow mode: only the copy about our own pod.
            } else if self.may_write(Sink::Object) {
                let written = tokio::time::timeout(PUBLISH_TIMEOUT, self.publish(event))
                    .await
                    .unwrap_or_else(|_| Err(timed_out()));
                self.settle(Sink::Object, written);
            } else {
                self.count(EventOutcome::Refused);
            }
            if rx.is_empty() {
                self.overflowing.store(false, Ordering::Relaxed);
            }
        }
    }

    /// Whether `sink` may be written now: not within [`REFUSAL_PAUSE`] of a refusal.
    fn may_write(&mut self, sink: Sink) -> bool {
        match self.paused.get(&sink) {
            Some(until) if Instant::now() < *until => false,
            Some(_) => {
                self.paused.remove(&sink);
                true
            }
            None => true,
        }
    }

    /// Counts and logs the outcome of one write to `sink`.
    fn settle(&mut self, sink: Sink, written: Result<(), EventError>) {
        match written {
            Ok(()) => {
                self.count(EventOutcome::Published);
                self.failing.record(sink, true);
            }
            Err(error) if error.refused() => {
                self.count(EventOutcome::Refused);
                self.paused.insert(sink, Instant::now() + REFUSAL_PAUSE);
                if self.refusal_logged.insert(sink) {
                    warn!(denied = error.denial().unwrap_or_default(), %error, pause = ?REFUSAL_PAUSE,
                        "{} are not allowed by this ServiceAccount's RBAC; not writing them for a while \
                         (refusals are counted in dwd_events_total{{outcome=\"Refused\"}}, logged once)",
                        sink.describe());
                } else {
                    debug!(%error, "event refused");
                }
            }
            Err(error) => {
                self.count(EventOutcome::Failed);
                if self.failing.record(sink, false) {
                    warn!(%error, "{} not written (further failures of them are logged at debug level until one succeeds)",
                        sink.describe());
                } else {
                    debug!(%error, "event not written");
                }
            }
        }
    }

    /// Writes `queued` as a core/v1 Event about the watchdog's own pod, its message naming the
    /// object; a repetition within [`RECORDER_TTL`] raises the first one's `count` instead.
    async fn publish_on_pod(&mut self, queued: &Queued) -> Result<(), EventError> {
        let object = describe(&queued.regarding);
        let message = truncate(&format!("{object}: {}", queued.note), NOTE_LIMIT).into_owned();
        let key = SeriesKey {
            api_version: queued.regarding.api_version.clone(),
            kind: queued.regarding.kind.clone(),
            namespace: queued.regarding.namespace.clone(),
            name: queued.regarding.name.clone(),
            uid: None,
            warning: queued.type_ == EventType::Warning,
            reason: queued.reason,
            note: message.clone(),
        };
        let api: Api<CoreEvent> = Api::namespaced(self.client.clone(), &self.own_pod.namespace);
        let failed = |source: kube::Error| EventError::PublishOnPod {
            reason: queued.reason,
            about: format!(
                "{}/{} ({object})",
                self.own_pod.namespace, self.own_pod.name
            ),
            source,
        };
        let now = Timestamp::now();
        if let Some((name, count, used)) = self
            .pod_series
            .get_mut(&key)
            .filter(|(_, _, used)| used.elapsed() < RECORDER_TTL)
        {
            let patch = serde_json::json!({ "count": *count + 1, "lastTimestamp": Time(now) });
            match api
                .patch(name, &PatchParams::default(), &Patch::Merge(&patch))
                .await
            {
                Ok(_) => {
                    *count += 1;
                    *used = Instant::now();
                    return Ok(());
                }
                // Gone (expired, or the namespace was re-created): start a new one below.
                Err(kube::Error::Api(s)) if s.code == 404 => {}
                Err(error) => return Err(failed(error)),
            }
        }
        // client-go names events `<object>.<unix nanoseconds in hex>`.
        let name = format!("{}.{:x}", self.own_pod.name, now.as_nanosecond());
        let event = self.pod_event(name.clone(), queued, message, now);
        api.create(&PostParams::default(), &event)
            .await
            .map_err(failed)?;
        self.pod_series.insert(key, (name, 1, Instant::now()));
        Ok(())
    }

    /// A new core/v1 Event `name` about the watchdog's own pod, counted once, for `queued`.
    fn pod_event(
        &self,
        name: String,
        queued: &Queued,
        message: String,
        now: Timestamp,
    ) -> CoreEvent {
        CoreEvent {
            metadata: ObjectMeta {
                name: Some(name),
                namespace: Some(self.own_pod.namespace.clone()),
                ..ObjectMeta::default()
            },
            involved_object: ObjectReference {
                api_version: Some("v1".into()),
                kind: Some("Pod".into()),
                namespace: Some(self.own_pod.namespace.clone()),
                name: Some(self.own_pod.name.clone()),
                ..ObjectReference::default()
            },
            reason: Some(queued.reason.into()),
            message: Some(message),
            type_: Some(
                match queued.type_ {
                    EventType::Normal => "Normal",
                    EventType::Warning => "Warning",
                }
                .into(),
            ),
            action: Some(action_of(queued.reason).into()),
            count: Some(1),
            first_timestamp: Some(Time(now)),
            last_timestamp: Some(Time(now)),
            source: Some(EventSource {
                component: Some(self.reporter.controller.clone()),
                host: None,
            }),
            reporting_component: Some(self.reporter.controller.clone()),
            reporting_instance: self.reporter.instance.clone(),
            ..CoreEvent::default()
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
        self.pod_series
            .retain(|_, (_, _, used)| used.elapsed() < RECORDER_TTL);
    }
}

/// The `action` of an event with `reason`: what the watchdog did to the object.
fn action_of(reason: &str) -> &'static str {
    match reason {
        REASON_POD_DELETED => "Delete",
        // Shadow mode acts on nothing: it compares.
        REASON_WOULD_DELETE_POD | REASON_AGREEMENT | REASON_DISAGREEMENT => "Compare",
        reason if reason.starts_with("Would") => "Compare",
        _ => "Scale",
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
    fn a_refusal_names_the_denied_verb_within_the_log_value_limit() {
        // The error of CI's failing run: the object name and the long Event name pushed
        // "cannot patch resource" past the cut of the whole error.
        let message = "events.events.k8s.io \"machine-controller-manager.18ebb7a4a3a3a35e\" is \
            forbidden: User \"system:serviceaccount:garden:dependency-watchdog-prober\" cannot \
            patch resource \"events\" in API group \"events.k8s.io\" in the namespace \
            \"shoot--rbac--restore\"";
        let refusal = EventError::Publish {
            reason: "ScaledUp",
            object: "Deployment shoot--rbac--restore/machine-controller-manager".into(),
            source: kube::Error::Api(
                kube::core::Status::failure(message, "Forbidden")
                    .with_code(403)
                    .boxed(),
            ),
        };
        assert!(refusal.refused());
        let denial = refusal.denial().expect("a 403 has a denial");
        let clause = r#"cannot patch resource "events" in API group "events.k8s.io""#;
        let end = denial.find(clause).expect("the denial names the verb") + clause.len();
        assert!(end <= crate::observe::logging::LOG_VALUE_LIMIT, "{end}");
        let timeout = EventError::Timeout {
            reason: "ScaledUp",
            object: "x".into(),
            timeout: PUBLISH_TIMEOUT,
        };
        assert_eq!(timeout.denial(), None);
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
            None,
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
    fn a_failing_kind_of_event_is_news_once_while_the_other_kind_is_written() {
        let mut failing = Failing::default();
        // Each event: its copy about our pod fails, its copy about the object is written.
        let news: Vec<bool> = (0..3)
            .flat_map(|_| {
                [
                    failing.record(Sink::OwnPod, false),
                    failing.record(Sink::Object, true),
                ]
            })
            .collect();
        assert_eq!(news, [true, false, false, false, false, false]);
        // Once written again, its next failure is news again; the other kind's first too.
        assert!(!failing.record(Sink::OwnPod, true));
        assert!(failing.record(Sink::OwnPod, false));
        assert!(failing.record(Sink::Object, false));
        assert!(!failing.record(Sink::Object, false));
    }

    #[test]
    fn a_disabled_handle_publishes_nothing_and_counts_nothing() {
        let m = metrics();
        Events::disabled(m.clone()).pod_deleted("ns", "p", "u", "s", "c");
        assert_eq!(count(&m, EventOutcome::Dropped), 0);
    }
}
