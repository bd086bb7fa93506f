//! The simulator against real apiservers from dwd-testenv: kubelets renew (and stop
//! renewing) leases, Deployment status follows spec, the Cluster carries the shoot state,
//! Machines, Pods, EndpointSlices and the probe Secret behave as the watchdog expects.

// A test crate: a failed assumption is a failed test (outside tests the workspace denies these).
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::collections::{BTreeMap, HashMap};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, anyhow, bail};
use dwd_sim::seed::{
    DEFAULT_PROBE_SECRET, KUBECONFIG_KEY, SERVICE_NAME_LABEL, cluster_resource,
    endpoint_slice_name, machine_resource,
};
use dwd_sim::shoot::{NODE_LEASE_NAMESPACE, NOT_MANAGED_BY_MCM_ANNOTATION, POOL_LABEL};
use dwd_sim::{
    DeploymentStatusOptions, DeploymentStatusSim, EndpointsState, KubeletOptions, Kubelets,
    NodeShape, NodeSpec, SeedControlPlane, ShootDataPlane, ShootState, SimShoot, SimShootOptions,
    WorkerPool, ZONE_LABEL, kubelet_sized_node_specs_with_prefix, node_specs_with_prefix,
};
use dwd_testenv::{ApiServer, TestEnv, eventually};
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{Node, Pod, Secret};
use k8s_openapi::api::discovery::v1::EndpointSlice;
use kube::api::{Api, DeleteParams, DynamicObject, ListParams};
use serde_json::Value;

const WAIT: Duration = Duration::from_secs(20);
const FAST: Duration = Duration::from_millis(200);

async fn seed_client() -> Result<kube::Client> {
    let env = TestEnv::shared().await?;
    Ok(env
        .apiserver("seed")
        .context("seed apiserver")?
        .client()
        .await?)
}

/// One shoot apiserver shared by the tests that don't stop it; each test uses its own node
/// name prefix so they don't see each other's nodes' leases change.
async fn shared_shoot() -> Result<ApiServer> {
    static SHOOT: tokio::sync::OnceCell<ApiServer> = tokio::sync::OnceCell::const_new();
    let env = TestEnv::shared().await?;
    Ok(SHOOT
        .get_or_try_init(|| env.start_apiserver("sim-shoot"))
        .await?
        .clone())
}

/// A simulated shoot `namespace` of `nodes` nodes named `prefix`0, `prefix`1, …, whose
/// kubelets renew every `renew`.
fn sim_options(namespace: &str, nodes: usize, prefix: &str, renew: Duration) -> SimShootOptions {
    let mut options = SimShootOptions::new(namespace).with_renew_interval(renew);
    options.nodes = nodes;
    options.node_prefix = prefix.into();
    options
}

/// The simulated shoot of `options` on `shoot`, its seed side on `seed`.
async fn create_sim(
    seed: kube::Client,
    shoot: &ApiServer,
    options: SimShootOptions,
) -> Result<SimShoot> {
    Ok(SimShoot::create(seed, shoot.client().await?, shoot.kubeconfig(), options).await?)
}

/// A client of the shared seed and the control plane of its namespace `ns`, created.
async fn seed_namespace(ns: &str) -> Result<(kube::Client, SeedControlPlane)> {
    let seed = seed_client().await?;
    let plane = SeedControlPlane::new(seed.clone(), ns);
    plane.create_namespace().await?;
    Ok((seed, plane))
}

/// The annotations of the node `name` as the apiserver has them now.
async fn node_annotations(nodes: &Api<Node>, name: &str) -> Result<BTreeMap<String, String>> {
    Ok(nodes
        .get(name)
        .await?
        .metadata
        .annotations
        .unwrap_or_default())
}

/// Converts `eventually`'s error (a String) into anyhow.
fn ev<T>(r: Result<T, String>) -> Result<T> {
    r.map_err(|e| anyhow!(e))
}

fn s<E: std::fmt::Display>(e: E) -> String {
    e.to_string()
}

