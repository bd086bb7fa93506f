//! A run's pipeline of values, after the probe's finding: the **verdict** ([`crate::verdict`]:
//! the lease decision through the hysteresis) becomes an **intent**: the flow's
//! levels in order and, for each target in them, what the flow would do to it as the seed
//! shows it now ([`intent`]). This is the one place a flow is sequenced and its targets
//! judged: the prober's planning from its caches (which targets a decision names, whether a
//! healthy shoot needs anything), shadow mode's targets in scope, and `explain` all take it
//! from here and add no sequencing of their own. The executor carries an intent out level by
//! level, judging each target again ([`plan_target`]) from the state it writes against.

use std::fmt;

use crate::DependentResourceInfo;
use crate::hysteresis::Direction;
use crate::scaling::{
    FlowScope, TargetAction, TargetPlan, TargetSnapshot, plan_levels, plan_target,
};

/// A target as the seed shows it to an intent.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Seen {
    /// Its kind is not served by the seed.
    NotServed,
    /// Not known now: its cache is not in sync, or (`explain`) it could not be read; why.
    Unknown(String),
    /// No such object in the shoot's namespace.
    Absent,
    /// The object's scaling state.
    Present(TargetSnapshot),
}

/// What the flow does with one target.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Step {
    /// Its plan from its current state.
    Planned(TargetPlan),
    /// Optional and absent, or its kind not served: skipped; its level still succeeds.
    Skipped,
    /// Mandatory and absent, or its kind not served: the flow stops at this level.
    Fails,
    /// Not known now: the flow reads it when its level starts.
    Unknown(String),
}

impl Step {
    /// Whether the flow takes the target up at all: it acts on it, would fail on it, or
    /// cannot tell yet. A target already where the flow would take it, or left alone by
    /// `ignore-scaling` with nothing to clear, is not taken up; nor is a skipped one.
    pub fn takes_up(&self) -> bool {
        match self {
            Step::Planned(plan) => !matches!(
                plan.action,
                TargetAction::AlreadyDone {
                    clear_marker: false
                } | TargetAction::Ignored {
                    clear_marker: false
                }
            ),
            Step::Skipped => false,
            Step::Fails | Step::Unknown(_) => true,
        }
    }

    /// Whether the flow would act on the target whatever state it is in now: it exists (or
    /// is mandatory, so a flow would fail naming it) and is not excluded by `ignore-scaling`.
    pub fn in_scope(&self) -> bool {
        match self {
            Step::Planned(plan) => !matches!(plan.action, TargetAction::Ignored { .. }),
            Step::Skipped => false,
            Step::Fails | Step::Unknown(_) => true,
        }
    }
}

/// One target of an intent.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct IntentTarget {
    /// The config entry.
    pub info: DependentResourceInfo,
    /// What the seed shows of it.
    pub seen: Seen,
    /// What the flow does with it.
    pub step: Step,
}

/// What the flow does with the target, in words (`explain` prints it).
impl fmt::Display for IntentTarget {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let plan = match (&self.step, &self.seen) {
            (Step::Skipped, Seen::NotServed) => {
                return f
                    .write_str("kind not served by the seed; optional, so every flow skips it");
            }
            (Step::Skipped, _) => {
                return f.write_str("not found; optional, so its level still succeeds");
            }
            (Step::Fails, Seen::NotServed) => {
                return f.write_str(
                    "kind not served by the seed and not optional: the flow would stop at this level",
                );
            }
            (Step::Fails, _) => {
                return f
                    .write_str("not found and not optional: the flow would stop at this level");
            }
            (Step::Unknown(why), _) => {
                return write!(
                    f,
                    "not known now ({why}); the flow reads it when its level starts"
                );
            }
            (Step::Planned(plan), _) => plan,
        };
        match &plan.action {
            TargetAction::Ignored { clear_marker } => {
                f.write_str("left alone: ignore-scaling annotation is set")?;
                if *clear_marker {
                    f.write_str("; would remove the leftover meltdown marker")?;
                }
            }
            TargetAction::AlreadyDone { clear_marker } => {
                let replicas = match &self.seen {
                    Seen::Present(snapshot) => snapshot.spec_replicas,
                    _ => 0,
                };
                write!(f, "nothing to scale (replicas {replicas})")?;
                if *clear_marker {
                    f.write_str("; would remove the leftover annotations")?;
                }
            }
            TargetAction::ScaleDown { record_replicas } => write!(
                f,
                "would record replicas={record_replicas}, then scale {record_replicas} → 0"
            )?,
            TargetAction::ScaleUp { replicas } => {
                write!(f, "would scale 0 → {replicas}, then remove the annotations")?
            }
        }
        match &plan.replicas_problem {
            Some(problem) => write!(f, " ({problem})"),
            None => Ok(()),
        }
    }
}

/// One level of an intent: its targets are scaled concurrently.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct IntentLevel {
    /// The `scaleUp.level` or `scaleDown.level` its targets share.
    pub level: u32,
    /// In config order.
    pub targets: Vec<IntentTarget>,
}

