//! Gardener's own dependency-watchdog configs, and the configs derived from them that the
//! sandbox runs (the bench includes this file too, so both run what Gardener runs).
//!
//! `deploy/gardener/prober.yaml` and `weeder.yaml` hold what gardenlet generates, as data; the
//! `dep-config.yaml` of each one's ConfigMap is what a seed's watchdog reads. We take that text
//! as it is, change only the intervals we are asked to (a demo can't wait 30 s between probes),
//! and then check with the watchdog's own loader that nothing else moved: targets, levels,
//! delays we did not touch, optionality, timeouts, threshold and selectors stay Gardener's.

use std::fmt;
use std::time::Duration;

use anyhow::{Context, Result, anyhow, ensure};
use dwd_core::{
    ConfigError, Loaded, ProberConfig, WeederConfig, format_go_duration, parse_go_duration,
};
use serde_json::{Map, Value};

/// The prober fixture, relative to the workspace root (for what we print).
pub(crate) const PROBER_FIXTURE_PATH: &str = "deploy/gardener/prober.yaml";
/// The weeder fixture, relative to the workspace root.
pub(crate) const WEEDER_FIXTURE_PATH: &str = "deploy/gardener/weeder.yaml";
// Compiled in rather than read at run time: the binaries then run from any directory, and a
// change to the fixtures rebuilds them.
const PROBER_FIXTURE: &str = include_str!("../../../deploy/gardener/prober.yaml");
const WEEDER_FIXTURE: &str = include_str!("../../../deploy/gardener/weeder.yaml");

/// One field whose value differs from Gardener's.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Change {
    /// Where, e.g. `probeInterval` or `machine-controller-manager scaleUp.initialDelay`.
    pub field: String,
    /// Gardener's effective value, e.g. `30s` or `30s (default)` when gardenlet leaves it out.
    pub gardener: String,
    /// Ours.
    pub ours: String,
}

impl fmt::Display for Change {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} {} → {}", self.field, self.gardener, self.ours)
    }
}

/// `a → b, c → d`, or `none` when nothing changed.
pub(crate) fn changes_text(changes: &[Change]) -> String {
    if changes.is_empty() {
        return "none".into();
    }
    changes
        .iter()
        .map(Change::to_string)
        .collect::<Vec<_>>()
        .join(", ")
}

/// A config derived from Gardener's.
#[derive(Debug, Clone)]
pub(crate) struct Derived<T> {
    /// Gardener's config as the watchdog loads it (defaults filled in).
    pub gardener: T,
    /// Ours, loaded by the same loader.
    pub config: T,
    /// The file to hand to `--config-file`: a comment naming the changes, then the YAML.
    pub yaml: String,
    /// What differs from Gardener's.
    pub changes: Vec<Change>,
    /// Fields of ours that Gardener's config does not set at all (zonal protection), added on
    /// top of the changes: told apart from them, never hidden among them.
    pub additions: Vec<Change>,
}

/// The prober intervals to change; `None` keeps Gardener's.
#[derive(Debug, Clone, Default)]
pub(crate) struct ProberChanges {
    /// `probeInterval` (Gardener: 30 s).
    pub probe_interval: Option<Duration>,
    /// `initialDelay` (Gardener leaves the default, 30 s).
    pub initial_delay: Option<Duration>,
    /// `kcmNodeMonitorGraceDuration` (Gardener leaves the default, 40 s).
    pub kcm_node_monitor_grace: Option<Duration>,
    /// `backoffJitterFactor` (Gardener leaves the default, 0.2).
    pub backoff_jitter_factor: Option<f64>,
    /// Every non-zero `scaleUp.initialDelay` Gardener sets (MCM's 30 s).
    pub scale_up_delay: Option<Duration>,
}

/// The `dep-config.yaml` of the one ConfigMap in a fixture.
fn dep_config(fixture: &str, path: &str) -> Result<String> {
    let docs: Vec<Value> =
        serde_saphyr::from_multiple(fixture).map_err(|e| anyhow!("parse {path}: {e}"))?;
    let maps: Vec<&Value> = docs.iter().filter(|d| d["kind"] == "ConfigMap").collect();
    ensure!(maps.len() == 1, "{path}: {} ConfigMaps, want 1", maps.len());
    maps[0]["data"]["dep-config.yaml"]
        .as_str()
        .map(str::to_string)
        .with_context(|| format!("{path}: the ConfigMap has no data.dep-config.yaml"))
}

