//! Shadow mode's comparison (docs/behaviour.md §5): ours decides but never acts, the reference
//! acts; this matches what we would have done with what the reference was seen doing.
//!
//! Both sides report *sightings*: an action (scale a shoot down or up, delete a pod) on a key
//! (the shoot's namespace, or the pod's `namespace/name` and UID) at a time. A sighting waits
//! for the other side's sighting of the same action on the same key for at most the
//! comparator's window, in either order: the second one resolves both into an agreement with
//! the time between them; one that waits longer than the window resolves alone, as something
//! only we or only the reference would do. Times are offsets from any fixed origin the caller
//! chooses (the pure layer reads no clock).

use std::collections::BTreeMap;
use std::fmt;
use std::time::Duration;

use crate::hysteresis::Direction;
use crate::scaling::FlowScope;

/// Who did (or would have done) something.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Side {
    /// This watchdog, in shadow mode: what it would have done.
    Ours,
    /// The acting watchdog, as seen in the seed (annotations on targets, deleted pods).
    Reference,
}

/// What was (or would have been) done.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum ShadowAction {
    /// A shoot's controllers scaled down (meltdown protection switched on).
    ScaleDown,
    /// A shoot's controllers restored (meltdown protection switched off).
    ScaleUp,
    /// A crash-looping dependant pod deleted by the weeder.
    DeletePod,
}

impl ShadowAction {
    /// The action that undoes this one on the same shoot, if any.
    pub fn opposite(self) -> Option<ShadowAction> {
        match self {
            ShadowAction::ScaleDown => Some(ShadowAction::ScaleUp),
            ShadowAction::ScaleUp => Some(ShadowAction::ScaleDown),
            ShadowAction::DeletePod => None,
        }
    }

    /// Stable name, also the `action` metric label.
    pub fn label(self) -> &'static str {
        match self {
            ShadowAction::ScaleDown => "scale_down",
            ShadowAction::ScaleUp => "scale_up",
            ShadowAction::DeletePod => "delete_pod",
        }
    }
}

impl fmt::Display for ShadowAction {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            ShadowAction::ScaleDown => "scale down",
            ShadowAction::ScaleUp => "scale up",
            ShadowAction::DeletePod => "delete pod",
        })
    }
}

/// How a comparison came out.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Agreement {
    /// Both did it, within the window of each other.
    Agree,
    /// We would have done it; the reference did not within the window.
    OnlyUs,
    /// The reference did it; we would not have within the window.
    OnlyReference,
}

impl Agreement {
    /// Stable name, also the `verdict` metric label.
    pub fn label(self) -> &'static str {
        match self {
            Agreement::Agree => "agree",
            Agreement::OnlyUs => "only_us",
            Agreement::OnlyReference => "only_reference",
        }
    }
}

/// One side's report that it did (or would have done) `action` on `key`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Sighting {
    /// Shoot namespace (scaling) or `namespace/pod uid` (deletion).
    pub key: String,
    /// What.
    pub action: ShadowAction,
    /// Who.
    pub side: Side,
    /// When, as an offset from the caller's origin.
    pub at: Duration,
    /// Why, in that side's words: our verdicts, or what was seen in the seed.
    pub evidence: String,
}

/// A resolved comparison.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Comparison {
    /// Shoot namespace or `namespace/pod uid`.
    pub key: String,
    /// What.
    pub action: ShadowAction,
    /// How it came out.
    pub verdict: Agreement,
    /// When we would have done it, if we would have.
    pub ours_at: Option<Duration>,
    /// When the reference was seen doing it, if it was.
    pub reference_at: Option<Duration>,
    /// Our evidence, if we would have acted.
    pub ours_evidence: Option<String>,
    /// What was seen of the reference, if it acted.
    pub reference_evidence: Option<String>,
}

