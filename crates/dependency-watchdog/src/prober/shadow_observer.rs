//! Shadow mode's view of the acting watchdog (docs/behaviour.md §5): what it did to each
//! shoot, read from the scaling targets' annotations in the seed caches, and where our own
//! would-be state stands.
//!
//! The acting watchdog (Gardener's reference, or ours in normal mode) marks every target it
//! scales down with `meltdown-protection-active` and removes the marker when it scales them
//! up again. [`observe`] watches the target caches and turns each shoot's marker appearing
//! (on any configured target) or leaving (every target) into a sighting
//! ([`Shadow::reference_did`]). Its first look after the caches synced only records what it
//! found: starting the shadow in the middle of an outage is no scale-down of the acting
//! watchdog's, and the probes start their own would-be state from the same snapshot
//! ([`ShadowStates`]), so it is no scale-down of ours either.

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use dwd_core::scaling::{FlowScope, MELTDOWN_ANNOTATION, REPLICAS_ANNOTATION};
use dwd_core::shadow::ShadowAction;
use tokio_util::sync::CancellationToken;
use tracing::debug;

use super::ProberContext;
use super::seed_caches::SeedCaches;
use crate::events::Subject;
use crate::shadow::Shadow;

/// How often the observer looks again without a cache change: probes the controller started
/// since the last look are picked up within it.
pub const RESCAN: Duration = Duration::from_secs(1);

/// Longest value of a tenant's `replicas` annotation quoted in evidence.
const QUOTED_VALUE_LIMIT: usize = 20;

/// What our shadow probe would have done to a shoot so far.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum VirtualState {
    /// Targets left as they are (never scaled down, or restored).
    Normal,
    /// Scaled down: every target, or only the zonal ones.
    Protected(FlowScope),
}

impl VirtualState {
    /// Whether the shoot is (virtually) scaled down.
    pub fn is_protected(self) -> bool {
        matches!(self, VirtualState::Protected(_))
    }
}

/// Per shoot namespace: the acting watchdog's state when shadow mode first saw the shoot,
/// and our would-be state. One entry per probed shoot; a removed probe's entry goes
/// ([`ShadowStates::forget`]).
#[derive(Debug, Default)]
pub struct ShadowStates {
    shoots: Mutex<HashMap<String, ShootStates>>,
}

#[derive(Debug, Default, Clone, Copy)]
struct ShootStates {
    /// Whether the acting watchdog had the shoot protected when shadow mode first saw it.
    first_seen_protected: Option<bool>,
    /// Our would-be state, once a probe has asked for it.
    ours: Option<VirtualState>,
}

impl ShadowStates {
    fn lock(&self) -> MutexGuard<'_, HashMap<String, ShootStates>> {
        // Entries are replaced whole: a panic elsewhere can't leave one torn.
        self.shoots.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Whether the acting watchdog had `namespace` protected when shadow mode first saw it;
    /// `now()` (its state now) becomes that first sight when nobody saw it before.
    pub fn first_seen_protected(&self, namespace: &str, now: impl FnOnce() -> bool) -> bool {
        let mut shoots = self.lock();
        let entry = shoots.entry(namespace.to_string()).or_default();
        *entry.first_seen_protected.get_or_insert_with(now)
    }

    /// Our would-be state for `namespace`: at first what the acting watchdog had when shadow
    /// mode first saw the shoot (`acting_now()` if that is now), so that a shadow started in
    /// the middle of an outage does not take the acting watchdog's scale-down for one still
    /// to make.
    pub fn ours(&self, namespace: &str, acting_now: impl FnOnce() -> bool) -> VirtualState {
        let mut shoots = self.lock();
        let entry = shoots.entry(namespace.to_string()).or_default();
        if let Some(ours) = entry.ours {
            return ours;
        }
        let ours = if *entry.first_seen_protected.get_or_insert_with(acting_now) {
            // Which scope the acting watchdog chose is not told by the markers: all.
            VirtualState::Protected(FlowScope::All)
        } else {
            VirtualState::Normal
        };
        entry.ours = Some(ours);
        ours
    }

    /// Records our would-be state for `namespace`.
    pub fn set_ours(&self, namespace: &str, state: VirtualState) {
        self.lock().entry(namespace.to_string()).or_default().ours = Some(state);
    }

    /// Forgets `namespace` (its probe was removed): a probe started for it later begins from
    /// the acting watchdog's state at that time.
    pub fn forget(&self, namespace: &str) {
        self.lock().remove(namespace);
    }

    /// Shoots with an entry.
    pub fn len(&self) -> usize {
        self.lock().len()
    }

    /// Whether no shoot has an entry.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// The acting watchdog's state of one shoot, as its targets' annotations show it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ActingState {
    /// Whether any configured target carries `meltdown-protection-active`.
    pub protected: bool,
    /// What was seen, for the evidence of a sighting: the marked targets with their replicas
    /// and recorded count, or every target's replicas.
    pub evidence: String,
}

