//! Config parity with the reference (dependency-watchdog v1.7.0), file by file.
//!
//! Each row is a config text, what the reference does with it (accepts it with which effective
//! values, rejects it, or crashes), read from its code and cited per row, and what we do. The
//! test asserts that we do the same, row by row, except in rows marked as an argued difference
//! (the reason is in the row); it also asserts exactly which fields we warn about.
//!
//! "The same" means the same runtime meaning: where the reference keeps a value we can't hold
//! (a negative duration, a level outside `u32`, "no timeout"), [`meaning`] maps its value to ours
//! (`max(0, d)` for durations that Go's timers treat as 0 when negative, `NO_TIMEOUT`, levels
//! renumbered in the same order).
//!
//! The "reference" column is not only read off the code: `reference_column_matches_the_oracle`
//! (ignored by default; `cargo test -p dwd-core --test parity -- --ignored`, needs Go) runs every
//! row through the reference's own loaders (`reference-oracle/`, the reference's config code
//! copied verbatim) and compares.

// A test crate: a failed assumption is a failed test (outside tests the workspace denies these).
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use dwd_core::config::prober::NO_TIMEOUT;
use dwd_core::{ConfigError, ProberConfig, WeederConfig};

const S: i64 = 1_000_000_000;
const MS: i64 = 1_000_000;

// ---------------------------------------------------------------------------------------------
// Effective values, in the reference's terms (Go's signed nanoseconds, Go ints).

#[derive(Debug, Clone, PartialEq)]
struct P {
    secret: String,
    interval: i64,
    initial_delay: i64,
    timeout: i64,
    jitter: f64,
    kcm: i64,
    fraction: f64,
    infos: Vec<T>,
}

#[derive(Debug, Clone, PartialEq)]
struct T {
    api_version: String,
    kind: String,
    name: String,
    optional: bool,
    up: Sc,
    down: Sc,
}

#[derive(Debug, Clone, Copy, PartialEq)]
struct Sc {
    level: i64,
    initial_delay: i64,
    timeout: i64,
}

const SC: Sc = Sc {
    level: 0,
    initial_delay: 0,
    timeout: 30 * S,
};

fn target(name: &str) -> T {
    T {
        api_version: "apps/v1".into(),
        kind: "Deployment".into(),
        name: name.into(),
        optional: false,
        up: SC,
        down: SC,
    }
}

/// The reference's defaults (internal/prober/config.go fillDefaultValues) around one target.
fn p() -> P {
    P {
        secret: "s".into(),
        interval: 10 * S,
        initial_delay: 30 * S,
        timeout: 30 * S,
        jitter: 0.2,
        kcm: 40 * S,
        fraction: 0.6,
        infos: vec![target("kcm")],
    }
}

fn p_with(f: impl FnOnce(&mut P)) -> P {
    let mut v = p();
    f(&mut v);
    v
}

#[derive(Debug, Clone, PartialEq)]
struct W {
    watch: i64,
    /// Service → each selector as the pod watch's label query, normalised by [`norm_query`].
    services: BTreeMap<String, Vec<String>>,
}

fn w(watch: i64, services: &[(&str, &[&str])]) -> W {
    W {
        watch,
        services: services
            .iter()
            .map(|(s, qs)| ((*s).to_owned(), qs.iter().map(|q| norm_query(q)).collect()))
            .collect(),
    }
}

/// A label query with each value list deduplicated and the requirements sorted: Go renders
/// `k in (a,b,b)`, we render a set; both select the same pods.
fn norm_query(q: &str) -> String {
    let mut parts = Vec::new();
    let mut depth = 0;
    let mut cur = String::new();
    for c in q.chars() {
        match c {
            '(' => depth += 1,
            ')' => depth -= 1,
            ',' if depth == 0 => {
                parts.push(std::mem::take(&mut cur));
                continue;
            }
            _ => {}
        }
        cur.push(c);
    }
    if !cur.is_empty() {
        parts.push(cur);
    }
    let mut parts: Vec<String> = parts
        .into_iter()
        .map(|p| match (p.find('('), p.rfind(')')) {
            (Some(a), Some(b)) => {
                let values: BTreeSet<&str> = p[a + 1..b].split(',').collect();
                format!(
                    "{}({})",
                    &p[..a],
                    values.into_iter().collect::<Vec<_>>().join(",")
                )
            }
            _ => p,
        })
        .collect();
    parts.sort();
    parts.dedup();
    parts.join(",")
}

#[derive(Debug, Clone, PartialEq)]
enum Effective {
    Prober(P),
    Weeder(W),
}

#[derive(Debug, Clone, Copy, PartialEq)]
enum Kind {
    Prober,
    Weeder,
}

#[derive(Debug, Clone, PartialEq)]
enum Reference {
    Accepts(Effective),
    /// Refuses the file; `field` is where we report it ("" for a file that isn't a YAML mapping).
    Rejects {
        field: &'static str,
    },
    /// Crashes (a Go panic, so the process exits) on this file; we refuse it, naming `field`.
    Panics {
        field: &'static str,
    },
}

