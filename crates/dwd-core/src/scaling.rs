//! Scaling flows: level plans and the per-target decision (docs/behaviour.md §2.11–2.15).
//!
//! The controller performs the I/O (read target, patch annotations, set the scale subresource,
//! wait for readiness); this module decides *what* to do from a snapshot of the target, so the
//! rules about annotations and replica bookkeeping are tested without a cluster and the recorded
//! replica count survives a watchdog restart.

use std::collections::BTreeMap;
use std::fmt;
use std::time::Duration;

use serde_json::{Value, json};
use thiserror::Error;

use crate::config::DependentResourceInfo;
use crate::hysteresis::Direction;

/// Annotation recording a target's replicas before a scale-down, restored on scale-up.
pub const REPLICAS_ANNOTATION: &str = "dependency-watchdog.gardener.cloud/replicas";
/// Marker that the watchdog scaled a target down (meltdown protection in effect).
pub const MELTDOWN_ANNOTATION: &str =
    "dependency-watchdog.gardener.cloud/meltdown-protection-active";
/// Operators set this to `true` to keep the watchdog's hands off a target.
pub const IGNORE_SCALING_ANNOTATION: &str = "dependency-watchdog.gardener.cloud/ignore-scaling";
/// Replicas used for a scale-up when no replicas were recorded.
pub const DEFAULT_SCALE_UP_REPLICAS: i32 = 1;
/// The largest count the watchdog restores from the `replicas` annotation. The annotation is
/// plain text anyone with `patch` on the target can write; a typo such as `30000` must not
/// make the seed schedule thirty thousand controller pods. No control-plane component of a
/// shoot runs anywhere near this many replicas.
pub const MAX_RECORDED_REPLICAS: i32 = 1000;

/// The longest a level waits for its targets to become ready (or, on the way down, to have
/// no ready replicas left) before the next level starts: the reference's fixed wait. The
/// next level starts as soon as every target is there, and at the latest after this, ready
/// or not: a seed whose Deployment status lags must never hold a level back longer than the
/// reference does (the watchdog acts with seconds to spare before KCM marks nodes Unknown),
/// and a scale-up after recovery must not queue behind a scale-down's wait.
pub const READINESS_WAIT: Duration = Duration::from_secs(5);

/// Bound of each API call of a scaling step when a target's `timeout` is not positive (the
/// config warns that such a target is scaled anyway).
pub const DEFAULT_CALL_TIMEOUT: Duration = Duration::from_secs(30);

/// How long a target's level waits for it after its replicas changed: as soon as it is
/// ready, at most [`READINESS_WAIT`], and never longer than its `timeout` (a zero `timeout`
/// ends the wait at once, as the config's warning says).
pub fn readiness_wait(timeout: Duration) -> Duration {
    timeout.min(READINESS_WAIT)
}

/// The deadline of each API call of a scaling step: the target's `timeout` (which bounds the
/// reference's scale call), or [`DEFAULT_CALL_TIMEOUT`] when that is zero.
pub fn call_timeout(timeout: Duration) -> Duration {
    if timeout.is_zero() {
        DEFAULT_CALL_TIMEOUT
    } else {
        timeout
    }
}

/// The targets of one level; they are scaled concurrently.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LevelPlan {
    /// The `scaleUp.level` or `scaleDown.level` (per the flow's direction) its targets share.
    pub level: u32,
    /// In config order.
    pub targets: Vec<DependentResourceInfo>,
}

/// Which targets a flow covers.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum FlowScope {
    /// Every target: the shoot-wide rule, and every scale-up.
    All,
    /// Only the targets with `scaleDownOnZoneOutage: true`: a disrupted zone
    /// (docs/behaviour.md §2.19).
    Zonal,
}

impl FlowScope {
    /// The scope of the flow a decision asks for.
    pub fn of(decision: &crate::lease::LeaseDecision) -> FlowScope {
        match decision {
            crate::lease::LeaseDecision::ZonalScaleDown => FlowScope::Zonal,
            _ => FlowScope::All,
        }
    }

    /// Whether the flow covers `info`.
    pub fn includes(self, info: &DependentResourceInfo) -> bool {
        match self {
            FlowScope::All => true,
            FlowScope::Zonal => info.scale_down_on_zone_outage,
        }
    }
}

impl fmt::Display for FlowScope {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            FlowScope::All => "all targets",
            FlowScope::Zonal => "zonal targets",
        })
    }
}

/// The settings (`scaleUp` or `scaleDown`) of `info` for a flow in `dir`.
pub fn scale_info_for(info: &DependentResourceInfo, dir: Direction) -> &crate::ScaleInfo {
    match dir {
        Direction::Up => &info.scale_up,
        Direction::Down => &info.scale_down,
    }
}

