//! Property tests of the parsers that read what operators and other controllers write: Go
//! durations, the prober and weeder config files, and the annotations on scaling targets
//! (`replicas`, `ignore-scaling`), with the scaling plan built on them.
//!
//! Two kinds of test:
//!
//! - **The corpus** (`tests/corpus/`, always replayed): inputs whose expected outcome was
//!   produced by the reference's own code — `durations.tsv` by Go's `time.ParseDuration`,
//!   `replicas_atoi.tsv` by `strconv.Atoi` (the watchdog then takes 1..=1000),
//!   `parse_bool.tsv` by `strconv.ParseBool`, and the `ok-`/`err-` config files by the
//!   reference's loaders (`reference-oracle/`). See `tests/corpus/README.md`.
//! - **Properties** over generated inputs, each run for a time budget (`DWD_PROPTEST_MILLIS`,
//!   default 1000 ms per property) from a printed seed (`DWD_PROPTEST_SEED` replays it). A
//!   failure prints the input: add it to the corpus with its expected outcome.
//!
//! No extra crates: a SplitMix64 generator, no shrinking (the inputs are small).

// A test crate: a failed assumption is a failed test (outside tests the workspace denies these).
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::collections::BTreeMap;
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use dwd_core::config::ConfigError;
use dwd_core::duration::parse_go_duration_nanos;
use dwd_core::scaling::{
    IGNORE_SCALING_ANNOTATION, MAX_RECORDED_REPLICAS, MELTDOWN_ANNOTATION, REPLICAS_ANNOTATION,
    TargetAction, TargetSnapshot, parse_go_bool, plan_target, recorded_replicas,
};
use dwd_core::{Direction, ProberConfig, WeederConfig, format_go_duration, parse_go_duration};

// --- the generator and the runner -------------------------------------------------------------

// Shared with dependency-watchdog's kubeconfig properties (its module doc says why hand-written).
#[path = "support/property.rs"]
mod property;

use property::{Rng, property};

/// Calls `f(input)`, failing with the input when it panics or takes longer than 5 s (a hang,
/// not a slow machine: the alias bomb of the corpus takes ~0.4 s in a debug build).
fn guarded<T>(what: &str, input: &str, f: impl FnOnce(&str) -> T) -> Result<T, String> {
    let t = Instant::now();
    let out = catch_unwind(AssertUnwindSafe(|| f(input)))
        .map_err(|_| format!("{what} panicked on input:\n{input:?}"))?;
    if t.elapsed() > Duration::from_secs(5) {
        return Err(format!(
            "{what} took {:?} on input:\n{input:?}",
            t.elapsed()
        ));
    }
    Ok(out)
}

// --- the corpus -------------------------------------------------------------------------------

fn corpus_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/corpus")
}

/// Go's `strconv.Quote` syntax back to the string (what the `.tsv` files hold).
fn go_unquote(quoted: &str) -> String {
    let inner = quoted
        .strip_prefix('"')
        .and_then(|s| s.strip_suffix('"'))
        .unwrap_or_else(|| panic!("not a quoted string: {quoted}"));
    let mut out = String::new();
    let mut chars = inner.chars();
    while let Some(c) = chars.next() {
        if c != '\\' {
            out.push(c);
            continue;
        }
        match chars.next() {
            Some('n') => out.push('\n'),
            Some('t') => out.push('\t'),
            Some('r') => out.push('\r'),
            Some('0') => out.push('\0'),
            Some('\\') => out.push('\\'),
            Some('"') => out.push('"'),
            Some(e @ ('x' | 'u' | 'U')) => {
                let len = match e {
                    'x' => 2,
                    'u' => 4,
                    _ => 8,
                };
                let hex: String = chars.by_ref().take(len).collect();
                let n = u32::from_str_radix(&hex, 16).expect("hex escape");
                out.push(char::from_u32(n).expect("valid char"));
            }
            other => panic!("unsupported escape \\{other:?} in {quoted}"),
        }
    }
    out
}

/// `(input, expected)` rows of a corpus table.
fn table(name: &str) -> Vec<(String, String)> {
    let path = corpus_dir().join(name);
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    text.lines()
        .filter(|l| !l.is_empty() && !l.starts_with('#'))
        .map(|l| {
            let (q, want) = l
                .rsplit_once('\t')
                .unwrap_or_else(|| panic!("{name}: no tab in {l:?}"));
            (go_unquote(q), want.to_string())
        })
        .collect()
}

