//! Decision records replay to what the run decided: generated findings (nodes, zones, lease
//! ages, exclusions), memories and configs are judged as the probe judges them, recorded,
//! written and read back as JSON, and replayed; the replay's verdict and intent are the run's,
//! under the recorded settings and under the same config given anew. A record's size stays
//! within its stated bound at 5,000 nodes with the longest names. Every record written here
//! is valid under the committed JSON Schema (docs/decision-record.schema.json), and that file
//! is the one the types generate (`DWD_WRITE_SCHEMA=1` rewrites it after a change of the
//! types; a change of v1's meaning needs a new [`SCHEMA`] name).
//!
//! The generator and runner are the property tests' (`support/property.rs`: a time budget per
//! property, `DWD_PROPTEST_SEED` replays a failure).

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use chrono::{DateTime, TimeDelta, TimeZone, Utc};
use dwd_core::intent::{Intent, Seen, intent};
use dwd_core::lease::{ConditionView, MachineView, NodeLeaseView, NodeView, evaluate_leases};
use dwd_core::record::{
    DecisionRecord, JudgedRun, Mode, RecordBody, ReplaySettings, RunRecord, SCHEMA, record_bound,
    replay,
};
use dwd_core::scaling::{MELTDOWN_ANNOTATION, REPLICAS_ANNOTATION, TargetSnapshot};
use dwd_core::verdict::{VerdictMemory, verdict};
use dwd_core::{
    DependentResourceInfo, EffectiveProbeSettings, Hysteresis, LeaseReport, ProberConfig,
};

/// The committed schema's path.
fn schema_path() -> std::path::PathBuf {
    std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../docs/decision-record.schema.json")
}

/// A validator of the committed schema, `format` (the times' `date-time`) asserted.
fn committed_schema() -> jsonschema::Validator {
    let text = std::fs::read_to_string(schema_path()).expect("docs/decision-record.schema.json");
    let schema: serde_json::Value = serde_json::from_str(&text).expect("the schema is JSON");
    jsonschema::options()
        .should_validate_formats(true)
        .build(&schema)
        .expect("the schema is a valid JSON Schema")
}

/// `json` against the committed schema: every violation, with where it is.
fn schema_errors(validator: &jsonschema::Validator, json: &serde_json::Value) -> Vec<String> {
    validator
        .iter_errors(json)
        .map(|e| format!("{} at {}", e, e.instance_path()))
        .collect()
}

#[path = "support/property.rs"]
mod property;

use property::{Rng, property};

fn now() -> DateTime<Utc> {
    Utc.with_ymd_and_hms(2026, 11, 29, 3, 12, 0).unwrap()
}

/// A config with random thresholds, zone rule, hysteresis and the three targets at random
/// levels (some zonal, some optional).
fn config(rng: &mut Rng) -> ProberConfig {
    let fraction = |rng: &mut Rng| format!("{:.2}", 0.05 + rng.below(96) as f64 / 100.0);
    let mut yaml = format!(
        "kubeConfigSecretName: s\nkcmNodeMonitorGraceDuration: 40s\nnodeLeaseFailureFraction: {}\n\
         zoneLeaseFailureFraction: {}\nminCandidatesPerZone: {}\nsuccessThreshold: {}\nfailureThreshold: {}\n\
         dependentResourceInfos:\n",
        fraction(rng),
        fraction(rng),
        2 + rng.below(3),
        1 + rng.below(3),
        1 + rng.below(3),
    );
    for name in [
        "kube-controller-manager",
        "machine-controller-manager",
        "cluster-autoscaler",
    ] {
        yaml.push_str(&format!(
            "- ref: {{kind: Deployment, name: {name}, apiVersion: apps/v1}}\n  optional: {}\n  \
             scaleDownOnZoneOutage: {}\n  scaleUp: {{level: {}, initialDelay: {}ms, timeout: 30s}}\n  \
             scaleDown: {{level: {}, initialDelay: 0s, timeout: {}ms}}\n",
            rng.chance(30),
            rng.chance(40),
            rng.below(3),
            rng.below(40_000),
            rng.below(3),
            1 + rng.below(60_000),
        ));
    }
    ProberConfig::from_yaml(&yaml)
        .expect("generated config")
        .config
}

