//! The weeder's configuration file (docs/behaviour.md §3.1).
//!
//! Maps a service name to the selectors of pods that depend on it. Every file the reference
//! (v1.7.0, `internal/weeder/config.go`) accepts loads here with the same meaning, including
//! selectors that match every pod in a namespace (an empty or null selector); because the weeder
//! deletes the pods its selectors pick, those load with a warning. Invalid selectors are refused,
//! as the reference refuses them, with every problem named.

use std::collections::BTreeMap;
use std::time::Duration;

use super::goyaml::GoValue;
use super::{
    Ctx, Fields, Got, Loaded, describe, join, kind_of, load_document, mapping_or_null, to_string,
};
use crate::config::ConfigError;
use crate::duration::format_go_duration;
use crate::selector::{PodSelector, RawRequirement};

/// Default for `watchDuration`.
pub const DEFAULT_WATCH_DURATION: Duration = Duration::from_secs(300);

/// The effective weeder configuration, with defaults filled in.
#[derive(Debug, Clone, PartialEq)]
pub struct WeederConfig {
    /// How long a weeder keeps deleting crash-looping dependants after its service came back.
    /// Zero when the file gives zero or less.
    pub watch_duration: Duration,
    /// Service name → selectors of the pods that depend on it.
    pub services_and_dependant_selectors: BTreeMap<String, DependantSelectors>,
}

/// The dependants of one service: `servicesAndDependantSelectors.<service>` in the file.
#[derive(Debug, Clone, PartialEq)]
pub struct DependantSelectors {
    /// `podSelectors` (required, non-empty): label selectors of the pods in the service's
    /// namespace that crash-loop while it is down; a pod matching any of them is a dependant.
    /// An empty selector matches every pod of the namespace.
    pub pod_selectors: Vec<PodSelector>,
}

impl WeederConfig {
    /// Loads a weeder config, reporting every problem at once; what loads but deserves attention
    /// comes back as warnings.
    pub fn from_yaml(text: &str) -> Result<Loaded<WeederConfig>, ConfigError> {
        let map = load_document(text)?;
        let mut cx = Ctx::default();
        let mut f = Fields::of_map(&map, "");

        let default = i64::try_from(DEFAULT_WATCH_DURATION.as_nanos()).unwrap_or(i64::MAX);
        let watch_duration = f.duration("watchDuration", &mut cx).or(default).map(|ns| {
            if ns <= 0 {
                let shown = format_go_duration(Duration::from_nanos(ns.unsigned_abs()));
                let sign = if ns < 0 { "-" } else { "" };
                cx.warn(
                    "watchDuration",
                    format_args!(
                        "{sign}{shown} is not positive: every weeder ends as soon as it starts, so crash-looping dependants are not deleted (the reference accepts it and then crashes with a nil-pointer panic the first time a service comes back)"
                    ),
                );
            }
            Duration::from_nanos(u64::try_from(ns).unwrap_or(0))
        });
        let services = services(&mut f, &mut cx);
        f.finish(&mut cx);

        let config = (|| {
            Some(WeederConfig {
                watch_duration: watch_duration?,
                services_and_dependant_selectors: services?,
            })
        })();
        cx.finish(config)
    }
}

fn services(f: &mut Fields<'_>, cx: &mut Ctx) -> Option<BTreeMap<String, DependantSelectors>> {
    const PATH: &str = "servicesAndDependantSelectors";
    // validate: MustNotBeEmpty("serviceAndDependantSelectors").
    let problem =
        "required: map each service name to its dependants' podSelectors (must not be empty)";
    let (path, map) = f
        .map(PATH, cx)
        .required(|(_, map)| !map.is_empty(), (PATH, problem), cx)?;
    let mut out = BTreeMap::new();
    let mut all_ok = true;
    for (service, deps) in map {
        let service_path = join(&path, service);
        if let Err(e) = validate_service_name(service) {
            cx.warn(&service_path, e);
        }
        match dependant_selectors(deps, service, &service_path, cx) {
            Some(d) => {
                out.insert(service.to_owned(), d);
            }
            None => all_ok = false,
        }
    }
    all_ok.then_some(out)
}