/// The config text as a YAML mapping.
fn mapping(text: &str, path: &str) -> Result<Map<String, Value>> {
    match serde_saphyr::from_str::<Value>(text) {
        Ok(Value::Object(map)) => Ok(map),
        Ok(_) => Err(anyhow!("{path}: dep-config.yaml is not a mapping")),
        Err(e) => Err(anyhow!("{path}: dep-config.yaml: {e}")),
    }
}

/// Gardener's value of a top-level duration field as text, `(default)` when it is left out.
fn gardener_value(map: &Map<String, Value>, key: &str, effective: String) -> String {
    if map.contains_key(key) {
        effective
    } else {
        format!("{effective} (default)")
    }
}

/// Sets a top-level field and records the change, unless the value is Gardener's already
/// (then the text stays as gardenlet wrote it, a defaulted field left out).
/// `(gardener, ours, value)`: Gardener's value and ours as text, ours as the YAML value.
fn set(
    map: &mut Map<String, Value>,
    changes: &mut Vec<Change>,
    key: &str,
    (gardener, ours, value): (String, String, Value),
) {
    if gardener == ours {
        return;
    }
    changes.push(Change {
        field: key.to_string(),
        gardener: gardener_value(map, key, gardener),
        ours,
    });
    map.insert(key.to_string(), value);
}

/// What [`set`] takes for a duration field: Gardener's value and ours as Go writes them.
fn durations(gardener: Duration, ours: Duration) -> (String, String, Value) {
    let ours_text = format_go_duration(ours);
    (
        format_go_duration(gardener),
        ours_text.clone(),
        Value::String(ours_text),
    )
}

/// The watchdog's loader of one config kind (`ProberConfig::from_yaml`, `WeederConfig::from_yaml`).
type Load<C> = fn(&str) -> Result<Loaded<C>, ConfigError>;

/// Gardener's config from `fixture` (at `path`) as the watchdog loads it, and its text as a
/// mapping to change.
fn gardeners<C>(fixture: &str, path: &str, load: Load<C>) -> Result<(C, Map<String, Value>)> {
    let text = dep_config(fixture, path)?;
    let gardener = load(&text).map_err(|e| anyhow!("{path}: {e}"))?.config;
    Ok((gardener, mapping(&text, path)?))
}

/// The `what` config derived from Gardener's (`gardener`, from `path`): `map` written with
/// its `changes`, loaded back with the watchdog's loader and checked to be `expected`.
fn derive<C: PartialEq>(
    what: &str,
    path: &str,
    load: Load<C>,
    gardener: C,
    expected: C,
    map: Map<String, Value>,
    changes: Vec<Change>,
) -> Result<Derived<C>> {
    let yaml = render(what, path, &changes, map)?;
    let loaded = load(&yaml).map_err(|e| anyhow!("the derived config: {e}"))?;
    ensure!(
        loaded.warnings.is_empty(),
        "the derived {what} config has unknown fields: {:?}",
        loaded.warnings
    );
    // The whole point: only the intervals asked for differ from what Gardener runs.
    ensure!(
        loaded.config == expected,
        "the derived {what} config differs from Gardener's beyond {}:\n{yaml}",
        changes_text(&changes)
    );
    Ok(Derived {
        gardener,
        config: loaded.config,
        yaml,
        changes,
        additions: Vec::new(),
    })
}

/// The file for `--config-file`: what it is and what changed, then the YAML.
fn render(what: &str, path: &str, changes: &[Change], map: Map<String, Value>) -> Result<String> {
    let body = serde_saphyr::to_string(&Value::Object(map))
        .map_err(|e| anyhow!("write the {what} config: {e}"))?;
    let mut out = format!(
        "# Gardener's {what} config ({path}, ConfigMap key dep-config.yaml), as gardenlet generates it\n"
    );
    if changes.is_empty() {
        out.push_str("# unchanged.\n");
    } else {
        out.push_str("# but for these intervals (Gardener's value → ours):\n");
        for c in changes {
            out.push_str(&format!("#   {c}\n"));
        }
    }
    out.push_str(&body);
    Ok(out)
}