#[tokio::test]
async fn kubelets_renew_leases_and_silenced_nodes_stop_until_resumed() -> Result<()> {
    let shoot = shared_shoot().await?;
    let options = sim_options("shoot--sim--kubelets", 4, "kl-", FAST);
    let sim = create_sim(seed_client().await?, &shoot, options).await?;
    let (k, data) = (sim.kubelets(), sim.shoot());
    let created = k.renewals();
    assert_eq!(created.len(), 4, "creation times are recorded");

    // Every lease gets renewed past its creation time, as recorded.
    ev(eventually(WAIT, "every lease renewed", || async {
        for node in sim.node_names() {
            let t = data.lease_renew_time(&node).await.map_err(s)?;
            if t <= created.get(&node).copied() {
                return Ok(None);
            }
        }
        Ok(Some(()))
    })
    .await)?;

    // Silence kl-0; after two more rounds nothing of it can be in flight.
    k.silence(&["kl-0"]);
    assert_eq!(k.silenced(), vec!["kl-0".to_string()]);
    let r0 = k.rounds();
    ev(eventually(WAIT, "two rounds", || async {
        Ok((k.rounds() >= r0 + 2).then_some(()))
    })
    .await)?;
    let frozen = data
        .lease_renew_time("kl-0")
        .await?
        .context("kl-0 renewTime")?;
    let other = data
        .lease_renew_time("kl-1")
        .await?
        .context("kl-1 renewTime")?;
    ev(
        eventually(WAIT, "kl-1 renewed over three more rounds", || async {
            let t = data.lease_renew_time("kl-1").await.map_err(s)?;
            Ok((k.rounds() >= r0 + 5 && t > Some(other)).then_some(()))
        })
        .await,
    )?;
    assert_eq!(data.lease_renew_time("kl-0").await?, Some(frozen));
    assert_eq!(
        k.renewals().get("kl-0"),
        Some(&frozen),
        "last recorded renewal"
    );
    assert!(k.renewals()["kl-1"] > frozen);

    // Resumed, it is renewed again.
    k.resume(&["kl-0"]);
    assert!(k.silenced().is_empty());
    ev(eventually(WAIT, "kl-0 renewed after resume", || async {
        let t = data.lease_renew_time("kl-0").await.map_err(s)?;
        Ok((t > Some(frozen)).then_some(()))
    })
    .await)?;

    assert_eq!(k.silence_count(3), vec!["kl-0", "kl-1", "kl-2"]);
    assert_eq!(k.silenced(), vec!["kl-0", "kl-1", "kl-2"]);
    k.resume_all();
    assert!(k.silenced().is_empty());
    assert_eq!(k.failures(), 0);
    Ok(())
}

#[tokio::test]
async fn stamped_silence_writes_one_last_renewal_at_the_given_time_at_once() -> Result<()> {
    let shoot = shared_shoot().await?;
    // Rounds an hour apart: the last words must not wait for the next tick.
    let options = sim_options("shoot--sim--stamped", 3, "st-", Duration::from_secs(3600));
    let sim = create_sim(seed_client().await?, &shoot, options).await?;
    let (k, data) = (sim.kubelets(), sim.shoot());
    let stamp = chrono::Utc::now() - chrono::Duration::seconds(30);
    let stamp =
        stamp - chrono::Duration::nanoseconds(i64::from(stamp.timestamp_subsec_nanos() % 1000));
    assert_eq!(k.silence_count_stamped(2, stamp), vec!["st-0", "st-1"]);
    ev(eventually(WAIT, "last words written", || async {
        Ok((k.last_words_pending() == 0).then_some(()))
    })
    .await)?;
    assert_eq!(k.silenced(), vec!["st-0", "st-1"]);
    for node in ["st-0", "st-1"] {
        assert_eq!(
            data.lease_renew_time(node).await?,
            Some(stamp),
            "{node} in the apiserver"
        );
        assert_eq!(k.renewals().get(node), Some(&stamp), "{node} as recorded");
    }
    // The unsilenced node was renewed by the same round, at its own time.
    assert!(k.renewals()["st-2"] > stamp);
    // Later rounds leave the stamped leases alone.
    let r0 = k.rounds();
    k.silence_count_stamped(0, stamp); // wakes a round without new last words
    ev(eventually(WAIT, "another round", || async {
        Ok((k.rounds() > r0).then_some(()))
    })
    .await)?;
    assert_eq!(data.lease_renew_time("st-0").await?, Some(stamp));
    assert_eq!(k.failures(), 0);
    Ok(())
}

#[tokio::test]
async fn kubelets_survive_a_stopped_apiserver_and_stop_when_dropped() -> Result<()> {
    let env = TestEnv::shared().await?;
    let shoot = env.start_apiserver("sim-shoot-stop").await?;
    let client = shoot.client().await?;
    let data = ShootDataPlane::new(client.clone());
    let nodes = node_specs_with_prefix("st-", 2, &[]);
    data.create_nodes(&nodes).await?;
    let names: Vec<String> = nodes.iter().map(|n| n.name.clone()).collect();
    let renewals = data.create_leases(&names).await?;
    let options = KubeletOptions {
        renew_interval: FAST,
        ..Default::default()
    };
    let kubelets = Kubelets::start(client.clone(), names.clone(), renewals, options.clone());

    shoot.stop().await?;
    ev(eventually(WAIT, "renewals to fail", || async {
        Ok((kubelets.failures() >= 2).then_some(()))
    })
    .await)?;
    shoot.start().await?;
    let restarted = chrono::Utc::now();
    ev(eventually(WAIT, "renewals after the restart", || async {
        let r = kubelets.renewals();
        Ok(names.iter().all(|n| r[n] > restarted).then_some(()))
    })
    .await)?;

    // Dropped kubelets renew nothing more; another node's kubelet serves as the clock.
    drop(kubelets);
    let clock_node = node_specs_with_prefix("clock-", 1, &[]);
    data.create_nodes(&clock_node).await?;
    let clock_names = vec![clock_node[0].name.clone()];
    let clock_renewals = data.create_leases(&clock_names).await?;
    // A renewal in flight at drop is aborted or lands now; read after the clock's first round.
    let clock = Kubelets::start(client, clock_names, clock_renewals, options);
    ev(eventually(WAIT, "the clock to tick once", || async {
        Ok((clock.rounds() >= 1).then_some(()))
    })
    .await)?;
    let frozen = data.lease_renew_time("st-0").await?;
    ev(
        eventually(WAIT, "the clock to tick three more times", || async {
            Ok((clock.rounds() >= 4).then_some(()))
        })
        .await,
    )?;
    assert_eq!(data.lease_renew_time("st-0").await?, frozen);
    drop(clock);
    shoot.stop().await?;
    Ok(())
}

