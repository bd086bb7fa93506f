//! The **decision record**: the evidence behind one run's decision (or one flow's outcome),
//! kept so that "why did it scale my shoot down at 03:12 last night?" can be answered hours
//! later, after the leases have long been renewed, and replayed under another config.
//!
//! A record is a value built from the run's own values (the finding, the verdict with the
//! memory it was reached from, the targets as the caches showed them, the intent) and the
//! rule's settings; [`replay`] rebuilds the finding's decision and the verdict and intent
//! from it with the functions the live run calls ([`lease_decision`], [`judge_zones`],
//! [`verdict`], [`intent`]), so a replay under the recorded settings gives back what the run
//! decided, and under other settings what they would have decided.
//!
//! Which runs produce a record is one pure rule, [`reasons_to_record`]. The schema is
//! versioned ([`SCHEMA`], docs/decision-record.md); numbers are numbers. A record's size is
//! bounded whatever the shoot sends ([`record_bound`]): at most [`NAMED_EXPIRED`] expired
//! leases and [`NAMED_OTHERS`] fresh leases and excluded nodes are named (each name cut to
//! [`NAME_BYTES`]), at most [`ZONES_RECORDED`] zones; counts are always whole.

use std::collections::BTreeMap;
use std::fmt;
use std::time::Duration;

use chrono::{DateTime, SecondsFormat, TimeDelta, Utc};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::config::prober::{DependentResourceInfo, ProberConfig, ResourceRef, ScaleInfo};
use crate::hysteresis::{Direction, Hysteresis};
use crate::intent::{Intent, Seen, Step, intent};
use crate::lease::{
    ExclusionReason, LeaseDecision, LeaseReport, NoScalingReason, NodeVerdict, UpReason, Verdict,
    lease_decision,
};
use crate::scaling::{
    FlowScope, IGNORE_SCALING_ANNOTATION, MELTDOWN_ANNOTATION, REPLICAS_ANNOTATION, TargetAction,
    TargetSnapshot,
};
use crate::verdict::{self as verdicts, Flow, Streak, VerdictMemory, verdict};
use crate::zone::{ZoneReport, ZoneRule, judge_zones};

/// The schema of every record this version writes; a reader refuses others by name.
pub const SCHEMA: &str = "dependency-watchdog.gardener.cloud/decision-record/v1";
/// Expired candidate leases named in a record (the rest are counted).
pub const NAMED_EXPIRED: usize = 10;
/// Fresh candidate leases, and excluded nodes, named in a record (the rest are counted).
pub const NAMED_OTHERS: usize = 5;
/// The longest node, zone or condition name a record quotes (names come from the tenant).
pub const NAME_BYTES: usize = 100;
/// Zones a record lists (the rest are counted); real regions have three or four.
pub const ZONES_RECORDED: usize = 8;
/// The longest text a record quotes (a why, an error from the seed).
pub const TEXT_BYTES: usize = 300;

/// The most bytes one record takes as compact JSON, for a config of `targets` targets: a
/// fixed part of 4 KiB (header, counts, verdict, the texts of [`TEXT_BYTES`]); each named
/// lease or node 320 bytes (a name of [`NAME_BYTES`] and its zone, escaped at most 6-fold
/// only for control characters, which Kubernetes names cannot hold, so 2 × 100 plus the
/// fields); each zone 256 bytes; each target 1.5 KiB (its config, what the caches showed,
/// its step in words, its write). Stated in README ("After the fact") and tested with a
/// 5,000-node shoot.
pub const fn record_bound(targets: usize) -> usize {
    4096 + (NAMED_EXPIRED + 2 * NAMED_OTHERS) * 320 + ZONES_RECORDED * 256 + targets * 1536
}

/// The JSON Schema (draft 2020-12) of a record, generated from these types with their
/// bounds (the names, lists and texts a record cuts, the fractions' range): the committed
/// docs/decision-record.schema.json is this value, which a test checks, so a log pipeline
/// can validate records without reading our code.
pub fn json_schema() -> serde_json::Value {
    let mut schema = schemars::schema_for!(DecisionRecord);
    schema.insert(
        "description".into(),
        format!(
            "A dependency-watchdog decision record ({SCHEMA}): the evidence behind one probe \
             run's decision or one flow's outcome. Field by field: docs/decision-record.md."
        )
        .into(),
    );
    let mut value = schema.to_value();
    resolve_doc_links(&mut value);
    value
}

/// The descriptions come from these types' doc comments, whose links name constants; a
/// reader of the schema gets their values instead (`[`NAMED_EXPIRED`]` becomes `10`).
fn resolve_doc_links(value: &mut serde_json::Value) {
    use crate::lease::{
        EXCLUDED_MACHINE_PHASES, IN_PLACE_UPDATE_EXCLUDING_REASONS, NOT_MANAGED_BY_MCM_ANNOTATION,
    };
    let values = [
        ("SCHEMA", format!("`{SCHEMA}`")),
        ("NAMED_EXPIRED", NAMED_EXPIRED.to_string()),
        ("NAMED_OTHERS", NAMED_OTHERS.to_string()),
        ("NAME_BYTES", format!("{NAME_BYTES} bytes")),
        ("TEXT_BYTES", format!("{TEXT_BYTES} bytes")),
        ("ZONES_RECORDED", ZONES_RECORDED.to_string()),
        (
            "NOT_MANAGED_BY_MCM_ANNOTATION",
            format!("`{NOT_MANAGED_BY_MCM_ANNOTATION}`"),
        ),
        (
            "EXCLUDED_MACHINE_PHASES",
            format!("`{}`", EXCLUDED_MACHINE_PHASES.join("`, `")),
        ),
        (
            "IN_PLACE_UPDATE_EXCLUDING_REASONS",
            format!("`{}`", IN_PLACE_UPDATE_EXCLUDING_REASONS.join("`, `")),
        ),
        ("crate::record", "the decision record".to_owned()),
    ];
    match value {
        serde_json::Value::Object(map) => {
            for (key, v) in map.iter_mut() {
                match v {
                    serde_json::Value::String(text) if key == "description" => {
                        for (name, resolved) in &values {
                            *text = text.replace(&format!("[`{name}`]"), resolved);
                        }
                    }
                    _ => resolve_doc_links(v),
                }
            }
        }
        serde_json::Value::Array(items) => items.iter_mut().for_each(resolve_doc_links),
        _ => {}
    }
}