/// Every non-zero `scaleUp.initialDelay` of the prober's targets set to `d`, in the config
/// text (`map`), in `expected` and, where it differs from Gardener's, in `done`. A zero delay
/// (the first level's) stays zero.
fn set_scale_up_delays(
    map: &mut Map<String, Value>,
    done: &mut Vec<Change>,
    expected: &mut ProberConfig,
    d: Duration,
) -> Result<()> {
    let infos = map
        .get_mut("dependentResourceInfos")
        .and_then(Value::as_array_mut)
        .with_context(|| format!("{PROBER_FIXTURE_PATH}: no dependentResourceInfos list"))?;
    for info in infos {
        let name = info["ref"]["name"].as_str().unwrap_or("?").to_string();
        let Some(delay) = info
            .get_mut("scaleUp")
            .and_then(|s| s.get_mut("initialDelay"))
        else {
            continue;
        };
        let gardener_delay = delay
            .as_str()
            .and_then(|s| parse_go_duration(s).ok())
            .with_context(|| {
                format!("{PROBER_FIXTURE_PATH}: {name} scaleUp.initialDelay is no duration")
            })?;
        if gardener_delay.is_zero() {
            continue;
        }
        *delay = Value::String(format_go_duration(d));
        if gardener_delay != d {
            done.push(Change {
                field: format!("{name} scaleUp.initialDelay"),
                gardener: format_go_duration(gardener_delay),
                ours: format_go_duration(d),
            });
        }
        for e in &mut expected.dependent_resource_infos {
            if e.target.name == name {
                e.scale_up.initial_delay = d;
            }
        }
    }
    Ok(())
}

/// Gardener's prober config with `changes` applied.
pub(crate) fn prober(changes: &ProberChanges) -> Result<Derived<ProberConfig>> {
    let path = PROBER_FIXTURE_PATH;
    let (gardener, mut map) = gardeners(PROBER_FIXTURE, path, ProberConfig::from_yaml)?;
    let mut done = Vec::new();
    let mut expected = gardener.clone();
    // `expected` starts as Gardener's: each field holds Gardener's value until it is set.
    let intervals = [
        (
            "probeInterval",
            changes.probe_interval,
            &mut expected.probe_interval,
        ),
        (
            "initialDelay",
            changes.initial_delay,
            &mut expected.initial_delay,
        ),
        (
            "kcmNodeMonitorGraceDuration",
            changes.kcm_node_monitor_grace,
            &mut expected.kcm_node_monitor_grace_duration,
        ),
    ];
    for (key, change, field) in intervals {
        if let Some(d) = change {
            set(&mut map, &mut done, key, durations(*field, d));
            *field = d;
        }
    }
    if let Some(j) = changes.backoff_jitter_factor {
        let g = gardener.backoff_jitter_factor.to_string();
        let value = serde_json::Number::from_f64(j)
            .map(Value::Number)
            .with_context(|| format!("backoffJitterFactor {j} is not a number"))?;
        set(
            &mut map,
            &mut done,
            "backoffJitterFactor",
            (g, j.to_string(), value),
        );
        expected.backoff_jitter_factor = j;
    }
    if let Some(d) = changes.scale_up_delay {
        set_scale_up_delays(&mut map, &mut done, &mut expected, d)?;
    }
    derive(
        "prober",
        path,
        ProberConfig::from_yaml,
        gardener,
        expected,
        map,
        done,
    )
}

