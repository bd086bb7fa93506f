//! The weeder's watches as steppers: their events in, what to do next out.
//!
//! - [`SliceWatch`] (docs/behaviour.md §3.2): the EndpointSlice watch's events in, "start a
//!   weeder for this slice" out.
//! - [`PodWatch`] (§3.3): one pod watch of a weeder: the watch's pods and the answers to its
//!   deletions in, what to do next out — delete a pod, wait before the next attempt, or give
//!   the deletion up until the watch lists again.
//!
//! The weeder's loop (`dependency_watchdog::weeder::pods`) feeds it every pod its watch reports
//! and every answer of the seed to a DELETE, and carries out what it returns; which pods are
//! deleted, how often a deletion is attempted and how long the watch pauses after a deletion
//! that failed every attempt are decided here, without I/O or clock.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::time::Duration;

use k8s_openapi::api::core::v1::Pod;

use super::should_delete_pod;
use crate::PodSelector;

/// Attempts per pod deletion before the pod is left for a new list of its watch.
pub const DELETE_ATTEMPTS: u32 = 3;
/// Pause between deletion attempts (times the number of the attempt that failed).
pub const DELETE_RETRY_PAUSE: Duration = Duration::from_millis(100);
/// Pause before a pod watch lists again after a deletion that failed all its attempts;
/// doubled after each further such failure, back to this after a deletion that succeeds.
pub const FIRST_RELIST_PAUSE: Duration = Duration::from_secs(1);
/// The longest such pause.
pub const MAX_RELIST_PAUSE: Duration = Duration::from_secs(30);

/// Whether a slice last seen with readiness `old` (`None`: never seen) and now `ready` starts a
/// weeder: a ready slice that is new, or was not ready. The same rule as
/// [`super::should_start_weeder`], on the one bit kept of the old slice.
pub fn should_start(old: Option<bool>, ready: bool) -> bool {
    ready && old != Some(true)
}

/// The EndpointSlice watch's rules: last-seen readiness per `namespace/slice`, turning the
/// watch's events into "start a weeder".
#[derive(Debug, Default)]
pub struct SliceWatch {
    last: HashMap<String, bool>,
    /// Keys seen since a (re-)list began; `None` outside a list.
    listing: Option<HashSet<String>>,
}

impl SliceWatch {
    /// A (re-)list begins.
    pub fn list_begins(&mut self) {
        self.listing = Some(HashSet::new());
    }

    /// The watch reported slice `key` (listed, created or changed) with readiness `ready`:
    /// true when a weeder should start for it.
    pub fn seen(&mut self, key: &str, ready: bool) -> bool {
        if let Some(seen) = self.listing.as_mut() {
            seen.insert(key.to_string());
        }
        let old = self.last.insert(key.to_string(), ready);
        should_start(old, ready)
    }

    /// The slice was deleted (starts nothing): a slice created under the same name later
    /// counts as new.
    pub fn gone(&mut self, key: &str) {
        self.last.remove(key);
    }

    /// The (re-)list is complete: slices it did not report were deleted meanwhile.
    pub fn list_done(&mut self) {
        if let Some(seen) = self.listing.take() {
            self.last.retain(|key, _| seen.contains(key));
        }
    }

    /// Number of slices tracked.
    pub fn len(&self) -> usize {
        self.last.len()
    }

    /// Whether no slice is tracked.
    pub fn is_empty(&self) -> bool {
        self.last.is_empty()
    }
}

/// A pod the weeder should delete, as read from the pod.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeletionTarget {
    /// Pod name.
    pub name: String,
    /// Pod UID: the delete's precondition, so a pod re-created under the same name is never
    /// deleted for its predecessor's state.
    pub uid: String,
    /// The container waiting in `CrashLoopBackOff`.
    pub container: String,
}

/// Whether `pod` is in `namespace` and matches `selector`.
pub fn in_scope(pod: &Pod, namespace: &str, selector: &PodSelector) -> bool {
    let meta = &pod.metadata;
    let empty = BTreeMap::new();
    meta.namespace.as_deref() == Some(namespace)
        && selector.matches(meta.labels.as_ref().unwrap_or(&empty))
}

