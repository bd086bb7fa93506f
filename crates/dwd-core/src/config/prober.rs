//! The prober's configuration file (docs/behaviour.md §2.1).
//!
//! Field names, defaults and the meaning of every value match the reference (v1.7.0,
//! `internal/prober/config.go`), so any file it loads loads here with the same effect; see
//! [`super`] for how the file itself is read and `tests/parity.rs` for the file-by-file
//! comparison. Where the reference accepts a value that switches protection off or scales healthy
//! shoots down (a failure fraction of 0, a negative grace period, a zero interval), we start
//! anyway, as it does, and return a warning naming the field and the consequence; the binary
//! logs it once at startup. We reject only what the reference rejects or crashes on.
//! `successThreshold` and `failureThreshold` are ours (optional hysteresis, from the redesign
//! document); the default of 1 keeps the reference behaviour.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;
use std::time::Duration;

use super::goyaml::GoValue;
use super::{Ctx, Fields, Got, Loaded, kind_of, load_document};
use crate::config::{ConfigError, is_blank};
use crate::duration::format_go_duration;

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
pub use crate::zone::DEFAULT_MIN_CANDIDATES_PER_ZONE;
/// The effective `probeTimeout` when the file gives zero or a negative value: the reference's
/// client then has no timeout at all. Go's largest duration (about 292 years) stands for "none"
/// here; it is safe to add to any clock reading.
pub const NO_TIMEOUT: Duration = Duration::from_nanos(i64::MAX as u64);

/// The effective prober configuration, with defaults filled in.
#[derive(Debug, Clone, PartialEq)]
pub struct ProberConfig {
    /// `kubeConfigSecretName` (required, non-blank): the Secret in each shoot namespace whose
    /// `kubeconfig` key reaches that shoot's API server (docs/behaviour.md §2.5).
    pub kube_config_secret_name: String,
    /// Zero when the file gives zero or less: runs follow each other without pause.
    pub probe_interval: Duration,
    /// `initialDelay` (default 30s): time from a probe's start to its first run. Zero when the
    /// file gives a negative value.
    pub initial_delay: Duration,
    /// [`NO_TIMEOUT`] when the file gives zero or less.
    pub probe_timeout: Duration,
    /// As given; zero or less means no jitter.
    pub backoff_jitter_factor: f64,
    /// Zero when the file gives a negative value: every lease counts as expired.
    pub kcm_node_monitor_grace_duration: Duration,
    /// As given: zero or less scales every shoot down, above 1 never scales down.
    pub node_lease_failure_fraction: f64,
    /// `dependentResourceInfos` (required, non-empty): the targets scaled down when a shoot's
    /// nodes look cut off and up again when they are back, in file order.
    pub dependent_resource_infos: Vec<DependentResourceInfo>,
    /// Consecutive scale-up decisions needed before scaling up (ours; default 1).
    pub success_threshold: u32,
    /// Consecutive scale-down decisions needed before scaling down (ours; default 1).
    pub failure_threshold: u32,
    /// `zoneLeaseFailureFraction` (ours): a zone is disrupted when this share of its candidate
    /// leases expired. In (0, 1]; defaults to `nodeLeaseFailureFraction` when that is in
    /// (0, 1], else to 0.6 (docs/behaviour.md §2.19).
    pub zone_lease_failure_fraction: f64,
    /// `minCandidatesPerZone` (ours): a zone with fewer candidates is never disrupted. At least 2.
    pub min_candidates_per_zone: u32,
}

impl ProberConfig {
    /// The zone rule this configuration sets: zones are always judged (and reported); they are
    /// acted on only when some target has `scaleDownOnZoneOutage: true`.
    pub fn zone_rule(&self) -> crate::zone::ZoneRule {
        crate::zone::ZoneRule {
            failure_fraction: self.zone_lease_failure_fraction,
            min_candidates: usize::try_from(self.min_candidates_per_zone).unwrap_or(usize::MAX),
            protection: self
                .dependent_resource_infos
                .iter()
                .any(|i| i.scale_down_on_zone_outage),
        }
    }
}

/// One scalable target and how to scale it in each direction.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DependentResourceInfo {
    /// `ref` (required): the workload in the shoot namespace whose replicas are scaled.
    pub target: ResourceRef,
    /// A missing optional target counts as scaled; a missing required one fails its level.
    pub optional: bool,
    /// `scaleUp` (required): level and timing when the shoot's nodes are reachable again.
    pub scale_up: ScaleInfo,
    /// `scaleDown` (required): level and timing when the shoot's nodes look cut off.
    pub scale_down: ScaleInfo,
    /// `scaleDownOnZoneOutage` (ours, default false): the target is scaled down also when only
    /// a zone is disrupted, not the whole shoot (docs/behaviour.md §2.19).
    pub scale_down_on_zone_outage: bool,
}

