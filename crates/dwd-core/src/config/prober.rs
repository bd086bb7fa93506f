//! The prober's configuration file (SPEC §2.4).
//!
//! Field names, defaults and the duration syntax match the reference so Gardener's rendered
//! `dep-config.yaml` loads unchanged. We are deliberately more lenient than the reference where the
//! spec grants a default (`kcmNodeMonitorGraceDuration`, `optional`) and stricter only where a value
//! could not possibly work (zero probe interval, fractions outside (0, 1]). `successThreshold` and
//! `failureThreshold` are ours (optional hysteresis, from the redesign document); the default of 1
//! keeps the reference behaviour.

use std::collections::BTreeSet;
use std::fmt;
use std::time::Duration;

use serde_json::Value;

use super::{
    ConfigError, Fields, Loaded, Problems, as_bool, as_duration, as_f64, as_u32, kind_of,
    load_mapping, required_string,
};

/// Default for `probeInterval`.
pub const DEFAULT_PROBE_INTERVAL: Duration = Duration::from_secs(10);
/// Default for `initialDelay`.
pub const DEFAULT_INITIAL_DELAY: Duration = Duration::from_secs(30);
/// Default for `probeTimeout`.
pub const DEFAULT_PROBE_TIMEOUT: Duration = Duration::from_secs(30);
/// Default for `backoffJitterFactor`.
pub const DEFAULT_BACKOFF_JITTER_FACTOR: f64 = 0.2;
/// Default for `kcmNodeMonitorGraceDuration` (KCM's own default `node-monitor-grace-period`).
pub const DEFAULT_KCM_NODE_MONITOR_GRACE: Duration = Duration::from_secs(40);
/// Default for `nodeLeaseFailureFraction`.
pub const DEFAULT_NODE_LEASE_FAILURE_FRACTION: f64 = 0.6;
/// Default for `scaleUp.initialDelay` / `scaleDown.initialDelay`.
pub const DEFAULT_SCALE_INITIAL_DELAY: Duration = Duration::ZERO;
/// Default for `scaleUp.timeout` / `scaleDown.timeout`.
pub const DEFAULT_SCALE_TIMEOUT: Duration = Duration::from_secs(30);
/// Default for `successThreshold` / `failureThreshold` (1 = act on every decision, as the reference).
pub const DEFAULT_THRESHOLD: u32 = 1;

/// The effective prober configuration, with defaults filled in.
#[derive(Debug, Clone, PartialEq)]
pub struct ProberConfig {
    pub kube_config_secret_name: String,
    pub probe_interval: Duration,
    pub initial_delay: Duration,
    pub probe_timeout: Duration,
    pub backoff_jitter_factor: f64,
    pub kcm_node_monitor_grace_duration: Duration,
    pub node_lease_failure_fraction: f64,
    pub dependent_resource_infos: Vec<DependentResourceInfo>,
    /// Consecutive scale-up decisions needed before scaling up (ours; default 1).
    pub success_threshold: u32,
    /// Consecutive scale-down decisions needed before scaling down (ours; default 1).
    pub failure_threshold: u32,
}

/// One scalable target and how to scale it in each direction.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DependentResourceInfo {
    pub target: ResourceRef,
    /// A missing optional target counts as scaled; a missing required one fails its level.
    pub optional: bool,
    pub scale_up: ScaleInfo,
    pub scale_down: ScaleInfo,
}

/// `autoscaling/v1 CrossVersionObjectReference`: a target in the shoot namespace.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct ResourceRef {
    pub api_version: String,
    pub kind: String,
    pub name: String,
}

impl fmt::Display for ResourceRef {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} {}/{}", self.api_version, self.kind, self.name)
    }
}

/// How to scale one target in one direction.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ScaleInfo {
    /// Levels run in ascending order; targets of one level run concurrently.
    pub level: u32,
    pub initial_delay: Duration,
    pub timeout: Duration,
}