/// Whether the weeder of `namespace` with `selector` deletes `pod`: it must crash-loop without
/// being deleted already ([`should_delete_pod`]), and — because deleting is not undoable —
/// also be in `namespace` and match `selector`, although the watch asked the server for
/// exactly that; a pod without name or UID cannot be deleted safely and is left alone.
pub fn deletion_target(
    pod: &Pod,
    namespace: &str,
    selector: &PodSelector,
) -> Option<DeletionTarget> {
    if !in_scope(pod, namespace, selector) {
        return None;
    }
    let container = should_delete_pod(pod)?;
    Some(DeletionTarget {
        name: pod.metadata.name.clone()?,
        uid: pod.metadata.uid.clone()?,
        container,
    })
}

/// How the seed answered one attempt to delete a pod.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DeleteAnswer {
    /// Accepted: the pod is deleted (in shadow mode: the would-be deletion is recorded).
    Deleted,
    /// The pod with that UID is gone already (`404`, or `409`: the UID precondition failed,
    /// so another pod took its name).
    Gone,
    /// Refused, throttled, timed out or unreachable.
    Failed,
}

/// What the stepper hears: the watch reported a pod, or the seed answered a DELETE.
#[derive(Debug, Clone, Copy)]
pub enum PodEvent<'a> {
    /// The watch reported `pod` (listed, added or changed).
    Seen(&'a Pod),
    /// Attempt number `attempt` (from 1) to delete the pod being deleted was answered.
    Answered {
        /// The attempt's number, from 1.
        attempt: u32,
        /// The seed's answer.
        answer: DeleteAnswer,
    },
}

/// What the loop does next.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PodStep {
    /// Nothing: the pod is no target, or the answer ends nothing.
    Nothing,
    /// Delete `target`: claim it (one deletion per pod across the namespace's weeders), then
    /// send the first attempt.
    Delete(DeletionTarget),
    /// The attempt failed and attempts are left: wait `pause`, then send attempt `attempt`.
    Wait {
        /// How long to wait.
        pause: Duration,
        /// The number of the next attempt.
        attempt: u32,
    },
    /// The deletion is done: keep the claim. `deleted` when this watch's DELETE deleted it,
    /// not when it was gone already.
    Done {
        /// Whether this watch deleted the pod (counted, logged, published).
        deleted: bool,
    },
    /// Every attempt failed: release the claim, wait `relist_after`, then list again. An
    /// unchanged pod sends no new event, and a watch that resumes after a short seed outage
    /// does not list again: without a new list the next try would wait for the pod's next
    /// crash-loop restart (up to 5 min). The growing pause keeps a deletion that keeps failing
    /// (e.g. forbidden) from turning into a list-and-delete loop.
    GiveUp {
        /// How long the watch waits before it lists again.
        relist_after: Duration,
    },
}

/// One pod watch's rules: which pod to delete, and what follows each answer to a DELETE.
#[derive(Debug, Clone)]
pub struct PodWatch {
    /// The weeder's namespace: the only one it touches.
    namespace: String,
    /// The watch's selector.
    selector: PodSelector,
    /// The pause before the watch lists again after the next deletion that fails.
    relist_pause: Duration,
}

impl PodWatch {
    /// The rules of a watch of the pods `selector` selects in `namespace`.
    pub fn new(namespace: &str, selector: &PodSelector) -> Self {
        PodWatch {
            namespace: namespace.to_string(),
            selector: selector.clone(),
            relist_pause: FIRST_RELIST_PAUSE,
        }
    }

    /// The watch's selector.
    pub fn selector(&self) -> &PodSelector {
        &self.selector
    }

    /// What to do after `event`.
    pub fn step(&mut self, event: PodEvent<'_>) -> PodStep {
        match event {
            PodEvent::Seen(pod) => deletion_target(pod, &self.namespace, &self.selector)
                .map_or(PodStep::Nothing, PodStep::Delete),
            PodEvent::Answered { attempt, answer } => self.answered(attempt, answer),
        }
    }