/// Groups the targets of `scope` by their level for `dir`, levels ascending, config order kept
/// within a level.
pub fn plan_levels(
    infos: &[DependentResourceInfo],
    dir: Direction,
    scope: FlowScope,
) -> Vec<LevelPlan> {
    let mut by_level: BTreeMap<u32, Vec<DependentResourceInfo>> = BTreeMap::new();
    for info in infos.iter().filter(|i| scope.includes(i)) {
        let level = match dir {
            Direction::Up => info.scale_up.level,
            Direction::Down => info.scale_down.level,
        };
        by_level.entry(level).or_default().push(info.clone());
    }
    by_level
        .into_iter()
        .map(|(level, targets)| LevelPlan { level, targets })
        .collect()
}

/// Go's `strconv.ParseBool` truth values; anything else, including unparsable text, is false.
pub fn parse_go_bool(s: &str) -> Option<bool> {
    match s {
        "1" | "t" | "T" | "TRUE" | "true" | "True" => Some(true),
        "0" | "f" | "F" | "FALSE" | "false" | "False" => Some(false),
        _ => None,
    }
}

/// Whether the ignore-scaling annotation is set to a true value. An unparsable value means *not*
/// ignored, as in the reference.
pub fn is_scaling_ignored(annotations: &BTreeMap<String, String>) -> bool {
    annotations
        .get(IGNORE_SCALING_ANNOTATION)
        .and_then(|v| parse_go_bool(v))
        .unwrap_or(false)
}

/// The watchdog's bookkeeping on a target, as its annotations carry it: the one place the
/// annotations are read (scaling plans here, shadow mode's view of the acting watchdog).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Bookkeeping<'a> {
    /// [`MELTDOWN_ANNOTATION`] is set: a watchdog scaled the target down and has not
    /// restored it.
    pub marked: bool,
    /// [`IGNORE_SCALING_ANNOTATION`] is true ([`is_scaling_ignored`]).
    pub ignored: bool,
    /// [`REPLICAS_ANNOTATION`] as written, unparsed ([`recorded_replicas`] parses it).
    pub record: Option<&'a str>,
}

/// The bookkeeping `annotations` carry.
pub fn bookkeeping(annotations: &BTreeMap<String, String>) -> Bookkeeping<'_> {
    Bookkeeping {
        marked: annotations.contains_key(MELTDOWN_ANNOTATION),
        ignored: is_scaling_ignored(annotations),
        record: annotations.get(REPLICAS_ANNOTATION).map(String::as_str),
    }
}

/// What a scaling step needs to know about a target.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct TargetSnapshot {
    /// The target's `spec.replicas` (1 when unset, as the API server defaults it).
    pub spec_replicas: i32,
    /// The target's `metadata.annotations`; the ones read are [`REPLICAS_ANNOTATION`],
    /// [`MELTDOWN_ANNOTATION`] and [`IGNORE_SCALING_ANNOTATION`].
    pub annotations: BTreeMap<String, String>,
}

/// What to do with one target.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TargetAction {
    /// Ignore-scaling is set. `clear_marker`: remove a leftover meltdown annotation only
    /// ([`clear_meltdown_patch`]); the recorded replicas stay for when the operator lifts the flag.
    Ignored {
        /// Whether [`MELTDOWN_ANNOTATION`] is still set and is to be removed.
        clear_marker: bool,
    },
    /// Nothing to scale. `clear_marker`: remove both annotations ([`clear_annotations_patch`]).
    AlreadyDone {
        /// Whether a scale-up found a target already running that still carries the meltdown
        /// marker or a replicas record, both to be removed; always false on the way down.
        clear_marker: bool,
    },
    /// Patch [`scale_down_annotation_patch`]`(record_replicas)` first, then set replicas to 0.
    ScaleDown {
        /// The count written to [`REPLICAS_ANNOTATION`] and restored on the next scale-up.
        record_replicas: i32,
    },
    /// Set replicas, then remove both annotations ([`clear_annotations_patch`]).
    ScaleUp {
        /// The replicas to set: the recorded count, else [`DEFAULT_SCALE_UP_REPLICAS`].
        replicas: i32,
    },
}

/// What is wrong with a target's scaling bookkeeping.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum ScalingError {
    /// [`REPLICAS_ANNOTATION`] is not an integer in 1..=[`MAX_RECORDED_REPLICAS`].
    #[error("annotation {REPLICAS_ANNOTATION}={value:?} is not a valid replica count: {reason}")]
    InvalidReplicasAnnotation {
        /// The annotation's value, as found on the target.
        value: String,
        /// Why it is unusable, e.g. `must be an integer` or `must be greater than 0`.
        reason: String,
    },
}

/// The action for one target, and what is wrong with its `replicas` annotation if that
/// changed the action (the executor warns about it, once per unchanged value).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TargetPlan {
    /// What to do with the target.
    pub action: TargetAction,
    /// The recorded count was unusable: a scale-up restores [`DEFAULT_SCALE_UP_REPLICAS`]
    /// instead, a scale-down records the current replicas over it.
    pub replicas_problem: Option<ScalingError>,
}