impl ProberConfig {
    /// Loads and validates a prober config. On success unknown fields are returned as warnings; on
    /// failure every problem found is reported at once.
    pub fn from_yaml(text: &str) -> Result<Loaded<ProberConfig>, ConfigError> {
        let map = load_mapping(text)?;
        let mut problems = Problems::default();
        let mut warnings = Vec::new();
        let mut f = Fields::new(&map, "");

        let kube_config_secret_name = required_string(
            f.get("kubeConfigSecretName"),
            "kubeConfigSecretName",
            &mut problems,
        );
        let probe_interval = positive_duration(
            &mut f,
            "probeInterval",
            DEFAULT_PROBE_INTERVAL,
            &mut problems,
        );
        let initial_delay = f
            .get("initialDelay")
            .map_or(Some(DEFAULT_INITIAL_DELAY), |v| {
                as_duration(v, "initialDelay", &mut problems)
            });
        let probe_timeout =
            positive_duration(&mut f, "probeTimeout", DEFAULT_PROBE_TIMEOUT, &mut problems);
        let kcm_grace = match f.get("kcmNodeMonitorGraceDuration") {
            None => Some(DEFAULT_KCM_NODE_MONITOR_GRACE),
            Some(v) => match as_duration(v, "kcmNodeMonitorGraceDuration", &mut problems) {
                Some(Duration::ZERO) => {
                    problems.push(
                        "kcmNodeMonitorGraceDuration",
                        "must be non-zero (every lease would count as expired at once)",
                    );
                    None
                }
                other => other,
            },
        };
        let backoff_jitter_factor = match f.get("backoffJitterFactor") {
            None => Some(DEFAULT_BACKOFF_JITTER_FACTOR),
            Some(v) => as_f64(v, "backoffJitterFactor", &mut problems).and_then(|j| {
                if j < 0.0 {
                    problems.push("backoffJitterFactor", format!("must be >= 0, got {j}"));
                    None
                } else {
                    Some(j)
                }
            }),
        };
        let node_lease_failure_fraction = match f.get("nodeLeaseFailureFraction") {
            None => Some(DEFAULT_NODE_LEASE_FAILURE_FRACTION),
            Some(v) => as_f64(v, "nodeLeaseFailureFraction", &mut problems).and_then(|x| {
                if x > 0.0 && x <= 1.0 {
                    Some(x)
                } else {
                    problems.push(
                        "nodeLeaseFailureFraction",
                        format!("must be in (0, 1], got {x}"),
                    );
                    None
                }
            }),
        };
        let success_threshold = threshold(&mut f, "successThreshold", &mut problems);
        let failure_threshold = threshold(&mut f, "failureThreshold", &mut problems);
        let infos = dependent_resource_infos(
            f.get("dependentResourceInfos"),
            &mut problems,
            &mut warnings,
        );
        f.finish(&mut warnings);

        if let Some(infos) = &infos {
            warn_duplicate_targets(infos, &mut warnings);
        }

        // Every `None` below has a matching problem, so this only assembles when all are present.
        let config = match (
            kube_config_secret_name,
            probe_interval,
            initial_delay,
            probe_timeout,
            backoff_jitter_factor,
            kcm_grace,
            node_lease_failure_fraction,
            infos,
            success_threshold,
            failure_threshold,
        ) {
            (
                Some(kube_config_secret_name),
                Some(probe_interval),
                Some(initial_delay),
                Some(probe_timeout),
                Some(backoff_jitter_factor),
                Some(kcm_node_monitor_grace_duration),
                Some(node_lease_failure_fraction),
                Some(dependent_resource_infos),
                Some(success_threshold),
                Some(failure_threshold),
            ) if problems.0.is_empty() => ProberConfig {
                kube_config_secret_name,
                probe_interval,
                initial_delay,
                probe_timeout,
                backoff_jitter_factor,
                kcm_node_monitor_grace_duration,
                node_lease_failure_fraction,
                dependent_resource_infos,
                success_threshold,
                failure_threshold,
            },
            _ => {
                if problems.0.is_empty() {
                    // Defensive: a missing value without a recorded problem would be our bug; still
                    // refuse rather than run with a half-built config.
                    problems.push("", "config could not be assembled");
                }
                return Err(ConfigError::Invalid {
                    problems: problems.0,
                });
            }
        };
        problems.into_result(Loaded { config, warnings })
    }
}

/// A duration that defaults when absent and must be strictly positive when given (an interval or
/// timeout of zero would spin or fail every time).
fn positive_duration(
    f: &mut Fields<'_>,
    key: &'static str,
    default: Duration,
    problems: &mut Problems,
) -> Option<Duration> {
    match f.get(key) {
        None => Some(default),
        Some(v) => match as_duration(v, key, problems) {
            Some(Duration::ZERO) => {
                problems.push(key, "must be > 0");
                None
            }
            other => other,
        },
    }
}

