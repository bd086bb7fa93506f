//! The worst day, measured (issue 25): a mass outage that ends (`--outage-for`) while the
//! scaling flows still queue behind the seed's request budget. Per shoot, from what the
//! apiservers and the replica watch recorded (so the numbers hold for any binary):
//!
//! - **probe lateness during the storm**: gaps between consecutive `GET /version` of a shoot,
//!   both within the storm (from the silence until every target is back), minus the
//!   interval; bound `probeInterval × jitter + 2 s` (a run's own duration);
//! - **recovery → restored**: from the moment enough kubelets renewed that fewer than the
//!   threshold's leases are expired (the last such moment before the restore: a shoot that
//!   relapsed was rightly scaled down again and recovered anew), to the last restore of the
//!   shoot's targets; bound
//!   `restore writes ÷ qps + the scale-up initialDelays + probeInterval × (1 + jitter)` (the
//!   whole seed's restore writes may queue before this shoot's; the delays are the config's;
//!   the probe must run once to see the recovery);
//! - **wasted scale-down writes**: writes that took a target of a recovered shoot down. Those
//!   sent later than `recovered + probeInterval × (1 + jitter) + 2 s` (a run after the
//!   recovery has seen it: the watchdog could know) are (a); those before are (b), which no
//!   watchdog can avoid (a run that judged just before the recovery). A write of (a) whose
//!   shoot had *relapsed* is neither: if, when the shoot's last run answered before the write
//!   (every request of the run answered whole before the write arrived: a run still waiting
//!   for an answer has no verdict the write could follow) asked for its leases (its first
//!   request besides its `GET /version`), enough of them were expired
//!   again to reach the threshold (its simulated kubelets, renewing on a loaded machine, let
//!   them lapse), the scale-down was the right answer to what the leases said; such writes
//!   are counted as relapses. Leases are judged as the apiserver held them: a renewal counts
//!   from when it landed (its `renewTime` is taken before the write is sent, and a loaded
//!   apiserver acknowledges it seconds later);
//! - **probe lateness after the run**: the same gaps, measured from the previous run's last
//!   request (its lease or node list) instead of its `GET /version`: what is left is the
//!   schedule's own delay (jitter and any wait), without the run's own duration;
//! - **a run's span at the apiserver**: from its first request until its last answer was sent
//!   whole (the audit event's `stageTimestamp`), and the lateness split by it: after runs that
//!   took up to a fifth of the interval (what ours takes back out of its wait, so its lateness
//!   there is the jitter and the next connection) and after longer ones.
//!
//! A run's requests are those of its probe user received from half an interval before its
//! `GET /version` until half an interval before the next run's ([`sent_together`]: a run that
//! sends its lists together with its `GET /version` may have them received first).
//!
//! A write is a scale-down write when the target was running when it was sent and its next
//! replica change went to 0 (the reference's annotate-then-scale counts two); a scale-up write
//! when the target was at 0 and its next change went above 0.

use std::collections::BTreeMap;

use chrono::{DateTime, Utc};
use serde_json::{Value, json};

use crate::stats::Summary;

/// One affected shoot's record of the storm.
#[derive(Debug, Default)]
pub(crate) struct ShootStorm {
    /// The shoot's namespace.
    pub namespace: String,
    /// When fewer than the threshold's leases were expired again (`None`: never).
    pub recovered: Option<DateTime<Utc>>,
    /// Target → its replica changes (time, `spec.replicas`) from before the silence on, in
    /// order; a target without a change was running throughout.
    pub replicas: BTreeMap<String, Vec<(DateTime<Utc>, i32)>>,
    /// Receive times of the shoot's `GET /version` (the watchdog's probes), sorted.
    pub probes: Vec<DateTime<Utc>>,
    /// Every request of the shoot's probe user (each run's `GET /version` and lists): when the
    /// apiserver received it and when it had answered it whole, sorted by receive time.
    pub requests: Vec<crate::audit::Span>,
    /// Each node's renewals from its last one before the resumption on, in order.
    pub renewals: Vec<Vec<Renewal>>,
    /// The watchdog's writes to the shoot's targets: (receive time, target).
    pub writes: Vec<(DateTime<Utc>, String)>,
}

/// One lease renewal of a simulated kubelet.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Renewal {
    /// The `renewTime` written (taken before the write was sent).
    pub at: DateTime<Utc>,
    /// When the apiserver acknowledged it: until then it served the renewal before.
    pub landed: DateTime<Utc>,
}

