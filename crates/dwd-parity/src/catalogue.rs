//! The scenarios, at least one per row of issue 13's list of differences.
//!
//! Times are seconds after the binary's start. Gardener's config with shortened intervals
//! ([`crate::world::shortened`]): first probe 2 s after start, then every 1–1.2 s; a silenced
//! node's lease counts as expired 4.5 s after its last renewal (kubelets renew every second);
//! MCM's scale-up waits 3 s; each level waits at most 5 s for its targets. Windows are
//! generous for a loaded 2-core machine; each expectation is what README's "Different
//! behaviour on the same input" and our code say our binary does.

use dwd_sim::{EndpointsState, NodeSpec, ShootState, WorkerPool};

use crate::scenario::{
    Action::*, CA, ConfigEdit, Expect::*, KCM, MCM, MELTDOWN, PodSpec, PodState, REPLICAS, Role,
    Scenario, Side, WorldSpec, at,
};

/// Every scenario, in the order they are listed and run.
pub fn all() -> Vec<Scenario> {
    vec![
        readiness_wait(),
        healthy_cadence(),
        retry_after(),
        initial_delay_per_flow(),
        cluster_edit_during_outage(),
        node_conditions_empty(),
        grace_not_positive(),
        skipped_scale_up(),
        unusable_replicas_record(),
        consistent_lists(),
        optional_unserved_kind(),
        weeder_empty_slice(),
        weeder_init_crashloop(),
        leader_lease_release(),
    ]
}

/// The scenario called `name`.
pub fn find(name: &str) -> Option<Scenario> {
    all().into_iter().find(|s| s.name == name)
}

fn prober(name: &'static str, about: &'static str, world: WorldSpec) -> Scenario {
    Scenario {
        name,
        about,
        role: Role::Prober,
        world,
        config_edits: Vec::new(),
        leader_election: false,
        actions: Vec::new(),
        duration: 20.0,
        expect: vec![ExitCode(0)],
    }
}

fn weeder(name: &'static str, about: &'static str, world: WorldSpec) -> Scenario {
    Scenario {
        role: Role::Weeder,
        ..prober(name, about, world)
    }
}

/// Row: readiness wait between levels. The seed's Deployment status lags 6 s behind spec:
/// each level waits at most 5 s for its targets (the reference's fixed wait), never its
/// 30 s `timeout`.
fn readiness_wait() -> Scenario {
    let mut world = WorldSpec::shoot(3);
    world.status_delay = std::time::Duration::from_secs(6);
    let mut s = prober(
        "readiness-wait",
        "readiness wait between levels: status lags 6 s; KCM goes down ≤5 s after MCM/CA, comes back first, MCM 5 s wait + 3 s delay later",
        world,
    );
    // The kubelets come back once the scale-down flow has ended (KCM's wait ends ~5 s after
    // it went down, ~19 s): a recovery during that wait would supersede it, and KCM, whose
    // status never showed it down, would count as ready at once (docs/behaviour.md §2.20).
    s.actions = vec![at(4.0, Silence(2)), at(20.0, ResumeAll)];
    s.duration = 44.0;
    s.expect.extend([
        Reaches(MCM, 0, 6.5, 12.0),
        Reaches(CA, 0, 6.5, 12.0),
        Gap(MCM, 0, KCM, 0, 3.5, 6.5),
        // Not before the kubelets renew again (20 s), as in `consistent_lists`.
        Reaches(KCM, 2, 20.0, 28.0),
        Gap(KCM, 2, MCM, 1, 6.5, 10.5),
        Gap(MCM, 1, CA, 1, 3.5, 6.5),
        AnnotationAtEnd(KCM, REPLICAS, None),
        AnnotationAtEnd(KCM, MELTDOWN, None),
    ]);
    s
}