/// The files of a corpus directory, by name.
fn corpus_files(dir: &str) -> Vec<(String, String)> {
    let mut files: Vec<(String, String)> = std::fs::read_dir(corpus_dir().join(dir))
        .unwrap_or_else(|e| panic!("corpus/{dir}: {e}"))
        .map(|e| {
            let path = e.expect("dir entry").path();
            let name = path.file_name().unwrap().to_string_lossy().into_owned();
            let text = std::fs::read_to_string(&path).expect("corpus file");
            (name, text)
        })
        .collect();
    files.sort();
    assert!(!files.is_empty(), "corpus/{dir} is empty");
    files
}

#[test]
fn corpus_durations_parse_as_go_parses_them() {
    let rows = table("durations.tsv");
    assert!(rows.len() >= 50, "durations corpus too small");
    let mut wrong = Vec::new();
    for (input, want) in rows {
        let got = parse_go_duration_nanos(&input);
        let ok = match (want.as_str(), &got) {
            ("error", Err(_)) => true,
            (n, Ok(v)) => n.parse::<i64>().ok() == Some(*v),
            _ => false,
        };
        if !ok {
            wrong.push(format!("{input:?}: Go says {want}, we say {got:?}"));
        }
        // The unsigned parser agrees wherever the value is not negative.
        match (got, parse_go_duration(&input)) {
            (Ok(n), Ok(d)) if n >= 0 => assert_eq!(d.as_nanos(), n as u128, "{input:?}"),
            (Ok(n), Err(_)) if n < 0 => {}
            (Err(_), Err(_)) => {}
            (n, d) => wrong.push(format!("{input:?}: nanos {n:?} but duration {d:?}")),
        }
    }
    assert!(
        wrong.is_empty(),
        "durations differ from Go:\n{}",
        wrong.join("\n")
    );
}

/// The watchdog's reading of the `replicas` annotation: Go's `strconv.Atoi`, then 1..=1000.
fn replicas_model(atoi: &str) -> Option<i32> {
    atoi.parse::<i64>()
        .ok()
        .filter(|n| (1..=i64::from(MAX_RECORDED_REPLICAS)).contains(n))
        .map(|n| n as i32)
}

fn annotations(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
    pairs
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}

#[test]
fn corpus_replicas_annotations_read_as_atoi_then_the_range() {
    let mut wrong = Vec::new();
    for (input, atoi) in table("replicas_atoi.tsv") {
        let want = replicas_model(&atoi);
        let got = recorded_replicas(&annotations(&[(REPLICAS_ANNOTATION, &input)]));
        let same = match (&got, want) {
            (Ok(Some(n)), Some(w)) => *n == w,
            (Err(_), None) => true,
            _ => false,
        };
        if !same {
            wrong.push(format!(
                "{input:?}: Atoi {atoi}, want {want:?}, got {got:?}"
            ));
        }
    }
    assert!(wrong.is_empty(), "{}", wrong.join("\n"));
}

#[test]
fn corpus_ignore_scaling_values_read_as_parse_bool() {
    let mut wrong = Vec::new();
    for (input, want) in table("parse_bool.tsv") {
        let got = parse_go_bool(&input);
        let expected = match want.as_str() {
            "true" => Some(true),
            "false" => Some(false),
            _ => None,
        };
        if got != expected {
            wrong.push(format!("{input:?}: Go says {want}, we say {got:?}"));
        }
    }
    assert!(wrong.is_empty(), "{}", wrong.join("\n"));
}

/// `ok-*` files load, `err-*` files are refused (as the reference does with each).
fn replay_configs<T>(dir: &str, load: impl Fn(&str) -> Result<T, ConfigError>) {
    let mut wrong = Vec::new();
    for (name, text) in corpus_files(dir) {
        let outcome = guarded(&format!("{dir}/{name}"), &text, &load);
        match outcome {
            Err(failure) => wrong.push(failure),
            Ok(result) => {
                let expect_ok = name.starts_with("ok-");
                assert!(
                    expect_ok || name.starts_with("err-"),
                    "{dir}/{name}: name must start with ok- or err-"
                );
                match (expect_ok, result) {
                    (true, Err(e)) => wrong.push(format!(
                        "{dir}/{name}: refused, the reference loads it: {e}"
                    )),
                    (false, Ok(_)) => {
                        wrong.push(format!("{dir}/{name}: loaded, the reference refuses it"))
                    }
                    (false, Err(e)) => {
                        if e.to_string().trim().is_empty() {
                            wrong.push(format!("{dir}/{name}: refused without a message"));
                        }
                    }
                    (true, Ok(_)) => {}
                }
            }
        }
    }
    assert!(wrong.is_empty(), "{}", wrong.join("\n"));
}

