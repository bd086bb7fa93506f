//! What one probe run reports to its shoot's executor, and what every executor publishes
//! the same way. A run produces one value, [`RunReport`] (a typed failure, all leases fresh,
//! or a judged finding with its verdict and the intent of the flow it calls for); the acting
//! and the recording executor ([`super::executor`], [`super::recording`]) publish it in their
//! own way, using the helpers here for what they share: the zone events (in their own
//! [`Verbs`]) and the log line of the flow taken ([`Taken`]).

use std::fmt;

use dwd_core::lease::LeaseReport;
use dwd_core::verdict::Verdict;
use tracing::{debug, info, warn};

use super::context::ProberContext;
use super::scaler::PlannedFlow;
use crate::metrics::ShootSeries;

/// The shoot a run reports on, as its executor publishes it.
pub(crate) struct ShootRef<'a> {
    /// The shoot's namespace in the seed.
    pub namespace: &'a str,
    /// Its Cluster's UID, for the events on the Cluster.
    pub cluster_uid: Option<&'a str>,
    /// Its per-shoot metric series (revoked when its probe is removed).
    pub series: &'a ShootSeries,
}

/// What one run found: the one value a run hands its shoot's executor, which publishes it in
/// its own way ([`Executor::publish`]).
pub(crate) enum RunReport<'a> {
    /// The run failed (typed failure, in words): no scaling.
    Failed(&'a dyn fmt::Display),
    /// Every lease was fresh and nothing waited to be restored: the nodes were not listed.
    AllLeasesFresh {
        /// Leases seen.
        leases: usize,
    },
    /// The leases were judged.
    Judged(Judged<'a>),
}

/// A judged run: its finding, the verdict on it, and the flow it calls for.
pub(crate) struct Judged<'a> {
    /// What the shoot said.
    pub report: &'a LeaseReport,
    /// What the prober makes of it ([`dwd_core::verdict`]).
    pub verdict: &'a Verdict,
    /// The flow the verdict calls for, its intent built from the seed caches; `None` when
    /// the verdict calls for none.
    pub flow: Option<PlannedFlow>,
}

/// What became of a flow handed to an executor, for its log line and decision event.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Taken {
    /// Nothing new: the same flow is under way, the targets are there already, or our
    /// would-be state does not change. Why, in words (logged at debug).
    Nothing(String),
    /// A flow over `targets` was queued, `superseding` a different one: a decision to
    /// publish (log line, attempt count, event).
    Queued {
        /// The targets the flow acts on.
        targets: Vec<String>,
        /// Whether it replaced a different flow, queued or running.
        superseding: bool,
    },
    /// The targets are where this flow would take them (as the caches show them), but a
    /// different flow handed over before was still queued or under way: it is dropped or told
    /// to stop, and this flow runs after it, to undo whatever it wrote that the caches did not
    /// show yet (usually nothing). Logged, not published: nothing visible is scaled by it.
    Superseded,
    /// Shadow mode recorded what we would have done in its book (logged only).
    Recorded,
}

/// How an executor's consequence of a decision reads in an event.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Verbs {
    /// "scales" or "would scale".
    scales: &'static str,
    /// "is" or "would be".
    is: &'static str,
}

impl Verbs {
    /// An acting executor's.
    pub(crate) const ACTING: Verbs = Verbs {
        scales: "scales",
        is: "is",
    };
    /// Shadow mode's: it scales nothing, its events say what it would do.
    pub(crate) const RECORDING: Verbs = Verbs {
        scales: "would scale",
        is: "would be",
    };
}