fn threshold(f: &mut Fields<'_>, key: &'static str, problems: &mut Problems) -> Option<u32> {
    match f.get(key) {
        None => Some(DEFAULT_THRESHOLD),
        Some(v) => match as_u32(v, key, problems) {
            Some(0) => {
                problems.push(key, "must be >= 1");
                None
            }
            other => other,
        },
    }
}

fn dependent_resource_infos(
    v: Option<&Value>,
    problems: &mut Problems,
    warnings: &mut Vec<String>,
) -> Option<Vec<DependentResourceInfo>> {
    const PATH: &str = "dependentResourceInfos";
    let Some(v) = v else {
        problems.push(PATH, "required (list the targets to scale)");
        return None;
    };
    let Value::Array(items) = v else {
        problems.push(PATH, format!("must be a list, got {}", kind_of(v)));
        return None;
    };
    if items.is_empty() {
        problems.push(PATH, "must not be empty");
        return None;
    }
    let mut out = Vec::with_capacity(items.len());
    let mut all_ok = true;
    for (i, item) in items.iter().enumerate() {
        let path = format!("{PATH}[{i}]");
        match dependent_resource_info(item, &path, problems, warnings) {
            Some(info) => out.push(info),
            None => all_ok = false,
        }
    }
    all_ok.then_some(out)
}

fn dependent_resource_info(
    v: &Value,
    path: &str,
    problems: &mut Problems,
    warnings: &mut Vec<String>,
) -> Option<DependentResourceInfo> {
    let Value::Object(map) = v else {
        problems.push(path, format!("must be a mapping, got {}", kind_of(v)));
        return None;
    };
    let mut f = Fields::new(map, path);
    let ref_path = f.path_of("ref");
    let target = match f.get("ref") {
        None => {
            problems.push(&ref_path, "required");
            None
        }
        Some(r) => resource_ref(r, &ref_path, problems, warnings),
    };
    let optional_path = f.path_of("optional");
    let optional = f
        .get("optional")
        .map_or(Some(false), |o| as_bool(o, &optional_path, problems));
    let up_path = f.path_of("scaleUp");
    let scale_up = scale_info(f.get("scaleUp"), &up_path, problems, warnings);
    let down_path = f.path_of("scaleDown");
    let scale_down = scale_info(f.get("scaleDown"), &down_path, problems, warnings);
    f.finish(warnings);
    Some(DependentResourceInfo {
        target: target?,
        optional: optional?,
        scale_up: scale_up?,
        scale_down: scale_down?,
    })
}

fn resource_ref(
    v: &Value,
    path: &str,
    problems: &mut Problems,
    warnings: &mut Vec<String>,
) -> Option<ResourceRef> {
    let Value::Object(map) = v else {
        problems.push(path, format!("must be a mapping, got {}", kind_of(v)));
        return None;
    };
    let mut f = Fields::new(map, path);
    let api_version_path = f.path_of("apiVersion");
    let api_version =
        required_string(f.get("apiVersion"), &api_version_path, problems).and_then(|a| {
            if valid_api_version(&a) {
                Some(a)
            } else {
                problems.push(
                    &api_version_path,
                    format!("must look like \"group/version\" or \"version\", got {a:?}"),
                );
                None
            }
        });
    let kind_path = f.path_of("kind");
    let kind = required_string(f.get("kind"), &kind_path, problems);
    let name_path = f.path_of("name");
    let name = required_string(f.get("name"), &name_path, problems);
    f.finish(warnings);
    Some(ResourceRef {
        api_version: api_version?,
        kind: kind?,
        name: name?,
    })
}

/// `apps/v1` or `v1`: no spaces, at most one slash, no empty side.
fn valid_api_version(s: &str) -> bool {
    let mut parts = s.split('/');
    let ok_part = |p: &str| !p.is_empty() && !p.chars().any(char::is_whitespace);
    match (parts.next(), parts.next(), parts.next()) {
        (Some(v), None, None) => ok_part(v),
        (Some(g), Some(v), None) => ok_part(g) && ok_part(v),
        _ => false,
    }
}