/// Service names are RFC 1035 labels; anything else can never match an EndpointSlice's
/// `kubernetes.io/service-name` label. The reference doesn't check, and such an entry is merely
/// dead, so this is a warning.
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
            "{name:?} is not a valid service name (lowercase alphanumerics and '-', starting with a letter, at most 63 characters), so no EndpointSlice ever matches it and this entry does nothing"
        ))
    }
}

fn dependant_selectors(
    v: &GoValue,
    service: &str,
    path: &str,
    cx: &mut Ctx,
) -> Option<DependantSelectors> {
    // null decodes to an empty DependantSelectors, whose podSelectors are then missing.
    let mut f = mapping_or_null(v, path, cx)?;
    // validate: MustNotBeEmpty("podSelectors").
    let selectors = match f.list("podSelectors", cx) {
        Got::Invalid => None,
        Got::Value((sel_path, items)) if !items.is_empty() => {
            let mut out = Vec::with_capacity(items.len());
            let mut all_ok = true;
            for (i, item) in items.iter().enumerate() {
                match pod_selector(item, service, &format!("{sel_path}[{i}]"), cx) {
                    Some(s) => out.push(s),
                    None => all_ok = false,
                }
            }
            all_ok.then_some(out)
        }
        _ => {
            cx.problem(f.path_of("podSelectors"), "required (must not be empty)");
            None
        }
    };
    f.finish(cx);
    selectors.map(|pod_selectors| DependantSelectors { pod_selectors })
}

fn pod_selector(v: &GoValue, service: &str, path: &str, cx: &mut Ctx) -> Option<PodSelector> {
    let map = match v {
        GoValue::Map(map) => map,
        GoValue::Null => {
            // `LabelSelectorAsSelector(nil)` is labels.Nothing(), but the reference's pod watch
            // sends its String(), which is empty: the watch sees every pod in the namespace.
            cx.warn(
                path,
                format_args!(
                    "null: the reference watches every pod in the namespace for it (its selector matches nothing, but renders as an empty query), so every crash-looping pod there is deleted when {service} is back; we do the same"
                ),
            );
            return Some(PodSelector::everything());
        }
        other => {
            cx.problem(path, format!("must be a mapping, got {}", kind_of(other)));
            return None;
        }
    };
    let mut f = Fields::of_map(map, path);
    let mut shape_ok = true;

    let mut labels = BTreeMap::new();
    match f.map("matchLabels", cx) {
        Got::Absent => {}
        Got::Invalid => shape_ok = false,
        Got::Value((labels_path, m)) => {
            for (k, val) in m {
                match val {
                    // A null value decodes to the empty string.
                    GoValue::Null => {
                        labels.insert(k.to_owned(), String::new());
                    }
                    other => match to_string(other, &join(&labels_path, k), true, cx) {
                        Some(s) => {
                            labels.insert(k.to_owned(), s);
                        }
                        None => shape_ok = false,
                    },
                }
            }
        }
    }

    let mut expressions = Vec::new();
    match f.list("matchExpressions", cx) {
        Got::Absent => {}
        Got::Invalid => shape_ok = false,
        Got::Value((expr_path, items)) => {
            for (i, item) in items.iter().enumerate() {
                match raw_requirement(item, &format!("{expr_path}[{i}]"), cx) {
                    Some(r) => expressions.push(r),
                    None => shape_ok = false,
                }
            }
        }
    }
    f.finish(cx);
    if !shape_ok {
        return None;
    }
    match PodSelector::from_config(labels, expressions) {
        Ok(s) => {
            if s.is_everything() {
                cx.warn(
                    path,
                    format_args!(
                        "empty: it selects every pod in the namespace, so every crash-looping pod there is deleted when {service} is back (as in the reference)"
                    ),
                );
            }
            Some(s)
        }
        Err(errs) => {
            for e in errs {
                cx.problem(join(path, &e.path), e.message);
            }
            None
        }
    }
}