// One shared apiserver-backed shoot walked through what it creates, then each node mutation on
// it; the mutations build on the state the creation checks left.
#[allow(clippy::too_many_lines)]
#[tokio::test]
async fn sim_shoot_creates_everything_and_node_mutations_apply() -> Result<()> {
    let shoot = shared_shoot().await?;
    let shoot_client = shoot.client().await?;
    let seed = seed_client().await?;
    let mut options = sim_options("shoot--sim--all", 4, "all-", FAST);
    options.pools = vec!["pool-a".into(), "pool-b".into()];
    let sim = create_sim(seed.clone(), &shoot, options).await?;
    assert_eq!(sim.namespace(), "shoot--sim--all");
    assert_eq!(sim.secret_name(), DEFAULT_PROBE_SECRET);

    // Nodes: labels, pools round-robin, Ready=True kept from create.
    let nodes: Api<Node> = Api::all(shoot_client.clone());
    for (i, name) in sim.node_names().iter().enumerate() {
        let node = nodes.get(name).await?;
        let labels = node.metadata.labels.clone().unwrap_or_default();
        let pool = if i % 2 == 0 { "pool-a" } else { "pool-b" };
        assert_eq!(labels.get(POOL_LABEL).map(String::as_str), Some(pool));
        assert_eq!(
            labels.get("kubernetes.io/hostname").map(String::as_str),
            Some(name.as_str())
        );
        let conditions = node.status.and_then(|s| s.conditions).unwrap_or_default();
        assert!(
            conditions
                .iter()
                .any(|c| c.type_ == "Ready" && c.status == "True"),
            "{name}: {conditions:?}"
        );
    }
    let leases: Api<Lease> = Api::namespaced(shoot_client.clone(), NODE_LEASE_NAMESPACE);
    let lease = leases.get("all-0").await?;
    let spec = lease.spec.context("lease spec")?;
    assert_eq!(spec.holder_identity.as_deref(), Some("all-0"));
    assert_eq!(spec.lease_duration_seconds, Some(40));

    // Seed side: secret, cluster with both pools, machines, deployments with status.
    let secrets: Api<Secret> = Api::namespaced(seed.clone(), sim.namespace());
    let secret = secrets.get(DEFAULT_PROBE_SECRET).await?;
    let kubeconfig = &secret.data.context("secret data")?[KUBECONFIG_KEY];
    assert_eq!(kubeconfig.0, shoot.kubeconfig().as_bytes());
    let shoot_json = sim.seed().cluster_shoot().await?;
    let workers = shoot_json
        .pointer("/spec/provider/workers")
        .and_then(Value::as_array)
        .context("workers")?;
    assert_eq!(workers.len(), 2);
    let machines: Api<DynamicObject> =
        Api::namespaced_with(seed.clone(), sim.namespace(), &machine_resource());
    let listed = machines
        .list(&ListParams::default().labels("node=all-3"))
        .await?;
    assert_eq!(listed.items.len(), 1);
    assert_eq!(
        sim.seed().machine_phase("all-3").await?.as_deref(),
        Some("Running")
    );
    ev(eventually(WAIT, "deployments ready", || async {
        for (name, replicas) in [
            ("kube-controller-manager", 2),
            ("machine-controller-manager", 1),
            ("cluster-autoscaler", 1),
        ] {
            let d = sim.seed().deployment(name).await.map_err(s)?;
            if d.status.and_then(|s| s.ready_replicas) != Some(replicas) {
                return Ok(None);
            }
        }
        Ok(Some(()))
    })
    .await)?;

    // Node mutations.
    let data = sim.shoot();
    data.set_node_condition("all-1", "KernelDeadlock", "True", "Test")
        .await?;
    let node = nodes.get("all-1").await?;
    let conditions = node.status.and_then(|s| s.conditions).unwrap_or_default();
    assert!(
        conditions
            .iter()
            .any(|c| c.type_ == "KernelDeadlock" && c.status == "True")
    );
    assert!(
        conditions.iter().any(|c| c.type_ == "Ready"),
        "strategic merge keeps the other conditions: {conditions:?}"
    );
    data.remove_node_condition("all-1", "KernelDeadlock")
        .await?;
    let node = nodes.get("all-1").await?;
    let conditions = node.status.and_then(|s| s.conditions).unwrap_or_default();
    assert!(!conditions.iter().any(|c| c.type_ == "KernelDeadlock"));
    assert!(conditions.iter().any(|c| c.type_ == "Ready"));

    data.set_node_annotation("all-2", NOT_MANAGED_BY_MCM_ANNOTATION, "1")
        .await?;
    let annotations = node_annotations(&nodes, "all-2").await?;
    assert_eq!(
        annotations
            .get(NOT_MANAGED_BY_MCM_ANNOTATION)
            .map(String::as_str),
        Some("1")
    );
    data.remove_node_annotation("all-2", NOT_MANAGED_BY_MCM_ANNOTATION)
        .await?;
    let annotations = node_annotations(&nodes, "all-2").await?;
    assert!(!annotations.contains_key(NOT_MANAGED_BY_MCM_ANNOTATION));

    // A lease without renewTime (its kubelet silenced, else it would renew it).
    sim.kubelets().silence(&["all-3"]);
    data.delete_lease("all-3").await?;
    assert!(leases.get_opt("all-3").await?.is_none());
    data.create_lease_without_renew_time("all-3").await?;
    assert_eq!(data.lease_renew_time("all-3").await?, None);
    // An old renewTime expires a lease at once.
    let old = chrono::Utc::now() - chrono::Duration::minutes(5);
    data.set_lease_renew_time("all-3", old).await?;
    let got = data.lease_renew_time("all-3").await?.context("renewTime")?;
    assert_eq!(got.timestamp_micros(), old.timestamp_micros());
    Ok(())
}