impl ShootStorm {
    /// The `GET /version` of the shoot's last run whose every request (see [`Self::runs`])
    /// was answered whole by `t` (the newest run whose verdict a write received at `t` can
    /// follow), with those requests.
    fn last_answered_run(
        &self,
        t: DateTime<Utc>,
        sent_together: chrono::Duration,
    ) -> Option<(DateTime<Utc>, &[crate::audit::Span])> {
        self.runs(sent_together).rev().find(|(probe, requests)| {
            *probe <= t && requests.iter().all(|(_, answered)| *answered <= t)
        })
    }

    /// When [`Self::last_answered_run`] by `t` asked for the leases: its first request other
    /// than its `GET /version` (the lease list, sent after it or, with the node list, together
    /// with it), else the `GET /version`.
    fn leases_asked_by_last_run_answered_by(
        &self,
        t: DateTime<Utc>,
        sent_together: chrono::Duration,
    ) -> Option<DateTime<Utc>> {
        let (probe, requests) = self.last_answered_run(t, sent_together)?;
        Some(
            requests
                .iter()
                .map(|r| r.0)
                .filter(|r| *r != probe)
                .min()
                .unwrap_or(probe),
        )
    }

    /// [`Self::last_answered_run`]'s `GET /version` alone (what the tests check).
    #[cfg(test)]
    fn last_run_answered_by(
        &self,
        t: DateTime<Utc>,
        sent_together: chrono::Duration,
    ) -> Option<DateTime<Utc>> {
        self.last_answered_run(t, sent_together)
            .map(|(probe, _)| probe)
    }

    /// Each run: its `GET /version` and its requests, those received from `sent_together`
    /// before it until `sent_together` before the next run's (see [`sent_together`]).
    fn runs(
        &self,
        sent_together: chrono::Duration,
    ) -> impl DoubleEndedIterator<Item = (DateTime<Utc>, &[crate::audit::Span])> + '_ {
        let index_from = move |t: DateTime<Utc>| {
            self.requests
                .partition_point(|(received, _)| *received < t - sent_together)
        };
        self.probes.iter().enumerate().map(move |(i, &probe)| {
            let from = index_from(probe);
            let to = self
                .probes
                .get(i + 1)
                .map_or(self.requests.len(), |next| index_from(*next));
            (probe, &self.requests[from..to.max(from)])
        })
    }
}

/// How long before its `GET /version` a request of the same run may reach the apiserver: half
/// the interval. Ours sends the lists of a shoot that is scaled down together with its
/// `GET /version` over one connection, and a loaded apiserver may receive them first (a
/// second apart was seen at 1,000 shoots); a run's requests counted only from its
/// `GET /version` on gave its lists to the run before, whose span then reached into the next
/// run and whose leases were judged a run too late. No request of the run before arrives this
/// late: each is received before that run ends, and the next run starts at least
/// 0.8 × the interval after that (ours, docs/behaviour.md §2.4; the reference waits the whole
/// interval).
pub(crate) fn sent_together(interval_s: f64) -> chrono::Duration {
    chrono::Duration::milliseconds((interval_s * 500.0) as i64)
}

impl Renewal {
    /// A renewal that landed at its own time.
    pub(crate) fn at_once(at: DateTime<Utc>) -> Renewal {
        Renewal { at, landed: at }
    }
}

impl ShootStorm {
    /// The moments at which the shoot's expired leases fell below `needed` again (from every
    /// node's renewals: a lease is expired from `validity_s` after a renewal's `renewTime`
    /// until the next renewal lands), in order; an expiry at the same moment as a renewal
    /// counts first.
    fn recoveries(&self, validity_s: f64, needed: usize) -> Vec<DateTime<Utc>> {
        let validity = chrono::Duration::milliseconds((validity_s * 1000.0) as i64);
        // (time, +1 expired / −1 renewed while expired)
        let mut changes: Vec<(DateTime<Utc>, i32)> = Vec::new();
        for times in &self.renewals {
            for (i, r) in times.iter().enumerate() {
                let expires = r.at + validity;
                match times.get(i + 1) {
                    Some(next) if next.landed <= expires => {}
                    Some(next) => changes.extend([(expires, 1), (next.landed, -1)]),
                    None => changes.push((expires, 1)),
                }
            }
        }
        changes.sort_by_key(|(t, d)| (*t, -d));
        let mut expired = 0i64;
        let needed = i64::try_from(needed).unwrap_or(i64::MAX);
        let mut out = Vec::new();
        for (t, d) in changes {
            let before = expired;
            expired += i64::from(d);
            if before >= needed && expired < needed {
                out.push(t);
            }
        }
        out
    }

