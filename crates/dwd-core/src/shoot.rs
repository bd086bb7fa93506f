//! Which shoots get a probe, and with which per-shoot settings (docs/behaviour.md §2.2, §2.3).
//!
//! The Cluster object carries the whole Shoot as raw JSON. We extract only the few fields the
//! lifecycle rules need into a [`ShootView`], so the rules are plain functions that can be tested
//! without an API server and so the controller never depends on Gardener's full Shoot schema.

use std::collections::BTreeMap;
use std::fmt;
use std::time::Duration;

use serde_json::Value;
use thiserror::Error;

use crate::config::ProberConfig;
use crate::duration::parse_go_duration_nanos;

/// Node condition types that make a node unfit to vote, unless a worker pool lists its own
/// (`machineControllerManager.nodeConditions`).
pub const DEFAULT_UNHEALTHY_CONDITIONS: [&str; 4] = [
    "KernelDeadlock",
    "ReadonlyFilesystem",
    "DiskPressure",
    "NetworkUnavailable",
];

/// The default unhealthy condition types as owned strings.
pub fn default_unhealthy_conditions() -> Vec<String> {
    DEFAULT_UNHEALTHY_CONDITIONS
        .iter()
        .map(|s| (*s).to_owned())
        .collect()
}

/// Why the Shoot embedded in a Cluster could not be read into a [`ShootView`].
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum ShootError {
    /// The Cluster has no (or a `null`) `spec.shoot`.
    #[error("Cluster has no spec.shoot (the embedded Shoot object is missing)")]
    MissingShoot,
    /// A field the lifecycle rules read is present but of the wrong type or unparsable.
    #[error("Cluster spec.shoot.{path}: {message}")]
    InvalidField {
        /// Path inside the Shoot, e.g. `spec.provider.workers[0].name`; empty when the Shoot
        /// itself is not a JSON object.
        path: String,
        /// What is wrong, e.g. `must be a boolean`.
        message: String,
    },
}

/// `status.lastOperation` of the Shoot.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LastOperation {
    /// `type`, e.g. `Create`, `Reconcile`, `Restore` or `Migrate`; empty when absent.
    pub type_: String,
    /// `state`, e.g. `Processing` or `Succeeded`; empty when absent.
    pub state: String,
}

/// One `spec.provider.workers[]` entry.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WorkerPool {
    /// The pool's `name`, matched against a node's `worker.gardener.cloud/pool` label; empty
    /// when absent.
    pub name: String,
    /// `machineControllerManager.nodeConditions`; `None`, and an empty list, mean "use the
    /// defaults" (the reference's `GetSliceOrDefault`, Gardener's meaning).
    pub node_conditions: Option<Vec<String>>,
}

/// The parts of a Shoot the prober's lifecycle rules look at.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct ShootView {
    /// `metadata.deletionTimestamp` is set: the probe is removed.
    pub deletion_requested: bool,
    /// `spec.hibernation.enabled` (false when absent): when true the probe is removed.
    pub hibernation_enabled: bool,
    /// `status.isHibernated` (false when absent): still true while a shoot wakes up, when no
    /// probe starts yet.
    pub is_hibernated: bool,
    /// `status.lastOperation`, when present; decides whether a probe may start.
    pub last_operation: Option<LastOperation>,
    /// `spec.provider.workers`, in order; empty (or absent) means no workers and no probe.
    pub workers: Vec<WorkerPool>,
    /// `spec.kubernetes.kubeControllerManager.nodeMonitorGracePeriod`.
    pub node_monitor_grace_period: Option<Duration>,
}

/// Navigates a JSON path, treating null like absent.
fn at<'a>(v: &'a Value, path: &[&str]) -> Option<&'a Value> {
    path.iter()
        .try_fold(v, |cur, key| cur.get(key))
        .filter(|v| !v.is_null())
}

fn invalid(path: &str, message: impl Into<String>) -> ShootError {
    ShootError::InvalidField {
        path: path.to_owned(),
        message: message.into(),
    }
}

fn opt_bool(shoot: &Value, path: &[&str]) -> Result<bool, ShootError> {
    match at(shoot, path) {
        None => Ok(false),
        Some(Value::Bool(b)) => Ok(*b),
        Some(_) => Err(invalid(&path.join("."), "must be a boolean")),
    }
}

