//! The lease probe's verdict (docs/behaviour.md §2.7, §2.8).
//!
//! Given what the API servers returned (nodes, machines, node leases) and the time, decide which
//! nodes may vote, which of their leases expired and whether the control plane should scale down
//! (the nodes lost contact) or up. Keeping this a pure function lets `explain` print exactly the
//! verdicts the prober acts on, and lets every edge (no renew time, single node, exact threshold)
//! be tested without a cluster.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;

use chrono::{DateTime, TimeDelta, Utc};

use crate::shoot::EffectiveProbeSettings;
use crate::zone::{ZoneReport, ZoneRule, judge_zones};

/// Namespace of the kubelets' node leases in the shoot.
pub const NODE_LEASE_NAMESPACE: &str = "kube-node-lease";
/// Nodes with this annotation are not managed by MCM and are not counted.
pub const NOT_MANAGED_BY_MCM_ANNOTATION: &str = "node.machine.sapcloud.io/not-managed-by-mcm";
/// Node label naming the node's worker pool.
pub const WORKER_POOL_LABEL: &str = "worker.gardener.cloud/pool";
/// Condition type set on nodes taking part in an in-place update.
pub const IN_PLACE_UPDATE_CONDITION: &str = "InPlaceUpdate";
/// `InPlaceUpdate` reasons that take a node out of the vote (it is about to go away or broke).
pub const IN_PLACE_UPDATE_EXCLUDING_REASONS: [&str; 2] = ["ReadyForUpdate", "UpdateFailed"];
/// Machine phases whose node must not vote.
pub const EXCLUDED_MACHINE_PHASES: [&str; 2] = ["Failed", "Terminating"];

/// What the probe needs to know about a `Machine` (`machine.sapcloud.io/v1alpha1`), which is not
/// in k8s-openapi.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MachineView {
    /// The Machine's `metadata.name` in the shoot namespace of the seed.
    pub name: String,
    /// The `node` label: the node this machine backs.
    pub node: Option<String>,
    /// `status.currentStatus.phase`.
    pub phase: Option<String>,
}

/// What the lease probe needs to know about a shoot's `v1` Node: what decides whether it votes
/// and in which zone. The prober reads nodes straight into this shape (nothing else of a Node
/// is kept); a Node without a name is never turned into one, as it can't be matched to a lease
/// or a Machine.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NodeView {
    /// `metadata.name`, which is also the name of the node's lease.
    pub name: String,
    /// The node's [`WORKER_POOL_LABEL`]: whose unhealthy conditions apply.
    pub pool: Option<String>,
    /// The node's [`ZONE_LABEL`](crate::zone::ZONE_LABEL).
    pub zone: Option<String>,
    /// Whether the node has the annotation [`NOT_MANAGED_BY_MCM_ANNOTATION`] (any value).
    pub not_managed_by_mcm: bool,
    /// `status.conditions`, in the node's order.
    pub conditions: Vec<ConditionView>,
}

/// One of a node's `status.conditions`, reduced to what the lease probe reads.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConditionView {
    /// `type`, e.g. `DiskPressure` or [`IN_PLACE_UPDATE_CONDITION`].
    pub type_: String,
    /// `status`: `True`, `False` or `Unknown`.
    pub status: String,
    /// `reason`, e.g. `ReadyForUpdate`.
    pub reason: Option<String>,
}

/// What the lease probe needs to know about a `coordination.k8s.io/v1` Lease in
/// [`NODE_LEASE_NAMESPACE`]: whose it is and when it was last renewed. A Lease without a name
/// is never turned into one.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NodeLeaseView {
    /// `metadata.name`: the name of the node that renews it.
    pub name: String,
    /// `spec.renewTime` at microsecond precision (the wire's); `None` when unset or out of
    /// range, and then the lease counts as expired.
    pub renew_time: Option<DateTime<Utc>>,
}

/// Why a node does not vote. As a decision record writes it: tagged by `kind`, snake_case
/// ([`crate::record`]).
#[derive(
    Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize, schemars::JsonSchema,
)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum ExclusionReason {
    /// The node has the annotation [`NOT_MANAGED_BY_MCM_ANNOTATION`].
    NotManagedByMcm,
    /// One of its worker pool's unhealthy condition types is `True` on the node.
    UnhealthyCondition {
        /// The condition type that is `True`, e.g. `ReadonlyFilesystem`.
        condition: String,
    },
    /// No Machine has the label `node=<this node>`.
    NoMachine,
    /// Every Machine backing the node is in one of [`EXCLUDED_MACHINE_PHASES`].
    MachinePhase {
        /// The first backing Machine's phase: `Failed` or `Terminating`.
        phase: String,
    },
    /// The node's `InPlaceUpdate` condition has a reason in [`IN_PLACE_UPDATE_EXCLUDING_REASONS`].
    InPlaceUpdate {
        /// That condition's reason: `ReadyForUpdate` or `UpdateFailed`.
        reason: String,
    },
    /// The node would vote but has no lease of its name in `kube-node-lease`.
    NoLease,
}

