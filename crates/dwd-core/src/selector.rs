//! Validated Kubernetes label selectors for the weeder's pod selectors.
//!
//! The weeder deletes pods, so a selector that is subtly wrong is dangerous. We validate selectors
//! when the config loads (operators, label syntax) instead of at the first event, with the rules
//! of `labels.NewRequirement`. The empty selector, which matches every pod in a namespace, is
//! refused by [`PodSelector::new`] and accepted by [`PodSelector::from_config`] (the reference's
//! config accepts it). The same type evaluates selectors
//! locally (`matches`) and renders them for list/watch calls (`to_query`), so both always agree.
//!
//! Why not `kube::core::Selector` (kube-core 5.0.0, read at its source): its
//! `TryFrom<LabelSelector>` checks only the operator's name and that `In`/`NotIn` have a
//! `values` field. It accepts `In` with `values: []` (a selector that matches nothing, which
//! the apiserver rejects at the first list), any string as a key or value (`"bad key!"`), `Exists`
//! with values, and its errors name no field ("Invalid expression operator"). The weeder would
//! then start with a selector that fails only when a service comes back, the moment it is
//! needed. The validation here (about 140 lines, with `labels.NewRequirement`'s messages and the
//! field path of every problem) is therefore ours; matching and rendering are 45 lines over the
//! validated requirements, so one type serves all three and a second representation, built
//! from ours only to match, would buy nothing.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;
use std::str::FromStr;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;
use thiserror::Error;

/// A selector requirement's operator (`metav1.LabelSelectorOperator`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Operator {
    /// `In`: the label is present and its value is one of the values (which must not be empty).
    In,
    /// `NotIn`: the label is absent or its value is none of the values (which must not be
    /// empty).
    NotIn,
    /// `Exists`: the label is present, whatever its value (no values allowed).
    Exists,
    /// `DoesNotExist`: the label is absent (no values allowed).
    DoesNotExist,
}

impl FromStr for Operator {
    type Err = String;

    /// Operators are case-sensitive, as in Kubernetes.
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "In" => Ok(Self::In),
            "NotIn" => Ok(Self::NotIn),
            "Exists" => Ok(Self::Exists),
            "DoesNotExist" => Ok(Self::DoesNotExist),
            other => Err(format!(
                "unknown operator {other:?} (use In, NotIn, Exists or DoesNotExist)"
            )),
        }
    }
}

impl fmt::Display for Operator {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Self::In => "In",
            Self::NotIn => "NotIn",
            Self::Exists => "Exists",
            Self::DoesNotExist => "DoesNotExist",
        })
    }
}

/// One `matchExpressions` entry. Values are a set: order and duplicates carry no meaning.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Requirement {
    /// The label key tested, valid Kubernetes label-key syntax (`[prefix/]name`).
    pub key: String,
    /// How the key and values are tested.
    pub operator: Operator,
    /// The label values for `In`/`NotIn` (never empty for them); empty for `Exists` and
    /// `DoesNotExist`.
    pub values: BTreeSet<String>,
}

impl Requirement {
    fn matches(&self, labels: &BTreeMap<String, String>) -> bool {
        let value = labels.get(&self.key);
        match self.operator {
            Operator::In => value.is_some_and(|v| self.values.contains(v)),
            Operator::NotIn => value.is_none_or(|v| !self.values.contains(v)),
            Operator::Exists => value.is_some(),
            Operator::DoesNotExist => value.is_none(),
        }
    }

    fn to_query(&self) -> String {
        let values = || self.values.iter().cloned().collect::<Vec<_>>().join(",");
        match self.operator {
            Operator::In => format!("{} in ({})", self.key, values()),
            Operator::NotIn => format!("{} notin ({})", self.key, values()),
            Operator::Exists => self.key.clone(),
            Operator::DoesNotExist => format!("!{}", self.key),
        }
    }
}

