//! The weeder's configuration file (SPEC §3).
//!
//! Maps a service name to the selectors of pods that depend on it. Because the weeder deletes the
//! pods these selectors pick, each selector is validated up front and an empty selector (which
//! would select every pod in the namespace) is refused; the reference accepts it, but safety wins
//! over symmetry here.

use std::collections::BTreeMap;
use std::time::Duration;

use serde_json::Value;

use super::{
    ConfigError, Fields, Loaded, Problems, as_duration, as_string, describe, join, kind_of,
    load_mapping,
};
use crate::selector::{PodSelector, RawRequirement};

/// Default for `watchDuration`.
pub const DEFAULT_WATCH_DURATION: Duration = Duration::from_secs(300);

/// The effective weeder configuration, with defaults filled in.
#[derive(Debug, Clone, PartialEq)]
pub struct WeederConfig {
    /// How long a weeder keeps deleting crash-looping dependants after its service came back.
    pub watch_duration: Duration,
    /// Service name → selectors of the pods that depend on it.
    pub services_and_dependant_selectors: BTreeMap<String, DependantSelectors>,
}

#[derive(Debug, Clone, PartialEq)]
pub struct DependantSelectors {
    pub pod_selectors: Vec<PodSelector>,
}

impl WeederConfig {
    /// Loads and validates a weeder config, reporting every problem at once and unknown fields as
    /// warnings.
    pub fn from_yaml(text: &str) -> Result<Loaded<WeederConfig>, ConfigError> {
        let map = load_mapping(text)?;
        let mut problems = Problems::default();
        let mut warnings = Vec::new();
        let mut f = Fields::new(&map, "");

        let watch_duration = match f.get("watchDuration") {
            None => Some(DEFAULT_WATCH_DURATION),
            Some(v) => match as_duration(v, "watchDuration", &mut problems) {
                Some(Duration::ZERO) => {
                    problems.push("watchDuration", "must be > 0");
                    None
                }
                other => other,
            },
        };
        let services = services(
            f.get("servicesAndDependantSelectors"),
            &mut problems,
            &mut warnings,
        );
        f.finish(&mut warnings);

        match (watch_duration, services) {
            (Some(watch_duration), Some(services_and_dependant_selectors))
                if problems.0.is_empty() =>
            {
                Ok(Loaded {
                    config: WeederConfig {
                        watch_duration,
                        services_and_dependant_selectors,
                    },
                    warnings,
                })
            }
            _ => {
                if problems.0.is_empty() {
                    problems.push("", "config could not be assembled");
                }
                Err(ConfigError::Invalid {
                    problems: problems.0,
                })
            }
        }
    }
}

fn services(
    v: Option<&Value>,
    problems: &mut Problems,
    warnings: &mut Vec<String>,
) -> Option<BTreeMap<String, DependantSelectors>> {
    const PATH: &str = "servicesAndDependantSelectors";
    let Some(v) = v else {
        problems.push(
            PATH,
            "required (map each service name to its dependants' podSelectors)",
        );
        return None;
    };
    let Value::Object(map) = v else {
        problems.push(PATH, format!("must be a mapping, got {}", kind_of(v)));
        return None;
    };
    if map.is_empty() {
        problems.push(PATH, "must name at least one service");
        return None;
    }
    let mut out = BTreeMap::new();
    let mut all_ok = true;
    for (service, deps) in map {
        let path = join(PATH, service);
        if let Err(e) = validate_service_name(service) {
            problems.push(&path, e);
            all_ok = false;
        }
        match dependant_selectors(deps, &path, problems, warnings) {
            Some(d) => {
                out.insert(service.clone(), d);
            }
            None => all_ok = false,
        }
    }
    all_ok.then_some(out)
}

