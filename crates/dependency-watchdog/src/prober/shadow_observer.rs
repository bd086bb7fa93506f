//! Shadow mode's view of the acting watchdog (docs/behaviour.md §5): what it did to each
//! shoot, read from the scaling targets' annotations in the seed caches, and where our own
//! would-be state stands.
//!
//! The acting watchdog (Gardener's reference, or ours in normal mode) marks every target it
//! scales down with `meltdown-protection-active` and removes the marker when it scales them
//! up again. [`observe`] watches the target caches and turns each shoot's marker appearing
//! (on any configured target not excluded by `ignore-scaling`) or leaving (every such target)
//! into a sighting ([`Shadow::reference_did`]). It looks at every shoot with a target, probed
//! by us or not: the acting watchdog scaling a shoot we run no probe for is a disagreement
//! too. Its first look at a shoot only records what it found, and a probe's would-be state
//! starts from the acting watchdog's state as the observer last recorded it
//! ([`ShadowStates`]): every later change of the acting watchdog's is a sighting, and
//! starting the shadow in the middle of an outage is no scale-down of either side.

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use dwd_core::scaling::{MELTDOWN_ANNOTATION, bookkeeping};
pub use dwd_core::shadow::VirtualState;
use dwd_core::shadow::{ShadowAction, Side};
use tokio_util::sync::CancellationToken;
use tracing::debug;

use super::context::ProberContext;
use super::seed_caches::SeedCaches;
use crate::observe::events::Subject;
use crate::shadow::Shadow;

/// How often the observer looks again without a cache change.
pub(crate) const RESCAN: Duration = Duration::from_secs(1);

/// Longest value of a tenant's `replicas` annotation quoted in evidence.
const QUOTED_VALUE_LIMIT: usize = 20;

/// What every shoot's recording executor shares: shadow mode's book and our would-be states.
pub struct Recorder {
    /// Shadow mode's book.
    pub(crate) book: Arc<Shadow>,
    /// Per shoot: the acting watchdog's state as the observer last saw it, and ours.
    pub(crate) states: ShadowStates,
}

impl Recorder {
    /// A recorder writing to `book`, with no state of any shoot yet.
    pub fn new(book: Arc<Shadow>) -> Recorder {
        Recorder {
            book,
            states: ShadowStates::default(),
        }
    }
}

/// Per shoot namespace: the acting watchdog's state as the observer last recorded it, and our
/// would-be state. An entry per shoot with a target or a probe: the observer drops shoots
/// without targets, a removed probe drops our state ([`ShadowStates::forget_ours`]).
#[derive(Debug, Default)]
pub(crate) struct ShadowStates {
    shoots: Mutex<HashMap<String, ShootStates>>,
}

#[derive(Debug, Default, Clone, Copy)]
struct ShootStates {
    /// Whether the acting watchdog had the shoot protected at the observer's last look.
    acting: Option<bool>,
    /// Our would-be state, once a probe has asked for it.
    ours: Option<VirtualState>,
}

impl ShadowStates {
    fn lock(&self) -> MutexGuard<'_, HashMap<String, ShootStates>> {
        // Entries are replaced field by field, each whole: a panic elsewhere can't tear one.
        self.shoots.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// The observer saw the acting watchdog's state of `namespace` as `protected`: returns
    /// what it had recorded before (`None` the first time).
    pub(crate) fn acting_seen(&self, namespace: &str, protected: bool) -> Option<bool> {
        let mut shoots = self.lock();
        let entry = shoots.entry(namespace.to_string()).or_default();
        entry.acting.replace(protected)
    }

    /// Our would-be state for `namespace`: at first the acting watchdog's as the observer
    /// last recorded it (`acting_now()`, recorded as the observer's first look, if it has not
    /// looked yet), so that a shadow started in the middle of an outage does not take the
    /// acting watchdog's scale-down for one still to make, and a probe started later begins
    /// where the acting watchdog stands.
    pub(crate) fn ours(&self, namespace: &str, acting_now: impl FnOnce() -> bool) -> VirtualState {
        let mut shoots = self.lock();
        let entry = shoots.entry(namespace.to_string()).or_default();
        if let Some(ours) = entry.ours {
            return ours;
        }
        let ours = if *entry.acting.get_or_insert_with(acting_now) {
            // Which scope the acting watchdog chose is not told by the markers: all.
            VirtualState::Protected(dwd_core::scaling::FlowScope::All)
        } else {
            VirtualState::Normal
        };
        entry.ours = Some(ours);
        ours
    }

    /// Records our would-be state for `namespace`.
    pub(crate) fn set_ours(&self, namespace: &str, state: VirtualState) {
        self.lock().entry(namespace.to_string()).or_default().ours = Some(state);
    }

