//! Configuration files of the prober and the weeder.
//!
//! Both subcommands read a YAML (or JSON) file that Gardener renders into a ConfigMap; the drop-in
//! rule says every file the reference accepts must load here with the same meaning. So the file is
//! first read the way the reference's `sigs.k8s.io/yaml` reads it ([`goyaml`]: YAML 1.1 scalars,
//! first document only, merge keys in go-yaml v2's order), and the fields are then decoded with
//! `encoding/json`'s rules ([`Fields`]): names match case-insensitively, a number or boolean is
//! taken for a string field, `null` leaves a field at its default, unknown fields are ignored.
//!
//! We walk the tree by hand instead of deriving `Deserialize`, because that is what lets us
//! (a) report *every* bad field in one error, each with its path, so an operator fixes a config in
//! one round trip, and (b) return warnings for what loads but deserves a look: unknown fields
//! (the reference ignores them silently), values read differently than they look, and values
//! the reference accepts although they switch protection off or scale healthy shoots down.

mod goyaml;
pub mod prober;
pub mod weeder;

use std::collections::BTreeMap;
use std::fmt;

use thiserror::Error;

use crate::duration::parse_go_duration_nanos;
use goyaml::GoValue;

pub use prober::{DependentResourceInfo, ProberConfig, ResourceRef, ScaleInfo};
pub use weeder::{DependantSelectors, WeederConfig};

/// A successfully loaded configuration plus the things that were accepted but deserve the
/// operator's attention. Warnings are full sentences that start with the field path, e.g.
/// `dependentResourceInfos[0].scaleUp.replicas: unknown field, ignored`; the binary logs each once
/// at startup.
#[derive(Debug, Clone, PartialEq)]
pub struct Loaded<T> {
    /// The effective configuration, with every default filled in.
    pub config: T,
    /// One sentence per accepted-but-questionable value or unknown field, each starting with
    /// the field's path; empty for a clean file.
    pub warnings: Vec<String>,
}

/// One bad field: where it is and what is wrong with it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FieldProblem {
    /// Path in the document, e.g. `dependentResourceInfos[1].scaleDown`.
    pub path: String,
    /// What is wrong with the field and, where it helps, what the field accepts, e.g.
    /// `required (must not be empty)`; empty `path` makes it a whole-document problem.
    pub message: String,
}

impl fmt::Display for FieldProblem {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.path.is_empty() {
            f.write_str(&self.message)
        } else {
            write!(f, "{}: {}", self.path, self.message)
        }
    }
}

/// Why a configuration file could not be loaded.
#[derive(Debug, Clone, PartialEq, Error)]
pub enum ConfigError {
    /// The text is not YAML the reference's parser (go-yaml v2) would read.
    #[error("config file is not valid YAML: {message}")]
    Yaml {
        /// The parser's description of the syntax error, with its position.
        message: String,
    },
    /// The first document is YAML but a scalar or a list, not a mapping of fields.
    #[error("config file must be a YAML mapping of fields, but it is {found}")]
    NotAMapping {
        /// The document's kind with an article, e.g. `a list` or `a string`.
        found: &'static str,
    },
    /// The document is a mapping but one or more fields are missing or invalid.
    #[error("{}", render_problems(problems))]
    Invalid {
        /// Every bad field, each with its path, in the order they were found; never empty.
        problems: Vec<FieldProblem>,
    },
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

/// Reads a config file into its top-level mapping. An empty file is an empty mapping: the
/// reference decodes it into an all-default config and then names the required fields missing,
/// and so do we.
pub(crate) fn load_document(text: &str) -> Result<goyaml::GoMap, ConfigError> {
    let doc = goyaml::load(text).map_err(|e| ConfigError::Yaml { message: e.0 })?;
    match doc {
        GoValue::Map(map) => Ok(map),
        GoValue::Null => Ok(goyaml::GoMap::default()),
        other => Err(ConfigError::NotAMapping {
            found: kind_of(&other),
        }),
    }
}

/// Describes a value's kind with an article, for messages like "must be a string, got a list".
pub(crate) fn kind_of(v: &GoValue) -> &'static str {
    match v {
        GoValue::Null => "null",
        GoValue::Bool(..) => "a boolean",
        GoValue::Int(..) | GoValue::Uint(..) | GoValue::Float(..) => "a number",
        GoValue::Str(_) => "a string",
        GoValue::Seq(_) => "a list",
        GoValue::Map(_) => "a mapping",
    }
}