impl Comparison {
    /// For an agreement, how much later the reference acted than we would have, in seconds
    /// (negative: the reference was first).
    pub fn reference_lag_seconds(&self) -> Option<f64> {
        match (self.ours_at, self.reference_at) {
            (Some(ours), Some(reference)) => Some(reference.as_secs_f64() - ours.as_secs_f64()),
            _ => None,
        }
    }
}

/// What our shadow prober would have done to a shoot so far.
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

/// What one shadow decision does: the sighting to report, if any, and the state after it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Step {
    /// The would-be action to report.
    pub report: Option<ShadowAction>,
    /// Our would-be state afterwards.
    pub next: VirtualState,
}

/// The shadow prober's decision when the hysteresis says `dir` over `scope` while we are in
/// `state`; `acts` says whether the flow would touch any target (one not ignored, existing or
/// mandatory). A scale-down while normal is reported, and a scale-up while scaled down; a
/// scale-down of nothing leaves us as we were (the acting watchdog can't be seen doing it
/// either), a scale-up of nothing still ends our scale-down. A zonal scale-down widening to
/// all targets is remembered, not reported: the marker the acting watchdog is judged by is
/// already there.
pub fn step(state: VirtualState, dir: Direction, scope: FlowScope, acts: bool) -> Step {
    let stay = Step {
        report: None,
        next: state,
    };
    match (dir, state) {
        (Direction::Down, VirtualState::Normal) if acts => Step {
            report: Some(ShadowAction::ScaleDown),
            next: VirtualState::Protected(scope),
        },
        (Direction::Down, VirtualState::Protected(FlowScope::Zonal)) if scope == FlowScope::All => {
            Step {
                report: None,
                next: VirtualState::Protected(FlowScope::All),
            }
        }
        (Direction::Up, VirtualState::Protected(_)) => Step {
            report: acts.then_some(ShadowAction::ScaleUp),
            next: VirtualState::Normal,
        },
        _ => stay,
    }
}

/// A sighting waiting for its counterpart.
#[derive(Debug, Clone)]
struct Waiting {
    side: Side,
    at: Duration,
    evidence: String,
}

/// Matches the two sides' sightings (see the module doc). Holds at most `capacity` waiting
/// sightings: past that the oldest resolves early, alone, so memory stays bounded whatever the
/// seed does.
///
/// A pod deletion's agreement is remembered for one window: a further sighting of it is the
/// same deletion seen again (two weeders of one namespace whose selectors both pick the pod;
/// the key holds the pod's UID), not a new one that would wait alone. A shoot's scalings are
/// not: each side reports only changes of its state, so a repeat is a new scale-down after a
/// scale-up (a flapping shoot). For the same reason a side's scaling sighting resolves, alone,
/// that side's waiting sighting of the opposite action: it has undone it before the other
/// side matched it.
#[derive(Debug)]
pub struct Comparator {
    window: Duration,
    capacity: usize,
    waiting: BTreeMap<(String, ShadowAction), Waiting>,
    /// Agreements of the last window: when each was completed.
    agreed: BTreeMap<(String, ShadowAction), Duration>,
}

impl Comparator {
    /// A comparator matching sightings at most `window` apart, holding at most `capacity`
    /// (at least 1) waiting sightings.
    pub fn new(window: Duration, capacity: usize) -> Self {
        Comparator {
            window,
            capacity: capacity.max(1),
            waiting: BTreeMap::new(),
            agreed: BTreeMap::new(),
        }
    }

    /// The matching window.
    pub fn window(&self) -> Duration {
        self.window
    }

    /// Sightings waiting for their counterpart.
    pub fn waiting(&self) -> usize {
        self.waiting.len()
    }

