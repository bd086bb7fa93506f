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

use std::sync::{Mutex, MutexGuard, PoisonError};

use dwd_core::Direction;
use dwd_core::scaling::FlowScope;
use tokio::sync::Notify;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tracing::{debug, info, warn};

use super::ProberContext;
use super::scaler::{self, PlannedFlow};

/// Whether `flow` asks for the flow in `dir` over `scope` (reasons may differ).
fn same_flow(flow: &PlannedFlow, dir: Direction, scope: FlowScope) -> bool {
    flow.dir == dir && flow.scope == scope
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
/// [`ShootExecutor::hand_over`]; [`ShootExecutor::run`] carries them out.
#[derive(Debug, Default)]
pub struct ShootExecutor {
    slot: Mutex<Slot>,
    /// Signalled when a flow is queued (a permit is kept if nobody waits).
    queued: Notify,
}

impl ShootExecutor {
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
        let executor = ShootExecutor::default();
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
        let executor = ShootExecutor::default();
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
