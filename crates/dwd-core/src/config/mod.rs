//! Configuration files of the prober and the weeder.
//!
//! Both subcommands read a YAML file that Gardener renders into a ConfigMap; the drop-in rule says
//! those files must load unchanged. We read the YAML into a generic JSON tree and walk it by hand
//! instead of deriving `Deserialize`, because that is what lets us (a) report *every* bad field in
//! one error, each with its path, so an operator fixes a config in one round trip, and (b) warn
//! about unknown fields (the reference silently ignores them) without failing, since older and
//! newer Gardener versions render fields the other side may not know.

pub mod prober;
pub mod weeder;

use std::collections::BTreeSet;
use std::fmt;
use std::time::Duration;

use serde_json::{Map, Value};
use thiserror::Error;

use crate::duration::parse_go_duration;

pub use prober::{DependentResourceInfo, ProberConfig, ResourceRef, ScaleInfo};
pub use weeder::{DependantSelectors, WeederConfig};

/// A successfully loaded configuration plus the things that were accepted but deserve the
/// operator's attention (unknown fields, by path). Warnings are full sentences that start with the
/// field path, e.g. `dependentResourceInfos[0].scaleUp.replicas: unknown field, ignored`.
#[derive(Debug, Clone, PartialEq)]
pub struct Loaded<T> {
    pub config: T,
    pub warnings: Vec<String>,
}

/// One bad field: where it is and what is wrong with it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FieldProblem {
    /// Path in the document, e.g. `dependentResourceInfos[1].scaleDown.level`.
    pub path: String,
    pub message: String,
}

impl fmt::Display for FieldProblem {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}", self.path, self.message)
    }
}

/// Why a configuration file could not be loaded.
#[derive(Debug, Clone, PartialEq, Error)]
pub enum ConfigError {
    #[error("config file is not valid YAML: {message}")]
    Yaml { message: String },
    #[error("config file must be a YAML mapping of fields, but it is {found}")]
    NotAMapping { found: &'static str },
    #[error("{}", render_problems(problems))]
    Invalid { problems: Vec<FieldProblem> },
}

fn render_problems(problems: &[FieldProblem]) -> String {
    let mut out = format!(
        "invalid config ({} problem{}):",
        problems.len(),
        if problems.len() == 1 { "" } else { "s" }
    );
    for p in problems {
        out.push_str("\n  - ");
        out.push_str(&p.to_string());
    }
    out
}

/// Parses YAML text into the top-level mapping of a config document.
pub(crate) fn load_mapping(text: &str) -> Result<Map<String, Value>, ConfigError> {
    // Duplicate keys: the last one wins, as with the reference's YAML decoder, so a file it loads
    // loads here too.
    let options = serde_saphyr::options! {
        duplicate_keys: serde_saphyr::DuplicateKeyPolicy::LastWins,
    };
    let doc: Value = serde_saphyr::from_str_with_options(text, options).map_err(|e| {
        let message = e.to_string();
        ConfigError::Yaml {
            message: message
                .strip_prefix("error: ")
                .unwrap_or(&message)
                .to_owned(),
        }
    })?;
    match doc {
        Value::Object(map) => Ok(map),
        Value::Null => Err(ConfigError::NotAMapping {
            found: "an empty document",
        }),
        other => Err(ConfigError::NotAMapping {
            found: kind_of(&other),
        }),
    }
}

/// Describes a JSON value's kind with an article, for messages like "must be a string, got a list".
pub(crate) fn kind_of(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "a list",
        Value::Object(_) => "a mapping",
    }
}

/// Joins a parent path and a field name the way problems and warnings print them (either side may
/// be empty: the document root, or a problem about the parent itself).
pub(crate) fn join(parent: &str, key: &str) -> String {
    if parent.is_empty() {
        key.to_owned()
    } else if key.is_empty() {
        parent.to_owned()
    } else {
        format!("{parent}.{key}")
    }
}

/// Accumulates problems while a document is walked, so validation never stops at the first one.
#[derive(Debug, Default)]
pub(crate) struct Problems(pub(crate) Vec<FieldProblem>);

impl Problems {
    pub(crate) fn push(&mut self, path: impl Into<String>, message: impl Into<String>) {
        self.0.push(FieldProblem {
            path: path.into(),
            message: message.into(),
        });
    }

    pub(crate) fn into_result<T>(self, ok: T) -> Result<T, ConfigError> {
        if self.0.is_empty() {
            Ok(ok)
        } else {
            Err(ConfigError::Invalid { problems: self.0 })
        }
    }
}

/// A mapping being read field by field. It remembers which keys were asked for so that the rest
/// can be reported as unknown once the caller is done.
pub(crate) struct Fields<'a> {
    path: String,
    map: &'a Map<String, Value>,
    seen: BTreeSet<&'a str>,
}

impl<'a> Fields<'a> {
    pub(crate) fn new(map: &'a Map<String, Value>, path: impl Into<String>) -> Self {
        Self {
            path: path.into(),
            map,
            seen: BTreeSet::new(),
        }
    }

    pub(crate) fn path_of(&self, key: &str) -> String {
        join(&self.path, key)
    }

