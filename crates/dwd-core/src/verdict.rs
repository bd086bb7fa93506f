//! A run's **verdict**: what the prober makes of one finding (a [`LeaseReport`]), given what it
//! remembers of the shoot from earlier runs (the hysteresis streaks and the zones it last found
//! disrupted). Pure: the finding and that memory in; the flow to run (direction and scope),
//! why, how the hysteresis counted it, the zones that changed, and the memory for the next run
//! out. The probe, shadow mode and `explain` all take the verdict from [`verdict`]; the
//! intent of its flow is then [`crate::intent::intent`].

use std::collections::BTreeSet;
use std::fmt;

use crate::hysteresis::{Direction, Hysteresis};
use crate::lease::{LeaseDecision, LeaseReport};
use crate::scaling::FlowScope;
use crate::zone::ZoneReport;

/// A scaling flow: its direction over its scope.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Flow {
    /// Down or up.
    pub dir: Direction,
    /// Every target, or only the zonal ones.
    pub scope: FlowScope,
}

impl fmt::Display for Flow {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} ({})", self.dir, self.scope)
    }
}

/// How the hysteresis (docs/behaviour.md §2.9) counted this run's decision.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Streak {
    /// `NoScaling`: neither counted nor reset.
    NotCounted,
    /// The decision's direction has been decided `seen` runs in a row, `needed` are needed:
    /// the flow runs when `seen >= needed`.
    Counted {
        /// Consecutive runs with this direction, this one included.
        seen: u32,
        /// `failureThreshold` (down) or `successThreshold` (up).
        needed: u32,
    },
}

impl Streak {
    /// Whether the streak lets the decision act this run.
    pub fn met(self) -> bool {
        matches!(self, Streak::Counted { seen, needed } if seen >= needed)
    }
}

/// A zone that recovered since the last run that judged zones.
#[derive(Debug, Clone, PartialEq)]
pub struct RecoveredZone {
    /// The zone's name.
    pub zone: String,
    /// Its report this run; `None` when no candidate node is left in it.
    pub now: Option<ZoneReport>,
}

/// What one finding means, after the hysteresis and against the zones seen before.
#[derive(Debug, Clone, PartialEq)]
pub struct Verdict {
    /// The finding's lease decision.
    pub decision: LeaseDecision,
    /// The flow the decision asks for; `None` for no scaling.
    pub asked: Option<Flow>,
    /// How the hysteresis counted the decision.
    pub streak: Streak,
    /// Why, in words: the finding's summary without its trailing decision ("4/5 node leases
    /// expired (0.80 ≥ 0.60)"); events append what was done.
    pub why: String,
    /// Zones disrupted now that were not at the last run that judged zones, by name.
    pub zones_disrupted: Vec<ZoneReport>,
    /// Zones disrupted then that are not now, by name.
    pub zones_recovered: Vec<RecoveredZone>,
}

impl Verdict {
    /// The flow to run this run: the one asked for, once the hysteresis lets it act.
    pub fn flow(&self) -> Option<Flow> {
        self.asked.filter(|_| self.streak.met())
    }
}

/// What the prober remembers of a shoot between runs, for its verdicts.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct VerdictMemory {
    /// The hysteresis streaks.
    pub hysteresis: Hysteresis,
    /// The zones the last run that judged zones found disrupted.
    pub disrupted_zones: BTreeSet<String>,
}

/// The verdict on `report` given `memory` of earlier runs, and the memory for the next run.
pub fn verdict(report: &LeaseReport, memory: &VerdictMemory) -> (Verdict, VerdictMemory) {
    let mut hysteresis = memory.hysteresis.clone();
    hysteresis.observe(&report.decision);
    let (up, down) = hysteresis.streaks();
    let (success, failure) = hysteresis.thresholds();
    let asked = flow_asked(&report.decision);
    let streak = match asked {
        None => Streak::NotCounted,
        Some(Flow {
            dir: Direction::Down,
            ..
        }) => Streak::Counted {
            seen: down,
            needed: failure,
        },
        Some(Flow {
            dir: Direction::Up, ..
        }) => Streak::Counted {
            seen: up,
            needed: success,
        },
    };
    let now: BTreeSet<String> = report.disrupted_zones().map(|z| z.zone.clone()).collect();
    let zones_disrupted = report
        .disrupted_zones()
        .filter(|z| !memory.disrupted_zones.contains(&z.zone))
        .cloned()
        .collect();
    let zones_recovered = memory
        .disrupted_zones
        .iter()
        .filter(|z| !now.contains(*z))
        .map(|zone| RecoveredZone {
            zone: zone.clone(),
            now: report.zones.iter().find(|r| &r.zone == zone).cloned(),
        })
        .collect();
    let verdict = Verdict {
        decision: report.decision,
        asked,
        streak,
        why: decision_reason(report),
        zones_disrupted,
        zones_recovered,
    };
    let next = VerdictMemory {
        hysteresis,
        disrupted_zones: now,
    };
    (verdict, next)
}

