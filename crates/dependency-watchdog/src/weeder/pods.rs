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

use std::collections::HashSet;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use dwd_core::PodSelector;
use dwd_core::weeder::should_delete_pod;
use futures::{StreamExt, TryStreamExt};
use k8s_openapi::api::core::v1::Pod;
use kube::api::{DeleteParams, Preconditions};
use kube::runtime::watcher::{self, Event};
use kube::runtime::{WatchStreamExt, watcher as watch_pods};
use kube::{Api, Client};
use tokio_util::sync::CancellationToken;
use tracing::{debug, info, warn};

use crate::events::Events;
use crate::metrics::{Metrics, ServiceLabels};
use crate::rate_limit::{Priority, prioritized};

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
pub const DELETE_TIMEOUT: Duration = Duration::from_secs(10);

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
    /// Kubernetes Events: one per deleted pod.
    pub events: Events,
}

/// A pod the weeder should delete, as read from the pod.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeletionTarget {
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
pub fn deletion_target(
    pod: &Pod,
    namespace: &str,
    selector: &PodSelector,
) -> Option<DeletionTarget> {
    let meta = &pod.metadata;
    if meta.namespace.as_deref() != Some(namespace) {
        return None;
    }
    let empty = std::collections::BTreeMap::new();
    if !selector.matches(meta.labels.as_ref().unwrap_or(&empty)) {
        return None;
    }
    let container = should_delete_pod(pod)?;
    Some(DeletionTarget {
        name: meta.name.clone()?,
        uid: meta.uid.clone()?,
        container,
    })
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
        // UIDs this weeder deleted or is deleting: two selectors may pick the same pod, and a
        // deleted pod keeps sending events (deletionTimestamp, finalizers) until it is gone.
        let handled = Mutex::new(HashSet::<String>::new());
        let watches = futures::future::join_all(
            self.selectors
                .iter()
                .map(|selector| self.watch_selector(&apis, selector, &handled)),
        );
        tokio::select! {
            _ = tokio::time::sleep(self.watch_duration) => info!("weeder ended: watch duration passed"),
            _ = cancel.cancelled() => info!("weeder stopped: replaced or shutting down"),
            _ = watches => warn!("weeder ended: its pod watches ended"),
        }
    }

    async fn watch_selector(
        &self,
        apis: &PodApis,
        selector: &PodSelector,
        handled: &Mutex<HashSet<String>>,
    ) {
        let query = selector.to_query();
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
                Event::Init | Event::InitDone | Event::Delete(_) => continue,
            };
            let Some(target) = deletion_target(&pod, &self.namespace, selector) else {
                continue;
            };
            if !lock(handled).insert(target.uid.clone()) {
                continue;
            }
            match delete_pod(&apis.delete, &target).await {
                Ok(Deleted::Now) => {
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
                    debug!(pod = %target.name, "crash-looping pod already gone");
                }
                Err(e) => {
                    // Forget it, so that it is tried again.
                    lock(handled).remove(&target.uid);
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

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

#[cfg(test)]
mod tests {
    use super::*;

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
    fn pod_of_another_namespace_is_never_a_target() {
        let p = pod("shoot--b", "apiserver", "CrashLoopBackOff");
        assert_eq!(deletion_target(&p, "shoot--a", &selector()), None);
        let mut p = p;
        p.metadata.namespace = None;
        assert_eq!(deletion_target(&p, "shoot--a", &selector()), None);
    }

    #[test]
    fn pod_not_matching_the_selector_is_not_a_target() {
        let p = pod("shoot--a", "etcd", "CrashLoopBackOff");
        assert_eq!(deletion_target(&p, "shoot--a", &selector()), None);
        let mut p = p;
        p.metadata.labels = None;
        assert_eq!(deletion_target(&p, "shoot--a", &selector()), None);
    }

    #[test]
    fn healthy_or_terminating_pod_is_not_a_target() {
        let p = pod("shoot--a", "apiserver", "ContainerCreating");
        assert_eq!(deletion_target(&p, "shoot--a", &selector()), None);
        let mut p = pod("shoot--a", "apiserver", "CrashLoopBackOff");
        p.metadata.deletion_timestamp = Some(Time(Timestamp::UNIX_EPOCH));
        assert_eq!(deletion_target(&p, "shoot--a", &selector()), None);
    }

    #[test]
    fn pod_without_uid_is_left_alone() {
        let mut p = pod("shoot--a", "apiserver", "CrashLoopBackOff");
        p.metadata.uid = None;
        assert_eq!(deletion_target(&p, "shoot--a", &selector()), None);
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