/// A shoot of up to 40 nodes in up to three zones (some in none), with lease ages around
/// the expiry, some nodes excluded (no Machine, no lease, an unhealthy condition).
fn shoot(rng: &mut Rng) -> (Vec<NodeView>, Vec<MachineView>, Vec<NodeLeaseView>) {
    let zones = ["eu-1a", "eu-1b", "eu-1c"];
    let n = rng.below(41) as usize;
    let (mut nodes, mut machines, mut leases) = (Vec::new(), Vec::new(), Vec::new());
    for i in 0..n {
        let name = format!("shoot--p--s-worker-{i}");
        let zone = (!rng.chance(15)).then(|| (*rng.pick(&zones)).to_owned());
        let conditions = if rng.chance(5) {
            vec![ConditionView {
                type_: "ReadonlyFilesystem".into(),
                status: "True".into(),
                reason: None,
            }]
        } else {
            Vec::new()
        };
        nodes.push(NodeView {
            name: name.clone(),
            pool: Some("worker".into()),
            zone,
            not_managed_by_mcm: false,
            conditions,
        });
        if !rng.chance(5) {
            machines.push(MachineView {
                name: format!("m-{i}"),
                node: Some(name.clone()),
                phase: Some("Running".into()),
            });
        }
        if !rng.chance(5) {
            let age = TimeDelta::milliseconds(rng.below(60_000) as i64);
            leases.push(NodeLeaseView {
                name,
                renew_time: (!rng.chance(3)).then(|| now() - age),
            });
        }
    }
    (nodes, machines, leases)
}

/// What the caches might show of a target.
fn seen(rng: &mut Rng) -> Seen {
    match rng.below(6) {
        0 => Seen::Absent,
        1 => Seen::Unknown("cache not in sync".into()),
        _ => {
            let mut annotations = BTreeMap::new();
            if rng.chance(50) {
                annotations.insert(MELTDOWN_ANNOTATION.to_owned(), String::new());
                annotations.insert(
                    REPLICAS_ANNOTATION.to_owned(),
                    (1 + rng.below(3)).to_string(),
                );
            }
            Seen::Present(TargetSnapshot {
                spec_replicas: rng.below(4) as i32,
                annotations,
            })
        }
    }
}

/// One judged run, as the probe makes it: the finding, the verdict from a memory, and the
/// intent of the asked flow from what the targets were seen at.
struct Run {
    config: ProberConfig,
    report: LeaseReport,
    memory: VerdictMemory,
    verdict: dwd_core::verdict::Verdict,
    intent: Option<Intent>,
    targets: Vec<(DependentResourceInfo, Seen)>,
}

fn run(rng: &mut Rng) -> Run {
    let config = config(rng);
    let (nodes, machines, leases) = shoot(rng);
    let settings = EffectiveProbeSettings {
        node_monitor_grace: config.kcm_node_monitor_grace_duration,
        pool_conditions: BTreeMap::from([(
            "worker".to_owned(),
            vec!["ReadonlyFilesystem".to_owned()],
        )]),
    };
    let report = evaluate_leases(
        &nodes,
        &machines,
        &leases,
        &settings,
        config.node_lease_failure_fraction,
        &config.zone_rule(),
        now(),
    );
    let memory = VerdictMemory {
        hysteresis: Hysteresis::with_streaks(
            config.success_threshold,
            config.failure_threshold,
            rng.below(3) as u32,
            rng.below(3) as u32,
        ),
        disrupted_zones: ["eu-1a", "eu-1b"]
            .into_iter()
            .filter(|_| rng.chance(30))
            .map(str::to_owned)
            .collect::<BTreeSet<_>>(),
    };
    let targets: Vec<(DependentResourceInfo, Seen)> = config
        .dependent_resource_infos
        .iter()
        .map(|info| (info.clone(), seen(rng)))
        .collect();
    Run::judged(config, report, memory, targets)
}

