//! `dependency-watchdog explain`: evaluates one shoot now, with the prober's own decision
//! functions, and prints the values a run produces — the finding (`dwd_core::evaluate_leases`
//! after `probe_lifecycle`), its verdict, and the intent (`dwd_core::intent`) — without
//! changing anything.
//!
//! It answers the operator's question "why did (or didn't) the watchdog scale this shoot?":
//! whether a probe runs for it, whether its API server answers, each node's verdict with its
//! lease age, the expired fraction against the threshold, the decision, and the flow of
//! levels and targets that decision would run.

pub mod replay;

use std::collections::BTreeMap;
use std::time::Duration;

use chrono::Utc;
use dwd_core::intent::{Seen, intent};
use dwd_core::lease::LeaseReport;
use dwd_core::record::ZoneRecord;
use dwd_core::scaling::FlowScope;
use dwd_core::verdict::{Streak, VerdictMemory};
use dwd_core::zone::ZoneRule;
use dwd_core::{
    DependentResourceInfo, Direction, EffectiveProbeSettings, Hysteresis, ProbeLifecycle,
    ProberConfig, ShootView, Verdict, evaluate_leases, probe_lifecycle,
};
use k8s_openapi::api::core::v1::Secret;
use kube::api::{ApiResource, DynamicObject};
use kube::{Api, Client};
use serde::Serialize;

use crate::gardener::cluster_gvk;
use crate::prober::view::{self, KUBECONFIG_KEY, is_not_served};
use crate::{Error, Result};

/// Everything `explain` found, in the order the prober evaluates it.
#[derive(Debug, Serialize)]
pub struct Explanation {
    /// Shoot namespace.
    pub namespace: String,
    /// Whether the prober runs a probe for this shoot, and why (not).
    pub probe: String,
    /// API server probe: `Ok(version)` or the error.
    pub api_server_probe: Step,
    /// Lease probe (absent when the API server probe failed).
    pub lease_probe: Option<LeaseSummary>,
    /// How the hysteresis (`successThreshold`/`failureThreshold`) counts the decision, in
    /// words (absent when the lease probe did not run or decided not to scale).
    pub hysteresis: Option<String>,
    /// The flow the decision would run (empty when no scaling).
    pub flow: Vec<FlowLevel>,
    /// When the targets were seen: `None` now; a replayed record's time.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub seen_at: Option<String>,
}

/// Outcome of one probe step.
#[derive(Debug, Serialize)]
pub struct Step {
    /// Whether it succeeded.
    pub ok: bool,
    /// What it returned or why it failed.
    pub detail: String,
}

/// The lease probe's findings.
#[derive(Debug, Serialize)]
pub struct LeaseSummary {
    /// One line per node.
    pub nodes: Vec<NodeLine>,
    /// Leases that belong to no node (ignored).
    pub orphan_leases: Vec<String>,
    /// Candidate leases.
    pub candidates: usize,
    /// Expired candidate leases.
    pub expired: usize,
    /// `expired / candidates`.
    pub fraction: Option<f64>,
    /// `nodeLeaseFailureFraction`.
    pub threshold: f64,
    /// The grace period used (`kcmNodeMonitorGraceDuration` or the shoot's override), seconds.
    pub grace_seconds: f64,
    /// The candidates by zone (node label `topology.kubernetes.io/zone`), sorted by name.
    pub zones: Vec<ZoneRecord>,
    /// `zoneLeaseFailureFraction`.
    pub zone_threshold: f64,
    /// `minCandidatesPerZone`.
    pub min_candidates_per_zone: usize,
    /// Whether zonal protection is configured (some target has `scaleDownOnZoneOutage`).
    pub zonal_protection: bool,
    /// The decision, in words.
    pub decision: String,
    /// The report's one-line summary (as the prober logs it).
    pub summary: String,
    /// Nodes and orphan leases a replayed decision record does not name (always 0 live).
    #[serde(skip_serializing_if = "is_zero")]
    pub not_named: usize,
}

fn is_zero(n: &usize) -> bool {
    *n == 0
}