/// Not a row of the issue, found by this runner: the probe's cadence on a healthy shoot.
/// MCM's scale-up `initialDelay` is 8 s: a healthy run with nothing to restore runs no flow,
/// so runs keep coming every second and the outage is acted on as soon as the leases expire
/// (the reference runs the scale-up flow on every healthy run, sleeping the delay before it
/// finds MCM running: a run every ~9 s, and the outage acted on up to 8 s later).
fn healthy_cadence() -> Scenario {
    let mut s = prober(
        "healthy-cadence",
        "MCM scale-up initialDelay 8 s, outage at 8 s: runs every second on the healthy shoot, scale-down as the leases expire (reference: a run every ~9 s)",
        WorldSpec::shoot(3),
    );
    s.config_edits = vec![ConfigEdit::Replace(
        "initialDelay: 3s\n",
        "initialDelay: 8s\n",
    )];
    // The reference's second run comes ~11 s after start, just before the leases expire
    // (~12.5 s); its third ~9 s later.
    s.actions = vec![at(8.0, Silence(2))];
    s.duration = 23.0;
    s.expect.extend([
        Reaches(MCM, 0, 11.5, 15.5),
        Reaches(CA, 0, 11.5, 15.5),
        Reaches(KCM, 0, 11.5, 16.5),
    ]);
    s
}

/// Row: 429 with `Retry-After`. The shoot answers 429 (Retry-After 1 s) while the leases
/// expire, the seed while the watchdog scales: both clients retry within the call, so the
/// scale-down happens once the seed serves again.
fn retry_after() -> Scenario {
    let mut s = prober(
        "retry-after",
        "429 with Retry-After on shoot (6–8 s) and seed (8–10 s): retried within the call, scale-down right after",
        WorldSpec::shoot(3),
    );
    s.actions = vec![
        at(4.0, Silence(2)),
        at(6.0, Throttle(Side::Shoot, true, Some(1))),
        at(8.0, Throttle(Side::Shoot, false, None)),
        at(8.0, Throttle(Side::Seed, true, Some(1))),
        at(10.0, Throttle(Side::Seed, false, None)),
        at(14.0, ResumeAll),
    ];
    s.duration = 20.0;
    s.expect.extend([
        Reaches(MCM, 0, 8.0, 14.0),
        Reaches(KCM, 0, 8.0, 16.0),
        Reaches(KCM, 2, 14.0, 19.5),
        ReplicasAtEnd(KCM, 2),
    ]);
    s
}

/// Row: `initialDelay` per attempt (reference) or per flow (ours). The seed answers the
/// first write to each target with 409 during the scale-up: MCM's retry follows its failed
/// attempt at once instead of after another 3 s.
fn initial_delay_per_flow() -> Scenario {
    let mut s = prober(
        "initial-delay-per-flow",
        "initialDelay with a write that fails once (409): slept once per flow, MCM up ~3 s after KCM (reference: ~6 s)",
        WorldSpec::shoot(3),
    );
    s.actions = vec![
        at(4.0, Silence(2)),
        at(12.0, ConflictOnFirstWrite(true)),
        at(12.5, ResumeAll),
    ];
    s.duration = 22.0;
    s.expect.extend([
        Reaches(MCM, 0, 6.5, 12.0),
        Reaches(KCM, 2, 12.5, 19.0),
        Gap(KCM, 2, MCM, 1, 2.5, 5.0),
        ReplicasAtEnd(CA, 1),
    ]);
    s
}

