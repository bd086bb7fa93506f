//! One weeder: for `watchDuration` after its service came back, delete the service's
//! crash-looping dependants in the slice's namespace.
//!
//! Each pod selector gets its own watch (kube-runtime's `watcher`): one streaming list (a watch
//! that first sends the pods that already exist; list + watch on seeds without WatchList),
//! re-created when the server ends it, with back-off after errors. Deletions go ahead of
//! other seed requests in the client's budget. A pod is deleted when [`deletion_target`] says so. Deletes carry
//! the pod's UID as a precondition, so a pod that was re-created under the same name (a
//! StatefulSet's `etcd-main-0`) is never deleted on the strength of its predecessor's status.
//! Each deletion attempt has [`DELETE_TIMEOUT`]: the watch that found the pod waits for it.
//!
//! In shadow mode (`--shadow`, [`crate::shadow`]) a weeder decides the same but never deletes:
//! it reports the pod it would have deleted ([`Shadow::would`]), and each watch keeps a
//! [`DeletionSpotter`] to see the acting watchdog's deletions of crash-looping pods
//! ([`Shadow::reference_did`]), so the two can be compared.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use dwd_core::PodSelector;
use dwd_core::shadow::{ShadowAction, Side};
use dwd_core::weeder::{crashlooping_container, should_delete_pod};
use futures::{StreamExt, TryStreamExt};
use k8s_openapi::api::core::v1::Pod;
use kube::api::{DeleteParams, Preconditions};
use kube::runtime::watcher::{self, Event};
use kube::runtime::{WatchStreamExt, watcher as watch_pods};
use kube::{Api, Client};
use tokio_util::sync::CancellationToken;
use tracing::{debug, info, warn};

use super::claims::NamespaceClaims;
use crate::events::{Events, Subject};
use crate::metrics::{DeletionFailure, DeletionFailureLabels, Metrics, ServiceLabels};
use crate::rate_limit::{Priority, prioritized};
use crate::shadow::Shadow;

/// Attempts per pod deletion before the pod is left for a new list of its watch.
const DELETE_ATTEMPTS: u32 = 3;
/// Pause before a pod watch lists again after a deletion that failed all its attempts;
/// doubled after each further failure, back to this after a deletion that succeeds.
const FIRST_RETRY_PAUSE: Duration = Duration::from_secs(1);
/// The longest such pause.
const MAX_RETRY_PAUSE: Duration = Duration::from_secs(30);
/// Pause between deletion attempts (times the attempt number).
const DELETE_RETRY_PAUSE: Duration = Duration::from_millis(100);
/// How long one deletion attempt may take, waiting for the seed budget included. The pod's
/// watch waits for it, so a seed that never answers must not stall the weeder for good.
pub(crate) const DELETE_TIMEOUT: Duration = Duration::from_secs(10);

/// Why a deletion failed.
#[derive(Debug, thiserror::Error)]
enum DeleteError {
    /// The apiserver refused or the request failed.
    #[error(transparent)]
    Api(#[from] kube::Error),
    /// No answer within [`DELETE_TIMEOUT`].
    #[error("no answer within {0:?}")]
    TimedOut(Duration),
}

impl DeleteError {
    /// The failure's stable category: the `reason` label of
    /// `dwd_weeder_pod_deletion_failures_total`.
    fn category(&self) -> DeletionFailure {
        match self {
            DeleteError::TimedOut(_) => DeletionFailure::Timeout,
            DeleteError::Api(kube::Error::Api(s)) => match s.code {
                401 | 403 => DeletionFailure::Forbidden,
                429 => DeletionFailure::Throttled,
                500..=599 => DeletionFailure::ServerError,
                _ => DeletionFailure::Refused,
            },
            DeleteError::Api(_) => DeletionFailure::Transport,
        }
    }
}

/// One weeder: a slice of `service` in `namespace` turned ready.
pub struct Weeder {
    /// The slice's namespace: the only namespace this weeder touches.
    pub namespace: String,
    /// The EndpointSlice's name.
    pub slice: String,
    /// The service that came back.
    pub service: String,
    /// Selectors of the service's dependants.
    pub selectors: Arc<[PodSelector]>,
    /// How long the weeder lives.
    pub watch_duration: Duration,
    /// Seed client.
    pub client: Client,
    /// Process metrics (`pods_deleted`).
    pub metrics: Arc<Metrics>,
    /// Kubernetes Events: one per deleted pod (in shadow mode: about our own pod only).
    pub events: Events,
    /// Shadow mode: never delete, report what would have been and what the acting watchdog
    /// deleted; `None` in normal operation.
    pub shadow: Option<Arc<Shadow>>,
    /// The pods claimed by the weeders of `namespace` (one per slice: a dual-stack service has
    /// two), shared so that each pod gets one deletion ([`super::claims`]).
    pub claims: Arc<NamespaceClaims>,
}

/// A pod the weeder should delete, as read from the pod.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct DeletionTarget {
    /// Pod name.
    pub name: String,
    /// Pod UID (delete precondition).
    pub uid: String,
    /// The container waiting in `CrashLoopBackOff`.
    pub container: String,
}

