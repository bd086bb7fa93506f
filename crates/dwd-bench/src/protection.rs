//! The protection bound (issue 34, docs/behaviour.md): how long after its leases expired a
//! shoot in outage may wait for its scale-down, and after its kubelets are back for its
//! restore, whatever the other shoots of the seed do, with the probe runs' memory budget full
//! of slow shoots.
//!
//! The leases cross the threshold (`nodeLeaseFailureFraction`) `0.75 ×
//! kcmNodeMonitorGraceDuration` after the kubelets' last renewal: the *crossing*. From it:
//!
//! ```text
//! scale-down ≤ (1 + j) × probeInterval + F + 3 × F + flow
//! restore    ≤ (1 + j) × probeInterval + F + 3 × F + flow_up      (from the recovery)
//! F          = min(probeTimeout / 2, 5 s)                         (the budget's prompt limit)
//! ```
//!
//! - `(1 + j) × probeInterval`: the next run of the shoot is due at most this long after the
//!   one before it ended (`j` = `backoffJitterFactor`);
//! - `F`: that run's own time, if prompt; `3 × F`: what the memory budget may make it wait for
//!   room (a run past `F` is ended for room for a waiter ahead of it, so room frees within `F`
//!   of a waiter's arrival while fewer wait ahead than the pool holds, and a shoot with a
//!   decision pending is ahead of every shoot without one);
//! - `flow`: the scale-down flow's levels at the seed's qps: every scale-down write the
//!   outage needs across the seed (one per target of every affected shoot: all of them cross
//!   at once, and their writes share one budget) ÷ `--kube-api-qps`, plus each level's
//!   `initialDelay` (Gardener's scale-down has none); `flow_up` the same for the restore, with
//!   the scale-up levels' `initialDelay`s (Gardener's: MCM's 30 s). The burst is not
//!   subtracted.
//!
//! The *recovery* is the moment enough kubelets renewed that fewer than the threshold's
//! leases are expired; the restore is timed to the last of the shoot's targets back, from its
//! last recovery before that (storm's rule: a relapse starts the clock anew).
//!
//! The bound is ours; any other binary's figures are judged against it for comparison only.

use std::collections::BTreeMap;
use std::time::Duration;

use dwd_core::ProberConfig;
use serde_json::{Value, json};

use crate::stats::Summary;
use crate::storm::Restore;

/// The memory budget's prompt limit caps at this (`memory_budget::PROMPT_WITHIN` of the
/// watchdog: a prompt shoot answers well within it).
pub(crate) const PROMPT_WITHIN: Duration = Duration::from_secs(5);

/// `F`: a run is prompt if it ends within half its `probeTimeout`, at most [`PROMPT_WITHIN`].
pub(crate) fn prompt_limit(probe_timeout: Duration) -> Duration {
    (probe_timeout / 2).min(PROMPT_WITHIN)
}

/// How long a whole flow waits in `initialDelay`s: each level waits for its longest.
pub(crate) fn level_delays(config: &ProberConfig, down: bool) -> Duration {
    let mut by_level: BTreeMap<u32, Duration> = BTreeMap::new();
    for i in &config.dependent_resource_infos {
        let info = if down { &i.scale_down } else { &i.scale_up };
        let d = by_level.entry(info.level).or_default();
        *d = (*d).max(info.initial_delay);
    }
    by_level.values().sum()
}

/// The bound's terms.
#[derive(Debug, Clone)]
pub(crate) struct Terms {
    /// `probeInterval`, seconds.
    pub interval_s: f64,
    /// `backoffJitterFactor`.
    pub jitter: f64,
    /// `F`, seconds.
    pub prompt_limit_s: f64,
    /// `--kube-api-qps`.
    pub qps: f64,
    /// Scale-down writes of every affected shoot (one per target).
    pub down_writes: usize,
    /// The scale-down levels' `initialDelay`s, summed, seconds.
    pub down_delays_s: f64,
    /// Restore writes of every affected shoot (one per target).
    pub up_writes: usize,
    /// The scale-up levels' `initialDelay`s, summed, seconds.
    pub up_delays_s: f64,
}

impl Terms {
    /// The terms for `affected` shoots under `config`, with the seed's `qps`.
    pub(crate) fn new(config: &ProberConfig, affected: usize, qps: f64) -> Terms {
        let targets = config.dependent_resource_infos.len();
        Terms {
            interval_s: config.probe_interval.as_secs_f64(),
            jitter: config.backoff_jitter_factor.max(0.0),
            prompt_limit_s: prompt_limit(config.probe_timeout).as_secs_f64(),
            qps: qps.max(0.01),
            down_writes: affected * targets,
            down_delays_s: level_delays(config, true).as_secs_f64(),
            up_writes: affected * targets,
            up_delays_s: level_delays(config, false).as_secs_f64(),
        }
    }