/// Decides the action for one target in direction `dir`.
///
/// - Scale-down records the current replicas, except that while the meltdown marker is
///   still set (the watchdog scaled the target down and has not restored it yet) a valid
///   recorded count higher than the current one is kept: something scaled the target
///   partly back up during the outage, and the count to restore is still the one from
///   before it.
/// - Scale-up restores the recorded count; when none is recorded, or the record is not an
///   integer in 1..=[`MAX_RECORDED_REPLICAS`], it restores [`DEFAULT_SCALE_UP_REPLICAS`]. The
///   shoot is healthy at that point: leaving its controller at 0 behind the marker (which
///   keeps gardenlet from scaling it) would be the one outcome that certainly hurts.
pub fn plan_target(dir: Direction, snapshot: &TargetSnapshot) -> TargetPlan {
    let books = bookkeeping(&snapshot.annotations);
    let has_meltdown = books.marked;
    let plan = |action| TargetPlan {
        action,
        replicas_problem: None,
    };
    if books.ignored {
        return plan(TargetAction::Ignored {
            clear_marker: has_meltdown,
        });
    }
    match dir {
        Direction::Down if snapshot.spec_replicas > 0 => {
            let current = snapshot.spec_replicas;
            if !has_meltdown {
                // Without the marker a record is a leftover (the reference never removes it):
                // the current count is the one to restore.
                return plan(TargetAction::ScaleDown {
                    record_replicas: current,
                });
            }
            match recorded_replicas(&snapshot.annotations) {
                Ok(recorded) => plan(TargetAction::ScaleDown {
                    record_replicas: recorded.map_or(current, |r| r.max(current)),
                }),
                Err(problem) => TargetPlan {
                    action: TargetAction::ScaleDown {
                        record_replicas: current,
                    },
                    replicas_problem: Some(problem),
                },
            }
        }
        // Already at 0: nothing is written, so a recorded count stays as it is.
        Direction::Down => plan(TargetAction::AlreadyDone {
            clear_marker: false,
        }),
        // Negative replicas cannot exist in the API; treat them like 0 rather than leave a target
        // down.
        Direction::Up if snapshot.spec_replicas <= 0 => {
            match recorded_replicas(&snapshot.annotations) {
                Ok(recorded) => plan(TargetAction::ScaleUp {
                    replicas: recorded.unwrap_or(DEFAULT_SCALE_UP_REPLICAS),
                }),
                Err(problem) => TargetPlan {
                    action: TargetAction::ScaleUp {
                        replicas: DEFAULT_SCALE_UP_REPLICAS,
                    },
                    replicas_problem: Some(problem),
                },
            }
        }
        // A running target: its marker, if any, is a leftover to remove (with the record it
        // came with). A record without the marker is left alone: the reference leaves one on
        // every target it ever restored, and a seed switching from it must not see a scale-up
        // of every target of every shoot (no write, no event; the next scale-down overwrites
        // it).
        Direction::Up => plan(TargetAction::AlreadyDone {
            clear_marker: has_meltdown,
        }),
    }
}

/// The recorded replica count: `None` when there is no record, an error naming the value
/// when it is not an integer in 1..=[`MAX_RECORDED_REPLICAS`].
pub fn recorded_replicas(
    annotations: &BTreeMap<String, String>,
) -> Result<Option<i32>, ScalingError> {
    let Some(value) = annotations.get(REPLICAS_ANNOTATION) else {
        return Ok(None);
    };
    let invalid = |reason: String| ScalingError::InvalidReplicasAnnotation {
        value: value.clone(),
        reason,
    };
    // Go's strconv.Atoi syntax (what the reference parses with): an optional sign, then
    // ASCII digits.
    let (negative, digits) = match value.as_bytes().first() {
        Some(b'-') => (true, &value[1..]),
        Some(b'+') => (false, &value[1..]),
        _ => (false, value.as_str()),
    };
    if digits.is_empty() || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return Err(invalid("must be an integer".into()));
    }
    if negative || digits.bytes().all(|b| b == b'0') {
        return Err(invalid("must be greater than 0".into()));
    }
    match digits.parse::<i32>() {
        Ok(n) if n <= MAX_RECORDED_REPLICAS => Ok(Some(n)),
        // Too many digits for an i32 is above the maximum too.
        _ => Err(invalid(format!(
            "above the maximum of {MAX_RECORDED_REPLICAS} replicas the watchdog restores"
        ))),
    }
}

/// Merge patch recording the current replicas and marking meltdown protection active; applied
/// *before* replicas are set to 0 so that a crash in between loses nothing.
pub fn scale_down_annotation_patch(record: i32) -> Value {
    json!({
        "metadata": {
            "annotations": {
                REPLICAS_ANNOTATION: record.to_string(),
                MELTDOWN_ANNOTATION: "",
            }
        }
    })
}

/// Merge patch removing both watchdog annotations (after a scale-up).
pub fn clear_annotations_patch() -> Value {
    json!({
        "metadata": {
            "annotations": {
                REPLICAS_ANNOTATION: null,
                MELTDOWN_ANNOTATION: null,
            }
        }
    })
}

/// Merge patch removing only the meltdown marker (ignored targets keep their recorded replicas).
pub fn clear_meltdown_patch() -> Value {
    json!({ "metadata": { "annotations": { MELTDOWN_ANNOTATION: null } } })
}

