//! Shadow mode's weeder (`--shadow`, docs/behaviour.md §5): the hands that record instead of
//! deleting, and see the acting watchdog's deletions. All of the weeder's shadow-only code is
//! here; the weeders' loop ([`super::pods`]) runs the same in both modes.
//!
//! A shadow weeder decides exactly as an acting one: each pod its rules pick (claimed once per
//! namespace, as a deletion would be) is a would-be deletion in the book ([`Shadow::record`],
//! `Side::Ours`), and nothing is deleted. Each pod watch keeps a [`DeletionSpotter`] to see,
//! from its events, the deletions of pods last seen crash-looping: the acting watchdog's (or
//! anyone else's: the pod does not say), reported once per UID as `Side::Reference`. A pod the
//! watch's first list shows crash-looping and already terminating, deleted since the weeder
//! started, is both: the acting watchdog's deletion, and ours, which it beat.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;

use dwd_core::PodSelector;
use dwd_core::shadow::{ShadowAction, Side};
use dwd_core::weeder::{DeleteAnswer, DeletionTarget, crashlooping_container, in_scope};
use futures::future::BoxFuture;
use k8s_openapi::api::core::v1::Pod;

use super::claims::{NamespaceClaims, PodClaims};
use super::pods::{Hands, PodHands, Weeder};
use crate::observe::events::{Events, Subject};
use crate::shadow::Shadow;

/// Shadow mode's hands: every pod watch records.
pub(crate) struct Recorders {
    /// The book.
    shadow: Arc<Shadow>,
    /// Events about our own pod only.
    events: Events,
    /// Per namespace, the pods whose deletion by the acting watchdog was reported: once per
    /// UID, however many weeders and selectors of the namespace saw it (claims that are
    /// never released, held as long as a weeder of the namespace runs).
    reported: PodClaims,
}

impl Recorders {
    /// Recorders noting in `shadow` and publishing (about our own pod) through `events`.
    pub(crate) fn new(shadow: Arc<Shadow>, events: Events) -> Self {
        Recorders {
            shadow,
            events,
            reported: PodClaims::default(),
        }
    }
}

impl Hands for Recorders {
    fn for_watch(&self, weeder: &Weeder, selector: &PodSelector) -> Box<dyn PodHands> {
        // Deletions since this tell the acting watchdog's weeder racing ours.
        let started = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| i64::try_from(d.as_secs()).unwrap_or(i64::MAX));
        Box::new(Recorder {
            spotter: DeletionSpotter::new(started, &weeder.namespace, selector),
            shadow: self.shadow.clone(),
            events: self.events.clone(),
            claims: weeder.claims.clone(),
            reported: self.reported.namespace(&weeder.namespace),
            namespace: weeder.namespace.clone(),
            service: weeder.service.clone(),
            query: selector.to_query(),
        })
    }
}

/// One pod watch's recorder.
struct Recorder {
    spotter: DeletionSpotter,
    shadow: Arc<Shadow>,
    events: Events,
    /// The claims of the weeders of the namespace: one would-be deletion per pod.
    claims: Arc<NamespaceClaims>,
    /// The acting watchdog's deletions reported in the namespace: one report per pod.
    reported: Arc<NamespaceClaims>,
    namespace: String,
    service: String,
    /// The watch's selector, for the evidence.
    query: String,
}

impl PodHands for Recorder {
    fn list_begins(&mut self) {
        self.spotter.begin_list();
    }

    fn list_done(&mut self) {
        for seen in self.spotter.end_list() {
            self.reference_deleted(&seen);
        }
    }

    fn seen(&mut self, pod: &Pod) {
        let Some(seen) = self.spotter.applied(pod) else {
            return;
        };
        self.reference_deleted(&seen);
        // The acting watchdog was first; ours would have deleted the pod it listed. Claimed
        // (and kept) like a deletion: once per pod, whichever weeder of the namespace and
        // whichever selector's watch saw it.
        if let Some(container) = &seen.raced
            && let Some(claim) = self.claims.claim(&seen.uid)
        {
            claim.keep();
            self.would_delete(
                &seen.name,
                &seen.uid,
                &format!(
                    "container {container} in CrashLoopBackOff when our weeder first listed the pod (already deleted by then); service {} is ready again (selector {})",
                    self.service, self.query
                ),
            );
        }
    }

    fn gone(&mut self, pod: &Pod) {
        if let Some(seen) = self.spotter.deleted(pod) {
            self.reference_deleted(&seen);
        }
    }

    fn attempt<'a>(&'a mut self, target: &'a DeletionTarget) -> BoxFuture<'a, DeleteAnswer> {
        // Decided exactly as in normal operation; recorded instead of done.
        self.would_delete(
            &target.name,
            &target.uid,
            &format!(
                "container {} in CrashLoopBackOff; service {} is ready again (selector {})",
                target.container, self.service, self.query
            ),
        );
        Box::pin(std::future::ready(DeleteAnswer::Deleted))
    }
}

impl Recorder {
    /// We would have deleted the pod `name` (`uid`), because `evidence`.
    fn would_delete(&self, name: &str, uid: &str, evidence: &str) {
        self.shadow.record(
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

    /// The acting watchdog deleted a crash-looping pod (reported once per UID).
    fn reference_deleted(&self, seen: &SeenDeletion) {
        let Some(first) = self.reported.claim(&seen.uid) else {
            return;
        };
        first.keep();
        self.shadow.record(
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
    pub(crate) fn new(started: i64, namespace: &str, selector: &PodSelector) -> Self {
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
    pub(crate) fn applied(&mut self, pod: &Pod) -> Option<SeenDeletion> {
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
    pub(crate) fn deleted(&mut self, pod: &Pod) -> Option<SeenDeletion> {
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
    pub(crate) fn len(&self) -> usize {
        self.pods.len()
    }

    #[cfg(test)]
    /// Whether no pod is remembered.
    pub(crate) fn is_empty(&self) -> bool {
        self.pods.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
    use k8s_openapi::jiff::Timestamp;
    use serde_json::json;
    use std::collections::BTreeMap;

    /// Selects `role=apiserver`.
    fn selector() -> PodSelector {
        let labels = BTreeMap::from([("role".to_string(), "apiserver".to_string())]);
        PodSelector::new(labels, Vec::new()).expect("valid selector")
    }

    /// Pod `ns/kube-apiserver-abc` (uid `uid-1`) labelled `role`, its one container waiting
    /// for `reason`, as the seed would send it.
    fn pod(ns: &str, role: &str, reason: &str) -> Pod {
        let container = json!({"name": "kube-apiserver", "ready": false, "restartCount": 3,
            "image": "img", "imageID": "", "state": {"waiting": {"reason": reason}}});
        serde_json::from_value(json!({
            "metadata": {"name": "kube-apiserver-abc", "namespace": ns, "uid": "uid-1",
                         "labels": {"role": role}},
            "status": {"containerStatuses": [container]},
        }))
        .expect("a pod")
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
}