impl fmt::Display for ExclusionReason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::NotManagedByMcm => {
                write!(f, "not managed by MCM ({NOT_MANAGED_BY_MCM_ANNOTATION})")
            }
            Self::UnhealthyCondition { condition } => {
                write!(f, "unhealthy: condition {condition} is True")
            }
            Self::NoMachine => f.write_str("no Machine backs this node"),
            Self::MachinePhase { phase } => write!(f, "its Machine is {phase}"),
            Self::InPlaceUpdate { reason } => write!(f, "in-place update: {reason}"),
            Self::NoLease => f.write_str("no node lease"),
        }
    }
}

/// A node's part in the decision.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Verdict {
    /// The node votes with its lease. `expires_at` is `None` when there is no renew time (counted
    /// as expired) or the sum is out of range.
    Candidate {
        /// The lease's `spec.renewTime`, at microsecond precision; `None` when unset.
        renew_time: Option<DateTime<Utc>>,
        /// `renew_time + 0.75 × grace` (docs/behaviour.md §2.8): from then on the lease is expired.
        expires_at: Option<DateTime<Utc>>,
        /// Whether the probe's `now` is at or after `expires_at`, or there is no renew time.
        expired: bool,
    },
    /// The node does not vote; its lease, if any, is not counted.
    Excluded(ExclusionReason),
}

impl fmt::Display for Verdict {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Candidate {
                renew_time: None, ..
            } => f.write_str("candidate, lease has no renew time: expired"),
            Self::Candidate {
                renew_time: Some(renewed),
                expires_at,
                expired,
            } => {
                write!(
                    f,
                    "candidate, lease renewed {}",
                    renewed.to_rfc3339_opts(chrono::SecondsFormat::Micros, true)
                )?;
                if let Some(at) = expires_at {
                    let verb = if *expired { "expired" } else { "expires" };
                    write!(
                        f,
                        ", {verb} {}",
                        at.to_rfc3339_opts(chrono::SecondsFormat::Micros, true)
                    )?;
                }
                f.write_str(if *expired { ": expired" } else { ": fresh" })
            }
            Self::Excluded(reason) => write!(f, "excluded: {reason}"),
        }
    }
}

/// One node of the shoot and its part in the lease decision.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NodeVerdict {
    /// The node's name, which is also the name of its lease.
    pub node: String,
    /// The node's [`ZONE_LABEL`](crate::zone::ZONE_LABEL), if it has one.
    pub zone: Option<String>,
    /// Whether the node votes and, if it does, whether its lease expired.
    pub verdict: Verdict,
}

/// Why the lease probe decided to scale up.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum UpReason {
    /// No candidate leases: nothing left to protect, restore the control plane.
    NoCandidates,
    /// Fewer leases expired than the failure fraction.
    BelowThreshold,
}

/// Why the lease probe decided to scale neither up nor down.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NoScalingReason {
    /// A single node can't tell its own death from an outage.
    SingleCandidate,
}

/// What the lease probe decided for the shoot (docs/behaviour.md §2.8, §2.19); hysteresis
/// (§2.9) decides whether it is acted on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LeaseDecision {
    /// No candidates, or fewer than `nodeLeaseFailureFraction` of the candidate leases expired
    /// (and no disrupted zone under zonal protection): restore every target.
    ScaleUp(UpReason),
    /// The shoot-wide rule: every target goes down.
    ScaleDown,
    /// The shoot-wide rule would scale up, but a zone is disrupted and zonal protection is
    /// configured: the targets marked `scaleDownOnZoneOutage` go down, nothing goes up
    /// (docs/behaviour.md §2.19).
    ZonalScaleDown,
    /// Exactly one candidate lease: nothing is scaled either way.
    NoScaling(NoScalingReason),
}

impl fmt::Display for LeaseDecision {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Self::ScaleUp(_) => "scale up",
            Self::ScaleDown => "scale down",
            Self::ZonalScaleDown => "scale down the zonal targets",
            Self::NoScaling(_) => "no scaling",
        })
    }
}

/// Everything the lease probe found and decided.
#[derive(Debug, Clone, PartialEq)]
pub struct LeaseReport {
    /// Nodes seen (the lease probe's: `nodes.len()`; a replayed finding names only some).
    pub nodes_seen: usize,
    /// One verdict per named node, sorted by node name.
    pub nodes: Vec<NodeVerdict>,
    /// Leases whose name matches no node at all (sorted); ignored. Leases of excluded nodes are
    /// not listed here: the node's verdict already says why they don't count.
    pub orphan_leases: Vec<String>,
    /// Candidate leases.
    pub candidates: usize,
    /// Expired candidate leases.
    pub expired: usize,
    /// `expired / candidates`, when there are candidates.
    pub fraction: Option<f64>,
    /// `nodeLeaseFailureFraction`.
    pub threshold: f64,
    /// The candidates grouped by zone, sorted by zone name (docs/behaviour.md §2.19).
    pub zones: Vec<ZoneReport>,
    /// The decision drawn from the counts above and the zones.
    pub decision: LeaseDecision,
}