/// Whether `spec.replicas` of `apiVersion`/`kind` is what its scale subresource sets, so that
/// one merge patch of the object can change replicas and annotations together. True for the
/// apps/v1 workloads; any other kind goes through its scale subresource.
pub fn replicas_in_spec(api_version: &str, kind: &str) -> bool {
    api_version == "apps/v1" && matches!(kind, "Deployment" | "StatefulSet" | "ReplicaSet")
}

/// `patch` that applies only while the object is still at `resource_version`: the version
/// the decision was made from. On any other version the apiserver answers 409 Conflict and
/// the step is decided again from fresh state, so no write is ever based on a stale read.
/// Through a `scale` subresource the precondition is the parent's version too (the Scale
/// carries its parent's `resourceVersion`, and the apiserver checks it against the parent).
pub fn with_resource_version(mut patch: Value, resource_version: Option<&str>) -> Value {
    if let Some(rv) = resource_version {
        patch["metadata"]["resourceVersion"] = json!(rv);
    }
    patch
}

/// Merge patch of a `scale` subresource setting `replicas`, under the precondition
/// `resource_version` (see [`with_resource_version`]).
pub fn scale_subresource_patch(replicas: i32, resource_version: Option<&str>) -> Value {
    with_resource_version(
        json!({ "spec": { "replicas": replicas } }),
        resource_version,
    )
}

/// One merge patch for a scale-down: record the replicas, mark meltdown protection and set
/// replicas to 0 *atomically* (so nothing is lost by a crash, and it costs one write instead
/// of two), only if the object is still at `resource_version` (the version the decision was
/// made from; a conflict makes the step retry with fresh state).
pub fn scale_down_patch(record: i32, resource_version: Option<&str>) -> Value {
    let mut patch = scale_down_annotation_patch(record);
    patch["spec"] = json!({ "replicas": 0 });
    with_resource_version(patch, resource_version)
}

/// One merge patch for a scale-up: set `replicas` and remove both watchdog annotations
/// atomically, only if the object is still at `resource_version`.
pub fn scale_up_patch(replicas: i32, resource_version: Option<&str>) -> Value {
    let mut patch = clear_annotations_patch();
    patch["spec"] = json!({ "replicas": replicas });
    with_resource_version(patch, resource_version)
}

/// A replica change the executor makes to one target: down to 0, recording the count to
/// restore, or up to a count.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ReplicaChange {
    /// Scale to 0, recording `record` replicas in [`REPLICAS_ANNOTATION`].
    Down {
        /// The count recorded for the next scale-up.
        record: i32,
    },
    /// Scale to `replicas`, removing both watchdog annotations.
    Up {
        /// The replicas to set.
        replicas: i32,
    },
}

impl ReplicaChange {
    /// The change of `action`, if it changes replicas.
    pub fn of(action: &TargetAction) -> Option<ReplicaChange> {
        match *action {
            TargetAction::ScaleDown { record_replicas } => Some(ReplicaChange::Down {
                record: record_replicas,
            }),
            TargetAction::ScaleUp { replicas } => Some(ReplicaChange::Up { replicas }),
            TargetAction::Ignored { .. } | TargetAction::AlreadyDone { .. } => None,
        }
    }

    /// The replicas the change sets.
    pub fn to(self) -> i32 {
        match self {
            ReplicaChange::Down { .. } => 0,
            ReplicaChange::Up { replicas } => replicas,
        }
    }

    /// Whether a target at `spec_replicas`, `ready_replicas` has reached the change's goal:
    /// on the way down no replica left ready; on the way up the count set and one replica
    /// ready (the level after it needs a working controller, not all of its replicas).
    pub fn reached(self, spec_replicas: i32, ready_replicas: i32) -> bool {
        match self {
            ReplicaChange::Down { .. } => spec_replicas == 0 && ready_replicas == 0,
            ReplicaChange::Up { replicas } => spec_replicas == replicas && ready_replicas >= 1,
        }
    }
}

/// Where one write of a replica change goes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WriteTo {
    /// A merge patch of the target object.
    Object,
    /// A merge patch of the target's `scale` subresource.
    Scale,
}

/// One write of a replica change: where it goes, its patch (without a precondition) and
/// what it does, in words, for its errors.
#[derive(Debug, Clone, PartialEq)]
pub struct ReplicaWrite {
    /// The object or its `scale` subresource.
    pub to: WriteTo,
    /// The merge patch; the executor adds the precondition (see [`replica_writes`]).
    pub patch: Value,
    /// "scaling KIND ns/name to 0", and so on.
    pub doing: String,
}