/// One record: a run's decision, or a flow's outcome.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct DecisionRecord {
    /// [`SCHEMA`].
    #[schemars(extend("const" = SCHEMA))]
    pub schema: String,
    /// Unique in the process's lifetime and across restarts: `<namespace>/<unix ms>.<n>`.
    /// Events and log lines carry it.
    pub id: String,
    /// The shoot's namespace in the seed.
    pub namespace: String,
    /// When the run judged (RFC 3339, milliseconds, UTC).
    #[schemars(extend("format" = "date-time"))]
    pub at: String,
    /// `acting`, or `shadow` (`--shadow`: it records what it would have done).
    pub mode: Mode,
    /// Why this record was kept.
    pub recorded_because: Vec<Because>,
    /// The run's or the flow's part.
    #[serde(flatten)]
    pub body: RecordBody,
}

/// Acting or shadow mode.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum Mode {
    /// The prober scales.
    Acting,
    /// The prober records what it would have done.
    Shadow,
}

/// Why a record was kept (docs/behaviour.md §2.22).
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize, JsonSchema,
)]
#[serde(rename_all = "snake_case")]
pub enum Because {
    /// The verdict handed a flow over that changes something (or would, in shadow mode).
    VerdictToScale,
    /// The verdict stopped a different flow queued or under way.
    Superseded,
    /// The decision asked for a flow the hysteresis does not let act yet.
    HysteresisHold,
    /// A zone is disrupted but the shoot-wide rule did not scale down: only the zonal
    /// targets go down, or zonal protection is not configured.
    ZoneRule,
    /// A target of the flow is left alone by its `ignore-scaling` annotation.
    IgnoreScaling,
    /// A single candidate with an expired lease: nothing is scaled either way.
    SingleCandidate,
    /// A zone became disrupted or recovered.
    ZonesChanged,
    /// The run was not made, or ended, for want of room in the runs' memory budget.
    NotMadeForRoom,
    /// A flow ended: finished, superseded or failed.
    FlowOutcome,
}

/// A record's body, by `kind`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum RecordBody {
    /// A run.
    Run(Box<RunRecord>),
    /// A flow's outcome.
    Flow(FlowRecord),
}

/// What one run found, decided and did.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct RunRecord {
    /// The rule's settings the run judged by.
    pub settings: SettingsRecord,
    /// The finding; none for a run not made.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub finding: Option<FindingRecord>,
    /// Why the run was not made, or ended, for room (a stable category and our words).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub not_made: Option<NotMadeRecord>,
    /// The verdict; none for a run not made.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub verdict: Option<VerdictRecord>,
    /// Every configured target as the seed caches showed it at the run.
    #[serde(default)]
    pub targets: Vec<TargetRecord>,
    /// The intent of the flow the decision asked for (also when the hysteresis held it).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub intent: Option<IntentRecord>,
    /// What became of the flow: queued, nothing new, superseded, recorded (shadow mode).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub taken: Option<TakenRecord>,
}

/// The rule's settings (the config's, and the shoot's grace period).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct SettingsRecord {
    /// `nodeLeaseFailureFraction`.
    #[schemars(range(min = 0.0, max = 1.0))]
    pub node_lease_failure_fraction: f64,
    /// `zoneLeaseFailureFraction`.
    #[schemars(range(min = 0.0, max = 1.0))]
    pub zone_lease_failure_fraction: f64,
    /// `minCandidatesPerZone`.
    pub min_candidates_per_zone: u32,
    /// `successThreshold`.
    pub success_threshold: u32,
    /// `failureThreshold`.
    pub failure_threshold: u32,
    /// The grace period the leases were judged by (`kcmNodeMonitorGraceDuration`, or the
    /// shoot's override), seconds.
    pub grace_seconds: f64,
}

impl SettingsRecord {
    /// The settings of `config`, judging leases by `grace`.
    pub fn of(config: &ProberConfig, grace: Duration) -> SettingsRecord {
        SettingsRecord {
            node_lease_failure_fraction: config.node_lease_failure_fraction,
            zone_lease_failure_fraction: config.zone_lease_failure_fraction,
            min_candidates_per_zone: config.min_candidates_per_zone,
            success_threshold: config.success_threshold,
            failure_threshold: config.failure_threshold,
            grace_seconds: grace.as_secs_f64(),
        }
    }
}