/// `derived` with zonal protection switched on for `targets` (`scaleDownOnZoneOutage: true`,
/// ours: Gardener's config has no zonal fields, so nothing of Gardener's changes); the other
/// zonal fields keep their defaults. Checked with the watchdog's loader like the intervals:
/// the result differs from `derived` in exactly these flags.
pub(crate) fn with_zonal_protection(
    derived: Derived<ProberConfig>,
    targets: &[&str],
) -> Result<Derived<ProberConfig>> {
    let path = PROBER_FIXTURE_PATH;
    let mut map = mapping(&derived.yaml, "the derived prober config")?;
    let infos = map
        .get_mut("dependentResourceInfos")
        .and_then(Value::as_array_mut)
        .with_context(|| format!("{path}: no dependentResourceInfos list"))?;
    let mut expected = derived.config.clone();
    let mut additions = derived.additions.clone();
    for target in targets {
        let info = infos
            .iter_mut()
            .find(|i| i["ref"]["name"].as_str() == Some(target))
            .with_context(|| {
                format!("{path}: no dependentResourceInfos entry for {target}, cannot add scaleDownOnZoneOutage")
            })?;
        let entry = info.as_object_mut().with_context(|| {
            format!("{path}: the dependentResourceInfos entry of {target} is not a mapping")
        })?;
        ensure!(
            !entry.contains_key("scaleDownOnZoneOutage"),
            "{path}: {target} already sets scaleDownOnZoneOutage; nothing to add"
        );
        entry.insert("scaleDownOnZoneOutage".into(), Value::Bool(true));
        for e in &mut expected.dependent_resource_infos {
            if e.target.name == *target {
                e.scale_down_on_zone_outage = true;
            }
        }
        additions.push(Change {
            field: format!("{target} scaleDownOnZoneOutage"),
            gardener: "false (default)".into(),
            ours: "true".into(),
        });
    }
    let body = serde_saphyr::to_string(&Value::Object(map))
        .map_err(|e| anyhow!("write the prober config: {e}"))?;
    // The header as it was (Gardener's origin, the intervals), then what was added.
    let mut yaml: String = derived
        .yaml
        .lines()
        .take_while(|l| l.starts_with('#'))
        .map(|l| format!("{l}\n"))
        .collect();
    yaml.push_str("# and with these fields of ours added (zonal protection; Gardener's config has no zonal fields):\n");
    for a in &additions {
        yaml.push_str(&format!("#   {a}\n"));
    }
    yaml.push_str(&body);
    let loaded = ProberConfig::from_yaml(&yaml).map_err(|e| anyhow!("the derived config: {e}"))?;
    ensure!(
        loaded.warnings.is_empty(),
        "the derived prober config warns: {:?}",
        loaded.warnings
    );
    ensure!(
        loaded.config == expected,
        "the derived prober config differs beyond {} and {}:\n{yaml}",
        changes_text(&derived.changes),
        changes_text(&additions)
    );
    Ok(Derived {
        gardener: derived.gardener,
        config: loaded.config,
        yaml,
        changes: derived.changes,
        additions,
    })
}

