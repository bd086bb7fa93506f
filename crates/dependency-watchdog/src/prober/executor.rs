//! One shoot's executor: carries out the scaling flows its probe decides on, so that the probe
//! never waits for one (docs/behaviour.md §2.20).
//!
//! On the worst day (a region-wide outage) hundreds of shoots want their controllers scaled
//! down at once, and the seed's request budget (`--kube-api-qps`) makes their flows take
//! minutes. A probe that awaited its flow (as the reference's does) would stop probing for
//! that long: it would neither see the shoot recover nor stop scaling it down when it had.
//! Here the probe hands its verdict over and keeps its schedule; the executor runs one flow at
//! a time and the newest verdict wins:
//!
//! - a verdict equal to the flow queued or under way changes nothing ([`Handover::UnderWay`]:
//!   it is not decided, published or counted again);
//! - a different one replaces the queued flow and stops the running one
//!   ([`Handover::Superseding`]): no new write starts for it (a write waiting for the seed's
//!   budget is not sent, see [`crate::client::rate_limit::StopWaiting`]; a write already sent, and the
//!   second write of a two-write step, is finished), and the newer flow starts once the old
//!   one has stopped, so no two writes of one shoot race. What the old flow did stays done
//!   until the new flow's own steps change it: a target scaled down carries its marker and
//!   record, and a scale-up restores it from them.
//!
//! Which executor every shoot gets is chosen once at startup ([`Executors`]): the
//! [`ActingExecutor`] above, or in shadow mode (`--shadow`) a [`RecordingExecutor`], which
//! takes the same decisions and writes nothing: it moves our would-be state of the shoot and
//! records what we would have done in shadow mode's book ([`crate::shadow`]). The probe talks
//! to either through [`Executor`] and never asks which mode it runs in.

use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

use chrono::Utc;
use dwd_core::Direction;
use dwd_core::record::Mode;
use dwd_core::scaling::FlowScope;
use tokio::sync::Notify;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tracing::{debug, info, warn};

use super::context::ProberContext;
use super::recording::RecordingExecutor;
use super::report::{
    RunReport, ShootRef, Taken, Verbs, keep_flow_record, keep_not_made_record, keep_run_record,
    log_no_flow, log_taken, publish_zone_changes,
};
use super::scaler::{self, PlannedFlow};
use super::shadow_observer::Recorder;
use crate::metrics::ShootDirectionLabels;
use crate::shadow::Shadow;

/// Which executor every shoot gets, chosen once at startup from `--shadow`.
pub enum Executors {
    /// Normal operation: [`ActingExecutor`]s scale the targets.
    Acting,
    /// Shadow mode: [`RecordingExecutor`]s note in the recorder's book what we would have done.
    Recording(Arc<Recorder>),
}

impl Executors {
    /// Shadow mode's executors when `shadow` is given, else acting ones.
    pub fn of(shadow: Option<Arc<Shadow>>) -> Executors {
        match shadow {
            Some(book) => Executors::Recording(Arc::new(Recorder::new(book))),
            None => Executors::Acting,
        }
    }

    /// A new shoot's executor.
    pub(crate) fn for_shoot(&self) -> Executor {
        match self {
            Executors::Acting => Executor::Acting(ActingExecutor::default()),
            Executors::Recording(recorder) => Executor::Recording(RecordingExecutor {
                recorder: recorder.clone(),
            }),
        }
    }

    /// Shadow mode's recorder, for what runs beside the probes (its book's expiry, the
    /// observer of the acting watchdog); `None` in normal operation.
    pub fn recorder(&self) -> Option<&Arc<Recorder>> {
        match self {
            Executors::Acting => None,
            Executors::Recording(recorder) => Some(recorder),
        }
    }

    /// Forgets what the executors kept of a removed shoot (shadow mode: our latest finding
    /// and would-be state; a probe started for it later begins from the acting watchdog's
    /// state at that time). Acting executors keep nothing beyond their shoot's task.
    pub(crate) fn forget(&self, namespace: &str) {
        if let Executors::Recording(recorder) = self {
            recorder.book.forget(namespace);
            recorder.states.forget_ours(namespace);
        }
    }
}

/// A shoot's executor, of the kind [`Executors`] chose at startup.
pub enum Executor {
    /// Carries out flows.
    Acting(ActingExecutor),
    /// Records what we would have done.
    Recording(RecordingExecutor),
}

