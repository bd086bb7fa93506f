//! `dependency-watchdog explain --record FILE|-`: a decision the prober made, hours ago,
//! explained from its decision record ([`dwd_core::record`]) as the live `explain` would have
//! explained it at that moment, and, with `--config-file`, replayed under another config
//! ("what would this threshold have done last night"). No apiserver is contacted: the
//! record holds the finding's counts, the verdict's memory and the targets as the run saw
//! them, and [`dwd_core::record::replay`] judges them again with the live run's functions.
//!
//! Records are read from what operators have: a saved prober log (zap JSON or console
//! lines; each record is the `record` field of a `decision record` line), the output of
//! `/debug/decisions` (a JSON array), or records one per line.

use std::io::BufRead;

use dwd_core::ProberConfig;
use dwd_core::record::{DecisionRecord, RecordBody, Replay, ReplaySettings, replay};
use dwd_core::verdict::Streak;
use serde::Serialize;

use super::{Explanation, Step, flow_levels, hysteresis_line, summarize};
use crate::{Error, Result};

/// Which record of the input to explain.
#[derive(Debug, Clone, Default)]
pub struct Pick {
    /// The record with this id (`--id`).
    pub id: Option<String>,
    /// The last run record at or before this time (`--at`, RFC 3339).
    pub at: Option<chrono::DateTime<chrono::Utc>>,
    /// Of this shoot (`--namespace`).
    pub namespace: Option<String>,
}

/// A replayed decision: the explanation as the live `explain` would have printed it, and,
/// under another config, whether the verdict and intent differ.
#[derive(Debug, Serialize)]
pub struct Replayed {
    /// The record's id.
    pub id: String,
    /// When the run judged.
    pub at: String,
    /// Why the record was kept.
    pub recorded_because: Vec<String>,
    /// What the run decided, in words: `scale down (every target)`, `no scale-down`, …
    pub decision: String,
    /// As the run decided (the recorded settings).
    pub explanation: Explanation,
    /// Under `--config-file`, if given.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub under_config: Option<UnderConfig>,
}

/// The decision under another config.
#[derive(Debug, Serialize)]
pub struct UnderConfig {
    /// The config file.
    pub config_file: String,
    /// What the config would have decided, in words.
    pub decision: String,
    /// The explanation under it.
    pub explanation: Explanation,
    /// Whether the verdict (the flow asked for, and whether it acts) differs.
    pub verdict_differs: bool,
    /// Whether the intent (levels, targets, steps) differs.
    pub intent_differs: bool,
    /// What could not be judged again, in words.
    pub caveats: Vec<String>,
}

/// Reads every decision record in `input` (see the module docs); lines that hold none are
/// skipped.
pub fn read_records(input: impl BufRead) -> Result<Vec<DecisionRecord>> {
    let mut text = String::new();
    let mut records = Vec::new();
    for line in input.lines() {
        let line = line.map_err(|e| Error::Scaling(format!("reading the records: {e}")))?;
        text.push_str(&line);
        text.push('\n');
        records.extend(records_in_line(&line));
    }
    if records.is_empty() {
        // The endpoint's output: one JSON array, perhaps pretty-printed over many lines.
        if let Ok(all) = serde_json::from_str::<Vec<DecisionRecord>>(&text) {
            records = all;
        }
    }
    Ok(records)
}

/// The records in one line: a log line whose `record` field is one, the line itself, or an
/// array of them (the endpoint's output on one line).
fn records_in_line(line: &str) -> Vec<DecisionRecord> {
    let Some(start) = line.find(['{', '[']) else {
        return Vec::new();
    };
    // The console layout puts the fields' object after tab-separated text: try each `{`.
    let candidates = std::iter::once(start).chain(line.match_indices('{').map(|(i, _)| i));
    for at in candidates {
        let mut values =
            serde_json::Deserializer::from_str(&line[at..]).into_iter::<serde_json::Value>();
        let Some(Ok(value)) = values.next() else {
            continue;
        };
        let found = match value {
            serde_json::Value::Array(items) => items
                .into_iter()
                .filter_map(|v| serde_json::from_value(v).ok())
                .collect(),
            serde_json::Value::Object(mut fields) => {
                match fields.remove(crate::decisions::RECORD_FIELD) {
                    Some(record) => serde_json::from_value(record).ok().into_iter().collect(),
                    None => serde_json::from_value(serde_json::Value::Object(fields))
                        .ok()
                        .into_iter()
                        .collect(),
                }
            }
            _ => Vec::new(),
        };
        if !found.is_empty() {
            return found;
        }
    }
    Vec::new()
}