    /// `(1 + j) × probeInterval + F + 3 × F`: the run that sees the change, and its room.
    fn run_s(&self) -> f64 {
        (1.0 + self.jitter) * self.interval_s + 4.0 * self.prompt_limit_s
    }

    /// Crossing → every target of the shoot at 0, seconds.
    pub(crate) fn scale_down_s(&self) -> f64 {
        self.run_s() + self.down_writes as f64 / self.qps + self.down_delays_s
    }

    /// Recovery → every target of the shoot back, seconds.
    pub(crate) fn restore_s(&self) -> f64 {
        self.run_s() + self.up_writes as f64 / self.qps + self.up_delays_s
    }
}

/// One affected shoot's outage.
#[derive(Debug, Clone)]
pub(crate) struct ShootOutage {
    /// Its namespace.
    pub namespace: String,
    /// Each target: crossing → its first 0 after the silence, seconds (`None`: it never went
    /// down, or the shoot never crossed).
    pub down_s: Vec<(String, Option<f64>)>,
    /// How it came back ([`crate::storm::ShootStorm::restore`]).
    pub restore: Restore,
}

/// Shoots named at most, per list of the result.
const NAMED: usize = 20;

/// The `bound` object: the formula of the protection bound, its terms and its two values.
fn bound_json(terms: &Terms) -> Value {
    json!({
        "formula": "from the crossing: (1 + j) × probeInterval + F + 3 × F + flow; from the recovery: the same with flow_up; F = min(probeTimeout / 2, 5 s); flow = every affected shoot's scale-down writes (one per target) ÷ qps + the scale-down levels' initialDelays; flow_up the same with the scale-up levels' initialDelays",
        "probe_interval_s": terms.interval_s,
        "jitter": terms.jitter,
        "prompt_limit_s": terms.prompt_limit_s,
        "qps": terms.qps,
        "scale_down_writes": terms.down_writes,
        "scale_down_initial_delays_s": terms.down_delays_s,
        "scale_up_writes": terms.up_writes,
        "scale_up_initial_delays_s": terms.up_delays_s,
        "scale_down_s": terms.scale_down_s(),
        "restore_s": terms.restore_s(),
    })
}

/// The shoots' outcomes as [`judge`] gathers them, one shoot at a time.
#[derive(Default)]
struct Tally<'a> {
    /// Per target: crossing → 0, seconds, of every shoot that took it down.
    by_target: BTreeMap<&'a str, Vec<f64>>,
    /// Per shoot scaled down: its slowest target's crossing → 0.
    worst_per_shoot: Vec<f64>,
    /// Shoots with a target never down.
    not_down: Vec<Value>,
    /// Shoots whose slowest target went down after the bound.
    down_over: Vec<Value>,
    /// Per shoot restored: last recovery → restored, and first recovery → restored.
    restored: Vec<f64>,
    restored_from_first: Vec<f64>,
    /// Shoots not restored, or never recovered.
    not_restored: Vec<Value>,
    /// Shoots restored after the bound.
    up_over: Vec<Value>,
}

impl<'a> Tally<'a> {
    /// Shoot `s`'s scale-down: each target's crossing → 0, its slowest against `down_bound`.
    fn scale_down(&mut self, s: &'a ShootOutage, down_bound: f64) {
        let mut worst: Option<(&str, f64)> = None;
        let mut missing = Vec::new();
        for (target, d) in &s.down_s {
            match d {
                Some(d) => {
                    self.by_target.entry(target).or_default().push(*d);
                    if worst.is_none_or(|(_, w)| *d > w) {
                        worst = Some((target, *d));
                    }
                }
                None => missing.push(target.as_str()),
            }
        }
        if !missing.is_empty() {
            self.not_down
                .push(json!({"shoot": s.namespace, "targets_never_down": missing}));
        } else if let Some((target, w)) = worst {
            self.worst_per_shoot.push(w);
            if w > down_bound {
                self.down_over
                    .push(json!({"shoot": s.namespace, "target": target, "crossing_to_0_s": w}));
            }
        }
    }

    /// Shoot `s`'s restore against `up_bound`.
    fn restore(&mut self, s: &ShootOutage, up_bound: f64) {
        match s.restore {
            Restore::Restored {
                from_last_recovery_s,
                from_first_recovery_s,
            } => {
                self.restored.push(from_last_recovery_s);
                self.restored_from_first.push(from_first_recovery_s);
                if from_last_recovery_s > up_bound {
                    self.up_over.push(json!({"shoot": s.namespace, "recovery_to_restored_s": from_last_recovery_s}));
                }
            }
            Restore::NotRestored | Restore::NeverRecovered => {
                self.not_restored
                    .push(json!({"shoot": s.namespace, "how": format!("{:?}", s.restore)}));
            }
            Restore::NotDown => {}
        }
    }
}