#[tokio::test]
async fn deployment_status_follows_spec_including_scale_to_zero() -> Result<()> {
    let ns = "shoot--sim--deploy";
    let (seed, plane) = seed_namespace(ns).await?;
    let sim = DeploymentStatusSim::start(
        seed.clone(),
        DeploymentStatusOptions::namespaces(&[ns]).with_delay(Duration::from_millis(100)),
    );
    plane
        .create_deployments(&[("kcm".into(), 2), ("mcm".into(), 1)])
        .await?;

    let wait_status = |name: &'static str, replicas: i32| {
        let plane = plane.clone();
        async move {
            ev(
                eventually(WAIT, &format!("{name} status at {replicas}"), || async {
                    let d: Deployment = plane.deployment(name).await.map_err(s)?;
                    let generation = d.metadata.generation;
                    let st = d.status.unwrap_or_default();
                    // Zero-valued fields are dropped by the API: absent means 0.
                    let ok = st.replicas.unwrap_or(0) == replicas
                        && st.ready_replicas.unwrap_or(0) == replicas
                        && st.available_replicas.unwrap_or(0) == replicas
                        && st.updated_replicas.unwrap_or(0) == replicas
                        && st.observed_generation == generation;
                    Ok(ok.then_some(()))
                })
                .await,
            )
        }
    };
    wait_status("kcm", 2).await?;
    wait_status("mcm", 1).await?;

    plane.scale_deployment("kcm", 0).await?;
    wait_status("kcm", 0).await?;
    let d = plane.deployment("kcm").await?;
    assert_eq!(
        d.status.and_then(|s| s.ready_replicas),
        None,
        "0 is omitted"
    );
    plane.scale_deployment("kcm", 3).await?;
    wait_status("kcm", 3).await?;
    // Quick successive changes converge on the last one.
    plane.scale_deployment("mcm", 0).await?;
    plane.scale_deployment("mcm", 4).await?;
    plane.scale_deployment("mcm", 2).await?;
    wait_status("mcm", 2).await?;
    assert!(sim.writes() >= 4, "writes: {}", sim.writes());
    Ok(())
}