/// The acting watchdog's state of `namespace` from the target caches (asked only while they
/// are in sync).
pub fn acting_state(caches: &SeedCaches, namespace: &str) -> ActingState {
    let mut marked = Vec::new();
    let mut replicas = Vec::new();
    for t in &caches.targets {
        let name = &t.info.target.name;
        let Some(state) = t.cache.get(namespace, name) else {
            continue;
        };
        replicas.push(format!("{name} {}", state.spec_replicas));
        if state.annotations.contains_key(MELTDOWN_ANNOTATION) {
            let recorded = state
                .annotations
                .get(REPLICAS_ANNOTATION)
                .map(|r| crate::events::truncate(r, QUOTED_VALUE_LIMIT).into_owned())
                .unwrap_or_else(|| "none".into());
            marked.push(format!(
                "{name} (replicas {}, recorded {recorded})",
                state.spec_replicas
            ));
        }
    }
    if marked.is_empty() {
        ActingState {
            protected: false,
            evidence: format!(
                "{MELTDOWN_ANNOTATION} on no target; replicas {}",
                or_none(&replicas)
            ),
        }
    } else {
        ActingState {
            protected: true,
            evidence: format!("{MELTDOWN_ANNOTATION} on {}", marked.join(", ")),
        }
    }
}

fn or_none(items: &[String]) -> String {
    if items.is_empty() {
        "(no target)".into()
    } else {
        items.join(", ")
    }
}

/// Whether `namespace` is protected by the acting watchdog now (the caches must be in sync).
pub fn acting_protected(caches: &SeedCaches, namespace: &str) -> bool {
    acting_state(caches, namespace).protected
}

/// Watches the target caches until `shutdown` and reports every change of the acting
/// watchdog's state of a probed shoot (`shoots()`: the namespaces with a probe) to `shadow`.
/// A shoot seen for the first time (at the first look after the caches synced, or later)
/// only records its state; so does a look while a cache is out of sync (nothing is judged
/// from it; a change made meanwhile is reported once it has listed again).
pub async fn observe(
    ctx: Arc<ProberContext>,
    shadow: Arc<Shadow>,
    shoots: impl Fn() -> Vec<String>,
    shutdown: CancellationToken,
) {
    let mut changes: Vec<_> = ctx
        .caches
        .targets
        .iter()
        .map(|t| t.cache.subscribe())
        .collect();
    let mut rescan = tokio::time::interval(RESCAN);
    rescan.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    // Last state seen per probed shoot.
    let mut last: HashMap<String, bool> = HashMap::new();
    loop {
        if ctx.caches.targets.iter().all(|t| t.cache.is_ready()) {
            look(&ctx, &shadow, &shoots(), &mut last);
        }
        let any_change = async {
            if changes.is_empty() {
                // No target cache at all: only the rescan wakes the loop.
                std::future::pending::<()>().await;
            }
            let _ =
                futures::future::select_all(changes.iter_mut().map(|rx| Box::pin(rx.changed())))
                    .await;
        };
        tokio::select! {
            _ = shutdown.cancelled() => return,
            _ = any_change => {}
            _ = rescan.tick() => {}
        }
    }
}

/// One look at every probed shoot: a sighting for each whose state changed since the last.
fn look(ctx: &ProberContext, shadow: &Shadow, shoots: &[String], last: &mut HashMap<String, bool>) {
    let probed: HashSet<&str> = shoots.iter().map(String::as_str).collect();
    // Bounded: only probed shoots are remembered.
    last.retain(|ns, _| probed.contains(ns.as_str()));
    for ns in shoots {
        let now = acting_state(&ctx.caches, ns);
        let before = match last.get(ns) {
            Some(before) => *before,
            // First seen: its first sight is the baseline (a probe may have taken it first).
            None => ctx.shadow_states.first_seen_protected(ns, || now.protected),
        };
        last.insert(ns.clone(), now.protected);
        if before == now.protected {
            continue;
        }
        let action = if now.protected {
            ShadowAction::ScaleDown
        } else {
            ShadowAction::ScaleUp
        };
        debug!(shoot = %ns, %action, "the acting watchdog's markers changed");
        shadow.reference_did(
            &ctx.events,
            &Subject::Cluster(ns),
            ns,
            action,
            &now.evidence,
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn our_state_starts_from_the_first_sight_of_the_acting_watchdogs_and_forget_starts_anew() {
        let states = ShadowStates::default();
        // The observer saw the shoot protected first; a probe asking later starts there,
        // whatever the acting watchdog does now.
        assert!(states.first_seen_protected("a", || true));
        assert_eq!(
            states.ours("a", || false),
            VirtualState::Protected(FlowScope::All)
        );
        states.set_ours("a", VirtualState::Normal);
        assert_eq!(states.ours("a", || true), VirtualState::Normal);
        // A probe that asks first takes the state now, and the observer's first sight is it.
        assert_eq!(states.ours("b", || false), VirtualState::Normal);
        assert!(!states.first_seen_protected("b", || true));
        assert_eq!(states.len(), 2);
        states.forget("a");
        assert_eq!(states.len(), 1);
        assert_eq!(states.ours("a", || false), VirtualState::Normal);
    }
}