impl LeaseReport {
    /// The disrupted zones.
    pub fn disrupted_zones(&self) -> impl Iterator<Item = &ZoneReport> {
        self.zones.iter().filter(|z| z.disrupted)
    }
}

impl fmt::Display for LeaseReport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match (self.decision, self.fraction) {
            (LeaseDecision::ScaleUp(UpReason::NoCandidates), _) | (_, None) => write!(
                f,
                "no candidate node leases ({} nodes seen): {}",
                self.nodes_seen, self.decision
            ),
            (LeaseDecision::NoScaling(NoScalingReason::SingleCandidate), Some(_)) => write!(
                f,
                "{}/{} node lease expired, a single node cannot tell its own failure from an outage: {}",
                self.expired, self.candidates, self.decision
            ),
            (decision, Some(fraction)) => {
                let cmp = if fraction >= self.threshold {
                    "≥"
                } else {
                    "<"
                };
                write!(
                    f,
                    "{}/{} node leases expired ({fraction:.2} {cmp} {:.2})",
                    self.expired, self.candidates, self.threshold
                )?;
                if decision == LeaseDecision::ZonalScaleDown {
                    for zone in self.disrupted_zones() {
                        write!(
                            f,
                            ", zone {} disrupted ({}/{})",
                            zone.zone, zone.expired, zone.candidates
                        )?;
                    }
                }
                write!(f, ": {decision}")
            }
        }
    }
}

/// The instant a lease renewed at `renew` counts as expired: `renew + 0.75 × grace`, computed in
/// nanoseconds. `None` when the sum is out of range (then it never expires).
pub fn lease_expiry(renew: DateTime<Utc>, grace: std::time::Duration) -> Option<DateTime<Utc>> {
    let nanos = grace.as_nanos().checked_mul(3)? / 4;
    let delta = TimeDelta::nanoseconds(i64::try_from(nanos).ok()?);
    renew.checked_add_signed(delta)
}

fn node_exclusion(
    node: &NodeView,
    machines: &[MachineView],
    settings: &EffectiveProbeSettings,
) -> Option<ExclusionReason> {
    if node.not_managed_by_mcm {
        return Some(ExclusionReason::NotManagedByMcm);
    }
    let unhealthy = settings.conditions_for_pool(node.pool.as_deref());
    if let Some(c) = node
        .conditions
        .iter()
        .find(|c| c.status == "True" && unhealthy.contains(&c.type_.as_str()))
    {
        return Some(ExclusionReason::UnhealthyCondition {
            condition: c.type_.clone(),
        });
    }
    let backing: Vec<&MachineView> = machines
        .iter()
        .filter(|m| m.node.as_deref() == Some(node.name.as_str()))
        .collect();
    let is_excluded_phase = |m: &&MachineView| {
        m.phase
            .as_deref()
            .is_some_and(|p| EXCLUDED_MACHINE_PHASES.contains(&p))
    };
    match backing.iter().find(|m| !is_excluded_phase(m)) {
        Some(_) => {}
        None => {
            return Some(match backing.first().and_then(|m| m.phase.clone()) {
                Some(phase) => ExclusionReason::MachinePhase { phase },
                None => ExclusionReason::NoMachine,
            });
        }
    }
    if let Some(c) = node.conditions.iter().find(|c| {
        c.type_ == IN_PLACE_UPDATE_CONDITION
            && c.reason
                .as_deref()
                .is_some_and(|r| IN_PLACE_UPDATE_EXCLUDING_REASONS.contains(&r))
    }) {
        return Some(ExclusionReason::InPlaceUpdate {
            reason: c.reason.clone().unwrap_or_default(),
        });
    }
    None
}