/// A node's verdict.
#[derive(Debug, Serialize)]
pub struct NodeLine {
    /// Node name.
    pub node: String,
    /// Its zone, if labelled.
    pub zone: Option<String>,
    /// Whether it votes.
    pub candidate: bool,
    /// For candidates: whether its lease is expired.
    pub expired: Option<bool>,
    /// Seconds since the lease was renewed.
    pub(crate) lease_age_seconds: Option<f64>,
    /// Seconds until (positive) or since (negative) the lease counts as expired.
    pub(crate) expires_in_seconds: Option<f64>,
    /// The verdict in words (or why the node is excluded).
    pub verdict: String,
}

/// One level of the flow.
#[derive(Debug, Serialize)]
pub struct FlowLevel {
    /// Level number.
    pub level: u32,
    /// Targets, run concurrently.
    pub targets: Vec<FlowTarget>,
}

/// What the flow would do to one target.
#[derive(Debug, Serialize)]
pub struct FlowTarget {
    /// `kind/name`.
    pub target: String,
    /// The action, in words.
    pub action: String,
}

fn kube_err(action: String) -> impl FnOnce(kube::Error) -> Error {
    move |e| Error::kube(action, e)
}

/// Evaluates shoot `namespace` now. Only reads.
pub async fn explain(seed: &Client, config: &ProberConfig, namespace: &str) -> Result<Explanation> {
    let (probe, settings) = probe_of(seed, config, namespace).await?;
    let mut out = Explanation {
        namespace: namespace.to_string(),
        probe,
        api_server_probe: Step {
            ok: false,
            detail: String::new(),
        },
        lease_probe: None,
        hysteresis: None,
        flow: Vec::new(),
        seen_at: None,
    };
    let Some(settings) = settings else {
        out.api_server_probe.detail = "skipped: no probe runs for this shoot".into();
        return Ok(out);
    };
    let shoot = match shoot_client(seed, config, namespace).await {
        Ok(client) => client,
        Err(detail) => {
            out.api_server_probe.detail = detail;
            return Ok(out);
        }
    };
    out.api_server_probe = api_server_probe(&shoot, config).await;
    if !out.api_server_probe.ok {
        return Ok(out);
    }
    let shoot = Shoot {
        client: &shoot,
        namespace,
        settings: &settings,
    };
    let report = lease_probe(seed, config, &shoot, &mut out).await?;
    // The verdict as a probe's first run on this finding would reach it: explain keeps no
    // streak, so it says how many such runs in a row the hysteresis needs.
    let fresh = VerdictMemory {
        hysteresis: Hysteresis::from_config(config),
        disrupted_zones: Default::default(),
    };
    let (verdict, _) = dwd_core::verdict::verdict(&report, &fresh);
    if let (Some(flow), Streak::Counted { needed, .. }) = (verdict.asked, verdict.streak) {
        out.hysteresis = Some(hysteresis_line(flow.dir, needed));
        out.flow = explain_flow(seed, config, namespace, flow.dir, flow.scope).await?;
    }
    Ok(out)
}

/// Whether the prober runs a probe for the shoot of `namespace` (its Cluster read now), in
/// words, and with which settings.
async fn probe_of(
    seed: &Client,
    config: &ProberConfig,
    namespace: &str,
) -> Result<(String, Option<EffectiveProbeSettings>)> {
    let clusters: Api<DynamicObject> =
        Api::all_with(seed.clone(), &ApiResource::from_gvk(&cluster_gvk()));
    let cluster = clusters
        .get_opt(namespace)
        .await
        .map_err(kube_err(format!("reading Cluster {namespace}")))?;
    let view = match &cluster {
        None => None,
        Some(c) => {
            let spec = c
                .data
                .get("spec")
                .cloned()
                .unwrap_or(serde_json::Value::Null);
            Some(
                ShootView::from_cluster_spec(&spec)
                    .map_err(|e| Error::Scaling(format!("Cluster {namespace}: {e}")))?,
            )
        }
    };
    Ok(match probe_lifecycle(view.as_ref(), config) {
        ProbeLifecycle::Run(settings) => (
            format!(
                "runs (grace period {:?}, pools {:?})",
                settings.node_monitor_grace, settings.pool_conditions
            ),
            Some(settings),
        ),
        ProbeLifecycle::Remove(reason) => (format!("none: {reason}"), None),
        ProbeLifecycle::NotYet(reason) => (format!("not started yet: {reason}"), None),
    })
}

