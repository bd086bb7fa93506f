//! The prober's decision records in the sandbox: read back from its log (each `decision
//! record` line carries one as its `record` field, docs/decision-record.md), listed in the
//! report (a click shows the leases and the rule), and the story's last step: the alpha
//! scale-down replayed from the log under a higher threshold with `dependency-watchdog
//! explain --record`, which contacts no apiserver.

use std::fmt::Write as _;
use std::path::Path;

use dwd_core::record::{DecisionRecord, RecordBody, RunRecord, TakenRecord};

/// Every decision record in the log at `path`, in the order they were logged.
pub(crate) fn read(path: &Path) -> Vec<DecisionRecord> {
    let Ok(text) = std::fs::read_to_string(path) else {
        return Vec::new();
    };
    text.lines()
        .filter(|l| l.contains("\"record\":{"))
        .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
        .filter_map(|mut v| serde_json::from_value(v["record"].take()).ok())
        .collect()
}

/// The first run record of shoot `namespace` that handed over a scale-down.
pub(crate) fn first_scale_down<'a>(
    records: &'a [DecisionRecord],
    namespace: &str,
) -> Option<&'a DecisionRecord> {
    records.iter().find(|r| {
        r.namespace == namespace
            && matches!(&r.body, RecordBody::Run(run)
            if matches!(run.taken, Some(TakenRecord::Queued { .. }))
                && run.intent.as_ref().is_some_and(|i| {
                    i.flow.direction == dwd_core::record::DirectionName::Down
                }))
    })
}

/// `s` escaped for HTML.
fn escape(s: &str) -> String {
    s.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
        .replace('"', "&quot;")
}

/// What a record says in one line: the decision and what became of it, or the flow's end.
fn headline(record: &DecisionRecord) -> String {
    match &record.body {
        RecordBody::Run(run) => {
            let decided = run
                .finding
                .as_ref()
                .map(|f| f.summary.clone())
                .or_else(|| {
                    run.not_made
                        .as_ref()
                        .map(|n| format!("run not made for room ({})", n.cause))
                })
                .unwrap_or_default();
            let taken = match &run.taken {
                Some(TakenRecord::Queued { targets, .. }) => {
                    format!("; handed over: {}", targets.join(", "))
                }
                Some(TakenRecord::Held) => "; held by the hysteresis".into(),
                Some(TakenRecord::Superseded) => "; a different flow stopped".into(),
                Some(TakenRecord::Nothing { why }) => format!("; {why}"),
                Some(TakenRecord::Recorded) | None => String::new(),
            };
            format!("{decided}{taken}")
        }
        RecordBody::Flow(flow) => {
            let writes: Vec<String> = flow
                .writes
                .iter()
                .map(|w| match (w.from, w.to) {
                    (Some(from), Some(to)) => format!("{} {from}→{to}", w.target),
                    _ => format!("{} skipped", w.target),
                })
                .collect();
            format!(
                "flow {:?} {:?}: {:?}; {}",
                flow.flow.direction,
                flow.flow.scope,
                flow.outcome,
                writes.join(", ")
            )
            .to_lowercase()
        }
    }
}

/// A run record's details: the leases, the rule, the targets' steps.
fn run_details(h: &mut String, run: &RunRecord) {
    let s = &run.settings;
    let _ = write!(
        h,
        "<p>rule: nodeLeaseFailureFraction {:.2}, grace {} s, failureThreshold {}, successThreshold {}, zoneLeaseFailureFraction {:.2}, minCandidatesPerZone {}</p>",
        s.node_lease_failure_fraction,
        s.grace_seconds,
        s.failure_threshold,
        s.success_threshold,
        s.zone_lease_failure_fraction,
        s.min_candidates_per_zone
    );
    if let Some(f) = &run.finding {
        let _ = write!(
            h,
            "<p>finding: {} candidates, {} expired ({} nodes seen)</p><ul>",
            f.candidates, f.expired, f.nodes_seen
        );
        for (state, leases) in [("expired", &f.expired_leases), ("fresh", &f.fresh_leases)] {
            for l in leases {
                let _ = write!(
                    h,
                    "<li>{} {state}, age {}</li>",
                    escape(&l.node),
                    l.age_seconds
                        .map(|a| format!("{a:.1} s"))
                        .unwrap_or_else(|| "unknown (no renewal)".into())
                );
            }
        }
        for e in &f.excluded_nodes {
            let _ = write!(h, "<li>{} excluded: {:?}</li>", escape(&e.node), e.why);
        }
        let n = f.not_named;
        if n.expired + n.fresh + n.excluded > 0 {
            let _ = write!(
                h,
                "<li>not named: {} expired, {} fresh, {} excluded</li>",
                n.expired, n.fresh, n.excluded
            );
        }
        h.push_str("</ul>");
    }
    if let Some(v) = &run.verdict {
        let streak = v
            .streak
            .map(|s| format!("{} of {} runs in a row", s.seen, s.needed))
            .unwrap_or_else(|| "not counted".into());
        let _ = write!(
            h,
            "<p>verdict: {} (hysteresis: {streak}; acts: {})</p>",
            escape(&v.why),
            v.acts
        );
    }
    if let Some(intent) = &run.intent {
        h.push_str("<ul>");
        for level in &intent.levels {
            for t in &level.targets {
                let _ = write!(
                    h,
                    "<li>level {}: {} — {}</li>",
                    level.level,
                    escape(&t.target),
                    escape(&t.words)
                );
            }
        }
        h.push_str("</ul>");
    }
}

/// The report's section: each record in a row, its details a click away.
pub(crate) fn html(records: &[DecisionRecord], shoots: &[(String, String, usize)]) -> String {
    let mut h = String::from(
        "<h2>Decisions</h2><p>The prober's decision records, read back from its log (one JSON line each, field <code>record</code>; docs/decision-record.md): every run that changed something or could have, and every flow's end. Click a row for the leases, the rule and the targets' steps. <code>dependency-watchdog explain --record prober.log --id ID</code> prints any of them as <code>explain</code> did then; with <code>--config-file</code> it replays it under another config.</p><table><tr><th>at</th><th>shoot</th><th>kept for</th><th>decision</th></tr>",
    );
    let short = |ns: &str| {
        shoots
            .iter()
            .find(|(_, namespace, _)| namespace == ns)
            .map(|(name, _, _)| name.clone())
            .unwrap_or_else(|| ns.to_owned())
    };
    for r in records {
        let because: Vec<String> = r.recorded_because.iter().map(ToString::to_string).collect();
        let _ = write!(
            h,
            "<tr><td class=\"t\">{}</td><td>{}</td><td>{}</td><td><details><summary>{}</summary><p><code>{}</code></p>",
            escape(r.at.get(11..23).unwrap_or(&r.at)),
            escape(&short(&r.namespace)),
            escape(&because.join(", ")),
            escape(&headline(r)),
            escape(&r.id)
        );
        if let RecordBody::Run(run) = &r.body {
            run_details(&mut h, run);
        }
        h.push_str("</details></td></tr>");
    }
    h.push_str("</table>");
    h
}
