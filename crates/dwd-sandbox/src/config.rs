//! What the sandbox runs: Gardener's prober and weeder configs (`deploy/gardener/`) with only
//! their intervals shortened, so a story of one minute shows what a seed does in ten.
//!
//! Everything the sandbox narrates about the configuration (levels, delays, threshold, grace,
//! intervals) is read from the derived configs here, never written down a second time.

use std::collections::BTreeMap;
use std::time::Duration;

use anyhow::{Result, ensure};
use dwd_core::{PodSelector, ProberConfig, WeederConfig, format_go_duration};

use crate::gardener::{self, Change, Derived, ProberChanges};

/// `probeInterval` (Gardener: 30 s): the prober looks every second.
const PROBE_INTERVAL: Duration = Duration::from_secs(1);
/// `initialDelay` (Gardener: default 30 s): the first probe soon after a shoot is seen.
const INITIAL_DELAY: Duration = Duration::from_secs(2);
/// `kcmNodeMonitorGraceDuration` (Gardener: default 40 s): a lease expires 0.75 × 8 = 6 s
/// after its last renewal, well above the simulated kubelets' 1 s renewals.
const KCM_GRACE: Duration = Duration::from_secs(8);
/// MCM's `scaleUp.initialDelay` (Gardener: 30 s): long enough to see on the chart that MCM
/// waits after KCM is back, short enough for the story.
const SCALE_UP_DELAY: Duration = Duration::from_secs(5);
/// `watchDuration` (Gardener: 5m0s): the weeders started at setup must end before the
/// story's etcd outage, or they would delete the crash-looping pods while etcd is still down.
const WATCH_DURATION: Duration = Duration::from_secs(15);

/// The targets the sandbox switches zonal protection on for (`scaleDownOnZoneOutage: true`,
/// ours: Gardener's config has no zonal fields). KCM stays off: a zone's outage is the
/// replacement of its machines (MCM) and scale-ups into it (CA), not the evictions KCM would
/// make everywhere.
pub(crate) const ZONAL_TARGETS: [&str; 2] = ["machine-controller-manager", "cluster-autoscaler"];

/// Labels of the simulated kube-apiserver pods, as Gardener labels them.
pub(crate) const KUBE_APISERVER_LABELS: [(&str, &str); 3] = [
    ("app", "kubernetes"),
    ("role", "apiserver"),
    ("gardener.cloud/role", "controlplane"),
];
/// Labels of the simulated kube-scheduler pod, as Gardener labels it: a control-plane pod that
/// needs the kube-apiserver (and that the prober never scales, unlike KCM).
pub(crate) const KUBE_SCHEDULER_LABELS: [(&str, &str); 3] = [
    ("app", "kubernetes"),
    ("role", "scheduler"),
    ("gardener.cloud/role", "controlplane"),
];
/// The weeder's service for etcd.
pub(crate) const ETCD_SERVICE: &str = "etcd-main-client";
/// The weeder's service for the kube-apiserver.
pub(crate) const KUBE_APISERVER_SERVICE: &str = "kube-apiserver";

/// One scalable controller as the prober config has it.
#[derive(Debug, Clone)]
pub(crate) struct Controller {
    /// Deployment name.
    pub name: String,
    /// `KCM`, `MCM`, `CA`.
    pub short: String,
    /// Scale-down level.
    pub down: u32,
    /// Scale-up level.
    pub up: u32,
    /// Scale-up `initialDelay` (ours).
    pub up_delay: Duration,
    /// Scale-up `initialDelay` in Gardener's config.
    pub gardener_up_delay: Duration,
    /// `optional`.
    pub optional: bool,
    /// `scaleDownOnZoneOutage` (ours).
    pub zonal: bool,
}

/// The configs the sandbox runs and what it says about them.
#[derive(Debug, Clone)]
pub(crate) struct SandboxConfig {
    /// The prober's.
    pub prober: Derived<ProberConfig>,
    /// The weeder's.
    pub weeder: Derived<WeederConfig>,
    /// The simulated controllers, in the config's order.
    pub controllers: Vec<Controller>,
}

/// Short names for the terminal and the charts.
fn short_name(controller: &str) -> &str {
    match controller {
        "kube-controller-manager" => "KCM",
        "machine-controller-manager" => "MCM",
        "cluster-autoscaler" => "CA",
        other => other,
    }
}

fn labels(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
    pairs
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}