    /// The value of `key`, with an explicit YAML null treated as absent (Go's decoder leaves a
    /// nulled field at its zero value, which then gets the default).
    pub(crate) fn get(&mut self, key: &'a str) -> Option<&'a Value> {
        self.seen.insert(key);
        self.map.get(key).filter(|v| !v.is_null())
    }

    /// Reports every key that was never asked for as an unknown field.
    pub(crate) fn finish(self, warnings: &mut Vec<String>) {
        for key in self.map.keys() {
            if !self.seen.contains(key.as_str()) {
                warnings.push(format!("{}: unknown field, ignored", join(&self.path, key)));
            }
        }
    }
}

/// A string field; a non-string value is a problem.
pub(crate) fn as_string(v: &Value, path: &str, problems: &mut Problems) -> Option<String> {
    match v {
        Value::String(s) => Some(s.clone()),
        other => {
            problems.push(path, format!("must be a string, got {}", kind_of(other)));
            None
        }
    }
}

/// A required, non-empty string field.
pub(crate) fn required_string(
    v: Option<&Value>,
    path: &str,
    problems: &mut Problems,
) -> Option<String> {
    let Some(v) = v else {
        problems.push(path, "required");
        return None;
    };
    let s = as_string(v, path, problems)?;
    if s.trim().is_empty() {
        problems.push(path, "required (must not be empty)");
        return None;
    }
    Some(s)
}

pub(crate) fn as_bool(v: &Value, path: &str, problems: &mut Problems) -> Option<bool> {
    match v {
        Value::Bool(b) => Some(*b),
        other => {
            problems.push(
                path,
                format!("must be true or false, got {}", describe(other)),
            );
            None
        }
    }
}

/// A finite number (integers are fine for float fields, as in Go's JSON decoder).
pub(crate) fn as_f64(v: &Value, path: &str, problems: &mut Problems) -> Option<f64> {
    match v.as_f64() {
        Some(f) if f.is_finite() => Some(f),
        _ => {
            problems.push(path, format!("must be a number, got {}", describe(v)));
            None
        }
    }
}

/// A non-negative integer that fits in `u32`.
pub(crate) fn as_u32(v: &Value, path: &str, problems: &mut Problems) -> Option<u32> {
    if let Some(n) = v.as_u64() {
        if let Ok(n) = u32::try_from(n) {
            return Some(n);
        }
        problems.push(path, format!("must be at most {}, got {n}", u32::MAX));
        return None;
    }
    problems.push(
        path,
        format!("must be a non-negative integer, got {}", describe(v)),
    );
    None
}

/// A duration in Go syntax. Like `metav1.Duration`, only strings are accepted: a bare number is
/// ambiguous (seconds? nanoseconds?) and the reference rejects it too.
pub(crate) fn as_duration(v: &Value, path: &str, problems: &mut Problems) -> Option<Duration> {
    match v {
        Value::String(s) => match parse_go_duration(s) {
            Ok(d) => Some(d),
            Err(e) => {
                problems.push(path, e.to_string());
                None
            }
        },
        Value::Number(n) => {
            problems.push(
                path,
                format!(
                    "must be a duration string such as \"30s\" or \"1m30s\", got the bare number {n}"
                ),
            );
            None
        }
        other => {
            problems.push(
                path,
                format!(
                    "must be a duration string such as \"30s\", got {}",
                    kind_of(other)
                ),
            );
            None
        }
    }
}

/// Describes a scalar by value (short ones) or by kind, for "got …" messages.
pub(crate) fn describe(v: &Value) -> String {
    match v {
        Value::String(s) => format!("the string {s:?}"),
        Value::Number(n) => n.to_string(),
        Value::Bool(b) => b.to_string(),
        other => kind_of(other).to_owned(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn malformed_yaml_is_a_yaml_error() {
        let err = load_mapping("a: [1, 2\nb: }").unwrap_err();
        assert!(matches!(err, ConfigError::Yaml { .. }), "{err:?}");
        assert!(
            err.to_string()
                .starts_with("config file is not valid YAML: line 2"),
            "{err}"
        );
    }

    #[test]
    fn duplicate_keys_keep_the_last_value_like_the_reference() {
        let map = load_mapping("a: 1\na: 2\n").unwrap();
        assert_eq!(map["a"], 2);
    }

    #[test]
    fn non_mapping_documents_are_rejected_with_their_kind() {
        assert_eq!(
            load_mapping("- a\n- b\n").unwrap_err(),
            ConfigError::NotAMapping { found: "a list" }
        );
        assert_eq!(
            load_mapping("").unwrap_err(),
            ConfigError::NotAMapping {
                found: "an empty document"
            }
        );
        assert_eq!(
            load_mapping("just text").unwrap_err(),
            ConfigError::NotAMapping { found: "a string" }
        );
    }

    #[test]
    fn invalid_error_lists_every_problem_with_its_path() {
        let err = ConfigError::Invalid {
            problems: vec![
                FieldProblem {
                    path: "a".into(),
                    message: "required".into(),
                },
                FieldProblem {
                    path: "b[0].c".into(),
                    message: "must be > 0".into(),
                },
            ],
        };
        assert_eq!(
            err.to_string(),
            "invalid config (2 problems):\n  - a: required\n  - b[0].c: must be > 0"
        );
    }
}