/// The lease probe's finding.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct FindingRecord {
    /// Nodes seen.
    pub nodes_seen: usize,
    /// Leases that belong to no node (ignored).
    pub orphan_leases: usize,
    /// Candidate leases.
    pub candidates: usize,
    /// Expired candidate leases.
    pub expired: usize,
    /// `expired / candidates`; none without candidates.
    #[schemars(range(min = 0.0, max = 1.0))]
    pub fraction: Option<f64>,
    /// Candidates in no zone.
    pub candidates_without_zone: usize,
    /// … of them expired.
    pub expired_without_zone: usize,
    /// The zones, by name (at most [`ZONES_RECORDED`]).
    #[schemars(length(max = ZONES_RECORDED))]
    pub zones: Vec<ZoneRecord>,
    /// Zones not listed.
    pub zones_not_listed: usize,
    /// Expired candidate leases, by node name (at most [`NAMED_EXPIRED`]).
    #[schemars(length(max = NAMED_EXPIRED))]
    pub expired_leases: Vec<LeaseRecord>,
    /// Fresh candidate leases (at most [`NAMED_OTHERS`]).
    #[schemars(length(max = NAMED_OTHERS))]
    pub fresh_leases: Vec<LeaseRecord>,
    /// Excluded nodes and why (at most [`NAMED_OTHERS`]).
    #[schemars(length(max = NAMED_OTHERS))]
    pub excluded_nodes: Vec<ExcludedRecord>,
    /// Expired, fresh and excluded nodes not named.
    pub not_named: NotNamed,
    /// The lease decision: `scale_down`, `zonal_scale_down`, `scale_up`, `no_scaling`.
    pub decision: DecisionKind,
    /// The finding in words, as the prober logs it.
    #[schemars(length(max = TEXT_BYTES))]
    pub summary: String,
}

/// How many of each list a record does not name.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize, JsonSchema)]
pub struct NotNamed {
    /// Expired candidate leases.
    pub expired: usize,
    /// Fresh candidate leases.
    pub fresh: usize,
    /// Excluded nodes.
    pub excluded: usize,
}

/// One zone's share.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct ZoneRecord {
    /// The zone.
    #[schemars(length(max = NAME_BYTES))]
    pub zone: String,
    /// Candidate nodes in it.
    pub candidates: usize,
    /// … with an expired lease.
    pub expired: usize,
    /// `expired / candidates`.
    #[schemars(range(min = 0.0, max = 1.0))]
    pub fraction: f64,
    /// Disrupted under the rule.
    pub disrupted: bool,
    /// Too few candidates to judge.
    pub too_small: bool,
}

impl ZoneRecord {
    /// The record of `zone` (its name cut to [`NAME_BYTES`]).
    pub fn of(zone: &ZoneReport) -> ZoneRecord {
        ZoneRecord {
            zone: name(&zone.zone),
            candidates: zone.candidates,
            expired: zone.expired,
            fraction: zone.fraction(),
            disrupted: zone.disrupted,
            too_small: zone.too_small,
        }
    }
}

/// A candidate lease.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct LeaseRecord {
    /// The node (and lease) name.
    #[schemars(length(max = NAME_BYTES))]
    pub node: String,
    /// Its zone.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub zone: Option<String>,
    /// Seconds since the lease was renewed; none without a renew time.
    pub age_seconds: Option<f64>,
    /// Seconds until (positive) or since (negative) it counts as expired; none when it never
    /// does or has no renew time.
    pub expires_in_seconds: Option<f64>,
}

/// An excluded node.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct ExcludedRecord {
    /// The node name.
    #[schemars(length(max = NAME_BYTES))]
    pub node: String,
    /// Its zone.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub zone: Option<String>,
    /// Why it does not vote.
    pub why: ExclusionReason,
}

/// `reason` with the names it quotes (a condition, a phase, an update's reason: the
/// tenant's) cut to [`NAME_BYTES`].
fn exclusion(reason: &ExclusionReason) -> ExclusionReason {
    match reason {
        ExclusionReason::UnhealthyCondition { condition } => ExclusionReason::UnhealthyCondition {
            condition: name(condition),
        },
        ExclusionReason::MachinePhase { phase } => {
            ExclusionReason::MachinePhase { phase: name(phase) }
        }
        ExclusionReason::InPlaceUpdate { reason } => ExclusionReason::InPlaceUpdate {
            reason: name(reason),
        },
        other => other.clone(),
    }
}

/// A lease decision, by name.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum DecisionKind {
    /// Every target down.
    ScaleDown,
    /// The zonal targets down.
    ZonalScaleDown,
    /// Restore, below the threshold.
    ScaleUp,
    /// Restore, no candidates left.
    ScaleUpNoCandidates,
    /// A single candidate: nothing either way.
    NoScaling,
}

impl DecisionKind {
    /// The kind of `decision`.
    pub fn of(decision: LeaseDecision) -> DecisionKind {
        match decision {
            LeaseDecision::ScaleDown => DecisionKind::ScaleDown,
            LeaseDecision::ZonalScaleDown => DecisionKind::ZonalScaleDown,
            LeaseDecision::ScaleUp(UpReason::BelowThreshold) => DecisionKind::ScaleUp,
            LeaseDecision::ScaleUp(UpReason::NoCandidates) => DecisionKind::ScaleUpNoCandidates,
            LeaseDecision::NoScaling(NoScalingReason::SingleCandidate) => DecisionKind::NoScaling,
        }
    }

    /// The decision of this kind.
    pub fn decision(self) -> LeaseDecision {
        match self {
            DecisionKind::ScaleDown => LeaseDecision::ScaleDown,
            DecisionKind::ZonalScaleDown => LeaseDecision::ZonalScaleDown,
            DecisionKind::ScaleUp => LeaseDecision::ScaleUp(UpReason::BelowThreshold),
            DecisionKind::ScaleUpNoCandidates => LeaseDecision::ScaleUp(UpReason::NoCandidates),
            DecisionKind::NoScaling => LeaseDecision::NoScaling(NoScalingReason::SingleCandidate),
        }
    }
}

/// Why a run was not made.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct NotMadeRecord {
    /// The budget's cause label (`no_room_in_time`, `ended_for_room`, `response_refused`).
    pub cause: String,
    /// Whether a decision was pending for the shoot (its runs get room first).
    pub decision_pending: bool,
}