/// The API-server probe (`GET /version` within `probeTimeout`).
async fn api_server_probe(shoot: &Client, config: &ProberConfig) -> Step {
    let detail = match tokio::time::timeout(config.probe_timeout, shoot.apiserver_version()).await {
        Ok(Ok(v)) => {
            return Step {
                ok: true,
                detail: format!("reachable, {}", v.git_version),
            };
        }
        Ok(Err(e)) => format!("GET /version failed: {e}; no lease probe, no scaling"),
        Err(_) => format!(
            "GET /version timed out after {:?}; no lease probe, no scaling",
            config.probe_timeout
        ),
    };
    Step { ok: false, detail }
}

/// The shoot a lease probe reads.
struct Shoot<'a> {
    client: &'a Client,
    namespace: &'a str,
    settings: &'a EffectiveProbeSettings,
}

/// The lease probe, read as the probe reads (consistent, paginated, bounded): its finding,
/// summarised into `out`.
async fn lease_probe(
    seed: &Client,
    config: &ProberConfig,
    shoot: &Shoot<'_>,
    out: &mut Explanation,
) -> Result<LeaseReport> {
    let timeout = config.probe_timeout;
    let nodes = list_with_timeout(view::shoot_nodes(shoot.client), timeout, "listing nodes");
    let nodes = nodes.await?;
    let leases = view::shoot_node_leases(shoot.client);
    let leases = list_with_timeout(leases, timeout, "listing node leases").await?;
    let namespace = shoot.namespace;
    let machines = view::seed_machines(seed, namespace)
        .await
        .map_err(kube_err(format!("listing Machines in {namespace}")))?;
    let now = Utc::now();
    let zone_rule = config.zone_rule();
    let report = evaluate_leases(
        &nodes,
        &machines,
        &leases,
        shoot.settings,
        config.node_lease_failure_fraction,
        &zone_rule,
        now,
    );
    let grace = shoot.settings.node_monitor_grace;
    out.lease_probe = Some(summarize(&report, &zone_rule, grace, now));
    Ok(report)
}

/// How the hysteresis counts a decision in `dir` that needs `needed` runs in a row.
pub(crate) fn hysteresis_line(dir: Direction, needed: u32) -> String {
    let setting = match dir {
        Direction::Down => "failureThreshold",
        Direction::Up => "successThreshold",
    };
    if needed <= 1 {
        return format!("{setting} {needed}: the prober acts on every run that decides {dir}");
    }
    format!(
        "{setting} {needed}: the prober acts once {needed} runs in a row decide {dir}; this finding counts as one of them"
    )
}

async fn list_with_timeout<T>(
    fut: impl std::future::Future<Output = kube::Result<Vec<T>>>,
    timeout: Duration,
    what: &str,
) -> Result<Vec<T>> {
    match tokio::time::timeout(timeout, fut).await {
        Ok(Ok(items)) => Ok(items),
        // Already bounded as the prober bounds a shoot's messages (`view`).
        Ok(Err(e)) => Err(Error::kube(format!("shoot: {what}"), e)),
        Err(_) => Err(Error::Timeout {
            action: format!("shoot: {what}"),
            timeout,
        }),
    }
}

/// The shoot client the prober would build, or why it can't.
async fn shoot_client(
    seed: &Client,
    config: &ProberConfig,
    namespace: &str,
) -> Result<Client, String> {
    let secret_name = &config.kube_config_secret_name;
    let secret = Api::<Secret>::namespaced(seed.clone(), namespace)
        .get_opt(secret_name)
        .await
        .map_err(|e| format!("reading secret {namespace}/{secret_name}: {e}"))?
        .ok_or_else(|| format!("secret {namespace}/{secret_name} not found; no probe can run"))?;
    let bytes = secret
        .data
        .as_ref()
        .and_then(|d| d.get(KUBECONFIG_KEY))
        .ok_or_else(|| format!("secret {namespace}/{secret_name} has no key {KUBECONFIG_KEY:?}"))?;
    let text = std::str::from_utf8(&bytes.0)
        .map_err(|_| format!("secret {namespace}/{secret_name}: kubeconfig is not UTF-8"))?;
    crate::client::kube_client::shoot_client(text, config.probe_timeout)
        .await
        .map_err(|e| format!("secret {namespace}/{secret_name}: {e}"))
}