/// The record `pick` names among `records`: by id; else the last run record of the
/// namespace (if given) at or before `at` (if given).
pub fn pick<'a>(records: &'a [DecisionRecord], pick: &Pick) -> Result<&'a DecisionRecord> {
    if let Some(id) = &pick.id {
        return records.iter().find(|r| &r.id == id).ok_or_else(|| {
            Error::Scaling(format!(
                "--id {id}: no such record among the {} read",
                records.len()
            ))
        });
    }
    let at_or_before = |r: &DecisionRecord| match pick.at {
        None => true,
        Some(at) => chrono::DateTime::parse_from_rfc3339(&r.at).is_ok_and(|t| t <= at),
    };
    records
        .iter()
        .filter(|r| matches!(r.body, RecordBody::Run(ref run) if run.finding.is_some()))
        .filter(|r| pick.namespace.as_ref().is_none_or(|ns| &r.namespace == ns))
        .filter(|r| at_or_before(r))
        .max_by(|a, b| a.at.cmp(&b.at))
        .ok_or_else(|| {
            Error::Scaling(format!(
                "no run record{}{} among the {} read",
                pick.namespace
                    .as_ref()
                    .map(|ns| format!(" of --namespace {ns}"))
                    .unwrap_or_default(),
                pick.at
                    .map(|at| format!(" at or before --at {}", at.to_rfc3339()))
                    .unwrap_or_default(),
                records.len()
            ))
        })
}

/// Explains `record` as the live `explain` would have at its time and, with `config`
/// (`config_file` its path), under that config.
pub fn replayed(
    record: &DecisionRecord,
    config: Option<(&ProberConfig, &str)>,
) -> Result<Replayed> {
    let refused = |e: dwd_core::record::RecordError| Error::Scaling(e.to_string());
    let recorded = replay(record, &ReplaySettings::Recorded).map_err(refused)?;
    let under_config = match config {
        None => None,
        Some((config, path)) => {
            let other = replay(record, &ReplaySettings::Config(config)).map_err(refused)?;
            Some(UnderConfig {
                config_file: path.to_owned(),
                verdict_differs: other.verdict.asked != recorded.verdict.asked
                    || other.verdict.flow().is_some() != recorded.verdict.flow().is_some(),
                intent_differs: other.intent != recorded.intent,
                caveats: other.caveats.clone(),
                decision: decision_words(&other),
                explanation: explanation(record, &other),
            })
        }
    };
    Ok(Replayed {
        id: record.id.clone(),
        at: record.at.clone(),
        recorded_because: record
            .recorded_because
            .iter()
            .map(ToString::to_string)
            .collect(),
        decision: decision_words(&recorded),
        explanation: explanation(record, &recorded),
        under_config,
    })
}

/// What a replayed run decides, in words; a run that does not scale down says so first
/// ("no scale-down"), the answer to "what would this threshold have done".
fn decision_words(replay: &Replay) -> String {
    use dwd_core::Direction;
    let v = &replay.verdict;
    match (v.asked, v.streak) {
        (Some(flow), Streak::Counted { seen, needed }) if seen < needed => format!(
            "{}{} asked, held by the hysteresis ({seen} of {needed} runs in a row)",
            if flow.dir == Direction::Down {
                ""
            } else {
                "no scale-down: "
            },
            flow
        ),
        (Some(flow), _) if flow.dir == Direction::Down => format!("{flow}"),
        (Some(flow), _) => format!("no scale-down: {flow}"),
        (None, _) => format!("no scale-down: no scaling ({})", replay.report.decision),
    }
}

/// The live `explain`'s values for a replay: the same summary, hysteresis line and flow.
fn explanation(record: &DecisionRecord, replay: &Replay) -> Explanation {
    let mut lease_probe = summarize(&replay.report, &replay.zone_rule, replay.grace, replay.at);
    if let RecordBody::Run(run) = &record.body
        && let Some(finding) = &run.finding
    {
        let n = finding.not_named;
        lease_probe.not_named = n.expired + n.fresh + n.excluded + finding.orphan_leases;
    }
    let (hysteresis, flow) = match (replay.verdict.asked, replay.verdict.streak, &replay.intent) {
        (Some(asked), Streak::Counted { needed, .. }, Some(intent)) => (
            Some(hysteresis_line(asked.dir, needed)),
            flow_levels(intent),
        ),
        _ => (None, Vec::new()),
    };
    Explanation {
        namespace: record.namespace.clone(),
        probe: format!(
            "ran (grace period {:?}); replayed from decision record {} of {}",
            replay.grace, record.id, record.at
        ),
        api_server_probe: Step {
            ok: true,
            detail: "reachable at the time (the run judged the leases)".into(),
        },
        lease_probe: Some(lease_probe),
        hysteresis,
        flow,
        seen_at: Some(record.at.clone()),
    }
}