/// The verdict and the memory it was reached from.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct VerdictRecord {
    /// The hysteresis streaks and disrupted zones before this run.
    pub memory_before: MemoryRecord,
    /// The flow the decision asks for; none for no scaling.
    pub asked: Option<FlowName>,
    /// Runs in a row that decided the asked direction, this one included, and how many are
    /// needed; none when the decision is not counted.
    pub streak: Option<StreakRecord>,
    /// Whether the flow acts this run (the streak is met).
    pub acts: bool,
    /// Why, in words (what events say).
    #[schemars(length(max = TEXT_BYTES))]
    pub why: String,
    /// Zones newly disrupted.
    #[schemars(length(max = ZONES_RECORDED))]
    pub zones_disrupted: Vec<String>,
    /// Zones recovered.
    #[schemars(length(max = ZONES_RECORDED))]
    pub zones_recovered: Vec<String>,
}

/// What the prober remembered of the shoot before the run.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct MemoryRecord {
    /// Scale-up decisions in a row.
    pub up_streak: u32,
    /// Scale-down decisions in a row.
    pub down_streak: u32,
    /// Zones the last run that judged zones found disrupted (at most [`ZONES_RECORDED`]).
    #[schemars(length(max = ZONES_RECORDED))]
    pub disrupted_zones: Vec<String>,
}

/// A streak.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct StreakRecord {
    /// Runs in a row.
    pub seen: u32,
    /// Runs needed.
    pub needed: u32,
}

/// A flow by name: its direction and scope.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct FlowName {
    /// `down` or `up`.
    pub direction: DirectionName,
    /// `all` or `zonal`.
    pub scope: ScopeName,
}

/// A direction, by name.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum DirectionName {
    /// Scale down.
    Down,
    /// Scale up.
    Up,
}

/// A scope, by name.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum ScopeName {
    /// Every target.
    All,
    /// The zonal targets.
    Zonal,
}

impl FlowName {
    /// The name of `dir` over `scope`.
    pub fn of(dir: Direction, scope: FlowScope) -> FlowName {
        FlowName {
            direction: match dir {
                Direction::Down => DirectionName::Down,
                Direction::Up => DirectionName::Up,
            },
            scope: match scope {
                FlowScope::All => ScopeName::All,
                FlowScope::Zonal => ScopeName::Zonal,
            },
        }
    }

    /// The flow of this name.
    pub fn flow(self) -> Flow {
        Flow {
            dir: match self.direction {
                DirectionName::Down => Direction::Down,
                DirectionName::Up => Direction::Up,
            },
            scope: match self.scope {
                ScopeName::All => FlowScope::All,
                ScopeName::Zonal => FlowScope::Zonal,
            },
        }
    }
}

/// A configured target and how the seed caches showed it at the run.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct TargetRecord {
    /// `ref.apiVersion`.
    pub api_version: String,
    /// `ref.kind`.
    pub kind: String,
    /// `ref.name`.
    pub name: String,
    /// `optional`.
    pub optional: bool,
    /// `scaleDownOnZoneOutage`.
    pub scale_down_on_zone_outage: bool,
    /// `scaleUp.level`, `scaleUp.initialDelay` and `scaleUp.timeout` (ms).
    pub scale_up: LevelRecord,
    /// The same for `scaleDown`.
    pub scale_down: LevelRecord,
    /// As the caches showed it.
    pub seen: SeenRecord,
}

/// One direction's level and timing.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct LevelRecord {
    /// The level.
    pub level: u32,
    /// `initialDelay`, ms.
    pub initial_delay_ms: u64,
    /// `timeout`, ms.
    pub timeout_ms: u64,
}

impl LevelRecord {
    fn of(info: &ScaleInfo) -> LevelRecord {
        let ms = |d: Duration| u64::try_from(d.as_millis()).unwrap_or(u64::MAX);
        LevelRecord {
            level: info.level,
            initial_delay_ms: ms(info.initial_delay),
            timeout_ms: ms(info.timeout),
        }
    }

    fn info(self) -> ScaleInfo {
        ScaleInfo {
            level: self.level,
            initial_delay: Duration::from_millis(self.initial_delay_ms),
            timeout: Duration::from_millis(self.timeout_ms),
        }
    }
}

impl TargetRecord {
    /// Target `info`, seen as `seen`.
    pub fn of(info: &DependentResourceInfo, seen: &Seen) -> TargetRecord {
        let r = &info.target;
        TargetRecord {
            api_version: r.api_version.clone(),
            kind: r.kind.clone(),
            name: r.name.clone(),
            optional: info.optional,
            scale_down_on_zone_outage: info.scale_down_on_zone_outage,
            scale_up: LevelRecord::of(&info.scale_up),
            scale_down: LevelRecord::of(&info.scale_down),
            seen: SeenRecord::of(seen),
        }
    }

    /// The config entry it was recorded with.
    pub fn info(&self) -> DependentResourceInfo {
        DependentResourceInfo {
            target: self.target(),
            optional: self.optional,
            scale_up: self.scale_up.info(),
            scale_down: self.scale_down.info(),
            scale_down_on_zone_outage: self.scale_down_on_zone_outage,
        }
    }

    fn target(&self) -> ResourceRef {
        ResourceRef {
            api_version: self.api_version.clone(),
            kind: self.kind.clone(),
            name: self.name.clone(),
        }
    }
}

/// A target as the seed showed it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(tag = "state", rename_all = "snake_case")]
pub enum SeenRecord {
    /// Its kind is not served.
    NotServed,
    /// Not known (cache not in sync); why.
    Unknown {
        /// Why.
        #[schemars(length(max = TEXT_BYTES))]
        why: String,
    },
    /// No such object.
    Absent,
    /// Its scaling state.
    Present {
        /// `spec.replicas`.
        spec_replicas: i32,
        /// The watchdog's annotations on it (replicas record, meltdown marker,
        /// ignore-scaling), values cut to [`NAME_BYTES`].
        annotations: BTreeMap<String, String>,
    },
}