/// Row: probe restarts on a Cluster edit. `initialDelay` 8 s; while the leases expire the
/// pool's `nodeConditions` are edited: the running probe takes the new settings from its next
/// run, protection is not delayed by another `initialDelay`.
fn cluster_edit_during_outage() -> Scenario {
    let mut s = prober(
        "cluster-edit-during-outage",
        "Cluster edit (pool nodeConditions) during an outage, initialDelay 8 s: no restart, scale-down not delayed",
        WorldSpec::shoot(3),
    );
    s.config_edits = vec![ConfigEdit::Replace(
        "initialDelay: 2s\n",
        "initialDelay: 8s\n",
    )];
    let edited = pool_node_conditions(vec!["ReadonlyFilesystem".to_string()]);
    s.actions = vec![
        at(9.0, Silence(2)),
        at(12.0, EditCluster(edited)),
        at(19.0, ResumeAll),
    ];
    s.duration = 25.0;
    s.expect.extend([
        Reaches(MCM, 0, 12.5, 17.5),
        Reaches(KCM, 0, 12.5, 19.0),
        // Restored not before the kubelets renew again (19 s): a run right after their
        // renewals may restore at once (CI on 6c16a69: 19.4 s, as in `consistent_lists`).
        Reaches(KCM, 2, 19.0, 24.0),
    ]);
    s
}

/// Row: `nodeConditions: []` means the defaults (as in the reference). Two of four nodes
/// report DiskPressure (a default condition: they don't vote); the other two go silent: all
/// candidates expired, the shoot is scaled down.
fn node_conditions_empty() -> Scenario {
    let pool = dwd_sim::shoot::DEFAULT_POOL;
    let disk_pressure = |name| {
        NodeSpec::new(name, pool).with_condition("DiskPressure", "True", "KubeletHasDiskPressure")
    };
    let mut world = WorldSpec::shoot(0);
    world.nodes = vec![
        NodeSpec::new("node-0", pool),
        NodeSpec::new("node-1", pool),
        disk_pressure("node-2"),
        disk_pressure("node-3"),
    ];
    world.shoot_state = Some(pool_node_conditions(Vec::new()));
    let mut s = prober(
        "node-conditions-empty",
        "nodeConditions: [] = defaults: DiskPressure nodes don't vote, the 2 silent ones are all candidates → scale-down",
        world,
    );
    s.actions = vec![at(4.0, Silence(2))];
    s.duration = 14.0;
    s.expect
        .extend([Reaches(MCM, 0, 7.0, 12.5), Reaches(KCM, 0, 7.0, 13.5)]);
    s
}

/// Row: a Shoot `nodeMonitorGracePeriod` of `0s`, then negative: ignored, the config's grace
/// applies, a healthy shoot is left alone (the reference scales it down).
fn grace_not_positive() -> Scenario {
    let mut world = WorldSpec::shoot(3);
    world.shoot_state = Some(ShootState {
        node_monitor_grace_period: Some("0s".to_string()),
        ..ShootState::default()
    });
    let mut s = prober(
        "grace-not-positive",
        "Shoot nodeMonitorGracePeriod 0s, then -10s, healthy shoot: ignored, nothing scaled (reference: scaled down)",
        world,
    );
    s.actions = vec![at(
        7.0,
        EditCluster(ShootState {
            node_monitor_grace_period: Some("-10s".to_string()),
            ..ShootState::default()
        }),
    )];
    s.duration = 13.0;
    s.expect
        .extend([Never(KCM, 0), Never(MCM, 0), Never(CA, 0)]);
    s
}

/// Row: a skipped scale-up (the target already runs) with a leftover marker and record:
/// both annotations removed, replicas untouched.
fn skipped_scale_up() -> Scenario {
    let mut world = WorldSpec::shoot(3);
    world.annotations = vec![
        (KCM, MELTDOWN, ""),
        (KCM, REPLICAS, "2"),
        (MCM, MELTDOWN, ""),
    ];
    let mut s = prober(
        "skipped-scale-up",
        "running targets with a leftover marker (KCM also a record): both annotations removed, replicas kept (reference: only the marker)",
        world,
    );
    s.duration = 10.0;
    s.expect.extend([
        Never(KCM, 0),
        ReplicasAtEnd(KCM, 2),
        ReplicasAtEnd(MCM, 1),
        AnnotationAtEnd(KCM, MELTDOWN, None),
        AnnotationAtEnd(KCM, REPLICAS, None),
        AnnotationAtEnd(MCM, MELTDOWN, None),
    ]);
    s
}