impl Executor {
    /// Whether a decision is in the executor's hands for shoot `namespace`: a target waits to
    /// be restored (acting: as the seed caches show the targets; recording: our would-be
    /// state), or a flow is queued or under way. Asked by each run once it is admitted, so
    /// the snapshot is the newest the run can have; the run then lists the nodes whatever its
    /// leases say, and its verdict reaches the executor even when every lease is fresh.
    pub(crate) fn decision_pending(&self, ctx: &ProberContext, namespace: &str) -> bool {
        match self {
            Executor::Acting(acting) => {
                acting.busy()
                    || scaler::intent_from_caches(ctx, namespace, Direction::Up, FlowScope::All)
                        .changes_any()
            }
            Executor::Recording(recording) => {
                recording.virtual_state(ctx, namespace).is_protected()
            }
        }
    }

    /// Publishes what a run of `shoot` found, the one place that does beyond the probe's own
    /// metrics and log: zone events, the flow taken (a decision event, or shadow mode's
    /// sighting), shadow mode's note of the finding.
    pub(crate) fn publish(&self, ctx: &ProberContext, shoot: &ShootRef<'_>, run: &RunReport<'_>) {
        match self {
            Executor::Acting(acting) => acting.publish(ctx, shoot, run),
            Executor::Recording(recording) => recording.publish(ctx, shoot, run),
        }
    }

    /// When a flow's seed call was last answered 429 since the last call, if it was (see
    /// [`ActingExecutor::take_throttled`]); a recording executor calls nothing.
    pub fn take_throttled(&self) -> Option<Instant> {
        match self {
            Executor::Acting(acting) => acting.take_throttled(),
            Executor::Recording(_) => None,
        }
    }

    /// Carries out what is handed over; never returns (it ends with the probe task that
    /// polls it). The recording executor has nothing to carry out.
    pub async fn run(&self, ctx: &ProberContext, namespace: &str) {
        match self {
            Executor::Acting(acting) => acting.run(ctx, namespace).await,
            Executor::Recording(_) => std::future::pending().await,
        }
    }
}

/// Whether `a` and `b` are the same flow: direction and scope (reasons and the targets' states
/// when they were judged may differ).
fn same_flow(a: &PlannedFlow, b: &PlannedFlow) -> bool {
    a.intent.dir == b.intent.dir && a.intent.scope == b.intent.scope
}

/// Whether `running` is the flow `flow` asks for (reasons may differ).
fn same_running(running: &Running, flow: &PlannedFlow) -> bool {
    running.dir == flow.intent.dir && running.scope == flow.intent.scope
}

/// What became of a flow handed over to the executor.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Handover {
    /// Queued; nothing else was queued or running.
    Accepted,
    /// The same flow is queued or running already: nothing changes.
    UnderWay,
    /// Queued in place of a different flow, which is dropped (queued) or stopped (running).
    Superseding,
}

/// The flow under way and how to stop it.
#[derive(Debug)]
struct Running {
    dir: Direction,
    scope: FlowScope,
    stop: CancellationToken,
}

/// What the executor holds between its flows.
#[derive(Debug, Default)]
struct Slot {
    /// The newest flow handed over and not started yet.
    queued: Option<PlannedFlow>,
    /// The flow under way.
    running: Option<Running>,
    /// When a seed call of a flow was last answered 429, not yet taken by the probe loop.
    throttled_at: Option<Instant>,
}

/// One shoot's executor (see the module docs). The probe hands flows over with
/// [`ActingExecutor::hand_over`]; [`ActingExecutor::run`] carries them out.
#[derive(Debug, Default)]
pub struct ActingExecutor {
    slot: Mutex<Slot>,
    /// Signalled when a flow is queued (a permit is kept if nobody waits).
    queued: Notify,
}