/// `autoscaling/v1 CrossVersionObjectReference`: a target in the shoot namespace.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct ResourceRef {
    /// `ref.apiVersion`, `group/version` or `version`, e.g. `apps/v1`; may be empty (with a
    /// warning), as the reference allows.
    pub api_version: String,
    /// `ref.kind`, e.g. `Deployment`; may be empty (with a warning), as the reference allows.
    pub kind: String,
    /// `ref.name`: the target object's name in the shoot namespace, e.g.
    /// `kube-controller-manager`; may be empty (with a warning), as the reference allows.
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
    /// Levels run in ascending order; targets of one level run concurrently. The file's levels
    /// are Go `int`s; when one of them is negative or above `u32::MAX` (the reference takes
    /// both), a direction's levels are renumbered 0, 1, 2, … in the same order, with a warning.
    pub level: u32,
    /// Zero when the file gives a negative value.
    pub initial_delay: Duration,
    /// Zero when the file gives zero or less.
    pub timeout: Duration,
}

/// Formats Go's signed nanoseconds like Go's `Duration.String()`.
fn go_string(nanos: i64) -> String {
    let d = format_go_duration(Duration::from_nanos(nanos.unsigned_abs()));
    if nanos < 0 { format!("-{d}") } else { d }
}

fn nanos_to_duration(nanos: i64) -> Duration {
    Duration::from_nanos(u64::try_from(nanos).unwrap_or(0))
}

fn default_nanos(d: Duration) -> i64 {
    i64::try_from(d.as_nanos()).unwrap_or(i64::MAX)
}

/// Why a `probeInterval` that is not positive deserves a warning.
const INTERVAL_NOT_POSITIVE: &str = "is not positive: every shoot is probed again as soon as a run ends, without pause, which keeps every shoot's API server busy (the reference does the same); set a positive interval such as 10s";

/// Why a negative `initialDelay` deserves a warning.
const DELAY_NEGATIVE: &str = "is negative and counts as 0s (as in the reference)";

/// Why a `probeTimeout` that is not positive deserves a warning.
const TIMEOUT_NOT_POSITIVE: &str = "means no timeout at all (as in the reference, whose client ignores a timeout that is not positive): a shoot API server that accepts connections but never answers holds that shoot's probe, and so its protection, indefinitely";

/// A duration field: its name, its default, when a value deserves a warning, and why.
type WarnedDuration = (&'static str, Duration, fn(i64) -> bool, &'static str);

/// Duration `field` in nanoseconds (its `default` when absent; `None` when invalid), warned
/// about (the value in Go's notation, then `why`) when `suspicious`.
fn duration_nanos(
    f: &mut Fields<'_>,
    cx: &mut Ctx,
    (field, default, suspicious, why): WarnedDuration,
) -> Option<i64> {
    let ns = f.duration(field, cx).or(default_nanos(default))?;
    if suspicious(ns) {
        cx.warn(field, format_args!("{} {why}", go_string(ns)));
    }
    Some(ns)
}

impl ProberConfig {
    /// Loads a prober config. On success the warnings say what loaded but deserves attention; on
    /// failure every problem found is reported at once.
    pub fn from_yaml(text: &str) -> Result<Loaded<ProberConfig>, ConfigError> {
        let map = load_document(text)?;
        let mut cx = Ctx::default();
        let mut f = Fields::of_map(&map, "");

        // validate: MustNotBeEmpty("KubeConfigSecretName") (after strings.TrimSpace).
        let key = "kubeConfigSecretName";
        let kube_config_secret_name = f.string(key, &mut cx).required(
            |s| !is_blank(s),
            (key, "required (must not be empty)"),
            &mut cx,
        );

        // Read in this order.
        let durations: [WarnedDuration; 3] = [
            (
                "probeInterval",
                DEFAULT_PROBE_INTERVAL,
                |ns| ns <= 0,
                INTERVAL_NOT_POSITIVE,
            ),
            (
                "initialDelay",
                DEFAULT_INITIAL_DELAY,
                |ns| ns < 0,
                DELAY_NEGATIVE,
            ),
            (
                "probeTimeout",
                DEFAULT_PROBE_TIMEOUT,
                |ns| ns <= 0,
                TIMEOUT_NOT_POSITIVE,
            ),
        ];
        let [probe_interval, initial_delay, probe_timeout] =
            durations.map(|duration| duration_nanos(&mut f, &mut cx, duration));
        let probe_interval = probe_interval.map(nanos_to_duration);
        let initial_delay = initial_delay.map(nanos_to_duration);
        let probe_timeout = probe_timeout.map(|ns| {
            if ns <= 0 {
                NO_TIMEOUT
            } else {
                nanos_to_duration(ns)
            }
        });

        let backoff_jitter_factor = backoff_jitter_factor(&mut f, &mut cx, probe_interval);

        let kcm_grace = kcm_grace(&mut f, &mut cx);

        let node_lease_failure_fraction = node_lease_failure_fraction(&mut f, &mut cx);

        let success_threshold = threshold(&mut f, "successThreshold", &mut cx);
        let failure_threshold = threshold(&mut f, "failureThreshold", &mut cx);
        let zone_fraction = f.float("zoneLeaseFailureFraction", &mut cx);
        let zone_fraction_given = !matches!(zone_fraction, Got::Absent);
        let zone_lease_failure_fraction =
            zone_failure_fraction(zone_fraction, node_lease_failure_fraction, &mut cx);
        let min_candidates = f.int("minCandidatesPerZone", &mut cx);
        let min_candidates_given = !matches!(min_candidates, Got::Absent);
        let min_candidates_per_zone = min_candidates_per_zone(min_candidates, &mut cx);
        let infos = dependent_resource_infos(&mut f, &mut cx);
        f.finish(&mut cx);

        if let Some(infos) = &infos {
            warn_duplicate_targets(infos, &mut cx);
            let given = [
                (zone_fraction_given, "zoneLeaseFailureFraction"),
                (min_candidates_given, "minCandidatesPerZone"),
            ];
            warn_zone_fields_without_zonal_targets(infos, given, &mut cx);
        }

        let config = (|| {
            Some(ProberConfig {
                kube_config_secret_name: kube_config_secret_name?,
                probe_interval: probe_interval?,
                initial_delay: initial_delay?,
                probe_timeout: probe_timeout?,
                backoff_jitter_factor: backoff_jitter_factor?,
                kcm_node_monitor_grace_duration: kcm_grace?,
                node_lease_failure_fraction: node_lease_failure_fraction?,
                dependent_resource_infos: infos?,
                success_threshold: success_threshold?,
                failure_threshold: failure_threshold?,
                zone_lease_failure_fraction: zone_lease_failure_fraction?,
                min_candidates_per_zone: min_candidates_per_zone?,
            })
        })();
        cx.finish(config)
    }
}