/// A problem in a selector, with a path relative to the selector (e.g.
/// `matchExpressions[1].operator`) so callers can prefix their own location.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SelectorProblem {
    /// Where in the selector, e.g. `matchLabels.app` or `matchExpressions[1].values[0]`;
    /// empty for the selector as a whole (an empty selector where one is required).
    pub path: String,
    /// What is wrong, e.g. `must not be empty for operator In`.
    pub message: String,
}

impl fmt::Display for SelectorProblem {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.path.is_empty() {
            f.write_str(&self.message)
        } else {
            write!(f, "{}: {}", self.path, self.message)
        }
    }
}

/// Why an API `LabelSelector` could not be used ([`PodSelector::from_label_selector`]).
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum SelectorError {
    /// The selector is empty or has invalid keys, values or operators.
    #[error("invalid label selector: {}", join_problems(problems))]
    Invalid {
        /// Every problem found, each with its path in the selector; never empty.
        problems: Vec<SelectorProblem>,
    },
}

fn join_problems(problems: &[SelectorProblem]) -> String {
    problems
        .iter()
        .map(ToString::to_string)
        .collect::<Vec<_>>()
        .join("; ")
}

/// Message used when a selector selects everything.
pub const EMPTY_SELECTOR_MESSAGE: &str =
    "empty selector would match every pod in the namespace; give matchLabels or matchExpressions";

/// A validated label selector (empty only when built by [`PodSelector::from_config`] or
/// [`PodSelector::everything`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PodSelector {
    match_labels: BTreeMap<String, String>,
    match_expressions: Vec<Requirement>,
}

/// An unvalidated `matchExpressions` entry, as read from a config or an API object.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RawRequirement {
    /// `key`: the label key, not yet checked against label-key syntax.
    pub key: String,
    /// `operator` as written; only `In`, `NotIn`, `Exists` and `DoesNotExist` (case-sensitive)
    /// are valid.
    pub operator: String,
    /// `values`; `None` when absent or `null`, which counts as empty.
    pub values: Option<Vec<String>>,
}

impl PodSelector {
    /// Validates the parts of a selector, collecting every problem (paths relative to the
    /// selector). An empty selector is refused: API objects and tests use this, and there a
    /// selector that matches every pod is never what was meant.
    pub fn new(
        match_labels: BTreeMap<String, String>,
        match_expressions: Vec<RawRequirement>,
    ) -> Result<Self, Vec<SelectorProblem>> {
        Self::validate(match_labels, match_expressions, false)
    }

    /// Like [`Self::new`], but an empty selector is fine and selects every pod, as
    /// `metav1.LabelSelectorAsSelector` makes it (`labels.Everything()`). The weeder's config
    /// uses this: the reference accepts such selectors, so a drop-in must too (with a warning).
    pub fn from_config(
        match_labels: BTreeMap<String, String>,
        match_expressions: Vec<RawRequirement>,
    ) -> Result<Self, Vec<SelectorProblem>> {
        Self::validate(match_labels, match_expressions, true)
    }

    /// The selector that selects every pod (empty query).
    pub fn everything() -> Self {
        Self {
            match_labels: BTreeMap::new(),
            match_expressions: Vec::new(),
        }
    }

    /// Whether this selector has no requirement, so it selects every pod.
    pub fn is_everything(&self) -> bool {
        self.match_labels.is_empty() && self.match_expressions.is_empty()
    }