#[test]
fn corpus_prober_configs_load_or_fail_as_the_reference() {
    replay_configs("prober", ProberConfig::from_yaml);
}

#[test]
fn corpus_weeder_configs_load_or_fail_as_the_reference() {
    replay_configs("weeder", WeederConfig::from_yaml);
}

// --- durations ------------------------------------------------------------------------------

const UNITS: [(&str, u64); 9] = [
    ("ns", 1),
    ("us", 1_000),
    ("\u{b5}s", 1_000),
    ("\u{3bc}s", 1_000),
    ("ms", 1_000_000),
    ("s", 1_000_000_000),
    ("m", 60_000_000_000),
    ("h", 3_600_000_000_000),
    ("", 0),
];

/// Text near the grammar: digits, dots, signs, units, spaces, odd characters.
fn duration_like(rng: &mut Rng) -> String {
    const PIECES: [&str; 24] = [
        "0",
        "1",
        "9",
        "12",
        "000",
        ".",
        "+",
        "-",
        "s",
        "m",
        "h",
        "ms",
        "us",
        "ns",
        "\u{b5}s",
        "\u{3bc}s",
        "e",
        " ",
        "d",
        "x",
        "9223372036854775807",
        "18446744073709551616",
        "µ",
        "\0",
    ];
    let n = rng.below(8);
    (0..n).map(|_| *rng.pick(&PIECES)).collect()
}

#[test]
fn property_durations_never_panic_and_agree_with_each_other() {
    property("durations_never_panic", |rng| {
        let input = if rng.chance(70) {
            duration_like(rng)
        } else {
            let bytes: Vec<u8> = (0..rng.below(12)).map(|_| rng.below(256) as u8).collect();
            String::from_utf8_lossy(&bytes).into_owned()
        };
        let nanos = guarded("parse_go_duration_nanos", &input, parse_go_duration_nanos)?;
        let unsigned = guarded("parse_go_duration", &input, parse_go_duration)?;
        match (nanos, unsigned) {
            (Ok(n), Ok(d)) if n >= 0 && d.as_nanos() == n as u128 => Ok(()),
            (Ok(n), Err(_)) if n < 0 => Ok(()),
            (Err(_), Err(_)) => Ok(()),
            (n, d) => Err(format!("{input:?}: nanos {n:?}, duration {d:?}")),
        }
    });
}

#[test]
fn property_formatted_durations_parse_back_exactly() {
    property("format_then_parse", |rng| {
        let nanos = rng.magnitude(i64::MAX as u64);
        let text = format_go_duration(Duration::from_nanos(nanos));
        match parse_go_duration_nanos(&text) {
            Ok(n) if n as u64 == nanos => {}
            other => {
                return Err(format!(
                    "{nanos} ns formats as {text:?}, parses as {other:?}"
                ));
            }
        }
        // Go accepts a sign in front, and so must we.
        match parse_go_duration_nanos(&format!("-{text}")) {
            Ok(n) if n == -(nanos as i64) => Ok(()),
            other => Err(format!("-{text:?} parses as {other:?}")),
        }
    });
}

#[test]
fn property_a_sum_of_pieces_is_the_sum_of_their_values() {
    property("sum_of_pieces", |rng| {
        let mut text = String::new();
        let mut total: u128 = 0;
        for _ in 0..=rng.below(5) {
            let (unit, nanos) = *rng.pick(&UNITS[..8]);
            let value = rng.magnitude(10_000_000);
            text.push_str(&value.to_string());
            text.push_str(unit);
            total += u128::from(value) * u128::from(nanos);
        }
        let sign = *rng.pick(&["", "+", "-"]);
        let input = format!("{sign}{text}");
        let got = parse_go_duration_nanos(&input);
        let limit = if sign == "-" {
            1u128 << 63
        } else {
            (1u128 << 63) - 1
        };
        match got {
            Ok(n) if total <= limit && i128::from(n).unsigned_abs() == total => Ok(()),
            Err(_) if total > limit => Ok(()),
            other => Err(format!(
                "{input:?}: want {total} ns (limit {limit}), got {other:?}"
            )),
        }
    });
}