impl SeenRecord {
    fn of(seen: &Seen) -> SeenRecord {
        match seen {
            Seen::NotServed => SeenRecord::NotServed,
            Seen::Unknown(why) => SeenRecord::Unknown { why: text(why) },
            Seen::Absent => SeenRecord::Absent,
            Seen::Present(snapshot) => SeenRecord::Present {
                spec_replicas: snapshot.spec_replicas,
                annotations: snapshot
                    .annotations
                    .iter()
                    .filter(|(k, _)| {
                        [
                            REPLICAS_ANNOTATION,
                            MELTDOWN_ANNOTATION,
                            IGNORE_SCALING_ANNOTATION,
                        ]
                        .contains(&k.as_str())
                    })
                    .map(|(k, v)| (k.clone(), name(v)))
                    .collect(),
            },
        }
    }

    /// What the intent sees.
    pub fn seen(&self) -> Seen {
        match self {
            SeenRecord::NotServed => Seen::NotServed,
            SeenRecord::Unknown { why } => Seen::Unknown(why.clone()),
            SeenRecord::Absent => Seen::Absent,
            SeenRecord::Present {
                spec_replicas,
                annotations,
            } => Seen::Present(TargetSnapshot {
                spec_replicas: *spec_replicas,
                annotations: annotations.clone(),
            }),
        }
    }
}

/// The intent: levels in the flow's order, each target's step.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct IntentRecord {
    /// The flow.
    pub flow: FlowName,
    /// Levels ascending.
    pub levels: Vec<IntentLevelRecord>,
}

/// One level of an intent.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct IntentLevelRecord {
    /// The level.
    pub level: u32,
    /// Its targets' steps.
    pub targets: Vec<StepRecord>,
}

/// What the flow does with one target.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct StepRecord {
    /// `kind/name`.
    pub target: String,
    /// `scale_down`, `scale_up`, `already_done`, `ignored`, `skipped`, `fails`, `unknown`.
    pub step: StepKind,
    /// The replicas a scale-down records or a scale-up restores.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub replicas: Option<i32>,
    /// In words, as `explain` prints it.
    #[schemars(length(max = TEXT_BYTES))]
    pub words: String,
}

/// A step, by name.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum StepKind {
    /// Record the replicas and scale to 0.
    ScaleDown,
    /// Scale to the recorded replicas.
    ScaleUp,
    /// Nothing to scale.
    AlreadyDone,
    /// `ignore-scaling` is set.
    Ignored,
    /// Optional and absent, or not served.
    Skipped,
    /// Mandatory and absent, or not served: the flow stops here.
    Fails,
    /// Not known at the run.
    Unknown,
}

impl IntentRecord {
    /// The record of `intent`.
    pub fn of(intent: &Intent) -> IntentRecord {
        IntentRecord {
            flow: FlowName::of(intent.dir, intent.scope),
            levels: intent
                .levels
                .iter()
                .map(|level| IntentLevelRecord {
                    level: level.level,
                    targets: level
                        .targets
                        .iter()
                        .map(|t| {
                            let (step, replicas) = match &t.step {
                                Step::Planned(plan) => match plan.action {
                                    TargetAction::ScaleDown { record_replicas } => {
                                        (StepKind::ScaleDown, Some(record_replicas))
                                    }
                                    TargetAction::ScaleUp { replicas } => {
                                        (StepKind::ScaleUp, Some(replicas))
                                    }
                                    TargetAction::AlreadyDone { .. } => {
                                        (StepKind::AlreadyDone, None)
                                    }
                                    TargetAction::Ignored { .. } => (StepKind::Ignored, None),
                                },
                                Step::Skipped => (StepKind::Skipped, None),
                                Step::Fails => (StepKind::Fails, None),
                                Step::Unknown(_) => (StepKind::Unknown, None),
                            };
                            StepRecord {
                                target: format!("{}/{}", t.info.target.kind, t.info.target.name),
                                step,
                                replicas,
                                words: text(&t.to_string()),
                            }
                        })
                        .collect(),
                })
                .collect(),
        }
    }
}

/// What became of a run's flow.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(tag = "outcome", rename_all = "snake_case")]
pub enum TakenRecord {
    /// Handed over to the executor.
    Queued {
        /// The targets it takes up.
        targets: Vec<String>,
        /// Whether it replaced a different flow.
        superseding: bool,
    },
    /// Nothing new; why.
    Nothing {
        /// Why.
        #[schemars(length(max = TEXT_BYTES))]
        why: String,
    },
    /// Its targets were there already; a different flow in hand is stopped.
    Superseded,
    /// Shadow mode noted what it would have done.
    Recorded,
    /// The hysteresis held it.
    Held,
}

/// How a flow ended.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct FlowRecord {
    /// The id of the run record whose decision queued it.
    pub decision: String,
    /// The flow.
    pub flow: FlowName,
    /// `finished`, `superseded` or `failed`.
    pub outcome: FlowOutcome,
    /// When it started (RFC 3339).
    #[schemars(extend("format" = "date-time"))]
    pub started_at: String,
    /// The failed target, and the seed's error (cut to [`TEXT_BYTES`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub failure: Option<FlowFailure>,
    /// Each target's step, in the order they ended.
    pub writes: Vec<WriteRecord>,
}

/// How a flow ended, by name.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum FlowOutcome {
    /// Every level ran.
    Finished,
    /// A newer verdict stopped it.
    Superseded,
    /// A target failed; later levels did not run.
    Failed,
}

/// The target a flow failed at.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct FlowFailure {
    /// Its name.
    pub target: String,
    /// The error.
    #[schemars(length(max = TEXT_BYTES))]
    pub error: String,
}