    /// How many of the shoot's leases were expired at `t`: a node whose latest renewal
    /// landed by then has a `renewTime` `validity_s` old or older (or that has none by then).
    fn expired_at(&self, t: DateTime<Utc>, validity_s: f64) -> usize {
        self.renewals
            .iter()
            .filter(|times| {
                times
                    .iter()
                    .rev()
                    .find(|r| r.landed <= t)
                    .is_none_or(|r| secs(r.at, t) >= validity_s)
            })
            .count()
    }
}

/// The storm's frame and the bounds' terms.
#[derive(Debug)]
pub(crate) struct StormFrame {
    /// When every kubelet went silent.
    pub silenced_at: DateTime<Utc>,
    /// When they renewed again (`--outage-for` after the silence).
    pub resumed_at: DateTime<Utc>,
    /// When every target that went down was back (or the wait gave up).
    pub restored_by: DateTime<Utc>,
    /// `probeInterval`, seconds.
    pub interval_s: f64,
    /// `backoffJitterFactor`.
    pub jitter: f64,
    /// `--kube-api-qps`.
    pub qps: f64,
    /// The scale-up `initialDelay`s a restore waits out, seconds (summed over levels).
    pub scale_up_delays_s: f64,
    /// How long a renewed lease stays valid (0.75 × `kcmNodeMonitorGraceDuration`), seconds.
    pub lease_validity_s: f64,
    /// Fewest expired leases of a shoot that reach the threshold.
    pub expired_needed: usize,
}

/// How a shoot came back after the outage.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) enum Restore {
    /// No target of it went down after the silence.
    NotDown,
    /// A target that went down is still down (at the end of the storm's records).
    NotRestored,
    /// Every target is back, but its leases never recovered in the records (cannot be timed).
    NeverRecovered,
    /// Every target that went down is back: from the shoot's last recovery before the last
    /// target came back (a relapse starts the clock anew), and from its first recovery, to
    /// that moment, seconds.
    Restored {
        /// From the last recovery before the restore.
        from_last_recovery_s: f64,
        /// From the first recovery.
        from_first_recovery_s: f64,
    },
}

impl ShootStorm {
    /// How the shoot came back: it is back when every target that went down after the
    /// silence is up again (its last replica change above 0), timed from its last recovery
    /// before that (a relapse was rightly scaled down again and recovered anew).
    pub(crate) fn restore(&self, frame: &StormFrame) -> Restore {
        let mut back: Option<DateTime<Utc>> = None;
        let mut still_down = false;
        let mut went_down = false;
        for changes in self.replicas.values() {
            if !changes
                .iter()
                .any(|(t, r)| *t >= frame.silenced_at && *r == 0)
            {
                continue;
            }
            went_down = true;
            match changes.last() {
                Some((t, r)) if *r > 0 => back = Some(back.map_or(*t, |b| b.max(*t))),
                _ => still_down = true,
            }
        }
        if !went_down {
            return Restore::NotDown;
        }
        if still_down {
            return Restore::NotRestored;
        }
        let last_recovery = back.and_then(|b| {
            self.recoveries(frame.lease_validity_s, frame.expired_needed)
                .into_iter()
                .rfind(|t| *t <= b)
        });
        match (self.recovered, back) {
            (Some(r), Some(b)) => {
                let from = last_recovery.map_or(r, |l| l.max(r));
                Restore::Restored {
                    from_last_recovery_s: secs(from, b).max(0.0),
                    from_first_recovery_s: secs(r, b).max(0.0),
                }
            }
            _ => Restore::NeverRecovered,
        }
    }
}

/// What a write did to its target.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum WriteKind {
    Down,
    Up,
    Other,
}

/// Replicas of a target at `t` from its `changes` (running, as every target starts, when none
/// came before).
fn replicas_at(changes: &[(DateTime<Utc>, i32)], t: DateTime<Utc>) -> Option<i32> {
    changes
        .iter()
        .rev()
        .find(|(at, _)| *at <= t)
        .map(|(_, r)| *r)
}

fn classify(changes: &[(DateTime<Utc>, i32)], t: DateTime<Utc>) -> WriteKind {
    let running = replicas_at(changes, t).is_none_or(|r| r > 0);
    let next = changes.iter().find(|(at, _)| *at >= t).map(|(_, r)| *r);
    match (running, next) {
        (true, Some(0)) => WriteKind::Down,
        (false, Some(r)) if r > 0 => WriteKind::Up,
        _ => WriteKind::Other,
    }
}