#[test]
fn property_second_fractions_of_up_to_nine_digits_are_exact() {
    property("second_fractions", |rng| {
        let whole = rng.below(1_000_000);
        let digits = 1 + rng.below(9) as u32;
        let frac = rng.below(10u64.pow(digits));
        let input = format!("{whole}.{frac:0width$}s", width = digits as usize);
        let want = whole * 1_000_000_000 + frac * 10u64.pow(9 - digits);
        match parse_go_duration_nanos(&input) {
            Ok(n) if n as u64 == want => Ok(()),
            other => Err(format!("{input:?}: want {want} ns, got {other:?}")),
        }
    });
}

// --- annotations and the plan on them ------------------------------------------------------

/// Annotation text: integers with signs and leading zeros, huge ones, and junk.
fn replicas_like(rng: &mut Rng) -> String {
    match rng.below(6) {
        0 => rng.magnitude(2000).to_string(),
        1 => format!(
            "{}{}",
            rng.pick(&["+", "-", "0", "00", ""]),
            rng.magnitude(u64::MAX)
        ),
        2 => format!("{}", rng.magnitude(1001)),
        3 => duration_like(rng),
        4 => format!(" {}", rng.below(10)),
        _ => (0..rng.below(25))
            .map(|_| char::from(b'0' + rng.below(10) as u8))
            .collect(),
    }
}

#[test]
fn property_the_replicas_annotation_reads_as_atoi_then_the_range() {
    property("replicas_annotation", |rng| {
        let value = replicas_like(rng);
        let got = recorded_replicas(&annotations(&[(REPLICAS_ANNOTATION, &value)]));
        // The model: Go's Atoi on 64 bits (sign, ASCII digits, int64 range), then 1..=1000.
        let digits = value.strip_prefix(['+', '-']).unwrap_or(&value);
        let atoi_ok = !digits.is_empty() && digits.bytes().all(|b| b.is_ascii_digit());
        let want = if atoi_ok {
            value
                .parse::<i64>()
                .ok()
                .and_then(|n| replicas_model(&n.to_string()))
        } else {
            None
        };
        match (&got, want) {
            (Ok(Some(n)), Some(w)) if *n == w => Ok(()),
            (Err(_), None) => Ok(()),
            _ => Err(format!("{value:?}: want {want:?}, got {got:?}")),
        }
    });
}

/// A target's annotations as a plan may find them: a record (valid or replicas-like text), the
/// meltdown marker and ignore-scaling, each present or not.
fn random_scaling_annotations(rng: &mut Rng) -> BTreeMap<String, String> {
    let mut a = BTreeMap::new();
    if rng.chance(60) {
        let record = if rng.chance(70) {
            (1 + rng.below(1000)).to_string()
        } else {
            replicas_like(rng)
        };
        a.insert(REPLICAS_ANNOTATION.to_string(), record);
    }
    if rng.chance(50) {
        a.insert(MELTDOWN_ANNOTATION.to_string(), String::new());
    }
    if rng.chance(20) {
        let v = *rng.pick(&["true", "1", "T", "false", "0", "yes", ""]);
        a.insert(IGNORE_SCALING_ANNOTATION.to_string(), v.to_string());
    }
    a
}