/// Row: an unusable `replicas` record during scale-up (`"0"`, text) on a healthy shoot: one
/// replica restored, both annotations removed, warned once per value.
fn unusable_replicas_record() -> Scenario {
    let mut world = WorldSpec::shoot(3);
    world.deployments = vec![(KCM, 0), (MCM, 0), (CA, 1)];
    world.annotations = vec![
        (KCM, MELTDOWN, ""),
        (KCM, REPLICAS, "0"),
        (MCM, MELTDOWN, ""),
        (MCM, REPLICAS, "abc"),
    ];
    let mut s = prober(
        "unusable-replicas-record",
        "targets at 0 behind the marker with records \"0\" (KCM) and \"abc\" (MCM), healthy shoot: 1 replica each, annotations gone",
        world,
    );
    s.duration = 14.0;
    s.expect.extend([
        Reaches(KCM, 1, 1.5, 7.0),
        Reaches(MCM, 1, 1.5, 12.5),
        ReplicasAtEnd(KCM, 1),
        ReplicasAtEnd(MCM, 1),
        AnnotationAtEnd(KCM, MELTDOWN, None),
        AnnotationAtEnd(KCM, REPLICAS, None),
        AnnotationAtEnd(MCM, MELTDOWN, None),
        AnnotationAtEnd(MCM, REPLICAS, None),
        // Once per unusable value, not once per run.
        Warnings("replicas=\"0\"", 1, 1),
        Warnings("replicas=\"abc\"", 1, 1),
    ]);
    s
}

/// Row: consistent shoot lists. 120 nodes (the node list comes in pages of 100), 80 go silent
/// (67 % ≥ 60 %): one consistent snapshot, the shoot is scaled down.
fn consistent_lists() -> Scenario {
    let mut s = prober(
        "consistent-lists",
        "120 nodes (node list paged), 80 silent: scale-down from consistent paged lists",
        WorldSpec::shoot(120),
    );
    s.actions = vec![at(4.0, Silence(80)), at(13.0, ResumeAll)];
    s.duration = 18.0;
    // Restored not before the kubelets renew again (13 s): a run right after their renewals
    // may see it (CI on 2026-11-27: 13.46 s, which a bound of 13.5 s refused).
    s.expect.extend([
        Reaches(MCM, 0, 7.0, 13.0),
        Reaches(KCM, 0, 7.0, 14.0),
        Reaches(KCM, 2, 13.0, 18.0),
    ]);
    s
}

/// Row: an optional target of a kind the seed does not serve: startup goes on, that target
/// is skipped, the others are scaled as usual.
fn optional_unserved_kind() -> Scenario {
    let mut s = prober(
        "optional-unserved-kind",
        "an optional level-0 target of an unserved kind (example.com/v1 Widget): skipped, KCM/MCM/CA scaled as usual",
        WorldSpec::shoot(3),
    );
    s.config_edits = vec![ConfigEdit::Replace(
        "dependentResourceInfos:\n",
        "dependentResourceInfos:\n- optional: true\n  ref:\n    apiVersion: example.com/v1\n    kind: Widget\n    name: widget\n  scaleDown:\n    level: 0\n  scaleUp:\n    level: 0\n",
    )];
    s.actions = vec![at(4.0, Silence(2)), at(13.0, ResumeAll)];
    s.duration = 22.0;
    s.expect.extend([
        Reaches(MCM, 0, 7.0, 12.5),
        Reaches(CA, 0, 7.0, 12.5),
        Reaches(KCM, 0, 7.0, 14.0),
        // Not before the kubelets renew again (13 s), as in `consistent_lists`.
        Reaches(KCM, 2, 13.0, 17.5),
        Reaches(MCM, 1, 16.0, 21.5),
    ]);
    s
}

/// The Shoot of the default worker pool with these `nodeConditions`.
fn pool_node_conditions(node_conditions: Vec<String>) -> ShootState {
    ShootState {
        workers: vec![WorkerPool {
            name: dwd_sim::shoot::DEFAULT_POOL.to_string(),
            node_conditions: Some(node_conditions),
        }],
        ..ShootState::default()
    }
}

