//! The prober against real apiservers: a seed with the Cluster and Machine CRDs, shoot
//! apiservers with simulated kubelets, one in-process prober for the whole binary.

// A test crate: a failed assumption is a failed test (outside tests the workspace denies these).
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod harness;

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use dwd_core::scaling::{IGNORE_SCALING_ANNOTATION, MELTDOWN_ANNOTATION, REPLICAS_ANNOTATION};
use dwd_sim::ShootState;
use dwd_testenv::eventually;
use futures::TryStreamExt;
use harness::in_process::*;
use k8s_openapi::api::apps::v1::Deployment;
use kube::Api;
use kube::runtime::{WatchStreamExt, watcher};

#[tokio::test]
async fn healthy_shoot_is_left_alone() {
    let h = harness().await;
    let shoot = h.shoot("healthy", &h.shoots, |_| {}).await;
    let ns = shoot.namespace().to_string();
    h.wait_runs(&ns, 8).await;
    let seed = h.seed_client().await;
    assert_untouched(&seed, &ns, "healthy").await;
    assert_eq!(h.api_failures(&ns), 0);
    assert_eq!(h.lease_failures(&ns), 0);
}

#[tokio::test]
async fn outage_scales_down_in_level_order_and_recovery_restores_recorded_replicas() {
    let h = harness().await;
    let seed = h.seed_client().await;
    let sick = h.shoot("outage", &h.shoots, |_| {}).await;
    let bystander = h.shoot("bystander", &h.shoots, |_| {}).await;
    let ns = sick.namespace().to_string();
    h.wait_runs(&ns, 2).await;
    let (log, watch) = record_replica_changes(seed.clone(), &ns);

    sick.kubelets().silence_count(4);
    wait_replicas(&seed, &ns, &[(KCM, 0), (MCM, 0), (CA, 0)]).await;
    let scaled_down = assert_level_order(
        &log,
        &[&[(KCM, 0)], &[(MCM, 0)], &[(CA, 0)]],
        0,
        "scale-down order must be KCM (0) < MCM (1) < CA (2)",
    )
    .await;
    assert_recorded(&seed, &ns, &[(KCM, "3"), (MCM, "2"), (CA, "2")]).await;
    // The other shoot on the same seed is untouched.
    let bns = bystander.namespace().to_string();
    assert_replicas(&seed, &bns, SHOOT_REPLICAS, "bystander").await;

    sick.kubelets().resume_all();
    wait_replicas(&seed, &ns, SHOOT_REPLICAS).await;
    assert_level_order(
        &log,
        &[&[(CA, 2)], &[(KCM, 3), (MCM, 2)]],
        scaled_down,
        "scale-up: CA (0) before KCM and MCM (1)",
    )
    .await;
    wait_annotations_cleared(&seed, &ns, &[KCM, MCM, CA]).await;
    watch.abort();
}

#[tokio::test]
async fn single_candidate_shoot_never_scales() {
    let h = harness().await;
    let seed = h.seed_client().await;
    // Three nodes, two of which don't vote: not managed by MCM, and a failed machine.
    let shoot = h.shoot("single", &h.shoots, |o| o.nodes = 3).await;
    let ns = shoot.namespace().to_string();
    let nodes = shoot.node_names();
    shoot
        .shoot()
        .set_node_annotation(
            &nodes[1],
            "node.machine.sapcloud.io/not-managed-by-mcm",
            "true",
        )
        .await
        .expect("annotate");
    shoot
        .seed()
        .set_machine_phase(&nodes[2], "Failed")
        .await
        .expect("machine phase");
    shoot.kubelets().silence(&[nodes[0].as_str()]);
    // Wait until the only candidate's lease is seen expired, then several more runs.
    h.wait_all_leases_expired(&ns).await;
    h.wait_runs(&ns, 5).await;
    assert_replicas(&seed, &ns, SHOOT_REPLICAS, "a single candidate").await;
}

#[tokio::test]
async fn stopped_shoot_apiserver_means_no_scaling_and_probing_resumes() {
    let h = harness().await;
    let seed = h.seed_client().await;
    let api = h
        .env
        .start_apiserver("prober-stop")
        .await
        .expect("apiserver");
    // A long grace period: the kubelets can't renew while their apiserver is down either.
    let shoot = h.shoot_with_long_grace("stop", &api).await;
    let ns = shoot.namespace().to_string();
    h.wait_runs(&ns, 2).await;
    api.stop().await.expect("stop");
    h.wait_api_failures(&ns, 3).await;
    assert_replicas(&seed, &ns, SHOOT_REPLICAS, "apiserver stopped").await;
    api.start().await.expect("start");
    let failures = h.api_failures(&ns);
    h.wait_runs(&ns, 3).await;
    assert!(
        h.api_failures(&ns) <= failures + 1,
        "probing must succeed again once the apiserver is back"
    );
    api.stop().await.expect("stop");
}