/// What a verdict asks of a shoot's targets (see the module docs).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Intent {
    /// Down or up.
    pub dir: Direction,
    /// Every target, or only the zonal ones.
    pub scope: FlowScope,
    /// Levels ascending.
    pub levels: Vec<IntentLevel>,
}

impl Intent {
    /// Every target, in the flow's order.
    pub fn targets(&self) -> impl Iterator<Item = &IntentTarget> {
        self.levels.iter().flat_map(|l| l.targets.iter())
    }

    /// Names of the targets the flow takes up ([`Step::takes_up`]), in its order: empty lets a
    /// run end without touching the seed; otherwise what the decision event names.
    pub fn taken_up(&self) -> Vec<String> {
        self.names(Step::takes_up)
    }

    /// Whether the flow would change a target it knows (a planned step that is not already
    /// done): what "a target waits to be restored" means for a scale-up. A mandatory target
    /// that is absent, or one not known now, is taken up ([`Intent::taken_up`]) but waits for
    /// nothing.
    pub fn changes_any(&self) -> bool {
        self.targets()
            .any(|t| matches!(t.step, Step::Planned(_)) && t.step.takes_up())
    }

    /// Names of the targets in scope ([`Step::in_scope`]), in the flow's order.
    pub fn in_scope(&self) -> Vec<String> {
        self.names(Step::in_scope)
    }

    fn names(&self, keep: impl Fn(&Step) -> bool) -> Vec<String> {
        self.targets()
            .filter(|t| keep(&t.step))
            .map(|t| t.info.target.name.clone())
            .collect()
    }
}

/// The intent of the flow in `dir` over `scope` with targets `infos`, each seen as `seen`
/// says; `seen` is asked once per target of the scope, in the flow's order.
pub fn intent(
    infos: &[DependentResourceInfo],
    dir: Direction,
    scope: FlowScope,
    mut seen: impl FnMut(&DependentResourceInfo) -> Seen,
) -> Intent {
    let levels = plan_levels(infos, dir, scope)
        .into_iter()
        .map(|level| IntentLevel {
            level: level.level,
            targets: level
                .targets
                .into_iter()
                .map(|info| {
                    let seen = seen(&info);
                    let step = step_for(dir, &info, &seen);
                    IntentTarget { info, seen, step }
                })
                .collect(),
        })
        .collect();
    Intent { dir, scope, levels }
}

/// What the flow in `dir` does with `info`, seen as `seen`: the one rule for a target that is
/// absent, optional, not served or not known. An intent applies it to the snapshot it was built
/// from; the executor applies it again, at write time, to the newest object.
pub fn step_for(dir: Direction, info: &DependentResourceInfo, seen: &Seen) -> Step {
    match seen {
        Seen::Present(snapshot) => Step::Planned(plan_target(dir, snapshot)),
        Seen::NotServed | Seen::Absent if info.optional => Step::Skipped,
        Seen::NotServed | Seen::Absent => Step::Fails,
        Seen::Unknown(why) => Step::Unknown(why.clone()),
    }
}