    fn validate(
        match_labels: BTreeMap<String, String>,
        match_expressions: Vec<RawRequirement>,
        allow_empty: bool,
    ) -> Result<Self, Vec<SelectorProblem>> {
        let mut problems = Vec::new();
        let mut push = |path: String, message: String| {
            problems.push(SelectorProblem { path, message });
        };
        for (key, value) in &match_labels {
            if let Err(e) = validate_label_key(key) {
                push(format!("matchLabels.{key}"), format!("invalid key: {e}"));
            }
            if let Err(e) = validate_label_value(value) {
                push(
                    format!("matchLabels.{key}"),
                    format!("invalid value {value:?}: {e}"),
                );
            }
        }
        let mut requirements = Vec::with_capacity(match_expressions.len());
        for (i, raw) in match_expressions.into_iter().enumerate() {
            let at = |field: &str| format!("matchExpressions[{i}].{field}");
            let key_ok = match validate_label_key(&raw.key) {
                Ok(()) => true,
                Err(e) => {
                    push(at("key"), format!("invalid key {:?}: {e}", raw.key));
                    false
                }
            };
            let operator = match raw.operator.parse::<Operator>() {
                Ok(op) => Some(op),
                Err(e) => {
                    push(at("operator"), e);
                    None
                }
            };
            let values = raw.values.unwrap_or_default();
            let mut values_ok = true;
            for (j, v) in values.iter().enumerate() {
                if let Err(e) = validate_label_value(v) {
                    push(
                        format!("{}[{j}]", at("values")),
                        format!("invalid value {v:?}: {e}"),
                    );
                    values_ok = false;
                }
            }
            if let Some(op) = operator {
                match op {
                    Operator::In | Operator::NotIn if values.is_empty() => {
                        push(at("values"), format!("must not be empty for operator {op}"));
                        values_ok = false;
                    }
                    Operator::Exists | Operator::DoesNotExist if !values.is_empty() => {
                        push(at("values"), format!("must be empty for operator {op}"));
                        values_ok = false;
                    }
                    _ => {}
                }
                if key_ok && values_ok {
                    requirements.push(Requirement {
                        key: raw.key,
                        operator: op,
                        values: values.into_iter().collect(),
                    });
                }
            }
        }
        if !allow_empty && match_labels.is_empty() && requirements.is_empty() && problems.is_empty()
        {
            problems.push(SelectorProblem {
                path: String::new(),
                message: EMPTY_SELECTOR_MESSAGE.to_owned(),
            });
        }
        if problems.is_empty() {
            Ok(Self {
                match_labels,
                match_expressions: requirements,
            })
        } else {
            Err(problems)
        }
    }

    /// Converts and validates an API `LabelSelector`.
    pub fn from_label_selector(selector: &LabelSelector) -> Result<Self, SelectorError> {
        let labels = selector.match_labels.clone().unwrap_or_default();
        let expressions = selector
            .match_expressions
            .iter()
            .flatten()
            .map(|e| RawRequirement {
                key: e.key.clone(),
                operator: e.operator.clone(),
                values: e.values.clone(),
            })
            .collect();
        Self::new(labels, expressions).map_err(|problems| SelectorError::Invalid { problems })
    }

    /// The `matchLabels` pairs: a pod must carry each label with exactly this value.
    pub fn match_labels(&self) -> &BTreeMap<String, String> {
        &self.match_labels
    }

    /// The validated `matchExpressions`, in their original order; a pod must meet all of them.
    pub fn match_expressions(&self) -> &[Requirement] {
        &self.match_expressions
    }

    /// Whether a pod with these labels is selected (all requirements must hold).
    pub fn matches(&self, labels: &BTreeMap<String, String>) -> bool {
        self.match_labels
            .iter()
            .all(|(k, v)| labels.get(k) == Some(v))
            && self.match_expressions.iter().all(|r| r.matches(labels))
    }

    /// The selector in Kubernetes' label-selector string syntax (`a=b,c in (x,y),!d`), sorted by
    /// key and then by rendering, so the same selector always yields the same query.
    pub fn to_query(&self) -> String {
        let mut parts: Vec<(String, String)> = self
            .match_labels
            .iter()
            .map(|(k, v)| (k.clone(), format!("{k}={v}")))
            .chain(
                self.match_expressions
                    .iter()
                    .map(|r| (r.key.clone(), r.to_query())),
            )
            .collect();
        parts.sort();
        parts.dedup();
        parts
            .into_iter()
            .map(|(_, rendered)| rendered)
            .collect::<Vec<_>>()
            .join(",")
    }
}

impl fmt::Display for PodSelector {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.to_query())
    }
}