/// Whether the weeder of `namespace` with `selector` deletes `pod`: it must crash-loop without
/// being deleted already (`dwd_core`'s rule), and — because deleting is not undoable — also
/// be in `namespace` and match `selector`, although the watch asked the server for exactly
/// that; a pod without name or UID cannot be deleted safely and is left alone.
pub(crate) fn deletion_target(
    pod: &Pod,
    namespace: &str,
    selector: &PodSelector,
) -> Option<DeletionTarget> {
    let meta = &pod.metadata;
    if !in_scope(pod, namespace, selector) {
        return None;
    }
    let container = should_delete_pod(pod)?;
    Some(DeletionTarget {
        name: meta.name.clone()?,
        uid: meta.uid.clone()?,
        container,
    })
}

/// Whether `pod` is in `namespace` and matches `selector`.
fn in_scope(pod: &Pod, namespace: &str, selector: &PodSelector) -> bool {
    let meta = &pod.metadata;
    let empty = std::collections::BTreeMap::new();
    meta.namespace.as_deref() == Some(namespace)
        && selector.matches(meta.labels.as_ref().unwrap_or(&empty))
}

/// A deletion of a crash-looping pod seen by a shadow weeder's watch: in shadow mode we delete
/// nothing, so this is what the acting watchdog (or someone else) did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct SeenDeletion {
    /// Pod name.
    pub name: String,
    /// Pod UID.
    pub uid: String,
    /// What was seen, for the comparison's record.
    pub evidence: String,
    /// Set when the acting watchdog was faster than our watch: the pod was deleted after our
    /// weeder started but before our watch first listed it, so our list showed it crash-looping
    /// and already terminating. Our weeder, acting, would have deleted it: the crash-looping
    /// container, for our would-be deletion.
    pub(crate) raced: Option<String>,
}

/// Slack for comparing the apiserver's `deletionTimestamp` (whole seconds, its clock) with
/// our weeder's start (our clock), when telling a deletion that raced our first list from an
/// older one.
pub(crate) const RACE_SLACK_SECONDS: i64 = 2;

/// What a shadow weeder's watch remembers of a pod it saw crash-looping or terminating.
#[derive(Debug, Clone)]
struct SeenPod {
    name: String,
    /// The container waiting in `CrashLoopBackOff` when last seen, if any.
    crashlooping: Option<String>,
    /// Whether the pod was seen with `deletionTimestamp` (its deletion reported then, or it
    /// was terminating already when first seen).
    terminating: bool,
}

/// Spots, from one pod watch's events, the deletions of pods last seen crash-looping: a
/// `deletionTimestamp` appearing (graceful deletion), a watch `Delete` of a pod still matching
/// the selector (a pod that merely stopped matching is not a deletion), or — after the watch
/// lost its place — a crash-looping pod missing from the new list.
///
/// Keeps only pods last seen crash-looping or terminating (a healthy pod's deletion is nobody's
/// weeding), each until its `Delete`: memory is bounded by the crash-looping pods the watch
/// saw, and dropped with the weeder. A pod first seen terminating is reported only when the
/// watch's first list shows it crash-looping and deleted since the weeder started (the acting
/// watchdog's weeder started on the same slice event and was faster, see
/// [`SeenDeletion::raced`]); otherwise when and by whom it was deleted is unknown.
#[derive(Debug)]
pub(crate) struct DeletionSpotter {
    /// The weeder's shoot namespace.
    namespace: String,
    /// The weeder's dependants.
    selector: PodSelector,
    pods: HashMap<String, SeenPod>,
    /// UIDs listed since a (re-)list began; `None` outside a list.
    listed: Option<HashSet<String>>,
    /// Whether the watch's first list is through.
    listed_once: bool,
    /// When the weeder started, in seconds since the Unix epoch.
    started: i64,
}

impl DeletionSpotter {
    /// A spotter for a weeder of the pods `selector` selects in `namespace`, started at
    /// `started` (seconds since the Unix epoch).
    pub fn new(started: i64, namespace: &str, selector: &PodSelector) -> Self {
        DeletionSpotter {
            namespace: namespace.to_string(),
            selector: selector.clone(),
            pods: HashMap::new(),
            listed: None,
            listed_once: false,
            started,
        }
    }

    /// Whether `pod` (terminating) was deleted after the weeder started: its deletionTimestamp
    /// is the deletion's time plus its grace period.
    fn deleted_since_start(&self, pod: &Pod) -> bool {
        let meta = &pod.metadata;
        let Some(at) = &meta.deletion_timestamp else {
            return false;
        };
        let grace = meta.deletion_grace_period_seconds.unwrap_or(0);
        at.0.as_second().saturating_sub(grace) >= self.started.saturating_sub(RACE_SLACK_SECONDS)
    }