/// Our hysteresis thresholds: absent means 1; when given, an integer from 1 up.
/// `backoffJitterFactor`, warned about when negative or when it can overflow the schedule of
/// `probe_interval`.
fn backoff_jitter_factor(
    f: &mut Fields<'_>,
    cx: &mut Ctx,
    probe_interval: Option<Duration>,
) -> Option<f64> {
    let backoff_jitter_factor = f
        .float("backoffJitterFactor", cx)
        .or(DEFAULT_BACKOFF_JITTER_FACTOR);
    if let Some(j) = backoff_jitter_factor {
        if j < 0.0 {
            cx.warn(
                "backoffJitterFactor",
                format_args!("{j} is negative and means no jitter, like 0 (as in the reference)"),
            );
        }
        if probe_interval.is_some_and(|i| crate::schedule::jitter_can_overflow(i, j)) {
            cx.warn(
                "backoffJitterFactor",
                format_args!(
                    "{j} times probeInterval can exceed Go's largest duration (about 292 years): as in the reference, every run whose random delay overflows follows the previous one at once, without pause"
                ),
            );
        }
    }
    backoff_jitter_factor
}

/// `kcmNodeMonitorGraceDuration`.
fn kcm_grace(f: &mut Fields<'_>, cx: &mut Ctx) -> Option<Duration> {
    // validate: MustNotBeZeroDuration("KCMNodeMonitorGraceDuration") rejects exactly zero;
    // a negative value passes and makes every lease count as expired.
    match f.duration("kcmNodeMonitorGraceDuration", cx) {
        Got::Absent => Some(DEFAULT_KCM_NODE_MONITOR_GRACE),
        Got::Invalid => None,
        Got::Value(0) => {
            cx.problem(
                "kcmNodeMonitorGraceDuration",
                "must not be zero (every lease would count as expired at once); the reference refuses it too",
            );
            None
        }
        Got::Value(ns) => {
            if ns < 0 {
                cx.warn(
                    "kcmNodeMonitorGraceDuration",
                    format_args!(
                        "{} is negative: every lease counts as expired at once, so every shoot with at least 2 candidate nodes is scaled down (the reference does the same); set KCM's node-monitor-grace-period (40s by default)",
                        go_string(ns)
                    ),
                );
            }
            Some(nanos_to_duration(ns))
        }
    }
}

/// `nodeLeaseFailureFraction`, warned about when it scales every shoot down or none.
fn node_lease_failure_fraction(f: &mut Fields<'_>, cx: &mut Ctx) -> Option<f64> {
    let node_lease_failure_fraction = f
        .float("nodeLeaseFailureFraction", cx)
        .or(DEFAULT_NODE_LEASE_FAILURE_FRACTION);
    match node_lease_failure_fraction {
        Some(x) if x <= 0.0 => cx.warn(
            "nodeLeaseFailureFraction",
            format_args!(
                "{x} is reached even when no lease has expired: every shoot with at least 2 candidate nodes is scaled down on every run (the reference does the same); use a fraction in (0, 1] such as 0.6"
            ),
        ),
        Some(x) if x > 1.0 => cx.warn(
            "nodeLeaseFailureFraction",
            format_args!(
                "{x} is above 1 and can never be reached: no shoot is ever scaled down, so there is no meltdown protection (the reference does the same); use a fraction in (0, 1] such as 0.6"
            ),
        ),
        _ => {}
    }
    node_lease_failure_fraction
}