/// One target's step of a flow.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct WriteRecord {
    /// The target's name.
    pub target: String,
    /// Its level in the flow.
    pub level: u32,
    /// `scaled` or `skipped`.
    pub outcome: WriteOutcome,
    /// Replicas before, for a scaled target.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub from: Option<i32>,
    /// Replicas after.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub to: Option<i32>,
    /// The count a scale-down recorded in the `replicas` annotation (what a restore brings
    /// back).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub recorded_replicas: Option<i32>,
    /// Why it was skipped.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub why: Option<String>,
    /// When its step ended (RFC 3339).
    #[schemars(extend("format" = "date-time"))]
    pub at: String,
    /// Seconds its writes waited for the seed's request budget, in all.
    pub budget_wait_seconds: f64,
}

/// A target's step outcome, by name.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum WriteOutcome {
    /// Its replicas changed.
    Scaled,
    /// Nothing to scale.
    Skipped,
}

/// `s` cut to [`NAME_BYTES`] at a character boundary.
fn name(s: &str) -> String {
    cut(s, NAME_BYTES)
}

/// `s` cut to [`TEXT_BYTES`] at a character boundary.
pub fn text(s: &str) -> String {
    cut(s, TEXT_BYTES)
}

fn cut(s: &str, limit: usize) -> String {
    let mut end = s.len().min(limit);
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    s[..end].to_owned()
}

/// RFC 3339 with milliseconds, UTC: every time a record carries.
pub fn timestamp(t: DateTime<Utc>) -> String {
    t.to_rfc3339_opts(SecondsFormat::Millis, true)
}

/// What a record needs of one judged run.
pub struct JudgedRun<'a> {
    /// The finding.
    pub report: &'a LeaseReport,
    /// When the leases were judged.
    pub now: DateTime<Utc>,
    /// The memory the verdict was reached from.
    pub memory_before: &'a VerdictMemory,
    /// The verdict.
    pub verdict: &'a verdicts::Verdict,
    /// The intent of the asked flow (also when held).
    pub intent: Option<&'a Intent>,
    /// Every configured target as seen at the run.
    pub targets: &'a [(DependentResourceInfo, Seen)],
}

impl FindingRecord {
    /// The record of `report`, judged at `now`.
    pub fn of(report: &LeaseReport, now: DateTime<Utc>) -> FindingRecord {
        let secs = |d: TimeDelta| d.num_milliseconds() as f64 / 1000.0;
        let (mut expired, mut fresh, mut excluded) = (Vec::new(), Vec::new(), Vec::new());
        let mut not_named = NotNamed::default();
        for n in &report.nodes {
            let zone = n.zone.as_deref().map(name);
            match &n.verdict {
                Verdict::Candidate {
                    renew_time,
                    expires_at,
                    expired: is_expired,
                } => {
                    let (list, limit, count) = if *is_expired {
                        (&mut expired, NAMED_EXPIRED, &mut not_named.expired)
                    } else {
                        (&mut fresh, NAMED_OTHERS, &mut not_named.fresh)
                    };
                    if list.len() < limit {
                        list.push(LeaseRecord {
                            node: name(&n.node),
                            zone,
                            age_seconds: renew_time.map(|t| secs(now - t)),
                            expires_in_seconds: expires_at.map(|t| secs(t - now)),
                        });
                    } else {
                        *count += 1;
                    }
                }
                Verdict::Excluded(reason) if excluded.len() < NAMED_OTHERS => {
                    excluded.push(ExcludedRecord {
                        node: name(&n.node),
                        zone,
                        why: exclusion(reason),
                    });
                }
                Verdict::Excluded(_) => not_named.excluded += 1,
            }
        }
        let in_zones: usize = report.zones.iter().map(|z| z.candidates).sum();
        let expired_in_zones: usize = report.zones.iter().map(|z| z.expired).sum();
        FindingRecord {
            nodes_seen: report.nodes_seen,
            orphan_leases: report.orphan_leases.len(),
            candidates: report.candidates,
            expired: report.expired,
            fraction: report.fraction,
            candidates_without_zone: report.candidates.saturating_sub(in_zones),
            expired_without_zone: report.expired.saturating_sub(expired_in_zones),
            zones: report
                .zones
                .iter()
                .take(ZONES_RECORDED)
                .map(ZoneRecord::of)
                .collect(),
            zones_not_listed: report.zones.len().saturating_sub(ZONES_RECORDED),
            expired_leases: expired,
            fresh_leases: fresh,
            excluded_nodes: excluded,
            not_named,
            decision: DecisionKind::of(report.decision),
            summary: text(&report.to_string()),
        }
    }
}

impl VerdictRecord {
    /// The record of `verdict`, reached from `memory_before`.
    pub fn of(verdict: &verdicts::Verdict, memory_before: &VerdictMemory) -> VerdictRecord {
        let (up, down) = memory_before.hysteresis.streaks();
        VerdictRecord {
            memory_before: MemoryRecord {
                up_streak: up,
                down_streak: down,
                disrupted_zones: memory_before
                    .disrupted_zones
                    .iter()
                    .take(ZONES_RECORDED)
                    .map(|z| name(z))
                    .collect(),
            },
            asked: verdict.asked.map(|f| FlowName::of(f.dir, f.scope)),
            streak: match verdict.streak {
                Streak::NotCounted => None,
                Streak::Counted { seen, needed } => Some(StreakRecord { seen, needed }),
            },
            acts: verdict.flow().is_some(),
            why: text(&verdict.why),
            zones_disrupted: verdict
                .zones_disrupted
                .iter()
                .take(ZONES_RECORDED)
                .map(|z| name(&z.zone))
                .collect(),
            zones_recovered: verdict
                .zones_recovered
                .iter()
                .take(ZONES_RECORDED)
                .map(|z| name(&z.zone))
                .collect(),
        }
    }
}