/// Service names are RFC 1035 labels; anything else can never match an EndpointSlice's
/// `kubernetes.io/service-name` label, so it is a typo worth failing on.
fn validate_service_name(name: &str) -> Result<(), String> {
    let ok = !name.is_empty()
        && name.len() <= 63
        && name
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
        && name.starts_with(|c: char| c.is_ascii_lowercase())
        && !name.ends_with('-');
    if ok {
        Ok(())
    } else {
        Err(format!(
            "{name:?} is not a valid service name (lowercase alphanumerics and '-', starting with a letter, at most 63 characters)"
        ))
    }
}

fn dependant_selectors(
    v: &Value,
    path: &str,
    problems: &mut Problems,
    warnings: &mut Vec<String>,
) -> Option<DependantSelectors> {
    let Value::Object(map) = v else {
        problems.push(path, format!("must be a mapping, got {}", kind_of(v)));
        return None;
    };
    let mut f = Fields::new(map, path);
    let sel_path = f.path_of("podSelectors");
    let selectors = match f.get("podSelectors") {
        None => {
            problems.push(&sel_path, "required");
            None
        }
        Some(Value::Array(items)) if items.is_empty() => {
            problems.push(&sel_path, "must not be empty");
            None
        }
        Some(Value::Array(items)) => {
            let mut out = Vec::with_capacity(items.len());
            let mut all_ok = true;
            for (i, item) in items.iter().enumerate() {
                match pod_selector(item, &format!("{sel_path}[{i}]"), problems, warnings) {
                    Some(s) => out.push(s),
                    None => all_ok = false,
                }
            }
            all_ok.then_some(out)
        }
        Some(other) => {
            problems.push(&sel_path, format!("must be a list, got {}", kind_of(other)));
            None
        }
    };
    f.finish(warnings);
    selectors.map(|pod_selectors| DependantSelectors { pod_selectors })
}

fn pod_selector(
    v: &Value,
    path: &str,
    problems: &mut Problems,
    warnings: &mut Vec<String>,
) -> Option<PodSelector> {
    let Value::Object(map) = v else {
        problems.push(path, format!("must be a mapping, got {}", kind_of(v)));
        return None;
    };
    let mut f = Fields::new(map, path);
    let mut shape_ok = true;

    let labels_path = f.path_of("matchLabels");
    let mut labels = BTreeMap::new();
    match f.get("matchLabels") {
        None => {}
        Some(Value::Object(m)) => {
            for (k, val) in m {
                match val {
                    Value::String(s) => {
                        labels.insert(k.clone(), s.clone());
                    }
                    other => {
                        problems.push(
                            join(&labels_path, k),
                            format!("must be a string, got {}", describe(other)),
                        );
                        shape_ok = false;
                    }
                }
            }
        }
        Some(other) => {
            problems.push(
                &labels_path,
                format!("must be a mapping, got {}", kind_of(other)),
            );
            shape_ok = false;
        }
    }

    let expr_path = f.path_of("matchExpressions");
    let mut expressions = Vec::new();
    match f.get("matchExpressions") {
        None => {}
        Some(Value::Array(items)) => {
            for (i, item) in items.iter().enumerate() {
                match raw_requirement(item, &format!("{expr_path}[{i}]"), problems, warnings) {
                    Some(r) => expressions.push(r),
                    None => shape_ok = false,
                }
            }
        }
        Some(other) => {
            problems.push(
                &expr_path,
                format!("must be a list, got {}", kind_of(other)),
            );
            shape_ok = false;
        }
    }
    f.finish(warnings);
    if !shape_ok {
        return None;
    }
    match PodSelector::new(labels, expressions) {
        Ok(s) => Some(s),
        Err(errs) => {
            for e in errs {
                problems.push(join(path, &e.path), e.message);
            }
            None
        }
    }
}