    /// The watch reported `pod` (added, changed, or listed): a deletion if it now shows
    /// `deletionTimestamp` for the first time and was last seen crash-looping.
    pub fn applied(&mut self, pod: &Pod) -> Option<SeenDeletion> {
        let meta = &pod.metadata;
        let (name, uid) = (meta.name.as_ref()?, meta.uid.as_ref()?);
        if let Some(listed) = self.listed.as_mut() {
            listed.insert(uid.clone());
        }
        if !in_scope(pod, &self.namespace, &self.selector) {
            self.pods.remove(uid);
            return None;
        }
        let crashlooping = crashlooping_container(pod);
        let terminating = meta.deletion_timestamp.is_some();
        let previous = if crashlooping.is_some() || terminating {
            self.pods.insert(
                uid.clone(),
                SeenPod {
                    name: name.clone(),
                    crashlooping: crashlooping.clone(),
                    terminating,
                },
            )
        } else {
            self.pods.remove(uid)
        };
        let Some(previous) = previous else {
            // First sight. Terminating and crash-looping in the watch's first list, deleted
            // since the weeder started: the acting watchdog was faster than our list.
            let raced = terminating
                && self.listed.is_some()
                && !self.listed_once
                && self.deleted_since_start(pod);
            let container = crashlooping.filter(|_| raced)?;
            return Some(SeenDeletion {
                name: name.clone(),
                uid: uid.clone(),
                evidence: format!(
                    "pod deleted (by the acting weeder or anyone else: the pod does not say) while container {container} was in CrashLoopBackOff, before our weeder's first list (deletionTimestamp {}, grace period {} s)",
                    meta.deletion_timestamp
                        .as_ref()
                        .map(|t| t.0.to_string())
                        .unwrap_or_default(),
                    meta.deletion_grace_period_seconds.unwrap_or(0)
                ),
                raced: Some(container),
            });
        };
        if !terminating || previous.terminating {
            return None;
        }
        // The state before the deletion is what the deleter saw.
        let container = previous.crashlooping.or(crashlooping)?;
        let at = meta
            .deletion_timestamp
            .as_ref()
            .map(|t| t.0.to_string())
            .unwrap_or_default();
        Some(SeenDeletion {
            name: name.clone(),
            uid: uid.clone(),
            evidence: format!(
                "pod deleted (by the acting weeder or anyone else: the pod does not say) while container {container} was in CrashLoopBackOff (deletionTimestamp {at})"
            ),
            raced: None,
        })
    }

    /// The watch reported `pod` gone: a deletion if the pod still matches the selector, was
    /// last seen crash-looping, and its deletion was not seen before (`deletionTimestamp`).
    pub fn deleted(&mut self, pod: &Pod) -> Option<SeenDeletion> {
        let meta = &pod.metadata;
        let (name, uid) = (meta.name.as_ref()?, meta.uid.as_ref()?);
        let previous = self.pods.remove(uid);
        // A label change out of the selector also ends the pod's watch with a `Delete`, which
        // carries the pod as it is now: still there, just no longer ours.
        if !in_scope(pod, &self.namespace, &self.selector) {
            return None;
        }
        if previous.as_ref().is_some_and(|p| p.terminating) {
            return None;
        }
        let container = previous
            .and_then(|p| p.crashlooping)
            .or_else(|| crashlooping_container(pod))?;
        let at = match &meta.deletion_timestamp {
            Some(t) => format!(" (deletionTimestamp {})", t.0),
            None => String::new(),
        };
        Some(SeenDeletion {
            name: name.clone(),
            uid: uid.clone(),
            evidence: format!(
                "pod deleted (by the acting weeder or anyone else: the pod does not say) while container {container} was in CrashLoopBackOff{at}"
            ),
            raced: None,
        })
    }

    /// A (re-)list of the watch begins.
    pub(crate) fn begin_list(&mut self) {
        self.listed = Some(HashSet::new());
    }

    /// The (re-)list is complete: pods last seen crash-looping that it did not report went away
    /// while the watch was away.
    pub(crate) fn end_list(&mut self) -> Vec<SeenDeletion> {
        let Some(listed) = self.listed.take() else {
            return Vec::new();
        };
        self.listed_once = true;
        let gone: Vec<String> = self
            .pods
            .keys()
            .filter(|uid| !listed.contains(*uid))
            .cloned()
            .collect();
        gone.into_iter()
            .filter_map(|uid| {
                let pod = self.pods.remove(&uid)?;
                if pod.terminating {
                    return None;
                }
                let container = pod.crashlooping?;
                Some(SeenDeletion {
                    name: pod.name,
                    uid,
                    evidence: format!(
                        "pod gone (deleted, or no longer matching the selector) when the watch listed again; last seen with container {container} in CrashLoopBackOff"
                    ),
                    raced: None,
                })
            })
            .collect()
    }