/// The `protection` object: per shoot, crossing → each target 0 and recovery → restored,
/// judged against the bound.
pub(crate) fn judge(terms: &Terms, shoots: &[ShootOutage]) -> Value {
    let mut tally = Tally::default();
    for s in shoots {
        tally.scale_down(s, terms.scale_down_s());
        tally.restore(s, terms.restore_s());
    }
    let Tally {
        by_target,
        worst_per_shoot,
        not_down,
        down_over,
        restored,
        restored_from_first,
        not_restored,
        up_over,
    } = tally;
    let named = |v: &[Value]| v.iter().take(NAMED).cloned().collect::<Vec<_>>();
    let met = not_down.is_empty()
        && down_over.is_empty()
        && not_restored.is_empty()
        && up_over.is_empty();
    json!({
        "bound": bound_json(terms),
        "shoots": shoots.len(),
        "scale_down": {
            "crossing_to_0_by_target_s": by_target
                .iter()
                .map(|(k, v)| (k.to_string(), Summary::of(v).to_json()))
                .collect::<serde_json::Map<_, _>>(),
            "worst_target_per_shoot_s": Summary::of(&worst_per_shoot).to_json(),
            "shoots_scaled_down": worst_per_shoot.len(),
            "shoots_not_scaled_down": not_down.len(),
            "not_scaled_down": named(&not_down),
            "shoots_over_bound": down_over.len(),
            "over_bound": named(&down_over),
        },
        "restore": {
            "recovery_to_restored_s": Summary::of(&restored).to_json(),
            "first_recovery_to_restored_s": Summary::of(&restored_from_first).to_json(),
            "shoots_restored": restored.len(),
            "shoots_not_restored": not_restored.len(),
            "not_restored": named(&not_restored),
            "shoots_over_bound": up_over.len(),
            "over_bound": named(&up_over),
        },
        "met": met,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn terms() -> Terms {
        Terms {
            interval_s: 10.0,
            jitter: 0.2,
            prompt_limit_s: 5.0,
            qps: 20.0,
            down_writes: 300,
            down_delays_s: 0.0,
            up_writes: 300,
            up_delays_s: 30.0,
        }
    }

    #[test]
    fn the_bound_is_the_interval_with_jitter_four_prompt_limits_and_the_flow() {
        let t = terms();
        // 12 + 20 + 300 / 20 = 47; the restore waits MCM's 30 s on top.
        assert!((t.scale_down_s() - 47.0).abs() < 1e-9);
        assert!((t.restore_s() - 77.0).abs() < 1e-9);
        assert_eq!(
            prompt_limit(Duration::from_secs(30)),
            Duration::from_secs(5)
        );
        assert_eq!(prompt_limit(Duration::from_secs(4)), Duration::from_secs(2));
    }

    #[test]
    fn a_shoot_is_judged_by_its_worst_target_and_its_last_recovery() {
        let shoot = |ns: &str, down: &[Option<f64>], restore| ShootOutage {
            namespace: ns.into(),
            down_s: ["mcm", "ca", "kcm"]
                .iter()
                .zip(down)
                .map(|(t, d)| (t.to_string(), *d))
                .collect(),
            restore,
        };
        let restored = |last, first| Restore::Restored {
            from_last_recovery_s: last,
            from_first_recovery_s: first,
        };
        let shoots = [
            shoot(
                "a",
                &[Some(3.0), Some(3.1), Some(9.0)],
                restored(40.0, 40.0),
            ),
            // Its KCM is over 47 s; restored 80 s after its last recovery (a relapse: 200 s
            // after its first), over 77 s.
            shoot(
                "b",
                &[Some(3.0), Some(3.0), Some(50.0)],
                restored(80.0, 200.0),
            ),
            // CA never went down: not scaled down, whatever the others did.
            shoot("c", &[Some(1.0), None, Some(2.0)], Restore::NotRestored),
        ];
        let j = judge(&terms(), &shoots);
        let d = &j["scale_down"];
        assert_eq!(d["shoots_scaled_down"], 2);
        assert_eq!(d["shoots_not_scaled_down"], 1);
        assert_eq!(d["shoots_over_bound"], 1);
        assert_eq!(d["over_bound"][0]["shoot"], "b");
        assert_eq!(d["over_bound"][0]["target"], "kcm");
        assert_eq!(d["worst_target_per_shoot_s"]["max"], 50.0);
        assert_eq!(d["crossing_to_0_by_target_s"]["ca"]["max"], 3.1);
        let r = &j["restore"];
        assert_eq!(r["shoots_restored"], 2);
        assert_eq!(r["shoots_not_restored"], 1);
        assert_eq!(r["shoots_over_bound"], 1);
        assert_eq!(r["over_bound"][0]["shoot"], "b");
        assert_eq!(j["met"], false);
        let fine = judge(&terms(), &shoots[..1]);
        assert_eq!(fine["met"], true);
    }
}
