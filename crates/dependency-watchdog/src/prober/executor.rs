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
//!   budget is not sent, see [`crate::rate_limit::StopWaiting`]; a write already sent, and the
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

use dwd_core::Direction;
use dwd_core::scaling::FlowScope;
use dwd_core::shadow::Side;
use tokio::sync::Notify;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tracing::{debug, info, warn};

use super::ProberContext;
use super::scaler::{self, PlannedFlow};
use super::shadow_observer::{self, VirtualState};
use crate::events::Subject;
use crate::shadow::Shadow;

/// Which executor every shoot gets, chosen once at startup from `--shadow`.
pub enum Executors {
    /// Normal operation: [`ActingExecutor`]s scale the targets.
    Acting,
    /// Shadow mode: [`RecordingExecutor`]s note in this book what we would have done.
    Recording(Arc<Shadow>),
}

impl Executors {
    /// Shadow mode's executors when `shadow` is given, else acting ones.
    pub fn of(shadow: Option<Arc<Shadow>>) -> Executors {
        match shadow {
            Some(book) => Executors::Recording(book),
            None => Executors::Acting,
        }
    }

    /// A new shoot's executor.
    pub(crate) fn for_shoot(&self) -> Executor {
        match self {
            Executors::Acting => Executor::Acting(ActingExecutor::default()),
            Executors::Recording(book) => {
                Executor::Recording(RecordingExecutor { book: book.clone() })
            }
        }
    }

    /// Shadow mode's book, for what runs beside the probes (its expiry, the observer of the
    /// acting watchdog, forgetting a removed shoot); `None` in normal operation.
    pub fn shadow(&self) -> Option<&Arc<Shadow>> {
        match self {
            Executors::Acting => None,
            Executors::Recording(book) => Some(book),
        }
    }
}

/// What a run hands its shoot's executor when its hysteresis calls for a flow.
#[derive(Debug, Clone)]
pub struct Decision {
    /// The flow: direction, scope, and the lease probe's summary.
    pub flow: PlannedFlow,
}

/// What became of a [`Decision`], for the probe to publish.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Taken {
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
    /// leases say, and its verdict reaches [`Executor::take`] even when every lease is fresh.
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

    /// Takes `decision` about shoot `namespace` (see [`Taken`]).
    pub fn take(&self, ctx: &ProberContext, namespace: &str, decision: Decision) -> Taken {
        match self {
            Executor::Acting(acting) => acting.take(ctx, namespace, decision),
            Executor::Recording(recording) => recording.take(ctx, namespace, decision),
        }
    }

    /// Notes a run's finding about shoot `namespace`, `note()` in words: shadow mode keeps the
    /// latest in its book (each comparison shows it); acting, it is only logged by the probe.
    pub(crate) fn note_finding(&self, namespace: &str, note: impl FnOnce() -> String) {
        if let Executor::Recording(recording) = self {
            recording.book.note_finding(namespace, &note());
        }
    }

    /// How the executor's consequence of a decision reads in an event: "scales"/"is" when
    /// it acts, "would scale"/"would be" when it records.
    pub fn verbs(&self) -> (&'static str, &'static str) {
        match self {
            Executor::Acting(_) => ("scales", "is"),
            Executor::Recording(_) => ("would scale", "would be"),
        }
    }

    /// When a flow's seed call was last answered 429 since the last call, if it was (see
    /// [`ActingExecutor::take_throttled`]); never for the recording executor.
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

/// Whether `flow` asks for the flow in `dir` over `scope` (reasons may differ).
fn same_flow(flow: &PlannedFlow, dir: Direction, scope: FlowScope) -> bool {
    flow.dir == dir && flow.scope == scope
}

