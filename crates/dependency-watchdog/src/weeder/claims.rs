//! Which pods the weeders of a namespace have claimed: one successful DELETE per pod, however
//! many weeders see it crash-loop.
//!
//! Weeders are keyed by `namespace/slice` ([`super::registry`]), and a service can have several
//! EndpointSlices at once (dual-stack: one per address family; over 100 endpoints: several per
//! family). When they turn ready together, one weeder per slice watches the same pods; each
//! would see a pod crash-loop before any of them sees its `deletionTimestamp`, and a scheduled
//! pod that is terminating answers a second DELETE with 200 again: two deletions, two Events,
//! the counter +2. So the weeders of a namespace share one claim set: a pod's UID is claimed
//! before its DELETE is sent, and only the claim's holder sends it.
//!
//! This is a leaf module: [`super::pods`] takes claims and [`super::slices`] hands each weeder
//! its namespace's set, and neither is imported here (the module graph stays one way).
//!
//! Memory: a namespace's set lives as long as a weeder of that namespace holds it (the registry
//! keeps weak references only), like the per-weeder set it replaces; stale entries of the
//! registry are pruned whenever a set is handed out.

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError, Weak};

/// The claim sets of all namespaces with a running weeder.
#[derive(Debug, Default)]
pub struct PodClaims {
    namespaces: Mutex<HashMap<String, Weak<NamespaceClaims>>>,
}

impl PodClaims {
    /// The claim set of `namespace`: the one the namespace's running weeders share, or a new
    /// one when none runs.
    pub fn namespace(&self, namespace: &str) -> Arc<NamespaceClaims> {
        let mut namespaces = lock(&self.namespaces);
        if let Some(claims) = namespaces.get(namespace).and_then(Weak::upgrade) {
            return claims;
        }
        // Sets whose weeders all ended: dropped from the registry here, so it never holds
        // more entries than namespaces ever weeded at once, plus this one.
        namespaces.retain(|_, claims| claims.strong_count() > 0);
        let claims = Arc::new(NamespaceClaims::default());
        namespaces.insert(namespace.to_string(), Arc::downgrade(&claims));
        claims
    }

    #[cfg(test)]
    /// Namespaces whose claim set is still held by a weeder.
    pub(crate) fn live_namespaces(&self) -> usize {
        lock(&self.namespaces)
            .values()
            .filter(|claims| claims.strong_count() > 0)
            .count()
    }
}

/// The pods (by UID) claimed by the weeders of one namespace.
#[derive(Debug, Default)]
pub struct NamespaceClaims {
    /// UIDs deleted, being deleted, or (shadow mode) reported as would-be deletions.
    claimed: Mutex<HashSet<String>>,
}

impl NamespaceClaims {
    /// Claims the pod `uid` for deletion; `None` when a weeder of the namespace holds or kept
    /// a claim on it. The claim is released when dropped, unless [`Claim::keep`] is called.
    pub(crate) fn claim(self: &Arc<Self>, uid: &str) -> Option<Claim> {
        lock(&self.claimed).insert(uid.to_string()).then(|| Claim {
            owner: Arc::clone(self),
            uid: uid.to_string(),
            kept: false,
        })
    }
}

/// A weeder's claim on one pod. Dropped without [`Claim::keep`] (the deletion failed, or the
/// weeder was cancelled mid-deletion) it is released, so that a watch can try that pod again.
#[derive(Debug)]
pub(crate) struct Claim {
    owner: Arc<NamespaceClaims>,
    uid: String,
    kept: bool,
}

impl Claim {
    /// The pod was deleted (or is gone, or shadow mode reported it): no weeder of the namespace
    /// touches it again.
    pub(crate) fn keep(mut self) {
        self.kept = true;
    }
}

impl Drop for Claim {
    fn drop(&mut self) {
        if !self.kept {
            lock(&self.owner.claimed).remove(&self.uid);
        }
    }
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn weeders_of_one_namespace_share_claims_and_others_do_not() {
        let claims = PodClaims::default();
        let (a1, a2) = (claims.namespace("a"), claims.namespace("a"));
        let b = claims.namespace("b");
        let claim = a1.claim("uid-1").expect("first claim");
        assert!(
            a2.claim("uid-1").is_none(),
            "the second weeder must not delete"
        );
        assert!(
            b.claim("uid-1").is_some(),
            "another namespace is another set"
        );
        claim.keep();
        assert!(a2.claim("uid-1").is_none(), "a kept claim stays");
    }

    #[test]
    fn a_claim_dropped_without_keep_is_released() {
        let set = PodClaims::default().namespace("a");
        drop(set.claim("uid-1").expect("first claim"));
        assert!(
            set.claim("uid-1").is_some(),
            "a failed deletion may be tried again"
        );
    }

    #[test]
    fn a_namespace_set_ends_with_its_last_weeder() {
        let claims = PodClaims::default();
        let a = claims.namespace("a");
        a.claim("uid-1").expect("claim").keep();
        assert_eq!(claims.live_namespaces(), 1);
        drop(a);
        assert_eq!(claims.live_namespaces(), 0);
        let fresh = claims.namespace("a");
        assert!(fresh.claim("uid-1").is_some(), "a new weeder starts afresh");
        drop(claims.namespace("b"));
        assert_eq!(lock(&claims.namespaces).len(), 2);
        // Handing out a set prunes the ended ones.
        let _c = claims.namespace("c");
        assert_eq!(lock(&claims.namespaces).len(), 2);
    }
}