    #[cfg(test)]
    /// Pods remembered.
    pub fn len(&self) -> usize {
        self.pods.len()
    }

    #[cfg(test)]
    /// Whether no pod is remembered.
    pub fn is_empty(&self) -> bool {
        self.pods.is_empty()
    }
}

/// How one deletion ended.
#[derive(Debug)]
enum Deleted {
    /// The apiserver accepted the delete.
    Now,
    /// The pod (with that UID) was gone already.
    AlreadyGone,
}

/// The weeder's pods in its namespace, once per priority of its requests.
struct PodApis {
    /// For the watches, at `Priority::WEEDER_POD_WATCHES` (a budget of their own).
    watch: Api<Pod>,
    /// For the deletions, at `Priority::WEEDER_DELETE`.
    delete: Api<Pod>,
}

impl Weeder {
    /// `namespace/slice`: the registry key.
    pub fn key(&self) -> String {
        format!("{}/{}", self.namespace, self.slice)
    }

    /// Runs until `watchDuration` passed or `cancel` fired.
    pub async fn run(self, cancel: CancellationToken) {
        info!(watch_duration = ?self.watch_duration, selectors = self.selectors.len(), "weeder started");
        // The watches' requests (their start, re-watches) go on the pod watches' own budget;
        // deleting is what the weeder is for: ahead of other seed requests in the budget.
        let apis = PodApis {
            watch: Api::namespaced(
                prioritized(&self.client, Priority::WEEDER_POD_WATCHES),
                &self.namespace,
            ),
            delete: Api::namespaced(
                prioritized(&self.client, Priority::WEEDER_DELETE),
                &self.namespace,
            ),
        };
        // Shadow mode: deletions since this tell the acting watchdog's weeder racing ours.
        let started_unix = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| i64::try_from(d.as_secs()).unwrap_or(i64::MAX));
        let watches = futures::future::join_all(
            self.selectors
                .iter()
                .map(|selector| self.watch_selector(&apis, selector, started_unix)),
        );
        tokio::select! {
            _ = tokio::time::sleep(self.watch_duration) => info!("weeder ended: watch duration passed"),
            _ = cancel.cancelled() => info!("weeder stopped: replaced or shutting down"),
            _ = watches => warn!("weeder ended: its pod watches ended"),
        }
    }

    async fn watch_selector(&self, apis: &PodApis, selector: &PodSelector, started_unix: i64) {
        let query = selector.to_query();
        // Only in shadow mode: normal operation keeps nothing per pod.
        let mut spotter = self
            .shadow
            .is_some()
            .then(|| DeletionSpotter::new(started_unix, &self.namespace, selector));
        let config = |streaming: bool| {
            let config = watcher::Config::default().labels(&query);
            // A streaming list (one watch request with `sendInitialEvents`) instead of a list
            // and then a watch: in a storm every weeder starts at once and the seed budget is
            // shared. Seeds whose apiserver lacks WatchList get list + watch.
            if streaming {
                config.streaming_lists()
            } else {
                config
            }
        };
        let mut streaming = !STREAMING_LISTS_REJECTED.load(Ordering::Relaxed);
        let mut events = watch_pods(apis.watch.clone(), config(streaming))
            .default_backoff()
            .boxed();
        let mut retry_pause = FIRST_RETRY_PAUSE;
        loop {
            let next = events.try_next().await;
            let event = match next {
                Ok(Some(event)) => event,
                Ok(None) => return,
                Err(e) if streaming && rejects_streaming_lists(&e) => {
                    warn!(selector = %query, error = %e, "the seed rejects streaming lists (WatchList); using list + watch");
                    STREAMING_LISTS_REJECTED.store(true, Ordering::Relaxed);
                    streaming = false;
                    events = watch_pods(apis.watch.clone(), config(false))
                        .default_backoff()
                        .boxed();
                    continue;
                }
                Err(e) => {
                    // default_backoff() already delays the retry; just report it.
                    warn!(selector = %query, error = %e, "pod watch failed, retrying");
                    continue;
                }
            };
            let pod = match event {
                Event::Apply(pod) | Event::InitApply(pod) => pod,
                Event::Init => {
                    if let Some(spotter) = spotter.as_mut() {
                        spotter.begin_list();
                    }
                    continue;
                }
                Event::InitDone => {
                    if let Some(spotter) = spotter.as_mut() {
                        for seen in spotter.end_list() {
                            self.reference_deleted(seen);
                        }
                    }
                    continue;
                }
                Event::Delete(pod) => {
                    if let Some(seen) = spotter.as_mut().and_then(|s| s.deleted(&pod)) {
                        self.reference_deleted(seen);
                    }
                    continue;
                }
            };
            if let Some(seen) = spotter.as_mut().and_then(|s| s.applied(&pod)) {
                let raced = seen
                    .raced
                    .clone()
                    .map(|c| (seen.name.clone(), seen.uid.clone(), c));
                self.reference_deleted(seen);
                // The acting watchdog was first; ours would have deleted the pod it listed.
                // Claimed (and kept) like a deletion: once per pod, whichever weeder of the
                // namespace and whichever selector's watch saw it.
                if let (Some(shadow), Some((name, uid, container))) = (&self.shadow, raced)
                    && let Some(claim) = self.claims.claim(&uid)
                {
                    claim.keep();
                    self.would_delete(
                        shadow,
                        &name,
                        &uid,
                        &format!(
                            "container {container} in CrashLoopBackOff when our weeder first listed the pod (already deleted by then); service {} is ready again (selector {query})",
                            self.service
                        ),
                    );
                }
            }
            let Some(target) = deletion_target(&pod, &self.namespace, selector) else {
                continue;
            };
            // Two selectors, or the weeders of two slices of one service (dual-stack), may
            // pick the same pod, and a deleted pod keeps sending events (deletionTimestamp,
            // finalizers) until it is gone: only the claim's holder deletes it.
            let Some(claim) = self.claims.claim(&target.uid) else {
                continue;
            };
            if let Some(shadow) = &self.shadow {
                claim.keep();
                // Decided exactly as in normal operation; reported instead of done.
                self.would_delete(
                    shadow,
                    &target.name,
                    &target.uid,
                    &format!(
                        "container {} in CrashLoopBackOff; service {} is ready again (selector {query})",
                        target.container, self.service
                    ),
                );
                continue;
            }
            match delete_pod(&apis.delete, &target).await {
                Ok(Deleted::Now) => {
                    claim.keep();
                    retry_pause = FIRST_RETRY_PAUSE;
                    self.metrics
                        .pods_deleted
                        .get_or_create(&ServiceLabels {
                            service: self.service.clone(),
                        })
                        .inc();
                    info!(
                        namespace = %self.namespace,
                        pod = %target.name,
                        service = %self.service,
                        selector = %query,
                        container = %target.container,
                        "deleted crash-looping pod so it restarts now that its dependency is back"
                    );
                    // The pod is gone, but its event lives on in the namespace, found by
                    // name and UID.
                    self.events.pod_deleted(
                        &self.namespace,
                        &target.name,
                        &target.uid,
                        &self.service,
                        &target.container,
                    );
                }
                Ok(Deleted::AlreadyGone) => {
                    claim.keep();
                    debug!(pod = %target.name, "crash-looping pod already gone");
                }
                Err(e) => {
                    self.metrics
                        .pod_deletion_failures
                        .get_or_create(&DeletionFailureLabels {
                            service: self.service.clone(),
                            reason: e.category(),
                        })
                        .inc();
                    // Released, so that it is tried again (by this watch's new list, or by
                    // another weeder of the namespace).
                    drop(claim);
                    warn!(
                        namespace = %self.namespace,
                        pod = %target.name,
                        service = %self.service,
                        selector = %query,
                        error = %e,
                        retry_in = ?retry_pause,
                        "deleting crash-looping pod failed"
                    );
                    // An unchanged pod sends no new event, and a watch that resumes after a
                    // short seed outage does not list again: without a new list the retry
                    // would wait for the pod's next crash-loop restart (up to 5 min). A new
                    // watch lists; the growing pause keeps a deletion that keeps failing
                    // (e.g. forbidden) from turning into a list-and-delete loop.
                    tokio::time::sleep(retry_pause).await;
                    retry_pause = (retry_pause * 2).min(MAX_RETRY_PAUSE);
                    events = watch_pods(apis.watch.clone(), config(streaming))
                        .default_backoff()
                        .boxed();
                }
            }
        }
    }
}