impl SandboxConfig {
    /// Gardener's configs with the sandbox's intervals; fails when the fixtures no longer fit
    /// what the sandbox simulates (a target it lacks, pods the weeder would not pick).
    pub(crate) fn derive() -> Result<SandboxConfig> {
        let prober = gardener::prober(&ProberChanges {
            probe_interval: Some(PROBE_INTERVAL),
            initial_delay: Some(INITIAL_DELAY),
            kcm_node_monitor_grace: Some(KCM_GRACE),
            backoff_jitter_factor: None,
            scale_up_delay: Some(SCALE_UP_DELAY),
        })?;
        let prober = gardener::with_zonal_protection(prober, &ZONAL_TARGETS)?;
        let weeder = gardener::weeder(Some(WATCH_DURATION))?;
        let mut controllers = Vec::new();
        for (info, gardener_info) in prober
            .config
            .dependent_resource_infos
            .iter()
            .zip(&prober.gardener.dependent_resource_infos)
        {
            let name = &info.target.name;
            ensure!(
                dwd_sim::seed::DEFAULT_DEPLOYMENTS
                    .iter()
                    .any(|(d, _)| d == name),
                "Gardener's prober config scales {name}, which the sandbox does not simulate"
            );
            controllers.push(Controller {
                name: name.clone(),
                short: short_name(name).to_string(),
                down: info.scale_down.level,
                up: info.scale_up.level,
                up_delay: info.scale_up.initial_delay,
                gardener_up_delay: gardener_info.scale_up.initial_delay,
                optional: info.optional,
                zonal: info.scale_down_on_zone_outage,
            });
        }
        let config = SandboxConfig {
            prober,
            weeder,
            controllers,
        };
        // The story's cascade needs Gardener's selectors to pick exactly these pods.
        let picks = |service: &str, pod: &[(&str, &str)]| {
            config
                .selectors(service)
                .iter()
                .any(|s| s.matches(&labels(pod)))
        };
        ensure!(
            picks(ETCD_SERVICE, &KUBE_APISERVER_LABELS)
                && !picks(ETCD_SERVICE, &KUBE_SCHEDULER_LABELS),
            "Gardener's weeder config no longer restarts kube-apiserver pods (only) when {ETCD_SERVICE} is back"
        );
        ensure!(
            picks(KUBE_APISERVER_SERVICE, &KUBE_SCHEDULER_LABELS)
                && !picks(KUBE_APISERVER_SERVICE, &KUBE_APISERVER_LABELS),
            "Gardener's weeder config no longer restarts kube-scheduler (and not kube-apiserver) pods when {KUBE_APISERVER_SERVICE} is back"
        );
        Ok(config)
    }

    /// The pod selectors of a weeder service (none when the service is not configured).
    pub(crate) fn selectors(&self, service: &str) -> &[PodSelector] {
        self.weeder
            .config
            .services_and_dependant_selectors
            .get(service)
            .map_or(&[], |d| d.pod_selectors.as_slice())
    }

    /// `nodeLeaseFailureFraction`.
    pub(crate) fn threshold(&self) -> f64 {
        self.prober.config.node_lease_failure_fraction
    }

    /// `zoneLeaseFailureFraction` (ours; defaults to `nodeLeaseFailureFraction`).
    pub(crate) fn zone_threshold(&self) -> f64 {
        self.prober.config.zone_lease_failure_fraction
    }

    /// `minCandidatesPerZone` (ours).
    pub(crate) fn min_candidates_per_zone(&self) -> u32 {
        self.prober.config.min_candidates_per_zone
    }

    /// The zonal scale-down: only the `scaleDownOnZoneOutage` targets, in level order, e.g.
    /// `MCM + CA (level 0); KCM not scaled`.
    pub(crate) fn zonal_flow_text(&self) -> String {
        let mut levels: BTreeMap<u32, Vec<&str>> = BTreeMap::new();
        for c in self.controllers.iter().filter(|c| c.zonal) {
            levels.entry(c.down).or_default().push(&c.short);
        }
        let flow = levels
            .iter()
            .map(|(level, names)| format!("{} (level {level})", names.join(" + ")))
            .collect::<Vec<_>>()
            .join(" → ");
        let untouched: Vec<&str> = self
            .controllers
            .iter()
            .filter(|c| !c.zonal)
            .map(|c| c.short.as_str())
            .collect();
        if untouched.is_empty() {
            flow
        } else {
            format!("{flow}; {} not scaled", untouched.join(", "))
        }
    }

    /// Every field added that Gardener's config does not have.
    pub(crate) fn additions(&self) -> &[Change] {
        &self.prober.additions
    }

    /// `kcmNodeMonitorGraceDuration` in seconds.
    pub(crate) fn grace_seconds(&self) -> f64 {
        self.prober
            .config
            .kcm_node_monitor_grace_duration
            .as_secs_f64()
    }

    /// How long after its last renewal a lease counts as expired (0.75 × grace), in seconds.
    pub(crate) fn lease_validity_seconds(&self) -> f64 {
        0.75 * self.grace_seconds()
    }

    /// `probeInterval` as Go prints it.
    pub(crate) fn probe_interval(&self) -> String {
        format_go_duration(self.prober.config.probe_interval)
    }

    /// `watchDuration`.
    pub(crate) fn watch_duration(&self) -> Duration {
        self.weeder.config.watch_duration
    }