/// Describes a scalar by value (as written) or a collection by kind, for "got …" messages.
pub(crate) fn describe(v: &GoValue) -> String {
    match v {
        GoValue::Str(s) => format!("the string {s:?}"),
        GoValue::Bool(_, text)
        | GoValue::Int(_, text)
        | GoValue::Uint(_, text)
        | GoValue::Float(_, text) => text.clone(),
        other => kind_of(other).to_owned(),
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

/// What one load collects: every problem (so validation never stops at the first one) and every
/// warning.
#[derive(Debug, Default)]
pub(crate) struct Ctx {
    pub(crate) problems: Vec<FieldProblem>,
    pub(crate) warnings: Vec<String>,
}

impl Ctx {
    pub(crate) fn problem(&mut self, path: impl Into<String>, message: impl Into<String>) {
        self.problems.push(FieldProblem {
            path: path.into(),
            message: message.into(),
        });
    }

    pub(crate) fn warn(&mut self, path: &str, message: impl fmt::Display) {
        self.warnings.push(if path.is_empty() {
            message.to_string()
        } else {
            format!("{path}: {message}")
        });
    }

    /// The loaded config, or every problem found.
    pub(crate) fn finish<T>(self, config: Option<T>) -> Result<Loaded<T>, ConfigError> {
        match config {
            Some(config) if self.problems.is_empty() => Ok(Loaded {
                config,
                warnings: self.warnings,
            }),
            _ => {
                let mut problems = self.problems;
                if problems.is_empty() {
                    // Defensive: a missing value without a recorded problem would be our bug;
                    // still refuse rather than run with a half-built config.
                    problems.push(FieldProblem {
                        path: String::new(),
                        message: "config could not be assembled".to_owned(),
                    });
                }
                Err(ConfigError::Invalid { problems })
            }
        }
    }
}

/// The outcome of decoding one field.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum Got<T> {
    /// Not in the file, or `null`: the field keeps its default.
    Absent,
    Value(T),
    /// Present but unusable; the problem is recorded.
    Invalid,
}

impl<T> Got<T> {
    /// The value, or `default` when absent; `None` when invalid.
    pub(crate) fn or(self, default: T) -> Option<T> {
        match self {
            Got::Absent => Some(default),
            Got::Value(v) => Some(v),
            Got::Invalid => None,
        }
    }

    /// The value when it is there and `usable`; otherwise `None`, with `problem` recorded at
    /// `key` (an invalid value's problem is recorded already).
    pub(crate) fn required(
        self,
        usable: impl FnOnce(&T) -> bool,
        (key, problem): (&str, &str),
        cx: &mut Ctx,
    ) -> Option<T> {
        match self {
            Got::Invalid => None,
            Got::Value(v) if usable(&v) => Some(v),
            _ => {
                cx.problem(key, problem);
                None
            }
        }
    }

    pub(crate) fn map<U>(self, f: impl FnOnce(T) -> U) -> Got<U> {
        match self {
            Got::Absent => Got::Absent,
            Got::Value(v) => Got::Value(f(v)),
            Got::Invalid => Got::Invalid,
        }
    }
}

/// `encoding/json`'s key folding (`foldName`): ASCII letters and the few non-ASCII letters whose
/// lower-then-upper case is an ASCII letter (Kelvin sign, long s, dotless i, dotted I) compare
/// equal to their ASCII capitals. Field names are ASCII, so no other character can match one.
fn fold_json(key: &str) -> String {
    key.chars()
        .map(|c| match c {
            '\u{212A}' => 'K',
            '\u{17F}' => 'S',
            '\u{131}' | '\u{130}' => 'I',
            c => c.to_ascii_uppercase(),
        })
        .collect()
}

/// The older folding `sigs.k8s.io/yaml` uses to find a key's field before converting numbers to
/// strings (`bytes.EqualFold`-like: the Kelvin sign and the long s, not the Turkish i's). A key
/// that only `encoding/json` matches gets its number unconverted, and then fails as a string.
fn fold_yaml(key: &str) -> String {
    key.chars()
        .map(|c| match c {
            '\u{212A}' => 'K',
            '\u{17F}' => 'S',
            c => c.to_ascii_uppercase(),
        })
        .collect()
}

/// One key of a mapping that a field matched.
struct Match<'a> {
    key: &'a str,
    value: &'a GoValue,
    /// Whether `sigs.k8s.io/yaml` saw this key as the field, and so turned a number or boolean
    /// into a string when the field is one.
    coercible: bool,
}