#[tokio::test]
async fn cluster_carries_the_shoot_state_and_updates() -> Result<()> {
    let (seed, plane) = seed_namespace("shoot--proj--cluster").await?;
    plane.create_cluster(&ShootState::default()).await?;

    let clusters: Api<DynamicObject> = Api::all_with(seed, &cluster_resource());
    let cluster = clusters.get("shoot--proj--cluster").await?;
    for field in ["shoot", "seed", "cloudProfile"] {
        assert!(cluster.data["spec"].get(field).is_some(), "spec.{field}");
    }
    let shoot = plane.cluster_shoot().await?;
    assert_eq!(shoot["kind"], "Shoot");
    assert_eq!(shoot["metadata"]["name"], "cluster");
    assert_eq!(shoot["metadata"]["namespace"], "garden-proj");
    assert!(shoot["metadata"].get("deletionTimestamp").is_none());
    assert_eq!(shoot["spec"]["hibernation"]["enabled"], false);
    assert_eq!(shoot["status"]["isHibernated"], false);
    assert_eq!(shoot["status"]["lastOperation"]["type"], "Reconcile");
    assert_eq!(shoot["status"]["lastOperation"]["state"], "Succeeded");
    assert_eq!(shoot["spec"]["provider"]["workers"][0]["name"], "worker-a");
    assert!(
        shoot["spec"]["provider"]["workers"][0]
            .get("machineControllerManager")
            .is_none()
    );

    let changed = ShootState {
        last_operation: Some(("Migrate".into(), "Processing".into())),
        hibernation_enabled: true,
        is_hibernated: true,
        deletion_timestamp: true,
        workers: vec![WorkerPool {
            name: "pool-x".into(),
            node_conditions: Some(vec!["DiskPressure".into()]),
        }],
        node_monitor_grace_period: Some("1m".into()),
    };
    plane.set_shoot_state(&changed).await?;
    let shoot = plane.cluster_shoot().await?;
    assert!(shoot["metadata"]["deletionTimestamp"].is_string());
    assert_eq!(shoot["spec"]["hibernation"]["enabled"], true);
    assert_eq!(shoot["status"]["isHibernated"], true);
    assert_eq!(shoot["status"]["lastOperation"]["type"], "Migrate");
    let worker = &shoot["spec"]["provider"]["workers"][0];
    assert_eq!(worker["name"], "pool-x");
    assert_eq!(
        worker["machineControllerManager"]["nodeConditions"],
        serde_json::json!(["DiskPressure"])
    );
    assert_eq!(
        shoot["spec"]["kubernetes"]["kubeControllerManager"]["nodeMonitorGracePeriod"],
        "1m"
    );

    // Back to the default: the replaced Shoot loses the fields, no leftovers from a merge.
    let no_op = ShootState {
        last_operation: None,
        workers: vec![],
        ..Default::default()
    };
    plane.set_shoot_state(&no_op).await?;
    let shoot = plane.cluster_shoot().await?;
    assert!(shoot["metadata"].get("deletionTimestamp").is_none());
    assert!(shoot["status"].get("lastOperation").is_none());
    assert_eq!(shoot["spec"]["provider"]["workers"], serde_json::json!([]));
    assert!(
        shoot["spec"]["kubernetes"]["kubeControllerManager"]
            .get("nodeMonitorGracePeriod")
            .is_none()
    );
    plane.delete_cluster().await?;
    assert!(clusters.get_opt("shoot--proj--cluster").await?.is_none());
    Ok(())
}

#[tokio::test]
async fn machines_have_a_phase_that_can_change() -> Result<()> {
    let (seed, plane) = seed_namespace("shoot--sim--machines").await?;
    plane
        .create_machines(&["m-0".into(), "m-1".into()], "Running")
        .await?;
    let machines: Api<DynamicObject> =
        Api::namespaced_with(seed, "shoot--sim--machines", &machine_resource());
    let all = machines.list(&ListParams::default()).await?;
    let by_node: HashMap<String, String> = all
        .items
        .iter()
        .filter_map(|m| {
            let node = m.metadata.labels.as_ref()?.get("node")?.clone();
            let phase = m.data.pointer("/status/currentStatus/phase")?.as_str()?;
            Some((node, phase.to_string()))
        })
        .collect();
    assert_eq!(by_node.len(), 2, "{:?}", all.items);
    assert!(by_node.values().all(|p| p == "Running"));

    plane.set_machine_phase("m-1", "Failed").await?;
    assert_eq!(plane.machine_phase("m-1").await?.as_deref(), Some("Failed"));
    assert_eq!(
        plane.machine_phase("m-0").await?.as_deref(),
        Some("Running")
    );
    plane.delete_machine("m-0").await?;
    assert_eq!(plane.machine_phase("m-0").await?, None);
    Ok(())
}

fn waiting_reason(pod: &Pod) -> Option<String> {
    pod.status
        .as_ref()?
        .container_statuses
        .as_ref()?
        .iter()
        .find_map(|c| c.state.as_ref()?.waiting.as_ref()?.reason.clone())
}