impl Weeder {
    /// Shadow mode: we would have deleted the pod `name` (`uid`), because `evidence`.
    fn would_delete(&self, shadow: &Shadow, name: &str, uid: &str, evidence: &str) {
        shadow.record(
            Side::Ours,
            &self.events,
            &Subject::Pod {
                namespace: &self.namespace,
                name,
                uid,
            },
            ShadowAction::DeletePod,
            evidence,
        );
    }

    /// Shadow mode: the acting watchdog deleted a crash-looping pod (reported once per UID).
    fn reference_deleted(&self, seen: SeenDeletion) {
        let Some(shadow) = &self.shadow else {
            return;
        };
        if !self.claims.first_report(&seen.uid) {
            return;
        }
        shadow.record(
            Side::Reference,
            &self.events,
            &Subject::Pod {
                namespace: &self.namespace,
                name: &seen.name,
                uid: &seen.uid,
            },
            ShadowAction::DeletePod,
            &seen.evidence,
        );
    }
}

/// Deletes `target` (UID precondition) through `api` (at `Priority::WEEDER_DELETE`), each
/// attempt limited to [`DELETE_TIMEOUT`].
async fn delete_pod(api: &Api<Pod>, target: &DeletionTarget) -> Result<Deleted, DeleteError> {
    let params = DeleteParams {
        preconditions: Some(Preconditions {
            uid: Some(target.uid.clone()),
            resource_version: None,
        }),
        ..DeleteParams::default()
    };
    let mut attempt = 1;
    loop {
        let deleting = api.delete(&target.name, &params);
        let result = match tokio::time::timeout(DELETE_TIMEOUT, deleting).await {
            Ok(answer) => answer.map_err(DeleteError::from),
            Err(_) => Err(DeleteError::TimedOut(DELETE_TIMEOUT)),
        };
        match result {
            Ok(_) => return Ok(Deleted::Now),
            // 404: gone; 409: the UID precondition failed, so the pod we saw is gone and
            // a new one took its name.
            Err(DeleteError::Api(kube::Error::Api(s))) if s.code == 404 || s.code == 409 => {
                return Ok(Deleted::AlreadyGone);
            }
            Err(e) if attempt < DELETE_ATTEMPTS => {
                debug!(pod = %target.name, attempt, error = %e, "delete failed, retrying");
                tokio::time::sleep(DELETE_RETRY_PAUSE * attempt).await;
                attempt += 1;
            }
            Err(e) => return Err(e),
        }
    }
}