impl Run {
    /// The run on `report`: the verdict from `memory`, the intent of the asked flow from the
    /// targets as `targets` saw them.
    fn judged(
        config: ProberConfig,
        report: LeaseReport,
        memory: VerdictMemory,
        targets: Vec<(DependentResourceInfo, Seen)>,
    ) -> Run {
        let (verdict, _) = verdict(&report, &memory);
        let intent = verdict.asked.map(|flow| {
            intent(
                &config.dependent_resource_infos,
                flow.dir,
                flow.scope,
                |info| {
                    targets
                        .iter()
                        .find(|(i, _)| i.target == info.target)
                        .map(|(_, s)| s.clone())
                        .unwrap()
                },
            )
        });
        Run {
            config,
            report,
            memory,
            verdict,
            intent,
            targets,
        }
    }
}

fn record_of(run: &Run) -> DecisionRecord {
    let judged = JudgedRun {
        report: &run.report,
        now: now(),
        memory_before: &run.memory,
        verdict: &run.verdict,
        intent: run.intent.as_ref(),
        targets: &run.targets,
    };
    DecisionRecord {
        schema: SCHEMA.into(),
        id: "shoot--p--s/1764385920000.1".into(),
        namespace: "shoot--p--s".into(),
        at: dwd_core::record::timestamp(now()),
        mode: Mode::Acting,
        recorded_because: Vec::new(),
        body: RecordBody::Run(Box::new(RunRecord::judged(
            &run.config,
            run.config.kcm_node_monitor_grace_duration,
            &judged,
            None,
        ))),
    }
}

/// The intent's steps and targets' configs, which a replay must give back (a target's
/// annotations other than the watchdog's are not recorded, and not generated here).
fn same_intent(a: &Option<Intent>, b: &Option<Intent>) -> bool {
    a == b
}

#[test]
fn a_recorded_run_replays_to_its_own_verdict_and_intent() {
    let validator = committed_schema();
    property("record-replay", |rng| {
        let run = run(rng);
        let record = record_of(&run);
        let json = serde_json::to_string(&record).map_err(|e| e.to_string())?;
        let errors = schema_errors(&validator, &serde_json::to_value(&record).unwrap());
        if !errors.is_empty() {
            return Err(format!("not valid under the schema: {errors:?}\n{json}"));
        }
        let read: DecisionRecord =
            serde_json::from_str(&json).map_err(|e| format!("{e}: {json}"))?;
        if read != record {
            return Err(format!("JSON round trip changed the record: {json}"));
        }
        for (what, settings) in [
            ("recorded settings", ReplaySettings::Recorded),
            ("the same config", ReplaySettings::Config(&run.config)),
        ] {
            let replayed = replay(&read, &settings).map_err(|e| e.to_string())?;
            if replayed.verdict != run.verdict {
                return Err(format!(
                    "{what}: verdict {:?} replayed as {:?}\n{json}",
                    run.verdict, replayed.verdict
                ));
            }
            if !same_intent(&replayed.intent, &run.intent) {
                return Err(format!(
                    "{what}: intent {:?} replayed as {:?}\n{json}",
                    run.intent, replayed.intent
                ));
            }
            if replayed.report.decision != run.report.decision
                || replayed.report.to_string() != run.report.to_string()
            {
                return Err(format!(
                    "{what}: finding {} replayed as {}",
                    run.report, replayed.report
                ));
            }
        }
        Ok(())
    });
}

#[test]
fn a_higher_threshold_replays_a_scale_down_as_none() {
    property("record-replay-threshold", |rng| {
        let run = run(rng);
        if run.report.decision != dwd_core::LeaseDecision::ScaleDown {
            return Ok(());
        }
        let mut higher = run.config.clone();
        higher.node_lease_failure_fraction = 1.01;
        higher.dependent_resource_infos.iter_mut().for_each(|i| {
            i.scale_down_on_zone_outage = false;
        });
        let replayed = replay(&record_of(&run), &ReplaySettings::Config(&higher))
            .map_err(|e| e.to_string())?;
        match replayed.verdict.asked {
            Some(flow) if flow.dir == dwd_core::Direction::Down => Err(format!(
                "a threshold above 1 still scales down: {:?}",
                replayed.verdict
            )),
            _ => Ok(()),
        }
    });
}