/// Warns about each zonal field `given` (whether, which) when no target of `infos` is zonal.
fn warn_zone_fields_without_zonal_targets(
    infos: &[DependentResourceInfo],
    given: [(bool, &'static str); 2],
    cx: &mut Ctx,
) {
    let zonal = infos.iter().any(|i| i.scale_down_on_zone_outage);
    for (given, key) in given {
        if given && !zonal {
            cx.warn(
                key,
                "no target has scaleDownOnZoneOutage: true, so zonal protection is not configured: disrupted zones are reported (events, metrics, explain) but nothing is scaled for them",
            );
        }
    }
}

fn threshold(f: &mut Fields<'_>, key: &'static str, cx: &mut Ctx) -> Option<u32> {
    let got = f.int(key, cx);
    u32_from(got, (key, DEFAULT_THRESHOLD), 1, "", cx)
}

/// A count of ours: `default` when absent; when given, an integer from `min` to `u32::MAX`,
/// else a problem saying so (with `why`, if any, after the range).
fn u32_from(
    got: Got<i64>,
    (key, default): (&str, u32),
    min: u32,
    why: &str,
    cx: &mut Ctx,
) -> Option<u32> {
    let n = got.or(i64::from(default))?;
    match u32::try_from(n) {
        Ok(n) if n >= min => Some(n),
        _ => {
            let max = u32::MAX;
            cx.problem(
                key,
                format!("must be an integer from {min} to {max}{why}, got {n}"),
            );
            None
        }
    }
}

/// `zoneLeaseFailureFraction` (ours): absent means `nodeLeaseFailureFraction` when that is a
/// usable fraction, else [`DEFAULT_NODE_LEASE_FAILURE_FRACTION`]; when given, in (0, 1]. Unlike
/// the reference's own fields, a value that would disrupt every zone (0) or none (above 1) is
/// refused: the field is new, so no file that works today can carry it.
fn zone_failure_fraction(got: Got<f64>, node_fraction: Option<f64>, cx: &mut Ctx) -> Option<f64> {
    const KEY: &str = "zoneLeaseFailureFraction";
    match got {
        Got::Absent => Some(match node_fraction {
            Some(x) if x > 0.0 && x <= 1.0 => x,
            _ => DEFAULT_NODE_LEASE_FAILURE_FRACTION,
        }),
        Got::Invalid => None,
        Got::Value(x) if x > 0.0 && x <= 1.0 => Some(x),
        Got::Value(x) => {
            cx.problem(
                KEY,
                format!("must be a fraction in (0, 1] such as 1.0 (every candidate lease of the zone expired), got {x}"),
            );
            None
        }
    }
}

/// `minCandidatesPerZone` (ours): absent means [`DEFAULT_MIN_CANDIDATES_PER_ZONE`]; when given,
/// an integer from 2 up.
fn min_candidates_per_zone(got: Got<i64>, cx: &mut Ctx) -> Option<u32> {
    let key = ("minCandidatesPerZone", DEFAULT_MIN_CANDIDATES_PER_ZONE);
    let why = " (a zone of one node cannot tell its node's failure from the zone's)";
    u32_from(got, key, 2, why, cx)
}

/// A target as read, before the levels of all targets are known.
struct RawInfo {
    target: ResourceRef,
    optional: bool,
    zonal: bool,
    up: RawScale,
    down: RawScale,
}

struct RawScale {
    level: i64,
    initial_delay: Duration,
    timeout: Duration,
}

fn dependent_resource_infos(
    f: &mut Fields<'_>,
    cx: &mut Ctx,
) -> Option<Vec<DependentResourceInfo>> {
    const PATH: &str = "dependentResourceInfos";
    // validate: MustNotBeEmpty("ScaleResourceInfos").
    let problem = "required: list the targets to scale (must not be empty)";
    let (path, items) =
        f.list(PATH, cx)
            .required(|(_, items)| !items.is_empty(), (PATH, problem), cx)?;
    let mut raw = Vec::with_capacity(items.len());
    let mut all_ok = true;
    for (i, item) in items.iter().enumerate() {
        let item_path = format!("{path}[{i}]");
        match dependent_resource_info(item, &item_path, cx) {
            Some(info) => raw.push(info),
            None => all_ok = false,
        }
    }
    if !all_ok {
        return None;
    }
    let up = plan_levels(
        &raw,
        |r| r.up.level,
        &format!("{path}[*].scaleUp.level"),
        cx,
    );
    let down = plan_levels(
        &raw,
        |r| r.down.level,
        &format!("{path}[*].scaleDown.level"),
        cx,
    );
    Some(
        raw.into_iter()
            .zip(up.into_iter().zip(down))
            .map(|(r, (up_level, down_level))| DependentResourceInfo {
                target: r.target,
                optional: r.optional,
                scale_down_on_zone_outage: r.zonal,
                scale_up: ScaleInfo {
                    level: up_level,
                    initial_delay: r.up.initial_delay,
                    timeout: r.up.timeout,
                },
                scale_down: ScaleInfo {
                    level: down_level,
                    initial_delay: r.down.initial_delay,
                    timeout: r.down.timeout,
                },
            })
            .collect(),
    )
}

/// The `u32` levels of one direction. Levels only order and group targets, so renumbering them
/// in the same order changes nothing the reference does; we only do it when some level does not
/// fit (negative, or above `u32::MAX`), and say so, since logs then show the new numbers.
fn plan_levels(
    raw: &[RawInfo],
    level: impl Fn(&RawInfo) -> i64,
    path: &str,
    cx: &mut Ctx,
) -> Vec<u32> {
    let levels: Vec<i64> = raw.iter().map(&level).collect();
    let direct: Option<Vec<u32>> = levels.iter().map(|l| u32::try_from(*l).ok()).collect();
    if let Some(direct) = direct {
        return direct;
    }
    let distinct: BTreeSet<i64> = levels.iter().copied().collect();
    let rank: BTreeMap<i64, u32> = distinct
        .iter()
        .enumerate()
        .map(|(i, l)| (*l, u32::try_from(i).unwrap_or(u32::MAX)))
        .collect();
    let mapping: Vec<String> = rank.iter().map(|(l, r)| format!("{l} → {r}")).collect();
    cx.warn(
        path,
        format_args!(
            "levels outside 0..{} run in the same order as in the reference, but logs, events and explain show them renumbered: {}",
            u32::MAX,
            mapping.join(", ")
        ),
    );
    levels
        .iter()
        .map(|l| rank.get(l).copied().unwrap_or(u32::MAX))
        .collect()
}

fn dependent_resource_info(v: &GoValue, path: &str, cx: &mut Ctx) -> Option<RawInfo> {
    let map = match v {
        GoValue::Map(map) => map,
        // A null entry decodes to an empty one, whose missing ref crashes the reference.
        GoValue::Null => {
            cx.problem(
                format!("{path}.ref"),
                "required (the entry is null; the reference crashes with a nil-pointer panic on it)",
            );
            return None;
        }
        other => {
            cx.problem(path, format!("must be a mapping, got {}", kind_of(other)));
            return None;
        }
    };
    let mut f = Fields::of_map(map, path);
    let target = match f.object("ref", cx) {
        Got::Value((ref_path, entries)) => {
            resource_ref(Fields::new(entries, ref_path.as_str()), cx)
        }
        Got::Invalid => None,
        Got::Absent => {
            cx.problem(
                f.path_of("ref"),
                "required (the reference crashes with a nil-pointer panic without it)",
            );
            None
        }
    };
    let optional = f.bool("optional", cx).or(false);
    let zonal = f.bool("scaleDownOnZoneOutage", cx).or(false);
    let up = scale_info(&mut f, "scaleUp", target.as_ref(), cx);
    let down = scale_info(&mut f, "scaleDown", target.as_ref(), cx);
    f.finish(cx);
    Some(RawInfo {
        target: target?,
        optional: optional?,
        zonal: zonal?,
        up: up?,
        down: down?,
    })
}

fn resource_ref(mut f: Fields<'_>, cx: &mut Ctx) -> Option<ResourceRef> {
    let api_version = f.string("apiVersion", cx).or(String::new());
    let kind = f.string("kind", cx).or(String::new());
    let name = f.string("name", cx).or(String::new());
    if let Some(a) = &api_version {
        // validate: ResourceRefMustBeValid → schema.ParseGroupVersion, which fails only on a
        // second slash. Its scheme check is computed and ignored, so any group and kind pass.
        if a.matches('/').count() > 1 {
            cx.problem(
                f.path_of("apiVersion"),
                format!("unexpected GroupVersion string {a:?}: use \"group/version\" or \"version\" (the reference refuses it too)"),
            );
        } else if !well_formed_api_version(a) {
            cx.warn(
                &f.path_of("apiVersion"),
                format_args!(
                    "{a:?} is not of the form \"group/version\" or \"version\"; it is unlikely to name the target, and a required target that can't be found fails its level on every run"
                ),
            );
        }
    }
    for (key, value) in [("kind", &kind), ("name", &name)] {
        if value.as_deref().is_some_and(is_blank) {
            cx.warn(
                &f.path_of(key),
                "empty: no object is found by it, so a required target fails its level on every run (the reference does not check it either)",
            );
        }
    }
    f.finish(cx);
    Some(ResourceRef {
        api_version: api_version?,
        kind: kind?,
        name: name?,
    })
}

/// `apps/v1` or `v1`: no spaces, at most one slash, no empty side.
fn well_formed_api_version(s: &str) -> bool {
    let mut parts = s.split('/');
    let ok_part = |p: &str| !p.is_empty() && !p.chars().any(char::is_whitespace);
    match (parts.next(), parts.next(), parts.next()) {
        (Some(v), None, None) => ok_part(v),
        (Some(g), Some(v), None) => ok_part(g) && ok_part(v),
        _ => false,
    }
}

fn scale_info(
    parent: &mut Fields<'_>,
    key: &str,
    target: Option<&ResourceRef>,
    cx: &mut Ctx,
) -> Option<RawScale> {
    // validate: MustNotBeNil("scaleUp"/"scaleDown").
    let (path, entries) = match parent.object(key, cx) {
        Got::Value(v) => v,
        Got::Invalid => return None,
        Got::Absent => {
            cx.problem(parent.path_of(key), "required (must not be null)");
            return None;
        }
    };
    let mut f = Fields::new(entries, path.as_str());
    // `level` is a Go int: absent means 0.
    let level = f.int("level", cx).or(0);
    let initial_delay = f
        .duration("initialDelay", cx)
        .or(default_nanos(DEFAULT_SCALE_INITIAL_DELAY))
        .map(|ns| {
            if ns < 0 {
                cx.warn(
                    &f.path_of("initialDelay"),
                    format_args!(
                        "{} is negative and counts as 0s (as in the reference)",
                        go_string(ns)
                    ),
                );
            }
            nanos_to_duration(ns)
        });
    let timeout = f
        .duration("timeout", cx)
        .or(default_nanos(DEFAULT_SCALE_TIMEOUT))
        .map(|ns| {
            if ns <= 0 {
                let what = target.map_or_else(|| "this target".to_owned(), ToString::to_string);
                cx.warn(
                    &f.path_of("timeout"),
                    format_args!(
                        "{} is not positive: the reference gives its scale call a deadline that has already passed, so it never scales {what} this way and the flow stops at this level on every run; here {what} is scaled and the wait for its replicas ends at once",
                        go_string(ns)
                    ),
                );
            }
            nanos_to_duration(ns)
        });
    f.finish(cx);
    Some(RawScale {
        level: level?,
        initial_delay: initial_delay?,
        timeout: timeout?,
    })
}

/// The same target listed twice would be scaled twice per flow; legal, but almost certainly a
/// copy-paste slip worth pointing out.
fn warn_duplicate_targets(infos: &[DependentResourceInfo], cx: &mut Ctx) {
    let mut seen = BTreeSet::new();
    for (i, info) in infos.iter().enumerate() {
        if !seen.insert(&info.target) {
            cx.warn(
                &format!("dependentResourceInfos[{i}].ref"),
                format_args!("{} is listed more than once", info.target),
            );
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

    /// A config for Secret `s` with the dependentResourceInfos `infos` (YAML list items).
    fn with_infos(infos: &str) -> String {
        format!("kubeConfigSecretName: s\ndependentResourceInfos:\n{infos}")
    }

    /// Asserts that `yaml` has as many problems as `expected` names, one at each path with a
    /// message containing the text given for it.
    fn assert_problems(yaml: &str, expected: &[(&str, &str)]) {
        let problems = problems_of(yaml);
        assert_eq!(problems.len(), expected.len(), "{problems:?}");
        for (path, needle) in expected {
            assert!(
                has(&problems, path, needle),
                "{path}: {needle}: {problems:?}"
            );
        }
    }

    /// A dependentResourceInfos item for `reference` (the fields of `ref`), at level 0 both ways.
    fn at_level_0(reference: &str) -> String {
        format!("- ref: {{{reference}}}\n  scaleUp: {{level: 0}}\n  scaleDown: {{level: 0}}\n")
    }

    /// A config for Secret `s` whose targets are Deployments (name, scaleUp, scaleDown if
    /// any), the scale fields as YAML flow mappings.
    fn deployments(targets: &[(&str, &str, Option<&str>)]) -> String {
        let mut yaml = with_infos("");
        for (name, up, down) in targets {
            yaml += &format!("- ref: {{kind: Deployment, name: {name}, apiVersion: apps/v1}}\n");
            yaml += &format!("  scaleUp: {up}\n");
            if let Some(down) = down {
                yaml += &format!("  scaleDown: {down}\n");
            }
        }
        yaml
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
    fn zonal_fields_are_absent_by_default_and_judge_zones_by_the_shoot_fraction() {
        let c = ProberConfig::from_yaml(GARDENER_FULL).unwrap().config;
        let rule = c.zone_rule();
        assert_eq!(rule.failure_fraction, 0.6);
        assert_eq!(rule.min_candidates, 2);
        assert!(!rule.protection, "no target is zonal");
        assert!(
            c.dependent_resource_infos
                .iter()
                .all(|i| !i.scale_down_on_zone_outage)
        );
        // A shoot fraction outside (0, 1] does not make every zone disrupted.
        let yaml = GARDENER_FULL.replace(
            "nodeLeaseFailureFraction: 0.6",
            "nodeLeaseFailureFraction: 0",
        );
        let c = ProberConfig::from_yaml(&yaml).unwrap().config;
        assert_eq!(c.zone_rule().failure_fraction, 0.6);
    }

    #[test]
    fn zonal_fields_load_and_switch_zonal_protection_on() {
        let yaml = GARDENER_FULL
            .replace(
                "- ref: {kind: Deployment, name: machine-controller-manager, apiVersion: apps/v1}\n  optional: false\n",
                "- ref: {kind: Deployment, name: machine-controller-manager, apiVersion: apps/v1}\n  optional: false\n  scaleDownOnZoneOutage: true\n",
            )
            + "zoneLeaseFailureFraction: 1.0\nminCandidatesPerZone: 3\n";
        let loaded = ProberConfig::from_yaml(&yaml).unwrap();
        assert!(loaded.warnings.is_empty(), "{:?}", loaded.warnings);
        let c = loaded.config;
        assert!(c.dependent_resource_infos[1].scale_down_on_zone_outage);
        assert!(!c.dependent_resource_infos[0].scale_down_on_zone_outage);
        let rule = c.zone_rule();
        assert_eq!(
            (rule.failure_fraction, rule.min_candidates, rule.protection),
            (1.0, 3, true)
        );
    }

    #[test]
    fn zonal_fields_out_of_range_are_refused_by_name() {
        for (field, value, needle) in [
            (
                "zoneLeaseFailureFraction",
                "0",
                "must be a fraction in (0, 1]",
            ),
            (
                "zoneLeaseFailureFraction",
                "1.5",
                "must be a fraction in (0, 1]",
            ),
            ("minCandidatesPerZone", "1", "must be an integer from 2"),
            ("minCandidatesPerZone", "-4", "must be an integer from 2"),
        ] {
            let problems = problems_of(&format!("{GARDENER_FULL}{field}: {value}\n"));
            assert!(
                has(&problems, field, needle),
                "{field}={value}: {problems:?}"
            );
        }
        let problems = problems_of(&GARDENER_FULL.replace(
            "  optional: true\n",
            "  optional: true\n  scaleDownOnZoneOutage: maybe\n",
        ));
        assert!(
            has(
                &problems,
                "dependentResourceInfos[2].scaleDownOnZoneOutage",
                "must be true or false"
            ),
            "{problems:?}"
        );
    }

    #[test]
    fn zonal_fields_without_a_zonal_target_warn_that_zones_are_only_reported() {
        let loaded =
            ProberConfig::from_yaml(&format!("{GARDENER_FULL}zoneLeaseFailureFraction: 1\n"))
                .unwrap();
        assert_eq!(loaded.warnings.len(), 1, "{:?}", loaded.warnings);
        assert!(
            loaded.warnings[0]
                .starts_with("zoneLeaseFailureFraction: no target has scaleDownOnZoneOutage")
        );
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
                message: "required: list the targets to scale (must not be empty)".into()
            }]
        );
    }

    #[test]
    fn missing_scale_down_is_named_by_index() {
        let yaml = deployments(&[
            ("a", "{level: 0}", Some("{level: 0}")),
            ("b", "{level: 0}", None),
        ]);
        let problems = problems_of(&yaml);
        assert_eq!(problems.len(), 1);
        assert_eq!(
            problems[0].to_string(),
            "dependentResourceInfos[1].scaleDown: required (must not be null)"
        );
    }

    #[test]
    fn zero_kcm_grace_is_rejected() {
        // internal/prober/config.go validate: MustNotBeZeroDuration.
        for zero in ["0s", "\"0\"", "-0s"] {
            let yaml = GARDENER_FULL.replace(
                "kcmNodeMonitorGraceDuration: 40s",
                &format!("kcmNodeMonitorGraceDuration: {zero}"),
            );
            assert!(
                has(
                    &problems_of(&yaml),
                    "kcmNodeMonitorGraceDuration",
                    "must not be zero"
                ),
                "{zero}"
            );
        }
    }

    #[test]
    fn negative_kcm_grace_loads_as_zero_with_a_warning() {
        // The reference accepts it (only zero is refused) and every lease then counts as expired.
        let yaml = GARDENER_FULL.replace(
            "kcmNodeMonitorGraceDuration: 40s",
            "kcmNodeMonitorGraceDuration: -1s",
        );
        let loaded = ProberConfig::from_yaml(&yaml).unwrap();
        assert_eq!(
            loaded.config.kcm_node_monitor_grace_duration,
            Duration::ZERO
        );
        assert_eq!(loaded.warnings.len(), 1);
        assert!(
            loaded.warnings[0].starts_with(
                "kcmNodeMonitorGraceDuration: -1s is negative: every lease counts as expired"
            ),
            "{}",
            loaded.warnings[0]
        );
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
    fn zero_probe_interval_and_timeout_load_as_the_reference_reads_them_with_warnings() {
        // An interval of 0 runs probes back to back; a timeout of 0 is no timeout (client-go
        // ignores a timeout that is not positive). Both are accepted by the reference.
        let yaml = GARDENER_FULL
            .replace("probeInterval: 20s", "probeInterval: 0s")
            .replace("probeTimeout: 10s", "probeTimeout: \"0\"");
        let loaded = ProberConfig::from_yaml(&yaml).unwrap();
        assert_eq!(loaded.config.probe_interval, Duration::ZERO);
        assert_eq!(loaded.config.probe_timeout, NO_TIMEOUT);
        let fields: Vec<_> = loaded
            .warnings
            .iter()
            .map(|w| w.split(':').next().unwrap_or_default())
            .collect();
        assert_eq!(fields, ["probeInterval", "probeTimeout"]);
        assert!(loaded.warnings[1].contains("no timeout at all"));
    }

    #[test]
    fn failure_fraction_outside_zero_one_loads_with_a_warning_naming_the_consequence() {
        for (value, consequence) in [
            (
                "0",
                "every shoot with at least 2 candidate nodes is scaled down",
            ),
            (
                "0.0",
                "every shoot with at least 2 candidate nodes is scaled down",
            ),
            (
                "-0.1",
                "every shoot with at least 2 candidate nodes is scaled down",
            ),
            ("1.5", "no shoot is ever scaled down"),
        ] {
            let yaml = GARDENER_FULL.replace(
                "nodeLeaseFailureFraction: 0.6",
                &format!("nodeLeaseFailureFraction: {value}"),
            );
            let loaded = ProberConfig::from_yaml(&yaml).unwrap();
            assert_eq!(
                loaded.config.node_lease_failure_fraction,
                value.parse::<f64>().unwrap()
            );
            assert_eq!(loaded.warnings.len(), 1, "{value}");
            assert!(
                loaded.warnings[0].starts_with("nodeLeaseFailureFraction: ")
                    && loaded.warnings[0].contains(consequence),
                "{value}: {}",
                loaded.warnings[0]
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
    fn negative_jitter_means_no_jitter_with_a_warning() {
        let yaml = GARDENER_FULL.replace("backoffJitterFactor: 0.2", "backoffJitterFactor: -0.5");
        let loaded = ProberConfig::from_yaml(&yaml).unwrap();
        assert_eq!(loaded.config.backoff_jitter_factor, -0.5);
        assert_eq!(
            loaded.warnings,
            [
                "backoffJitterFactor: -0.5 is negative and means no jitter, like 0 (as in the reference)"
            ]
        );
    }

    #[test]
    fn levels_are_go_ints_missing_means_zero() {
        let yaml = deployments(&[
            ("a", "{level: -1}", Some("{level: 1.5}")),
            ("b", r#"{level: "one"}"#, Some("{}")),
        ]);
        assert_problems(
            &yaml,
            &[
                (
                    "dependentResourceInfos[0].scaleDown.level",
                    "must be a 64-bit integer, got 1.5",
                ),
                (
                    "dependentResourceInfos[1].scaleUp.level",
                    "must be an integer, got the string \"one\"",
                ),
            ],
        );

        // -1, 1.0 and a missing level load; levels outside u32 are renumbered in order.
        let yaml = deployments(&[
            ("a", "{level: -1}", Some("{level: 1.0}")),
            ("b", "{level: 5}", Some("{}")),
        ]);
        let loaded = ProberConfig::from_yaml(&yaml).unwrap();
        let infos = &loaded.config.dependent_resource_infos;
        assert_eq!((infos[0].scale_up.level, infos[1].scale_up.level), (0, 1));
        assert_eq!(
            (infos[0].scale_down.level, infos[1].scale_down.level),
            (1, 0)
        );
        assert_eq!(
            loaded.warnings,
            [
                "dependentResourceInfos[*].scaleUp.level: levels outside 0..4294967295 run in the same order as in the reference, but logs, events and explain show them renumbered: -1 → 0, 5 → 1"
            ]
        );
    }

    #[test]
    fn ref_fields_are_required_and_checked() {
        let without_ref = "- scaleUp: {level: 0}\n  scaleDown: {level: 0}\n  optional: \"yes\"\n";
        let yaml = with_infos(&(at_level_0(r#"kind: "", apiVersion: "a/b/c""#) + without_ref));
        assert_problems(
            &yaml,
            &[
                (
                    "dependentResourceInfos[0].ref.apiVersion",
                    "unexpected GroupVersion string",
                ),
                ("dependentResourceInfos[1].ref", "required"),
                (
                    "dependentResourceInfos[1].optional",
                    "must be true or false",
                ),
            ],
        );
    }

    #[test]
    fn empty_ref_parts_load_with_warnings_as_the_reference_does_not_check_them() {
        let yaml = with_infos(&at_level_0(r#"kind: "", apiVersion: "apps/""#));
        let loaded = ProberConfig::from_yaml(&yaml).unwrap();
        let paths: Vec<_> = loaded
            .warnings
            .iter()
            .map(|w| w.split(": ").next().unwrap_or_default())
            .collect();
        assert_eq!(
            paths,
            [
                "dependentResourceInfos[0].ref.apiVersion",
                "dependentResourceInfos[0].ref.kind",
                "dependentResourceInfos[0].ref.name",
            ]
        );
    }

    #[test]
    fn thresholds_must_be_at_least_one() {
        let yaml = format!("{GARDENER_FULL}successThreshold: 0\nfailureThreshold: -2\n");
        let problems = problems_of(&yaml);
        assert!(has(
            &problems,
            "successThreshold",
            "must be an integer from 1"
        ));
        assert!(has(
            &problems,
            "failureThreshold",
            "must be an integer from 1"
        ));
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
        // A fraction of 2, a jitter of -1 and a ref without a name load (with warnings) in the
        // reference too, so they are not among the problems.
        for expected in [
            "kubeConfigSecretName",
            "probeInterval",
            "probeTimeout",
            "kcmNodeMonitorGraceDuration",
            "dependentResourceInfos[0].scaleUp.timeout",
            "dependentResourceInfos[0].scaleDown",
        ] {
            assert!(
                paths.contains(expected),
                "{expected} missing from {paths:?}"
            );
        }
        let text = err.to_string();
        assert_eq!(problems.len(), 6, "{problems:?}");
        assert!(text.starts_with("invalid config (6 problems):"), "{text}");
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
        let yaml = deployments(&[
            ("a", "{level: 0}", Some("{level: 0}")),
            ("a", "{level: 1}", Some("{level: 1}")),
        ]);
        let loaded = ProberConfig::from_yaml(&yaml).unwrap();
        assert_eq!(loaded.warnings.len(), 1);
        assert!(loaded.warnings[0].starts_with("dependentResourceInfos[1].ref:"));
    }
}