fn raw_requirement(v: &GoValue, path: &str, cx: &mut Ctx) -> Option<RawRequirement> {
    // A null entry decodes to an empty requirement, refused below for its operator.
    let mut f = mapping_or_null(v, path, cx)?;
    let key = f.string("key", cx).or(String::new());
    let operator = f.string("operator", cx).or(String::new());
    let values = match f.list("values", cx) {
        Got::Absent => Some(None),
        Got::Invalid => None,
        Got::Value((values_path, items)) => {
            let mut out = Vec::with_capacity(items.len());
            let mut ok = true;
            for (j, item) in items.iter().enumerate() {
                let item_path = format!("{values_path}[{j}]");
                match item {
                    GoValue::Null => out.push(String::new()),
                    GoValue::Seq(_) | GoValue::Map(_) => {
                        cx.problem(
                            item_path,
                            format!("must be a string, got {}", describe(item)),
                        );
                        ok = false;
                    }
                    scalar => match to_string(scalar, &item_path, true, cx) {
                        Some(s) => out.push(s),
                        None => ok = false,
                    },
                }
            }
            ok.then_some(Some(out))
        }
    };
    f.finish(cx);
    Some(RawRequirement {
        key: key?,
        operator: operator?,
        values: values?,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::{ConfigError, FieldProblem};

    /// The seeds' weeder config (deploy/weeder/configmap.yaml's), shared with the binary's tests.
    const GARDENER_WEEDER: &str = include_str!("../../tests/support/seeds-weeder.yaml");

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
        for text in [
            "watchDuration: 1m\n",
            "servicesAndDependantSelectors: {}\n",
            "servicesAndDependantSelectors: null\n",
        ] {
            let p = problems_of(text);
            assert_eq!(
                p[0].to_string(),
                "servicesAndDependantSelectors: required: map each service name to its dependants' podSelectors (must not be empty)",
                "{text}"
            );
        }
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
                "servicesAndDependantSelectors.etcd-main-client.podSelectors: required (must not be empty)",
                "servicesAndDependantSelectors.kube-apiserver.podSelectors: required (must not be empty)",
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
    fn empty_and_null_selectors_select_every_pod_with_a_warning() {
        // The reference accepts both: {} is labels.Everything(); null is labels.Nothing(), whose
        // String() is "" too, so its pod watch sees every pod in the namespace.
        let loaded = WeederConfig::from_yaml(
            "servicesAndDependantSelectors:\n  etcd-main-client:\n    podSelectors: [{}, null]\n",
        )
        .unwrap();
        let selectors = &loaded.config.services_and_dependant_selectors["etcd-main-client"];
        assert!(
            selectors
                .pod_selectors
                .iter()
                .all(PodSelector::is_everything)
        );
        assert_eq!(selectors.pod_selectors[0].to_query(), "");
        assert_eq!(loaded.warnings.len(), 2);
        assert!(
            loaded.warnings[0].starts_with(
                "servicesAndDependantSelectors.etcd-main-client.podSelectors[0]: empty: it selects every pod"
            ),
            "{}",
            loaded.warnings[0]
        );
        assert!(
            loaded.warnings[1].starts_with(
                "servicesAndDependantSelectors.etcd-main-client.podSelectors[1]: null:"
            )
        );
    }

    /// The paths of `yaml`'s problems, relative to kube-apiserver's first podSelector's
    /// matchExpressions where they are below them.
    fn expression_problems(yaml: &str) -> Vec<String> {
        let base = "servicesAndDependantSelectors.kube-apiserver.podSelectors[0].matchExpressions";
        problems_of(yaml)
            .iter()
            .map(|p| p.path.strip_prefix(base).unwrap_or(&p.path).to_string())
            .collect()
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
        // watchDuration 0s, the service name Bad_Name, `role: 1` and `values: [true]` all load
        // in the reference (the last two as the strings "1" and "true"), so they are warnings.
        assert_eq!(
            expression_problems(yaml),
            ["[0].values", "[1].key", "[2].values"]
        );
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
        assert_eq!(expression_problems(yaml), ["[0].values", "[1].values"]);
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