impl ActingExecutor {
    fn slot(&self) -> MutexGuard<'_, Slot> {
        // Nothing panics while the lock is held; if something did, the slot is whole.
        self.slot.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Hands `flow` over: queued unless the same flow is queued or under way (see
    /// [`Handover`]); a different running flow is told to stop.
    pub fn hand_over(&self, flow: PlannedFlow) -> Handover {
        let mut slot = self.slot();
        let running_same = slot
            .running
            .as_ref()
            .is_some_and(|r| same_running(r, &flow) && !r.stop.is_cancelled());
        let outcome = match &slot.queued {
            Some(queued) if same_flow(queued, &flow) => return Handover::UnderWay,
            Some(_) => Handover::Superseding,
            None if running_same => return Handover::UnderWay,
            None if slot.running.is_some() => Handover::Superseding,
            None => Handover::Accepted,
        };
        if let Some(running) = &slot.running
            && !same_running(running, &flow)
        {
            running.stop.cancel();
        }
        slot.queued = Some(flow);
        drop(slot);
        self.queued.notify_one();
        outcome
    }

    /// Whether a flow is queued or under way.
    fn busy(&self) -> bool {
        let slot = self.slot();
        slot.queued.is_some() || slot.running.is_some()
    }

    /// Whether a flow other than `flow` is queued, or under way and not yet told to stop.
    fn other_in_hand(&self, flow: &PlannedFlow) -> bool {
        let slot = self.slot();
        let queued = slot.queued.as_ref().is_some_and(|q| !same_flow(q, flow));
        let running = slot
            .running
            .as_ref()
            .is_some_and(|r| !same_running(r, flow) && !r.stop.is_cancelled());
        queued || running
    }

    /// Publishes `run` of `shoot` (see [`Executor::publish`]): failed runs and runs whose
    /// leases were all fresh were logged by the probe, and leave nothing to publish.
    fn publish(&self, ctx: &ProberContext, shoot: &ShootRef<'_>, run: &RunReport<'_>) {
        let judged = match run {
            RunReport::Judged(judged) => judged,
            RunReport::NotMade(not_made) => {
                return keep_not_made_record(ctx, shoot, not_made, Mode::Acting);
            }
            RunReport::Failed(_) | RunReport::AllLeasesFresh { .. } => return,
        };
        publish_zone_changes(ctx, shoot, judged, Verbs::ACTING);
        let Some(flow) = &judged.flow else {
            log_no_flow(judged);
            keep_run_record(ctx, shoot, judged, None, Mode::Acting);
            return;
        };
        // The flow carries the id of its run's decision record to its events and log lines.
        let id = ctx.decisions.next_id(shoot.namespace, judged.judged_at);
        let flow = PlannedFlow {
            decision: Some(id.clone()),
            ..flow.clone()
        };
        let taken = self.take(flow.clone());
        log_taken(judged, &flow, &taken);
        keep_run_record(ctx, shoot, judged, Some((&taken, id)), Mode::Acting);
        if let Taken::Queued { targets, .. } = &taken {
            publish_decision(ctx, shoot, &flow, targets);
        }
    }

    /// Takes `flow`: hands it over unless its targets are already there (as its intent judged
    /// them from the seed caches) and no other flow is in hand. A newer verdict always stops
    /// a different flow, whether or not that one has written yet: a recovered shoot's queued
    /// scale-down must not go out, nor a re-outaged shoot's queued restore.
    fn take(&self, flow: PlannedFlow) -> Taken {
        let targets = flow.intent.taken_up();
        if targets.is_empty() {
            if !self.other_in_hand(&flow) {
                return Taken::Nothing("targets already there".into());
            }
            self.hand_over(flow);
            return Taken::Superseded;
        }
        match self.hand_over(flow) {
            Handover::UnderWay => Taken::Nothing("this flow is under way already".into()),
            handover => Taken::Queued {
                targets,
                superseding: handover == Handover::Superseding,
            },
        }
    }

    /// When a flow's seed call was last answered 429 since the last call, if it was: the
    /// probe loop spaces its next run out as after a throttled run of its own.
    pub fn take_throttled(&self) -> Option<Instant> {
        self.slot().throttled_at.take()
    }

    /// Carries out the flows handed over, one at a time, for shoot `namespace`; never returns
    /// (it ends with the probe task that polls it).
    pub async fn run(&self, ctx: &ProberContext, namespace: &str) {
        loop {
            let (flow, stop) = self.next_flow().await;
            let started_at = Utc::now();
            let result = scaler::run_flow(ctx, namespace, &flow, &stop).await;
            keep_flow_record(ctx, namespace, &flow, started_at, &result);
            let throttled = report(&flow, result);
            let mut slot = self.slot();
            slot.running = None;
            if throttled {
                slot.throttled_at = Some(Instant::now());
            }
        }
    }

    /// Waits for a queued flow and marks it running.
    async fn next_flow(&self) -> (PlannedFlow, CancellationToken) {
        loop {
            {
                let mut slot = self.slot();
                if let Some(flow) = slot.queued.take() {
                    let stop = CancellationToken::new();
                    slot.running = Some(Running {
                        dir: flow.intent.dir,
                        scope: flow.intent.scope,
                        stop: stop.clone(),
                    });
                    return (flow, stop);
                }
            }
            self.queued.notified().await;
        }
    }
}

/// Publishes the decision to run `flow` over `targets` of `shoot`: it counts as an attempt, and
/// an Event on the Cluster names the targets and why.
fn publish_decision(
    ctx: &ProberContext,
    shoot: &ShootRef<'_>,
    flow: &PlannedFlow,
    targets: &[String],
) {
    let dir = flow.intent.dir;
    let m = &ctx.metrics;
    m.for_shoot(shoot.series, |l| {
        m.scaling_attempts
            .get_or_create(&ShootDirectionLabels {
                shoot: l.shoot.clone(),
                direction: dir.into(),
            })
            .inc();
    });
    let names: Vec<&str> = targets.iter().map(String::as_str).collect();
    ctx.events.scaling_decision(
        shoot.namespace,
        shoot.cluster_uid,
        dir,
        &flow.reason,
        &names,
        flow.decision.as_deref(),
    );
}

/// Reports how a flow ended, the one place that does; whether a seed call of it was answered
/// 429.
fn report(flow: &PlannedFlow, result: Result<scaler::FlowReport, Box<scaler::FlowError>>) -> bool {
    let dir = flow.intent.dir;
    match result {
        Ok(report) => {
            let changed = report.changed();
            if report.superseded {
                info!(action = %dir, targets = ?changed, "flow stopped: a newer verdict superseded it");
            } else if changed.is_empty() {
                debug!(action = %dir, "flow finished, nothing changed");
            } else {
                info!(action = %dir, targets = ?changed, "flow finished");
            }
            report.throttled
        }
        Err(failure) => {
            warn!(action = %dir, target = %failure.target, error = %failure.error,
                "flow stopped at a failed target; later levels not run, next run retries");
            failure.report.throttled || failure.error.is_throttled()
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn flow_over(dir: Direction, scope: FlowScope) -> PlannedFlow {
        PlannedFlow {
            intent: dwd_core::intent::Intent {
                dir,
                scope,
                levels: Vec::new(),
            },
            reason: "r".into(),
            decision: None,
        }
    }

    fn flow(dir: Direction) -> PlannedFlow {
        flow_over(dir, FlowScope::All)
    }

    #[tokio::test]
    async fn the_newest_verdict_wins_and_the_same_verdict_changes_nothing() {
        let executor = ActingExecutor::default();
        assert_eq!(
            executor.hand_over(flow(Direction::Down)),
            Handover::Accepted
        );
        // Queued: the same again changes nothing, a different one takes its place.
        assert_eq!(
            executor.hand_over(flow(Direction::Down)),
            Handover::UnderWay
        );
        assert_eq!(
            executor.hand_over(flow(Direction::Up)),
            Handover::Superseding
        );
        let (started, stop) = executor.next_flow().await;
        assert_eq!(started.intent.dir, Direction::Up);
        // Running: the same changes nothing; a different one stops it and is queued.
        assert_eq!(executor.hand_over(flow(Direction::Up)), Handover::UnderWay);
        assert!(!stop.is_cancelled());
        assert_eq!(
            executor.hand_over(flow(Direction::Down)),
            Handover::Superseding
        );
        assert!(stop.is_cancelled());
        // The stopped flow's direction again, before the queued one started: it replaces the
        // queued one (the stopped flow does not resume).
        assert_eq!(
            executor.hand_over(flow(Direction::Up)),
            Handover::Superseding
        );
        let (next, _) = executor.next_flow().await;
        assert_eq!(next.intent.dir, Direction::Up);
    }

    #[tokio::test]
    async fn a_zonal_and_a_shoot_wide_scale_down_are_different_flows() {
        let executor = ActingExecutor::default();
        let zonal = flow_over(Direction::Down, FlowScope::Zonal);
        assert_eq!(executor.hand_over(zonal), Handover::Accepted);
        let (_, stop) = executor.next_flow().await;
        assert_eq!(
            executor.hand_over(flow(Direction::Down)),
            Handover::Superseding
        );
        assert!(stop.is_cancelled());
    }
}