/// Gardener's weeder config, `watchDuration` replaced when given.
pub(crate) fn weeder(watch_duration: Option<Duration>) -> Result<Derived<WeederConfig>> {
    let path = WEEDER_FIXTURE_PATH;
    let (gardener, mut map) = gardeners(WEEDER_FIXTURE, path, WeederConfig::from_yaml)?;
    let mut done = Vec::new();
    let mut expected = gardener.clone();
    if let Some(d) = watch_duration {
        let values = durations(gardener.watch_duration, d);
        set(&mut map, &mut done, "watchDuration", values);
        expected.watch_duration = d;
    }
    derive(
        "weeder",
        path,
        WeederConfig::from_yaml,
        gardener,
        expected,
        map,
        done,
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn level(c: &ProberConfig, name: &str) -> (u32, u32, Duration, bool) {
        let i = c
            .dependent_resource_infos
            .iter()
            .find(|i| i.target.name == name)
            .expect("target in the config");
        (
            i.scale_down.level,
            i.scale_up.level,
            i.scale_up.initial_delay,
            i.optional,
        )
    }

    #[test]
    fn gardeners_prober_config_as_the_fixture_has_it() {
        let d = prober(&ProberChanges::default()).expect("derive");
        assert!(d.changes.is_empty());
        assert_eq!(d.config, d.gardener);
        let c = &d.gardener;
        assert_eq!(c.probe_interval, Duration::from_secs(30));
        assert_eq!(c.initial_delay, Duration::from_secs(30));
        assert_eq!(c.kcm_node_monitor_grace_duration, Duration::from_secs(40));
        assert_eq!(c.node_lease_failure_fraction, 0.6);
        assert_eq!(
            c.kube_config_secret_name,
            "shoot-access-dependency-watchdog-probe"
        );
        let zero = Duration::ZERO;
        assert_eq!(level(c, "kube-controller-manager"), (1, 0, zero, false));
        assert_eq!(
            level(c, "machine-controller-manager"),
            (0, 1, Duration::from_secs(30), false)
        );
        assert_eq!(level(c, "cluster-autoscaler"), (0, 2, zero, true));
    }

    #[test]
    fn only_the_intervals_asked_for_change() {
        let d = prober(&ProberChanges {
            probe_interval: Some(Duration::from_secs(1)),
            initial_delay: Some(Duration::from_secs(2)),
            kcm_node_monitor_grace: Some(Duration::from_secs(8)),
            backoff_jitter_factor: None,
            scale_up_delay: Some(Duration::from_secs(5)),
        })
        .expect("derive");
        let c = &d.config;
        assert_eq!(c.probe_interval, Duration::from_secs(1));
        assert_eq!(c.initial_delay, Duration::from_secs(2));
        assert_eq!(c.kcm_node_monitor_grace_duration, Duration::from_secs(8));
        assert_eq!(
            level(c, "machine-controller-manager"),
            (0, 1, Duration::from_secs(5), false)
        );
        assert_eq!(c.probe_timeout, d.gardener.probe_timeout);
        let text: Vec<String> = d.changes.iter().map(Change::to_string).collect();
        assert_eq!(
            text,
            [
                "probeInterval 30s → 1s",
                "initialDelay 30s (default) → 2s",
                "kcmNodeMonitorGraceDuration 40s (default) → 8s",
                "machine-controller-manager scaleUp.initialDelay 30s → 5s",
            ]
        );
        for t in &text {
            assert!(d.yaml.contains(&format!("#   {t}\n")), "{}", d.yaml);
        }
    }

    #[test]
    fn gardeners_own_values_leave_the_text_as_gardenlet_wrote_it() {
        let d = prober(&ProberChanges {
            probe_interval: Some(Duration::from_secs(30)),
            initial_delay: Some(Duration::from_secs(30)),
            kcm_node_monitor_grace: Some(Duration::from_secs(40)),
            backoff_jitter_factor: Some(0.2),
            scale_up_delay: Some(Duration::from_secs(30)),
        })
        .expect("derive");
        assert!(d.changes.is_empty());
        for defaulted in [
            "initialDelay: ",
            "kcmNodeMonitorGraceDuration",
            "backoffJitterFactor",
        ] {
            assert!(
                !d.yaml.lines().any(|l| l.starts_with(defaulted)),
                "{defaulted} written:\n{}",
                d.yaml
            );
        }
    }

    #[test]
    fn zonal_protection_is_added_without_touching_gardeners_fields() {
        let d = prober(&ProberChanges {
            probe_interval: Some(Duration::from_secs(1)),
            ..ProberChanges::default()
        })
        .expect("derive");
        let z = with_zonal_protection(
            d.clone(),
            &["machine-controller-manager", "cluster-autoscaler"],
        )
        .expect("zonal");
        assert_eq!(z.changes, d.changes);
        assert_eq!(
            changes_text(&z.additions),
            "machine-controller-manager scaleDownOnZoneOutage false (default) → true, \
             cluster-autoscaler scaleDownOnZoneOutage false (default) → true"
        );
        let rule = z.config.zone_rule();
        assert!(rule.protection);
        assert_eq!(rule.failure_fraction, z.config.node_lease_failure_fraction);
        let zonal: Vec<&str> = z
            .config
            .dependent_resource_infos
            .iter()
            .filter(|i| i.scale_down_on_zone_outage)
            .map(|i| i.target.name.as_str())
            .collect();
        assert_eq!(zonal, ["machine-controller-manager", "cluster-autoscaler"]);
        assert!(
            z.yaml.contains("#   probeInterval 30s → 1s\n"),
            "{}",
            z.yaml
        );
        assert!(
            z.yaml
                .contains("#   cluster-autoscaler scaleDownOnZoneOutage false (default) → true\n"),
            "{}",
            z.yaml
        );
        assert!(with_zonal_protection(d, &["no-such-target"]).is_err());
    }

    #[test]
    fn gardeners_weeder_config_with_a_shorter_watch() {
        let d = weeder(Some(Duration::from_secs(15))).expect("derive");
        assert_eq!(d.gardener.watch_duration, Duration::from_secs(300));
        assert_eq!(d.config.watch_duration, Duration::from_secs(15));
        assert_eq!(
            d.config.services_and_dependant_selectors,
            d.gardener.services_and_dependant_selectors
        );
        let services: Vec<&str> = d
            .config
            .services_and_dependant_selectors
            .keys()
            .map(String::as_str)
            .collect();
        assert_eq!(services, ["etcd-main-client", "kube-apiserver"]);
        assert_eq!(changes_text(&d.changes), "watchDuration 5m0s → 15s");
    }
}