#[test]
fn property_plans_never_lose_or_lower_a_valid_record() {
    property("plan_target", |rng| {
        let spec_replicas = rng.below(1_503) as i32 - 2;
        let a = random_scaling_annotations(rng);
        let dir = if rng.chance(50) {
            Direction::Down
        } else {
            Direction::Up
        };
        let snapshot = TargetSnapshot {
            spec_replicas,
            annotations: a.clone(),
        };
        let plan = plan_target(dir, &snapshot);
        let ignored = a
            .get(IGNORE_SCALING_ANNOTATION)
            .and_then(|v| parse_go_bool(v))
            .unwrap_or(false);
        let marker = a.contains_key(MELTDOWN_ANNOTATION);
        let valid_record = recorded_replicas(&a).ok().flatten();
        let fail = |why: &str| Err(format!("{dir:?} {snapshot:?}: {why}; plan {plan:?}"));
        match (&plan.action, ignored, dir) {
            (TargetAction::Ignored { clear_marker }, true, _) if *clear_marker == marker => Ok(()),
            (_, true, _) => {
                fail("ignore-scaling is true: must be Ignored, clearing only the marker")
            }
            (TargetAction::ScaleDown { record_replicas }, false, Direction::Down) => {
                if spec_replicas <= 0 {
                    return fail("scale-down of a target already at 0");
                }
                if *record_replicas < spec_replicas {
                    return fail("the record is lower than the current replicas");
                }
                match (marker, valid_record) {
                    // Under the marker a valid record is never lowered.
                    (true, Some(r)) if *record_replicas != r.max(spec_replicas) => {
                        fail("a valid record under the marker was not kept")
                    }
                    (false, _) if *record_replicas != spec_replicas => {
                        fail("without the marker the current replicas are the record")
                    }
                    _ => Ok(()),
                }
            }
            (TargetAction::AlreadyDone { clear_marker }, false, Direction::Down) => {
                if spec_replicas > 0 {
                    return fail("a target above 0 was not scaled down");
                }
                if *clear_marker {
                    return fail("a scale-down removed the record of a target at 0");
                }
                Ok(())
            }
            (TargetAction::ScaleUp { replicas }, false, Direction::Up) => {
                if spec_replicas > 0 {
                    return fail("scale-up of a target that runs");
                }
                if !(1..=MAX_RECORDED_REPLICAS).contains(replicas) {
                    return fail("restores a count outside 1..=1000");
                }
                if valid_record.is_some_and(|r| r != *replicas) {
                    return fail("does not restore the valid record");
                }
                if valid_record.is_none() && *replicas != 1 {
                    return fail("without a usable record it must restore 1");
                }
                Ok(())
            }
            (TargetAction::AlreadyDone { .. }, false, Direction::Up) if spec_replicas > 0 => Ok(()),
            _ => fail("unexpected action"),
        }
    });
}

// --- config files -----------------------------------------------------------------------------

/// Scalars that mean something to YAML or to the loaders.
const SCALARS: [&str; 30] = [
    "~",
    "null",
    "true",
    "false",
    "yes",
    "no",
    "0",
    "-1",
    "1e3",
    "0x10",
    "0o17",
    ".inf",
    "-.inf",
    ".nan",
    "1.5",
    "10s",
    "-5s",
    "2562048h",
    "1h1m",
    "\"\"",
    "''",
    "[]",
    "{}",
    "[1, 2]",
    "{a: b}",
    "&x 3",
    "*x",
    "!!str 5",
    "|\n  block",
    "\"\\u0000\"",
];

/// One random edit of a config text.
fn mutate(rng: &mut Rng, text: &str) -> String {
    let (mut lines, i) = property::lines_to_edit(rng, text);
    let choice = rng.below(8);
    if property::move_line(rng, &mut lines, i, choice) {
        return lines.join("\n");
    }
    match choice {
        3 => {
            // Replace a value with a scalar that means something.
            if let Some((key, _)) = lines[i].split_once(": ") {
                lines[i] = format!("{key}: {}", rng.pick(&SCALARS));
            } else {
                let scalar: &&str = rng.pick(&SCALARS);
                lines[i].push_str(scalar);
            }
        }
        4 => {
            // Change indentation.
            if rng.chance(50) {
                lines[i] = format!("  {}", lines[i]);
            } else {
                lines[i] = lines[i].trim_start().to_string();
            }
        }
        5 => {
            // Insert a character that is YAML syntax.
            let chars = [
                ':', '-', '[', ']', '{', '}', '#', '&', '*', '!', '|', '>', '\'', '"', '%', '@',
                '`', '\t', ',', '?',
            ];
            property::insert_char(rng, &mut lines[i], &chars);
        }
        6 => {
            // A duration or number from the generators.
            if let Some((key, _)) = lines[i].split_once(": ") {
                let value = if rng.chance(50) {
                    duration_like(rng)
                } else {
                    replicas_like(rng)
                };
                lines[i] = format!("{key}: {value}");
            }
        }
        _ => {
            // Truncate the text here.
            lines.truncate(i);
        }
    }
    lines.join("\n")
}

