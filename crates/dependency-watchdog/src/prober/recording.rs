//! Shadow mode's executor (docs/behaviour.md §5): every shoot gets one when the prober runs
//! with `--shadow`, chosen once at startup ([`super::executor::Executors`]). It publishes the
//! same run reports an acting executor does, in its own way: it keeps each run's finding in
//! shadow mode's book (each comparison shows the latest), publishes the zone events in the
//! conditional ("would scale"), and instead of carrying a flow out it moves our would-be state
//! of the shoot and records the change in the book as a sighting of what we would have done.
//! Everything only shadow mode needs on the run path is here; the probe knows nothing of modes.

use std::sync::Arc;

use chrono::Utc;
use dwd_core::lease::LeaseReport;
use dwd_core::record::Mode;
use dwd_core::shadow::Side;

use super::context::ProberContext;
use super::report::{self, RunReport, ShootRef, Taken, Verbs};
use super::scaler::PlannedFlow;
use super::shadow_observer::{self, Recorder, VirtualState};
use crate::observe::events::Subject;
use crate::text::cut;

/// Nodes listed by name in shadow mode's note of a finding; the rest are counted (node
/// names come from the tenant).
pub(crate) const NOTED_NODES_LIMIT: usize = 20;

/// Longest node name quoted in shadow mode's note of a finding.
const NOTED_NAME_LIMIT: usize = 100;

/// Shadow mode's executor: takes the decisions an acting executor would and writes
/// nothing; it moves our would-be state of the shoot (a scale-down of a shoot we have not
/// scaled down, a scale-up of one we have) and records each change in the book as a
/// sighting of what we would have done, naming the targets the flow would act on whatever
/// the acting watchdog did to them.
pub struct RecordingExecutor {
    pub(crate) recorder: Arc<Recorder>,
}

impl RecordingExecutor {
    /// Our would-be state of shoot `namespace`: at first the acting watchdog's when shadow
    /// mode first saw the shoot (asked of the caches, which are in sync during a run, if the
    /// observer has not seen it yet).
    pub(crate) fn virtual_state(&self, ctx: &ProberContext, namespace: &str) -> VirtualState {
        self.recorder.states.ours(namespace, || {
            shadow_observer::acting_protected(&ctx.caches, namespace)
        })
    }

    /// Publishes `run` of `shoot` (see the module docs).
    pub(crate) fn publish(&self, ctx: &ProberContext, shoot: &ShootRef<'_>, run: &RunReport<'_>) {
        let note = match run {
            RunReport::Failed(failure) => format!("probe failed: {failure}; no scaling this run"),
            RunReport::NotMade(not_made) => {
                report::keep_not_made_record(ctx, shoot, not_made, Mode::Shadow);
                format!("run not made: {}; no scaling this run", not_made.why)
            }
            RunReport::AllLeasesFresh { leases } => {
                format!("all {leases} node leases fresh: no scaling")
            }
            RunReport::Judged(judged) => finding_note(judged.report, Utc::now()),
        };
        self.recorder.book.note_finding(shoot.namespace, &note);
        let RunReport::Judged(judged) = run else {
            return;
        };
        report::publish_zone_changes(ctx, shoot, judged, Verbs::RECORDING);
        let Some(flow) = &judged.flow else {
            report::log_no_flow(judged);
            report::keep_run_record(ctx, shoot, judged, None, Mode::Shadow);
            return;
        };
        let id = ctx.decisions.next_id(shoot.namespace, judged.judged_at);
        let flow = PlannedFlow {
            decision: Some(id.clone()),
            ..flow.clone()
        };
        let taken = self.take(ctx, shoot.namespace, &flow);
        report::log_taken(judged, &flow, &taken);
        report::keep_run_record(ctx, shoot, judged, Some((&taken, id)), Mode::Shadow);
    }

    fn take(&self, ctx: &ProberContext, namespace: &str, flow: &PlannedFlow) -> Taken {
        let (dir, scope) = (flow.intent.dir, flow.intent.scope);
        let state = self.virtual_state(ctx, namespace);
        let targets = flow.intent.in_scope();
        let step = dwd_core::shadow::step(state, dir, scope, !targets.is_empty());
        if step.next != state {
            self.recorder.states.set_ours(namespace, step.next);
        }
        let Some(action) = step.report else {
            return Taken::Nothing(format!(
                "shadow mode: nothing to report (our would-be state {state:?}, next {:?}, {} \
                 target(s) in scope)",
                step.next,
                targets.len()
            ));
        };
        let evidence = format!("{}; {scope}: {}", flow.reason, targets.join(", "));
        self.recorder.book.record(
            Side::Ours,
            &ctx.events,
            &Subject::Cluster(namespace),
            action,
            &evidence,
        );
        Taken::Recorded
    }
}