#[tokio::test]
async fn crashlooping_pods_show_the_reason_and_can_recover() -> Result<()> {
    let ns = "shoot--sim--pods";
    let (seed, plane) = seed_namespace(ns).await?;
    plane
        .create_crashlooping_pod("kcm-0", &[("app", "kcm")])
        .await?;
    plane.create_running_pod("kcm-1", &[("app", "kcm")]).await?;
    let pods: Api<Pod> = Api::namespaced(seed, ns);
    let crashing = pods.get("kcm-0").await?;
    assert_eq!(
        waiting_reason(&crashing).as_deref(),
        Some("CrashLoopBackOff")
    );
    assert_eq!(
        crashing
            .metadata
            .labels
            .unwrap_or_default()
            .get("app")
            .map(String::as_str),
        Some("kcm")
    );
    let running = pods.get("kcm-1").await?;
    assert_eq!(waiting_reason(&running), None);
    let running_state = running
        .status
        .and_then(|s| s.container_statuses)
        .and_then(|c| c.into_iter().next())
        .and_then(|c| c.state)
        .and_then(|s| s.running);
    assert!(running_state.is_some());

    plane.set_crashlooping("kcm-0", false).await?;
    assert_eq!(waiting_reason(&pods.get("kcm-0").await?), None);
    plane.set_crashlooping("kcm-1", true).await?;
    assert_eq!(
        waiting_reason(&pods.get("kcm-1").await?).as_deref(),
        Some("CrashLoopBackOff")
    );
    // Never scheduled, so a delete removes the pod at once (what the weeder relies on).
    pods.delete("kcm-1", &DeleteParams::default()).await?;
    assert!(pods.get_opt("kcm-1").await?.is_none());
    Ok(())
}

fn readiness(slice: &EndpointSlice) -> Vec<Option<bool>> {
    slice
        .endpoints
        .iter()
        .map(|e| e.conditions.as_ref().and_then(|c| c.ready))
        .collect()
}

#[tokio::test]
async fn endpoint_slices_move_between_ready_not_ready_partly_and_empty() -> Result<()> {
    let ns = "shoot--sim--slices";
    let (seed, plane) = seed_namespace(ns).await?;
    let slices: Api<EndpointSlice> = Api::namespaced(seed, ns);
    let name = endpoint_slice_name("kube-apiserver");

    plane
        .set_endpoint_slice("kube-apiserver", 3, EndpointsState::AllReady)
        .await?;
    let slice = slices.get(&name).await?;
    assert_eq!(slice.address_type, "IPv4");
    assert_eq!(
        slice.metadata.labels.clone().unwrap_or_default()[SERVICE_NAME_LABEL],
        "kube-apiserver"
    );
    assert_eq!(readiness(&slice), vec![Some(true); 3]);
    let listed = slices
        .list(&ListParams::default().labels(&format!("{SERVICE_NAME_LABEL}=kube-apiserver")))
        .await?;
    assert_eq!(listed.items.len(), 1);

    plane
        .set_endpoint_slice("kube-apiserver", 3, EndpointsState::NotReady)
        .await?;
    assert_eq!(readiness(&slices.get(&name).await?), vec![Some(false); 3]);
    plane
        .set_endpoint_slice("kube-apiserver", 3, EndpointsState::PartlyReady(1))
        .await?;
    assert_eq!(
        readiness(&slices.get(&name).await?),
        vec![Some(true), Some(false), Some(false)]
    );
    plane
        .set_endpoint_slice("kube-apiserver", 3, EndpointsState::Empty)
        .await?;
    assert!(slices.get(&name).await?.endpoints.is_empty());
    plane
        .set_endpoint_slice("kube-apiserver", 2, EndpointsState::AllReady)
        .await?;
    assert_eq!(readiness(&slices.get(&name).await?), vec![Some(true); 2]);
    plane.delete_endpoint_slice("kube-apiserver").await?;
    assert!(slices.get_opt(&name).await?.is_none());
    Ok(())
}

#[tokio::test]
async fn probe_secret_rotates_corrupts_and_deletes() -> Result<()> {
    let shoot = shared_shoot().await?;
    let ns = "shoot--sim--secret";
    let (seed, plane) = seed_namespace(ns).await?;
    let name = "probe";
    plane.create_probe_secret(name, shoot.kubeconfig()).await?;
    let secrets: Api<Secret> = Api::namespaced(seed, ns);
    let read = || async {
        let secret = secrets.get(name).await?;
        let data = secret.data.context("no data")?;
        let bytes = data.get(KUBECONFIG_KEY).context("no kubeconfig key")?;
        Ok::<_, anyhow::Error>(bytes.0.clone())
    };

    // The secret's content is a working kubeconfig for the shoot.
    let content = String::from_utf8(read().await?)?;
    let client = dwd_testenv::client_from_kubeconfig("from secret", &content).await?;
    assert_eq!(client.apiserver_version().await?.git_version, "v1.34.4");

    let rotated = shoot.kubeconfig_for("rotated-user", &["system:masters"])?;
    plane.rotate_probe_secret(name, &rotated).await?;
    assert_eq!(read().await?, rotated.as_bytes());

    plane.corrupt_probe_secret(name).await?;
    let garbage = read().await?;
    // Not even UTF-8 is certainly no kubeconfig; text must not parse as one either.
    if let Ok(text) = String::from_utf8(garbage)
        && kube::config::Kubeconfig::from_yaml(&text).is_ok()
    {
        bail!("corrupted content still parses as a kubeconfig: {text:?}");
    }

    plane.delete_probe_secret(name).await?;
    assert!(secrets.get_opt(name).await?.is_none());
    Ok(())
}