#[tokio::test]
async fn throttled_shoot_gets_no_run_within_10s_of_a_429() {
    let h = harness().await;
    let api = h
        .env
        .start_apiserver("prober-429")
        .await
        .expect("apiserver");
    let shoot = h.shoot_with_long_grace("throttle", &api).await;
    let ns = shoot.namespace().to_string();
    h.wait_runs(&ns, 2).await;
    api.set_throttled(true);
    // One run can collect up to three 429s within a moment (version, then its concurrent node
    // and lease lists on fresh connections); the runs are the bursts, seen from the front door.
    let mut seen = api.throttled_responses();
    let mut bursts: Vec<Instant> = Vec::new();
    let mut last_at = Instant::now();
    let deadline = Instant::now() + Duration::from_secs(40);
    while bursts.len() < 2 {
        assert!(
            Instant::now() < deadline,
            "no second throttled run within 40s: {bursts:?}"
        );
        let now_count = api.throttled_responses();
        if now_count > seen {
            let now = Instant::now();
            if bursts.is_empty() || now - last_at > Duration::from_secs(1) {
                bursts.push(now);
            }
            last_at = now;
            seen = now_count;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    api.set_throttled(false);
    let gap = bursts[1] - bursts[0];
    // The interval is 400 ms; only the 429 back-off explains a gap this long.
    assert!(
        gap >= Duration::from_millis(9_800),
        "next run {gap:?} after a 429; must be >= 10s"
    );
    assert!(
        gap <= Duration::from_secs(13),
        "next run came too late: {gap:?}"
    );
    api.stop().await.expect("stop");
}

#[tokio::test]
async fn rotated_missing_or_garbage_kubeconfig_secret() {
    let h = harness().await;
    let seed = h.seed_client().await;
    let shoot = h.shoot("secret", &h.shoots, |_| {}).await;
    let other = h.shoot("secret-bystander", &h.shoots, |_| {}).await;
    let ns = shoot.namespace().to_string();
    let other_ns = other.namespace().to_string();
    h.wait_runs(&ns, 2).await;

    // Rotated to a user without any RBAC: the next runs use it (and the lease probe is refused).
    let unprivileged = h
        .shoots
        .kubeconfig_for("rotated-user", &[])
        .expect("kubeconfig");
    shoot
        .rotate_probe_secret(&unprivileged)
        .await
        .expect("rotate");
    // Runs with the rotated kubeconfig fail their lease probe.
    h.wait_lease_failures(&ns, 2).await;
    shoot
        .rotate_probe_secret(h.shoots.kubeconfig())
        .await
        .expect("rotate back");
    let lease_failures = h.lease_failures(&ns);
    h.wait_runs(&ns, 3).await;
    assert!(
        h.lease_failures(&ns) <= lease_failures + 1,
        "rotated back: runs succeed again"
    );

    // Garbage, then missing: errors, no scaling, even with every kubelet silent.
    shoot.kubelets().silence_count(5);
    for breakage in ["garbage", "missing"] {
        match breakage {
            "garbage" => shoot.corrupt_probe_secret().await.expect("corrupt"),
            _ => shoot.delete_probe_secret().await.expect("delete"),
        }
        h.wait_api_failures(&ns, 3).await;
        assert_replicas(&seed, &ns, SHOOT_REPLICAS, breakage).await;
    }
    // The other shoot kept being probed successfully all along.
    let other_runs = h.runs(&other_ns);
    h.wait_runs(&other_ns, 3).await;
    assert!(h.runs(&other_ns) > other_runs);
    assert_eq!(h.api_failures(&other_ns), 0);
}

#[tokio::test]
async fn missing_mandatory_target_stops_later_levels_optional_missing_does_not() {
    let h = harness().await;
    let seed = h.seed_client().await;
    // No machine-controller-manager (level 1); the optional level-0 target never exists.
    let shoot = h
        .shoot("mandatory", &h.shoots, |o| {
            o.deployments = vec![(KCM.into(), 3), (CA.into(), 2)]
        })
        .await;
    let ns = shoot.namespace().to_string();
    h.wait_runs(&ns, 2).await;
    shoot.kubelets().silence_count(5);
    // Level 0 (KCM, plus the missing optional target) succeeds...
    wait_replicas(&seed, &ns, &[(KCM, 0)]).await;
    // ...level 1 fails on the missing MCM, so level 2 (CA) never runs.
    h.wait_runs(&ns, 5).await;
    assert_eq!(
        deployment_state(&seed, &ns, CA).await.0,
        2,
        "CA must not be scaled past a failed level"
    );
}

#[tokio::test]
async fn ignore_scaling_leaves_that_target_alone() {
    let h = harness().await;
    let seed = h.seed_client().await;
    let shoot = h.shoot("ignore", &h.shoots, |_| {}).await;
    let ns = shoot.namespace().to_string();
    shoot
        .seed()
        .set_deployment_annotation(MCM, IGNORE_SCALING_ANNOTATION, Some("true"))
        .await
        .expect("annotate");
    h.wait_runs(&ns, 2).await;
    shoot.kubelets().silence_count(5);
    wait_replicas(&seed, &ns, &[(KCM, 0), (CA, 0)]).await;
    assert_eq!(deployment_state(&seed, &ns, MCM).await.0, 2);
    shoot.kubelets().resume_all();
    wait_replicas(&seed, &ns, SHOOT_REPLICAS).await;
}

#[tokio::test]
async fn lifecycle_removes_probes_and_never_scales_back_up() {
    let h = harness().await;
    let seed = h.seed_client().await;
    let shoot = h.shoot("hibernate", &h.shoots, |_| {}).await;
    let ns = shoot.namespace().to_string();
    h.wait_runs(&ns, 2).await;
    shoot.kubelets().silence_count(5);
    wait_replicas(&seed, &ns, &[(KCM, 0), (MCM, 0), (CA, 0)]).await;

    // Hibernation: the probe stops at once and scales nothing back up on its way out.
    shoot
        .set_shoot_state(&ShootState {
            hibernation_enabled: true,
            ..ShootState::default()
        })
        .await
        .expect("hibernate");
    eventually(DEADLINE, "probe removed", || async {
        Ok((!h.has_series(&ns)).then_some(()))
    })
    .await
    .expect("probe removed");
    shoot.kubelets().resume_all();
    let clock = h.shoot("hibernate-clock", &h.shoots, |_| {}).await;
    h.wait_runs(clock.namespace(), 8).await;
    wait_replicas(&seed, &ns, &[(KCM, 0), (MCM, 0), (CA, 0)]).await;
    assert!(
        !h.has_series(&ns),
        "no probe may come back for a hibernated shoot"
    );

    // The other removal reasons, each on a fresh shoot that had a probe.
    let removals: [(&str, ShootState); 3] = [
        (
            "deleting",
            ShootState {
                deletion_timestamp: true,
                ..ShootState::default()
            },
        ),
        (
            "migrating",
            ShootState {
                last_operation: Some(("Migrate".into(), "Processing".into())),
                ..ShootState::default()
            },
        ),
        (
            "workerless",
            ShootState {
                workers: vec![],
                ..ShootState::default()
            },
        ),
    ];
    for (name, state) in removals {
        let s = h.shoot(name, &h.shoots, |_| {}).await;
        h.wait_runs(s.namespace(), 1).await;
        s.set_shoot_state(&state).await.expect("state");
        eventually(DEADLINE, &format!("{name}: probe removed"), || async {
            Ok((!h.has_series(s.namespace())).then_some(()))
        })
        .await
        .expect("removed");
    }
    // A deleted Cluster.
    let gone = h.shoot("cluster-gone", &h.shoots, |_| {}).await;
    h.wait_runs(gone.namespace(), 1).await;
    gone.seed().delete_cluster().await.expect("delete cluster");
    eventually(DEADLINE, "probe of a deleted Cluster removed", || async {
        Ok((!h.has_series(gone.namespace())).then_some(()))
    })
    .await
    .expect("removed");
}

#[tokio::test]
async fn waking_up_and_creating_shoots_get_no_probe_until_ready() {
    let h = harness().await;
    let waking = h
        .shoot("waking", &h.shoots, |o| {
            o.shoot_state = Some(ShootState {
                is_hibernated: true,
                ..ShootState::default()
            })
        })
        .await;
    let creating = h
        .shoot("creating", &h.shoots, |o| {
            o.shoot_state = Some(ShootState {
                last_operation: Some(("Create".into(), "Processing".into())),
                ..ShootState::default()
            })
        })
        .await;
    let clock = h.shoot("waking-clock", &h.shoots, |_| {}).await;
    h.wait_runs(clock.namespace(), 6).await;
    assert!(
        !h.has_series(waking.namespace()),
        "a waking-up shoot gets no probe"
    );
    assert!(
        !h.has_series(creating.namespace()),
        "a shoot still being created gets no probe"
    );
    creating
        .set_shoot_state(&ShootState {
            last_operation: Some(("Create".into(), "Succeeded".into())),
            ..ShootState::default()
        })
        .await
        .expect("created");
    h.wait_runs(creating.namespace(), 1).await;
}

#[tokio::test]
async fn shoot_grace_period_override_applies() {
    let h = harness().await;
    let seed = h.seed_client().await;
    // With a 2 minute grace period, a 5 s silence expires nothing (the config's 4 s would).
    let shoot = h.shoot_with_long_grace("grace", &h.shoots).await;
    let ns = shoot.namespace().to_string();
    h.wait_runs(&ns, 2).await;
    shoot.kubelets().silence_count(5);
    // Wait until every lease is older than the config's expiry (0.75 × 4 s = 3 s).
    leases_older_than(&shoot, Duration::from_millis(3_500)).await;
    h.wait_runs(&ns, 2).await;
    assert_eq!(
        h.shoot_metric("dwd_prober_expired_lease_fraction", &ns),
        Some(0.0)
    );
    assert_eq!(deployment_state(&seed, &ns, KCM).await.0, 3);
}

#[tokio::test]
async fn interrupted_scale_down_is_completed_and_later_restored_to_recorded_replicas() {
    let h = harness().await;
    let seed = h.seed_client().await;
    // The state a crash right after the annotation patch (before the scale call) leaves.
    let shoot = h
        .shoot("crash", &h.shoots, |o| {
            o.deployments = vec![(KCM.into(), 3), (MCM.into(), 2), (CA.into(), 2)];
            o.shoot_state = Some(ShootState {
                last_operation: Some(("Create".into(), "Processing".into())),
                ..ShootState::default()
            });
        })
        .await;
    let ns = shoot.namespace().to_string();
    shoot
        .seed()
        .set_deployment_annotation(KCM, REPLICAS_ANNOTATION, Some("3"))
        .await
        .expect("annotate");
    shoot
        .seed()
        .set_deployment_annotation(KCM, MELTDOWN_ANNOTATION, Some(""))
        .await
        .expect("annotate");
    // And after the scale call, before MCM's turn: scaled to 0 with its record.
    shoot
        .seed()
        .set_deployment_annotation(MCM, REPLICAS_ANNOTATION, Some("2"))
        .await
        .expect("annotate");
    shoot
        .seed()
        .set_deployment_annotation(MCM, MELTDOWN_ANNOTATION, Some(""))
        .await
        .expect("annotate");
    shoot.seed().scale_deployment(MCM, 0).await.expect("scale");
    // A (re)started watchdog picks the shoot up with its kubelets healthy: everything is
    // restored to the recorded replicas and the annotations are gone.
    shoot
        .set_shoot_state(&ShootState::default())
        .await
        .expect("reconciled");
    wait_replicas(&seed, &ns, SHOOT_REPLICAS).await;
    wait_annotations_cleared(&seed, &ns, &[KCM, MCM]).await;
}

#[tokio::test]
async fn changed_pool_conditions_restart_the_probe_with_the_new_candidates() {
    let h = harness().await;
    let seed = h.seed_client().await;
    // Four of five nodes report a condition only this pool calls unhealthy.
    let pool_with_custom = |conditions: Option<Vec<String>>| ShootState {
        workers: vec![dwd_sim::WorkerPool {
            name: "worker-a".into(),
            node_conditions: conditions,
        }],
        ..ShootState::default()
    };
    let shoot = h
        .shoot("pools", &h.shoots, |o| {
            o.node_specs = Some(
                (0..5)
                    .map(|i| {
                        let spec = dwd_sim::NodeSpec::new(format!("pools-{i}"), "worker-a");
                        if i < 4 {
                            spec.with_condition("CustomProblem", "True", "Simulated")
                        } else {
                            spec
                        }
                    })
                    .collect(),
            );
            o.shoot_state = Some(pool_with_custom(Some(vec!["CustomProblem".into()])));
        })
        .await;
    let ns = shoot.namespace().to_string();
    h.wait_runs(&ns, 2).await;
    // Every kubelet goes silent, but only one node is a candidate: no scaling.
    shoot.kubelets().silence_count(5);
    h.wait_all_leases_expired(&ns).await;
    h.wait_runs(&ns, 3).await;
    assert_eq!(
        deployment_state(&seed, &ns, KCM).await.0,
        3,
        "a single candidate never scales"
    );
    // The pool goes back to the default conditions: from its next run on (no restart), the
    // probe lets all five nodes vote.
    shoot
        .set_shoot_state(&pool_with_custom(None))
        .await
        .expect("pool conditions");
    wait_replicas(&seed, &ns, &[(KCM, 0), (MCM, 0), (CA, 0)]).await;
}

/// What the real binary's `explain --output json` says of namespace `ns` now, with the
/// shared prober config.
fn explain_json(kubeconfig: &std::path::Path, ns: &str) -> serde_json::Value {
    let dir = std::env::temp_dir().join(format!("dwd-explain-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("dir");
    let config_path = dir.join("dep-config.yaml");
    std::fs::write(&config_path, PROBER_CONFIG).expect("config");
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_dependency-watchdog"))
        .args([
            "explain",
            "--output",
            "json",
            "--namespace",
            ns,
            "--config-file",
        ])
        .arg(&config_path)
        .arg("--kubeconfig")
        .arg(kubeconfig)
        .output()
        .expect("run explain");
    let _ = std::fs::remove_dir_all(&dir);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).expect("json")
}

#[tokio::test]
async fn explain_agrees_with_what_the_prober_did() {
    let h = harness().await;
    let seed = h.seed_client().await;
    let shoot = h.shoot("explain", &h.shoots, |_| {}).await;
    let ns = shoot.namespace().to_string();
    let nodes = shoot.node_names();
    shoot
        .shoot()
        .set_node_annotation(
            &nodes[4],
            "node.machine.sapcloud.io/not-managed-by-mcm",
            "true",
        )
        .await
        .expect("annotate");
    h.wait_runs(&ns, 2).await;
    // Healthy: explain says scale up, nothing to do.
    let config = dwd_core::ProberConfig::from_yaml(PROBER_CONFIG)
        .expect("config")
        .config;
    let healthy = dependency_watchdog::explain::explain(&seed, &config, &ns)
        .await
        .expect("explain");
    let lp = healthy.lease_probe.as_ref().expect("lease probe ran");
    assert!(healthy.api_server_probe.ok, "{healthy}");
    assert_eq!((lp.candidates, lp.expired), (4, 0), "{healthy}");
    assert_eq!(lp.decision, "scale up");
    let excluded = lp
        .nodes
        .iter()
        .find(|n| n.node == nodes[4])
        .expect("node line");
    assert!(
        !excluded.candidate && excluded.verdict.contains("not managed"),
        "{}",
        excluded.verdict
    );

    // Outage: after the prober acted, explain (the real binary, JSON) reports the same decision.
    shoot.kubelets().silence_count(4);
    wait_replicas(&seed, &ns, &[(KCM, 0), (MCM, 0), (CA, 0)]).await;
    let json = explain_json(&h.seed.kubeconfig_path(), &ns);
    assert_eq!(json["lease_probe"]["decision"], "scale down", "{json:#}");
    assert_eq!(json["lease_probe"]["candidates"], 4);
    assert_eq!(json["lease_probe"]["expired"], 4);
    let flow = json["flow"].as_array().expect("flow");
    assert_eq!(
        flow.first().map(|l| l["level"].clone()),
        Some(serde_json::json!(0)),
        "{json:#}"
    );
    let kcm = &flow[0]["targets"][0];
    assert_eq!(kcm["target"], "Deployment/kube-controller-manager");
    assert!(
        kcm["action"]
            .as_str()
            .unwrap_or_default()
            .contains("nothing to scale"),
        "{kcm}"
    );
    // Nothing changed by explain.
    assert_eq!(deployment_state(&seed, &ns, KCM).await.0, 0);
}

/// Requests of `user` in `api`'s audit log, as `(verb, resource or path)`.
fn audited_requests(api: &dwd_testenv::ApiServer, user: &str) -> Vec<(String, String)> {
    let Ok(text) = std::fs::read_to_string(api.audit_log_path()) else {
        return Vec::new(); // no request logged yet: the file is created lazily
    };
    text.lines()
        .filter_map(|line| serde_json::from_str::<serde_json::Value>(line).ok())
        .filter(|e| e["user"]["username"] == user)
        .map(|e| {
            let what = e["objectRef"]["resource"]
                .as_str()
                .or_else(|| e["requestURI"].as_str())
                .unwrap_or_default()
                .to_string();
            (e["verb"].as_str().unwrap_or_default().to_string(), what)
        })
        .collect()
}

fn count(requests: &[(String, String)], verb: &str, what: &str) -> usize {
    requests
        .iter()
        .filter(|(v, w)| v == verb && w == what)
        .count()
}

/// Healthy runs list only the leases (all fresh, nothing to restore: no node can change the
/// outcome); once leases expire the nodes are listed and the shoot is scaled down. Counted
/// from the shoot apiserver's audit log, under a user only the probe secret carries.
///
/// Also: every run connects anew (docs/behaviour.md §2.5) although the kubeconfig is parsed and its
/// TLS configuration built only once, and runs that may resume the previous run's TLS session are
/// still authenticated as the probe user (else the lists would fail and nothing would be scaled
/// down).
#[tokio::test]
async fn healthy_runs_skip_the_node_list_until_leases_expire() {
    const PROBE_USER: &str = "dwd-probe";
    let h = harness().await;
    let api = h
        .env
        .start_apiserver_with(
            "audited-shoot",
            dwd_testenv::ApiServerOptions {
                install_crds: false,
                audit_log: true,
                extra_args: Vec::new(),
                own_etcd: false,
            },
        )
        .await
        .expect("audited shoot apiserver");
    let mut options = dwd_sim::SimShootOptions::new("shoot--it--audited")
        .with_nodes(5)
        .with_renew_interval(RENEW);
    options.node_prefix = "audited-".into();
    options.deployments = vec![(KCM.into(), 3), (MCM.into(), 2), (CA.into(), 2)];
    let probe_kubeconfig = api
        .kubeconfig_for(PROBE_USER, &["system:masters"])
        .expect("probe kubeconfig");
    let shoot = dwd_sim::SimShoot::create(
        h.seed_client().await,
        api.client().await.expect("shoot client"),
        &probe_kubeconfig,
        options,
    )
    .await
    .expect("simulated shoot");
    let ns = shoot.namespace().to_string();
    let connections_before = api.connections();
    let versions_before = count(&audited_requests(&api, PROBE_USER), "get", "/version");

    let requests = eventually(DEADLINE, "8 lease lists by the probe", || {
        let r = audited_requests(&api, PROBE_USER);
        async move { Ok((count(&r, "list", "leases") >= 8).then_some(r)) }
    })
    .await
    .expect("lease lists");
    let (leases, nodes) = (
        count(&requests, "list", "leases"),
        count(&requests, "list", "nodes"),
    );
    // Every run lists the leases; a kubelet delayed past expiry on a loaded machine may make
    // a run list the nodes too, but not half of them (without the short cut: every run).
    assert!(
        nodes * 2 <= leases,
        "{nodes} node lists for {leases} lease lists: {requests:?}"
    );
    assert!(count(&requests, "get", "/version") >= leases);
    // The simulator's own clients connect through the same front door, so this is a lower
    // bound; a probe holding its connection would open about one for all these runs.
    let runs = count(&requests, "get", "/version") - versions_before;
    let connections = api.connections() - connections_before;
    assert!(
        connections >= runs as u64,
        "{connections} connections for {runs} probe runs"
    );

    shoot.kubelets().silence_count(4);
    wait_replicas(&h.seed_client().await, &ns, &[(KCM, 0), (MCM, 0), (CA, 0)]).await;
    eventually(DEADLINE, "nodes listed once leases expired", || {
        let r = audited_requests(&api, PROBE_USER);
        async move { Ok((count(&r, "list", "nodes") > nodes).then_some(())) }
    })
    .await
    .expect("node lists after expiry");
}

/// `(deployment, spec.replicas, when)` changes in the order the watch delivered them.
type StampedLog = Arc<Mutex<Vec<(String, i32, Instant)>>>;

/// Like [`record_replica_changes`], with the moment each change arrived.
fn record_stamped_replica_changes(
    client: kube::Client,
    ns: &str,
) -> (StampedLog, tokio::task::JoinHandle<()>) {
    let log: StampedLog = Arc::default();
    let api: Api<Deployment> = Api::namespaced(client, ns);
    let sink = log.clone();
    let task = tokio::spawn(async move {
        let mut last = std::collections::HashMap::<String, i32>::new();
        let mut stream = std::pin::pin!(watcher(api, watcher::Config::default()).applied_objects());
        while let Ok(Some(d)) = stream.try_next().await {
            let name = d.metadata.name.clone().unwrap_or_default();
            let replicas = d.spec.and_then(|s| s.replicas).unwrap_or(1);
            if last.insert(name.clone(), replicas) != Some(replicas) {
                sink.lock()
                    .expect("log")
                    .push((name, replicas, Instant::now()));
            }
        }
    });
    (log, task)
}

fn stamp(log: &[(String, i32, Instant)], name: &str, replicas: i32) -> Instant {
    log.iter()
        .find(|(n, r, _)| n == name && *r == replicas)
        .map(|(_, _, at)| *at)
        .unwrap_or_else(|| panic!("{name} never reached {replicas}: {log:?}"))
}

/// Merge-patches Deployment `name` in `ns` on the seed.
async fn patch_deployment(seed: &kube::Client, ns: &str, name: &str, patch: serde_json::Value) {
    Api::<Deployment>::namespaced(seed.clone(), ns)
        .patch(
            name,
            &kube::api::PatchParams::default(),
            &kube::api::Patch::Merge(&patch),
        )
        .await
        .expect("patch deployment");
}

#[tokio::test]
async fn a_seed_whose_status_lags_holds_no_level_longer_than_five_seconds() {
    let h = harness().await;
    let seed = h.seed_client().await;
    // A seed whose Deployment status never follows spec: written once (ready), then left
    // as it is, so no target is ever seen to reach its goal (the targets' timeout is 10 s;
    // the reference waits a fixed 5 s).
    let shoot = h
        .shoot("lagging", &h.shoots, |o| o.deployment_status_delay = None)
        .await;
    let ns = shoot.namespace().to_string();
    for (name, ready) in [(KCM, 3), (MCM, 2), (CA, 2)] {
        Api::<Deployment>::namespaced(seed.clone(), &ns)
            .patch_status(
                name,
                &kube::api::PatchParams::default(),
                &kube::api::Patch::Merge(serde_json::json!({"status": {
                    "replicas": ready, "readyReplicas": ready, "availableReplicas": ready}})),
            )
            .await
            .expect("status");
    }
    h.wait_runs(&ns, 2).await;
    let (log, watch) = record_stamped_replica_changes(seed.clone(), &ns);
    shoot.kubelets().silence_count(4);
    wait_replicas(&seed, &ns, &[(KCM, 0), (MCM, 0), (CA, 0)]).await;
    let log = log.lock().expect("log").clone();
    let (kcm, mcm, ca) = (stamp(&log, KCM, 0), stamp(&log, MCM, 0), stamp(&log, CA, 0));
    for (what, gap) in [("KCM → MCM", mcm - kcm), ("MCM → CA", ca - mcm)] {
        assert!(
            gap >= Duration::from_millis(4_500) && gap <= Duration::from_millis(7_500),
            "{what}: the next level must start 5 s after the last one when status lags, not after the 10 s timeout: {gap:?}\n{log:?}"
        );
    }
    // Recovery is not queued behind anything either: back within a few waits.
    let resumed = Instant::now();
    shoot.kubelets().resume_all();
    wait_replicas(&seed, &ns, SHOOT_REPLICAS).await;
    wait_annotations_cleared(&seed, &ns, &[KCM, MCM, CA]).await;
    assert!(
        resumed.elapsed() < Duration::from_secs(20),
        "restored after {:?}",
        resumed.elapsed()
    );
    watch.abort();
}

#[tokio::test]
async fn an_unusable_replicas_record_never_leaves_a_healthy_shoots_target_at_zero() {
    let h = harness().await;
    let seed = h.seed_client().await;
    let shoot = h.shoot("badrecord", &h.shoots, |_| {}).await;
    let ns = shoot.namespace().to_string();
    h.wait_runs(&ns, 2).await;
    // Someone (not the watchdog) left each target at 0 behind the marker with a record the
    // watchdog can't restore: "0", text, and a count above the 1000 it restores at most.
    for (name, record) in [(KCM, "0"), (MCM, "garbage"), (CA, "5000")] {
        patch_deployment(
            &seed,
            &ns,
            name,
            serde_json::json!({
                "metadata": {"annotations": {REPLICAS_ANNOTATION: record, MELTDOWN_ANNOTATION: ""}},
                "spec": {"replicas": 0}
            }),
        )
        .await;
    }
    // The shoot is healthy: each comes back with one replica, and neither annotation stays
    // (the marker would keep gardenlet from scaling it).
    wait_replicas(&seed, &ns, &[(KCM, 1), (MCM, 1), (CA, 1)]).await;
    wait_annotations_cleared(&seed, &ns, &[KCM, MCM, CA]).await;
    h.wait_runs(&ns, 3).await;
    for name in [KCM, MCM, CA] {
        assert_eq!(deployment_state(&seed, &ns, name).await.0, 1, "{name}");
    }
}

#[tokio::test]
async fn a_repeated_scale_down_keeps_the_higher_recorded_count() {
    let h = harness().await;
    let seed = h.seed_client().await;
    let shoot = h.shoot("rescaled", &h.shoots, |_| {}).await;
    let ns = shoot.namespace().to_string();
    h.wait_runs(&ns, 2).await;
    shoot.kubelets().silence_count(4);
    wait_replicas(&seed, &ns, &[(KCM, 0), (MCM, 0), (CA, 0)]).await;
    let recorded =
        |a: &std::collections::BTreeMap<String, String>| a.get(REPLICAS_ANNOTATION).cloned();
    assert_eq!(
        recorded(&deployment_state(&seed, &ns, KCM).await.1).as_deref(),
        Some("3")
    );
    // During the outage something brings KCM partly back; the watchdog scales it down again
    // and must keep the count from before the outage.
    patch_deployment(
        &seed,
        &ns,
        KCM,
        serde_json::json!({"spec": {"replicas": 1}}),
    )
    .await;
    eventually(
        DEADLINE,
        "KCM seen at 1, then scaled down again",
        || async {
            let (replicas, a) = deployment_state(&seed, &ns, KCM).await;
            Ok((replicas == 0 && a.contains_key(MELTDOWN_ANNOTATION)).then_some(a))
        },
    )
    .await
    .expect("scaled down again");
    // (The patch above and the re-scale may pass unseen between two polls: the record is
    // what matters.)
    assert_eq!(
        recorded(&deployment_state(&seed, &ns, KCM).await.1).as_deref(),
        Some("3"),
        "a repeated scale-down overwrote the record with a lower count"
    );
    shoot.kubelets().resume_all();
    wait_replicas(&seed, &ns, SHOOT_REPLICAS).await;
    wait_annotations_cleared(&seed, &ns, &[KCM, MCM, CA]).await;
}

#[tokio::test]
async fn a_429_with_retry_after_is_retried_within_the_call_by_seed_and_shoot_clients() {
    use dependency_watchdog::client::kube_client::{rate_limited_client, seed_config};
    use k8s_openapi::api::core::v1::ConfigMap;
    let h = harness().await;
    // An apiserver of its own: nothing else may take its throttled answers.
    let api = h
        .env
        .start_apiserver("prober-retry-after")
        .await
        .expect("apiserver");
    api.set_retry_after(Some(1));

    // The seed client, as the binary builds it. A fresh client per step: its first request
    // opens a new connection, which is what the front door throttles.
    let seed_client = || async {
        let path = api.kubeconfig_path();
        let config = seed_config(Some(path.as_path())).await.expect("config");
        rate_limited_client(config, 5.0, 10).expect("client")
    };
    let maps = |c: kube::Client| Api::<ConfigMap>::namespaced(c, "default");
    let mut cm = ConfigMap::default();
    cm.metadata.name = Some("retry-after".into());
    maps(seed_client().await)
        .create(&kube::api::PostParams::default(), &cm)
        .await
        .expect("create");
    let patch = serde_json::json!({"data": {"k": "v"}});
    let patch = kube::api::Patch::Merge(&patch);
    let pp = kube::api::PatchParams::default();

    // Two 429s with Retry-After: 1, then the write goes through, within the same call.
    let before = api.throttled_responses();
    api.throttle_next(2);
    let started = Instant::now();
    maps(seed_client().await)
        .patch("retry-after", &pp, &patch)
        .await
        .expect("the write passes after two Retry-After waits");
    assert_eq!(api.throttled_responses() - before, 2);
    assert!(
        started.elapsed() >= Duration::from_secs(2),
        "{:?}",
        started.elapsed()
    );

    // Within a caller's deadline (the scaler's call timeout) no wait is started that would
    // end past it: the 429 comes back, not a timeout.
    api.throttle_next(3);
    let started = Instant::now();
    let client = seed_client().await;
    let client = dependency_watchdog::client::retry_after::deadline_client(
        &client,
        tokio::time::Instant::now() + Duration::from_millis(1_500),
    );
    let result = maps(client).patch("retry-after", &pp, &patch).await;
    match result {
        Err(kube::Error::Api(s)) => assert_eq!(s.code, 429),
        other => panic!("expected the 429 back: {other:?}"),
    }
    assert!(
        started.elapsed() < Duration::from_millis(1_900),
        "{:?}",
        started.elapsed()
    );
    api.throttle_next(0);

    // A shoot's probe call: its GET /version answered 429 twice is retried within the
    // probe timeout (3 s), so the run succeeds and no API-server probe failure is recorded.
    let shoot = h.shoot("retryafter", &api, |_| {}).await;
    let ns = shoot.namespace().to_string();
    h.wait_runs(&ns, 2).await;
    let failures = h.api_failures(&ns);
    let before = api.throttled_responses();
    api.throttle_next(2);
    eventually(DEADLINE, "both 429s sent", || async {
        Ok((api.throttled_responses() - before >= 2).then_some(()))
    })
    .await
    .expect("throttled");
    h.wait_runs(&ns, 2).await;
    assert_eq!(
        h.api_failures(&ns),
        failures,
        "a 429 with Retry-After within the probe timeout must not fail the run"
    );
    api.stop().await.expect("stop");
}