impl std::fmt::Display for Replayed {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        writeln!(
            f,
            "decision record {} ({}), kept for: {}",
            self.id,
            self.at,
            self.recorded_because.join(", ")
        )?;
        write!(f, "{}", self.explanation)?;
        writeln!(f, "  decided:          {}", self.decision)?;
        let Some(under) = &self.under_config else {
            return Ok(());
        };
        writeln!(f)?;
        writeln!(f, "under {}:", under.config_file)?;
        write!(f, "{}", under.explanation)?;
        writeln!(f, "  would decide:     {}", under.decision)?;
        let said = |differs: bool| if differs { "DIFFERS" } else { "the same" };
        writeln!(
            f,
            "  compared with the run: verdict {}, intent {}",
            said(under.verdict_differs),
            said(under.intent_differs)
        )?;
        for caveat in &under.caveats {
            writeln!(f, "  note: {caveat}")?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use chrono::{TimeDelta, TimeZone, Utc};
    use dwd_core::intent::{Seen, intent};
    use dwd_core::lease::{MachineView, NodeLeaseView, NodeView, evaluate_leases};
    use dwd_core::record::{JudgedRun, Mode, RunRecord, SCHEMA, timestamp};
    use dwd_core::verdict::{VerdictMemory, verdict};
    use dwd_core::{EffectiveProbeSettings, Hysteresis};

    use super::*;

    const CONFIG: &str = "kubeConfigSecretName: s\nkcmNodeMonitorGraceDuration: 40s\nnodeLeaseFailureFraction: 0.6\n\
        dependentResourceInfos:\n- ref: {kind: Deployment, name: kube-controller-manager, apiVersion: apps/v1}\n  \
        scaleUp: {level: 1}\n  scaleDown: {level: 0}\n";

    fn config(threshold: &str) -> ProberConfig {
        let yaml = CONFIG.replace("0.6", threshold);
        ProberConfig::from_yaml(&yaml).expect("config").config
    }

    /// The record of a run that found 4 of 5 leases expired and scaled kcm down.
    #[allow(
        clippy::too_many_lines,
        reason = "one scenario's world, built field by field"
    )]
    fn scale_down() -> DecisionRecord {
        let config = config("0.6");
        let now = Utc.with_ymd_and_hms(2026, 11, 29, 3, 12, 0).unwrap();
        let names: Vec<String> = (1..=5).map(|i| format!("n{i}")).collect();
        let nodes: Vec<NodeView> = names
            .iter()
            .map(|n| NodeView {
                name: n.clone(),
                pool: None,
                zone: None,
                not_managed_by_mcm: false,
                conditions: Vec::new(),
            })
            .collect();
        let machines: Vec<MachineView> = names
            .iter()
            .map(|n| MachineView {
                name: format!("m-{n}"),
                node: Some(n.clone()),
                phase: Some("Running".into()),
            })
            .collect();
        let leases: Vec<NodeLeaseView> = names
            .iter()
            .enumerate()
            .map(|(i, n)| NodeLeaseView {
                name: n.clone(),
                renew_time: Some(now - TimeDelta::seconds(if i < 4 { 60 } else { 2 })),
            })
            .collect();
        let settings = EffectiveProbeSettings {
            node_monitor_grace: config.kcm_node_monitor_grace_duration,
            pool_conditions: BTreeMap::new(),
        };
        let report = evaluate_leases(
            &nodes,
            &machines,
            &leases,
            &settings,
            0.6,
            &config.zone_rule(),
            now,
        );
        let memory = VerdictMemory {
            hysteresis: Hysteresis::from_config(&config),
            disrupted_zones: Default::default(),
        };
        let (verdict, _) = verdict(&report, &memory);
        let seen = Seen::Present(dwd_core::TargetSnapshot {
            spec_replicas: 2,
            annotations: BTreeMap::new(),
        });
        let targets = vec![(config.dependent_resource_infos[0].clone(), seen.clone())];
        let flow = verdict.flow().expect("a flow");
        let intent = intent(
            &config.dependent_resource_infos,
            flow.dir,
            flow.scope,
            |_| seen.clone(),
        );
        let run = JudgedRun {
            report: &report,
            now,
            memory_before: &memory,
            verdict: &verdict,
            intent: Some(&intent),
            targets: &targets,
        };
        DecisionRecord {
            schema: SCHEMA.into(),
            id: "shoot--p--s/1764385920000.7".into(),
            namespace: "shoot--p--s".into(),
            at: timestamp(now),
            mode: Mode::Acting,
            recorded_because: vec![dwd_core::record::Because::VerdictToScale],
            body: RecordBody::Run(Box::new(RunRecord::judged(
                &config,
                config.kcm_node_monitor_grace_duration,
                &run,
                None,
            ))),
        }
    }

    #[test]
    fn records_are_read_from_log_lines_of_both_layouts_and_from_the_endpoints_array() {
        let record = scale_down();
        let json = serde_json::to_string(&record).unwrap();
        let zap = format!(
            r#"{{"level":"info","ts":"2026-11-29T03:12:00Z","logger":"dwd.decisions","msg":"decision record","decision_id":"{}","record":{json}}}"#,
            record.id
        );
        let console = format!(
            "2026-11-29T03:12:00Z\tINFO\tdwd.decisions\tdecision record\t{{\"record\": {json}}}"
        );
        let pretty = serde_json::to_string_pretty(&vec![&record]).unwrap();
        for input in [
            format!("{{\"level\":\"info\",\"msg\":\"other\"}}\nnot json\n{zap}\n"),
            format!("{console}\n"),
            pretty,
            format!("{json}\n"),
        ] {
            let read = read_records(input.as_bytes()).unwrap();
            assert_eq!(read, std::slice::from_ref(&record), "{input}");
        }
    }

    #[test]
    fn a_record_is_picked_by_id_or_as_the_shoots_last_before_a_time() {
        let first = scale_down();
        let mut later = scale_down();
        later.id = "shoot--p--s/1764386000000.9".into();
        later.at = "2026-11-29T03:13:20.000Z".into();
        let records = [first.clone(), later.clone()];
        let by = |id: Option<&str>, at: Option<&str>| {
            pick(
                &records,
                &Pick {
                    id: id.map(Into::into),
                    at: at.map(|t| chrono::DateTime::parse_from_rfc3339(t).unwrap().to_utc()),
                    namespace: Some("shoot--p--s".into()),
                },
            )
            .map(|r| r.id.clone())
        };
        assert_eq!(by(Some(&first.id), None).unwrap(), first.id);
        assert_eq!(by(None, None).unwrap(), later.id);
        assert_eq!(by(None, Some("2026-11-29T03:12:30Z")).unwrap(), first.id);
        let none = by(None, Some("2026-11-29T03:00:00Z"))
            .unwrap_err()
            .to_string();
        assert!(none.contains("at or before --at"), "{none}");
        assert!(
            by(Some("nope"), None)
                .unwrap_err()
                .to_string()
                .contains("--id nope")
        );
    }

    #[test]
    fn a_scale_down_replayed_prints_what_explain_printed_and_a_higher_threshold_says_no_scale_down()
    {
        let record = scale_down();
        let replayed = replayed(&record, None).unwrap();
        let text = replayed.to_string();
        for line in [
            "  verdict:          4/5 node leases expired (0.80 ≥ 0.60): scale down",
            "  hysteresis:       failureThreshold 1: the prober acts on every run that decides scale down",
            "    level 0  Deployment/kube-controller-manager       would record replicas=2, then scale 2 → 0",
            "  decided:          scale down (all targets)",
        ] {
            assert!(text.contains(line), "{line:?} not in\n{text}");
        }
        let higher = config("0.9");
        let other = replayed_under(&record, &higher);
        let under = other.under_config.as_ref().unwrap();
        assert!(
            under.decision.starts_with("no scale-down"),
            "{}",
            under.decision
        );
        assert!(under.verdict_differs && under.intent_differs);
        let same = replayed_under(&record, &config("0.6"));
        let same = same.under_config.as_ref().unwrap();
        assert!(
            !same.verdict_differs && !same.intent_differs,
            "{}",
            same.decision
        );
        assert!(
            other
                .to_string()
                .contains("verdict DIFFERS, intent DIFFERS")
        );
    }

    fn replayed_under(record: &DecisionRecord, config: &ProberConfig) -> Replayed {
        replayed(record, Some((config, "new.yaml"))).unwrap()
    }
}
