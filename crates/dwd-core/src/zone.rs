//! Zonal outages (docs/behaviour.md §2.19): the lease rule applied to each zone on its own.
//!
//! The shoot-wide rule misses a zone that loses its way to the control plane (one NAT gateway
//! of three: a third of the leases expire, below any sensible threshold), while the node
//! lifecycle controller keeps evicting from that zone and machine-controller-manager replaces
//! its healthy machines with new ones that cannot reach the control plane either. So the
//! candidates of the lease rule are grouped by their node's [`ZONE_LABEL`]; a zone with enough
//! candidates whose share of expired leases reaches its own threshold is *disrupted*. Zones
//! are always judged and reported; they change the decision only when zonal protection is
//! configured (some target has `scaleDownOnZoneOutage: true`), and then only below the
//! shoot-wide rule, which keeps priority (see [`crate::lease::LeaseDecision::ZonalScaleDown`]).

use std::collections::BTreeMap;
use std::fmt;

/// The well-known node label naming a node's zone. Nodes without it belong to no zone: they
/// count for the shoot-wide rule only.
pub const ZONE_LABEL: &str = "topology.kubernetes.io/zone";

/// Default for `minCandidatesPerZone` (ours): a zone of one node cannot tell its node's own
/// failure from the zone's, just as a shoot of one node cannot (docs/behaviour.md §2.19).
pub const DEFAULT_MIN_CANDIDATES_PER_ZONE: u32 = 2;

/// When a zone counts as disrupted, and whether that is acted on.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct ZoneRule {
    /// A zone is disrupted when `expired / candidates` reaches this (`zoneLeaseFailureFraction`).
    pub failure_fraction: f64,
    /// … and it has at least this many candidates (`minCandidatesPerZone`).
    pub min_candidates: usize,
    /// Zonal protection is configured: some target is scaled down for a disrupted zone.
    /// Without it, disrupted zones are only reported.
    pub protection: bool,
}

impl ZoneRule {
    /// Zones reported, never acted on: the rule of a configuration without zonal fields.
    pub const fn report_only(failure_fraction: f64) -> Self {
        ZoneRule {
            failure_fraction,
            min_candidates: DEFAULT_MIN_CANDIDATES_PER_ZONE as usize,
            protection: false,
        }
    }
}

/// One zone's share of the lease verdict.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ZoneReport {
    /// The value of [`ZONE_LABEL`].
    pub zone: String,
    /// Candidate nodes in the zone.
    pub candidates: usize,
    /// Of those, with an expired lease.
    pub expired: usize,
    /// Whether the zone is disrupted under the rule it was judged by.
    pub disrupted: bool,
    /// Whether it had too few candidates to be judged at all.
    pub too_small: bool,
}

impl ZoneReport {
    /// `expired / candidates` (never NaN: a zone is only reported with candidates).
    pub fn fraction(&self) -> f64 {
        if self.candidates == 0 {
            0.0
        } else {
            self.expired as f64 / self.candidates as f64
        }
    }
}

impl fmt::Display for ZoneReport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let noun = if self.candidates == 1 {
            "node lease"
        } else {
            "node leases"
        };
        write!(
            f,
            "zone {}: {}/{} {noun} expired",
            self.zone, self.expired, self.candidates
        )?;
        if self.disrupted {
            f.write_str(", disrupted")
        } else if self.too_small {
            f.write_str(", too few candidates to judge")
        } else {
            Ok(())
        }
    }
}

/// Judges every zone from `(zone, expired)` of each candidate (candidates without a zone are
/// left out). Sorted by zone name.
pub fn judge_zones<'a>(
    candidates: impl IntoIterator<Item = (Option<&'a str>, bool)>,
    rule: &ZoneRule,
) -> Vec<ZoneReport> {
    let mut by_zone: BTreeMap<&str, (usize, usize)> = BTreeMap::new();
    for (zone, expired) in candidates {
        let Some(zone) = zone else { continue };
        let entry = by_zone.entry(zone).or_default();
        entry.0 += 1;
        if expired {
            entry.1 += 1;
        }
    }
    by_zone
        .into_iter()
        .map(|(zone, (candidates, expired))| {
            let too_small = candidates < rule.min_candidates.max(1);
            let fraction = expired as f64 / candidates as f64;
            ZoneReport {
                zone: zone.to_owned(),
                candidates,
                expired,
                disrupted: !too_small && fraction >= rule.failure_fraction,
                too_small,
            }
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rule(min: usize) -> ZoneRule {
        ZoneRule {
            failure_fraction: 0.6,
            min_candidates: min,
            protection: true,
        }
    }

    /// `(zone, candidates, expired)` → `(disrupted, too_small)`, one row per case.
    #[test]
    fn zone_table() {
        let rows: &[(&str, usize, usize, usize, bool, bool)] = &[
            // zone, candidates, expired, min, disrupted, too small
            ("all expired", 3, 3, 2, true, false),
            ("exactly the threshold", 5, 3, 2, true, false),
            ("just below", 5, 2, 2, false, false),
            ("none expired", 4, 0, 2, false, false),
            ("at the minimum", 2, 2, 2, true, false),
            ("below the minimum never counts", 2, 2, 3, false, true),
            ("one node", 1, 1, 2, false, true),
        ];
        for &(zone, candidates, expired, min, disrupted, too_small) in rows {
            let votes = (0..candidates).map(|i| (Some(zone), i < expired));
            let got = judge_zones(votes, &rule(min));
            assert_eq!(
                got,
                vec![ZoneReport {
                    zone: zone.to_owned(),
                    candidates,
                    expired,
                    disrupted,
                    too_small
                }],
                "{zone}"
            );
        }
    }

    #[test]
    fn nodes_without_a_zone_form_no_zone_and_zones_are_sorted() {
        let votes = [
            (Some("b"), true),
            (None, true),
            (Some("a"), false),
            (None, true),
            (Some("a"), false),
            (Some("b"), true),
        ];
        let got = judge_zones(votes, &rule(2));
        let names: Vec<_> = got.iter().map(|z| (z.zone.as_str(), z.disrupted)).collect();
        assert_eq!(names, [("a", false), ("b", true)]);
    }

    #[test]
    fn display_says_what_an_event_says() {
        let z = ZoneReport {
            zone: "eu-1a".into(),
            candidates: 7,
            expired: 7,
            disrupted: true,
            too_small: false,
        };
        assert_eq!(
            z.to_string(),
            "zone eu-1a: 7/7 node leases expired, disrupted"
        );
        assert_eq!(z.fraction(), 1.0);
    }
}