/// The nodes of `pools` as the apiserver serves them in a list (`GET /api/v1/nodes`, the
/// request the watchdog's lease probe makes): raw JSON, `managedFields` included, each item
/// with its size re-encoded compactly (the bytes it takes in the list: serde_json escapes the
/// same characters Go's encoder does in these nodes, quotes and backslashes).
async fn served_nodes(client: &kube::Client, pools: &[&str]) -> Result<Vec<(Value, usize)>> {
    let selector = format!("{POOL_LABEL} in ({})", pools.join(","));
    let request =
        kube::core::Request::new("/api/v1/nodes").list(&ListParams::default().labels(&selector))?;
    let list: Value = serde_json::from_str(&client.request_text(request).await?)?;
    let items = list["items"].as_array().context("items")?;
    items
        .iter()
        .map(|item| Ok((item.clone(), serde_json::to_string(item)?.len())))
        .collect()
}

/// `(min, avg, max)` of `sizes`.
fn size_stats(sizes: &[usize]) -> (usize, usize, usize) {
    let min = sizes.iter().copied().min().unwrap_or(0);
    let max = sizes.iter().copied().max().unwrap_or(0);
    (min, sizes.iter().sum::<usize>() / sizes.len().max(1), max)
}

/// Checks one served kubelet-sized node against its spec: 10–30 KiB, managedFields of at least
/// three writers, 40–50 images, and what the watchdog reads exactly as the spec says.
fn check_served_node(item: &Value, size: usize, spec: &NodeSpec) -> Result<()> {
    let name = &spec.name;
    if !(10 * 1024..=30 * 1024).contains(&size) {
        bail!("{name}: {size} bytes served, not 10-30 KiB");
    }
    let managers: Vec<&str> = item["metadata"]["managedFields"]
        .as_array()
        .context("managedFields")?
        .iter()
        .filter_map(|m| m["manager"].as_str())
        .collect();
    if managers.len() < 3 {
        bail!("{name}: managedFields of {managers:?}");
    }
    for m in [
        "kubelet",
        "node-problem-detector",
        "kube-controller-manager",
    ] {
        if !managers.contains(&m) {
            bail!("{name}: no {m} in managedFields of {managers:?}");
        }
    }
    let images = item["status"]["images"].as_array().context("images")?;
    if !(40..=50).contains(&images.len()) {
        bail!("{name}: {} images", images.len());
    }
    // The same images as the spec makes offline: the name decides them, not the run.
    assert_eq!(
        item["status"]["images"],
        spec.node_json(chrono::Utc::now())["status"]["images"],
        "{name}"
    );
    let labels = &item["metadata"]["labels"];
    assert_eq!(
        labels[POOL_LABEL].as_str(),
        Some(spec.pool.as_str()),
        "{name}"
    );
    assert_eq!(
        labels.get(ZONE_LABEL).and_then(Value::as_str),
        spec.labels.get(ZONE_LABEL).map(String::as_str),
        "{name}: zone label as the spec has it (or none)"
    );
    assert_eq!(
        item["metadata"]["annotations"]
            .get(NOT_MANAGED_BY_MCM_ANNOTATION)
            .and_then(Value::as_str),
        spec.annotations
            .get(NOT_MANAGED_BY_MCM_ANNOTATION)
            .map(String::as_str),
        "{name}"
    );
    let served: Vec<(&str, &str, &str)> = item["status"]["conditions"]
        .as_array()
        .context("conditions")?
        .iter()
        .map(|c| {
            let f = |k: &str| c[k].as_str().unwrap_or_default();
            (f("type"), f("status"), f("reason"))
        })
        .collect();
    for (t, st, r) in &spec.conditions {
        let of_type: Vec<_> = served.iter().filter(|c| c.0 == t).collect();
        assert_eq!(
            of_type,
            [&(t.as_str(), st.as_str(), r.as_str())],
            "{name}: {t}"
        );
    }
    for c in &served {
        if !spec.conditions.iter().any(|(t, _, _)| t == c.0) {
            assert_eq!(
                c.1, "False",
                "{name}: realistic conditions are healthy: {c:?}"
            );
        }
    }
    Ok(())
}

