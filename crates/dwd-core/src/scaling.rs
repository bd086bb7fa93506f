//! Scaling flows: level plans and the per-target decision (SPEC §2.3).
//!
//! The controller performs the I/O (read target, patch annotations, set the scale subresource,
//! wait for readiness); this module decides *what* to do from a snapshot of the target, so the
//! rules about annotations and replica bookkeeping are tested without a cluster and the recorded
//! replica count survives a watchdog restart.

use std::collections::BTreeMap;

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

/// The targets of one level; they are scaled concurrently.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LevelPlan {
    pub level: u32,
    /// In config order.
    pub targets: Vec<DependentResourceInfo>,
}

/// Groups targets by their level for `dir`, levels ascending, config order kept within a level.
pub fn plan_levels(infos: &[DependentResourceInfo], dir: Direction) -> Vec<LevelPlan> {
    let mut by_level: BTreeMap<u32, Vec<DependentResourceInfo>> = BTreeMap::new();
    for info in infos {
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

/// What a scaling step needs to know about a target.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct TargetSnapshot {
    pub spec_replicas: i32,
    pub annotations: BTreeMap<String, String>,
}

/// What to do with one target.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TargetAction {
    /// Ignore-scaling is set. `clear_marker`: remove a leftover meltdown annotation only
    /// ([`clear_meltdown_patch`]); the recorded replicas stay for when the operator lifts the flag.
    Ignored { clear_marker: bool },
    /// Nothing to scale. `clear_marker`: remove both annotations ([`clear_annotations_patch`]).
    AlreadyDone { clear_marker: bool },
    /// Patch [`scale_down_annotation_patch`]`(record_replicas)` first, then set replicas to 0.
    ScaleDown { record_replicas: i32 },
    /// Set replicas, then remove both annotations ([`clear_annotations_patch`]).
    ScaleUp { replicas: i32 },
}

#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum ScalingError {
    #[error("annotation {REPLICAS_ANNOTATION}={value:?} is not a valid replica count: {reason}")]
    InvalidReplicasAnnotation { value: String, reason: String },
}

/// Decides the action for one target in direction `dir`.
pub fn decide_target_action(
    dir: Direction,
    snapshot: &TargetSnapshot,
) -> Result<TargetAction, ScalingError> {
    let has_meltdown = snapshot.annotations.contains_key(MELTDOWN_ANNOTATION);
    if is_scaling_ignored(&snapshot.annotations) {
        return Ok(TargetAction::Ignored {
            clear_marker: has_meltdown,
        });
    }
    match dir {
        Direction::Down if snapshot.spec_replicas > 0 => Ok(TargetAction::ScaleDown {
            record_replicas: snapshot.spec_replicas,
        }),
        Direction::Down => Ok(TargetAction::AlreadyDone {
            clear_marker: false,
        }),
        // Negative replicas cannot exist in the API; treat them like 0 rather than leave a target
        // down.
        Direction::Up if snapshot.spec_replicas <= 0 => Ok(TargetAction::ScaleUp {
            replicas: scale_up_replicas(&snapshot.annotations)?,
        }),
        Direction::Up => Ok(TargetAction::AlreadyDone {
            clear_marker: has_meltdown || snapshot.annotations.contains_key(REPLICAS_ANNOTATION),
        }),
    }
}