impl RunRecord {
    /// The record of a judged run under `config` (grace `grace`); `taken` is what the
    /// executor made of its flow.
    pub fn judged(
        config: &ProberConfig,
        grace: Duration,
        run: &JudgedRun<'_>,
        taken: Option<TakenRecord>,
    ) -> RunRecord {
        RunRecord {
            settings: SettingsRecord::of(config, grace),
            finding: Some(FindingRecord::of(run.report, run.now)),
            not_made: None,
            verdict: Some(VerdictRecord::of(run.verdict, run.memory_before)),
            targets: run
                .targets
                .iter()
                .map(|(info, seen)| TargetRecord::of(info, seen))
                .collect(),
            intent: run.intent.map(IntentRecord::of),
            taken,
        }
    }
}

/// Why a judged run is worth a record, from its values and what the executor made of its
/// flow (`taken`); empty: no record (docs/behaviour.md §2.22). A healthy shoot whose targets
/// are where a scale-up would take them produces none, nor does a run repeating the flow
/// under way.
pub fn reasons_to_record(
    report: &LeaseReport,
    verdict: &verdicts::Verdict,
    intent: Option<&Intent>,
    taken: Option<&TakenRecord>,
) -> Vec<Because> {
    let mut because = Vec::new();
    match taken {
        Some(TakenRecord::Queued { .. }) => because.push(Because::VerdictToScale),
        Some(TakenRecord::Recorded) if intent.is_some_and(Intent::changes_any) => {
            because.push(Because::VerdictToScale);
        }
        Some(TakenRecord::Superseded) => because.push(Because::Superseded),
        _ => {}
    }
    let asked_down = verdict.asked.is_some_and(|f| f.dir == Direction::Down);
    if verdict.asked.is_some()
        && !verdict.streak.met()
        && (asked_down || intent.is_some_and(Intent::changes_any))
    {
        because.push(Because::HysteresisHold);
    }
    if report.disrupted_zones().next().is_some() && report.decision != LeaseDecision::ScaleDown {
        because.push(Because::ZoneRule);
    }
    let ignored = |i: &Intent| {
        i.targets().any(|t| {
            matches!(&t.step, Step::Planned(p) if matches!(p.action, TargetAction::Ignored { .. }))
        })
    };
    if asked_down && intent.is_some_and(ignored) {
        because.push(Because::IgnoreScaling);
    }
    if matches!(report.decision, LeaseDecision::NoScaling(_)) && report.expired > 0 {
        because.push(Because::SingleCandidate);
    }
    if !verdict.zones_disrupted.is_empty() || !verdict.zones_recovered.is_empty() {
        because.push(Because::ZonesChanged);
    }
    because
}

/// Why a record cannot be read.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RecordError {
    /// Not a record of [`SCHEMA`].
    #[error("record {id}: schema {schema:?} is not {SCHEMA:?}")]
    Schema {
        /// The record's id.
        id: String,
        /// Its schema.
        schema: String,
    },
    /// A flow's outcome, not a run.
    #[error("record {0} is a flow's outcome; replay its run (field `decision`)")]
    NotARun(String),
    /// A run not made: nothing was judged.
    #[error("record {0} is a run not made for room: there is no finding to replay")]
    NotJudged(String),
    /// Its time is not RFC 3339.
    #[error("record {id}: field `at` {at:?} is not an RFC 3339 time")]
    Time {
        /// The record's id.
        id: String,
        /// The field.
        at: String,
    },
}

/// A run replayed: the finding as the record has it (named leases only), the verdict and
/// the intent, under the recorded settings or others.
#[derive(Debug, Clone, PartialEq)]
pub struct Replay {
    /// The finding rebuilt: counts whole, nodes as named, decision judged again.
    pub report: LeaseReport,
    /// The zone rule it was judged by.
    pub zone_rule: ZoneRule,
    /// The grace period the leases were judged by.
    pub grace: Duration,
    /// When the run judged.
    pub at: DateTime<Utc>,
    /// The verdict.
    pub verdict: verdicts::Verdict,
    /// The intent of the asked flow, each target as recorded (a target the record does not
    /// have is not known).
    pub intent: Option<Intent>,
    /// What the replay could not judge again under other settings, in words.
    pub caveats: Vec<String>,
}

/// The settings a replay judges by: the recorded ones, or another config's.
pub enum ReplaySettings<'a> {
    /// As the run judged.
    Recorded,
    /// As `config` would have.
    Config(&'a ProberConfig),
}

/// Replays run record `record` under `settings` with the live run's own functions: the lease
/// decision from the recorded counts and zones, the verdict from the recorded memory, the
/// intent from the recorded targets.
pub fn replay(
    record: &DecisionRecord,
    settings: &ReplaySettings<'_>,
) -> Result<Replay, RecordError> {
    if record.schema != SCHEMA {
        return Err(RecordError::Schema {
            id: record.id.clone(),
            schema: record.schema.clone(),
        });
    }
    let RecordBody::Run(run) = &record.body else {
        return Err(RecordError::NotARun(record.id.clone()));
    };
    let (Some(finding), Some(recorded_verdict)) = (&run.finding, &run.verdict) else {
        return Err(RecordError::NotJudged(record.id.clone()));
    };
    let at = DateTime::parse_from_rfc3339(&record.at)
        .map_err(|_| RecordError::Time {
            id: record.id.clone(),
            at: record.at.clone(),
        })?
        .with_timezone(&Utc);
    let rules = Rules::of(run, settings);
    let grace = Duration::from_secs_f64(run.settings.grace_seconds.max(0.0));
    let caveats = caveats(run, finding, settings);
    let Rules {
        threshold,
        zone_rule,
        success,
        failure,
        infos,
    } = rules;
    let report = replayed_report(finding, threshold, &zone_rule, at);
    let memory = VerdictMemory {
        hysteresis: Hysteresis::with_streaks(
            success,
            failure,
            recorded_verdict.memory_before.up_streak,
            recorded_verdict.memory_before.down_streak,
        ),
        disrupted_zones: recorded_verdict
            .memory_before
            .disrupted_zones
            .iter()
            .cloned()
            .collect(),
    };
    let (verdict, _) = verdict(&report, &memory);
    let seen: BTreeMap<ResourceRef, Seen> = run
        .targets
        .iter()
        .map(|t| (t.target(), t.seen.seen()))
        .collect();
    let intent = verdict.asked.map(|flow| {
        intent(&infos, flow.dir, flow.scope, |info| {
            seen.get(&info.target).cloned().unwrap_or_else(|| {
                Seen::Unknown("not in the record: the run's config had no such target".into())
            })
        })
    });
    Ok(Replay {
        report,
        zone_rule,
        grace,
        at,
        verdict,
        intent,
        caveats,
    })
}