/// The fields of mapping `v` at `path`, `null` counting as an empty mapping (Go decodes
/// `null` into a zero struct); anything else is a problem.
pub(crate) fn mapping_or_null<'a>(v: &'a GoValue, path: &str, cx: &mut Ctx) -> Option<Fields<'a>> {
    match v {
        GoValue::Map(map) => Some(Fields::of_map(map, path)),
        GoValue::Null => Some(Fields::new(Vec::new(), path)),
        other => {
            cx.problem(path, format!("must be a mapping, got {}", kind_of(other)));
            None
        }
    }
}

/// A Go struct being decoded from a mapping, field by field. It remembers which keys were used so
/// that the rest can be reported as unknown once the caller is done.
pub(crate) struct Fields<'a> {
    path: String,
    /// The mapping's entries in the order `encoding/json` decodes them: key order, and for a
    /// struct given twice under case variants of its name, the first mapping's entries then the
    /// second's (Go decodes the second into the same struct).
    entries: Vec<(&'a str, &'a GoValue)>,
    seen: Vec<bool>,
}

impl<'a> Fields<'a> {
    pub(crate) fn new(entries: Vec<(&'a str, &'a GoValue)>, path: impl Into<String>) -> Self {
        let seen = vec![false; entries.len()];
        Self {
            path: path.into(),
            entries,
            seen,
        }
    }

    pub(crate) fn of_map(map: &'a BTreeMap<String, GoValue>, path: impl Into<String>) -> Self {
        Self::new(map.iter().map(|(k, v)| (k.as_str(), v)).collect(), path)
    }

    pub(crate) fn path_of(&self, key: &str) -> String {
        join(&self.path, key)
    }