fn raw_requirement(
    v: &Value,
    path: &str,
    problems: &mut Problems,
    warnings: &mut Vec<String>,
) -> Option<RawRequirement> {
    let Value::Object(map) = v else {
        problems.push(path, format!("must be a mapping, got {}", kind_of(v)));
        return None;
    };
    let mut f = Fields::new(map, path);
    let key_path = f.path_of("key");
    let key = match f.get("key") {
        None => {
            problems.push(&key_path, "required");
            None
        }
        Some(k) => as_string(k, &key_path, problems),
    };
    let op_path = f.path_of("operator");
    let operator = match f.get("operator") {
        None => {
            problems.push(&op_path, "required (In, NotIn, Exists or DoesNotExist)");
            None
        }
        Some(o) => as_string(o, &op_path, problems),
    };
    let values_path = f.path_of("values");
    let mut values_ok = true;
    let values = match f.get("values") {
        None => None,
        Some(Value::Array(items)) => {
            let mut out = Vec::with_capacity(items.len());
            for (j, item) in items.iter().enumerate() {
                match item {
                    Value::String(s) => out.push(s.clone()),
                    other => {
                        problems.push(
                            format!("{values_path}[{j}]"),
                            format!(
                                "must be a string, got {} (quote values such as \"true\" or \"1\")",
                                describe(other)
                            ),
                        );
                        values_ok = false;
                    }
                }
            }
            Some(out)
        }
        Some(other) => {
            problems.push(
                &values_path,
                format!("must be a list, got {}", kind_of(other)),
            );
            values_ok = false;
            None
        }
    };
    f.finish(warnings);
    if !values_ok {
        return None;
    }
    Some(RawRequirement {
        key: key?,
        operator: operator?,
        values,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::FieldProblem;

    const GARDENER_WEEDER: &str = r#"
watchDuration: 5m0s
servicesAndDependantSelectors:
  etcd-main-client:
    podSelectors:
    - matchExpressions:
      - key: role
        operator: In
        values:
        - apiserver
  kube-apiserver:
    podSelectors:
    - matchExpressions:
      - key: role
        operator: In
        values:
        - controller-manager
    - matchExpressions:
      - key: role
        operator: In
        values:
        - scheduler
"#;

    fn problems_of(yaml: &str) -> Vec<FieldProblem> {
        match WeederConfig::from_yaml(yaml) {
            Err(ConfigError::Invalid { problems }) => problems,
            other => panic!("expected Invalid, got {other:?}"),
        }
    }

    fn labels(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect()
    }

    #[test]
    fn gardener_weeder_config_loads() {
        let loaded = WeederConfig::from_yaml(GARDENER_WEEDER).unwrap();
        assert!(loaded.warnings.is_empty(), "{:?}", loaded.warnings);
        let c = loaded.config;
        assert_eq!(c.watch_duration, Duration::from_secs(300));
        let services: Vec<_> = c.services_and_dependant_selectors.keys().collect();
        assert_eq!(services, ["etcd-main-client", "kube-apiserver"]);
        let etcd = &c.services_and_dependant_selectors["etcd-main-client"].pod_selectors;
        assert_eq!(etcd.len(), 1);
        assert_eq!(etcd[0].to_query(), "role in (apiserver)");
        assert!(etcd[0].matches(&labels(&[("role", "apiserver")])));
        let kapi = &c.services_and_dependant_selectors["kube-apiserver"].pod_selectors;
        assert_eq!(kapi.len(), 2);
        assert!(kapi[0].matches(&labels(&[("role", "controller-manager")])));
    }

    #[test]
    fn watch_duration_defaults_to_five_minutes() {
        let yaml = GARDENER_WEEDER.replace("watchDuration: 5m0s\n", "");
        let c = WeederConfig::from_yaml(&yaml).unwrap().config;
        assert_eq!(c.watch_duration, DEFAULT_WATCH_DURATION);
    }

    #[test]
    fn missing_or_empty_services_are_rejected() {
        let p = problems_of("watchDuration: 1m\n");
        assert_eq!(p[0].path, "servicesAndDependantSelectors");
        assert!(p[0].message.starts_with("required"));
        let p = problems_of("servicesAndDependantSelectors: {}\n");
        assert_eq!(
            p[0].to_string(),
            "servicesAndDependantSelectors: must name at least one service"
        );
    }

    #[test]
    fn service_without_pod_selectors_is_rejected() {
        let p = problems_of(
            "servicesAndDependantSelectors:\n  etcd-main-client: {}\n  kube-apiserver:\n    podSelectors: []\n",
        );
        let text: Vec<_> = p.iter().map(ToString::to_string).collect();
        assert_eq!(
            text,
            [
                "servicesAndDependantSelectors.etcd-main-client.podSelectors: required",
                "servicesAndDependantSelectors.kube-apiserver.podSelectors: must not be empty",
            ]
        );
    }

    #[test]
    fn invalid_operator_is_named_by_full_path() {
        let yaml = r#"
servicesAndDependantSelectors:
  etcd-main-client:
    podSelectors:
    - matchExpressions:
      - {key: role, operator: In, values: [apiserver]}
      - {key: tier, operator: Equals, values: [x]}
"#;
        let p = problems_of(yaml);
        assert_eq!(p.len(), 1);
        assert_eq!(
            p[0].path,
            "servicesAndDependantSelectors.etcd-main-client.podSelectors[0].matchExpressions[1].operator"
        );
    }

    #[test]
    fn empty_selector_is_rejected_for_safety() {
        let p = problems_of(
            "servicesAndDependantSelectors:\n  etcd-main-client:\n    podSelectors: [{}]\n",
        );
        assert_eq!(
            p[0].path,
            "servicesAndDependantSelectors.etcd-main-client.podSelectors[0]"
        );
        assert!(p[0].message.contains("would match every pod"));
    }

    #[test]
    fn many_selector_problems_are_reported_together() {
        let yaml = r#"
watchDuration: 0s
servicesAndDependantSelectors:
  Bad_Name:
    podSelectors:
    - matchLabels: {role: 1}
  kube-apiserver:
    podSelectors:
    - matchExpressions:
      - {key: role, operator: In}
      - {operator: Exists}
      - {key: a, operator: Exists, values: [x]}
      - {key: b, operator: In, values: [true]}
"#;
        let p = problems_of(yaml);
        let paths: Vec<_> = p.iter().map(|x| x.path.as_str()).collect();
        let base = "servicesAndDependantSelectors.kube-apiserver.podSelectors[0].matchExpressions";
        for expected in [
            "watchDuration".to_owned(),
            "servicesAndDependantSelectors.Bad_Name".to_owned(),
            "servicesAndDependantSelectors.Bad_Name.podSelectors[0].matchLabels.role".to_owned(),
            format!("{base}[1].key"),
            format!("{base}[3].values[0]"),
        ] {
            assert!(
                paths.contains(&expected.as_str()),
                "{expected} not in {paths:?}"
            );
        }
    }

    #[test]
    fn selector_rules_checked_after_shape_is_fine() {
        let yaml = r#"
servicesAndDependantSelectors:
  kube-apiserver:
    podSelectors:
    - matchExpressions:
      - {key: role, operator: In}
      - {key: a, operator: Exists, values: [x]}
"#;
        let p = problems_of(yaml);
        let paths: Vec<_> = p.iter().map(|x| x.path.as_str()).collect();
        let base = "servicesAndDependantSelectors.kube-apiserver.podSelectors[0].matchExpressions";
        assert_eq!(
            paths,
            [format!("{base}[0].values"), format!("{base}[1].values")]
        );
    }

    #[test]
    fn unknown_fields_are_warnings() {
        let yaml = format!("{GARDENER_WEEDER}extra: 1\n").replace(
            "  etcd-main-client:\n",
            "  etcd-main-client:\n    note: x\n",
        );
        let loaded = WeederConfig::from_yaml(&yaml).unwrap();
        assert_eq!(
            loaded.warnings,
            [
                "servicesAndDependantSelectors.etcd-main-client.note: unknown field, ignored",
                "extra: unknown field, ignored",
            ]
        );
    }
}