fn opt_str<'a>(v: &'a Value, path: &[&str], full: &str) -> Result<Option<&'a str>, ShootError> {
    match at(v, path) {
        None => Ok(None),
        Some(Value::String(s)) => Ok(Some(s)),
        Some(_) => Err(invalid(full, "must be a string")),
    }
}

impl ShootView {
    /// Reads the Shoot embedded in a Cluster. `cluster_spec` is the Cluster's `.spec` (whose
    /// `shoot` field holds the Shoot); for convenience the whole Cluster object (with
    /// `.spec.shoot`) is accepted too.
    pub fn from_cluster_spec(cluster_spec: &Value) -> Result<ShootView, ShootError> {
        let shoot = at(cluster_spec, &["shoot"])
            .or_else(|| at(cluster_spec, &["spec", "shoot"]))
            .ok_or(ShootError::MissingShoot)?;
        Self::from_shoot(shoot)
    }

    /// Reads a Shoot object (`core.gardener.cloud/v1beta1`) given as JSON. Missing optional parts
    /// are tolerated; present parts of the wrong type are errors naming the field.
    pub fn from_shoot(shoot: &Value) -> Result<ShootView, ShootError> {
        if !shoot.is_object() {
            return Err(invalid("", "the embedded Shoot must be a JSON object"));
        }
        let deletion_requested = at(shoot, &["metadata", "deletionTimestamp"]).is_some();
        let hibernation_enabled = opt_bool(shoot, &["spec", "hibernation", "enabled"])?;
        let is_hibernated = opt_bool(shoot, &["status", "isHibernated"])?;

        let last_operation = match at(shoot, &["status", "lastOperation"]) {
            None => None,
            Some(op) => Some(LastOperation {
                type_: opt_str(op, &["type"], "status.lastOperation.type")?
                    .unwrap_or_default()
                    .to_owned(),
                state: opt_str(op, &["state"], "status.lastOperation.state")?
                    .unwrap_or_default()
                    .to_owned(),
            }),
        };

        let mut workers = Vec::new();
        match at(shoot, &["spec", "provider", "workers"]) {
            None => {}
            Some(Value::Array(items)) => {
                for (i, w) in items.iter().enumerate() {
                    let base = format!("spec.provider.workers[{i}]");
                    let name = opt_str(w, &["name"], &format!("{base}.name"))?
                        .unwrap_or_default()
                        .to_owned();
                    let cond_path = format!("{base}.machineControllerManager.nodeConditions");
                    let node_conditions =
                        match at(w, &["machineControllerManager", "nodeConditions"]) {
                            None => None,
                            Some(Value::Array(cs)) => Some(
                                cs.iter()
                                    .map(|c| {
                                        c.as_str().map(str::to_owned).ok_or_else(|| {
                                            invalid(&cond_path, "must be a list of strings")
                                        })
                                    })
                                    .collect::<Result<Vec<_>, _>>()?,
                            ),
                            Some(_) => return Err(invalid(&cond_path, "must be a list")),
                        };
                    workers.push(WorkerPool {
                        name,
                        node_conditions,
                    });
                }
            }
            Some(_) => return Err(invalid("spec.provider.workers", "must be a list")),
        }

        const GRACE: &str = "spec.kubernetes.kubeControllerManager.nodeMonitorGracePeriod";
        let node_monitor_grace_period = opt_str(
            shoot,
            &[
                "spec",
                "kubernetes",
                "kubeControllerManager",
                "nodeMonitorGracePeriod",
            ],
            GRACE,
        )?
        // A negative value is kept as zero: both are ignored by `effective_settings`. Gardener's
        // validation refuses either, so one only reaches us from an unvalidated object.
        .map(|s| {
            parse_go_duration_nanos(s)
                .map(|ns| Duration::from_nanos(u64::try_from(ns).unwrap_or(0)))
                .map_err(|e| invalid(GRACE, e.to_string()))
        })
        .transpose()?;

        Ok(ShootView {
            deletion_requested,
            hibernation_enabled,
            is_hibernated,
            last_operation,
            workers,
            node_monitor_grace_period,
        })
    }
}

/// Why a shoot must not have a probe (an existing one is stopped).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RemoveReason {
    /// The shoot's Cluster object no longer exists.
    ClusterGone,
    /// The Shoot has a `metadata.deletionTimestamp`.
    DeletionRequested,
    /// The Shoot's `spec.hibernation.enabled` is true.
    HibernationEnabled,
    /// The Shoot's `status.lastOperation.type` is `Migrate` (control-plane migration).
    Migrating,
    /// The Shoot has no `spec.provider.workers`.
    NoWorkers,
}