/// Publishes a `ZoneDisrupted` event for each zone the verdict found newly disrupted and a
/// `ZoneRecovered` event for each that recovered. Published also when zonal protection is
/// not configured, so an operator sees what it would have done (docs/behaviour.md §2.19). At
/// most [`ZONES_PER_SHOOT_LIMIT`](crate::metrics::ZONES_PER_SHOOT_LIMIT) of each per run:
/// zone names come from the tenant.
pub(crate) fn publish_zone_changes(
    ctx: &ProberContext,
    shoot: &ShootRef<'_>,
    judged: &Judged<'_>,
    verbs: Verbs,
) {
    use crate::metrics::ZONES_PER_SHOOT_LIMIT;
    let verdict = judged.verdict;
    if verdict.zones_disrupted.is_empty() && verdict.zones_recovered.is_empty() {
        return;
    }
    let consequence = zone_consequence(ctx, judged.report, verbs);
    for zone in verdict.zones_disrupted.iter().take(ZONES_PER_SHOOT_LIMIT) {
        let note = format!(
            "zone {}: {}/{} node leases expired; {consequence}",
            zone.zone, zone.expired, zone.candidates
        );
        warn!(zone = %zone.zone, expired = zone.expired, candidates = zone.candidates, "{note}");
        ctx.events
            .zone_changed(shoot.namespace, shoot.cluster_uid, true, note);
    }
    for recovered in verdict.zones_recovered.iter().take(ZONES_PER_SHOOT_LIMIT) {
        let zone = &recovered.zone;
        let note = match &recovered.now {
            Some(r) => format!(
                "zone {zone} recovered: {}/{} node leases expired",
                r.expired, r.candidates
            ),
            None => format!("zone {zone} recovered: no candidate node left in it"),
        };
        info!(%zone, "{note}");
        ctx.events
            .zone_changed(shoot.namespace, shoot.cluster_uid, false, note);
    }
}

/// What the watchdog does about a disrupted zone this run, for its event.
fn zone_consequence(ctx: &ProberContext, report: &LeaseReport, verbs: Verbs) -> String {
    let cfg = &ctx.config;
    if !cfg.zone_rule().protection {
        return "zonal protection is not configured".into();
    }
    let Verbs { scales, is } = verbs;
    match report.decision {
        dwd_core::LeaseDecision::ScaleDown => {
            format!("the shoot-wide rule applies: every target {is} scaled down")
        }
        dwd_core::LeaseDecision::ZonalScaleDown => {
            let zonal: Vec<&str> = cfg
                .dependent_resource_infos
                .iter()
                .filter(|i| i.scale_down_on_zone_outage)
                .map(|i| i.target.name.as_str())
                .collect();
            format!("zonal protection {scales} down {}", zonal.join(", "))
        }
        _ => format!("no scaling this run ({})", report.decision),
    }
}

/// Logs a judged run that calls for no flow (the lease decision, or the hysteresis, says so).
pub(crate) fn log_no_flow(judged: &Judged<'_>) {
    let report = judged.report;
    debug!(candidates = report.candidates, expired = report.expired, fraction = ?report.fraction,
        threshold = report.threshold, decision = %report.decision, streak = ?judged.verdict.streak,
        "{report}; no scaling this run");
}

/// Logs what became of the flow a judged run called for.
pub(crate) fn log_taken(judged: &Judged<'_>, flow: &PlannedFlow, taken: &Taken) {
    let report = judged.report;
    let (dir, scope, threshold) = (flow.intent.dir, flow.intent.scope, report.threshold);
    match taken {
        Taken::Nothing(why) => {
            debug!(candidates = report.candidates, expired = report.expired, fraction = ?report.fraction, threshold,
                decision = %report.decision, action = %dir, %scope, "{report}; {why}");
        }
        Taken::Superseded => {
            info!(candidates = report.candidates, expired = report.expired, fraction = ?report.fraction,
                threshold, action = %dir, %scope,
                "{report}; the targets are there already: the different flow handed over before is stopped before it changes anything more");
        }
        Taken::Recorded => {
            info!(candidates = report.candidates, expired = report.expired, fraction = ?report.fraction,
                threshold, action = %dir, %scope, "{report}");
        }
        Taken::Queued { superseding, .. } => {
            info!(candidates = report.candidates, expired = report.expired, fraction = ?report.fraction, threshold,
                action = %dir, %scope, superseding, "{report}");
        }
    }
}