/// Seconds from `a` to `b`.
fn secs(a: DateTime<Utc>, b: DateTime<Utc>) -> f64 {
    (b - a).num_microseconds().unwrap_or(i64::MAX) as f64 / 1e6
}

/// The probe runs' timing in the storm, over all shoots: the gaps between runs (and after
/// each run's last request) past the interval, the runs' spans at the apiserver, and the gaps
/// after runs short enough for ours to absorb and after longer ones.
#[derive(Default)]
struct ProbeTiming {
    gaps: Vec<f64>,
    gaps_after_run: Vec<f64>,
    run_spans: Vec<f64>,
    gaps_after_short_runs: Vec<f64>,
    gaps_after_long_runs: Vec<f64>,
    /// Per shoot, its worst gap.
    worst_per_shoot: Vec<f64>,
}

impl ProbeTiming {
    /// Adds `shoot`'s runs in the storm (requests `sent_together` make one run; a run of up
    /// to `absorbed_s` is one ours takes out of its wait).
    fn add_shoot(
        &mut self,
        shoot: &ShootStorm,
        frame: &StormFrame,
        sent_together: chrono::Duration,
        absorbed_s: f64,
    ) {
        let interval = frame.interval_s;
        let in_storm: Vec<(DateTime<Utc>, &[crate::audit::Span])> = shoot
            .runs(sent_together)
            .filter(|(t, _)| *t >= frame.silenced_at && *t <= frame.restored_by)
            .collect();
        let lateness: Vec<f64> = in_storm
            .windows(2)
            .map(|w| secs(w[0].0, w[1].0) - interval)
            .collect();
        self.worst_per_shoot
            .push(lateness.iter().copied().fold(0.0, f64::max));
        for (w, lateness) in in_storm.windows(2).zip(&lateness) {
            let ((probe, requests), (next, _)) = (w[0], w[1]);
            // From the run's last request to the next run's `GET /version`.
            let last = requests.iter().map(|r| r.0).max().unwrap_or(probe);
            self.gaps_after_run.push(secs(last, next) - interval);
            // The run's span at the apiserver: from its first request until its last answer
            // was sent (the run can't have ended sooner). Ours takes up to a fifth of the
            // interval of it out of the wait before the next run (docs/behaviour.md §2.4).
            let first = requests
                .iter()
                .map(|r| r.0)
                .min()
                .unwrap_or(probe)
                .min(probe);
            let span = secs(first, requests.iter().map(|r| r.1).max().unwrap_or(probe));
            self.run_spans.push(span);
            if span <= absorbed_s {
                self.gaps_after_short_runs.push(*lateness);
            } else {
                self.gaps_after_long_runs.push(*lateness);
            }
        }
        self.gaps.extend(lateness);
    }
}

/// The watchdog's writes to the targets in the storm, over all shoots: the restores, and the
/// scale-downs after a shoot recovered, wasted (before or after the watchdog could know) or
/// relapses (its leases had lapsed again), with up to 20 examples each.
#[derive(Default)]
struct WriteTally {
    restore_writes: usize,
    wasted_could_know: usize,
    wasted_before_knowing: usize,
    wasted_shoots: Vec<Value>,
    relapses: usize,
    relapse_examples: Vec<Value>,
}

impl WriteTally {
    /// Adds `shoot`'s writes; the watchdog could know of a recovery a run (at most
    /// `max_interval`) and 2 s after it.
    fn add_shoot(
        &mut self,
        shoot: &ShootStorm,
        frame: &StormFrame,
        sent_together: chrono::Duration,
        max_interval: f64,
    ) {
        let could_know = shoot
            .recovered
            .map(|r| r + chrono::Duration::milliseconds(((max_interval + 2.0) * 1000.0) as i64));
        let mut wasted_here = Vec::new();
        for (t, target) in &shoot.writes {
            let changes = shoot.replicas.get(target).map_or(&[][..], Vec::as_slice);
            match classify(changes, *t) {
                WriteKind::Up if *t >= frame.resumed_at => self.restore_writes += 1,
                WriteKind::Down => match (shoot.recovered, could_know) {
                    (Some(r), Some(k)) if *t >= k => {
                        // What the leases said when the shoot's last run answered before the
                        // write asked for them.
                        let judged = shoot.leases_asked_by_last_run_answered_by(*t, sent_together);
                        let expired = judged.map(|p| shoot.expired_at(p, frame.lease_validity_s));
                        let example = json!({
                            "shoot": shoot.namespace, "target": target,
                            "after_recovery_s": secs(r, *t),
                            "expired_leases_at_the_last_probe": expired,
                        });
                        if expired.is_some_and(|e| e >= frame.expired_needed) {
                            self.relapses += 1;
                            if self.relapse_examples.len() < 20 {
                                self.relapse_examples.push(example);
                            }
                        } else {
                            self.wasted_could_know += 1;
                            wasted_here.push(example);
                        }
                    }
                    (Some(r), _) if *t >= r => self.wasted_before_knowing += 1,
                    _ => {}
                },
                _ => {}
            }
        }
        if !wasted_here.is_empty() && self.wasted_shoots.len() < 20 {
            self.wasted_shoots
                .push(json!({"shoot": shoot.namespace, "writes": wasted_here}));
        }
    }
}