/// A label key: an optional DNS-subdomain prefix and `/`, then a name of at most 63 characters of
/// alphanumerics, `-`, `_` and `.`, starting and ending alphanumeric.
pub fn validate_label_key(key: &str) -> Result<(), String> {
    let (prefix, name) = match key.split_once('/') {
        Some((p, n)) => (Some(p), n),
        None => (None, key),
    };
    if let Some(prefix) = prefix {
        if prefix.is_empty() {
            return Err("prefix before '/' must not be empty".to_owned());
        }
        if prefix.len() > 253 {
            return Err("prefix must be at most 253 characters".to_owned());
        }
        // A DNS-1123 subdomain, as `validation.IsDNS1123Subdomain` checks it: the whole prefix
        // is limited (253), not each of its labels.
        let label_ok = |l: &str| {
            !l.is_empty()
                && l.bytes()
                    .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
                && !l.starts_with('-')
                && !l.ends_with('-')
        };
        if !prefix.split('.').all(label_ok) {
            return Err(format!(
                "prefix {prefix:?} must be a DNS subdomain (lowercase alphanumerics, '-' and '.')"
            ));
        }
    }
    if name.is_empty() {
        return Err("name part must not be empty".to_owned());
    }
    validate_label_value(name).map_err(|e| format!("name part {e}"))
}

