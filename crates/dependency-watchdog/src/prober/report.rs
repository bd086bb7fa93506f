//! What one probe run reports to its shoot's executor, and what every executor publishes
//! the same way. A run produces one value, [`RunReport`] (a typed failure, all leases fresh,
//! or a judged finding with its verdict and the intent of the flow it calls for); the acting
//! and the recording executor ([`super::executor`], [`super::recording`]) publish it in their
//! own way, using the helpers here for what they share: the zone events (in their own
//! [`Verbs`]) and the log line of the flow taken ([`Taken`]).

use std::fmt;

use std::time::Duration;

use chrono::{DateTime, Utc};
use dwd_core::intent::Intent;
use dwd_core::lease::LeaseReport;
use dwd_core::record::{
    Because, DecisionRecord, FlowFailure, FlowName, FlowOutcome, FlowRecord, JudgedRun, Mode,
    NotMadeRecord, RecordBody, RunRecord, SCHEMA, SettingsRecord, TakenRecord, WriteOutcome,
    WriteRecord, reasons_to_record, text, timestamp,
};
use dwd_core::verdict::{Verdict, VerdictMemory};
use tracing::{debug, info, warn};

use super::context::ProberContext;
use super::scaler::{self, FlowError, FlowReport, PlannedFlow, TargetOutcome};
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
    /// The run was not made, or ended, for want of room in the runs' memory budget: the
    /// prober's shortage, not the shoot's failure (no scaling).
    NotMade(NotMade<'a>),
    /// Every lease was fresh and nothing waited to be restored: the nodes were not listed.
    AllLeasesFresh {
        /// Leases seen.
        leases: usize,
    },
    /// The leases were judged.
    Judged(Judged<'a>),
}

/// A run not made for room.
pub(crate) struct NotMade<'a> {
    /// Why, in words.
    pub why: &'a dyn fmt::Display,
    /// The budget's cause label.
    pub cause: &'static str,
    /// Whether a decision was pending for the shoot.
    pub decision_pending: bool,
    /// Whether the shoot's last finding had expired leases.
    pub expired_seen: bool,
    /// The grace period the shoot's leases are judged by.
    pub grace: Duration,
}

/// A judged run: its finding, the verdict on it, and the flow it calls for.
pub(crate) struct Judged<'a> {
    /// What the shoot said.
    pub report: &'a LeaseReport,
    /// When the leases were judged (asked for).
    pub judged_at: DateTime<Utc>,
    /// The grace period they were judged by.
    pub grace: Duration,
    /// What the prober remembered of the shoot before this run's verdict.
    pub memory_before: &'a VerdictMemory,
    /// What the prober makes of it ([`dwd_core::verdict`]).
    pub verdict: &'a Verdict,
    /// The flow the verdict calls for, its intent built from the seed caches; `None` when
    /// the verdict calls for none.
    pub flow: Option<PlannedFlow>,
    /// The intent of the flow the decision asked for when the hysteresis holds it.
    pub held: Option<Intent>,
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
    // Numbers as numbers: the streak's runs seen and needed, when the decision is counted.
    let (seen, needed) = match judged.verdict.streak {
        dwd_core::verdict::Streak::Counted { seen, needed } => (Some(seen), Some(needed)),
        dwd_core::verdict::Streak::NotCounted => (None, None),
    };
    debug!(candidates = report.candidates, expired = report.expired, fraction = report.fraction,
        threshold = report.threshold, decision = %report.decision, streak_seen = seen,
        streak_needed = needed, "{report}; no scaling this run");
}

/// Logs what became of the flow a judged run called for.
pub(crate) fn log_taken(judged: &Judged<'_>, flow: &PlannedFlow, taken: &Taken) {
    let report = judged.report;
    let (dir, scope, threshold) = (flow.intent.dir, flow.intent.scope, report.threshold);
    match taken {
        Taken::Nothing(why) => {
            debug!(candidates = report.candidates, expired = report.expired, fraction = report.fraction, threshold,
                decision = %report.decision, action = %dir, %scope, "{report}; {why}");
        }
        Taken::Superseded => {
            info!(candidates = report.candidates, expired = report.expired, fraction = report.fraction,
                threshold, action = %dir, %scope,
                "{report}; the targets are there already: the different flow handed over before is stopped before it changes anything more");
        }
        Taken::Recorded => {
            info!(candidates = report.candidates, expired = report.expired, fraction = report.fraction,
                threshold, action = %dir, %scope, "{report}");
        }
        Taken::Queued { superseding, .. } => {
            let decision_id = flow.decision.as_deref().unwrap_or_default();
            info!(candidates = report.candidates, expired = report.expired, fraction = report.fraction, threshold,
                action = %dir, %scope, superseding, decision_id, "{report}");
        }
    }
}

/// The record of what became of a flow.
fn taken_record(taken: &Taken) -> TakenRecord {
    match taken {
        Taken::Nothing(why) => TakenRecord::Nothing { why: text(why) },
        Taken::Queued {
            targets,
            superseding,
        } => TakenRecord::Queued {
            targets: targets.clone(),
            superseding: *superseding,
        },
        Taken::Superseded => TakenRecord::Superseded,
        Taken::Recorded => TakenRecord::Recorded,
    }
}