    /// Every key that names `field`, exactly or case-insensitively, in decoding order. A key that
    /// only matches case-insensitively gets a warning: it works (the reference reads it too),
    /// but it is probably a typo.
    fn lookup(&mut self, field: &str, cx: &mut Ctx) -> Vec<Match<'a>> {
        let want_json = fold_json(field);
        let want_yaml = fold_yaml(field);
        let mut out = Vec::new();
        for (i, (key, value)) in self.entries.iter().enumerate() {
            if *key == field || fold_json(key) == want_json {
                if *key != field && !self.seen[i] {
                    cx.warn(
                        &join(&self.path, key),
                        format_args!(
                            "read as {field} (field names match case-insensitively, as in the reference)"
                        ),
                    );
                }
                self.seen[i] = true;
                out.push(Match {
                    key,
                    value,
                    coercible: *key == field || fold_yaml(key) == want_yaml,
                });
            }
        }
        out
    }

    /// Decodes a field with `conv`, following `encoding/json`: each matching key in turn, the
    /// last one wins; `null` resets a `nullable` field (a Go pointer, slice or map) to absent and
    /// leaves any other unchanged. A key that fails makes the field invalid, as Go's decoder then
    /// fails the whole file.
    fn decode<T>(
        &mut self,
        field: &str,
        nullable: bool,
        cx: &mut Ctx,
        mut conv: impl FnMut(&'a GoValue, &str, bool, &mut Ctx) -> Option<T>,
    ) -> Got<T> {
        let mut out = Got::Absent;
        let mut bad = false;
        for m in self.lookup(field, cx) {
            if matches!(m.value, GoValue::Null) {
                if nullable {
                    out = Got::Absent;
                }
                continue;
            }
            let path = join(&self.path, m.key);
            match conv(m.value, &path, m.coercible, cx) {
                Some(v) => out = Got::Value(v),
                None => bad = true,
            }
        }
        if bad { Got::Invalid } else { out }
    }

    /// A Go `string` field.
    pub(crate) fn string(&mut self, field: &str, cx: &mut Ctx) -> Got<String> {
        self.decode(field, false, cx, to_string)
    }

    /// A Go `bool` field.
    pub(crate) fn bool(&mut self, field: &str, cx: &mut Ctx) -> Got<bool> {
        self.decode(field, false, cx, |v, path, _, cx| match v {
            GoValue::Bool(b, _) => Some(*b),
            other => {
                cx.problem(
                    path,
                    format!("must be true or false, got {}", describe(other)),
                );
                None
            }
        })
    }

    /// A Go `int` field (64 bits).
    pub(crate) fn int(&mut self, field: &str, cx: &mut Ctx) -> Got<i64> {
        self.decode(field, false, cx, to_int)
    }

    /// A Go `*float64` field.
    pub(crate) fn float(&mut self, field: &str, cx: &mut Ctx) -> Got<f64> {
        self.decode(field, true, cx, |v, path, _, cx| match v {
            GoValue::Int(i, _) => Some(*i as f64),
            GoValue::Uint(u, _) => Some(*u as f64),
            GoValue::Float(f, _) if f.is_finite() => Some(*f),
            GoValue::Float(_, text) => {
                cx.problem(path, non_finite(text));
                None
            }
            other => {
                cx.problem(path, format!("must be a number, got {}", describe(other)));
                None
            }
        })
    }

    /// A `*metav1.Duration` field, as Go's signed nanoseconds.
    pub(crate) fn duration(&mut self, field: &str, cx: &mut Ctx) -> Got<i64> {
        self.decode(field, true, cx, |v, path, _, cx| match v {
            GoValue::Str(s) => match parse_go_duration_nanos(s) {
                Ok(d) => Some(d),
                Err(e) => {
                    cx.problem(path, e.to_string());
                    None
                }
            },
            // `metav1.Duration` reads only JSON strings; a bare number is ambiguous anyway
            // (seconds? nanoseconds?).
            other @ (GoValue::Int(..) | GoValue::Uint(..) | GoValue::Float(..)) => {
                cx.problem(
                    path,
                    format!(
                        "must be a duration string such as \"30s\" or \"1m30s\", got the bare number {}",
                        describe(other)
                    ),
                );
                None
            }
            other => {
                cx.problem(
                    path,
                    format!(
                        "must be a duration string such as \"30s\", got {}",
                        kind_of(other)
                    ),
                );
                None
            }
        })
    }

    /// A Go slice field: the last list given wins, `null` empties it.
    pub(crate) fn list(&mut self, field: &str, cx: &mut Ctx) -> Got<(String, &'a [GoValue])> {
        self.decode(field, true, cx, |v, path, _, cx| match v {
            GoValue::Seq(items) => Some((path.to_owned(), items.as_slice())),
            other => {
                cx.problem(path, format!("must be a list, got {}", kind_of(other)));
                None
            }
        })
    }

    /// A pointer-to-struct field: its entries in decoding order (several case variants of the
    /// name decode into the same struct, so their entries add up; `null` starts over).
    pub(crate) fn object(
        &mut self,
        field: &str,
        cx: &mut Ctx,
    ) -> Got<(String, Vec<(&'a str, &'a GoValue)>)> {
        self.entries_of(field, false, cx)
    }

    fn entries_of(
        &mut self,
        field: &str,
        user_keys: bool,
        cx: &mut Ctx,
    ) -> Got<(String, Vec<(&'a str, &'a GoValue)>)> {
        let mut out: Got<(String, Vec<(&'a str, &'a GoValue)>)> = Got::Absent;
        let mut bad = false;
        for m in self.lookup(field, cx) {
            let path = join(&self.path, m.key);
            match m.value {
                GoValue::Null => out = Got::Absent,
                GoValue::Map(map) => {
                    let mut entries = match out {
                        Got::Value((_, entries)) => entries,
                        _ => Vec::new(),
                    };
                    entries.extend(map.iter().map(|(k, v)| (k.as_str(), v)));
                    if user_keys {
                        warn_written_keys(map, &path, cx);
                    }
                    out = Got::Value((path, entries));
                }
                other => {
                    cx.problem(&path, format!("must be a mapping, got {}", kind_of(other)));
                    bad = true;
                }
            }
        }
        if bad { Got::Invalid } else { out }
    }

    /// A Go map field: keys of several mappings given under case variants of the name add up
    /// (a later key replaces an earlier one's value); `null` starts over.
    pub(crate) fn map(
        &mut self,
        field: &str,
        cx: &mut Ctx,
    ) -> Got<(String, BTreeMap<&'a str, &'a GoValue>)> {
        self.entries_of(field, true, cx)
            .map(|(path, entries)| (path, entries.into_iter().collect()))
    }

    /// Reports every key that was never asked for as an unknown field. The reference ignores
    /// them too, except that a NaN or infinity anywhere can't be turned into JSON, which fails
    /// its whole file.
    pub(crate) fn finish(self, cx: &mut Ctx) {
        for (i, (key, value)) in self.entries.iter().enumerate() {
            if !self.seen[i] {
                let path = join(&self.path, key);
                cx.warn(&path, "unknown field, ignored");
                check_json_numbers(value, &path, cx);
            }
        }
    }
}