/// What a replay under `settings` cannot judge again, in words.
fn caveats(run: &RunRecord, finding: &FindingRecord, settings: &ReplaySettings<'_>) -> Vec<String> {
    let mut caveats = Vec::new();
    let s = &run.settings;
    if let ReplaySettings::Config(c) = settings
        && c.kcm_node_monitor_grace_duration.as_secs_f64() != s.grace_seconds
    {
        caveats.push(format!(
            "the leases are judged as recorded, at a grace period of {}s: a record names only some of them, so expiry under kcmNodeMonitorGraceDuration {}s is not judged again",
            s.grace_seconds,
            c.kcm_node_monitor_grace_duration.as_secs_f64()
        ));
    }
    if finding.zones_not_listed > 0 {
        caveats.push(format!(
            "{} zone(s) beyond the {ZONES_RECORDED} recorded are left out of the zone rule",
            finding.zones_not_listed
        ));
    }
    caveats
}

/// The rules a replay judges by.
struct Rules {
    threshold: f64,
    zone_rule: ZoneRule,
    success: u32,
    failure: u32,
    infos: Vec<DependentResourceInfo>,
}

impl Rules {
    fn of(run: &RunRecord, settings: &ReplaySettings<'_>) -> Rules {
        let s = &run.settings;
        let (threshold, zone_fraction, min_zone, success, failure, infos) = match settings {
            ReplaySettings::Recorded => (
                s.node_lease_failure_fraction,
                s.zone_lease_failure_fraction,
                s.min_candidates_per_zone,
                s.success_threshold,
                s.failure_threshold,
                run.targets.iter().map(TargetRecord::info).collect(),
            ),
            ReplaySettings::Config(c) => (
                c.node_lease_failure_fraction,
                c.zone_lease_failure_fraction,
                c.min_candidates_per_zone,
                c.success_threshold,
                c.failure_threshold,
                c.dependent_resource_infos.clone(),
            ),
        };
        let zone_rule = ZoneRule {
            failure_fraction: zone_fraction,
            min_candidates: usize::try_from(min_zone).unwrap_or(usize::MAX),
            protection: infos
                .iter()
                .any(|i: &DependentResourceInfo| i.scale_down_on_zone_outage),
        };
        Rules {
            threshold,
            zone_rule,
            success,
            failure,
            infos,
        }
    }
}

/// The finding of `finding` judged again by `threshold` and `zone_rule`: the zones from
/// their recorded counts, the decision by [`lease_decision`]; the named nodes rebuilt from
/// their ages at `at`.
fn replayed_report(
    finding: &FindingRecord,
    threshold: f64,
    zone_rule: &ZoneRule,
    at: DateTime<Utc>,
) -> LeaseReport {
    let candidates = finding
        .zones
        .iter()
        .flat_map(|z| (0..z.candidates).map(move |i| (Some(z.zone.as_str()), i < z.expired)));
    let zones: Vec<ZoneReport> = judge_zones(candidates, zone_rule);
    let (fraction, decision) = lease_decision(
        finding.candidates,
        finding.expired,
        &zones,
        threshold,
        zone_rule,
    );
    let back = |secs: f64| TimeDelta::milliseconds((secs * 1000.0).round() as i64);
    let lease = |l: &LeaseRecord, expired: bool| NodeVerdict {
        node: l.node.clone(),
        zone: l.zone.clone(),
        verdict: Verdict::Candidate {
            renew_time: l.age_seconds.map(|a| at - back(a)),
            expires_at: l.expires_in_seconds.map(|e| at + back(e)),
            expired,
        },
    };
    let mut nodes: Vec<NodeVerdict> = finding
        .expired_leases
        .iter()
        .map(|l| lease(l, true))
        .chain(finding.fresh_leases.iter().map(|l| lease(l, false)))
        .chain(finding.excluded_nodes.iter().map(|e| NodeVerdict {
            node: e.node.clone(),
            zone: e.zone.clone(),
            verdict: Verdict::Excluded(e.why.clone()),
        }))
        .collect();
    nodes.sort_by(|a, b| a.node.cmp(&b.node));
    LeaseReport {
        nodes_seen: finding.nodes_seen,
        nodes,
        orphan_leases: Vec::new(),
        candidates: finding.candidates,
        expired: finding.expired,
        fraction,
        threshold,
        zones,
        decision,
    }
}

impl fmt::Display for Because {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Because::VerdictToScale => "a verdict to scale",
            Because::Superseded => "a flow superseded",
            Because::HysteresisHold => "a hysteresis hold",
            Because::ZoneRule => "the zone rule",
            Because::IgnoreScaling => "ignore-scaling",
            Because::SingleCandidate => "a single candidate",
            Because::ZonesChanged => "zones changed",
            Because::NotMadeForRoom => "a run not made for room",
            Because::FlowOutcome => "a flow's outcome",
        })
    }
}
