//! Optional hysteresis between lease decisions and scaling (docs/behaviour.md §2.9).
//!
//! The redesign document proposed `successThreshold`/`failureThreshold` so that one flaky probe
//! run does not scale a control plane down. The reference never shipped it, so the default of 1/1
//! must reproduce its behaviour exactly: act on every decision.

use std::fmt;

use crate::config::ProberConfig;
use crate::lease::LeaseDecision;

/// The direction a scaling flow runs in.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Direction {
    /// Restore the targets' replicas, in `scaleUp` level order: the shoot's nodes are back.
    Up,
    /// Scale the targets to zero, in `scaleDown` level order: the shoot's nodes (or, for
    /// targets with `scaleDownOnZoneOutage`, one zone's) look cut off.
    Down,
}

impl fmt::Display for Direction {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Self::Up => "scale up",
            Self::Down => "scale down",
        })
    }
}

/// Counts consecutive decisions per direction and releases a direction once its threshold is met.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Hysteresis {
    success_threshold: u32,
    failure_threshold: u32,
    consecutive_up: u32,
    consecutive_down: u32,
}

impl Hysteresis {
    /// Thresholds below 1 are treated as 1 (the config loader already rejects them).
    pub fn new(success_threshold: u32, failure_threshold: u32) -> Self {
        Self {
            success_threshold: success_threshold.max(1),
            failure_threshold: failure_threshold.max(1),
            consecutive_up: 0,
            consecutive_down: 0,
        }
    }

    /// The thresholds, with streaks of `up` and `down` runs in a row already counted: a
    /// decision record's memory, replayed ([`crate::record`]).
    pub fn with_streaks(
        success_threshold: u32,
        failure_threshold: u32,
        up: u32,
        down: u32,
    ) -> Self {
        Self {
            consecutive_up: up,
            consecutive_down: down,
            ..Self::new(success_threshold, failure_threshold)
        }
    }

    /// Counters with the config's `successThreshold` and `failureThreshold` (both default 1,
    /// which acts on every decision as the reference does).
    pub fn from_config(config: &ProberConfig) -> Self {
        Self::new(config.success_threshold, config.failure_threshold)
    }

    /// Records one lease decision and returns the direction to act on, if any. `ScaleDown` needs
    /// `failure_threshold` in a row, `ScaleUp` needs `success_threshold` in a row (each resets the
    /// other's streak); once reached, every further decision in the same direction acts again
    /// (scaling an already-scaled target is a no-op). `NoScaling` neither counts nor resets: a
    /// single-node shoot says nothing about the trend.
    pub fn observe(&mut self, d: &LeaseDecision) -> Option<Direction> {
        match d {
            LeaseDecision::ScaleDown | LeaseDecision::ZonalScaleDown => {
                self.consecutive_up = 0;
                self.consecutive_down = self.consecutive_down.saturating_add(1);
                (self.consecutive_down >= self.failure_threshold).then_some(Direction::Down)
            }
            LeaseDecision::ScaleUp(_) => {
                self.consecutive_down = 0;
                self.consecutive_up = self.consecutive_up.saturating_add(1);
                (self.consecutive_up >= self.success_threshold).then_some(Direction::Up)
            }
            LeaseDecision::NoScaling(_) => None,
        }
    }

    /// Forgets both streaks (e.g. when a probe is restarted with new settings).
    pub fn reset(&mut self) {
        self.consecutive_up = 0;
        self.consecutive_down = 0;
    }

    /// The thresholds `(success, failure)`: runs in a row a scale-up (a scale-down) needs.
    pub fn thresholds(&self) -> (u32, u32) {
        (self.success_threshold, self.failure_threshold)
    }

    /// Current streaks `(up, down)`, for metrics and `explain`.
    pub fn streaks(&self) -> (u32, u32) {
        (self.consecutive_up, self.consecutive_down)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::lease::{NoScalingReason, UpReason};

    const DOWN: LeaseDecision = LeaseDecision::ScaleDown;
    const UP: LeaseDecision = LeaseDecision::ScaleUp(UpReason::BelowThreshold);
    const NONE: LeaseDecision = LeaseDecision::NoScaling(NoScalingReason::SingleCandidate);

    #[test]
    fn thresholds_of_one_act_on_every_decision() {
        let mut h = Hysteresis::new(1, 1);
        assert_eq!(h.observe(&DOWN), Some(Direction::Down));
        assert_eq!(h.observe(&UP), Some(Direction::Up));
        assert_eq!(h.observe(&DOWN), Some(Direction::Down));
        assert_eq!(h.observe(&NONE), None);
        assert_eq!(
            h.observe(&LeaseDecision::ScaleUp(UpReason::NoCandidates)),
            Some(Direction::Up)
        );
    }

    #[test]
    fn scale_down_waits_for_failure_threshold_consecutive_results() {
        let mut h = Hysteresis::new(1, 3);
        assert_eq!(h.observe(&DOWN), None);
        assert_eq!(h.observe(&DOWN), None);
        assert_eq!(h.observe(&DOWN), Some(Direction::Down));
        assert_eq!(h.observe(&DOWN), Some(Direction::Down));
    }

    #[test]
    fn an_opposite_result_resets_the_streak() {
        let mut h = Hysteresis::new(2, 2);
        assert_eq!(h.observe(&DOWN), None);
        assert_eq!(h.observe(&UP), None);
        assert_eq!(h.observe(&DOWN), None);
        assert_eq!(h.observe(&DOWN), Some(Direction::Down));
        assert_eq!(h.observe(&UP), None);
        assert_eq!(h.observe(&UP), Some(Direction::Up));
    }

    #[test]
    fn no_scaling_neither_counts_nor_resets() {
        let mut h = Hysteresis::new(1, 2);
        assert_eq!(h.observe(&DOWN), None);
        assert_eq!(h.observe(&NONE), None);
        assert_eq!(h.streaks(), (0, 1));
        assert_eq!(h.observe(&DOWN), Some(Direction::Down));
    }

    #[test]
    fn zero_thresholds_behave_like_one_and_reset_clears() {
        let mut h = Hysteresis::new(0, 0);
        assert_eq!(h.observe(&DOWN), Some(Direction::Down));
        h.reset();
        assert_eq!(h.streaks(), (0, 0));
    }

    #[test]
    fn direction_displays_as_words() {
        assert_eq!(Direction::Up.to_string(), "scale up");
        assert_eq!(Direction::Down.to_string(), "scale down");
    }
}