/// The flow a lease decision asks for, before the hysteresis; `None` for no scaling.
pub fn flow_asked(decision: &LeaseDecision) -> Option<Flow> {
    let dir = match decision {
        LeaseDecision::ScaleDown | LeaseDecision::ZonalScaleDown => Direction::Down,
        LeaseDecision::ScaleUp(_) => Direction::Up,
        LeaseDecision::NoScaling(_) => return None,
    };
    Some(Flow {
        dir,
        scope: FlowScope::of(decision),
    })
}

/// The report's summary without its trailing decision ("4/5 node leases expired (0.80 ≥
/// 0.60)" of "…: scale down"): events append what was done to it.
pub fn decision_reason(report: &LeaseReport) -> String {
    let text = report.to_string();
    let decision = format!(": {}", report.decision);
    match text.strip_suffix(&decision) {
        Some(reason) => reason.to_string(),
        None => text,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::lease::{NoScalingReason, UpReason};

    fn report(decision: LeaseDecision, disrupted: &[&str]) -> LeaseReport {
        LeaseReport {
            nodes_seen: 4,
            nodes: vec![],
            orphan_leases: vec![],
            candidates: 4,
            expired: 3,
            fraction: Some(0.75),
            threshold: 0.6,
            zones: disrupted
                .iter()
                .map(|z| ZoneReport {
                    zone: (*z).into(),
                    candidates: 2,
                    expired: 2,
                    disrupted: true,
                    too_small: false,
                })
                .collect(),
            decision,
        }
    }

    fn memory(success: u32, failure: u32) -> VerdictMemory {
        VerdictMemory {
            hysteresis: Hysteresis::new(success, failure),
            disrupted_zones: BTreeSet::new(),
        }
    }

    #[test]
    fn a_scale_down_acts_once_its_streak_meets_the_failure_threshold() {
        let down = report(LeaseDecision::ScaleDown, &[]);
        let (first, m) = verdict(&down, &memory(1, 2));
        assert_eq!(
            first.asked,
            Some(Flow {
                dir: Direction::Down,
                scope: FlowScope::All
            })
        );
        assert_eq!(first.streak, Streak::Counted { seen: 1, needed: 2 });
        assert_eq!(first.flow(), None);
        let (second, _) = verdict(&down, &m);
        assert_eq!(second.flow(), first.asked);
        assert_eq!(second.why, "3/4 node leases expired (0.75 ≥ 0.60)");
    }

    #[test]
    fn why_is_the_summary_without_the_decision() {
        let up = LeaseReport {
            expired: 0,
            fraction: Some(0.0),
            ..report(LeaseDecision::ScaleUp(UpReason::BelowThreshold), &[])
        };
        assert_eq!(
            decision_reason(&up),
            "0/4 node leases expired (0.00 < 0.60)"
        );
    }

    #[test]
    fn no_scaling_neither_counts_nor_resets_and_asks_for_nothing() {
        let none = report(
            LeaseDecision::NoScaling(NoScalingReason::SingleCandidate),
            &[],
        );
        let (_, m) = verdict(&report(LeaseDecision::ScaleDown, &[]), &memory(1, 2));
        let (v, m) = verdict(&none, &m);
        assert_eq!(
            (v.asked, v.streak, v.flow()),
            (None, Streak::NotCounted, None)
        );
        let (v, _) = verdict(&report(LeaseDecision::ScaleDown, &[]), &m);
        assert!(v.flow().is_some(), "the streak survived the NoScaling run");
    }

    #[test]
    fn a_zonal_scale_down_covers_the_zonal_targets_and_an_up_every_target() {
        let (v, _) = verdict(
            &report(LeaseDecision::ZonalScaleDown, &["a"]),
            &memory(1, 1),
        );
        assert_eq!(
            v.flow(),
            Some(Flow {
                dir: Direction::Down,
                scope: FlowScope::Zonal
            })
        );
        let (v, _) = verdict(
            &report(LeaseDecision::ScaleUp(UpReason::BelowThreshold), &[]),
            &memory(1, 1),
        );
        assert_eq!(
            v.flow(),
            Some(Flow {
                dir: Direction::Up,
                scope: FlowScope::All
            })
        );
    }

    #[test]
    fn zones_are_reported_when_they_change_and_remembered_for_the_next_run() {
        let (v, m) = verdict(
            &report(LeaseDecision::ZonalScaleDown, &["a", "b"]),
            &memory(1, 1),
        );
        let names = |zones: &[ZoneReport]| zones.iter().map(|z| z.zone.clone()).collect::<Vec<_>>();
        assert_eq!(names(&v.zones_disrupted), ["a", "b"]);
        assert!(v.zones_recovered.is_empty());
        let (v, m) = verdict(&report(LeaseDecision::ZonalScaleDown, &["b"]), &m);
        assert!(v.zones_disrupted.is_empty());
        assert_eq!(
            v.zones_recovered,
            [RecoveredZone {
                zone: "a".into(),
                now: None
            }]
        );
        assert_eq!(m.disrupted_zones, BTreeSet::from(["b".to_string()]));
    }
}