/// Warns about the keys of a user-data mapping (labels, services) that YAML 1.1 read as something
/// else than they look (`n:` is the key "false"), as the reference reads them.
pub(crate) fn warn_written_keys(map: &goyaml::GoMap, path: &str, cx: &mut Ctx) {
    for (key, written) in &map.written {
        cx.warn(
            &join(path, key),
            format_args!(
                "the unquoted key {written} is read as \"{key}\" (YAML 1.1, as the reference reads it); quote it to mean \"{written}\""
            ),
        );
    }
}

/// Records a problem for every NaN or infinity in an ignored value (see [`Fields::finish`]).
pub(crate) fn check_json_numbers(v: &GoValue, path: &str, cx: &mut Ctx) {
    match v {
        GoValue::Float(f, text) if !f.is_finite() => cx.problem(path, non_finite(text)),
        GoValue::Seq(items) => {
            for (i, item) in items.iter().enumerate() {
                check_json_numbers(item, &format!("{path}[{i}]"), cx);
            }
        }
        GoValue::Map(map) => {
            for (k, item) in map.iter() {
                check_json_numbers(item, &join(path, k), cx);
            }
        }
        _ => {}
    }
}

fn non_finite(text: &str) -> String {
    format!(
        "{text} is not a number JSON can hold; the reference rejects the file (quote it if a string is meant)"
    )
}

/// A Go `string` target: strings as they are, and (as `sigs.k8s.io/yaml` does for a key it
/// recognises) numbers and booleans as Go prints them. When that printing differs from what was
/// written (`on` → `true`, `010` → `8`, `1.0` → `1`), the operator most likely meant the text,
/// so a warning says how it was read and how to get the text.
pub(crate) fn to_string(v: &GoValue, path: &str, coercible: bool, cx: &mut Ctx) -> Option<String> {
    let printed = match v {
        GoValue::Str(s) => return Some(s.clone()),
        GoValue::Bool(b, text) => (b.to_string(), text),
        GoValue::Int(i, text) => (i.to_string(), text),
        GoValue::Uint(u, text) => (u.to_string(), text),
        GoValue::Float(f, text) => (goyaml::format_float32_g(*f), text),
        other => {
            cx.problem(path, format!("must be a string, got {}", kind_of(other)));
            return None;
        }
    };
    let (value, text) = printed;
    if !coercible {
        cx.problem(path, format!("must be a string, got {}", describe(v)));
        return None;
    }
    if value != *text {
        cx.warn(
            path,
            format_args!(
                "the unquoted {text} is read as \"{value}\" (YAML 1.1, as the reference reads it); quote it to mean \"{text}\""
            ),
        );
    }
    Some(value)
}

/// A Go `int` target. A float is fine when the number `json.Marshal` writes for it (its
/// shortest decimal digits, padded with zeros) parses as an int64: `1.0` is 1, and 2^63 as a
/// float (written 9223372036854776000) is out of range. Rust prints an `f64` the same way.
pub(crate) fn to_int(v: &GoValue, path: &str, _coercible: bool, cx: &mut Ctx) -> Option<i64> {
    match v {
        GoValue::Int(i, _) => Some(*i),
        GoValue::Float(f, text) if !f.is_finite() => {
            cx.problem(path, non_finite(text));
            None
        }
        GoValue::Float(f, text) => match f.to_string().parse::<i64>() {
            Ok(i) => Some(i),
            Err(_) => {
                cx.problem(path, format!("must be a 64-bit integer, got {text}"));
                None
            }
        },
        GoValue::Uint(_, text) => {
            cx.problem(path, format!("must be a 64-bit integer, got {text}"));
            None
        }
        other => {
            cx.problem(path, format!("must be an integer, got {}", describe(other)));
            None
        }
    }
}