impl fmt::Display for RemoveReason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Self::ClusterGone => "the Cluster no longer exists",
            Self::DeletionRequested => "the shoot is being deleted",
            Self::HibernationEnabled => "the shoot is hibernated or hibernating",
            Self::Migrating => "the shoot's control plane is being migrated",
            Self::NoWorkers => "the shoot has no worker pools",
        })
    }
}

/// Why a probe is not started yet (an existing one is left alone).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum WaitReason {
    /// `status.isHibernated` is still true although hibernation is no longer enabled.
    WakingUp,
    /// The Shoot has no `status.lastOperation` yet.
    NoLastOperation,
    /// The last operation is a `Create` or `Restore` not yet in state `Succeeded`.
    OperationNotSucceeded {
        /// The operation's type: `Create` or `Restore`.
        type_: String,
        /// Its current state, e.g. `Processing`, `Error` or `Failed`.
        state: String,
    },
    /// The last operation is neither `Reconcile`, `Create`, `Restore` nor `Migrate`.
    UnsupportedOperation {
        /// The operation's type as found, possibly empty.
        type_: String,
    },
}

impl fmt::Display for WaitReason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::WakingUp => f.write_str("the shoot is waking up from hibernation"),
            Self::NoLastOperation => f.write_str("the shoot has no last operation yet"),
            Self::OperationNotSucceeded { type_, state } => write!(
                f,
                "the shoot's {type_} operation has not succeeded yet (state {state:?})"
            ),
            Self::UnsupportedOperation { type_ } => write!(
                f,
                "the shoot's last operation {type_:?} is not one a probe starts on"
            ),
        }
    }
}

/// The per-shoot settings a probe runs with. The controller compares these (PartialEq) to restart
/// a running probe when they change.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EffectiveProbeSettings {
    /// The shoot's KCM `nodeMonitorGracePeriod`, else the config's `kcmNodeMonitorGraceDuration`.
    pub node_monitor_grace: Duration,
    /// Worker pool name → unhealthy node condition types (defaults filled in).
    pub pool_conditions: BTreeMap<String, Vec<String>>,
}

impl EffectiveProbeSettings {
    /// The unhealthy condition types for a node's pool; unknown or missing pools get the defaults.
    pub fn conditions_for_pool(&self, pool: Option<&str>) -> Vec<&str> {
        match pool.and_then(|p| self.pool_conditions.get(p)) {
            Some(list) => list.iter().map(String::as_str).collect(),
            None => DEFAULT_UNHEALTHY_CONDITIONS.to_vec(),
        }
    }
}

/// What the controller should do with the probe of one shoot.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ProbeLifecycle {
    /// Stop any running probe and start none.
    Remove(RemoveReason),
    /// Run a probe with these settings (restart it if the settings changed).
    Run(EffectiveProbeSettings),
    /// Don't start a probe; leave a running one alone.
    NotYet(WaitReason),
}

/// Applies the lifecycle rules of docs/behaviour.md §2.2. `shoot` is `None` when the Cluster is
/// gone.
pub fn probe_lifecycle(shoot: Option<&ShootView>, base: &ProberConfig) -> ProbeLifecycle {
    let Some(shoot) = shoot else {
        return ProbeLifecycle::Remove(RemoveReason::ClusterGone);
    };
    if shoot.deletion_requested {
        return ProbeLifecycle::Remove(RemoveReason::DeletionRequested);
    }
    if shoot.hibernation_enabled {
        return ProbeLifecycle::Remove(RemoveReason::HibernationEnabled);
    }
    if shoot
        .last_operation
        .as_ref()
        .is_some_and(|op| op.type_ == "Migrate")
    {
        return ProbeLifecycle::Remove(RemoveReason::Migrating);
    }
    if shoot.workers.is_empty() {
        return ProbeLifecycle::Remove(RemoveReason::NoWorkers);
    }
    if shoot.is_hibernated {
        return ProbeLifecycle::NotYet(WaitReason::WakingUp);
    }
    let Some(op) = &shoot.last_operation else {
        return ProbeLifecycle::NotYet(WaitReason::NoLastOperation);
    };
    match op.type_.as_str() {
        "Reconcile" => {}
        "Create" | "Restore" if op.state == "Succeeded" => {}
        "Create" | "Restore" => {
            return ProbeLifecycle::NotYet(WaitReason::OperationNotSucceeded {
                type_: op.type_.clone(),
                state: op.state.clone(),
            });
        }
        _ => {
            return ProbeLifecycle::NotYet(WaitReason::UnsupportedOperation {
                type_: op.type_.clone(),
            });
        }
    }
    ProbeLifecycle::Run(effective_settings(shoot, base))
}