    /// Takes a sighting: returns the agreement it completes, or (only when the comparator is
    /// full) the oldest waiting sighting resolved alone to make room. A repeated sighting from
    /// the side already waiting keeps the first one's time.
    pub fn observe(&mut self, sighting: Sighting) -> Vec<Comparison> {
        let slot = (sighting.key.clone(), sighting.action);
        let mut resolved = Vec::new();
        if let Some(opposite) = sighting.action.opposite() {
            let undone = (sighting.key.clone(), opposite);
            if self
                .waiting
                .get(&undone)
                .is_some_and(|w| w.side == sighting.side)
                && let Some(waiting) = self.waiting.remove(&undone)
            {
                resolved.push(alone(undone, waiting));
            }
        }
        resolved.extend(self.take(slot, sighting));
        resolved
    }

    fn take(&mut self, slot: (String, ShadowAction), sighting: Sighting) -> Vec<Comparison> {
        if let Some(agreed_at) = self.agreed.get(&slot) {
            if sighting.at.saturating_sub(*agreed_at) <= self.window {
                return Vec::new();
            }
            self.agreed.remove(&slot);
        }
        if let Some(first) = self.waiting.get(&slot) {
            if first.side == sighting.side {
                return Vec::new();
            }
            if sighting.at.saturating_sub(first.at) <= self.window {
                let Some(first) = self.waiting.remove(&slot) else {
                    return Vec::new();
                };
                if slot.1 == ShadowAction::DeletePod {
                    self.remember_agreement(slot.clone(), sighting.at);
                }
                return vec![agreement(slot, first, sighting)];
            }
            // Too far apart to be the same event: the first resolves alone, the new one waits.
            let mut resolved = Vec::new();
            if let Some(first) = self.waiting.remove(&slot) {
                resolved.push(alone(slot.clone(), first));
            }
            resolved.extend(self.wait(slot, sighting));
            return resolved;
        }
        self.wait(slot, sighting)
    }

    /// Remembers an agreement for a window, at most `capacity` of them (the oldest forgotten
    /// first).
    fn remember_agreement(&mut self, slot: (String, ShadowAction), at: Duration) {
        while self.agreed.len() >= self.capacity {
            let oldest = self
                .agreed
                .iter()
                .min_by_key(|(_, at)| **at)
                .map(|(slot, _)| slot.clone());
            match oldest {
                Some(oldest) => {
                    self.agreed.remove(&oldest);
                }
                None => break,
            }
        }
        self.agreed.insert(slot, at);
    }

    fn wait(&mut self, slot: (String, ShadowAction), sighting: Sighting) -> Vec<Comparison> {
        let mut resolved = Vec::new();
        while self.waiting.len() >= self.capacity {
            let oldest = self
                .waiting
                .iter()
                .min_by_key(|(_, w)| w.at)
                .map(|(slot, _)| slot.clone());
            match oldest.and_then(|s| self.waiting.remove_entry(&s)) {
                Some((slot, waiting)) => resolved.push(alone(slot, waiting)),
                None => break,
            }
        }
        self.waiting.insert(
            slot,
            Waiting {
                side: sighting.side,
                at: sighting.at,
                evidence: sighting.evidence,
            },
        );
        resolved
    }

    /// Resolves, alone, every sighting that has waited longer than the window at `now`.
    pub fn expire(&mut self, now: Duration) -> Vec<Comparison> {
        let window = self.window;
        self.agreed
            .retain(|_, agreed_at| now.saturating_sub(*agreed_at) <= window);
        let due: Vec<(String, ShadowAction)> = self
            .waiting
            .iter()
            .filter(|(_, w)| now.saturating_sub(w.at) > window)
            .map(|(slot, _)| slot.clone())
            .collect();
        let mut resolved: Vec<Comparison> = due
            .into_iter()
            .filter_map(|slot| self.waiting.remove_entry(&slot))
            .map(|(slot, waiting)| alone(slot, waiting))
            .collect();
        resolved.sort_by_key(|c| c.ours_at.or(c.reference_at));
        resolved
    }
}