/// Loading a mutated config never panics or hangs; an error names at least one problem.
fn fuzz_configs<T>(name: &str, dir: &str, load: impl Fn(&str) -> Result<T, ConfigError>) {
    let seeds = corpus_files(dir);
    property(name, |rng| {
        let (_, seed) = rng.pick(&seeds);
        let mut text = seed.clone();
        for _ in 0..=rng.below(4) {
            text = mutate(rng, &text);
        }
        match guarded(name, &text, &load)? {
            Ok(_) => Ok(()),
            Err(ConfigError::Invalid { problems }) if problems.is_empty() => {
                Err(format!("refused without naming a problem:\n{text}"))
            }
            Err(e) if e.to_string().trim().is_empty() => {
                Err(format!("refused without a message:\n{text}"))
            }
            Err(_) => Ok(()),
        }
    });
}

#[test]
fn property_mutated_prober_configs_never_panic() {
    fuzz_configs("prober_config_mutations", "prober", ProberConfig::from_yaml);
}

#[test]
fn property_mutated_weeder_configs_never_panic() {
    fuzz_configs("weeder_config_mutations", "weeder", WeederConfig::from_yaml);
}

/// A duration written in a random but equivalent way: `(text, nanos)`.
fn duration_text(rng: &mut Rng, max_nanos: u64) -> (String, u64) {
    let nanos = rng.magnitude(max_nanos);
    let text = match rng.below(3) {
        0 => format_go_duration(Duration::from_nanos(nanos)),
        1 => format!("{nanos}ns"),
        _ => {
            // Whole milliseconds in a random unit split.
            let ms = nanos / 1_000_000;
            let nanos = ms * 1_000_000;
            return (format!("{}s{}ms", ms / 1000, ms % 1000), nanos);
        }
    };
    (text, nanos)
}

/// A generated prober config: its YAML and the values it says, for comparing with what loads.
struct GeneratedProberConfig {
    yaml: String,
    interval_ns: u64,
    delay_ns: u64,
    timeout_ns: u64,
    grace_ns: u64,
    fraction: f64,
    jitter: f64,
    /// Per target, in the order written: (scale-up level, scale-down level, optional,
    /// scale-up initial delay in ns).
    levels: Vec<(u32, u32, bool, u64)>,
}

fn random_prober_config(rng: &mut Rng) -> GeneratedProberConfig {
    let day = 86_400_000_000_000;
    let (interval, interval_ns) = duration_text(rng, day);
    let (delay, delay_ns) = duration_text(rng, day);
    let (timeout, timeout_ns) = duration_text(rng, day);
    // kcmNodeMonitorGraceDuration must not be zero when given.
    let (grace, grace_ns) = loop {
        let g = duration_text(rng, day);
        if g.1 > 0 {
            break g;
        }
    };
    let fraction = rng.below(101) as f64 / 100.0;
    let jitter = rng.below(101) as f64 / 100.0;
    let n = 1 + rng.below(4) as usize;
    let mut infos = String::new();
    let mut levels = Vec::new();
    for k in 0..n {
        let (up, down) = (rng.below(4) as u32, rng.below(4) as u32);
        let optional = rng.chance(50);
        let (up_delay, up_delay_ns) = duration_text(rng, 3_600_000_000_000);
        infos.push_str(&format!(
            "  - ref: {{apiVersion: apps/v1, kind: Deployment, name: target-{k}}}\n    optional: {optional}\n    scaleUp: {{level: {up}, initialDelay: {up_delay}}}\n    scaleDown: {{level: {down}}}\n"
        ));
        levels.push((up, down, optional, up_delay_ns));
    }
    let yaml = format!(
        "kubeConfigSecretName: secret-{}\nprobeInterval: {interval}\ninitialDelay: {delay}\nprobeTimeout: {timeout}\nkcmNodeMonitorGraceDuration: {grace}\nnodeLeaseFailureFraction: {fraction}\nbackoffJitterFactor: {jitter}\ndependentResourceInfos:\n{infos}",
        rng.below(1000)
    );
    GeneratedProberConfig {
        yaml,
        interval_ns,
        delay_ns,
        timeout_ns,
        grace_ns,
        fraction,
        jitter,
        levels,
    }
}