/// Replicas to restore: the recorded count (an integer > 0), or 1 when none was recorded.
pub fn scale_up_replicas(annotations: &BTreeMap<String, String>) -> Result<i32, ScalingError> {
    let Some(value) = annotations.get(REPLICAS_ANNOTATION) else {
        return Ok(DEFAULT_SCALE_UP_REPLICAS);
    };
    let invalid = |reason: &str| ScalingError::InvalidReplicasAnnotation {
        value: value.clone(),
        reason: reason.to_owned(),
    };
    match value.parse::<i32>() {
        Ok(n) if n > 0 => Ok(n),
        Ok(_) => Err(invalid("must be greater than 0")),
        Err(_) => Err(invalid("must be an integer")),
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

/// One merge patch for a scale-down: record the replicas, mark meltdown protection and set
/// replicas to 0 *atomically* (so nothing is lost by a crash, and it costs one write instead
/// of two), only if the object is still at `resource_version` (the version the decision was
/// made from; a conflict makes the step retry with fresh state).
pub fn scale_down_patch(record: i32, resource_version: Option<&str>) -> Value {
    let mut patch = scale_down_annotation_patch(record);
    patch["spec"] = json!({ "replicas": 0 });
    if let Some(rv) = resource_version {
        patch["metadata"]["resourceVersion"] = json!(rv);
    }
    patch
}

/// One merge patch for a scale-up: set `replicas` and remove both watchdog annotations
/// atomically, only if the object is still at `resource_version`.
pub fn scale_up_patch(replicas: i32, resource_version: Option<&str>) -> Value {
    let mut patch = clear_annotations_patch();
    patch["spec"] = json!({ "replicas": replicas });
    if let Some(rv) = resource_version {
        patch["metadata"]["resourceVersion"] = json!(rv);
    }
    patch
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::{ResourceRef, ScaleInfo};
    use std::time::Duration;

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
    fn scale_down_levels_run_sequentially_in_ascending_order() {
        assert_eq!(
            names(&plan_levels(&seed_infos(), Direction::Down)),
            [(0, vec!["kcm"]), (1, vec!["mcm"]), (2, vec!["ca"])]
        );
    }

    #[test]
    fn targets_of_the_same_level_run_together_in_config_order() {
        assert_eq!(
            names(&plan_levels(&seed_infos(), Direction::Up)),
            [(0, vec!["ca"]), (1, vec!["kcm", "mcm"])]
        );
    }

    #[test]
    fn levels_may_have_gaps() {
        let infos = [info("a", 5, 0), info("b", 2, 0)];
        assert_eq!(
            names(&plan_levels(&infos, Direction::Up)),
            [(2, vec!["b"]), (5, vec!["a"])]
        );
        assert!(plan_levels(&[], Direction::Up).is_empty());
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
                decide_target_action(dir, &s),
                Ok(TargetAction::Ignored {
                    clear_marker: false
                })
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
            decide_target_action(Direction::Up, &s),
            Ok(TargetAction::Ignored { clear_marker: true })
        );
    }

    #[test]
    fn unparsable_ignore_scaling_means_not_ignored() {
        let s = snap(2, &[(IGNORE_SCALING_ANNOTATION, "foo")]);
        assert_eq!(
            decide_target_action(Direction::Down, &s),
            Ok(TargetAction::ScaleDown { record_replicas: 2 })
        );
    }

    #[test]
    fn scale_down_records_current_replicas() {
        assert_eq!(
            decide_target_action(Direction::Down, &snap(3, &[])),
            Ok(TargetAction::ScaleDown { record_replicas: 3 })
        );
    }

    #[test]
    fn scale_down_of_zero_replicas_is_already_done() {
        assert_eq!(
            decide_target_action(Direction::Down, &snap(0, &[(REPLICAS_ANNOTATION, "2")])),
            Ok(TargetAction::AlreadyDone {
                clear_marker: false
            })
        );
    }

    #[test]
    fn scale_up_restores_recorded_replicas() {
        let s = snap(0, &[(REPLICAS_ANNOTATION, "3"), (MELTDOWN_ANNOTATION, "")]);
        assert_eq!(
            decide_target_action(Direction::Up, &s),
            Ok(TargetAction::ScaleUp { replicas: 3 })
        );
    }

    #[test]
    fn scale_up_without_annotation_uses_one_replica() {
        assert_eq!(
            decide_target_action(Direction::Up, &snap(0, &[])),
            Ok(TargetAction::ScaleUp { replicas: 1 })
        );
    }

    #[test]
    fn invalid_replicas_annotation_is_an_error_naming_the_value() {
        for bad in ["0", "-1", "abc", "", "1.5"] {
            let err = decide_target_action(Direction::Up, &snap(0, &[(REPLICAS_ANNOTATION, bad)]))
                .unwrap_err();
            let ScalingError::InvalidReplicasAnnotation { value, .. } = &err;
            assert_eq!(value, bad);
            assert!(err.to_string().contains(&format!("{bad:?}")), "{err}");
        }
    }

    #[test]
    fn skipped_scale_up_clears_leftover_annotations() {
        assert_eq!(
            decide_target_action(Direction::Up, &snap(2, &[(MELTDOWN_ANNOTATION, "")])),
            Ok(TargetAction::AlreadyDone { clear_marker: true })
        );
        assert_eq!(
            decide_target_action(Direction::Up, &snap(2, &[(REPLICAS_ANNOTATION, "2")])),
            Ok(TargetAction::AlreadyDone { clear_marker: true })
        );
        assert_eq!(
            decide_target_action(Direction::Up, &snap(2, &[])),
            Ok(TargetAction::AlreadyDone {
                clear_marker: false
            })
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
    fn only_apps_workloads_are_scaled_through_spec_replicas() {
        for kind in ["Deployment", "StatefulSet", "ReplicaSet"] {
            assert!(replicas_in_spec("apps/v1", kind), "{kind}");
        }
        assert!(!replicas_in_spec("apps/v1beta1", "Deployment"));
        assert!(!replicas_in_spec("example.com/v1", "Deployment"));
        assert!(!replicas_in_spec("apps/v1", "DaemonSet"));
    }
}