pub(crate) fn summarize(
    report: &LeaseReport,
    zone_rule: &ZoneRule,
    grace: Duration,
    now: chrono::DateTime<Utc>,
) -> LeaseSummary {
    let secs = |d: chrono::TimeDelta| d.num_milliseconds() as f64 / 1000.0;
    let nodes = report
        .nodes
        .iter()
        .map(|n| {
            let (candidate, expired, age, expires_in) = match &n.verdict {
                Verdict::Candidate {
                    renew_time,
                    expires_at,
                    expired,
                } => (
                    true,
                    Some(*expired),
                    renew_time.map(|t| secs(now - t)),
                    expires_at.map(|t| secs(t - now)),
                ),
                Verdict::Excluded(_) => (false, None, None, None),
            };
            NodeLine {
                node: n.node.clone(),
                zone: n.zone.clone(),
                candidate,
                expired,
                lease_age_seconds: age,
                expires_in_seconds: expires_in,
                verdict: n.verdict.to_string(),
            }
        })
        .collect();
    LeaseSummary {
        nodes,
        orphan_leases: report.orphan_leases.clone(),
        candidates: report.candidates,
        expired: report.expired,
        fraction: report.fraction,
        threshold: report.threshold,
        grace_seconds: grace.as_secs_f64(),
        zones: report.zones.iter().map(ZoneRecord::of).collect(),
        zone_threshold: zone_rule.failure_fraction,
        min_candidates_per_zone: zone_rule.min_candidates,
        zonal_protection: zone_rule.protection,
        decision: report.decision.to_string(),
        summary: report.to_string(),
        not_named: 0,
    }
}

/// The flow in `dir` over `scope` as the prober's own intent ([`dwd_core::intent`]) judges
/// it from what the seed shows now: each target of the scope is read first, then the intent
/// orders and judges them (`explain` adds no sequencing of its own).
async fn explain_flow(
    seed: &Client,
    config: &ProberConfig,
    namespace: &str,
    dir: Direction,
    scope: FlowScope,
) -> Result<Vec<FlowLevel>> {
    let infos = &config.dependent_resource_infos;
    let mut seen = BTreeMap::new();
    for info in infos.iter().filter(|i| scope.includes(i)) {
        seen.insert(
            info.target.clone(),
            seen_in_seed(seed, namespace, info).await,
        );
    }
    let intent = intent(infos, dir, scope, |info| {
        seen.remove(&info.target)
            .unwrap_or_else(|| Seen::Unknown("not read".into()))
    });
    Ok(flow_levels(&intent))
}

/// The levels of `intent`, each target's step in words.
pub(crate) fn flow_levels(intent: &dwd_core::intent::Intent) -> Vec<FlowLevel> {
    intent
        .levels
        .iter()
        .map(|level| FlowLevel {
            level: level.level,
            targets: level
                .targets
                .iter()
                .map(|t| FlowTarget {
                    target: format!("{}/{}", t.info.target.kind, t.info.target.name),
                    action: t.to_string(),
                })
                .collect(),
        })
        .collect()
}

/// Target `info` of shoot `namespace` as the seed shows it now.
async fn seen_in_seed(seed: &Client, namespace: &str, info: &DependentResourceInfo) -> Seen {
    let r = &info.target;
    let resource = match view::target_resource(seed, info).await {
        Err(e) if is_not_served(&e) => return Seen::NotServed,
        Err(e) => {
            return Seen::Unknown(format!("cannot resolve {}/{}: {e}", r.api_version, r.kind));
        }
        Ok(resource) => resource,
    };
    let api: Api<DynamicObject> = Api::namespaced_with(seed.clone(), namespace, &resource);
    match api.get_opt(&r.name).await {
        Err(e) => Seen::Unknown(format!("cannot read it: {e}")),
        Ok(None) => Seen::Absent,
        Ok(Some(obj)) => match view::target_snapshot(&obj) {
            Some(snapshot) => Seen::Present(snapshot),
            None => Seen::Unknown("unreadable target".into()),
        },
    }
}