/// Where `loaded` differs from what `generated` says, one entry a value.
fn prober_config_differences(
    loaded: &ProberConfig,
    generated: &GeneratedProberConfig,
) -> Vec<String> {
    let d = |ns: u64| Duration::from_nanos(ns);
    let levels = &generated.levels;
    let n = levels.len();
    let mut wrong = Vec::new();
    if loaded.probe_interval != d(generated.interval_ns) {
        wrong.push(format!("probeInterval {:?}", loaded.probe_interval));
    }
    if loaded.initial_delay != d(generated.delay_ns) {
        wrong.push(format!("initialDelay {:?}", loaded.initial_delay));
    }
    // Zero means no timeout.
    if generated.timeout_ns > 0 && loaded.probe_timeout != d(generated.timeout_ns) {
        wrong.push(format!("probeTimeout {:?}", loaded.probe_timeout));
    }
    if loaded.kcm_node_monitor_grace_duration != d(generated.grace_ns) {
        wrong.push(format!(
            "kcmNodeMonitorGraceDuration {:?}",
            loaded.kcm_node_monitor_grace_duration
        ));
    }
    if loaded.node_lease_failure_fraction != generated.fraction {
        wrong.push(format!(
            "nodeLeaseFailureFraction {}",
            loaded.node_lease_failure_fraction
        ));
    }
    if loaded.backoff_jitter_factor != generated.jitter {
        wrong.push(format!(
            "backoffJitterFactor {}",
            loaded.backoff_jitter_factor
        ));
    }
    if loaded.dependent_resource_infos.len() != n {
        wrong.push(format!("{} targets", loaded.dependent_resource_infos.len()));
    }
    for (k, (info, (_, _, optional, up_delay_ns))) in loaded
        .dependent_resource_infos
        .iter()
        .zip(levels)
        .enumerate()
    {
        if info.target.name != format!("target-{k}") || info.optional != *optional {
            wrong.push(format!("target {k}: {info:?}"));
        }
        if info.scale_up.initial_delay != d(*up_delay_ns) {
            wrong.push(format!(
                "target {k} scaleUp.initialDelay {:?}",
                info.scale_up.initial_delay
            ));
        }
    }
    // Levels: the same order as written.
    for i in 0..n {
        for j in 0..n {
            let (ui, di) = (levels[i].0, levels[i].1);
            let (uj, dj) = (levels[j].0, levels[j].1);
            let li = &loaded.dependent_resource_infos[i];
            let lj = &loaded.dependent_resource_infos[j];
            if (ui < uj) != (li.scale_up.level < lj.scale_up.level)
                || (di < dj) != (li.scale_down.level < lj.scale_down.level)
            {
                wrong.push(format!("level order of targets {i} and {j} changed"));
            }
        }
    }
    wrong
}

#[test]
fn property_generated_prober_configs_load_with_their_values() {
    property("prober_config_values", |rng| {
        let generated = random_prober_config(rng);
        let yaml = &generated.yaml;
        let loaded = match guarded("ProberConfig::from_yaml", yaml, ProberConfig::from_yaml)? {
            Ok(l) => l.config,
            Err(e) => return Err(format!("refused:\n{yaml}\n{e}")),
        };
        let wrong = prober_config_differences(&loaded, &generated);
        if wrong.is_empty() {
            Ok(())
        } else {
            Err(format!("{yaml}\nloaded differently: {}", wrong.join(", ")))
        }
    });
}

#[test]
fn property_a_missing_required_field_is_named() {
    let base = corpus_files("prober")
        .into_iter()
        .find(|(n, _)| n == "ok-gardener.yaml")
        .expect("ok-gardener.yaml")
        .1;
    property("required_fields_named", |rng| {
        let (drop, field) = *rng.pick(&[
            ("kubeConfigSecretName:", "kubeConfigSecretName"),
            ("dependentResourceInfos:", "dependentResourceInfos"),
        ]);
        // Drop the field (and, for the list, its items) and shuffle the remaining lines'
        // order of top-level keys a little by adding unknown fields.
        let mut text: String = if drop.starts_with("dependent") {
            base.lines()
                .filter(|l| !l.starts_with(drop) && !l.starts_with([' ', '-']))
                .map(|l| format!("{l}\n"))
                .collect()
        } else {
            base.lines()
                .filter(|l| !l.starts_with(drop))
                .map(|l| format!("{l}\n"))
                .collect()
        };
        for k in 0..rng.below(3) {
            text.push_str(&format!("unknown{k}: {}\n", rng.pick(&SCALARS[..20])));
        }
        match ProberConfig::from_yaml(&text) {
            Err(e) if e.to_string().contains(field) => Ok(()),
            other => Err(format!("{text}\nwithout {field}: {other:?}")),
        }
    });
}