/// Set once the seed answered a streaming list with "bad request"/"invalid" (an apiserver
/// without the WatchList feature): every later pod watch of the process lists, then watches.
static STREAMING_LISTS_REJECTED: AtomicBool = AtomicBool::new(false);

/// Whether `e` is the seed refusing a streaming list (400 or 422), not a passing failure.
fn rejects_streaming_lists(e: &watcher::Error) -> bool {
    let code = match e {
        watcher::Error::WatchStartFailed(kube::Error::Api(s))
        | watcher::Error::InitialListFailed(kube::Error::Api(s))
        | watcher::Error::WatchFailed(kube::Error::Api(s)) => s.code,
        watcher::Error::WatchError(s) => s.code,
        _ => return false,
    };
    matches!(code, 400 | 422)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_failed_deletion_counts_in_its_stable_category() {
        let api = |code: u16| {
            let status = kube::core::Status::failure("no", "Reason").with_code(code);
            DeleteError::Api(kube::Error::Api(status.boxed()))
        };
        let cases = [
            (
                DeleteError::TimedOut(DELETE_TIMEOUT),
                DeletionFailure::Timeout,
            ),
            (api(403), DeletionFailure::Forbidden),
            (api(401), DeletionFailure::Forbidden),
            (api(429), DeletionFailure::Throttled),
            (api(500), DeletionFailure::ServerError),
            (api(503), DeletionFailure::ServerError),
            (api(422), DeletionFailure::Refused),
            (
                DeleteError::Api(kube::Error::LinesCodecMaxLineLengthExceeded),
                DeletionFailure::Transport,
            ),
        ];
        for (error, category) in cases {
            assert_eq!(error.category(), category, "{error}");
        }
    }

    #[tokio::test(start_paused = true)]
    async fn a_deletion_the_seed_never_answers_gives_up_after_its_timeouts() {
        let never = tower::service_fn(|_req: http::Request<kube::client::Body>| {
            std::future::pending::<Result<http::Response<kube::client::Body>, std::io::Error>>()
        });
        let api: Api<Pod> = Api::namespaced(Client::new(never, "default"), "shoot--p--s");
        let target = DeletionTarget {
            name: "kube-apiserver-0".into(),
            uid: "uid".into(),
            container: "kube-apiserver".into(),
        };
        let started = tokio::time::Instant::now();
        // Bounded by the test, so a deletion without timeout fails here instead of hanging.
        let result =
            tokio::time::timeout(Duration::from_secs(600), delete_pod(&api, &target)).await;
        let Ok(Err(DeleteError::TimedOut(t))) = result else {
            panic!("expected a timed-out deletion, got {result:?}");
        };
        assert_eq!(t, DELETE_TIMEOUT);
        // Three attempts of 10 s, with pauses of 100 and 200 ms between them.
        assert_eq!(
            started.elapsed(),
            DELETE_TIMEOUT * DELETE_ATTEMPTS + Duration::from_millis(300)
        );
    }
    use dwd_core::selector::RawRequirement;
    use k8s_openapi::api::core::v1::{
        ContainerState, ContainerStateWaiting, ContainerStatus, PodStatus,
    };
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, Time};
    use k8s_openapi::jiff::Timestamp;
    use std::collections::BTreeMap;

    fn selector() -> PodSelector {
        PodSelector::new(
            BTreeMap::new(),
            vec![RawRequirement {
                key: "role".into(),
                operator: "In".into(),
                values: Some(vec!["apiserver".into()]),
            }],
        )
        .expect("valid selector")
    }

    fn pod(ns: &str, role: &str, reason: &str) -> Pod {
        Pod {
            metadata: ObjectMeta {
                name: Some("kube-apiserver-abc".into()),
                namespace: Some(ns.into()),
                uid: Some("uid-1".into()),
                labels: Some(BTreeMap::from([("role".into(), role.into())])),
                ..Default::default()
            },
            status: Some(PodStatus {
                container_statuses: Some(vec![ContainerStatus {
                    name: "kube-apiserver".into(),
                    state: Some(ContainerState {
                        waiting: Some(ContainerStateWaiting {
                            reason: Some(reason.into()),
                            ..Default::default()
                        }),
                        ..Default::default()
                    }),
                    ..Default::default()
                }]),
                ..Default::default()
            }),
            ..Default::default()
        }
    }

    #[test]
    fn crashlooping_matching_pod_in_namespace_is_a_target() {
        let got = deletion_target(
            &pod("shoot--a", "apiserver", "CrashLoopBackOff"),
            "shoot--a",
            &selector(),
        );
        assert_eq!(
            got,
            Some(DeletionTarget {
                name: "kube-apiserver-abc".into(),
                uid: "uid-1".into(),
                container: "kube-apiserver".into(),
            })
        );
    }

    #[test]
    fn pods_that_are_not_targets() {
        let crashlooping = |ns| pod(ns, "apiserver", "CrashLoopBackOff");
        let changed = |change: fn(&mut Pod)| {
            let mut p = crashlooping("shoot--a");
            change(&mut p);
            p
        };
        let cases = [
            ("of another namespace", crashlooping("shoot--b")),
            (
                "without a namespace",
                changed(|p| p.metadata.namespace = None),
            ),
            (
                "not matching the selector",
                pod("shoot--a", "etcd", "CrashLoopBackOff"),
            ),
            ("without labels", changed(|p| p.metadata.labels = None)),
            ("healthy", pod("shoot--a", "apiserver", "ContainerCreating")),
            ("terminating", terminating(crashlooping("shoot--a"))),
            // Left alone: it can't be deleted with a uid precondition.
            ("without a uid", changed(|p| p.metadata.uid = None)),
        ];
        for (what, p) in cases {
            assert_eq!(deletion_target(&p, "shoot--a", &selector()), None, "{what}");
        }
    }

    fn terminating(mut p: Pod) -> Pod {
        p.metadata.deletion_timestamp = Some(Time(Timestamp::UNIX_EPOCH));
        p
    }

    #[test]
    fn a_deletion_timestamp_on_a_crashlooping_pod_is_seen_once() {
        let mut s = DeletionSpotter::new(0, "shoot--a", &selector());
        let crashing = pod("shoot--a", "apiserver", "CrashLoopBackOff");
        assert_eq!(s.applied(&crashing), None);
        assert_eq!(s.applied(&crashing), None);
        let seen = s
            .applied(&terminating(crashing.clone()))
            .expect("a deletion");
        assert_eq!(
            (seen.name.as_str(), seen.uid.as_str()),
            ("kube-apiserver-abc", "uid-1")
        );
        assert!(
            seen.evidence.starts_with(
                "pod deleted (by the acting weeder or anyone else: the pod does not say) while container kube-apiserver was in CrashLoopBackOff (deletionTimestamp 1970-01-01"
            ),
            "{}",
            seen.evidence
        );
        // Further updates of the terminating pod and its final removal are the same deletion.
        assert_eq!(s.applied(&terminating(crashing.clone())), None);
        assert_eq!(s.deleted(&terminating(crashing)), None);
        assert!(s.is_empty());
    }

    #[test]
    fn an_immediate_delete_of_a_crashlooping_pod_is_seen() {
        let mut s = DeletionSpotter::new(0, "shoot--a", &selector());
        let crashing = pod("shoot--a", "apiserver", "CrashLoopBackOff");
        s.applied(&crashing);
        assert_eq!(s.len(), 1);
        let seen = s.deleted(&crashing).expect("a deletion");
        assert_eq!(
            seen.evidence,
            "pod deleted (by the acting weeder or anyone else: the pod does not say) while container kube-apiserver was in CrashLoopBackOff"
        );
        assert!(s.is_empty());
    }

    #[test]
    fn healthy_relabelled_or_already_terminating_pods_are_not_deletions_to_compare() {
        let mut s = DeletionSpotter::new(0, "shoot--a", &selector());
        // Healthy when deleted: nobody's weeding; not even remembered.
        let healthy = pod("shoot--a", "apiserver", "ContainerCreating");
        assert_eq!(s.applied(&healthy), None);
        assert!(s.is_empty());
        assert_eq!(s.applied(&terminating(healthy.clone())), None);
        assert_eq!(s.deleted(&terminating(healthy)), None);
        // Crash-looping, then recovered, then deleted.
        s.applied(&pod("shoot--a", "apiserver", "CrashLoopBackOff"));
        let recovered = pod("shoot--a", "apiserver", "ContainerCreating");
        s.applied(&recovered);
        assert!(s.is_empty());
        assert_eq!(s.deleted(&recovered), None);
        // Crash-looping, then relabelled out of the selector: the watch's Delete carries the
        // pod as it is now.
        s.applied(&pod("shoot--a", "apiserver", "CrashLoopBackOff"));
        let relabelled = pod("shoot--a", "etcd", "CrashLoopBackOff");
        assert_eq!(s.deleted(&relabelled), None);
        assert!(s.is_empty());
        // First seen terminating: when and by whom it was deleted is unknown.
        let old = terminating(pod("shoot--a", "apiserver", "CrashLoopBackOff"));
        assert_eq!(s.applied(&old), None);
        assert_eq!(s.deleted(&old), None);
        assert!(s.is_empty());
    }

    /// `p` with deletionTimestamp at `second` and a grace period of `grace` seconds.
    fn deleted_at(mut p: Pod, second: i64, grace: i64) -> Pod {
        p.metadata.deletion_timestamp =
            Some(Time(Timestamp::from_second(second).expect("valid second")));
        p.metadata.deletion_grace_period_seconds = Some(grace);
        p
    }

    #[test]
    fn a_deletion_that_raced_the_first_list_is_seen_with_what_we_would_have_done() {
        let crashing = || pod("shoot--a", "apiserver", "CrashLoopBackOff");
        let in_first_list = |p: Pod| {
            let mut s = DeletionSpotter::new(1_000, "shoot--a", &selector());
            s.begin_list();
            let seen = s.applied(&p);
            (s, seen)
        };
        // Deleted at 1005 (no grace), or at 1000 with 30 s of grace: after the weeder started.
        for p in [
            deleted_at(crashing(), 1_005, 0),
            deleted_at(crashing(), 1_030, 30),
        ] {
            let (mut s, seen) = in_first_list(p.clone());
            let seen = seen.expect("a deletion that raced our list");
            assert_eq!(seen.raced.as_deref(), Some("kube-apiserver"));
            assert!(
                seen.evidence.contains("before our weeder's first list"),
                "{seen:?}"
            );
            // Its further updates and its removal are the same deletion.
            assert_eq!(s.applied(&p), None);
            assert_eq!(s.end_list(), Vec::new());
            assert_eq!(s.deleted(&p), None);
        }
        // Deleted long before the weeder started (a stuck finalizer), or healthy: not ours to
        // compare.
        assert_eq!(in_first_list(deleted_at(crashing(), 990, 0)).1, None);
        let healthy = pod("shoot--a", "apiserver", "ContainerCreating");
        assert_eq!(in_first_list(deleted_at(healthy, 1_005, 0)).1, None);
        // After the first list, a pod first seen terminating tells nothing about who was first.
        let mut s = DeletionSpotter::new(1_000, "shoot--a", &selector());
        s.begin_list();
        s.end_list();
        let late = deleted_at(crashing(), 1_005, 0);
        assert_eq!(s.applied(&late), None);
    }

    #[test]
    fn a_crashlooping_pod_missing_from_a_relist_was_deleted_meanwhile() {
        let mut s = DeletionSpotter::new(0, "shoot--a", &selector());
        s.begin_list();
        let mut other = pod("shoot--a", "apiserver", "CrashLoopBackOff");
        other.metadata.name = Some("kube-apiserver-def".into());
        other.metadata.uid = Some("uid-2".into());
        s.applied(&pod("shoot--a", "apiserver", "CrashLoopBackOff"));
        s.applied(&other);
        assert_eq!(s.end_list(), Vec::new());
        // The watch lost its place; meanwhile uid-1 went away.
        s.begin_list();
        s.applied(&other);
        let gone = s.end_list();
        assert_eq!(gone.len(), 1, "{gone:?}");
        assert_eq!(gone[0].uid, "uid-1");
        assert!(
            gone[0].evidence.contains("container kube-apiserver"),
            "{:?}",
            gone[0]
        );
        assert_eq!(s.len(), 1);
        // Outside a list nothing is concluded from absence.
        assert_eq!(s.end_list(), Vec::new());
    }

    #[test]
    fn only_a_refused_streaming_list_switches_to_list_and_watch() {
        let status = |code: u16| {
            Box::new(kube::core::Status {
                code,
                ..kube::core::Status::default()
            })
        };
        assert!(rejects_streaming_lists(&watcher::Error::WatchError(
            status(400)
        )));
        assert!(rejects_streaming_lists(&watcher::Error::WatchStartFailed(
            kube::Error::Api(status(422))
        )));
        // Forbidden, gone, server trouble: retried as they are.
        for code in [403, 410, 500, 503] {
            assert!(
                !rejects_streaming_lists(&watcher::Error::WatchError(status(code))),
                "{code}"
            );
        }
        assert!(!rejects_streaming_lists(&watcher::Error::NoResourceVersion));
    }
}