/// Whether every flow goes on without `info` when the seed does not serve its kind (it is
/// optional): the prober then starts without its cache, and a watch of it that the seed
/// refuses holds nothing back. Otherwise no flow could ever scale it, and the prober refuses to
/// start. The same rule as [`step_for`]'s, asked once at start.
pub fn skipped_when_not_served(info: &DependentResourceInfo) -> bool {
    step_for(Direction::Down, info, &Seen::NotServed) == Step::Skipped
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ProberConfig;
    use crate::scaling::{IGNORE_SCALING_ANNOTATION, MELTDOWN_ANNOTATION, REPLICAS_ANNOTATION};
    use std::collections::BTreeMap;

    fn config() -> ProberConfig {
        ProberConfig::from_yaml(
            "
kubeConfigSecretName: probe
dependentResourceInfos:
- ref: {apiVersion: apps/v1, kind: Deployment, name: kcm}
  scaleUp: {level: 1}
  scaleDown: {level: 0}
  scaleDownOnZoneOutage: true
- ref: {apiVersion: apps/v1, kind: Deployment, name: mcm}
  scaleUp: {level: 0}
  scaleDown: {level: 1}
- ref: {apiVersion: apps/v1, kind: Deployment, name: ca}
  optional: true
  scaleUp: {level: 2}
  scaleDown: {level: 0}
",
        )
        .expect("valid config")
        .config
    }

    fn running(replicas: i32, annotations: &[(&str, &str)]) -> Seen {
        Seen::Present(TargetSnapshot {
            spec_replicas: replicas,
            annotations: annotations
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect::<BTreeMap<_, _>>(),
        })
    }

    fn names(level: &IntentLevel) -> Vec<&str> {
        level
            .targets
            .iter()
            .map(|t| t.info.target.name.as_str())
            .collect()
    }

    #[test]
    fn a_scale_down_orders_levels_and_judges_each_target_from_what_the_seed_shows() {
        let cfg = config();
        let mut asked = Vec::new();
        let intent = intent(
            &cfg.dependent_resource_infos,
            Direction::Down,
            FlowScope::All,
            |info| {
                asked.push(info.target.name.clone());
                match info.target.name.as_str() {
                    "kcm" => running(2, &[]),
                    "mcm" => running(0, &[(MELTDOWN_ANNOTATION, ""), (REPLICAS_ANNOTATION, "1")]),
                    _ => Seen::Absent,
                }
            },
        );
        // Asked once per target, in the flow's order.
        assert_eq!(asked, ["kcm", "ca", "mcm"]);
        assert_eq!(intent.levels.len(), 2);
        assert_eq!(names(&intent.levels[0]), ["kcm", "ca"]);
        assert_eq!(names(&intent.levels[1]), ["mcm"]);
        let steps: Vec<&Step> = intent.targets().map(|t| &t.step).collect();
        assert!(matches!(
            steps[0],
            Step::Planned(TargetPlan {
                action: TargetAction::ScaleDown { record_replicas: 2 },
                ..
            })
        ));
        assert_eq!(steps[1], &Step::Skipped);
        assert!(matches!(
            steps[2],
            Step::Planned(TargetPlan {
                action: TargetAction::AlreadyDone {
                    clear_marker: false
                },
                ..
            })
        ));
        // Only kcm is still to be scaled; in scope: every existing target.
        assert_eq!(intent.taken_up(), ["kcm"]);
        assert_eq!(intent.in_scope(), ["kcm", "mcm"]);
        assert!(intent.changes_any());
    }

    #[test]
    fn a_restore_waits_only_for_targets_it_would_change_not_for_absent_mandatory_ones() {
        let cfg = config();
        let up = |kcm: Seen, mcm: Seen| {
            intent(
                &cfg.dependent_resource_infos,
                Direction::Up,
                FlowScope::All,
                |info| match info.target.name.as_str() {
                    "kcm" => kcm.clone(),
                    "mcm" => mcm.clone(),
                    _ => Seen::Absent,
                },
            )
        };
        // Mandatory kcm and mcm absent: the flow would fail naming them, yet nothing waits to
        // be restored (a shoot without targets is not a decision pending).
        let absent = up(Seen::Absent, Seen::Absent);
        assert_eq!(absent.taken_up(), ["mcm", "kcm"]);
        assert!(!absent.changes_any());
        // Running: nothing. Scaled down with its record: it waits.
        assert!(!up(running(2, &[]), running(1, &[])).changes_any());
        let marked = running(0, &[(MELTDOWN_ANNOTATION, ""), (REPLICAS_ANNOTATION, "2")]);
        assert!(up(marked, running(1, &[])).changes_any());
    }

    #[test]
    fn only_an_optional_target_is_skipped_when_its_kind_is_not_served() {
        let mut info = config().dependent_resource_infos[0].clone();
        info.optional = false;
        assert!(!skipped_when_not_served(&info));
        assert_eq!(
            step_for(Direction::Up, &info, &Seen::NotServed),
            Step::Fails
        );
        info.optional = true;
        assert!(skipped_when_not_served(&info));
        assert_eq!(
            step_for(Direction::Up, &info, &Seen::NotServed),
            Step::Skipped
        );
    }

    #[test]
    fn mandatory_absent_or_unknown_targets_are_taken_up_optional_absent_ones_are_not() {
        let cfg = config();
        let intent = intent(
            &cfg.dependent_resource_infos,
            Direction::Up,
            FlowScope::All,
            |info| match info.target.name.as_str() {
                "kcm" => Seen::NotServed,
                "mcm" => Seen::Unknown("cache not in sync".into()),
                _ => Seen::NotServed,
            },
        );
        let by_name = |n: &str| {
            intent
                .targets()
                .find(|t| t.info.target.name == n)
                .map(|t| t.step.clone())
        };
        assert_eq!(by_name("kcm"), Some(Step::Fails));
        assert_eq!(by_name("ca"), Some(Step::Skipped));
        assert!(matches!(by_name("mcm"), Some(Step::Unknown(_))));
        // Up: mcm (level 0), kcm (level 1); ca (level 2) skipped.
        assert_eq!(intent.taken_up(), ["mcm", "kcm"]);
    }

    #[test]
    fn ignore_scaling_leaves_a_target_out_of_scope_and_a_zonal_scope_only_has_zonal_targets() {
        let cfg = config();
        let intent = intent(
            &cfg.dependent_resource_infos,
            Direction::Down,
            FlowScope::Zonal,
            |_| {
                running(
                    3,
                    &[
                        (IGNORE_SCALING_ANNOTATION, "true"),
                        (MELTDOWN_ANNOTATION, ""),
                    ],
                )
            },
        );
        assert_eq!(intent.targets().count(), 1, "only kcm is zonal");
        // Ignored, but its leftover marker is to be cleared: taken up, not in scope.
        assert_eq!(intent.taken_up(), ["kcm"]);
        assert!(intent.in_scope().is_empty());
        assert!(
            intent.levels[0].targets[0]
                .to_string()
                .starts_with("left alone")
        );
    }
}