#[test]
fn a_record_of_a_5000_node_shoot_with_the_longest_names_is_within_its_bound() {
    let mut rng = Rng(5000);
    let config = config(&mut rng);
    let long = |prefix: &str, i: usize| format!("{prefix}{i:0>240}");
    let mut nodes = Vec::new();
    let mut leases = Vec::new();
    let mut machines = Vec::new();
    for i in 0..5000 {
        let name = long("n", i);
        nodes.push(NodeView {
            name: name.clone(),
            pool: Some("worker".into()),
            zone: Some(long("z", i % 12)[..63].to_owned() + &i.to_string()),
            not_managed_by_mcm: false,
            conditions: Vec::new(),
        });
        if i % 7 != 0 {
            machines.push(MachineView {
                name: long("m", i),
                node: Some(name.clone()),
                phase: Some("Running".into()),
            });
        }
        let age = if i % 2 == 0 { 100 } else { 1 };
        leases.push(NodeLeaseView {
            name,
            renew_time: Some(now() - TimeDelta::seconds(age)),
        });
    }
    let report = evaluate_leases(
        &nodes,
        &machines,
        &leases,
        &EffectiveProbeSettings {
            node_monitor_grace: Duration::from_secs(40),
            pool_conditions: BTreeMap::new(),
        },
        config.node_lease_failure_fraction,
        &config.zone_rule(),
        now(),
    );
    assert_eq!(report.nodes_seen, 5000);
    assert!(report.zones.len() > 8, "more zones than a record lists");
    let memory = VerdictMemory {
        hysteresis: Hysteresis::from_config(&config),
        disrupted_zones: report.zones.iter().map(|z| z.zone.clone()).collect(),
    };
    let targets: Vec<(DependentResourceInfo, Seen)> = config
        .dependent_resource_infos
        .iter()
        .map(|i| (i.clone(), Seen::Unknown("x".repeat(5000))))
        .collect();
    let run = Run::judged(config, report, memory, targets);
    let record = record_of(&run);
    let json = serde_json::to_string(&record).unwrap();
    let errors = schema_errors(&committed_schema(), &serde_json::to_value(&record).unwrap());
    assert!(errors.is_empty(), "not valid under the schema: {errors:?}");
    let bound = record_bound(run.config.dependent_resource_infos.len());
    eprintln!(
        "record of a 5,000-node shoot: {} bytes (bound {bound})",
        json.len()
    );
    assert!(
        json.len() <= bound,
        "{} bytes against a bound of {bound}",
        json.len()
    );
}

#[test]
fn the_committed_schema_is_the_one_the_types_generate() {
    let generated = dwd_core::record::json_schema();
    let text = serde_json::to_string_pretty(&generated).unwrap() + "\n";
    if std::env::var_os("DWD_WRITE_SCHEMA").is_some() {
        std::fs::write(schema_path(), &text).unwrap();
    }
    let committed = std::fs::read_to_string(schema_path()).unwrap_or_default();
    assert!(
        committed == text,
        "docs/decision-record.schema.json differs from what the record's types generate; \
         after a change of the types run `DWD_WRITE_SCHEMA=1 cargo test -p dwd-core --test \
         record_replay` and commit the file (a change of v1's meaning needs a new schema name)"
    );
}

#[test]
fn the_schema_refuses_a_record_out_of_its_bounds() {
    use serde_json::json;
    let validator = committed_schema();
    let mut rng = Rng(36);
    let record = serde_json::to_value(record_of(&run(&mut rng))).unwrap();
    assert!(schema_errors(&validator, &record).is_empty());
    let lease = json!({"node": "n", "age_seconds": 1.0, "expires_in_seconds": -1.0});
    for (path, value) in [
        (
            "/schema",
            json!("dependency-watchdog.gardener.cloud/decision-record/v2"),
        ),
        ("/at", json!("last night")),
        ("/mode", json!("dry_run")),
        ("/settings/node_lease_failure_fraction", json!("0.6")),
        ("/settings/zone_lease_failure_fraction", json!(1.5)),
        ("/finding/expired_leases", json!(vec![lease; 11])),
        ("/finding/summary", json!("x".repeat(301))),
        ("/finding/candidates", json!(-1)),
    ] {
        let mut broken = record.clone();
        *broken.pointer_mut(path).unwrap() = value;
        assert!(
            !schema_errors(&validator, &broken).is_empty(),
            "{path} out of its bounds is refused"
        );
    }
}