/// Evaluates the lease probe: candidates, expiry, zones and the scaling decision.
pub fn evaluate_leases(
    nodes: &[NodeView],
    machines: &[MachineView],
    leases: &[NodeLeaseView],
    settings: &EffectiveProbeSettings,
    failure_fraction: f64,
    zone_rule: &ZoneRule,
    now: DateTime<Utc>,
) -> LeaseReport {
    let leases_by_name: BTreeMap<&str, &NodeLeaseView> =
        leases.iter().map(|l| (l.name.as_str(), l)).collect();
    let mut node_names = BTreeSet::new();
    let mut verdicts = Vec::new();
    let (mut candidates, mut expired) = (0usize, 0usize);

    for node in nodes {
        let name = node.name.as_str();
        node_names.insert(name);
        let verdict = match node_exclusion(node, machines, settings) {
            Some(reason) => Verdict::Excluded(reason),
            None => match leases_by_name.get(name) {
                None => Verdict::Excluded(ExclusionReason::NoLease),
                Some(lease) => {
                    let renew = lease.renew_time;
                    let expires_at =
                        renew.and_then(|r| lease_expiry(r, settings.node_monitor_grace));
                    let is_expired = expired_at(renew, expires_at, now);
                    candidates += 1;
                    if is_expired {
                        expired += 1;
                    }
                    Verdict::Candidate {
                        renew_time: renew,
                        expires_at,
                        expired: is_expired,
                    }
                }
            },
        };
        verdicts.push(NodeVerdict {
            node: name.to_owned(),
            zone: node.zone.clone(),
            verdict,
        });
    }
    verdicts.sort_by(|a, b| a.node.cmp(&b.node));

    let orphan_leases = leases_by_name
        .keys()
        .filter(|n| !node_names.contains(*n))
        .map(|n| (*n).to_owned())
        .collect();

    let zones = judge_zones(
        verdicts.iter().filter_map(|v| match v.verdict {
            Verdict::Candidate { expired, .. } => Some((v.zone.as_deref(), expired)),
            Verdict::Excluded(_) => None,
        }),
        zone_rule,
    );
    let (fraction, decision) =
        lease_decision(candidates, expired, &zones, failure_fraction, zone_rule);
    LeaseReport {
        nodes_seen: verdicts.len(),
        nodes: verdicts,
        orphan_leases,
        candidates,
        expired,
        fraction,
        threshold: failure_fraction,
        zones,
        decision,
    }
}

/// No renew time means no heartbeat: expired. An expiry out of range never arrives.
fn expired_at(
    renew: Option<DateTime<Utc>>,
    expires_at: Option<DateTime<Utc>>,
    now: DateTime<Utc>,
) -> bool {
    match (renew, expires_at) {
        (None, _) => true,
        (Some(_), Some(at)) => now >= at,
        (Some(_), None) => false,
    }
}

/// Whether the lease probe can decide from the leases alone that nothing needs to change,
/// so the (much larger) node list need not be fetched.
///
/// When no lease at all is expired, no set of candidates drawn from them can reach a positive
/// `failure_fraction`: the decision is scale up (0 or ≥ 2 candidates) or no scaling (1), never
/// scale down. If no target is waiting to be scaled up either, every possible decision leaves
/// the shoot as it is, whatever the nodes and machines would say. This is the steady state of
/// almost every shoot, and it halves the shoot requests of a probe run. `nodes_may_matter`:
/// a target waits to be restored (or a scale-down streak is building): decide in full.
pub fn leases_alone_suffice(
    leases: &[NodeLeaseView],
    grace: std::time::Duration,
    failure_fraction: f64,
    now: DateTime<Utc>,
    nodes_may_matter: bool,
) -> bool {
    // A fraction of 0 would scale down on 0 expired leases: only the full evaluation knows.
    if failure_fraction <= 0.0 || nodes_may_matter {
        return false;
    }
    leases.iter().all(|lease| {
        let renew = lease.renew_time;
        !expired_at(renew, renew.and_then(|r| lease_expiry(r, grace)), now)
    })
}

/// The lease decision on `expired` of `candidates` leases, judged `zones`: the expired
/// fraction (none without candidates) and the decision. The one rule the lease probe and a
/// replay of a decision record ([`crate::record`]) both apply.
pub fn lease_decision(
    candidates: usize,
    expired: usize,
    zones: &[ZoneReport],
    failure_fraction: f64,
    zone_rule: &ZoneRule,
) -> (Option<f64>, LeaseDecision) {
    let fraction = (candidates > 0).then(|| expired as f64 / candidates as f64);
    let shoot_wide = decide(candidates, fraction, failure_fraction);
    (fraction, with_zones(shoot_wide, zones, zone_rule))
}

/// The shoot-wide rule keeps priority: a scale-down or a single candidate stays what it is.
/// Only a scale-up becomes a zonal scale-down, when a zone is disrupted and zonal protection is
/// configured: nothing comes back while a zone is still cut off.
fn with_zones(shoot_wide: LeaseDecision, zones: &[ZoneReport], rule: &ZoneRule) -> LeaseDecision {
    match shoot_wide {
        LeaseDecision::ScaleUp(_) if rule.protection && zones.iter().any(|z| z.disrupted) => {
            LeaseDecision::ZonalScaleDown
        }
        other => other,
    }
}