impl LeaseSummary {
    /// The zones section of the text output (nothing when no node is in a zone).
    fn write_zones(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        if self.zones.is_empty() {
            return Ok(());
        }
        let protection = if self.zonal_protection {
            "zonal protection on"
        } else {
            "zonal protection not configured: reported only"
        };
        writeln!(
            f,
            "  zones (disrupted at {:.2} with at least {} candidates; {protection}):",
            self.zone_threshold, self.min_candidates_per_zone
        )?;
        for z in &self.zones {
            let state = if z.disrupted {
                "DISRUPTED"
            } else if z.too_small {
                "too few candidates to judge"
            } else {
                "ok"
            };
            writeln!(
                f,
                "    {:<24} {}/{} expired, fraction {:.2}: {state}",
                z.zone, z.expired, z.candidates, z.fraction
            )?;
        }
        Ok(())
    }
}

impl std::fmt::Display for Explanation {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        writeln!(f, "shoot {}", self.namespace)?;
        writeln!(f, "  probe:            {}", self.probe)?;
        let mark = if self.api_server_probe.ok {
            "ok"
        } else {
            "FAILED"
        };
        writeln!(
            f,
            "  API server probe: {mark}: {}",
            self.api_server_probe.detail
        )?;
        let Some(lp) = &self.lease_probe else {
            return Ok(());
        };
        writeln!(
            f,
            "  lease probe (grace {}s, expiry at 0.75 × grace):",
            lp.grace_seconds
        )?;
        for n in &lp.nodes {
            let age = n
                .lease_age_seconds
                .map(|a| format!(" (age {a:.1}s)"))
                .unwrap_or_default();
            let zone = n
                .zone
                .as_deref()
                .map(|z| format!(" [zone {z}]"))
                .unwrap_or_default();
            writeln!(f, "    {:<24} {}{}{}", n.node, n.verdict, age, zone)?;
        }
        for o in &lp.orphan_leases {
            writeln!(f, "    {o:<24} lease without a node: ignored")?;
        }
        if lp.not_named > 0 {
            writeln!(
                f,
                "    … {} more nodes and orphan leases, counted but not named in the decision record",
                lp.not_named
            )?;
        }
        let fraction = lp
            .fraction
            .map(|x| format!("{x:.2}"))
            .unwrap_or_else(|| "-".into());
        writeln!(
            f,
            "  candidates {}, expired {}, fraction {} vs threshold {:.2}",
            lp.candidates, lp.expired, fraction, lp.threshold
        )?;
        lp.write_zones(f)?;
        writeln!(f, "  verdict:          {}", lp.summary)?;
        if let Some(hysteresis) = &self.hysteresis {
            writeln!(f, "  hysteresis:       {hysteresis}")?;
        }
        if !self.flow.is_empty() {
            let when = match &self.seen_at {
                None => "shows it now".to_owned(),
                Some(at) => format!("showed it at {at}"),
            };
            writeln!(
                f,
                "  intent (levels in the flow's order, each target as the seed {when}):"
            )?;
            for level in &self.flow {
                for t in &level.targets {
                    writeln!(
                        f,
                        "    level {}  {:<40} {}",
                        level.level, t.target, t.action
                    )?;
                }
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_hysteresis_line_says_how_many_runs_in_a_row_act() {
        assert_eq!(
            hysteresis_line(Direction::Down, 1),
            "failureThreshold 1: the prober acts on every run that decides scale down"
        );
        assert_eq!(
            hysteresis_line(Direction::Up, 3),
            "successThreshold 3: the prober acts once 3 runs in a row decide scale up; \
             this finding counts as one of them"
        );
    }
}