/// The writes that make `change` to a target of `api_version`/`kind` (`what`, in words), in
/// the order they are sent. An apps/v1 workload gets one write: replicas and annotations
/// together, atomically. Any other kind needs two, ordered so that a crash between them
/// loses nothing: down, the record before the scale (a target at 0 always has its count
/// recorded); up, the scale before the annotations are cleared (a target whose record is
/// gone is always running).
///
/// The executor conditions the first write on the version the decision was made from, and
/// each later one on the version the write before it produced ([`with_resource_version`]),
/// so nothing that changed the target in between is overwritten unseen. A later write is
/// sent even when the flow is stopped: the first is out, and half a change is worse than a
/// whole one the next flow undoes.
pub fn replica_writes(
    api_version: &str,
    kind: &str,
    change: ReplicaChange,
    what: &str,
) -> Vec<ReplicaWrite> {
    let write = |to, patch, doing| ReplicaWrite { to, patch, doing };
    let to = change.to();
    match (replicas_in_spec(api_version, kind), change) {
        (true, ReplicaChange::Down { record }) => vec![write(
            WriteTo::Object,
            scale_down_patch(record, None),
            format!("scaling {what} to 0 (recording {record} replicas)"),
        )],
        (true, ReplicaChange::Up { replicas }) => vec![write(
            WriteTo::Object,
            scale_up_patch(replicas, None),
            format!("scaling {what} to {replicas}"),
        )],
        (false, ReplicaChange::Down { record }) => vec![
            write(
                WriteTo::Object,
                scale_down_annotation_patch(record),
                format!("recording replicas of {what}"),
            ),
            write(
                WriteTo::Scale,
                scale_subresource_patch(to, None),
                format!("scaling {what} to 0"),
            ),
        ],
        (false, ReplicaChange::Up { replicas }) => vec![
            write(
                WriteTo::Scale,
                scale_subresource_patch(to, None),
                format!("scaling {what} to {replicas}"),
            ),
            write(
                WriteTo::Object,
                clear_annotations_patch(),
                format!("removing annotations of {what}"),
            ),
        ],
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::{ResourceRef, ScaleInfo};

    /// What [`plan_target`] does with the target.
    fn action(dir: Direction, snapshot: &TargetSnapshot) -> TargetAction {
        plan_target(dir, snapshot).action
    }

    fn info(name: &str, up: u32, down: u32) -> DependentResourceInfo {
        let scale = |level| ScaleInfo {
            level,
            initial_delay: Duration::ZERO,
            timeout: Duration::from_secs(30),
        };
        DependentResourceInfo {
            target: ResourceRef {
                api_version: "apps/v1".into(),
                kind: "Deployment".into(),
                name: name.into(),
            },
            optional: false,
            scale_up: scale(up),
            scale_down: scale(down),
            scale_down_on_zone_outage: false,
        }
    }

    fn names(plan: &[LevelPlan]) -> Vec<(u32, Vec<&str>)> {
        plan.iter()
            .map(|p| {
                (
                    p.level,
                    p.targets.iter().map(|t| t.target.name.as_str()).collect(),
                )
            })
            .collect()
    }

    fn snap(replicas: i32, annotations: &[(&str, &str)]) -> TargetSnapshot {
        TargetSnapshot {
            spec_replicas: replicas,
            annotations: annotations
                .iter()
                .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
                .collect(),
        }
    }

    /// The seed's example: kcm up 1/down 0, mcm up 1/down 1, ca up 0/down 2.
    fn seed_infos() -> Vec<DependentResourceInfo> {
        vec![info("kcm", 1, 0), info("mcm", 1, 1), info("ca", 0, 2)]
    }

    #[test]
    fn a_level_waits_for_readiness_at_most_five_seconds_and_calls_are_bounded_by_timeout() {
        // (timeout) → (readiness wait, call deadline)
        for (timeout, wait, call) in [
            (30_000, 5_000, 30_000),
            (10_000, 5_000, 10_000),
            (5_000, 5_000, 5_000),
            (2_000, 2_000, 2_000),
            (0, 0, 30_000),
        ] {
            let t = Duration::from_millis(timeout);
            assert_eq!(readiness_wait(t), Duration::from_millis(wait), "{t:?}");
            assert_eq!(call_timeout(t), Duration::from_millis(call), "{t:?}");
        }
    }

    #[test]
    fn scale_down_levels_run_sequentially_in_ascending_order() {
        assert_eq!(
            names(&plan_levels(&seed_infos(), Direction::Down, FlowScope::All)),
            [(0, vec!["kcm"]), (1, vec!["mcm"]), (2, vec!["ca"])]
        );
    }

    #[test]
    fn targets_of_the_same_level_run_together_in_config_order() {
        assert_eq!(
            names(&plan_levels(&seed_infos(), Direction::Up, FlowScope::All)),
            [(0, vec!["ca"]), (1, vec!["kcm", "mcm"])]
        );
    }

    #[test]
    fn a_zonal_flow_covers_only_the_zonal_targets_in_level_order() {
        let mut infos = seed_infos();
        infos[1].scale_down_on_zone_outage = true;
        infos[2].scale_down_on_zone_outage = true;
        assert_eq!(
            names(&plan_levels(&infos, Direction::Down, FlowScope::Zonal)),
            [(1, vec!["mcm"]), (2, vec!["ca"])]
        );
        assert_eq!(
            FlowScope::of(&crate::lease::LeaseDecision::ZonalScaleDown),
            FlowScope::Zonal
        );
        assert_eq!(
            FlowScope::of(&crate::lease::LeaseDecision::ScaleDown),
            FlowScope::All
        );
    }

    #[test]
    fn levels_may_have_gaps() {
        let infos = [info("a", 5, 0), info("b", 2, 0)];
        assert_eq!(
            names(&plan_levels(&infos, Direction::Up, FlowScope::All)),
            [(2, vec!["b"]), (5, vec!["a"])]
        );
        assert!(plan_levels(&[], Direction::Up, FlowScope::All).is_empty());
    }

    #[test]
    fn ignore_scaling_parses_like_go_parse_bool() {
        for v in ["1", "t", "T", "TRUE", "true", "True"] {
            assert!(
                is_scaling_ignored(&snap(1, &[(IGNORE_SCALING_ANNOTATION, v)]).annotations),
                "{v}"
            );
        }
        for v in ["false", "0", "foo", "yes", " true", ""] {
            assert!(
                !is_scaling_ignored(&snap(1, &[(IGNORE_SCALING_ANNOTATION, v)]).annotations),
                "{v}"
            );
        }
        assert!(!is_scaling_ignored(&BTreeMap::new()));
    }

    #[test]
    fn ignored_target_is_skipped_in_both_directions() {
        let s = snap(3, &[(IGNORE_SCALING_ANNOTATION, "true")]);
        for dir in [Direction::Up, Direction::Down] {
            assert_eq!(
                action(dir, &s),
                TargetAction::Ignored {
                    clear_marker: false
                }
            );
        }
    }

    #[test]
    fn ignored_target_clears_a_leftover_meltdown_marker() {
        let s = snap(
            0,
            &[
                (IGNORE_SCALING_ANNOTATION, "True"),
                (MELTDOWN_ANNOTATION, ""),
            ],
        );
        assert_eq!(
            action(Direction::Up, &s),
            TargetAction::Ignored { clear_marker: true }
        );
    }

    #[test]
    fn unparsable_ignore_scaling_means_not_ignored() {
        let s = snap(2, &[(IGNORE_SCALING_ANNOTATION, "foo")]);
        assert_eq!(
            action(Direction::Down, &s),
            TargetAction::ScaleDown { record_replicas: 2 }
        );
    }

    #[test]
    fn scale_down_records_current_replicas() {
        assert_eq!(
            action(Direction::Down, &snap(3, &[])),
            TargetAction::ScaleDown { record_replicas: 3 }
        );
    }

    #[test]
    fn scale_down_of_zero_replicas_is_already_done() {
        assert_eq!(
            action(Direction::Down, &snap(0, &[(REPLICAS_ANNOTATION, "2")])),
            TargetAction::AlreadyDone {
                clear_marker: false
            }
        );
    }

    #[test]
    fn scale_up_restores_recorded_replicas() {
        let s = snap(0, &[(REPLICAS_ANNOTATION, "3"), (MELTDOWN_ANNOTATION, "")]);
        assert_eq!(
            action(Direction::Up, &s),
            TargetAction::ScaleUp { replicas: 3 }
        );
    }

    #[test]
    fn scale_up_without_annotation_uses_one_replica() {
        assert_eq!(
            action(Direction::Up, &snap(0, &[])),
            TargetAction::ScaleUp { replicas: 1 }
        );
    }

    #[test]
    fn unusable_replicas_annotation_restores_one_replica_and_names_the_value() {
        // (value, the reason's key words): a healthy shoot's target never stays at 0.
        for (bad, why) in [
            ("0", "greater than 0"),
            ("-0", "greater than 0"),
            ("-1", "greater than 0"),
            ("-99999999999", "greater than 0"),
            ("abc", "integer"),
            ("", "integer"),
            ("1.5", "integer"),
            (" 3", "integer"),
            ("3 ", "integer"),
            ("+", "integer"),
            ("0x10", "integer"),
            ("1001", "maximum of 1000"),
            ("2147483647", "maximum of 1000"),
            ("99999999999999999999999", "maximum of 1000"),
        ] {
            let s = snap(0, &[(REPLICAS_ANNOTATION, bad), (MELTDOWN_ANNOTATION, "")]);
            let plan = plan_target(Direction::Up, &s);
            assert_eq!(
                plan.action,
                TargetAction::ScaleUp {
                    replicas: DEFAULT_SCALE_UP_REPLICAS
                },
                "{bad:?}"
            );
            let problem = plan.replicas_problem.expect(bad);
            let ScalingError::InvalidReplicasAnnotation { value, .. } = &problem;
            assert_eq!(value, bad);
            let text = problem.to_string();
            assert!(text.contains(&format!("{bad:?}")), "{text}");
            assert!(text.contains(REPLICAS_ANNOTATION), "{text}");
            assert!(text.contains(why), "{bad:?}: {text}");
            assert_eq!(
                action(Direction::Up, &s),
                TargetAction::ScaleUp { replicas: 1 }
            );
        }
    }

    #[test]
    fn recorded_replicas_accepts_go_integers_up_to_the_maximum() {
        for (good, n) in [
            ("1", 1),
            ("+2", 2),
            ("007", 7),
            ("1000", MAX_RECORDED_REPLICAS),
        ] {
            let a = snap(0, &[(REPLICAS_ANNOTATION, good)]).annotations;
            assert_eq!(recorded_replicas(&a), Ok(Some(n)), "{good}");
        }
        assert_eq!(recorded_replicas(&BTreeMap::new()), Ok(None));
        let s = snap(
            0,
            &[(REPLICAS_ANNOTATION, "1000"), (MELTDOWN_ANNOTATION, "")],
        );
        assert_eq!(
            plan_target(Direction::Up, &s),
            TargetPlan {
                action: TargetAction::ScaleUp { replicas: 1000 },
                replicas_problem: None
            }
        );
    }

    #[test]
    fn repeated_scale_down_never_records_a_lower_count() {
        // (replicas now, annotations) → count recorded.
        type Case<'a> = (i32, Vec<(&'a str, &'a str)>, i32);
        let m = (MELTDOWN_ANNOTATION, "");
        let cases: [Case; 6] = [
            // Scaled down by us to 0 (recording 3), then something brought it back to 1
            // during the outage: the count to restore is still 3.
            (1, vec![(REPLICAS_ANNOTATION, "3"), m], 3),
            // Scaled above the record during the outage: the higher count wins.
            (5, vec![(REPLICAS_ANNOTATION, "3"), m], 5),
            (3, vec![(REPLICAS_ANNOTATION, "3"), m], 3),
            // Marker only (an interrupted two-write scale-down of the reference).
            (2, vec![m], 2),
            // No marker: a leftover record (the reference never removes it) is stale.
            (2, vec![(REPLICAS_ANNOTATION, "3")], 2),
            (2, vec![], 2),
        ];
        for (replicas, annotations, want) in cases {
            let s = snap(replicas, &annotations);
            assert_eq!(
                plan_target(Direction::Down, &s),
                TargetPlan {
                    action: TargetAction::ScaleDown {
                        record_replicas: want
                    },
                    replicas_problem: None
                },
                "{replicas} {annotations:?}"
            );
        }
    }

    #[test]
    fn scale_down_replaces_an_unusable_record_with_the_current_count_and_says_so() {
        for bad in ["abc", "0", "5000"] {
            let s = snap(2, &[(REPLICAS_ANNOTATION, bad), (MELTDOWN_ANNOTATION, "")]);
            let plan = plan_target(Direction::Down, &s);
            assert_eq!(
                plan.action,
                TargetAction::ScaleDown { record_replicas: 2 },
                "{bad}"
            );
            assert!(plan.replicas_problem.is_some(), "{bad}");
        }
    }

    #[test]
    fn a_target_found_at_zero_keeps_its_record_in_any_state() {
        for annotations in [
            vec![(REPLICAS_ANNOTATION, "3"), (MELTDOWN_ANNOTATION, "")],
            vec![(REPLICAS_ANNOTATION, "3")],
            vec![(REPLICAS_ANNOTATION, "garbage"), (MELTDOWN_ANNOTATION, "")],
        ] {
            assert_eq!(
                plan_target(Direction::Down, &snap(0, &annotations)),
                TargetPlan {
                    action: TargetAction::AlreadyDone {
                        clear_marker: false
                    },
                    replicas_problem: None
                },
                "{annotations:?}"
            );
        }
    }

    #[test]
    fn a_running_target_with_only_a_replicas_record_is_left_alone() {
        // What the reference leaves on every target it restored.
        assert_eq!(
            action(Direction::Up, &snap(2, &[(REPLICAS_ANNOTATION, "2")])),
            TargetAction::AlreadyDone {
                clear_marker: false
            }
        );
    }

    #[test]
    fn skipped_scale_up_clears_leftover_annotations() {
        assert_eq!(
            action(Direction::Up, &snap(2, &[(MELTDOWN_ANNOTATION, "")])),
            TargetAction::AlreadyDone { clear_marker: true }
        );
        assert_eq!(
            action(
                Direction::Up,
                &snap(2, &[(REPLICAS_ANNOTATION, "2"), (MELTDOWN_ANNOTATION, "")])
            ),
            TargetAction::AlreadyDone { clear_marker: true }
        );
        assert_eq!(
            action(Direction::Up, &snap(2, &[])),
            TargetAction::AlreadyDone {
                clear_marker: false
            }
        );
    }

    #[test]
    fn patches_set_and_clear_both_annotations() {
        assert_eq!(
            scale_down_annotation_patch(4),
            json!({"metadata": {"annotations": {
                "dependency-watchdog.gardener.cloud/replicas": "4",
                "dependency-watchdog.gardener.cloud/meltdown-protection-active": ""
            }}})
        );
        assert_eq!(
            clear_annotations_patch(),
            json!({"metadata": {"annotations": {
                "dependency-watchdog.gardener.cloud/replicas": null,
                "dependency-watchdog.gardener.cloud/meltdown-protection-active": null
            }}})
        );
        assert_eq!(
            clear_meltdown_patch(),
            json!({"metadata": {"annotations": {
                "dependency-watchdog.gardener.cloud/meltdown-protection-active": null
            }}})
        );
    }

    #[test]
    fn single_patches_change_replicas_and_annotations_together_under_a_precondition() {
        assert_eq!(
            scale_down_patch(3, Some("42")),
            json!({"metadata": {"annotations": {REPLICAS_ANNOTATION: "3", MELTDOWN_ANNOTATION: ""},
                                "resourceVersion": "42"},
                   "spec": {"replicas": 0}})
        );
        assert_eq!(
            scale_up_patch(3, Some("43")),
            json!({"metadata": {"annotations": {REPLICAS_ANNOTATION: null, MELTDOWN_ANNOTATION: null},
                                "resourceVersion": "43"},
                   "spec": {"replicas": 3}})
        );
        assert_eq!(
            scale_up_patch(1, None),
            json!({"metadata": {"annotations": {REPLICAS_ANNOTATION: null, MELTDOWN_ANNOTATION: null}},
                   "spec": {"replicas": 1}})
        );
    }

    #[test]
    fn scale_subresource_and_annotation_writes_carry_the_precondition_too() {
        assert_eq!(
            scale_subresource_patch(0, Some("7")),
            json!({"spec": {"replicas": 0}, "metadata": {"resourceVersion": "7"}})
        );
        assert_eq!(
            scale_subresource_patch(2, None),
            json!({"spec": {"replicas": 2}})
        );
        assert_eq!(
            with_resource_version(clear_meltdown_patch(), Some("9")),
            json!({"metadata": {"annotations": {MELTDOWN_ANNOTATION: null}, "resourceVersion": "9"}})
        );
        assert_eq!(
            with_resource_version(scale_down_annotation_patch(3), Some("9")),
            json!({"metadata": {"annotations": {REPLICAS_ANNOTATION: "3", MELTDOWN_ANNOTATION: ""},
                                "resourceVersion": "9"}})
        );
    }

    #[test]
    fn an_apps_workload_changes_replicas_and_annotations_in_one_write() {
        let writes = replica_writes(
            "apps/v1",
            "Deployment",
            ReplicaChange::Down { record: 3 },
            "d",
        );
        assert_eq!(writes.len(), 1);
        assert_eq!(writes[0].to, WriteTo::Object);
        assert_eq!(writes[0].patch, scale_down_patch(3, None));
        let writes = replica_writes(
            "apps/v1",
            "StatefulSet",
            ReplicaChange::Up { replicas: 2 },
            "s",
        );
        assert_eq!(writes.len(), 1);
        assert_eq!(writes[0].patch, scale_up_patch(2, None));
    }

    #[test]
    fn another_kind_records_before_it_scales_down_and_scales_before_it_clears_on_the_way_up() {
        let down = replica_writes(
            "example.com/v1",
            "Thing",
            ReplicaChange::Down { record: 4 },
            "t",
        );
        let order: Vec<_> = down.iter().map(|w| (w.to, w.patch.clone())).collect();
        assert_eq!(
            order,
            [
                (WriteTo::Object, scale_down_annotation_patch(4)),
                (WriteTo::Scale, scale_subresource_patch(0, None)),
            ]
        );
        let up = replica_writes(
            "example.com/v1",
            "Thing",
            ReplicaChange::Up { replicas: 4 },
            "t",
        );
        let order: Vec<_> = up.iter().map(|w| (w.to, w.patch.clone())).collect();
        assert_eq!(
            order,
            [
                (WriteTo::Scale, scale_subresource_patch(4, None)),
                (WriteTo::Object, clear_annotations_patch()),
            ]
        );
        assert_eq!(down[1].doing, "scaling t to 0");
        assert_eq!(up[1].doing, "removing annotations of t");
    }

    #[test]
    fn a_change_is_reached_at_zero_ready_down_and_one_ready_up() {
        let down = ReplicaChange::Down { record: 2 };
        assert!(down.reached(0, 0));
        assert!(!down.reached(0, 1), "a replica still ready");
        let up = ReplicaChange::Up { replicas: 3 };
        assert!(up.reached(3, 1));
        assert!(!up.reached(3, 0), "none ready yet");
        assert!(!up.reached(2, 2), "not the count set");
        assert_eq!(
            ReplicaChange::of(&TargetAction::ScaleDown { record_replicas: 2 }),
            Some(down)
        );
        assert_eq!(
            ReplicaChange::of(&TargetAction::AlreadyDone { clear_marker: true }),
            None
        );
    }

    #[test]
    fn only_apps_workloads_are_scaled_through_spec_replicas() {
        for kind in ["Deployment", "StatefulSet", "ReplicaSet"] {
            assert!(replicas_in_spec("apps/v1", kind), "{kind}");
        }
        assert!(!replicas_in_spec("apps/v1beta1", "Deployment"));
        assert!(!replicas_in_spec("example.com/v1", "Deployment"));
        assert!(!replicas_in_spec("apps/v1", "DaemonSet"));
    }
}