    fn answered(&mut self, attempt: u32, answer: DeleteAnswer) -> PodStep {
        match answer {
            DeleteAnswer::Deleted => {
                self.relist_pause = FIRST_RELIST_PAUSE;
                PodStep::Done { deleted: true }
            }
            DeleteAnswer::Gone => PodStep::Done { deleted: false },
            DeleteAnswer::Failed if attempt < DELETE_ATTEMPTS => PodStep::Wait {
                pause: DELETE_RETRY_PAUSE * attempt,
                attempt: attempt + 1,
            },
            DeleteAnswer::Failed => {
                let relist_after = self.relist_pause;
                self.relist_pause = (self.relist_pause * 2).min(MAX_RELIST_PAUSE);
                PodStep::GiveUp { relist_after }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::selector::RawRequirement;
    use crate::weeder::{should_start_weeder, slice_is_ready};
    use k8s_openapi::api::core::v1::{
        ContainerState, ContainerStateWaiting, ContainerStatus, PodStatus,
    };
    use k8s_openapi::api::discovery::v1::{Endpoint, EndpointConditions, EndpointSlice};
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, Time};
    use k8s_openapi::jiff::Timestamp;

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

    fn endpoint_slice(ready: &[bool]) -> EndpointSlice {
        EndpointSlice {
            endpoints: ready
                .iter()
                .map(|r| Endpoint {
                    addresses: vec!["10.0.0.1".into()],
                    conditions: Some(EndpointConditions {
                        ready: Some(*r),
                        ..Default::default()
                    }),
                    ..Default::default()
                })
                .collect(),
            ..Default::default()
        }
    }

    #[test]
    fn should_start_agrees_with_the_core_rule() {
        let shapes: [&[bool]; 5] = [&[], &[false], &[true, false], &[true], &[true, true]];
        for new in shapes {
            let new = endpoint_slice(new);
            assert_eq!(
                should_start(None, slice_is_ready(&new)),
                should_start_weeder(None, &new)
            );
            for old in shapes {
                let old = endpoint_slice(old);
                assert_eq!(
                    should_start(Some(slice_is_ready(&old)), slice_is_ready(&new)),
                    should_start_weeder(Some(&old), &new),
                    "old {old:?} new {new:?}"
                );
            }
        }
    }

    #[test]
    fn first_sight_of_a_ready_slice_starts_and_repeats_do_not() {
        let mut t = SliceWatch::default();
        t.list_begins();
        assert!(t.seen("ns/etcd", true));
        assert!(!t.seen("ns/kapi", false));
        t.list_done();
        assert!(!t.seen("ns/etcd", true));
        assert!(t.seen("ns/kapi", true));
    }

    #[test]
    fn not_ready_then_ready_starts_again() {
        let mut t = SliceWatch::default();
        assert!(t.seen("ns/etcd", true));
        assert!(!t.seen("ns/etcd", false));
        assert!(t.seen("ns/etcd", true));
    }

    #[test]
    fn deleted_slice_recreated_ready_starts() {
        let mut t = SliceWatch::default();
        assert!(t.seen("ns/etcd", true));
        t.gone("ns/etcd");
        assert!(t.is_empty());
        assert!(t.seen("ns/etcd", true));
    }

    #[test]
    fn relist_is_an_update_for_known_slices_and_drops_vanished_ones() {
        let mut t = SliceWatch::default();
        t.list_begins();
        assert!(t.seen("a/etcd", true));
        assert!(!t.seen("b/etcd", false));
        assert!(t.seen("c/etcd", true));
        t.list_done();
        // The watch lost its place; meanwhile b turned ready and c was deleted.
        t.list_begins();
        assert!(!t.seen("a/etcd", true), "still ready: no restart");
        assert!(t.seen("b/etcd", true), "turned ready while we were away");
        t.list_done();
        assert_eq!(t.len(), 2);
        assert!(t.seen("c/etcd", true), "c is new again");
    }

    fn target() -> DeletionTarget {
        DeletionTarget {
            name: "kube-apiserver-abc".into(),
            uid: "uid-1".into(),
            container: "kube-apiserver".into(),
        }
    }

    #[test]
    fn crashlooping_matching_pod_in_namespace_is_a_target() {
        let got = deletion_target(
            &pod("shoot--a", "apiserver", "CrashLoopBackOff"),
            "shoot--a",
            &selector(),
        );
        assert_eq!(got, Some(target()));
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
            (
                "terminating",
                changed(|p| p.metadata.deletion_timestamp = Some(Time(Timestamp::UNIX_EPOCH))),
            ),
            // Left alone: it can't be deleted with a uid precondition.
            ("without a uid", changed(|p| p.metadata.uid = None)),
            ("without a name", changed(|p| p.metadata.name = None)),
        ];
        for (what, p) in cases {
            assert_eq!(deletion_target(&p, "shoot--a", &selector()), None, "{what}");
        }
    }

    #[test]
    fn a_seen_target_is_deleted_and_anything_else_is_nothing() {
        let mut watch = PodWatch::new("shoot--a", &selector());
        let crashing = pod("shoot--a", "apiserver", "CrashLoopBackOff");
        assert_eq!(
            watch.step(PodEvent::Seen(&crashing)),
            PodStep::Delete(target())
        );
        let healthy = pod("shoot--a", "apiserver", "ContainerCreating");
        assert_eq!(watch.step(PodEvent::Seen(&healthy)), PodStep::Nothing);
        assert_eq!(watch.selector(), &selector());
    }

    fn answer(watch: &mut PodWatch, attempt: u32, answer: DeleteAnswer) -> PodStep {
        watch.step(PodEvent::Answered { attempt, answer })
    }

    #[test]
    fn a_deletion_accepted_or_gone_is_done_and_only_an_accepted_one_was_ours() {
        let mut watch = PodWatch::new("shoot--a", &selector());
        for attempt in 1..=DELETE_ATTEMPTS {
            assert_eq!(
                answer(&mut watch, attempt, DeleteAnswer::Deleted),
                PodStep::Done { deleted: true }
            );
            assert_eq!(
                answer(&mut watch, attempt, DeleteAnswer::Gone),
                PodStep::Done { deleted: false }
            );
        }
    }

    #[test]
    fn a_failed_attempt_waits_longer_each_time_and_the_third_gives_up() {
        let mut watch = PodWatch::new("shoot--a", &selector());
        let ms = Duration::from_millis;
        assert_eq!(
            answer(&mut watch, 1, DeleteAnswer::Failed),
            PodStep::Wait {
                pause: ms(100),
                attempt: 2
            }
        );
        assert_eq!(
            answer(&mut watch, 2, DeleteAnswer::Failed),
            PodStep::Wait {
                pause: ms(200),
                attempt: 3
            }
        );
        assert_eq!(
            answer(&mut watch, 3, DeleteAnswer::Failed),
            PodStep::GiveUp {
                relist_after: FIRST_RELIST_PAUSE
            }
        );
    }

    #[test]
    fn the_pause_before_a_relist_doubles_up_to_thirty_seconds_and_a_deletion_resets_it() {
        let mut watch = PodWatch::new("shoot--a", &selector());
        let mut give_up = || match answer(&mut watch, DELETE_ATTEMPTS, DeleteAnswer::Failed) {
            PodStep::GiveUp { relist_after } => relist_after.as_secs(),
            other => panic!("expected to give up, got {other:?}"),
        };
        let pauses: Vec<u64> = (0..7).map(|_| give_up()).collect();
        assert_eq!(pauses, [1, 2, 4, 8, 16, 30, 30]);
        // A pod gone already leaves the pause as it is; one this watch deleted resets it.
        answer(&mut watch, 1, DeleteAnswer::Gone);
        assert_eq!(
            answer(&mut watch, DELETE_ATTEMPTS, DeleteAnswer::Failed),
            PodStep::GiveUp {
                relist_after: MAX_RELIST_PAUSE
            }
        );
        answer(&mut watch, 1, DeleteAnswer::Deleted);
        assert_eq!(
            answer(&mut watch, DELETE_ATTEMPTS, DeleteAnswer::Failed),
            PodStep::GiveUp {
                relist_after: FIRST_RELIST_PAUSE
            }
        );
    }
}