/// Shadow mode's note of a finding: the report's summary and decision, then each node's
/// verdict (at most [`NOTED_NODES_LIMIT`] of them, the rest counted): candidate or why it is
/// excluded, its lease's age against its expiry at `now`, its zone.
pub(crate) fn finding_note(report: &LeaseReport, now: chrono::DateTime<Utc>) -> String {
    use dwd_core::lease::Verdict;
    use std::fmt::Write;
    let mut note = report.to_string();
    for (i, node) in report.nodes.iter().enumerate() {
        if i == NOTED_NODES_LIMIT {
            let _ = write!(note, "; … and {} more", report.nodes.len() - i);
            break;
        }
        let _ = write!(note, "; {}", cut(&node.node, NOTED_NAME_LIMIT));
        if let Some(zone) = &node.zone {
            let _ = write!(note, " (zone {})", cut(zone, NOTED_NAME_LIMIT));
        }
        let seconds = |d: chrono::TimeDelta| d.num_milliseconds() as f64 / 1000.0;
        let _ = match &node.verdict {
            Verdict::Candidate {
                renew_time: Some(renewed),
                expires_at,
                expired,
            } => {
                let state = if *expired { "expired" } else { "fresh" };
                match expires_at {
                    Some(at) => write!(
                        note,
                        ": candidate, lease {:.1} s old, expires at {:.1} s: {state}",
                        seconds(now - *renewed),
                        seconds(*at - *renewed)
                    ),
                    None => write!(
                        note,
                        ": candidate, lease {:.1} s old: {state}",
                        seconds(now - *renewed)
                    ),
                }
            }
            verdict => write!(note, ": {verdict}"),
        };
    }
    note
}

#[cfg(test)]
mod tests {
    use super::*;
    use dwd_core::LeaseDecision;

    fn report(expired: usize, decision: LeaseDecision) -> LeaseReport {
        LeaseReport {
            nodes_seen: 5,
            nodes: Vec::new(),
            orphan_leases: Vec::new(),
            candidates: 5,
            expired,
            fraction: Some(expired as f64 / 5.0),
            threshold: 0.6,
            zones: Vec::new(),
            decision,
        }
    }

    #[test]
    fn shadow_modes_note_of_a_finding_names_at_most_twenty_nodes_with_their_verdicts() {
        use dwd_core::lease::{ExclusionReason, NodeVerdict, Verdict};
        let now = Utc::now();
        let renewed = now - chrono::Duration::seconds(300);
        let mut report = report(4, LeaseDecision::ScaleDown);
        report.nodes = (0..25)
            .map(|i| NodeVerdict {
                node: format!("n{i:02}"),
                zone: (i == 0).then(|| "eu-1a".to_string()),
                verdict: match i {
                    0 => Verdict::Candidate {
                        renew_time: Some(renewed),
                        expires_at: Some(renewed + chrono::Duration::seconds(30)),
                        expired: true,
                    },
                    1 => Verdict::Excluded(ExclusionReason::NoMachine),
                    _ => Verdict::Candidate {
                        renew_time: None,
                        expires_at: None,
                        expired: true,
                    },
                },
            })
            .collect();
        let note = finding_note(&report, now);
        assert!(
            note.starts_with(
                "4/5 node leases expired (0.80 ≥ 0.60): scale down; \
                 n00 (zone eu-1a): candidate, lease 300.0 s old, expires at 30.0 s: expired; \
                 n01: excluded: no Machine backs this node; \
                 n02: candidate, lease has no renew time: expired; "
            ),
            "{note}"
        );
        assert!(note.contains("; n19: "), "{note}");
        assert!(!note.contains("n20"), "{note}");
        assert!(note.ends_with("; … and 5 more"), "{note}");

        // A tenant's node names are cut.
        report.nodes.truncate(1);
        report.nodes[0].node = "x".repeat(10_000);
        assert!(finding_note(&report, now).len() < 400);
    }
}