/// A label value: empty, or at most 63 characters of alphanumerics, `-`, `_` and `.`, starting and
/// ending alphanumeric.
pub fn validate_label_value(value: &str) -> Result<(), String> {
    if value.is_empty() {
        return Ok(());
    }
    if value.len() > 63 {
        return Err("must be at most 63 characters".to_owned());
    }
    let inner_ok = value
        .bytes()
        .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.'));
    let ends_ok = value.starts_with(|c: char| c.is_ascii_alphanumeric())
        && value.ends_with(|c: char| c.is_ascii_alphanumeric());
    if inner_ok && ends_ok {
        Ok(())
    } else {
        Err(
            "must consist of alphanumerics, '-', '_' or '.', and start and end with an alphanumeric"
                .to_owned(),
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelectorRequirement;

    fn labels(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect()
    }

    fn req(key: &str, op: &str, values: &[&str]) -> RawRequirement {
        RawRequirement {
            key: key.to_owned(),
            operator: op.to_owned(),
            values: Some(values.iter().map(|v| (*v).to_owned()).collect()),
        }
    }

    #[test]
    fn in_requires_label_value_in_set() {
        let s = PodSelector::new(BTreeMap::new(), vec![req("role", "In", &["apiserver"])]).unwrap();
        assert!(s.matches(&labels(&[("role", "apiserver")])));
        assert!(!s.matches(&labels(&[("role", "etcd")])));
        assert!(!s.matches(&labels(&[])));
    }

    #[test]
    fn notin_matches_absent_or_other_values() {
        let s = PodSelector::new(BTreeMap::new(), vec![req("role", "NotIn", &["etcd"])]).unwrap();
        assert!(s.matches(&labels(&[])));
        assert!(s.matches(&labels(&[("role", "apiserver")])));
        assert!(!s.matches(&labels(&[("role", "etcd")])));
    }

    #[test]
    fn exists_and_does_not_exist_look_only_at_the_key() {
        let s = PodSelector::new(
            BTreeMap::new(),
            vec![req("a", "Exists", &[]), req("b", "DoesNotExist", &[])],
        )
        .unwrap();
        assert!(s.matches(&labels(&[("a", "")])));
        assert!(!s.matches(&labels(&[("a", "x"), ("b", "y")])));
        assert!(!s.matches(&labels(&[])));
    }

    #[test]
    fn match_labels_and_expressions_must_all_hold() {
        let s = PodSelector::new(
            labels(&[("app", "kube")]),
            vec![req("role", "In", &["a", "b"])],
        )
        .unwrap();
        assert!(s.matches(&labels(&[("app", "kube"), ("role", "b")])));
        assert!(!s.matches(&labels(&[("app", "other"), ("role", "b")])));
    }

    #[test]
    fn query_uses_kubernetes_syntax_sorted_by_key() {
        let s = PodSelector::new(
            labels(&[("a", "b")]),
            vec![
                req("f", "DoesNotExist", &[]),
                req("d", "NotIn", &["z"]),
                req("c", "In", &["y", "x"]),
                req("e", "Exists", &[]),
            ],
        )
        .unwrap();
        assert_eq!(s.to_query(), "a=b,c in (x,y),d notin (z),e,!f");
        assert_eq!(s.to_string(), s.to_query());
    }

    #[test]
    fn empty_selector_is_rejected() {
        let err = PodSelector::new(BTreeMap::new(), vec![]).unwrap_err();
        assert_eq!(err[0].message, EMPTY_SELECTOR_MESSAGE);
        assert!(PodSelector::from_label_selector(&LabelSelector::default()).is_err());
    }

    #[test]
    fn invalid_operator_is_named_by_path() {
        let err = PodSelector::new(
            BTreeMap::new(),
            vec![req("a", "In", &["x"]), req("b", "Equals", &["x"])],
        )
        .unwrap_err();
        assert_eq!(err.len(), 1);
        assert_eq!(err[0].path, "matchExpressions[1].operator");
        assert!(err[0].message.contains("\"Equals\""));
    }

    #[test]
    fn in_and_notin_need_values_exists_needs_none() {
        let err = PodSelector::new(
            BTreeMap::new(),
            vec![
                req("a", "In", &[]),
                RawRequirement {
                    key: "b".into(),
                    operator: "NotIn".into(),
                    values: None,
                },
                req("c", "Exists", &["x"]),
                req("d", "DoesNotExist", &["x"]),
            ],
        )
        .unwrap_err();
        let paths: Vec<_> = err.iter().map(|p| p.path.as_str()).collect();
        assert_eq!(
            paths,
            [
                "matchExpressions[0].values",
                "matchExpressions[1].values",
                "matchExpressions[2].values",
                "matchExpressions[3].values"
            ]
        );
    }

    #[test]
    fn label_keys_and_values_are_validated() {
        assert!(validate_label_key("role").is_ok());
        assert!(validate_label_key("gardener.cloud/role").is_ok());
        assert!(validate_label_key("app.kubernetes.io/name").is_ok());
        assert!(validate_label_key("").is_err());
        assert!(validate_label_key("/a").is_err());
        assert!(validate_label_key("a/").is_err());
        assert!(validate_label_key("Bad_Prefix/a").is_err());
        assert!(validate_label_key("-a").is_err());
        assert!(validate_label_key(&"a".repeat(64)).is_err());
        assert!(validate_label_value("").is_ok());
        assert!(validate_label_value("v1.2_3-x").is_ok());
        assert!(validate_label_value("has space").is_err());
        assert!(validate_label_value("x,y").is_err());
        let err = PodSelector::new(labels(&[("ok", "bad value")]), vec![]).unwrap_err();
        assert_eq!(err[0].path, "matchLabels.ok");
    }

    #[test]
    fn converts_from_api_label_selector() {
        let api = LabelSelector {
            match_labels: Some(labels(&[("app", "x")])),
            match_expressions: Some(vec![LabelSelectorRequirement {
                key: "role".into(),
                operator: "In".into(),
                values: Some(vec!["controller-manager".into()]),
            }]),
        };
        let s = PodSelector::from_label_selector(&api).unwrap();
        assert_eq!(s.to_query(), "app=x,role in (controller-manager)");
        let bad = LabelSelector {
            match_expressions: Some(vec![LabelSelectorRequirement {
                key: "role".into(),
                operator: "in".into(),
                values: None,
            }]),
            ..Default::default()
        };
        let err = PodSelector::from_label_selector(&bad).unwrap_err();
        assert!(
            err.to_string()
                .contains("matchExpressions[0].operator: unknown operator \"in\""),
            "{err}"
        );
    }
}