/// A seed whose etcd-main-client slice has one endpoint, not ready, and these kube-apiserver
/// pods (named `name`, in `state`), the weeder's dependants of it.
fn etcd_and_apiservers(pods: &[(&'static str, PodState)]) -> WorldSpec {
    let mut world = WorldSpec::seed_only();
    world.slices = vec![("etcd-main-client", 1, EndpointsState::NotReady)];
    world.pods = pods
        .iter()
        .map(|&(name, state)| PodSpec {
            name,
            labels: vec![
                ("gardener.cloud/role", "controlplane"),
                ("role", "apiserver"),
            ],
            state,
        })
        .collect();
    world
}

/// Row: weeder, an EndpointSlice with no endpoints is not a service that came back.
fn weeder_empty_slice() -> Scenario {
    let world = etcd_and_apiservers(&[("kube-apiserver-0", PodState::CrashLooping)]);
    let mut s = weeder(
        "weeder-empty-slice",
        "etcd-main-client's slice empties (3 s), then gets a ready endpoint (8 s): the crash-looping kube-apiserver is deleted only then",
        world,
    );
    s.actions = vec![
        at(3.0, Slice("etcd-main-client", 1, EndpointsState::Empty)),
        at(8.0, Slice("etcd-main-client", 1, EndpointsState::AllReady)),
    ];
    s.duration = 12.0;
    s.expect.extend([PodDeleted("kube-apiserver-0", 8.0, 11.0)]);
    s
}

/// Row: weeder, a dependant whose init container crash-loops is deleted too.
fn weeder_init_crashloop() -> Scenario {
    let world = etcd_and_apiservers(&[
        ("kube-apiserver-init", PodState::InitCrashLooping),
        ("kube-apiserver-main", PodState::CrashLooping),
        ("kube-apiserver-ok", PodState::Running),
    ]);
    let mut s = weeder(
        "weeder-init-crashloop",
        "etcd-main-client ready at 3 s: dependants crash-looping in the init container and in the main container deleted, the running one kept",
        world,
    );
    s.actions = vec![at(
        3.0,
        Slice("etcd-main-client", 1, EndpointsState::AllReady),
    )];
    s.duration = 9.0;
    s.expect.extend([
        PodDeleted("kube-apiserver-main", 3.0, 6.0),
        PodDeleted("kube-apiserver-init", 3.0, 6.0),
        PodKept("kube-apiserver-ok"),
    ]);
    s
}

/// Row: the leader lease on shutdown: released at SIGTERM (the reference keeps it until it
/// expires).
fn leader_lease_release() -> Scenario {
    let mut s = prober(
        "leader-lease-release",
        "leader election on, SIGTERM at 6 s: the Lease is released at once, exit 0 (reference: held until it expires)",
        WorldSpec::shoot(3),
    );
    s.leader_election = true;
    s.actions = vec![at(6.0, Terminate)];
    s.duration = 11.0;
    s.expect.extend([LeaseReleasedWithin(2.0), Never(KCM, 0)]);
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_unique_and_short() {
        let all = all();
        for s in &all {
            assert!(
                s.name.len() <= 28 && s.name.chars().all(|c| c.is_ascii_lowercase() || c == '-'),
                "{}",
                s.name
            );
            assert_eq!(
                all.iter().filter(|o| o.name == s.name).count(),
                1,
                "{}",
                s.name
            );
            assert!(s.actions.iter().all(|a| a.at < s.duration), "{}", s.name);
        }
    }

    #[test]
    fn every_config_edit_applies_to_gardeners_config() {
        for s in all() {
            let mut config = crate::world::shortened(s.role).expect("Gardener's config");
            for e in &s.config_edits {
                config = e.apply(&config).expect(s.name);
            }
        }
    }
}