/// The storm's results (the `storm` object of the run's JSON).
pub(crate) fn analyse(frame: &StormFrame, shoots: &[ShootStorm]) -> Value {
    let interval = frame.interval_s;
    let max_interval = interval * (1.0 + frame.jitter.max(0.0));
    let lateness_bound = interval * frame.jitter.max(0.0) + 2.0;
    // What ours takes back out of its wait after a run (one definition, dwd-core's).
    let absorbed_s =
        dwd_core::schedule::absorbed_run_time(std::time::Duration::from_secs_f64(interval))
            .as_secs_f64();
    let sent_together = sent_together(interval);
    let mut timing = ProbeTiming::default();
    let mut writes = WriteTally::default();
    let mut restored = Vec::new();
    let mut restored_from_first = Vec::new();
    let mut unrestored = 0usize;
    for shoot in shoots {
        timing.add_shoot(shoot, frame, sent_together, absorbed_s);
        writes.add_shoot(shoot, frame, sent_together, max_interval);
        match shoot.restore(frame) {
            Restore::NotRestored => unrestored += 1,
            Restore::Restored {
                from_last_recovery_s,
                from_first_recovery_s,
            } => {
                restored.push(from_last_recovery_s);
                restored_from_first.push(from_first_recovery_s);
            }
            Restore::NotDown | Restore::NeverRecovered => {}
        }
    }
    let restore_bound =
        writes.restore_writes as f64 / frame.qps.max(0.01) + frame.scale_up_delays_s + max_interval;
    let over_bound = restored.iter().filter(|s| **s > restore_bound).count();
    let lateness = Summary::of(&timing.gaps);
    let after_run = Summary::of(&timing.gaps_after_run);
    json!({
        "window_s": secs(frame.silenced_at, frame.restored_by),
        "outage_s": secs(frame.silenced_at, frame.resumed_at),
        "probe_lateness_p99_s": lateness.to_json()["p99"],
        "probe_lateness_s": lateness.to_json(),
        "probe_lateness_worst_per_shoot_s": Summary::of(&timing.worst_per_shoot).to_json(),
        "probe_lateness_bound_s": lateness_bound,
        "probe_lateness_after_the_run_s": after_run.to_json(),
        "run_span_at_the_apiserver_s": Summary::of(&timing.run_spans).to_json(),
        "probe_lateness_after_runs_up_to_a_fifth_of_the_interval_s": Summary::of(&timing.gaps_after_short_runs).to_json(),
        "probe_lateness_after_longer_runs_s": Summary::of(&timing.gaps_after_long_runs).to_json(),
        "restored_after_recovery_s": Summary::of(&restored).to_json(),
        "restored_after_first_recovery_s": Summary::of(&restored_from_first).to_json(),
        "shoots_restored_over_bound_from_first_recovery": restored_from_first
            .iter()
            .filter(|s| **s > restore_bound)
            .count(),
        "restore_writes": writes.restore_writes,
        "restore_bound_s": restore_bound,
        "shoots_restored_over_bound": over_bound,
        "shoots_not_restored": unrestored,
        "wasted_scale_down_writes": {
            "after_the_watchdog_could_know": writes.wasted_could_know,
            "before_the_watchdog_could_know": writes.wasted_before_knowing,
            "examples": writes.wasted_shoots,
        },
        "relapse_scale_down_writes": {
            "count": writes.relapses,
            "means": "scale-down writes after the recovery to a shoot whose leases had lapsed again: when its last run answered before the write (every request answered whole) asked for its leases, at least the threshold's leases were expired (a renewal counts from when the apiserver acknowledged it)",
            "examples": writes.relapse_examples,
        },
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(s: i64) -> DateTime<Utc> {
        DateTime::from_timestamp(1_000_000 + s, 0).unwrap_or_default()
    }

    /// Requests answered as they were received.
    fn answered_at_once(received: &[DateTime<Utc>]) -> Vec<crate::audit::Span> {
        received.iter().map(|t| (*t, *t)).collect()
    }

    fn frame() -> StormFrame {
        StormFrame {
            silenced_at: at(0),
            resumed_at: at(60),
            restored_by: at(300),
            interval_s: 10.0,
            jitter: 0.2,
            qps: 1.0,
            scale_up_delays_s: 30.0,
            lease_validity_s: 30.0,
            expired_needed: 2,
        }
    }

    #[test]
    fn writes_are_classified_by_the_change_they_led_to_and_wasted_ones_split_by_knowledge() {
        let shoot = ShootStorm {
            namespace: "s".into(),
            recovered: Some(at(70)),
            replicas: BTreeMap::from([
                // Down before the recovery, restored at 120.
                ("mcm".into(), vec![(at(40), 0), (at(120), 2)]),
                // Down at 75 (before the watchdog could know: 70 + 12 + 2 = 84), up at 130.
                ("ca".into(), vec![(at(75), 0), (at(130), 1)]),
                // Down at 100 (it could have known), up at 140.
                ("kcm".into(), vec![(at(100), 0), (at(140), 3)]),
            ]),
            probes: vec![at(10), at(20), at(30), at(50)],
            requests: {
                let mut requests =
                    answered_at_once(&[at(10), at(11), at(20), at(21), at(30), at(33), at(50)]);
                // The first run's list answered whole 1.5 s after it arrived.
                requests[1].1 = at(11) + chrono::Duration::milliseconds(1_500);
                requests
            },
            renewals: Vec::new(),
            // Each write is received before the change it makes is watched.
            writes: vec![
                (at(39), "mcm".into()),
                (at(73), "ca".into()),
                (at(74), "ca".into()),
                (at(99), "kcm".into()),
                (at(119), "mcm".into()),
                (at(129), "ca".into()),
                (at(139), "kcm".into()),
                // A marker cleared on a running target: neither.
                (at(200), "mcm".into()),
            ],
        };
        let out = analyse(&frame(), &[shoot]);
        let wasted = &out["wasted_scale_down_writes"];
        assert_eq!(wasted["after_the_watchdog_could_know"], 1, "{out}");
        assert_eq!(wasted["before_the_watchdog_could_know"], 2, "{out}");
        assert_eq!(out["restore_writes"], 3, "{out}");
        // Back at 140, recovered at 70.
        assert_eq!(out["restored_after_recovery_s"]["max"], 70.0, "{out}");
        // 3 writes ÷ 1 qps + 30 s + 12 s.
        assert_eq!(out["restore_bound_s"], 45.0, "{out}");
        assert_eq!(out["shoots_restored_over_bound"], 1, "{out}");
        // Gaps 10, 10, 20 → lateness 0, 0, 10; from each run's last request: 9, 7, 17 → −1,
        // −3, 7.
        assert_eq!(out["probe_lateness_s"]["max"], 10.0, "{out}");
        assert_eq!(out["probe_lateness_after_the_run_s"]["max"], 7.0, "{out}");
        assert_eq!(out["probe_lateness_after_the_run_s"]["count"], 3, "{out}");
        assert_eq!(out["probe_lateness_bound_s"], 4.0, "{out}");
        // Runs' spans at the apiserver, to their last answer: 2.5 s (the list answered at
        // 12.5), 1 s, 3 s. Up to 2 s (a fifth of the interval): the run of 20 (lateness 0);
        // longer: the runs of 10 and 30 (lateness 0 and 10).
        assert_eq!(out["run_span_at_the_apiserver_s"]["max"], 3.0, "{out}");
        let short = &out["probe_lateness_after_runs_up_to_a_fifth_of_the_interval_s"];
        assert_eq!(
            (&short["count"], &short["max"]),
            (&json!(1), &json!(0.0)),
            "{out}"
        );
        let long = &out["probe_lateness_after_longer_runs_s"];
        assert_eq!(
            (&long["count"], &long["max"]),
            (&json!(2), &json!(10.0)),
            "{out}"
        );
    }

    #[test]
    fn a_scale_down_after_the_recovery_is_a_relapse_when_the_leases_had_lapsed_again() {
        // Three nodes, two expired leases reach the threshold, valid 30 s. All renewed at 65
        // (recovered at 70 in the record); two renew again only at 140: lapsed from 95 on.
        let renewals: Vec<Vec<Renewal>> = [
            vec![at(-10), at(65), at(140)],
            vec![at(-10), at(65), at(140)],
            vec![at(-10), at(65), at(90), at(115)],
        ]
        .into_iter()
        .map(|times| times.into_iter().map(Renewal::at_once).collect())
        .collect();
        let shoot = |probe: i64| ShootStorm {
            namespace: "s".into(),
            recovered: Some(at(70)),
            replicas: BTreeMap::from([("kcm".into(), vec![(at(101), 0), (at(160), 3)])]),
            probes: vec![at(probe)],
            requests: answered_at_once(&[at(probe)]),
            renewals: renewals.clone(),
            writes: vec![(at(100), "kcm".into())],
        };
        // Judged at 96: two leases 31 s old → a relapse, not a wasted write.
        let out = analyse(&frame(), &[shoot(96)]);
        assert_eq!(out["relapse_scale_down_writes"]["count"], 1, "{out}");
        assert_eq!(
            out["wasted_scale_down_writes"]["after_the_watchdog_could_know"], 0,
            "{out}"
        );
        // Restored at 160: 20 s after the second recovery (140), 90 s after the first (70).
        assert_eq!(out["restored_after_recovery_s"]["max"], 20.0, "{out}");
        assert_eq!(out["restored_after_first_recovery_s"]["max"], 90.0, "{out}");
        assert_eq!(
            shoot(96).recoveries(30.0, 2),
            [at(65), at(140)],
            "below two expired at 65, two again at 95, below at 140"
        );
        // Judged at 90: every lease fresh → wasted.
        let out = analyse(&frame(), &[shoot(90)]);
        assert_eq!(out["relapse_scale_down_writes"]["count"], 0, "{out}");
        assert_eq!(
            out["wasted_scale_down_writes"]["after_the_watchdog_could_know"], 1,
            "{out}"
        );
    }

    #[test]
    fn a_write_follows_the_last_run_answered_before_it_not_one_still_waiting_for_its_lists() {
        // Three nodes, two expired leases reach the threshold, valid 30 s. All renewed at 55;
        // nodes 1 and 2 again only at 93: their leases lapsed from 85 to 93. The run of 90
        // (answered at once) found two expired and scaled down; the write arrives at 100. The
        // run of 96 asked for its leases at 97 (all fresh by then) but was answered only at
        // 105: the write could not follow its verdict, so it followed the run of 90, a relapse.
        let renewals: Vec<Vec<Renewal>> = [
            vec![at(55), at(93)],
            vec![at(55), at(93)],
            vec![at(55), at(80)],
        ]
        .into_iter()
        .map(|times| times.into_iter().map(Renewal::at_once).collect())
        .collect();
        let shoot = |lease_list_answered: i64| ShootStorm {
            namespace: "s".into(),
            recovered: Some(at(60)),
            replicas: BTreeMap::from([("kcm".into(), vec![(at(101), 0), (at(160), 3)])]),
            probes: vec![at(90), at(96)],
            requests: vec![
                (at(90), at(90)),
                (at(96), at(96)),
                (at(97), at(lease_list_answered)),
            ],
            renewals: renewals.clone(),
            writes: vec![(at(100), "kcm".into())],
        };
        assert_eq!(
            shoot(105).last_run_answered_by(at(100), sent_together(10.0)),
            Some(at(90))
        );
        let out = analyse(&frame(), &[shoot(105)]);
        assert_eq!(out["relapse_scale_down_writes"]["count"], 1, "{out}");
        assert_eq!(
            out["wasted_scale_down_writes"]["after_the_watchdog_could_know"], 0,
            "{out}"
        );
        // Answered at 99, before the write: the write went against the run of 96's fresh
        // leases, and is wasted.
        assert_eq!(
            shoot(99).last_run_answered_by(at(100), sent_together(10.0)),
            Some(at(96))
        );
        let out = analyse(&frame(), &[shoot(99)]);
        assert_eq!(out["relapse_scale_down_writes"]["count"], 0, "{out}");
        assert_eq!(
            out["wasted_scale_down_writes"]["after_the_watchdog_could_know"], 1,
            "{out}"
        );
    }

    #[test]
    fn lists_received_before_their_runs_get_version_belong_to_that_run_not_the_one_before() {
        // Three nodes, two expired leases reach the threshold, valid 30 s. Nodes 0 and 1
        // renewed at 55 and again only at 96: expired from 85 to 96. Each run sends its lists
        // together with its GET /version, and the apiserver receives the lists first: run A's
        // at 89.5 (GET /version at 90), run B's at 97 (answered 97.5; GET /version at 98,
        // answered 98.1). The write arrives at 97.8, when run B had no verdict yet: it
        // followed run A, which saw two expired leases (a relapse). Counted from its
        // GET /version on, run A took run B's lists as its own: answered by 97.8, leases all
        // fresh at 97, and the write wasted.
        let ms = |s: f64| at(0) + chrono::Duration::milliseconds((s * 1000.0) as i64);
        let renewals: Vec<Vec<Renewal>> = [
            vec![at(55), at(96)],
            vec![at(55), at(96)],
            vec![at(55), at(80)],
        ]
        .into_iter()
        .map(|times| times.into_iter().map(Renewal::at_once).collect())
        .collect();
        let shoot = ShootStorm {
            namespace: "s".into(),
            recovered: Some(at(60)),
            replicas: BTreeMap::from([("kcm".into(), vec![(at(98), 0), (at(160), 3)])]),
            probes: vec![at(90), at(98)],
            requests: vec![
                (ms(89.5), ms(89.6)),
                (ms(89.5), ms(89.7)),
                (at(90), at(90)),
                (at(97), ms(97.5)),
                (at(97), ms(97.4)),
                (at(98), ms(98.1)),
            ],
            renewals,
            writes: vec![(ms(97.8), "kcm".into())],
        };
        let together = sent_together(10.0);
        let runs: Vec<usize> = shoot.runs(together).map(|(_, r)| r.len()).collect();
        assert_eq!(runs, [3, 3], "each run has its own two lists");
        assert_eq!(shoot.last_run_answered_by(ms(97.8), together), Some(at(90)));
        assert_eq!(
            shoot.leases_asked_by_last_run_answered_by(ms(97.8), together),
            Some(ms(89.5))
        );
        let out = analyse(&frame(), &[shoot]);
        assert_eq!(out["relapse_scale_down_writes"]["count"], 1, "{out}");
        assert_eq!(
            out["wasted_scale_down_writes"]["after_the_watchdog_could_know"], 0,
            "{out}"
        );
        // Run A's span: from its first list (89.5) to its last answer (90), not into run B.
        assert_eq!(out["run_span_at_the_apiserver_s"]["max"], 0.5, "{out}");
    }

    #[test]
    fn a_renewal_counts_from_when_it_landed_and_leases_are_judged_when_the_run_asked_for_them() {
        // Three nodes, two expired leases reach the threshold, valid 30 s. All renewed at 65;
        // nodes 1 and 2 renew at 94 but the loaded apiserver acknowledges it only at 97: their
        // leases (renewTime 65) were expired from 95 to 97. The run's GET /version arrives at
        // 94, its lease list at 96, its scale-down at 98.
        let slow = Renewal {
            at: at(94),
            landed: at(97),
        };
        let shoot = ShootStorm {
            namespace: "s".into(),
            recovered: Some(at(70)),
            replicas: BTreeMap::from([("kcm".into(), vec![(at(99), 0), (at(160), 3)])]),
            probes: vec![at(94)],
            requests: answered_at_once(&[at(94), at(96)]),
            renewals: vec![
                vec![Renewal::at_once(at(65)), slow],
                vec![Renewal::at_once(at(65)), slow],
                vec![Renewal::at_once(at(65)), Renewal::at_once(at(90))],
            ],
            writes: vec![(at(98), "kcm".into())],
        };
        assert_eq!(shoot.expired_at(at(94), 30.0), 0);
        assert_eq!(shoot.expired_at(at(96), 30.0), 2);
        assert_eq!(shoot.expired_at(at(97), 30.0), 0);
        assert_eq!(shoot.recoveries(30.0, 2), [at(97)]);
        let out = analyse(&frame(), &[shoot]);
        assert_eq!(out["relapse_scale_down_writes"]["count"], 1, "{out}");
        assert_eq!(
            out["wasted_scale_down_writes"]["after_the_watchdog_could_know"], 0,
            "{out}"
        );
    }

    #[test]
    fn a_target_still_down_at_the_end_is_not_restored() {
        let shoot = ShootStorm {
            namespace: "s".into(),
            recovered: Some(at(70)),
            replicas: BTreeMap::from([("kcm".into(), vec![(at(40), 0)])]),
            ..ShootStorm::default()
        };
        let out = analyse(&frame(), &[shoot]);
        assert_eq!(out["shoots_not_restored"], 1, "{out}");
    }
}