fn decide(candidates: usize, fraction: Option<f64>, threshold: f64) -> LeaseDecision {
    match (candidates, fraction) {
        (0, _) | (_, None) => LeaseDecision::ScaleUp(UpReason::NoCandidates),
        (1, _) => LeaseDecision::NoScaling(NoScalingReason::SingleCandidate),
        (_, Some(f)) if f >= threshold => LeaseDecision::ScaleDown,
        _ => LeaseDecision::ScaleUp(UpReason::BelowThreshold),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::shoot::default_unhealthy_conditions;
    use crate::zone::ZoneRule;
    use std::time::Duration;

    const GRACE: Duration = Duration::from_secs(40);

    fn t(secs: i64) -> DateTime<Utc> {
        DateTime::from_timestamp(1_700_000_000 + secs, 0).unwrap()
    }

    fn settings() -> EffectiveProbeSettings {
        EffectiveProbeSettings {
            node_monitor_grace: GRACE,
            pool_conditions: BTreeMap::from([
                ("a".to_owned(), default_unhealthy_conditions()),
                (
                    "custom".to_owned(),
                    vec!["FrequentKubeletRestart".to_owned()],
                ),
            ]),
        }
    }

    fn node(name: &str) -> NodeView {
        NodeView {
            name: name.into(),
            pool: Some("a".into()),
            zone: None,
            not_managed_by_mcm: false,
            conditions: Vec::new(),
        }
    }

    fn with_condition(
        mut n: NodeView,
        type_: &str,
        status: &str,
        reason: Option<&str>,
    ) -> NodeView {
        n.conditions.push(ConditionView {
            type_: type_.into(),
            status: status.into(),
            reason: reason.map(Into::into),
        });
        n
    }

    /// Judges with [`settings`] and the shoot-wide rule alone (zones reported, never acted on).
    fn judge(
        nodes: &[NodeView],
        machines: &[MachineView],
        leases: &[NodeLeaseView],
        fraction: f64,
        now: DateTime<Utc>,
    ) -> LeaseReport {
        evaluate_leases(
            nodes,
            machines,
            leases,
            &settings(),
            fraction,
            &ZoneRule::report_only(fraction),
            now,
        )
    }

    fn machine(node: &str, phase: Option<&str>) -> MachineView {
        MachineView {
            name: format!("m-{node}"),
            node: Some(node.into()),
            phase: phase.map(Into::into),
        }
    }

    fn lease(name: &str, renewed: Option<DateTime<Utc>>) -> NodeLeaseView {
        NodeLeaseView {
            name: name.into(),
            renew_time: renewed,
        }
    }

    /// `n` healthy nodes "n0".."n{n-1}" with machines, the first `expired` leases renewed long ago.
    fn cluster(n: usize, expired: usize) -> (Vec<NodeView>, Vec<MachineView>, Vec<NodeLeaseView>) {
        let names: Vec<String> = (0..n).map(|i| format!("n{i}")).collect();
        let nodes = names.iter().map(|x| node(x)).collect();
        let machines = names.iter().map(|x| machine(x, Some("Running"))).collect();
        let leases = names
            .iter()
            .enumerate()
            .map(|(i, x)| lease(x, Some(if i < expired { t(-100) } else { t(-1) })))
            .collect();
        (nodes, machines, leases)
    }

    fn run(n: usize, expired: usize, threshold: f64) -> LeaseReport {
        let (nodes, machines, leases) = cluster(n, expired);
        judge(&nodes, &machines, &leases, threshold, t(0))
    }

    /// A shoot of `zones` (name, nodes, expired) with every node labelled with its zone,
    /// judged with zonal protection on or off.
    fn zoned(zones: &[(&str, usize, usize)], protection: bool, min: usize) -> LeaseReport {
        zoned_without_machine(zones, protection, min, None)
    }

    /// [`zoned`], and `no_machine` (a node name) is left without a Machine.
    fn zoned_without_machine(
        zones: &[(&str, usize, usize)],
        protection: bool,
        min: usize,
        no_machine: Option<&str>,
    ) -> LeaseReport {
        let (mut nodes, mut machines, mut leases) = (Vec::new(), Vec::new(), Vec::new());
        for (zone, n, expired) in zones {
            for i in 0..*n {
                let name = format!("{zone}-{i}");
                let mut nd = node(&name);
                if !zone.is_empty() {
                    nd.zone = Some((*zone).into());
                }
                nodes.push(nd);
                if no_machine != Some(name.as_str()) {
                    machines.push(machine(&name, Some("Running")));
                }
                leases.push(lease(
                    &name,
                    Some(if i < *expired { t(-100) } else { t(-1) }),
                ));
            }
        }
        let rule = ZoneRule {
            failure_fraction: 1.0,
            min_candidates: min,
            protection,
        };
        evaluate_leases(&nodes, &machines, &leases, &settings(), 0.6, &rule, t(0))
    }

    #[test]
    fn one_lost_zone_of_three_scales_the_zonal_targets_down_only_when_configured() {
        let world = [("a", 3, 3), ("b", 3, 0), ("c", 3, 0)];
        let on = zoned(&world, true, 2);
        assert_eq!(on.decision, LeaseDecision::ZonalScaleDown);
        assert_eq!(
            on.to_string(),
            "3/9 node leases expired (0.33 < 0.60), zone a disrupted (3/3): scale down the zonal targets"
        );
        let disrupted: Vec<_> = on.disrupted_zones().map(|z| z.zone.as_str()).collect();
        assert_eq!(disrupted, ["a"]);
        // Off: today's decision, the zone still reported as disrupted.
        let off = zoned(&world, false, 2);
        assert_eq!(
            off.decision,
            LeaseDecision::ScaleUp(UpReason::BelowThreshold)
        );
        assert_eq!(off.disrupted_zones().count(), 1);
    }

    #[test]
    fn two_lost_zones_of_three_are_the_shoot_wide_rule() {
        let r = zoned(&[("a", 3, 3), ("b", 3, 3), ("c", 3, 0)], true, 2);
        assert_eq!(r.decision, LeaseDecision::ScaleDown);
    }

    #[test]
    fn a_zone_below_the_minimum_never_counts() {
        let r = zoned(&[("a", 2, 2), ("b", 3, 0), ("c", 3, 0)], true, 3);
        assert_eq!(r.decision, LeaseDecision::ScaleUp(UpReason::BelowThreshold));
        assert!(r.zones[0].too_small && !r.zones[0].disrupted);
    }

    #[test]
    fn nodes_without_a_zone_vote_shoot_wide_only() {
        let r = zoned(&[("", 4, 4), ("b", 3, 0), ("c", 3, 0)], true, 2);
        assert_eq!(r.zones.len(), 2);
        assert_eq!(r.decision, LeaseDecision::ScaleUp(UpReason::BelowThreshold));
        assert_eq!(r.nodes.iter().filter(|v| v.zone.is_none()).count(), 4);
    }

    #[test]
    fn excluded_nodes_do_not_vote_in_their_zone() {
        // Zone a: 2 of 3 leases expired; with its third node excluded (no Machine) the zone
        // is 2/2, disrupted.
        let all = zoned(&[("a", 3, 2), ("b", 3, 0)], true, 2);
        assert_eq!((all.zones[0].candidates, all.zones[0].expired), (3, 2));
        assert_eq!(
            all.decision,
            LeaseDecision::ScaleUp(UpReason::BelowThreshold)
        );
        let r = zoned_without_machine(&[("a", 3, 2), ("b", 3, 0)], true, 2, Some("a-2"));
        assert_eq!((r.zones[0].candidates, r.zones[0].expired), (2, 2));
        assert_eq!(r.decision, LeaseDecision::ZonalScaleDown);
    }

    fn verdict_of<'a>(r: &'a LeaseReport, node: &str) -> &'a Verdict {
        &r.nodes.iter().find(|v| v.node == node).unwrap().verdict
    }

    fn single(n: NodeView, machines: &[MachineView]) -> Verdict {
        let leases = [lease("n0", Some(t(0)))];
        let r = judge(&[n], machines, &leases, 0.6, t(0));
        r.nodes[0].verdict.clone()
    }

    #[test]
    fn no_candidates_scales_up() {
        let r = judge(&[], &[], &[], 0.6, t(0));
        assert_eq!(r.decision, LeaseDecision::ScaleUp(UpReason::NoCandidates));
        assert_eq!(r.fraction, None);
        assert_eq!(
            r.to_string(),
            "no candidate node leases (0 nodes seen): scale up"
        );
    }

    #[test]
    fn single_candidate_never_scales() {
        for expired in [0, 1] {
            let r = run(1, expired, 0.6);
            assert_eq!(
                r.decision,
                LeaseDecision::NoScaling(NoScalingReason::SingleCandidate)
            );
        }
    }

    #[test]
    fn fraction_exactly_at_threshold_scales_down() {
        let r = run(5, 3, 0.6);
        assert_eq!((r.candidates, r.expired), (5, 3));
        assert_eq!(r.decision, LeaseDecision::ScaleDown);
        let r = run(10, 7, 0.7);
        assert_eq!(r.decision, LeaseDecision::ScaleDown);
    }

    #[test]
    fn fraction_below_threshold_scales_up() {
        let r = run(5, 2, 0.6);
        assert_eq!(r.decision, LeaseDecision::ScaleUp(UpReason::BelowThreshold));
        assert_eq!(
            r.to_string(),
            "2/5 node leases expired (0.40 < 0.60): scale up"
        );
    }

    #[test]
    fn report_display_states_counts_fraction_threshold_and_decision() {
        let r = run(5, 4, 0.6);
        assert_eq!(
            r.to_string(),
            "4/5 node leases expired (0.80 ≥ 0.60): scale down"
        );
    }

    #[test]
    fn lease_expires_exactly_at_three_quarters_of_grace() {
        let renewed = t(0);
        let at = lease_expiry(renewed, GRACE).unwrap();
        assert_eq!(at, t(30));
        let leases = [lease("n0", Some(renewed)), lease("n1", Some(renewed))];
        let nodes = [node("n0"), node("n1")];
        let machines = [machine("n0", None), machine("n1", None)];
        let just_before = t(30) - TimeDelta::microseconds(1);
        let r = judge(&nodes, &machines, &leases, 0.6, just_before);
        assert_eq!(r.expired, 0);
        let r = judge(&nodes, &machines, &leases, 0.6, t(30));
        assert_eq!(r.expired, 2);
        assert_eq!(r.decision, LeaseDecision::ScaleDown);
    }

    #[test]
    fn expiry_is_computed_below_the_second() {
        let renewed = t(0) + TimeDelta::microseconds(123_456);
        let at = lease_expiry(renewed, Duration::from_millis(1001)).unwrap();
        assert_eq!(at, renewed + TimeDelta::microseconds(750_750));
    }

    #[test]
    fn lease_without_renew_time_counts_as_expired() {
        let nodes = [node("n0"), node("n1")];
        let machines = [machine("n0", None), machine("n1", None)];
        let leases = [lease("n0", None), lease("n1", Some(t(0)))];
        let r = judge(&nodes, &machines, &leases, 0.5, t(0));
        assert_eq!(
            *verdict_of(&r, "n0"),
            Verdict::Candidate {
                renew_time: None,
                expires_at: None,
                expired: true
            }
        );
        assert_eq!(r.expired, 1);
        assert_eq!(r.decision, LeaseDecision::ScaleDown);
    }

    #[test]
    fn not_managed_by_mcm_is_excluded() {
        let mut n = node("n0");
        n.not_managed_by_mcm = true;
        assert_eq!(
            single(n, &[machine("n0", None)]),
            Verdict::Excluded(ExclusionReason::NotManagedByMcm)
        );
    }

    #[test]
    fn true_unhealthy_condition_of_the_pool_is_excluded() {
        let n = with_condition(node("n0"), "DiskPressure", "True", None);
        assert_eq!(
            single(n, &[machine("n0", None)]),
            Verdict::Excluded(ExclusionReason::UnhealthyCondition {
                condition: "DiskPressure".into()
            })
        );
        let n = with_condition(node("n0"), "DiskPressure", "False", None);
        assert!(matches!(
            single(n, &[machine("n0", None)]),
            Verdict::Candidate { .. }
        ));
    }

    #[test]
    fn pool_list_replaces_default_conditions() {
        let mut n = with_condition(node("n0"), "DiskPressure", "True", None);
        n.pool = Some("custom".into());
        assert!(matches!(
            single(n.clone(), &[machine("n0", None)]),
            Verdict::Candidate { .. }
        ));
        let n = with_condition(n, "FrequentKubeletRestart", "True", None);
        assert!(matches!(
            single(n, &[machine("n0", None)]),
            Verdict::Excluded(ExclusionReason::UnhealthyCondition { .. })
        ));
    }

    #[test]
    fn node_of_unknown_or_missing_pool_uses_default_conditions() {
        let mut n = with_condition(node("n0"), "KernelDeadlock", "True", None);
        n.pool = None;
        assert!(matches!(
            single(n.clone(), &[machine("n0", None)]),
            Verdict::Excluded(ExclusionReason::UnhealthyCondition { .. })
        ));
        n.pool = Some("gone".into());
        assert!(matches!(
            single(n, &[machine("n0", None)]),
            Verdict::Excluded(ExclusionReason::UnhealthyCondition { .. })
        ));
    }

    #[test]
    fn node_without_machine_is_excluded() {
        assert_eq!(
            single(node("n0"), &[machine("other", None)]),
            Verdict::Excluded(ExclusionReason::NoMachine)
        );
    }

    #[test]
    fn failed_or_terminating_machine_is_excluded() {
        for phase in EXCLUDED_MACHINE_PHASES {
            assert_eq!(
                single(node("n0"), &[machine("n0", Some(phase))]),
                Verdict::Excluded(ExclusionReason::MachinePhase {
                    phase: phase.into()
                })
            );
        }
    }

    #[test]
    fn machine_without_phase_or_other_phase_is_fine() {
        for phase in [None, Some("Running"), Some("Pending"), Some("Unknown")] {
            assert!(matches!(
                single(node("n0"), &[machine("n0", phase)]),
                Verdict::Candidate { .. }
            ));
        }
    }

    #[test]
    fn in_place_update_ready_or_failed_is_excluded() {
        for reason in IN_PLACE_UPDATE_EXCLUDING_REASONS {
            let n = with_condition(node("n0"), IN_PLACE_UPDATE_CONDITION, "True", Some(reason));
            assert_eq!(
                single(n, &[machine("n0", None)]),
                Verdict::Excluded(ExclusionReason::InPlaceUpdate {
                    reason: reason.into()
                })
            );
        }
        let n = with_condition(
            node("n0"),
            IN_PLACE_UPDATE_CONDITION,
            "True",
            Some("UpdateSuccessful"),
        );
        assert!(matches!(
            single(n, &[machine("n0", None)]),
            Verdict::Candidate { .. }
        ));
    }

    /// Nodes n0, n1 and `third`, each with a Machine; the leases of n0 and n1 fresh and a
    /// lease `stale_lease` renewed long ago; judged at `fraction`.
    fn two_fresh_and(third: NodeView, stale_lease: &str, fraction: f64) -> LeaseReport {
        let machines = [
            machine("n0", None),
            machine("n1", None),
            machine(&third.name, None),
        ];
        let nodes = [node("n0"), node("n1"), third];
        let leases = [
            lease("n0", Some(t(0))),
            lease("n1", Some(t(0))),
            lease(stale_lease, Some(t(-1000))),
        ];
        judge(&nodes, &machines, &leases, fraction, t(0))
    }

    #[test]
    fn candidate_without_lease_is_excluded_and_orphan_leases_are_listed() {
        let r = two_fresh_and(node("n2"), "ghost", 0.6);
        assert_eq!(
            *verdict_of(&r, "n2"),
            Verdict::Excluded(ExclusionReason::NoLease)
        );
        assert_eq!(r.orphan_leases, ["ghost"]);
        assert_eq!((r.candidates, r.expired), (2, 0));
        assert_eq!(r.decision, LeaseDecision::ScaleUp(UpReason::BelowThreshold));
    }

    #[test]
    fn leases_of_excluded_nodes_do_not_count() {
        let excluded = with_condition(node("n2"), "NetworkUnavailable", "True", None);
        let r = two_fresh_and(excluded, "n2", 0.3);
        assert_eq!((r.candidates, r.expired), (2, 0));
        assert!(r.orphan_leases.is_empty());
    }

    #[test]
    fn verdicts_are_sorted_by_node_name() {
        let nodes = [node("b"), node("a")];
        let r = judge(&nodes, &[], &[], 0.6, t(0));
        let names: Vec<_> = r.nodes.iter().map(|v| v.node.as_str()).collect();
        assert_eq!(names, ["a", "b"]);
    }

    #[test]
    fn leases_alone_suffice_only_when_none_is_expired_and_nothing_waits_to_scale_up() {
        let now = t(100);
        let fresh = |n: &str| lease(n, Some(t(90)));
        let all_fresh = [fresh("a"), fresh("b"), fresh("c")];
        assert!(leases_alone_suffice(&all_fresh, GRACE, 0.6, now, false));
        // No leases: 0 candidates whatever the nodes → scale up, a no-op when nothing is down.
        assert!(leases_alone_suffice(&[], GRACE, 0.6, now, false));
        // Something is scaled down: the nodes decide whether (and how) to restore it.
        assert!(!leases_alone_suffice(&all_fresh, GRACE, 0.6, now, true));
        // One expired lease could be the majority of the candidates: nodes needed.
        let one_expired = [fresh("a"), fresh("b"), lease("c", Some(t(0)))];
        assert!(!leases_alone_suffice(&one_expired, GRACE, 0.6, now, false));
        // A lease without a renew time counts as expired.
        let no_renew = [fresh("a"), lease("b", None)];
        assert!(!leases_alone_suffice(&no_renew, GRACE, 0.6, now, false));
        // Exactly at 0.75 × grace the lease is expired (30 s after t(70) is t(100)).
        assert!(!leases_alone_suffice(
            &[lease("a", Some(t(70)))],
            GRACE,
            0.6,
            now,
            false
        ));
        assert!(leases_alone_suffice(
            &[lease("a", Some(t(71)))],
            GRACE,
            0.6,
            now,
            false
        ));
        // A zero fraction scales down on nothing: never short-cut.
        assert!(!leases_alone_suffice(&all_fresh, GRACE, 0.0, now, false));
    }

    #[test]
    fn when_leases_alone_suffice_the_full_evaluation_never_scales_down() {
        // Whichever nodes turn out to be candidates, all-fresh leases never scale down.
        let now = t(0);
        for n in 0..6 {
            let (nodes, machines, leases) = cluster(n, 0);
            assert!(leases_alone_suffice(&leases, GRACE, 0.6, now, false));
            for keep in 0..=nodes.len() {
                let r = judge(&nodes[..keep], &machines, &leases, 0.6, now);
                assert_ne!(
                    r.decision,
                    LeaseDecision::ScaleDown,
                    "{n} nodes, {keep} kept"
                );
            }
        }
    }
}