#[derive(Debug, Clone, PartialEq)]
enum Ours {
    Accepts(Effective),
    Rejects { field: &'static str },
}

struct Row {
    name: &'static str,
    /// The reference's code that decides the row (file: function).
    cite: &'static str,
    kind: Kind,
    text: String,
    reference: Reference,
    /// An argued difference: what we do instead, and why it is better for an operator.
    differs: Option<(Ours, &'static str)>,
    /// The fields we warn about (each warning starts with its field's path).
    warns: Vec<&'static str>,
}

fn row(
    name: &'static str,
    cite: &'static str,
    kind: Kind,
    text: impl Into<String>,
    reference: Reference,
    warns: &[&'static str],
) -> Row {
    Row {
        name,
        cite,
        kind,
        text: text.into(),
        reference,
        differs: None,
        warns: warns.to_vec(),
    }
}

/// Defines `$name(name, cite, text, reference, warns)`: a row of kind `$kind` (the table's rows
/// are the prober's and the weeder's, written alike).
macro_rules! row_of_kind {
    ($name:ident, $kind:expr) => {
        fn $name(
            name: &'static str,
            cite: &'static str,
            text: impl Into<String>,
            reference: Reference,
            warns: &[&'static str],
        ) -> Row {
            row(name, cite, $kind, text, reference, warns)
        }
    };
}

row_of_kind!(prober, Kind::Prober);
row_of_kind!(weeder, Kind::Weeder);

fn accepts_p(p: P) -> Reference {
    Reference::Accepts(Effective::Prober(p))
}

fn accepts_w(w: W) -> Reference {
    Reference::Accepts(Effective::Weeder(w))
}

fn rejects(field: &'static str) -> Reference {
    Reference::Rejects { field }
}

// ---------------------------------------------------------------------------------------------
// Config texts.

/// A minimal prober config: one target, levels 0/0; `top` goes at the top level.
fn base(top: &str) -> String {
    format!(
        "kubeConfigSecretName: s\n{top}dependentResourceInfos:\n- ref: {{apiVersion: apps/v1, kind: Deployment, name: kcm}}\n  scaleUp: {{level: 0}}\n  scaleDown: {{level: 0}}\n"
    )
}

/// A prober config whose one target's entry is `entry` (YAML flow or block, indented by 2).
fn with_entry(entry: &str) -> String {
    format!("kubeConfigSecretName: s\ndependentResourceInfos:\n- {entry}\n")
}

/// The `dep-config.yaml` key of the ConfigMap in one of deploy/gardener's manifests: the
/// configs gardenlet generates (see deploy/gardener/).
fn gardener_config(manifest: &str) -> String {
    let mut out = String::new();
    let mut inside = false;
    for line in manifest.lines() {
        if line.trim_end() == "  dep-config.yaml: |" {
            inside = true;
            continue;
        }
        if inside {
            match line.strip_prefix("    ") {
                Some(rest) => {
                    out.push_str(rest);
                    out.push('\n');
                }
                None if line.trim().is_empty() => out.push('\n'),
                None => break,
            }
        }
    }
    assert!(!out.is_empty(), "no dep-config.yaml in the manifest");
    out
}

const GARDENER_PROBER: &str = include_str!("../../../deploy/gardener/prober.yaml");
const GARDENER_WEEDER: &str = include_str!("../../../deploy/gardener/weeder.yaml");

fn weeder_one(selector: &str) -> String {
    format!("servicesAndDependantSelectors:\n  svc:\n    podSelectors:\n    - {selector}\n")
}

// ---------------------------------------------------------------------------------------------
// The table.

// The parity table itself: one row a case with the reference's answer, data read and extended
// as a table; cut into functions it would only gain boundaries that say nothing.
#[allow(clippy::too_many_lines)]
fn rows() -> Vec<Row> {
    use Reference::Panics;
    let mut rows = vec![
        // --- Gardener's generated configs: exact values, no warning.
        prober(
            "gardener prober config",
            "internal/prober/config.go: LoadConfig, fillDefaultValues",
            gardener_config(GARDENER_PROBER),
            accepts_p(P {
                secret: "shoot-access-dependency-watchdog-probe".into(),
                interval: 30 * S,
                infos: vec![
                    T {
                        up: Sc { level: 0, ..SC },
                        down: Sc { level: 1, ..SC },
                        ..target("kube-controller-manager")
                    },
                    T {
                        up: Sc {
                            level: 1,
                            initial_delay: 30 * S,
                            ..SC
                        },
                        down: Sc { level: 0, ..SC },
                        ..target("machine-controller-manager")
                    },
                    T {
                        optional: true,
                        up: Sc { level: 2, ..SC },
                        down: Sc { level: 0, ..SC },
                        ..target("cluster-autoscaler")
                    },
                ],
                ..p()
            }),
            &[],
        ),
        weeder(
            "gardener weeder config",
            "internal/weeder/config.go: LoadConfig",
            gardener_config(GARDENER_WEEDER),
            accepts_w(w(
                300 * S,
                &[
                    (
                        "etcd-main-client",
                        &["gardener.cloud/role in (controlplane),role in (apiserver)"],
                    ),
                    (
                        "kube-apiserver",
                        &["gardener.cloud/role in (controlplane),role notin (apiserver,main)"],
                    ),
                ],
            )),
            &[],
        ),
        // --- Defaults and missing fields.
        prober(
            "minimal config gets every default",
            "internal/prober/config.go: fillDefaultValues (nil pointers only)",
            base(""),
            accepts_p(p()),
            &[],
        ),
        prober(
            "missing level is 0",
            "api/prober/types.go: ScaleInfo.Level is an int",
            with_entry(
                "ref: {apiVersion: apps/v1, kind: Deployment, name: kcm}\n  scaleUp: {}\n  scaleDown: {initialDelay: 5s}",
            ),
            accepts_p(p_with(|p| p.infos[0].down.initial_delay = 5 * S)),
            &[],
        ),
        prober(
            "level: null is 0",
            "encoding/json: null into an int is a no-op",
            with_entry(
                "ref: {apiVersion: apps/v1, kind: Deployment, name: kcm}\n  scaleUp: {level: null}\n  scaleDown: {level: ~}",
            ),
            accepts_p(p()),
            &[],
        ),
        prober(
            "missing scaleUp",
            "internal/prober/config.go: validate, MustNotBeNil(\"scaleUp\")",
            with_entry(
                "ref: {apiVersion: apps/v1, kind: Deployment, name: kcm}\n  scaleDown: {level: 0}",
            ),
            rejects("dependentResourceInfos[0].scaleUp"),
            &[],
        ),
        prober(
            "missing scaleDown",
            "internal/prober/config.go: validate, MustNotBeNil(\"scaleDown\")",
            with_entry(
                "ref: {apiVersion: apps/v1, kind: Deployment, name: kcm}\n  scaleUp: {level: 0}",
            ),
            rejects("dependentResourceInfos[0].scaleDown"),
            &[],
        ),
        prober(
            "scaleDown: null",
            "internal/prober/config.go: validate, MustNotBeNil(\"scaleDown\")",
            with_entry(
                "ref: {apiVersion: apps/v1, kind: Deployment, name: kcm}\n  scaleUp: {level: 0}\n  scaleDown:",
            ),
            rejects("dependentResourceInfos[0].scaleDown"),
            &[],
        ),
        prober(
            "missing optional is false; optional: yes is true (YAML 1.1)",
            "api/prober/types.go: Optional bool; go-yaml v2 resolve: yes is a boolean",
            "kubeConfigSecretName: s\ndependentResourceInfos:\n- ref: {apiVersion: apps/v1, kind: Deployment, name: a}\n  scaleUp: {level: 0}\n  scaleDown: {level: 0}\n- ref: {apiVersion: apps/v1, kind: Deployment, name: b}\n  optional: yes\n  scaleUp: {level: 0}\n  scaleDown: {level: 0}\n",
            accepts_p(p_with(|p| {
                p.infos = vec![
                    target("a"),
                    T {
                        optional: true,
                        ..target("b")
                    },
                ];
            })),
            &[],
        ),
        prober(
            "optional: \"true\" (a string)",
            "encoding/json: a string into a bool is an UnmarshalTypeError",
            with_entry(
                "ref: {apiVersion: apps/v1, kind: Deployment, name: kcm}\n  optional: \"true\"\n  scaleUp: {level: 0}\n  scaleDown: {level: 0}",
            ),
            rejects("dependentResourceInfos[0].optional"),
            &[],
        ),
        prober(
            "optional: 1",
            "encoding/json: a number into a bool is an UnmarshalTypeError",
            with_entry(
                "ref: {apiVersion: apps/v1, kind: Deployment, name: kcm}\n  optional: 1\n  scaleUp: {level: 0}\n  scaleDown: {level: 0}",
            ),
            rejects("dependentResourceInfos[0].optional"),
            &[],
        ),
        prober(
            "missing kubeConfigSecretName",
            "internal/prober/config.go: validate, MustNotBeEmpty(\"KubeConfigSecretName\")",
            "dependentResourceInfos:\n- ref: {apiVersion: apps/v1, kind: Deployment, name: kcm}\n  scaleUp: {level: 0}\n  scaleDown: {level: 0}\n",
            rejects("kubeConfigSecretName"),
            &[],
        ),
        prober(
            "blank kubeConfigSecretName",
            "internal/util/validator.go: MustNotBeEmpty (strings.TrimSpace)",
            base("").replace("kubeConfigSecretName: s", "kubeConfigSecretName: \"  \""),
            rejects("kubeConfigSecretName"),
            &[],
        ),
        prober(
            "missing dependentResourceInfos",
            "internal/prober/config.go: validate, MustNotBeEmpty(\"ScaleResourceInfos\")",
            "kubeConfigSecretName: s\n",
            rejects("dependentResourceInfos"),
            &[],
        ),
        prober(
            "empty dependentResourceInfos",
            "internal/prober/config.go: validate, MustNotBeEmpty(\"ScaleResourceInfos\")",
            "kubeConfigSecretName: s\ndependentResourceInfos: []\n",
            rejects("dependentResourceInfos"),
            &[],
        ),
        prober(
            "dependentResourceInfos as a mapping",
            "encoding/json: an object into a slice is an UnmarshalTypeError",
            "kubeConfigSecretName: s\ndependentResourceInfos: {}\n",
            rejects("dependentResourceInfos"),
            &[],
        ),
        prober(
            "an empty file",
            "sigs.k8s.io/yaml: null decodes to a zero Config; validate names the required fields",
            "",
            rejects("kubeConfigSecretName"),
            &[],
        ),
        prober(
            "a list instead of a mapping",
            "encoding/json: an array into a struct is an UnmarshalTypeError",
            "- a\n- b\n",
            rejects(""),
            &[],
        ),
        prober(
            "not YAML",
            "go-yaml v2: parser error",
            "a: [1, 2\nb: }\n",
            rejects(""),
            &[],
        ),
        // --- A missing ref crashes the reference.
        prober(
            "missing ref",
            "internal/util/validator.go: ResourceRefMustBeValid dereferences a nil ref",
            with_entry("scaleUp: {level: 0}\n  scaleDown: {level: 0}"),
            Panics {
                field: "dependentResourceInfos[0].ref",
            },
            &[],
        ),
        prober(
            "a null entry",
            "internal/util/validator.go: ResourceRefMustBeValid dereferences a nil ref",
            "kubeConfigSecretName: s\ndependentResourceInfos: [null]\n",
            Panics {
                field: "dependentResourceInfos[0].ref",
            },
            &[],
        ),
        prober(
            "apiVersion with two slashes",
            "internal/util/validator.go: ResourceRefMustBeValid → schema.ParseGroupVersion",
            with_entry(
                "ref: {apiVersion: a/b/c, kind: Deployment, name: kcm}\n  scaleUp: {level: 0}\n  scaleDown: {level: 0}",
            ),
            rejects("dependentResourceInfos[0].ref.apiVersion"),
            &[],
        ),
        prober(
            "empty apiVersion, kind and name",
            "internal/util/validator.go: ResourceRefMustBeValid ignores scheme.Recognizes; nothing checks kind or name",
            with_entry("ref: {apiVersion: \"\"}\n  scaleUp: {level: 0}\n  scaleDown: {level: 0}"),
            accepts_p(p_with(|p| {
                p.infos = vec![T {
                    api_version: String::new(),
                    kind: String::new(),
                    name: String::new(),
                    ..target("")
                }];
            })),
            &[
                "dependentResourceInfos[0].ref.apiVersion",
                "dependentResourceInfos[0].ref.kind",
                "dependentResourceInfos[0].ref.name",
            ],
        ),
        prober(
            "an unknown kind and group",
            "internal/util/validator.go: the result of scheme.Recognizes is ignored",
            with_entry(
                "ref: {apiVersion: example.com/v9, kind: Widget, name: w}\n  scaleUp: {level: 0}\n  scaleDown: {level: 0}",
            ),
            accepts_p(p_with(|p| {
                p.infos = vec![T {
                    api_version: "example.com/v9".into(),
                    kind: "Widget".into(),
                    ..target("w")
                }];
            })),
            &[],
        ),
        prober(
            "duplicate targets",
            "internal/prober/config.go: validate has no uniqueness check",
            "kubeConfigSecretName: s\ndependentResourceInfos:\n- ref: {apiVersion: apps/v1, kind: Deployment, name: kcm}\n  scaleUp: {level: 0}\n  scaleDown: {level: 0}\n- ref: {apiVersion: apps/v1, kind: Deployment, name: kcm}\n  scaleUp: {level: 1}\n  scaleDown: {level: 1}\n",
            accepts_p(p_with(|p| {
                p.infos = vec![
                    target("kcm"),
                    T {
                        up: Sc { level: 1, ..SC },
                        down: Sc { level: 1, ..SC },
                        ..target("kcm")
                    },
                ];
            })),
            &["dependentResourceInfos[1].ref"],
        ),
        // --- Durations: zero, negative, odd syntax, for every duration field.
        prober(
            "probeInterval 0s: back to back",
            "internal/prober/prober.go: Run → wait.JitterUntilWithContext, a 0 period fires at once",
            base("probeInterval: 0s\n"),
            accepts_p(p_with(|p| p.interval = 0)),
            &["probeInterval"],
        ),
        prober(
            "probeInterval -5s: back to back",
            "internal/prober/prober.go: Run; a negative timer fires at once",
            base("probeInterval: -5s\n"),
            accepts_p(p_with(|p| p.interval = -5 * S)),
            &["probeInterval"],
        ),
        prober(
            "probeInterval: 0 (a bare number)",
            "metav1.Duration.UnmarshalJSON reads only JSON strings",
            base("probeInterval: 0\n"),
            rejects("probeInterval"),
            &[],
        ),
        prober(
            "probeInterval: \"0\" (Go's unitless zero)",
            "time.ParseDuration: \"0\" is the one number without a unit",
            base("probeInterval: \"0\"\n"),
            accepts_p(p_with(|p| p.interval = 0)),
            &["probeInterval"],
        ),
        prober(
            "initialDelay 0s",
            "internal/prober/prober.go: Run → SleepWithContext(0)",
            base("initialDelay: 0s\n"),
            accepts_p(p_with(|p| p.initial_delay = 0)),
            &[],
        ),
        prober(
            "initialDelay -1h counts as 0",
            "internal/util/util.go: SleepWithContext → time.After(negative) fires at once",
            base("initialDelay: -1h\n"),
            accepts_p(p_with(|p| p.initial_delay = -3600 * S)),
            &["initialDelay"],
        ),
        prober(
            "probeTimeout 0s: no timeout",
            "internal/util/k8shelper.go: config.Timeout = 0 → client-go sets no deadline",
            base("probeTimeout: 0s\n"),
            accepts_p(p_with(|p| p.timeout = 0)),
            &["probeTimeout"],
        ),
        prober(
            "probeTimeout -1s: no timeout",
            "client-go rest: a request timeout applies only when > 0",
            base("probeTimeout: -1s\n"),
            accepts_p(p_with(|p| p.timeout = -S)),
            &["probeTimeout"],
        ),
        prober(
            "kcmNodeMonitorGraceDuration 0s",
            "internal/prober/config.go: validate, MustNotBeZeroDuration",
            base("kcmNodeMonitorGraceDuration: 0s\n"),
            rejects("kcmNodeMonitorGraceDuration"),
            &[],
        ),
        prober(
            "kcmNodeMonitorGraceDuration -1s: every lease expired",
            "internal/util/validator.go: MustNotBeZeroDuration passes negatives; prober.go isLeaseExpired",
            base("kcmNodeMonitorGraceDuration: -1s\n"),
            accepts_p(p_with(|p| p.kcm = -S)),
            &["kcmNodeMonitorGraceDuration"],
        ),
        prober(
            "kcmNodeMonitorGraceDuration 1ns",
            "internal/util/validator.go: MustNotBeZeroDuration compares Seconds() with 0",
            base("kcmNodeMonitorGraceDuration: 1ns\n"),
            accepts_p(p_with(|p| p.kcm = 1)),
            &[],
        ),
        prober(
            "scale initialDelay and timeout: zero and negative",
            "internal/prober/scaler/scale.go: SleepWithContext(negative) is 0; WithTimeout(<= 0) is already expired",
            with_entry(
                "ref: {apiVersion: apps/v1, kind: Deployment, name: kcm}\n  scaleUp: {initialDelay: -5s, timeout: 0s}\n  scaleDown: {initialDelay: 0s, timeout: -1m}",
            ),
            accepts_p(p_with(|p| {
                p.infos[0].up = Sc {
                    initial_delay: -5 * S,
                    timeout: 0,
                    ..SC
                };
                p.infos[0].down = Sc {
                    initial_delay: 0,
                    timeout: -60 * S,
                    ..SC
                };
            })),
            &[
                "dependentResourceInfos[0].scaleUp.initialDelay",
                "dependentResourceInfos[0].scaleUp.timeout",
                "dependentResourceInfos[0].scaleDown.timeout",
            ],
        ),
        prober(
            "odd but valid duration syntax",
            "time.ParseDuration: fractions, compound values, µs/us, a sign",
            "kubeConfigSecretName: s\nprobeInterval: 1.5h2us\ninitialDelay: 2µs\nprobeTimeout: \"+1m\"\nkcmNodeMonitorGraceDuration: 300ms\ndependentResourceInfos:\n- ref: {apiVersion: apps/v1, kind: Deployment, name: kcm}\n  scaleUp: {level: 0, initialDelay: .5s, timeout: 1h2m3.5s}\n  scaleDown: {level: 0, initialDelay: 2us, timeout: 0.000000001s}\n",
            accepts_p(p_with(|p| {
                p.interval = 5400 * S + 2000;
                p.initial_delay = 2000;
                p.timeout = 60 * S;
                p.kcm = 300 * MS;
                p.infos[0].up = Sc {
                    level: 0,
                    initial_delay: 500 * MS,
                    timeout: 3723 * S + 500 * MS,
                };
                p.infos[0].down = Sc {
                    level: 0,
                    initial_delay: 2000,
                    timeout: 1,
                };
            })),
            &[],
        ),
        prober(
            "unknown duration unit",
            "time.ParseDuration: unknown unit \"d\"",
            base("probeInterval: 1d\n"),
            rejects("probeInterval"),
            &[],
        ),
        prober(
            "duration without a unit",
            "time.ParseDuration: missing unit",
            base("probeTimeout: \"10\"\n"),
            rejects("probeTimeout"),
            &[],
        ),
        prober(
            "empty duration",
            "time.ParseDuration(\"\") is an error",
            base("initialDelay: \"\"\n"),
            rejects("initialDelay"),
            &[],
        ),
        prober(
            "duration beyond Go's int64",
            "time.ParseDuration: overflow",
            base("probeInterval: 2562048h\n"),
            rejects("probeInterval"),
            &[],
        ),
        // --- Fractions and jitter.
        prober(
            "nodeLeaseFailureFraction 0: every shoot scaled down",
            "internal/prober/prober.go: shouldPerformScaleUp, fraction < 0 is never true",
            base("nodeLeaseFailureFraction: 0\n"),
            accepts_p(p_with(|p| p.fraction = 0.0)),
            &["nodeLeaseFailureFraction"],
        ),
        prober(
            "nodeLeaseFailureFraction 1",
            "internal/prober/prober.go: shouldPerformScaleUp",
            base("nodeLeaseFailureFraction: 1\n"),
            accepts_p(p_with(|p| p.fraction = 1.0)),
            &[],
        ),
        prober(
            "nodeLeaseFailureFraction 1.5: never scaled down",
            "internal/prober/prober.go: shouldPerformScaleUp, a fraction <= 1 is always < 1.5",
            base("nodeLeaseFailureFraction: 1.5\n"),
            accepts_p(p_with(|p| p.fraction = 1.5)),
            &["nodeLeaseFailureFraction"],
        ),
        prober(
            "nodeLeaseFailureFraction -0.1",
            "internal/prober/prober.go: shouldPerformScaleUp",
            base("nodeLeaseFailureFraction: -0.1\n"),
            accepts_p(p_with(|p| p.fraction = -0.1)),
            &["nodeLeaseFailureFraction"],
        ),
        prober(
            "nodeLeaseFailureFraction as a string",
            "encoding/json: a string into a float64 is an UnmarshalTypeError",
            base("nodeLeaseFailureFraction: \"0.5\"\n"),
            rejects("nodeLeaseFailureFraction"),
            &[],
        ),
        prober(
            "nodeLeaseFailureFraction .inf",
            "sigs.k8s.io/yaml: json.Marshal fails on +Inf",
            base("nodeLeaseFailureFraction: .inf\n"),
            rejects("nodeLeaseFailureFraction"),
            &[],
        ),
        prober(
            "backoffJitterFactor 0: no jitter",
            "apimachinery wait: jitteredBackoffManagerImpl jitters only when > 0",
            base("backoffJitterFactor: 0\n"),
            accepts_p(p_with(|p| p.jitter = 0.0)),
            &[],
        ),
        prober(
            "backoffJitterFactor -1: no jitter",
            "apimachinery wait: jitteredBackoffManagerImpl jitters only when > 0",
            base("backoffJitterFactor: -1\n"),
            accepts_p(p_with(|p| p.jitter = -1.0)),
            &["backoffJitterFactor"],
        ),
        prober(
            "backoffJitterFactor 5",
            "apimachinery wait.Jitter",
            base("backoffJitterFactor: 5\n"),
            accepts_p(p_with(|p| p.jitter = 5.0)),
            &[],
        ),
        prober(
            "backoffJitterFactor 1e10: the jittered delay overflows",
            "apimachinery wait.Jitter: time.Duration(float) overflows, the timer fires at once",
            base("backoffJitterFactor: 1e10\n"),
            accepts_p(p_with(|p| p.jitter = 1e10)),
            &["backoffJitterFactor"],
        ),
        // --- Levels.
        prober(
            "negative and huge levels",
            "internal/prober/scaler/util.go: sortAndGetUniqueLevels sorts Go ints",
            "kubeConfigSecretName: s\ndependentResourceInfos:\n- ref: {apiVersion: apps/v1, kind: Deployment, name: a}\n  scaleUp: {level: -3}\n  scaleDown: {level: 9223372036854775807}\n- ref: {apiVersion: apps/v1, kind: Deployment, name: b}\n  scaleUp: {level: 2}\n  scaleDown: {level: 1}\n",
            accepts_p(p_with(|p| {
                p.infos = vec![
                    T {
                        up: Sc { level: -3, ..SC },
                        down: Sc {
                            level: i64::MAX,
                            ..SC
                        },
                        ..target("a")
                    },
                    T {
                        up: Sc { level: 2, ..SC },
                        down: Sc { level: 1, ..SC },
                        ..target("b")
                    },
                ];
            })),
            &[
                "dependentResourceInfos[*].scaleUp.level",
                "dependentResourceInfos[*].scaleDown.level",
            ],
        ),
        prober(
            "level 1.0 and 010 (octal in YAML 1.1)",
            "go-yaml v2 resolve; encoding/json reads 1 (from 1.0) into an int",
            with_entry(
                "ref: {apiVersion: apps/v1, kind: Deployment, name: kcm}\n  scaleUp: {level: 1.0}\n  scaleDown: {level: 010}",
            ),
            accepts_p(p_with(|p| {
                p.infos[0].up.level = 1;
                p.infos[0].down.level = 8;
            })),
            &[],
        ),
        prober(
            "level 1.5",
            "encoding/json: 1.5 into an int is an UnmarshalTypeError",
            with_entry(
                "ref: {apiVersion: apps/v1, kind: Deployment, name: kcm}\n  scaleUp: {level: 1.5}\n  scaleDown: {level: 0}",
            ),
            rejects("dependentResourceInfos[0].scaleUp.level"),
            &[],
        ),
        prober(
            "level \"1\" (a string)",
            "encoding/json: a string into an int is an UnmarshalTypeError",
            with_entry(
                "ref: {apiVersion: apps/v1, kind: Deployment, name: kcm}\n  scaleUp: {level: \"1\"}\n  scaleDown: {level: 0}",
            ),
            rejects("dependentResourceInfos[0].scaleUp.level"),
            &[],
        ),
        prober(
            "level -2^63 as a float (written -9223372036854776000)",
            "encoding/json: json.Marshal writes the float's shortest digits, which overflow an int",
            with_entry(
                "ref: {apiVersion: apps/v1, kind: Deployment, name: kcm}\n  scaleUp: {level: -9223372036854775809}\n  scaleDown: {level: 0}",
            ),
            rejects("dependentResourceInfos[0].scaleUp.level"),
            &[],
        ),
        prober(
            "level beyond int64",
            "encoding/json: 9223372036854775808 overflows an int",
            with_entry(
                "ref: {apiVersion: apps/v1, kind: Deployment, name: kcm}\n  scaleUp: {level: 9223372036854775808}\n  scaleDown: {level: 0}",
            ),
            rejects("dependentResourceInfos[0].scaleUp.level"),
            &[],
        ),
        // --- Unknown fields, names, YAML and JSON details.
        prober(
            "unknown fields at every level",
            "encoding/json ignores unknown keys",
            "name: x\nkubeConfigSecretName: s\ndependentResourceInfos:\n- ref: {apiVersion: apps/v1, kind: Deployment, name: kcm, namespace: y}\n  priority: 3\n  scaleUp: {level: 0, replicas: 1}\n  scaleDown: {level: 0, replicas: 0}\n",
            accepts_p(p()),
            &[
                "dependentResourceInfos[0].ref.namespace",
                "dependentResourceInfos[0].scaleUp.replicas",
                "dependentResourceInfos[0].scaleDown.replicas",
                "dependentResourceInfos[0].priority",
                "name",
            ],
        ),
        prober(
            "field names in another case",
            "encoding/json matches field names case-insensitively; the last key in byte order wins",
            "KUBECONFIGSECRETNAME: s\nProbeInterval: 5s\nprobeinterval: 7s\nDependentResourceInfos:\n- REF: {APIVERSION: apps/v1, Kind: Deployment, NAME: kcm}\n  scaleup: {LEVEL: 2}\n  ScaleDown: {Level: 0, TIMEOUT: 1s}\n  OPTIONAL: true\n",
            accepts_p(p_with(|p| {
                p.interval = 7 * S;
                p.infos[0].optional = true;
                p.infos[0].up.level = 2;
                p.infos[0].down.timeout = S;
            })),
            &[
                "KUBECONFIGSECRETNAME",
                "ProbeInterval",
                "probeinterval",
                "DependentResourceInfos",
                "DependentResourceInfos[0].REF",
                "DependentResourceInfos[0].REF.APIVERSION",
                "DependentResourceInfos[0].REF.Kind",
                "DependentResourceInfos[0].REF.NAME",
                "DependentResourceInfos[0].OPTIONAL",
                "DependentResourceInfos[0].scaleup",
                "DependentResourceInfos[0].scaleup.LEVEL",
                "DependentResourceInfos[0].ScaleDown",
                "DependentResourceInfos[0].ScaleDown.Level",
                "DependentResourceInfos[0].ScaleDown.TIMEOUT",
            ],
        ),
        prober(
            "numbers and booleans where strings are wanted",
            "sigs.k8s.io/yaml convertToJSONableObject: to a string field, ints as %d, floats as %g of a float32, booleans as true/false",
            "kubeConfigSecretName: 1.0\ndependentResourceInfos:\n- ref: {apiVersion: 1, kind: yes, name: 0x1F}\n  scaleUp: {level: 0}\n  scaleDown: {level: 0}\n",
            accepts_p(p_with(|p| {
                p.secret = "1".into();
                p.infos[0].api_version = "1".into();
                p.infos[0].kind = "true".into();
                p.infos[0].name = "31".into();
            })),
            &[
                "kubeConfigSecretName",
                "dependentResourceInfos[0].ref.kind",
                "dependentResourceInfos[0].ref.name",
            ],
        ),
        prober(
            "timestamps stay text",
            "go-yaml v2 decoder.scalar: a timestamp into interface{} is its text",
            base("").replace(
                "kubeConfigSecretName: s",
                "kubeConfigSecretName: 2001-12-14",
            ),
            accepts_p(p_with(|p| p.secret = "2001-12-14".into())),
            &[],
        ),
        prober(
            "a NaN in an unknown field",
            "sigs.k8s.io/yaml yamlToJSONTarget: json.Marshal fails on NaN",
            base("extra: .nan\n"),
            rejects("extra"),
            &[],
        ),
        prober(
            "tags",
            "go-yaml v2 resolve: !!str, !!int, !!float, !!binary; other tags leave the text",
            "kubeConfigSecretName: !!str 12\nprobeInterval: !custom 5s\ndependentResourceInfos:\n- ref: {apiVersion: apps/v1, kind: Deployment, name: !!binary a2NtLXg=}\n  scaleUp: {level: !!int \"7\"}\n  scaleDown: {level: !!float 2}\n",
            accepts_p(p_with(|p| {
                p.secret = "12".into();
                p.interval = 5 * S;
                p.infos[0].name = "kcm-x".into();
                p.infos[0].up.level = 7;
                p.infos[0].down.level = 2;
            })),
            &[],
        ),
        prober(
            "anchors and merge keys, in go-yaml v2's order",
            "go-yaml v2 decoder.mapping/merge: a merge inserts at its position",
            "defaults: &d {initialDelay: 5s, timeout: 1m, level: 3}\nkubeConfigSecretName: s\ndependentResourceInfos:\n- ref: &r {apiVersion: apps/v1, kind: Deployment, name: kcm}\n  scaleUp: {level: 1, <<: *d}\n  scaleDown: {<<: *d, level: 1}\n",
            accepts_p(p_with(|p| {
                p.infos[0].up = Sc {
                    level: 3,
                    initial_delay: 5 * S,
                    timeout: 60 * S,
                };
                p.infos[0].down = Sc {
                    level: 1,
                    initial_delay: 5 * S,
                    timeout: 60 * S,
                };
            })),
            &["defaults"],
        ),
        prober(
            "duplicate keys: the last wins",
            "go-yaml v2 into a map: SetMapIndex, last wins",
            base("").replace(
                "kubeConfigSecretName: s\n",
                "kubeConfigSecretName: a\nkubeConfigSecretName: s\n",
            ),
            accepts_p(p()),
            &[],
        ),
        prober(
            "only the first document",
            "go-yaml v2 Unmarshal parses one document",
            format!("{}---\nkubeConfigSecretName: other\n", base("")),
            accepts_p(p()),
            &[],
        ),
        prober(
            "a JSON config file",
            "sigs.k8s.io/yaml: JSON is YAML",
            "{\"kubeConfigSecretName\": \"s\", \"probeInterval\": \"1m\", \"dependentResourceInfos\": [{\"ref\": {\"apiVersion\": \"apps/v1\", \"kind\": \"Deployment\", \"name\": \"kcm\"}, \"scaleUp\": {\"level\": 0}, \"scaleDown\": {\"level\": 1}}]}",
            accepts_p(p_with(|p| {
                p.interval = 60 * S;
                p.infos[0].down.level = 1;
            })),
            &[],
        ),
        prober(
            "a JSON file indented with tabs, with \\u escapes",
            "go-yaml v2 scanner: tabs are fine inside flow collections",
            "{\n\t\"kubeConfigSecretName\": \"s\\u00e9\",\n\t\"dependentResourceInfos\": [\n\t\t{\"ref\": {\"apiVersion\": \"apps/v1\", \"kind\": \"Deployment\", \"name\": \"kcm\"}, \"scaleUp\": {\"level\": 0}, \"scaleDown\": {\"level\": 0}}\n\t]\n}\n",
            accepts_p(p_with(|p| p.secret = "s\u{e9}".into())),
            &[],
        ),
        prober(
            "a null mapping key",
            "sigs.k8s.io/yaml convertToJSONableObject: unsupported map key",
            base("~: x\n"),
            rejects(""),
            &[],
        ),
        prober(
            "our own hysteresis fields",
            "encoding/json ignores successThreshold/failureThreshold (unknown to the reference)",
            base("successThreshold: 2\nfailureThreshold: 3\n"),
            accepts_p(p()),
            &[],
        ),
    ];

    rows.push(Row {
        differs: Some((
            Ours::Accepts(Effective::Prober(p_with(|p| p.secret = "a/b".into()))),
            "go-yaml v2 knows no \\/ escape, YAML 1.2 and JSON do; a file the reference refuses \
             never ran with it, so accepting it breaks nothing",
        )),
        ..prober(
            "a JSON \\/ escape",
            "go-yaml v2 scanner: found unknown escape character",
            base("").replace("kubeConfigSecretName: s", "kubeConfigSecretName: \"a\\/b\""),
            rejects("kubeConfigSecretName"),
            &[],
        )
    });

    rows.extend([
        // --- Weeder.
        weeder(
            "missing services",
            "internal/weeder/config.go: validate, MustNotBeEmpty(\"serviceAndDependantSelectors\")",
            "watchDuration: 1m\n",
            rejects("servicesAndDependantSelectors"),
            &[],
        ),
        weeder(
            "empty services map",
            "internal/weeder/config.go: validate, MustNotBeEmpty(\"serviceAndDependantSelectors\")",
            "servicesAndDependantSelectors: {}\n",
            rejects("servicesAndDependantSelectors"),
            &[],
        ),
        weeder(
            "empty selector list",
            "internal/weeder/config.go: validate, MustNotBeEmpty(\"podSelectors\")",
            "servicesAndDependantSelectors:\n  svc: {podSelectors: []}\n",
            rejects("servicesAndDependantSelectors.svc.podSelectors"),
            &[],
        ),
        weeder(
            "a null service entry",
            "encoding/json: null element → zero DependantSelectors → MustNotBeEmpty(\"podSelectors\")",
            "servicesAndDependantSelectors:\n  svc: null\n",
            rejects("servicesAndDependantSelectors.svc.podSelectors"),
            &[],
        ),
        weeder(
            "an empty selector selects every pod",
            "metav1.LabelSelectorAsSelector: no requirements → labels.Everything()",
            weeder_one("{}"),
            accepts_w(w(300 * S, &[("svc", &[""])])),
            &["servicesAndDependantSelectors.svc.podSelectors[0]"],
        ),
        weeder(
            "a null selector also watches every pod",
            "internal/weeder/watcher.go: doCreateK8sWatch sends labels.Nothing().String(), which is empty",
            weeder_one("null"),
            accepts_w(w(300 * S, &[("svc", &[""])])),
            &["servicesAndDependantSelectors.svc.podSelectors[0]"],
        ),
        weeder(
            "an invalid operator",
            "metav1.LabelSelectorAsSelector: \"in\" is not a valid label selector operator",
            weeder_one("{matchExpressions: [{key: k, operator: in, values: [x]}]}"),
            rejects("servicesAndDependantSelectors.svc.podSelectors[0].matchExpressions[0].operator"),
            &[],
        ),
        weeder(
            "a missing operator",
            "metav1.LabelSelectorAsSelector: \"\" is not a valid label selector operator",
            weeder_one("{matchExpressions: [{key: k}]}"),
            rejects("servicesAndDependantSelectors.svc.podSelectors[0].matchExpressions[0].operator"),
            &[],
        ),
        weeder(
            "a missing key",
            "labels.NewRequirement: validateLabelKey(\"\")",
            weeder_one("{matchExpressions: [{operator: Exists}]}"),
            rejects("servicesAndDependantSelectors.svc.podSelectors[0].matchExpressions[0].key"),
            &[],
        ),
        weeder(
            "In without values",
            "labels.NewRequirement: values set can't be empty for in/notin",
            weeder_one("{matchExpressions: [{key: k, operator: In}]}"),
            rejects("servicesAndDependantSelectors.svc.podSelectors[0].matchExpressions[0].values"),
            &[],
        ),
        weeder(
            "Exists with values",
            "labels.NewRequirement: values set must be empty for exists",
            weeder_one("{matchExpressions: [{key: k, operator: Exists, values: [x]}]}"),
            rejects("servicesAndDependantSelectors.svc.podSelectors[0].matchExpressions[0].values"),
            &[],
        ),
        weeder(
            "an invalid label key",
            "labels.NewRequirement: validation.IsQualifiedName",
            weeder_one("{matchLabels: {\"bad key\": x}}"),
            rejects("servicesAndDependantSelectors.svc.podSelectors[0].matchLabels.bad key"),
            &[],
        ),
        weeder(
            "an invalid label value",
            "labels.NewRequirement: validation.IsValidLabelValue",
            weeder_one("{matchLabels: {k: \"-x\"}}"),
            rejects("servicesAndDependantSelectors.svc.podSelectors[0].matchLabels.k"),
            &[],
        ),
        weeder(
            "label keys with a long prefix label and capitals",
            "validation.IsQualifiedName: the prefix is a DNS-1123 subdomain (253 in all, no per-label limit)",
            weeder_one(&format!(
                "{{matchLabels: {{{}.example.com/K: v}}}}",
                "a".repeat(70)
            )),
            accepts_w(w(
                300 * S,
                &[("svc", &[&format!("{}.example.com/K=v", "a".repeat(70))])],
            )),
            &[],
        ),
        weeder(
            "watchDuration 0s: the reference crashes when a service comes back",
            "internal/weeder/watcher.go: watch() calls ResultChan() on a nil watch once the context is done",
            "watchDuration: 0s\nservicesAndDependantSelectors:\n  svc: {podSelectors: [{matchLabels: {a: b}}]}\n",
            accepts_w(w(0, &[("svc", &["a=b"])])),
            &["watchDuration"],
        ),
        weeder(
            "watchDuration -1m",
            "internal/weeder/weeder.go: NewWeeder → context.WithTimeout(negative)",
            "watchDuration: -1m\nservicesAndDependantSelectors:\n  svc: {podSelectors: [{matchLabels: {a: b}}]}\n",
            accepts_w(w(-60 * S, &[("svc", &["a=b"])])),
            &["watchDuration"],
        ),
        weeder(
            "watchDuration: 300 (a bare number)",
            "metav1.Duration.UnmarshalJSON reads only JSON strings",
            "watchDuration: 300\nservicesAndDependantSelectors:\n  svc: {podSelectors: [{matchLabels: {a: b}}]}\n",
            rejects("watchDuration"),
            &[],
        ),
        weeder(
            "YAML 1.1 values in selectors",
            "go-yaml v2 resolve + sigs.k8s.io/yaml: y/on are true, the key n is \"false\", 0x10 is 16, ~ is empty",
            weeder_one("{matchLabels: {x: y, n: ~}, matchExpressions: [{key: k, operator: In, values: [on, 0x10, ~, 1.50]}]}"),
            accepts_w(w(
                300 * S,
                &[("svc", &["false=,k in (,1.5,16,true),x=true"])],
            )),
            &[
                "servicesAndDependantSelectors.svc.podSelectors[0].matchLabels.false",
                "servicesAndDependantSelectors.svc.podSelectors[0].matchLabels.x",
                "servicesAndDependantSelectors.svc.podSelectors[0].matchExpressions[0].values[0]",
                "servicesAndDependantSelectors.svc.podSelectors[0].matchExpressions[0].values[1]",
                "servicesAndDependantSelectors.svc.podSelectors[0].matchExpressions[0].values[3]",
            ],
        ),
        weeder(
            "service names that can never match",
            "internal/weeder/config.go: validate doesn't check names; sigs.k8s.io/yaml makes 123 the key \"123\"",
            "servicesAndDependantSelectors:\n  Bad_Name: {podSelectors: [{matchLabels: {a: b}}]}\n  123: {podSelectors: [{matchLabels: {a: c}}]}\n",
            accepts_w(w(
                300 * S,
                &[("Bad_Name", &["a=b"]), ("123", &["a=c"])],
            )),
            &[
                "servicesAndDependantSelectors.123",
                "servicesAndDependantSelectors.Bad_Name",
            ],
        ),
        weeder(
            "unknown fields at every level",
            "encoding/json ignores unknown keys",
            "extra: 1\nservicesAndDependantSelectors:\n  svc:\n    note: x\n    podSelectors:\n    - other: 1\n      matchLabels: {k: v}\n      matchExpressions: [{key: k, operator: Exists, foo: bar}]\n",
            accepts_w(w(300 * S, &[("svc", &["k=v,k"])])),
            &[
                "servicesAndDependantSelectors.svc.podSelectors[0].matchExpressions[0].foo",
                "servicesAndDependantSelectors.svc.podSelectors[0].other",
                "servicesAndDependantSelectors.svc.note",
                "extra",
            ],
        ),
        weeder(
            "field names in another case",
            "encoding/json matches field names case-insensitively",
            "ServicesAndDependantSelectors: {svc: {PODSELECTORS: [{MatchLabels: {K: v}, matchexpressions: [{KEY: k, OPERATOR: DoesNotExist, VALUES: []}]}]}}\n",
            accepts_w(w(300 * S, &[("svc", &["K=v,!k"])])),
            &[
                "ServicesAndDependantSelectors",
                "ServicesAndDependantSelectors.svc.PODSELECTORS",
                "ServicesAndDependantSelectors.svc.PODSELECTORS[0].MatchLabels",
                "ServicesAndDependantSelectors.svc.PODSELECTORS[0].matchexpressions",
                "ServicesAndDependantSelectors.svc.PODSELECTORS[0].matchexpressions[0].KEY",
                "ServicesAndDependantSelectors.svc.PODSELECTORS[0].matchexpressions[0].OPERATOR",
                "ServicesAndDependantSelectors.svc.PODSELECTORS[0].matchexpressions[0].VALUES",
            ],
        ),
        weeder(
            "a JSON weeder config",
            "sigs.k8s.io/yaml: JSON is YAML",
            "{\"watchDuration\": \"2m\", \"servicesAndDependantSelectors\": {\"svc\": {\"podSelectors\": [{\"matchExpressions\": [{\"key\": \"role\", \"operator\": \"In\", \"values\": [\"b\", \"a\", \"b\"]}]}]}}}",
            accepts_w(w(120 * S, &[("svc", &["role in (a,b)"])])),
            &[],
        ),
    ]);
    rows
}

// ---------------------------------------------------------------------------------------------
// What we do.

fn nanos(d: Duration) -> i64 {
    i64::try_from(d.as_nanos()).unwrap_or(i64::MAX)
}

fn ours_p(c: &ProberConfig) -> P {
    P {
        secret: c.kube_config_secret_name.clone(),
        interval: nanos(c.probe_interval),
        initial_delay: nanos(c.initial_delay),
        timeout: nanos(c.probe_timeout),
        jitter: c.backoff_jitter_factor,
        kcm: nanos(c.kcm_node_monitor_grace_duration),
        fraction: c.node_lease_failure_fraction,
        infos: c
            .dependent_resource_infos
            .iter()
            .map(|i| {
                let sc = |s: &dwd_core::ScaleInfo| Sc {
                    level: i64::from(s.level),
                    initial_delay: nanos(s.initial_delay),
                    timeout: nanos(s.timeout),
                };
                T {
                    api_version: i.target.api_version.clone(),
                    kind: i.target.kind.clone(),
                    name: i.target.name.clone(),
                    optional: i.optional,
                    up: sc(&i.scale_up),
                    down: sc(&i.scale_down),
                }
            })
            .collect(),
    }
}

fn ours_w(c: &WeederConfig) -> W {
    W {
        watch: nanos(c.watch_duration),
        services: c
            .services_and_dependant_selectors
            .iter()
            .map(|(s, d)| {
                (
                    s.clone(),
                    d.pod_selectors
                        .iter()
                        .map(|p| norm_query(&p.to_query()))
                        .collect(),
                )
            })
            .collect(),
    }
}

/// Our outcome, and our warnings' field paths.
fn run_ours(kind: Kind, text: &str) -> (Result<Effective, ConfigError>, Vec<String>) {
    let paths = |w: &[String]| {
        w.iter()
            .map(|w| w.split_once(": ").map_or(w.as_str(), |(p, _)| p).to_owned())
            .collect::<Vec<_>>()
    };
    match kind {
        Kind::Prober => match ProberConfig::from_yaml(text) {
            Ok(l) => (Ok(Effective::Prober(ours_p(&l.config))), paths(&l.warnings)),
            Err(e) => (Err(e), Vec::new()),
        },
        Kind::Weeder => match WeederConfig::from_yaml(text) {
            Ok(l) => (Ok(Effective::Weeder(ours_w(&l.config))), paths(&l.warnings)),
            Err(e) => (Err(e), Vec::new()),
        },
    }
}

/// The reference's effective values as they behave at run time, in our representation.
fn meaning(e: &Effective) -> Effective {
    let clamp = |d: i64| d.max(0);
    match e {
        Effective::Prober(p) => {
            let mut m = p.clone();
            m.interval = clamp(p.interval);
            m.initial_delay = clamp(p.initial_delay);
            m.timeout = if p.timeout <= 0 {
                nanos(NO_TIMEOUT)
            } else {
                p.timeout
            };
            m.kcm = clamp(p.kcm);
            for t in &mut m.infos {
                for s in [&mut t.up, &mut t.down] {
                    s.initial_delay = clamp(s.initial_delay);
                    s.timeout = clamp(s.timeout);
                }
            }
            // Levels only order and group targets: renumbered in order when one doesn't fit.
            let up: fn(&mut T) -> &mut i64 = |t| &mut t.up.level;
            let down: fn(&mut T) -> &mut i64 = |t| &mut t.down.level;
            for dir in [up, down] {
                let levels: Vec<i64> = m.infos.iter_mut().map(|t| *dir(t)).collect();
                if levels.iter().any(|l| u32::try_from(*l).is_err()) {
                    let distinct: Vec<i64> = levels
                        .iter()
                        .copied()
                        .collect::<BTreeSet<_>>()
                        .into_iter()
                        .collect();
                    for t in &mut m.infos {
                        let l = dir(t);
                        *l = distinct.iter().position(|d| d == l).unwrap_or(0) as i64;
                    }
                }
            }
            Effective::Prober(m)
        }
        Effective::Weeder(w) => Effective::Weeder(W {
            watch: clamp(w.watch),
            services: w.services.clone(),
        }),
    }
}

fn rejection_names(err: &ConfigError, field: &str) -> bool {
    match err {
        ConfigError::Invalid { problems } => problems.iter().any(|p| p.path == field),
        ConfigError::Yaml { .. } | ConfigError::NotAMapping { .. } => field.is_empty(),
    }
}

#[test]
fn every_row_behaves_as_the_reference_or_as_argued() {
    let mut failures = Vec::new();
    for r in rows() {
        let (outcome, warnings) = run_ours(r.kind, &r.text);
        let expected = match &r.differs {
            Some((ours, why)) => {
                assert!(
                    !why.is_empty(),
                    "{}: an argued difference needs its reason",
                    r.name
                );
                ours.clone()
            }
            None => match &r.reference {
                Reference::Accepts(e) => Ours::Accepts(meaning(e)),
                Reference::Rejects { field } | Reference::Panics { field } => {
                    Ours::Rejects { field }
                }
            },
        };
        let ok = match (&expected, &outcome) {
            (Ours::Accepts(e), Ok(got)) => e == got,
            (Ours::Rejects { field }, Err(err)) => rejection_names(err, field),
            _ => false,
        };
        if !ok {
            failures.push(format!(
                "{} ({}):\n    expected {expected:?}\n    got {outcome:?}",
                r.name, r.cite
            ));
            continue;
        }
        let want: BTreeSet<&str> = r.warns.iter().copied().collect();
        let got: BTreeSet<&str> = warnings.iter().map(String::as_str).collect();
        if want != got || warnings.len() != r.warns.len() {
            failures.push(format!(
                "{}: warnings on {warnings:?}, expected {:?}",
                r.name, r.warns
            ));
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

#[test]
fn gardeners_configs_load_to_the_documented_values_without_warnings() {
    gardeners_prober_config_loads_to_the_documented_values();
    gardeners_weeder_config_loads_to_the_documented_values();
}

/// gardener-deployment.md: probeInterval 30s, everything else defaulted; KCM down at level 1
/// and up first, MCM and CA down first, MCM up 30 s later, CA last.
fn gardeners_prober_config_loads_to_the_documented_values() {
    let loaded = ProberConfig::from_yaml(&gardener_config(GARDENER_PROBER)).unwrap();
    assert!(loaded.warnings.is_empty(), "{:?}", loaded.warnings);
    let c = loaded.config;
    assert_eq!(
        c.kube_config_secret_name,
        "shoot-access-dependency-watchdog-probe"
    );
    assert_eq!(c.probe_interval, Duration::from_secs(30));
    assert_eq!(c.initial_delay, Duration::from_secs(30));
    assert_eq!(c.probe_timeout, Duration::from_secs(30));
    assert_eq!(c.backoff_jitter_factor, 0.2);
    assert_eq!(c.kcm_node_monitor_grace_duration, Duration::from_secs(40));
    assert_eq!(c.node_lease_failure_fraction, 0.6);
    let table: Vec<_> = c
        .dependent_resource_infos
        .iter()
        .map(|i| {
            (
                i.target.to_string(),
                i.optional,
                i.scale_down.level,
                i.scale_up.level,
                i.scale_up.initial_delay,
                i.scale_up.timeout,
                i.scale_down.timeout,
            )
        })
        .collect();
    let t30 = Duration::from_secs(30);
    assert_eq!(
        table,
        [
            (
                "apps/v1 Deployment/kube-controller-manager".to_owned(),
                false,
                1,
                0,
                Duration::ZERO,
                t30,
                t30
            ),
            (
                "apps/v1 Deployment/machine-controller-manager".to_owned(),
                false,
                0,
                1,
                t30,
                t30,
                t30
            ),
            (
                "apps/v1 Deployment/cluster-autoscaler".to_owned(),
                true,
                0,
                2,
                Duration::ZERO,
                t30,
                t30
            ),
        ]
    );
}

/// Gardener's weeder config (deploy/gardener/weeder.yaml): a 300 s watch, and each service's
/// dependants' selectors as written.
fn gardeners_weeder_config_loads_to_the_documented_values() {
    let loaded = WeederConfig::from_yaml(&gardener_config(GARDENER_WEEDER)).unwrap();
    assert!(loaded.warnings.is_empty(), "{:?}", loaded.warnings);
    assert_eq!(loaded.config.watch_duration, Duration::from_secs(300));
    let queries: Vec<(String, Vec<String>)> = loaded
        .config
        .services_and_dependant_selectors
        .iter()
        .map(|(s, d)| {
            (
                s.clone(),
                d.pod_selectors.iter().map(|p| p.to_query()).collect(),
            )
        })
        .collect();
    assert_eq!(
        queries,
        [
            (
                "etcd-main-client".to_owned(),
                vec!["gardener.cloud/role in (controlplane),role in (apiserver)".to_owned()]
            ),
            (
                "kube-apiserver".to_owned(),
                vec![
                    "gardener.cloud/role in (controlplane),role notin (apiserver,main)".to_owned()
                ]
            ),
        ]
    );
}

// ---------------------------------------------------------------------------------------------
// The reference column, checked against the reference's own loaders.

/// The oracle's answer for one file (see reference-oracle/main.go).
fn oracle_effective(kind: Kind, v: &serde_json::Value) -> Effective {
    let i = |v: &serde_json::Value| v.as_i64().unwrap_or(i64::MIN);
    let f = |v: &serde_json::Value| v.as_f64().unwrap_or(f64::NAN);
    let s = |v: &serde_json::Value| v.as_str().unwrap_or_default().to_owned();
    match kind {
        Kind::Prober => {
            let p = &v["prober"];
            let sc = |v: &serde_json::Value| Sc {
                level: i(&v["level"]),
                initial_delay: i(&v["initialDelay"]),
                timeout: i(&v["timeout"]),
            };
            Effective::Prober(P {
                secret: s(&p["kubeConfigSecretName"]),
                interval: i(&p["probeInterval"]),
                initial_delay: i(&p["initialDelay"]),
                timeout: i(&p["probeTimeout"]),
                jitter: f(&p["backoffJitterFactor"]),
                kcm: i(&p["kcmNodeMonitorGraceDuration"]),
                fraction: f(&p["nodeLeaseFailureFraction"]),
                infos: p["dependentResourceInfos"]
                    .as_array()
                    .into_iter()
                    .flatten()
                    .map(|t| T {
                        api_version: s(&t["apiVersion"]),
                        kind: s(&t["kind"]),
                        name: s(&t["name"]),
                        optional: t["optional"].as_bool().unwrap_or(false),
                        up: sc(&t["scaleUp"]),
                        down: sc(&t["scaleDown"]),
                    })
                    .collect(),
            })
        }
        Kind::Weeder => {
            let w = &v["weeder"];
            Effective::Weeder(W {
                watch: i(&w["watchDuration"]),
                services: w["services"]
                    .as_object()
                    .into_iter()
                    .flatten()
                    .map(|(name, sels)| {
                        (
                            name.clone(),
                            sels.as_array()
                                .into_iter()
                                .flatten()
                                .map(|q| norm_query(&s(&q["query"])))
                                .collect(),
                        )
                    })
                    .collect(),
            })
        }
    }
}

#[test]
#[ignore = "needs Go; run with --ignored to check the reference column against the reference's code"]
fn reference_column_matches_the_oracle() {
    use std::process::Command;

    let dir = std::env::temp_dir().join(format!("dwd-parity-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let rows = rows();
    let mut failures = Vec::new();
    for kind in [Kind::Prober, Kind::Weeder] {
        let mut files = Vec::new();
        for (n, r) in rows.iter().enumerate().filter(|(_, r)| r.kind == kind) {
            let path = dir.join(format!("row-{n}.yaml"));
            std::fs::write(&path, &r.text).unwrap();
            files.push((path, r));
        }
        let oracle_dir = concat!(env!("CARGO_MANIFEST_DIR"), "/reference-oracle");
        let mode = if kind == Kind::Prober {
            "prober"
        } else {
            "weeder"
        };
        let out = Command::new("go")
            .current_dir(oracle_dir)
            .args(["run", ".", mode])
            .args(files.iter().map(|(p, _)| p))
            .output()
            .expect("go must be installed to run the reference oracle");
        assert!(
            out.status.success(),
            "oracle failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        let lines: Vec<serde_json::Value> = String::from_utf8_lossy(&out.stdout)
            .lines()
            .map(|l| serde_json::from_str(l).unwrap())
            .collect();
        assert_eq!(lines.len(), files.len());
        for ((_, r), answer) in files.iter().zip(&lines) {
            let outcome = answer["outcome"].as_str().unwrap_or_default();
            let ok = match (&r.reference, outcome) {
                (Reference::Accepts(e), "accepted") => {
                    let got = oracle_effective(kind, answer);
                    // Floats went through text twice; equal to the last bit is not promised.
                    match (e, &got) {
                        (Effective::Prober(a), Effective::Prober(b)) => {
                            let close = |x: f64, y: f64| (x - y).abs() <= 1e-12 * x.abs().max(1.0);
                            close(a.jitter, b.jitter)
                                && close(a.fraction, b.fraction)
                                && P {
                                    jitter: 0.0,
                                    fraction: 0.0,
                                    ..a.clone()
                                } == P {
                                    jitter: 0.0,
                                    fraction: 0.0,
                                    ..b.clone()
                                }
                        }
                        _ => *e == got,
                    }
                }
                (Reference::Rejects { .. }, "rejected") | (Reference::Panics { .. }, "panic") => {
                    true
                }
                _ => false,
            };
            if !ok {
                failures.push(format!(
                    "{}: the table says {:?}, the reference's code says {answer}",
                    r.name, r.reference
                ));
            }
        }
    }
    let _ = std::fs::remove_dir_all(&dir);
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}