fn scale_info(
    v: Option<&Value>,
    path: &str,
    problems: &mut Problems,
    warnings: &mut Vec<String>,
) -> Option<ScaleInfo> {
    let Some(v) = v else {
        problems.push(path, "required");
        return None;
    };
    let Value::Object(map) = v else {
        problems.push(path, format!("must be a mapping, got {}", kind_of(v)));
        return None;
    };
    let mut f = Fields::new(map, path);
    let level_path = f.path_of("level");
    let level = match f.get("level") {
        None => {
            problems.push(&level_path, "required");
            None
        }
        Some(l) => as_u32(l, &level_path, problems),
    };
    let delay_path = f.path_of("initialDelay");
    let initial_delay = f
        .get("initialDelay")
        .map_or(Some(DEFAULT_SCALE_INITIAL_DELAY), |d| {
            as_duration(d, &delay_path, problems)
        });
    let timeout_path = f.path_of("timeout");
    let timeout = f.get("timeout").map_or(Some(DEFAULT_SCALE_TIMEOUT), |d| {
        as_duration(d, &timeout_path, problems)
    });
    f.finish(warnings);
    Some(ScaleInfo {
        level: level?,
        initial_delay: initial_delay?,
        timeout: timeout?,
    })
}

/// The same target listed twice would be scaled twice per flow; legal, but almost certainly a
/// copy-paste slip worth pointing out.
fn warn_duplicate_targets(infos: &[DependentResourceInfo], warnings: &mut Vec<String>) {
    let mut seen = BTreeSet::new();
    for (i, info) in infos.iter().enumerate() {
        if !seen.insert(&info.target) {
            warnings.push(format!(
                "dependentResourceInfos[{i}].ref: {} is listed more than once",
                info.target
            ));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::FieldProblem;

    const SEED_003_EXAMPLE: &str = r#"
kubeConfigSecretName: shoot-access-dependency-watchdog-probe
kcmNodeMonitorGraceDuration: 40s
dependentResourceInfos:
  - ref: 
      kind: "Deployment"
      name: "kube-controller-manager"
      apiVersion: "apps/v1"
    scaleUp: 
      level: 1 
    scaleDown: 
      level: 0 
  - ref:
      kind: "Deployment"
      name: "machine-controller-manager"
      apiVersion: "apps/v1"
    scaleUp:
      level: 1
    scaleDown:
      level: 1
  - ref:
      kind: "Deployment"
      name: "cluster-autoscaler"
      apiVersion: "apps/v1"
    scaleUp:
      level: 0
    scaleDown:
      level: 2
"#;

    const GARDENER_FULL: &str = r#"
kubeConfigSecretName: shoot-access-dependency-watchdog-probe
probeInterval: 20s
initialDelay: 5s
probeTimeout: 10s
backoffJitterFactor: 0.2
kcmNodeMonitorGraceDuration: 40s
nodeLeaseFailureFraction: 0.6
dependentResourceInfos:
- ref: {kind: Deployment, name: kube-controller-manager, apiVersion: apps/v1}
  optional: false
  scaleUp: {level: 1, initialDelay: 30s, timeout: 30s}
  scaleDown: {level: 0, initialDelay: 0s, timeout: 30s}
- ref: {kind: Deployment, name: machine-controller-manager, apiVersion: apps/v1}
  optional: false
  scaleUp: {level: 1, initialDelay: 30s, timeout: 30s}
  scaleDown: {level: 1, initialDelay: 0s, timeout: 30s}
- ref: {kind: Deployment, name: cluster-autoscaler, apiVersion: apps/v1}
  optional: true
  scaleUp: {level: 0, initialDelay: 0s, timeout: 30s}
  scaleDown: {level: 2, initialDelay: 0s, timeout: 30s}
"#;

    fn problems_of(yaml: &str) -> Vec<FieldProblem> {
        match ProberConfig::from_yaml(yaml) {
            Err(ConfigError::Invalid { problems }) => problems,
            other => panic!("expected Invalid, got {other:?}"),
        }
    }

    fn has(problems: &[FieldProblem], path: &str, needle: &str) -> bool {
        problems
            .iter()
            .any(|p| p.path == path && p.message.contains(needle))
    }

    #[test]
    fn seed_example_with_three_levelled_targets_loads_with_defaults() {
        let loaded = ProberConfig::from_yaml(SEED_003_EXAMPLE).unwrap();
        assert!(loaded.warnings.is_empty(), "{:?}", loaded.warnings);
        let c = loaded.config;
        assert_eq!(
            c.kube_config_secret_name,
            "shoot-access-dependency-watchdog-probe"
        );
        assert_eq!(c.probe_interval, Duration::from_secs(10));
        assert_eq!(c.initial_delay, Duration::from_secs(30));
        assert_eq!(c.probe_timeout, Duration::from_secs(30));
        assert_eq!(c.backoff_jitter_factor, 0.2);
        assert_eq!(c.kcm_node_monitor_grace_duration, Duration::from_secs(40));
        assert_eq!(c.node_lease_failure_fraction, 0.6);
        assert_eq!(c.success_threshold, 1);
        assert_eq!(c.failure_threshold, 1);
        let names: Vec<_> = c
            .dependent_resource_infos
            .iter()
            .map(|i| i.target.name.as_str())
            .collect();
        assert_eq!(
            names,
            [
                "kube-controller-manager",
                "machine-controller-manager",
                "cluster-autoscaler"
            ]
        );
        let ca = &c.dependent_resource_infos[2];
        assert_eq!(ca.target.api_version, "apps/v1");
        assert_eq!(ca.target.kind, "Deployment");
        assert!(!ca.optional);
        assert_eq!(
            ca.scale_up,
            ScaleInfo {
                level: 0,
                initial_delay: Duration::ZERO,
                timeout: Duration::from_secs(30)
            }
        );
        assert_eq!(ca.scale_down.level, 2);
    }

    #[test]
    fn gardener_style_full_config_loads_every_field() {
        let loaded = ProberConfig::from_yaml(GARDENER_FULL).unwrap();
        assert!(loaded.warnings.is_empty(), "{:?}", loaded.warnings);
        let c = loaded.config;
        assert_eq!(c.probe_interval, Duration::from_secs(20));
        assert_eq!(c.initial_delay, Duration::from_secs(5));
        assert_eq!(c.probe_timeout, Duration::from_secs(10));
        assert_eq!(c.dependent_resource_infos.len(), 3);
        let kcm = &c.dependent_resource_infos[0];
        assert_eq!(kcm.scale_up.initial_delay, Duration::from_secs(30));
        assert_eq!(kcm.scale_down.initial_delay, Duration::ZERO);
        assert!(c.dependent_resource_infos[2].optional);
    }

    #[test]
    fn kcm_grace_defaults_to_40s_when_absent() {
        let yaml = SEED_003_EXAMPLE.replace("kcmNodeMonitorGraceDuration: 40s\n", "");
        let c = ProberConfig::from_yaml(&yaml).unwrap().config;
        assert_eq!(c.kcm_node_monitor_grace_duration, Duration::from_secs(40));
    }

    #[test]
    fn thresholds_are_read_when_given() {
        let yaml = format!("{GARDENER_FULL}successThreshold: 2\nfailureThreshold: 3\n");
        let c = ProberConfig::from_yaml(&yaml).unwrap().config;
        assert_eq!((c.success_threshold, c.failure_threshold), (2, 3));
    }

    #[test]
    fn redesign_doc_replicas_field_loads_with_unknown_field_warnings() {
        let yaml = r#"
name: "shoot-kube-apiserver"
kubeConfigSecretName: probe-secret
dependentResourceInfos:
  - ref: {kind: "Deployment", name: "kube-controller-manager", apiVersion: "apps/v1"}
    scaleUp:
      level: 1
      initialDelay: 10s
      timeout: 60s
      replicas: 1
    scaleDown:
      level: 0
      initialDelay: 15s
      timeout: 45s
      replicas: 0
"#;
        let loaded = ProberConfig::from_yaml(yaml).unwrap();
        assert_eq!(
            loaded.warnings,
            [
                "dependentResourceInfos[0].scaleUp.replicas: unknown field, ignored",
                "dependentResourceInfos[0].scaleDown.replicas: unknown field, ignored",
                "name: unknown field, ignored",
            ]
        );
        let up = &loaded.config.dependent_resource_infos[0].scale_up;
        assert_eq!(up.timeout, Duration::from_secs(60));
    }

    #[test]
    fn missing_required_fields_are_each_named() {
        let problems = problems_of("probeInterval: 10s\n");
        assert!(has(&problems, "kubeConfigSecretName", "required"));
        assert!(has(&problems, "dependentResourceInfos", "required"));
    }

    #[test]
    fn empty_dependent_resource_infos_is_rejected() {
        let problems = problems_of("kubeConfigSecretName: s\ndependentResourceInfos: []\n");
        assert_eq!(
            problems,
            [FieldProblem {
                path: "dependentResourceInfos".into(),
                message: "must not be empty".into()
            }]
        );
    }

    #[test]
    fn missing_scale_down_is_named_by_index() {
        let yaml = r#"
kubeConfigSecretName: s
dependentResourceInfos:
- ref: {kind: Deployment, name: a, apiVersion: apps/v1}
  scaleUp: {level: 0}
  scaleDown: {level: 0}
- ref: {kind: Deployment, name: b, apiVersion: apps/v1}
  scaleUp: {level: 0}
"#;
        let problems = problems_of(yaml);
        assert_eq!(problems.len(), 1);
        assert_eq!(
            problems[0].to_string(),
            "dependentResourceInfos[1].scaleDown: required"
        );
    }

    #[test]
    fn zero_kcm_grace_is_rejected() {
        let yaml = GARDENER_FULL.replace(
            "kcmNodeMonitorGraceDuration: 40s",
            "kcmNodeMonitorGraceDuration: 0s",
        );
        assert!(has(
            &problems_of(&yaml),
            "kcmNodeMonitorGraceDuration",
            "must be non-zero"
        ));
    }

    #[test]
    fn invalid_duration_quotes_the_value() {
        let yaml = GARDENER_FULL.replace("probeInterval: 20s", "probeInterval: 10x");
        let problems = problems_of(&yaml);
        assert_eq!(problems.len(), 1);
        assert!(problems[0].message.contains("\"10x\""), "{}", problems[0]);
        assert_eq!(problems[0].path, "probeInterval");
    }

    #[test]
    fn bare_number_durations_are_rejected() {
        let yaml = GARDENER_FULL.replace("probeTimeout: 10s", "probeTimeout: 10");
        assert!(has(
            &problems_of(&yaml),
            "probeTimeout",
            "got the bare number 10"
        ));
    }

    #[test]
    fn zero_probe_interval_and_timeout_are_rejected() {
        let yaml = GARDENER_FULL
            .replace("probeInterval: 20s", "probeInterval: 0s")
            .replace("probeTimeout: 10s", "probeTimeout: \"0\"");
        let problems = problems_of(&yaml);
        assert!(has(&problems, "probeInterval", "must be > 0"));
        assert!(has(&problems, "probeTimeout", "must be > 0"));
    }

    #[test]
    fn failure_fraction_outside_zero_one_is_rejected() {
        for bad in ["0", "0.0", "1.5", "-0.1"] {
            let yaml = GARDENER_FULL.replace(
                "nodeLeaseFailureFraction: 0.6",
                &format!("nodeLeaseFailureFraction: {bad}"),
            );
            assert!(
                has(
                    &problems_of(&yaml),
                    "nodeLeaseFailureFraction",
                    "must be in (0, 1]"
                ),
                "{bad}"
            );
        }
        let yaml = GARDENER_FULL.replace(
            "nodeLeaseFailureFraction: 0.6",
            "nodeLeaseFailureFraction: 1",
        );
        assert_eq!(
            ProberConfig::from_yaml(&yaml)
                .unwrap()
                .config
                .node_lease_failure_fraction,
            1.0
        );
    }

    #[test]
    fn negative_jitter_is_rejected() {
        let yaml = GARDENER_FULL.replace("backoffJitterFactor: 0.2", "backoffJitterFactor: -0.5");
        assert!(has(
            &problems_of(&yaml),
            "backoffJitterFactor",
            "must be >= 0"
        ));
    }

    #[test]
    fn levels_must_be_non_negative_integers() {
        let yaml = r#"
kubeConfigSecretName: s
dependentResourceInfos:
- ref: {kind: Deployment, name: a, apiVersion: apps/v1}
  scaleUp: {level: -1}
  scaleDown: {level: 1.5}
- ref: {kind: Deployment, name: b, apiVersion: apps/v1}
  scaleUp: {level: "one"}
  scaleDown: {}
"#;
        let problems = problems_of(yaml);
        assert!(has(
            &problems,
            "dependentResourceInfos[0].scaleUp.level",
            "non-negative integer, got -1"
        ));
        assert!(has(
            &problems,
            "dependentResourceInfos[0].scaleDown.level",
            "non-negative integer, got 1.5"
        ));
        assert!(has(
            &problems,
            "dependentResourceInfos[1].scaleUp.level",
            "non-negative integer, got the string \"one\""
        ));
        assert!(has(
            &problems,
            "dependentResourceInfos[1].scaleDown.level",
            "required"
        ));
    }

    #[test]
    fn ref_fields_are_required_and_checked() {
        let yaml = r#"
kubeConfigSecretName: s
dependentResourceInfos:
- ref: {kind: "", apiVersion: "a/b/c"}
  scaleUp: {level: 0}
  scaleDown: {level: 0}
- scaleUp: {level: 0}
  scaleDown: {level: 0}
  optional: "yes"
"#;
        let problems = problems_of(yaml);
        assert!(has(
            &problems,
            "dependentResourceInfos[0].ref.name",
            "required"
        ));
        assert!(has(
            &problems,
            "dependentResourceInfos[0].ref.kind",
            "required"
        ));
        assert!(has(
            &problems,
            "dependentResourceInfos[0].ref.apiVersion",
            "group/version"
        ));
        assert!(has(&problems, "dependentResourceInfos[1].ref", "required"));
        assert!(has(
            &problems,
            "dependentResourceInfos[1].optional",
            "must be true or false"
        ));
    }

    #[test]
    fn thresholds_must_be_at_least_one() {
        let yaml = format!("{GARDENER_FULL}successThreshold: 0\nfailureThreshold: -2\n");
        let problems = problems_of(&yaml);
        assert!(has(&problems, "successThreshold", "must be >= 1"));
        assert!(has(&problems, "failureThreshold", "non-negative integer"));
    }

    #[test]
    fn many_errors_are_reported_at_once() {
        let yaml = r#"
probeInterval: 10x
probeTimeout: 5
kcmNodeMonitorGraceDuration: 0s
nodeLeaseFailureFraction: 2
backoffJitterFactor: -1
dependentResourceInfos:
- ref: {kind: Deployment, apiVersion: apps/v1}
  scaleUp: {level: 0, timeout: soon}
"#;
        let err = ProberConfig::from_yaml(yaml).unwrap_err();
        let ConfigError::Invalid { problems } = &err else {
            panic!("{err:?}")
        };
        let paths: BTreeSet<_> = problems.iter().map(|p| p.path.as_str()).collect();
        for expected in [
            "kubeConfigSecretName",
            "probeInterval",
            "probeTimeout",
            "kcmNodeMonitorGraceDuration",
            "nodeLeaseFailureFraction",
            "backoffJitterFactor",
            "dependentResourceInfos[0].ref.name",
            "dependentResourceInfos[0].scaleUp.timeout",
            "dependentResourceInfos[0].scaleDown",
        ] {
            assert!(
                paths.contains(expected),
                "{expected} missing from {paths:?}"
            );
        }
        let text = err.to_string();
        assert!(text.starts_with("invalid config (9 problems):"), "{text}");
        assert!(
            text.contains("\n  - kubeConfigSecretName: required"),
            "{text}"
        );
    }

    #[test]
    fn wrongly_typed_containers_are_problems_not_crashes() {
        let problems = problems_of("kubeConfigSecretName: [a]\ndependentResourceInfos: {a: 1}\n");
        assert!(has(&problems, "kubeConfigSecretName", "must be a string"));
        assert!(has(&problems, "dependentResourceInfos", "must be a list"));
        let problems =
            problems_of("kubeConfigSecretName: s\ndependentResourceInfos: [3, {ref: x}]\n");
        assert!(has(
            &problems,
            "dependentResourceInfos[0]",
            "must be a mapping"
        ));
        assert!(has(
            &problems,
            "dependentResourceInfos[1].ref",
            "must be a mapping"
        ));
    }

    #[test]
    fn null_optional_fields_get_defaults() {
        let yaml = GARDENER_FULL.replace("probeInterval: 20s", "probeInterval:");
        let c = ProberConfig::from_yaml(&yaml).unwrap().config;
        assert_eq!(c.probe_interval, DEFAULT_PROBE_INTERVAL);
    }

    #[test]
    fn duplicate_targets_load_with_a_warning() {
        let yaml = r#"
kubeConfigSecretName: s
dependentResourceInfos:
- ref: {kind: Deployment, name: a, apiVersion: apps/v1}
  scaleUp: {level: 0}
  scaleDown: {level: 0}
- ref: {kind: Deployment, name: a, apiVersion: apps/v1}
  scaleUp: {level: 1}
  scaleDown: {level: 1}
"#;
        let loaded = ProberConfig::from_yaml(yaml).unwrap();
        assert_eq!(loaded.warnings.len(), 1);
        assert!(loaded.warnings[0].starts_with("dependentResourceInfos[1].ref:"));
    }
}