    /// Forgets our would-be state of `namespace` (its probe was removed): a probe started for
    /// it later begins from the acting watchdog's state at that time.
    pub(crate) fn forget_ours(&self, namespace: &str) {
        let mut shoots = self.lock();
        if let Some(entry) = shoots.get_mut(namespace) {
            entry.ours = None;
            if entry.acting.is_none() {
                shoots.remove(namespace);
            }
        }
    }

    /// Keeps the acting watchdog's state only of `namespaces` (the shoots with a target), and
    /// entries that hold our state.
    fn retain_acting(&self, namespaces: &HashSet<String>) {
        let mut shoots = self.lock();
        shoots.retain(|ns, entry| {
            if !namespaces.contains(ns) {
                entry.acting = None;
            }
            entry.acting.is_some() || entry.ours.is_some()
        });
    }

    #[cfg(test)]
    /// Shoots with an entry.
    pub(crate) fn len(&self) -> usize {
        self.lock().len()
    }
}

/// The acting watchdog's state of one shoot, as its targets' annotations show it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct ActingState {
    /// Whether any configured target carries `meltdown-protection-active`.
    pub protected: bool,
    /// What was seen, for the evidence of a sighting: the marked targets with their replicas
    /// and recorded count, or every target's replicas.
    pub evidence: String,
}

/// The acting watchdog's state of `namespace` from the target caches (asked only while they
/// are in sync).
pub(crate) fn acting_state(caches: &SeedCaches, namespace: &str) -> ActingState {
    let mut marked = Vec::new();
    let mut replicas = Vec::new();
    for t in &caches.targets {
        let name = &t.info.target.name;
        let Some(state) = t.cache.get(namespace, name) else {
            continue;
        };
        // The acting watchdog leaves an ignored target alone, a stale marker included (an
        // operator may add `ignore-scaling` to a target it holds down); so does our flow.
        // Read as the scaler reads it (`"false"` or an unparsable value is not ignored).
        let books = bookkeeping(&state.annotations);
        if books.ignored {
            continue;
        }
        replicas.push(format!("{name} {}", state.spec_replicas));
        if books.marked {
            let recorded = books
                .record
                .map(|r| crate::text::truncate(r, QUOTED_VALUE_LIMIT).into_owned())
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
pub(crate) fn acting_protected(caches: &SeedCaches, namespace: &str) -> bool {
    acting_state(caches, namespace).protected
}

/// Watches the target caches until `shutdown` and reports every change of the acting
/// watchdog's state of a shoot (any namespace holding a target) to `shadow`. A shoot seen for
/// the first time only records its state; nothing is judged while a cache is out of sync (a
/// change made meanwhile is reported once it has listed again).
pub async fn observe(
    ctx: Arc<ProberContext>,
    recorder: Arc<Recorder>,
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
    loop {
        if ctx.caches.targets.iter().all(|t| t.cache.is_ready()) {
            look(&ctx, &recorder);
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

/// One look at every shoot with a target: a sighting for each whose state changed since the
/// last.
fn look(ctx: &ProberContext, recorder: &Recorder) {
    let shoots: HashSet<String> = ctx
        .caches
        .targets
        .iter()
        .flat_map(|t| t.cache.namespaces())
        .collect();
    recorder.states.retain_acting(&shoots);
    for ns in &shoots {
        let now = acting_state(&ctx.caches, ns);
        let before = recorder.states.acting_seen(ns, now.protected);
        if before.is_none_or(|before| before == now.protected) {
            continue;
        }
        let action = if now.protected {
            ShadowAction::ScaleDown
        } else {
            ShadowAction::ScaleUp
        };
        debug!(shoot = %ns, %action, "the acting watchdog's markers changed");
        recorder.book.record(
            Side::Reference,
            &ctx.events,
            &Subject::Cluster(ns),
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
        use dwd_core::scaling::FlowScope;
        let states = ShadowStates::default();
        // The observer saw the shoot protected first; a probe asking later starts there,
        // whatever the caches say now.
        assert_eq!(states.acting_seen("a", true), None);
        assert_eq!(
            states.ours("a", || false),
            VirtualState::Protected(FlowScope::All)
        );
        states.set_ours("a", VirtualState::Normal);
        assert_eq!(states.ours("a", || true), VirtualState::Normal);
        // A probe that asks first takes the state now, and that is the observer's baseline.
        assert_eq!(states.ours("b", || false), VirtualState::Normal);
        assert_eq!(states.acting_seen("b", true), Some(false));
        assert_eq!(states.len(), 2);
        // A removed probe's state goes; a new probe starts where the acting watchdog stands
        // at the observer's last look.
        states.forget_ours("a");
        assert_eq!(states.acting_seen("a", false), Some(true));
        assert_eq!(states.ours("a", || true), VirtualState::Normal);
        // A shoot without targets keeps only what a probe holds.
        states.forget_ours("b");
        states.retain_acting(&HashSet::from(["a".to_string()]));
        assert_eq!(states.len(), 1);
    }
}