fn agreement(slot: (String, ShadowAction), first: Waiting, second: Sighting) -> Comparison {
    let (key, action) = slot;
    let (ours, reference) = match first.side {
        Side::Ours => ((first.at, first.evidence), (second.at, second.evidence)),
        Side::Reference => ((second.at, second.evidence), (first.at, first.evidence)),
    };
    Comparison {
        key,
        action,
        verdict: Agreement::Agree,
        ours_at: Some(ours.0),
        reference_at: Some(reference.0),
        ours_evidence: Some(ours.1),
        reference_evidence: Some(reference.1),
    }
}

fn alone(slot: (String, ShadowAction), waiting: Waiting) -> Comparison {
    let (key, action) = slot;
    match waiting.side {
        Side::Ours => Comparison {
            key,
            action,
            verdict: Agreement::OnlyUs,
            ours_at: Some(waiting.at),
            reference_at: None,
            ours_evidence: Some(waiting.evidence),
            reference_evidence: None,
        },
        Side::Reference => Comparison {
            key,
            action,
            verdict: Agreement::OnlyReference,
            ours_at: None,
            reference_at: Some(waiting.at),
            ours_evidence: None,
            reference_evidence: Some(waiting.evidence),
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn s(key: &str, action: ShadowAction, side: Side, at: u64) -> Sighting {
        Sighting {
            key: key.into(),
            action,
            side,
            at: Duration::from_secs(at),
            evidence: format!("{side:?} at {at}"),
        }
    }

    const WINDOW: Duration = Duration::from_secs(60);

    #[test]
    fn sightings_of_both_sides_within_the_window_agree_in_either_order_with_the_lag() {
        let mut c = Comparator::new(WINDOW, 10);
        assert!(
            c.observe(s("shoot--a", ShadowAction::ScaleDown, Side::Ours, 100))
                .is_empty()
        );
        let done = c.observe(s("shoot--a", ShadowAction::ScaleDown, Side::Reference, 130));
        assert_eq!(done.len(), 1);
        assert_eq!(done[0].verdict, Agreement::Agree);
        assert_eq!(done[0].reference_lag_seconds(), Some(30.0));
        assert_eq!(done[0].ours_evidence.as_deref(), Some("Ours at 100"));
        assert_eq!(
            done[0].reference_evidence.as_deref(),
            Some("Reference at 130")
        );
        assert_eq!(c.waiting(), 0);

        // The reference first: a negative lag.
        c.observe(s("shoot--a", ShadowAction::ScaleUp, Side::Reference, 200));
        let done = c.observe(s("shoot--a", ShadowAction::ScaleUp, Side::Ours, 210));
        assert_eq!(done[0].verdict, Agreement::Agree);
        assert_eq!(done[0].reference_lag_seconds(), Some(-10.0));
    }

    #[test]
    fn a_sighting_alone_past_the_window_resolves_as_only_that_side() {
        let mut c = Comparator::new(WINDOW, 10);
        c.observe(s("shoot--a", ShadowAction::ScaleDown, Side::Ours, 100));
        c.observe(s("shoot--b", ShadowAction::ScaleDown, Side::Reference, 120));
        assert!(
            c.expire(Duration::from_secs(160)).is_empty(),
            "exactly the window: still waiting"
        );
        let done = c.expire(Duration::from_secs(161));
        assert_eq!(done.len(), 1);
        assert_eq!(
            (done[0].key.as_str(), done[0].verdict),
            ("shoot--a", Agreement::OnlyUs)
        );
        assert_eq!(done[0].reference_at, None);
        let done = c.expire(Duration::from_secs(181));
        assert_eq!(
            (done[0].key.as_str(), done[0].verdict),
            ("shoot--b", Agreement::OnlyReference)
        );
        assert_eq!(c.waiting(), 0);
    }

    #[test]
    fn different_keys_or_actions_never_match_and_repeats_keep_the_first_time() {
        let mut c = Comparator::new(WINDOW, 10);
        c.observe(s("shoot--a", ShadowAction::ScaleDown, Side::Ours, 100));
        assert!(
            c.observe(s("shoot--b", ShadowAction::ScaleDown, Side::Reference, 101))
                .is_empty()
        );
        assert!(
            c.observe(s("shoot--a", ShadowAction::ScaleUp, Side::Reference, 102))
                .is_empty()
        );
        assert!(
            c.observe(s("shoot--a", ShadowAction::ScaleDown, Side::Ours, 130))
                .is_empty()
        );
        assert_eq!(c.waiting(), 3);
        // The reference's scale-down also undoes its own unmatched scale-up (resolved alone).
        let done = c.observe(s("shoot--a", ShadowAction::ScaleDown, Side::Reference, 150));
        let agreed = done
            .iter()
            .find(|c| c.verdict == Agreement::Agree)
            .expect("an agreement");
        assert_eq!(agreed.ours_at, Some(Duration::from_secs(100)));
    }

    #[test]
    fn the_other_side_too_late_resolves_the_first_alone_and_waits_itself() {
        let mut c = Comparator::new(WINDOW, 10);
        c.observe(s("shoot--a", ShadowAction::ScaleDown, Side::Ours, 100));
        let done = c.observe(s("shoot--a", ShadowAction::ScaleDown, Side::Reference, 300));
        assert_eq!(done.len(), 1);
        assert_eq!(done[0].verdict, Agreement::OnlyUs);
        assert_eq!(c.waiting(), 1);
        let done = c.expire(Duration::from_secs(400));
        assert_eq!(done[0].verdict, Agreement::OnlyReference);
    }

    #[test]
    fn the_same_event_seen_again_within_the_window_after_an_agreement_is_ignored() {
        let mut c = Comparator::new(WINDOW, 10);
        c.observe(s("ns/p (u)", ShadowAction::DeletePod, Side::Ours, 100));
        assert_eq!(
            c.observe(s("ns/p (u)", ShadowAction::DeletePod, Side::Reference, 101))[0].verdict,
            Agreement::Agree
        );
        // A second weeder of the namespace picked the same pod: both sides seen again.
        assert!(
            c.observe(s("ns/p (u)", ShadowAction::DeletePod, Side::Reference, 102))
                .is_empty()
        );
        assert!(
            c.observe(s("ns/p (u)", ShadowAction::DeletePod, Side::Ours, 103))
                .is_empty()
        );
        assert_eq!(c.waiting(), 0);
        assert!(c.expire(Duration::from_secs(500)).is_empty());
        // Past the window it is a new event again.
        c.observe(s("ns/p (u)", ShadowAction::DeletePod, Side::Ours, 600));
        assert_eq!(c.waiting(), 1);
    }

    #[test]
    fn a_flapping_shoot_is_compared_flap_by_flap() {
        let mut c = Comparator::new(Duration::from_secs(120), 10);
        let k = "shoot--a";
        c.observe(s(k, ShadowAction::ScaleDown, Side::Ours, 0));
        assert_eq!(
            c.observe(s(k, ShadowAction::ScaleDown, Side::Reference, 5))[0].verdict,
            Agreement::Agree
        );
        c.observe(s(k, ShadowAction::ScaleUp, Side::Ours, 30));
        assert_eq!(
            c.observe(s(k, ShadowAction::ScaleUp, Side::Reference, 35))[0].verdict,
            Agreement::Agree
        );
        // We would scale down again; the reference does not: reported, not swallowed.
        assert!(
            c.observe(s(k, ShadowAction::ScaleDown, Side::Ours, 60))
                .is_empty()
        );
        let done = c.expire(Duration::from_secs(181));
        assert_eq!(done.len(), 1);
        assert_eq!(
            (done[0].action, done[0].verdict),
            (ShadowAction::ScaleDown, Agreement::OnlyUs)
        );
    }

    #[test]
    fn undoing_an_unmatched_scaling_resolves_it_alone_at_once() {
        let mut c = Comparator::new(Duration::from_secs(120), 10);
        let k = "shoot--a";
        c.observe(s(k, ShadowAction::ScaleDown, Side::Ours, 0));
        // We scale up before the reference scaled down: our scale-down stood alone.
        let done = c.observe(s(k, ShadowAction::ScaleUp, Side::Ours, 30));
        assert_eq!(done.len(), 1);
        assert_eq!(
            (done[0].action, done[0].verdict, done[0].ours_at),
            (
                ShadowAction::ScaleDown,
                Agreement::OnlyUs,
                Some(Duration::ZERO)
            )
        );
        // Our next scale-down undoes our scale-up, which the reference never matched, and
        // pairs with the reference's scale-down, not the old one.
        let done = c.observe(s(k, ShadowAction::ScaleDown, Side::Ours, 60));
        assert_eq!(
            (done[0].action, done[0].verdict),
            (ShadowAction::ScaleUp, Agreement::OnlyUs)
        );
        let done = c.observe(s(k, ShadowAction::ScaleDown, Side::Reference, 100));
        assert_eq!(
            (done[0].verdict, done[0].reference_lag_seconds()),
            (Agreement::Agree, Some(40.0))
        );
        assert_eq!(c.waiting(), 0);
    }

    #[test]
    fn a_full_comparator_resolves_its_oldest_sighting_to_make_room() {
        let mut c = Comparator::new(WINDOW, 2);
        c.observe(s("p1", ShadowAction::DeletePod, Side::Ours, 10));
        c.observe(s("p2", ShadowAction::DeletePod, Side::Ours, 5));
        let done = c.observe(s("p3", ShadowAction::DeletePod, Side::Ours, 20));
        assert_eq!(done.len(), 1);
        assert_eq!(
            (done[0].key.as_str(), done[0].verdict),
            ("p2", Agreement::OnlyUs)
        );
        assert_eq!(c.waiting(), 2);
    }

    #[test]
    fn the_would_be_state_moves_only_on_a_change_that_acts() {
        use FlowScope::{All, Zonal};
        use VirtualState::{Normal, Protected};
        let table = [
            // (state, dir, scope, acts) → (report, next)
            (
                (Normal, Direction::Down, All, true),
                (Some(ShadowAction::ScaleDown), Protected(All)),
            ),
            (
                (Normal, Direction::Down, Zonal, true),
                (Some(ShadowAction::ScaleDown), Protected(Zonal)),
            ),
            ((Normal, Direction::Down, All, false), (None, Normal)),
            ((Normal, Direction::Up, All, true), (None, Normal)),
            (
                (Protected(All), Direction::Down, All, true),
                (None, Protected(All)),
            ),
            (
                (Protected(Zonal), Direction::Down, All, true),
                (None, Protected(All)),
            ),
            (
                (Protected(All), Direction::Down, Zonal, true),
                (None, Protected(All)),
            ),
            (
                (Protected(All), Direction::Up, All, true),
                (Some(ShadowAction::ScaleUp), Normal),
            ),
            (
                (Protected(Zonal), Direction::Up, All, false),
                (None, Normal),
            ),
        ];
        for ((state, dir, scope, acts), (report, next)) in table {
            assert_eq!(
                step(state, dir, scope, acts),
                Step { report, next },
                "{state:?} {dir} {scope} acts={acts}"
            );
        }
    }

    #[test]
    fn labels_are_stable() {
        assert_eq!(
            [
                ShadowAction::ScaleDown.label(),
                ShadowAction::ScaleUp.label(),
                ShadowAction::DeletePod.label()
            ],
            ["scale_down", "scale_up", "delete_pod"]
        );
        assert_eq!(
            [
                Agreement::Agree.label(),
                Agreement::OnlyUs.label(),
                Agreement::OnlyReference.label()
            ],
            ["agree", "only_us", "only_reference"]
        );
    }
}