/// Keeps the decision record of `judged`, if the run is worth one
/// ([`reasons_to_record`]): `taken` is what the executor made of its flow, `id` the id its
/// flow was handed over with (a new one when none). Returns the id of the record kept.
pub(crate) fn keep_run_record(
    ctx: &ProberContext,
    shoot: &ShootRef<'_>,
    judged: &Judged<'_>,
    taken: Option<(&Taken, String)>,
    mode: Mode,
) -> Option<String> {
    let intent = judged
        .flow
        .as_ref()
        .map(|f| &f.intent)
        .or(judged.held.as_ref());
    let (taken, id) = match taken {
        Some((taken, id)) => (Some(taken_record(taken)), Some(id)),
        None => (judged.held.as_ref().map(|_| TakenRecord::Held), None),
    };
    let because = reasons_to_record(judged.report, judged.verdict, intent, taken.as_ref());
    if because.is_empty() {
        return None;
    }
    let targets = scaler::seen_in_caches_all(ctx, shoot.namespace);
    let run = JudgedRun {
        report: judged.report,
        now: judged.judged_at,
        memory_before: judged.memory_before,
        verdict: judged.verdict,
        intent,
        targets: &targets,
    };
    let record = DecisionRecord {
        schema: SCHEMA.into(),
        id: id.unwrap_or_else(|| ctx.decisions.next_id(shoot.namespace, judged.judged_at)),
        namespace: shoot.namespace.to_owned(),
        at: timestamp(judged.judged_at),
        mode,
        recorded_because: because,
        body: RecordBody::Run(Box::new(RunRecord::judged(
            &ctx.config,
            judged.grace,
            &run,
            taken,
        ))),
    };
    ctx.decisions.keep(&record).then_some(record.id)
}

/// Keeps the record of a run not made for room when something could have been decided: a
/// decision was pending, or the shoot's last finding had expired leases.
pub(crate) fn keep_not_made_record(
    ctx: &ProberContext,
    shoot: &ShootRef<'_>,
    not_made: &NotMade<'_>,
    mode: Mode,
) {
    if !not_made.decision_pending && !not_made.expired_seen {
        return;
    }
    let now = Utc::now();
    let record = DecisionRecord {
        schema: SCHEMA.into(),
        id: ctx.decisions.next_id(shoot.namespace, now),
        namespace: shoot.namespace.to_owned(),
        at: timestamp(now),
        mode,
        recorded_because: vec![Because::NotMadeForRoom],
        body: RecordBody::Run(Box::new(RunRecord {
            settings: SettingsRecord::of(&ctx.config, not_made.grace),
            finding: None,
            not_made: Some(NotMadeRecord {
                cause: not_made.cause.to_owned(),
                decision_pending: not_made.decision_pending,
            }),
            verdict: None,
            targets: Vec::new(),
            intent: None,
            taken: None,
        })),
    };
    ctx.decisions.keep(&record);
}

/// Keeps the record of how `flow` of shoot `namespace`, started at `started_at`, ended.
pub(crate) fn keep_flow_record(
    ctx: &ProberContext,
    namespace: &str,
    flow: &PlannedFlow,
    started_at: DateTime<Utc>,
    result: &Result<FlowReport, Box<FlowError>>,
) {
    let (report, outcome, failure) = match result {
        Ok(report) if report.superseded => (report, FlowOutcome::Superseded, None),
        Ok(report) => (report, FlowOutcome::Finished, None),
        Err(failed) => (
            &failed.report,
            FlowOutcome::Failed,
            Some(FlowFailure {
                target: failed.target.clone(),
                error: text(&failed.error.to_string()),
            }),
        ),
    };
    let writes = report
        .targets
        .iter()
        .map(|t| {
            let (outcome, from, to, recorded, why) = match &t.outcome {
                TargetOutcome::Scaled { from, to, recorded } => (
                    WriteOutcome::Scaled,
                    Some(*from),
                    Some(*to),
                    *recorded,
                    None,
                ),
                TargetOutcome::Skipped(why) => {
                    (WriteOutcome::Skipped, None, None, None, Some(text(why)))
                }
            };
            WriteRecord {
                target: t.name.clone(),
                level: t.level,
                outcome,
                from,
                to,
                recorded_replicas: recorded,
                why,
                at: timestamp(t.ended_at),
                budget_wait_seconds: t.budget_wait.as_secs_f64(),
            }
        })
        .collect();
    let now = Utc::now();
    let decision = flow.decision.clone().unwrap_or_default();
    let record = DecisionRecord {
        schema: SCHEMA.into(),
        id: ctx.decisions.next_id(namespace, now),
        namespace: namespace.to_owned(),
        at: timestamp(now),
        mode: Mode::Acting,
        recorded_because: vec![Because::FlowOutcome],
        body: RecordBody::Flow(FlowRecord {
            decision,
            flow: FlowName::of(flow.intent.dir, flow.intent.scope),
            outcome,
            started_at: timestamp(started_at),
            failure,
            writes,
        }),
    };
    ctx.decisions.keep(&record);
}