/// Kubelet-sized nodes as a kube-apiserver serves them. A node of a Gardener shoot, as
/// `kubectl get nodes -o json` lists it, is 10–30 KiB: about half of it its images (the kubelet
/// reports up to 50, each named by digest and by tag, 100–150 characters a name), the rest
/// thirteen or so conditions with their messages and times, node info, addresses, capacity,
/// the Gardener, topology and instance labels, the annotations of the kubelet, the CSI driver,
/// kube-controller-manager, machine-controller-manager and gardener-node-agent, and the
/// `managedFields` the apiserver keeps for each of those writers (3–5 KiB). Here the
/// apiserver writes the managedFields itself, from the writes of each manager.
#[tokio::test]
async fn kubelet_sized_nodes_are_served_as_big_as_real_ones_and_keep_the_spec() -> Result<()> {
    let shoot = shared_shoot().await?;
    let client = shoot.client().await?;
    // Small specs in two pools, half in zones, a few that a watchdog treats specially; the
    // option makes them all kubelet-sized.
    let specs: Vec<NodeSpec> = (0..20)
        .map(|i| {
            let spec = NodeSpec::new(format!("ks-{i}"), ["ks-a", "ks-b"][i % 2]);
            let spec = match i % 4 {
                0 => spec.in_zone("eu-west-1a"),
                1 => spec.in_zone("eu-west-1b"),
                _ => spec,
            };
            match i {
                2 => spec.with_condition("KernelDeadlock", "True", "KernelHasDeadlock"),
                3 => spec.with_condition("Ready", "False", "KubeletNotReady"),
                5 => spec.with_annotation(NOT_MANAGED_BY_MCM_ANNOTATION, "1"),
                6 => spec.with_condition("InPlaceUpdate", "True", "ReadyForUpdate"),
                _ => spec,
            }
        })
        .collect();
    let mut options = sim_options("shoot--sim--kubelet-sized", 0, "ks-", FAST);
    options.node_specs = Some(specs);
    let options = options.with_kubelet_sized_nodes();
    let started = Instant::now();
    let sim = create_sim(seed_client().await?, &shoot, options).await?;
    let took = started.elapsed();
    assert!(
        sim.nodes()
            .iter()
            .all(|n| n.shape == NodeShape::KubeletSized)
    );
    assert_eq!(sim.nodes().len(), 20);

    let served = served_nodes(&client, &["ks-a", "ks-b"]).await?;
    assert_eq!(served.len(), 20);
    for (item, size) in &served {
        let name = item["metadata"]["name"].as_str().context("name")?;
        let spec = sim
            .nodes()
            .iter()
            .find(|s| s.name == name)
            .context("spec")?;
        check_served_node(item, *size, spec)?;
    }
    let sizes: Vec<usize> = served.iter().map(|(_, size)| *size).collect();
    let (min, avg, max) = size_stats(&sizes);
    println!(
        "20 kubelet-sized nodes: SimShoot::create {took:?}; \
         served bytes per node min {min} avg {avg} max {max}"
    );
    // The typed client reads them too (what a Node list of another client would do).
    let nodes: Api<Node> = Api::all(client);
    let typed = nodes
        .list(&ListParams::default().labels(&format!("{POOL_LABEL}=ks-a")))
        .await?;
    assert_eq!(typed.items.len(), 10);
    Ok(())
}

/// 500 kubelet-sized nodes on an apiserver of their own, timed: a benchmark's shoot. Ignored
/// by default (it loads the shared etcd for a while); run it with
/// `cargo test -p dwd-sim --test sim -- --ignored --nocapture five_hundred`.
#[tokio::test]
#[ignore = "500 nodes of 20 KiB: run on demand, see the doc comment"]
async fn five_hundred_kubelet_sized_nodes_are_created_in_seconds() -> Result<()> {
    let env = TestEnv::shared().await?;
    let shoot = env.start_apiserver("sim-kubelet-500").await?;
    let client = shoot.client().await?;
    let data = ShootDataPlane::new(client.clone());
    let mut report = Vec::new();
    for (prefix, n, pool) in [("k20-", 20, "k20"), ("k500-", 500, "k500")] {
        let specs = kubelet_sized_node_specs_with_prefix(prefix, n, &[pool]);
        let started = Instant::now();
        data.create_nodes(&specs).await?;
        let took = started.elapsed();
        let served = served_nodes(&client, &[pool]).await?;
        assert_eq!(served.len(), n);
        for (item, size) in &served {
            let name = item["metadata"]["name"].as_str().context("name")?;
            let spec = specs.iter().find(|s| s.name == name).context("spec")?;
            check_served_node(item, *size, spec)?;
        }
        let sizes: Vec<usize> = served.iter().map(|(_, size)| *size).collect();
        let (min, avg, max) = size_stats(&sizes);
        report.push(format!(
            "{n} nodes: created in {took:?}; served bytes per node min {min} avg {avg} max {max}"
        ));
        assert!(took < Duration::from_secs(60), "{n} nodes took {took:?}");
    }
    println!("{}", report.join("\n"));
    shoot.stop().await?;
    Ok(())
}