/// Per-shoot settings.
///
/// A grace period of zero or less from the Shoot is ignored and the config's value applies. The
/// reference takes it as it is, which makes every lease count as expired at once and scales the
/// shoot's controllers down while its nodes are healthy; Gardener's own validation refuses such a
/// value (`nodeMonitorGracePeriod must be larger than 0`), so it can only come from an object
/// that bypassed it, and protecting the shoot with the operator's configured grace is the safe
/// reading. (A deliberate difference from the reference.)
///
/// An empty `nodeConditions` list means the defaults, as in the reference (`GetSliceOrDefault`)
/// (which is what the Gardener API means by it).
pub fn effective_settings(shoot: &ShootView, base: &ProberConfig) -> EffectiveProbeSettings {
    let node_monitor_grace = shoot
        .node_monitor_grace_period
        .filter(|d| !d.is_zero())
        .unwrap_or(base.kcm_node_monitor_grace_duration);
    let pool_conditions = shoot
        .workers
        .iter()
        .map(|w| {
            (
                w.name.clone(),
                w.node_conditions
                    .clone()
                    .filter(|c| !c.is_empty())
                    .unwrap_or_else(default_unhealthy_conditions),
            )
        })
        .collect();
    EffectiveProbeSettings {
        node_monitor_grace,
        pool_conditions,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn base() -> ProberConfig {
        ProberConfig::from_yaml(
            "kubeConfigSecretName: s\ndependentResourceInfos:\n- ref: {apiVersion: apps/v1, kind: Deployment, name: kcm}\n  scaleUp: {level: 0}\n  scaleDown: {level: 0}\n",
        )
        .unwrap()
        .config
    }

    fn healthy() -> ShootView {
        ShootView {
            last_operation: Some(LastOperation {
                type_: "Reconcile".into(),
                state: "Processing".into(),
            }),
            workers: vec![WorkerPool {
                name: "pool-a".into(),
                node_conditions: None,
            }],
            ..Default::default()
        }
    }

    fn op(type_: &str, state: &str) -> Option<LastOperation> {
        Some(LastOperation {
            type_: type_.into(),
            state: state.into(),
        })
    }

    fn lifecycle(s: &ShootView) -> ProbeLifecycle {
        probe_lifecycle(Some(s), &base())
    }

    #[test]
    fn reads_every_field_from_cluster_spec() {
        let spec = json!({
            "shoot": {
                "metadata": {"name": "s", "deletionTimestamp": "2024-01-01T00:00:00Z"},
                "spec": {
                    "hibernation": {"enabled": true},
                    "kubernetes": {"kubeControllerManager": {"nodeMonitorGracePeriod": "2m"}},
                    "provider": {"workers": [
                        {"name": "a", "machineControllerManager": {"nodeConditions": ["ReadonlyFilesystem"]}},
                        {"name": "b"}
                    ]}
                },
                "status": {"isHibernated": true, "lastOperation": {"type": "Reconcile", "state": "Succeeded", "progress": 100}}
            }
        });
        let v = ShootView::from_cluster_spec(&spec).unwrap();
        assert!(v.deletion_requested && v.hibernation_enabled && v.is_hibernated);
        assert_eq!(v.last_operation, op("Reconcile", "Succeeded"));
        assert_eq!(v.node_monitor_grace_period, Some(Duration::from_secs(120)));
        assert_eq!(
            v.workers,
            [
                WorkerPool {
                    name: "a".into(),
                    node_conditions: Some(vec!["ReadonlyFilesystem".into()])
                },
                WorkerPool {
                    name: "b".into(),
                    node_conditions: None
                }
            ]
        );
        // The whole Cluster object works too.
        let cluster = json!({"spec": spec});
        assert_eq!(ShootView::from_cluster_spec(&cluster).unwrap(), v);
    }

    #[test]
    fn minimal_shoot_tolerates_missing_parts() {
        let v =
            ShootView::from_cluster_spec(&json!({"shoot": {"metadata": {"name": "s"}}})).unwrap();
        assert_eq!(v, ShootView::default());
    }

    #[test]
    fn missing_shoot_is_an_error_naming_it() {
        let err = ShootView::from_cluster_spec(&json!({"seed": {}})).unwrap_err();
        assert_eq!(err, ShootError::MissingShoot);
        assert!(err.to_string().contains("spec.shoot"));
        assert!(ShootView::from_cluster_spec(&json!({"shoot": null})).is_err());
    }

    #[test]
    fn wrongly_typed_fields_are_errors_naming_them() {
        let err = ShootView::from_cluster_spec(&json!({"shoot": {"spec": {"kubernetes": {"kubeControllerManager": {"nodeMonitorGracePeriod": "forever"}}}}})).unwrap_err();
        assert!(
            err.to_string()
                .contains("kubeControllerManager.nodeMonitorGracePeriod"),
            "{err}"
        );
        let err = ShootView::from_cluster_spec(
            &json!({"shoot": {"spec": {"hibernation": {"enabled": "yes"}}}}),
        )
        .unwrap_err();
        assert!(
            err.to_string().contains("spec.hibernation.enabled"),
            "{err}"
        );
    }

    #[test]
    fn cluster_gone_removes_probe() {
        assert_eq!(
            probe_lifecycle(None, &base()),
            ProbeLifecycle::Remove(RemoveReason::ClusterGone)
        );
    }

    #[test]
    fn deletion_timestamp_removes_probe() {
        let s = ShootView {
            deletion_requested: true,
            ..healthy()
        };
        assert_eq!(
            lifecycle(&s),
            ProbeLifecycle::Remove(RemoveReason::DeletionRequested)
        );
    }

    #[test]
    fn hibernation_enabled_removes_probe() {
        let s = ShootView {
            hibernation_enabled: true,
            ..healthy()
        };
        assert_eq!(
            lifecycle(&s),
            ProbeLifecycle::Remove(RemoveReason::HibernationEnabled)
        );
    }

    #[test]
    fn migrate_operation_removes_probe() {
        let s = ShootView {
            last_operation: op("Migrate", "Succeeded"),
            ..healthy()
        };
        assert_eq!(
            lifecycle(&s),
            ProbeLifecycle::Remove(RemoveReason::Migrating)
        );
    }

    #[test]
    fn no_workers_removes_probe() {
        let s = ShootView {
            workers: vec![],
            ..healthy()
        };
        assert_eq!(
            lifecycle(&s),
            ProbeLifecycle::Remove(RemoveReason::NoWorkers)
        );
    }

    #[test]
    fn waking_up_waits() {
        let s = ShootView {
            is_hibernated: true,
            ..healthy()
        };
        assert_eq!(lifecycle(&s), ProbeLifecycle::NotYet(WaitReason::WakingUp));
    }

    #[test]
    fn missing_last_operation_waits() {
        let s = ShootView {
            last_operation: None,
            ..healthy()
        };
        assert_eq!(
            lifecycle(&s),
            ProbeLifecycle::NotYet(WaitReason::NoLastOperation)
        );
    }

    #[test]
    fn create_or_restore_not_succeeded_waits() {
        for t in ["Create", "Restore"] {
            let s = ShootView {
                last_operation: op(t, "Processing"),
                ..healthy()
            };
            assert!(matches!(
                lifecycle(&s),
                ProbeLifecycle::NotYet(WaitReason::OperationNotSucceeded { .. })
            ));
        }
    }

    #[test]
    fn other_operation_types_wait() {
        let s = ShootView {
            last_operation: op("Delete", "Processing"),
            ..healthy()
        };
        assert_eq!(
            lifecycle(&s),
            ProbeLifecycle::NotYet(WaitReason::UnsupportedOperation {
                type_: "Delete".into()
            })
        );
    }

    #[test]
    fn reconcile_in_any_state_runs() {
        for state in ["Processing", "Error", "Succeeded", "Failed"] {
            let s = ShootView {
                last_operation: op("Reconcile", state),
                ..healthy()
            };
            assert!(matches!(lifecycle(&s), ProbeLifecycle::Run(_)), "{state}");
        }
    }

    #[test]
    fn create_or_restore_succeeded_runs() {
        for t in ["Create", "Restore"] {
            let s = ShootView {
                last_operation: op(t, "Succeeded"),
                ..healthy()
            };
            assert!(matches!(lifecycle(&s), ProbeLifecycle::Run(_)), "{t}");
        }
    }

    #[test]
    fn default_conditions_fill_pools_without_a_list_and_explicit_lists_replace_them() {
        let s = ShootView {
            workers: vec![
                WorkerPool {
                    name: "a".into(),
                    node_conditions: None,
                },
                WorkerPool {
                    name: "b".into(),
                    node_conditions: Some(vec!["DiskPressure".into()]),
                },
            ],
            ..healthy()
        };
        let ProbeLifecycle::Run(settings) = lifecycle(&s) else {
            panic!("should run")
        };
        assert_eq!(
            settings.pool_conditions["a"],
            default_unhealthy_conditions()
        );
        assert_eq!(settings.pool_conditions["b"], ["DiskPressure"]);
        assert_eq!(settings.conditions_for_pool(Some("b")), ["DiskPressure"]);
        assert_eq!(
            settings.conditions_for_pool(Some("unknown")),
            DEFAULT_UNHEALTHY_CONDITIONS
        );
        assert_eq!(
            settings.conditions_for_pool(None),
            DEFAULT_UNHEALTHY_CONDITIONS
        );
    }

    #[test]
    fn shoot_grace_period_overrides_config() {
        let s = ShootView {
            node_monitor_grace_period: Some(Duration::from_secs(90)),
            ..healthy()
        };
        let ProbeLifecycle::Run(settings) = lifecycle(&s) else {
            panic!("should run")
        };
        assert_eq!(settings.node_monitor_grace, Duration::from_secs(90));
        let ProbeLifecycle::Run(default) = lifecycle(&healthy()) else {
            panic!("should run")
        };
        assert_eq!(default.node_monitor_grace, Duration::from_secs(40));
        assert_ne!(
            settings, default,
            "a changed grace period must restart the probe"
        );
    }

    #[test]
    fn zero_shoot_grace_period_falls_back_to_config() {
        let s = ShootView {
            node_monitor_grace_period: Some(Duration::ZERO),
            ..healthy()
        };
        assert_eq!(
            effective_settings(&s, &base()).node_monitor_grace,
            Duration::from_secs(40)
        );
    }

    #[test]
    fn an_empty_node_conditions_list_means_the_defaults_as_in_the_reference() {
        // util.GetEffectiveNodeConditionsForWorkers → GetSliceOrDefault: len 0 → defaults.
        let spec = json!({"shoot": {"spec": {"provider": {"workers": [
            {"name": "a", "machineControllerManager": {"nodeConditions": []}},
            {"name": "b", "machineControllerManager": {}}
        ]}}}});
        let v = ShootView::from_cluster_spec(&spec).unwrap();
        let settings = effective_settings(&v, &base());
        assert_eq!(
            settings.pool_conditions["a"],
            default_unhealthy_conditions()
        );
        assert_eq!(
            settings.pool_conditions["b"],
            default_unhealthy_conditions()
        );
    }

    #[test]
    fn a_negative_shoot_grace_period_is_ignored_like_zero() {
        // The reference would use it and count every lease as expired (scaling a healthy shoot
        // down); Gardener refuses it, so the config's grace is the safe reading (argued difference).
        for grace in ["-1s", "0s", "0"] {
            let spec = json!({"shoot": {"spec": {"kubernetes": {"kubeControllerManager": {
                "nodeMonitorGracePeriod": grace
            }}}}});
            let v = ShootView::from_cluster_spec(&spec).unwrap();
            assert_eq!(v.node_monitor_grace_period, Some(Duration::ZERO), "{grace}");
            assert_eq!(
                effective_settings(&v, &base()).node_monitor_grace,
                Duration::from_secs(40),
                "{grace}"
            );
        }
    }

    #[test]
    fn reasons_read_as_plain_words() {
        assert_eq!(
            RemoveReason::HibernationEnabled.to_string(),
            "the shoot is hibernated or hibernating"
        );
        assert_eq!(
            WaitReason::WakingUp.to_string(),
            "the shoot is waking up from hibernation"
        );
    }
}