/// Whether `running` is the flow `flow` asks for (reasons may differ).
fn same_running(running: &Running, flow: &PlannedFlow) -> bool {
    running.dir == flow.dir && running.scope == flow.scope
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
            .is_some_and(|r| r.dir == flow.dir && r.scope == flow.scope && !r.stop.is_cancelled());
        let outcome = match &slot.queued {
            Some(queued) if same_flow(queued, flow.dir, flow.scope) => return Handover::UnderWay,
            Some(_) => Handover::Superseding,
            None if running_same => return Handover::UnderWay,
            None if slot.running.is_some() => Handover::Superseding,
            None => Handover::Accepted,
        };
        if let Some(running) = &slot.running
            && !(running.dir == flow.dir && running.scope == flow.scope)
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
        let queued = slot
            .queued
            .as_ref()
            .is_some_and(|q| !same_flow(q, flow.dir, flow.scope));
        let running = slot
            .running
            .as_ref()
            .is_some_and(|r| !same_running(r, flow) && !r.stop.is_cancelled());
        queued || running
    }

    /// Takes `decision`: hands its flow over unless its targets are already there (judged
    /// now, from the seed caches) and no other flow is in hand. A newer verdict always stops
    /// a different flow, whether or not that one has written yet: a recovered shoot's queued
    /// scale-down must not go out, nor a re-outaged shoot's queued restore.
    fn take(&self, ctx: &ProberContext, namespace: &str, decision: Decision) -> Taken {
        let flow = decision.flow;
        let targets = scaler::targets_to_scale(ctx, namespace, flow.dir, flow.scope);
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
            let result = scaler::run_flow(ctx, namespace, &flow, &stop).await;
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
                        dir: flow.dir,
                        scope: flow.scope,
                        stop: stop.clone(),
                    });
                    return (flow, stop);
                }
            }
            self.queued.notified().await;
        }
    }
}

/// Shadow mode's executor: takes the decisions an [`ActingExecutor`] would and writes
/// nothing; it moves our would-be state of the shoot (a scale-down of a shoot we have not
/// scaled down, a scale-up of one we have) and records each change in the book as a
/// sighting of what we would have done, naming the targets the flow would act on whatever
/// the acting watchdog did to them.
pub struct RecordingExecutor {
    /// Shadow mode's book.
    book: Arc<Shadow>,
}

impl RecordingExecutor {
    /// Our would-be state of shoot `namespace`: at first the acting watchdog's when shadow
    /// mode first saw the shoot (asked of the caches, which are in sync during a run, if the
    /// observer has not seen it yet).
    fn virtual_state(&self, ctx: &ProberContext, namespace: &str) -> VirtualState {
        ctx.shadow_states.ours(namespace, || {
            shadow_observer::acting_protected(&ctx.caches, namespace)
        })
    }

    fn take(&self, ctx: &ProberContext, namespace: &str, decision: Decision) -> Taken {
        let PlannedFlow { dir, scope, reason } = decision.flow;
        let state = self.virtual_state(ctx, namespace);
        let targets = scaler::targets_in_scope(ctx, namespace, scope);
        let step = dwd_core::shadow::step(state, dir, scope, !targets.is_empty());
        if step.next != state {
            ctx.shadow_states.set_ours(namespace, step.next);
        }
        let Some(action) = step.report else {
            return Taken::Nothing(format!(
                "shadow mode: nothing to report (our would-be state {state:?}, next {:?}, {} \
                 target(s) in scope)",
                step.next,
                targets.len()
            ));
        };
        let evidence = format!("{reason}; {scope}: {}", targets.join(", "));
        self.book.record(
            Side::Ours,
            &ctx.events,
            &Subject::Cluster(namespace),
            action,
            &evidence,
        );
        Taken::Recorded
    }
}

/// Reports how a flow ended, the one place that does; whether a seed call of it was answered
/// 429.
fn report(flow: &PlannedFlow, result: Result<scaler::FlowReport, Box<scaler::FlowError>>) -> bool {
    let dir = flow.dir;
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

    fn flow(dir: Direction) -> PlannedFlow {
        PlannedFlow {
            dir,
            scope: FlowScope::All,
            reason: "r".into(),
        }
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
        assert_eq!(started.dir, Direction::Up);
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
        assert_eq!(next.dir, Direction::Up);
    }

    #[tokio::test]
    async fn a_zonal_and_a_shoot_wide_scale_down_are_different_flows() {
        let executor = ActingExecutor::default();
        let zonal = PlannedFlow {
            scope: FlowScope::Zonal,
            ..flow(Direction::Down)
        };
        assert_eq!(executor.hand_over(zonal), Handover::Accepted);
        let (_, stop) = executor.next_flow().await;
        assert_eq!(
            executor.hand_over(flow(Direction::Down)),
            Handover::Superseding
        );
        assert!(stop.is_cancelled());
    }
}