    /// The controller named so.
    pub(crate) fn controller(&self, name: &str) -> Option<&Controller> {
        self.controllers.iter().find(|c| c.name == name)
    }

    /// The levels of a flow in order, each with its controllers.
    pub(crate) fn levels(&self, down: bool) -> Vec<(u32, Vec<&Controller>)> {
        let mut levels: BTreeMap<u32, Vec<&Controller>> = BTreeMap::new();
        for c in &self.controllers {
            levels
                .entry(if down { c.down } else { c.up })
                .or_default()
                .push(c);
        }
        levels.into_iter().collect()
    }

    /// `MCM + CA (level 0) → KCM (level 1)`; a scale-up names its delays:
    /// `KCM (level 0) → MCM (level 1, after 5s) → CA (level 2)`.
    pub(crate) fn flow_text(&self, down: bool) -> String {
        self.levels(down)
            .iter()
            .map(|(level, cs)| {
                let names: Vec<&str> = cs.iter().map(|c| c.short.as_str()).collect();
                let delays: Vec<String> = cs
                    .iter()
                    .filter(|c| !down && !c.up_delay.is_zero())
                    .map(|c| format!("after {}", format_go_duration(c.up_delay)))
                    .collect();
                if delays.is_empty() {
                    format!("{} (level {level})", names.join(" + "))
                } else {
                    format!(
                        "{} (level {level}, {})",
                        names.join(" + "),
                        delays.join(", ")
                    )
                }
            })
            .collect::<Vec<_>>()
            .join(" → ")
    }

    /// Every change from Gardener's configs, prober then weeder.
    pub(crate) fn changes(&self) -> Vec<Change> {
        self.prober
            .changes
            .iter()
            .chain(&self.weeder.changes)
            .cloned()
            .collect()
    }

    /// The lines the sandbox prints at start (and the report repeats): whose config, what
    /// was shortened, the flows.
    pub(crate) fn summary_lines(&self) -> Vec<String> {
        vec![
            format!(
                "config: Gardener's, as gardenlet generates it ({} and {}): same targets, levels, delays, threshold and selectors",
                gardener::PROBER_FIXTURE_PATH,
                gardener::WEEDER_FIXTURE_PATH
            ),
            format!(
                "intervals shortened so the story takes a minute (Gardener's → ours): {}",
                gardener::changes_text(&self.changes())
            ),
            format!(
                "zonal protection switched on (added, ours: Gardener's config has no zonal fields): {}; a zone is disrupted when ≥ {:.2} of its node leases expired (zoneLeaseFailureFraction, default nodeLeaseFailureFraction) with ≥ {} candidate nodes (minCandidatesPerZone, default)",
                gardener::changes_text(self.additions()),
                self.zone_threshold(),
                self.min_candidates_per_zone()
            ),
            format!(
                "scale-down {}; scale-up {}; zonal scale-down {}",
                self.flow_text(true),
                self.flow_text(false),
                self.zonal_flow_text()
            ),
        ]
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_sandbox_runs_gardeners_levels_with_short_intervals() {
        let c = SandboxConfig::derive().expect("derive");
        assert_eq!(c.flow_text(true), "MCM + CA (level 0) → KCM (level 1)");
        assert_eq!(
            c.flow_text(false),
            "KCM (level 0) → MCM (level 1, after 5s) → CA (level 2)"
        );
        assert_eq!(c.threshold(), 0.6);
        assert_eq!(c.lease_validity_seconds(), 6.0);
        assert_eq!(c.probe_interval(), "1s");
        let changes = gardener::changes_text(&c.changes());
        assert_eq!(
            changes,
            "probeInterval 30s → 1s, initialDelay 30s (default) → 2s, \
             kcmNodeMonitorGraceDuration 40s (default) → 8s, \
             machine-controller-manager scaleUp.initialDelay 30s → 5s, watchDuration 5m0s → 15s"
        );
        let mcm = c.controller("machine-controller-manager").expect("MCM");
        assert_eq!(mcm.gardener_up_delay, Duration::from_secs(30));
        assert!(
            c.controller("cluster-autoscaler")
                .is_some_and(|ca| ca.optional)
        );
        assert_eq!(c.zonal_flow_text(), "MCM + CA (level 0); KCM not scaled");
        assert_eq!(c.zone_threshold(), 0.6);
        assert_eq!(
            gardener::changes_text(c.additions()),
            "machine-controller-manager scaleDownOnZoneOutage false (default) → true, \
             cluster-autoscaler scaleDownOnZoneOutage false (default) → true"
        );
        assert!(
            c.summary_lines()
                .iter()
                .any(|l| l.starts_with("zonal protection switched on (added"))
        );
        // The configs written for the watchdog say what was changed.
        assert!(c.prober.yaml.contains("#   probeInterval 30s → 1s\n"));
        assert!(c.weeder.yaml.contains("#   watchDuration 5m0s → 15s\n"));
    }
}