/// Go's `strings.TrimSpace(s) == ""`.
pub(crate) fn is_blank(s: &str) -> bool {
    s.trim().is_empty()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn malformed_yaml_is_a_yaml_error() {
        let err = load_document("a: [1, 2\nb: }").unwrap_err();
        assert!(matches!(err, ConfigError::Yaml { .. }), "{err:?}");
        let text = err.to_string();
        assert!(
            text.starts_with("config file is not valid YAML: ") && text.contains("line 2"),
            "{err}"
        );
    }

    #[test]
    fn duplicate_keys_keep_the_last_value_like_the_reference() {
        let map = load_document("a: 1\na: 2\n").unwrap();
        assert_eq!(map["a"], GoValue::Int(2, "2".into()));
    }

    #[test]
    fn non_mapping_documents_are_rejected_with_their_kind() {
        assert_eq!(
            load_document("- a\n- b\n").unwrap_err(),
            ConfigError::NotAMapping { found: "a list" }
        );
        assert_eq!(
            load_document("just text").unwrap_err(),
            ConfigError::NotAMapping { found: "a string" }
        );
    }

    #[test]
    fn an_empty_file_is_an_empty_mapping_whose_required_fields_are_then_missing() {
        // The reference decodes `null` into an all-default config and fails its validation.
        assert!(load_document("").unwrap().is_empty());
        assert!(load_document("# nothing\n").unwrap().is_empty());
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

    fn fields_of(text: &str) -> BTreeMap<String, GoValue> {
        load_document(text).unwrap().entries
    }

    #[test]
    fn field_names_match_case_insensitively_and_the_last_key_in_byte_order_wins() {
        let map = fields_of("ProbeInterval: 5s\nprobeinterval: 7s\n");
        let mut cx = Ctx::default();
        let mut f = Fields::of_map(&map, "");
        // "ProbeInterval" < "probeinterval": Go decodes both, in that order.
        assert_eq!(
            f.duration("probeInterval", &mut cx),
            Got::Value(7_000_000_000)
        );
        f.finish(&mut cx);
        assert!(cx.problems.is_empty());
        assert_eq!(
            cx.warnings,
            [
                "ProbeInterval: read as probeInterval (field names match case-insensitively, as in the reference)",
                "probeinterval: read as probeInterval (field names match case-insensitively, as in the reference)",
            ]
        );
    }

    /// What [`Fields::string`] reads for each of `keys`, in order, from mapping `yaml`, and
    /// the context after.
    fn strings_of(yaml: &str, keys: &[&str]) -> (Vec<Got<String>>, Ctx) {
        let map = fields_of(yaml);
        let mut cx = Ctx::default();
        let mut f = Fields::of_map(&map, "");
        let got = keys.iter().map(|k| f.string(k, &mut cx)).collect();
        (got, cx)
    }

    #[test]
    fn the_kelvin_sign_and_long_s_fold_like_go() {
        let (got, _) = strings_of("\u{17F}cale: a\nmas\u{212A}: b\n", &["scale", "mask"]);
        assert_eq!(got, [Got::Value("a".into()), Got::Value("b".into())]);
    }

    #[test]
    fn numbers_and_booleans_become_strings_where_a_string_is_wanted() {
        let yaml = "a: 123\nb: 1.0\nc: on\nd: 0x1F\ne: [x]\n";
        let (got, cx) = strings_of(yaml, &["a", "b", "c", "d", "e"]);
        let value = |s: &str| Got::Value(s.to_string());
        assert_eq!(
            got,
            [
                value("123"),
                value("1"),
                value("true"),
                value("31"),
                Got::Invalid
            ]
        );
        assert_eq!(cx.warnings.len(), 3, "{:?}", cx.warnings);
        assert!(cx.warnings[1].starts_with("c: the unquoted on is read as \"true\""));
    }

    #[test]
    fn null_resets_pointers_and_leaves_values_alone() {
        let map = fields_of("A: 5s\na: null\nB: x\nb: null\n");
        let mut cx = Ctx::default();
        let mut f = Fields::of_map(&map, "");
        assert_eq!(f.duration("a", &mut cx), Got::Absent);
        assert_eq!(f.string("b", &mut cx), Got::Value("x".into()));
    }

    #[test]
    fn a_nan_in_an_unknown_field_fails_the_file_as_in_the_reference() {
        let map = fields_of("x: [1, .nan]\n");
        let mut cx = Ctx::default();
        Fields::of_map(&map, "").finish(&mut cx);
        assert_eq!(cx.problems.len(), 1);
        assert_eq!(cx.problems[0].path, "x[1]");
    }
}
