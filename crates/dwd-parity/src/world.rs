//! Lanes and worlds.
//!
//! A [`Lane`] is a seed kube-apiserver and a shoot kube-apiserver of a shared test
//! environment, used by one binary at a time: a watchdog acts on every Cluster and every
//! EndpointSlice of its seed, and a probe lists every lease of its shoot, so two binaries
//! running at once need two lanes. Scenarios on one lane run one after another, each in its
//! own shoot namespace; [`ScenarioWorld::clean_up`] removes what could reach the next binary
//! (the Cluster, pods, slices, Deployments; every Node and Lease of the shoot).
//!
//! The simulator and the recorder talk to the apiservers past their front doors, so a fault
//! at a front door (429s, conflicts) reaches only the binary under test.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use anyhow::{Context, Result, anyhow, ensure};
use dwd_sim::{SeedControlPlane, SimShoot, SimShootOptions};
use dwd_testenv::{ApiServer, ApiServerOptions, TestEnv};
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{Namespace, Node, Pod};
use k8s_openapi::api::discovery::v1::EndpointSlice;
use kube::api::{Api, DeleteParams, DynamicObject, ListParams, Patch, PatchParams, PostParams};
use serde_json::{Value, json};

use crate::scenario::{PodSpec, PodState, Role, Scenario, WorldSpec};

/// Kubelets renew every second (the kubelet's 10 s, shortened like the other intervals).
pub const RENEW_INTERVAL: Duration = Duration::from_secs(1);

/// A seed and a shoot apiserver used by one binary at a time.
pub struct Lane {
    /// Lane name (`lane0`, …), the prefix of its apiservers' names.
    pub name: String,
    /// The seed (CRDs installed).
    pub seed: ApiServer,
    /// The shoot.
    pub shoot: ApiServer,
    /// Admin clients past the front doors.
    pub seed_direct: kube::Client,
    shoot_direct: kube::Client,
    /// Where this lane writes configs, kubeconfigs and logs.
    pub dir: PathBuf,
}

impl Lane {
    /// Starts the lane's two apiservers in `env`; its files go to `dir`.
    pub async fn start(env: &TestEnv, name: &str, dir: PathBuf) -> Result<Lane> {
        Self::start_with(env, name, dir, ApiServerOptions::seed()).await
    }

    /// Like [`Lane::start`] with the seed's options (e.g. an audit log, for the shadow-mode
    /// test); the CRDs are installed whatever `seed_options` says.
    pub async fn start_with(
        env: &TestEnv,
        name: &str,
        dir: PathBuf,
        seed_options: ApiServerOptions,
    ) -> Result<Lane> {
        let seed_options = ApiServerOptions {
            install_crds: true,
            ..seed_options
        };
        let seed = env
            .start_apiserver_with(&format!("{name}-seed"), seed_options)
            .await?;
        let shoot = env.start_apiserver(&format!("{name}-shoot")).await?;
        let seed_direct = seed.direct_client().await?;
        // Where both binaries write their own Events and, with leader election, their Lease
        // by default (Gardener deploys them in `garden`).
        create_namespace(&seed_direct, GARDEN).await?;
        let shoot_direct = shoot.direct_client().await?;
        std::fs::create_dir_all(&dir).with_context(|| format!("create {}", dir.display()))?;
        std::fs::write(dir.join("seed.kubeconfig"), seed.kubeconfig())
            .context("write the seed kubeconfig")?;
        Ok(Lane {
            name: name.to_string(),
            seed,
            shoot,
            seed_direct,
            shoot_direct,
            dir,
        })
    }

    /// The watchdog's seed kubeconfig (admin, through the front door).
    pub fn seed_kubeconfig(&self) -> PathBuf {
        self.dir.join("seed.kubeconfig")
    }

    /// Builds `scenario`'s world in a namespace of its own.
    pub async fn build(&self, scenario: &Scenario) -> Result<ScenarioWorld> {
        static RUN: AtomicUsize = AtomicUsize::new(0);
        let n = RUN.fetch_add(1, Ordering::SeqCst);
        let namespace = format!("shoot--parity--{}-{n}", scenario.name);
        let w = &scenario.world;
        let seed = SeedControlPlane::new(self.seed_direct.clone(), &namespace);
        let sim = match scenario.role {
            Role::Prober => {
                let options = sim_shoot_options(&namespace, w);
                let sim = SimShoot::create(
                    self.seed_direct.clone(),
                    self.shoot_direct.clone(),
                    self.shoot.kubeconfig(),
                    options,
                )
                .await
                .with_context(|| format!("build the shoot of {}", scenario.name))?;
                Some(sim)
            }
            Role::Weeder => {
                seed.create_namespace().await?;
                None
            }
        };
        for (d, k, v) in &w.annotations {
            seed.set_deployment_annotation(d, k, Some(v)).await?;
        }
        for (service, n, state) in &w.slices {
            seed.set_endpoint_slice(service, *n, *state).await?;
        }
        for pod in &w.pods {
            create_pod(&self.seed_direct, &namespace, pod).await?;
        }
        if scenario.role == Role::Prober {
            // The status simulation writes the Deployments' first status; wait for it, so the
            // binary starts on a settled world.
            deployments_ready(&self.seed_direct, &namespace).await?;
        }
        Ok(ScenarioWorld {
            namespace,
            seed,
            sim,
            seed_direct: self.seed_direct.clone(),
            shoot_direct: self.shoot_direct.clone(),
        })
    }
}

/// The simulated shoot of a prober scenario's world: its nodes (their pools, in order of first
/// use), shoot state and Deployments with their status delay, leases renewed every
/// [`RENEW_INTERVAL`].
fn sim_shoot_options(namespace: &str, w: &WorldSpec) -> SimShootOptions {
    let mut options = SimShootOptions::new(namespace);
    options.node_specs = Some(w.nodes.clone());
    options.pools = w
        .nodes
        .iter()
        .map(|n| n.pool.clone())
        .fold(Vec::new(), |mut v, p| {
            if !v.contains(&p) {
                v.push(p);
            }
            v
        });
    options.renew_interval = RENEW_INTERVAL;
    options.shoot_state = w.shoot_state.clone();
    options.deployments = w
        .deployments
        .iter()
        .map(|(d, r)| (d.to_string(), *r))
        .collect();
    options.deployment_status_delay = Some(w.status_delay);
    options
}

/// Waits (up to 30 s) until every Deployment in `namespace` has its wanted replicas ready.
async fn deployments_ready(seed: &kube::Client, namespace: &str) -> Result<()> {
    let api: Api<Deployment> = Api::namespaced(seed.clone(), namespace);
    dwd_testenv::eventually(Duration::from_secs(30), "Deployments ready", || {
        let api = api.clone();
        async move {
            let list = api
                .list(&ListParams::default())
                .await
                .map_err(|e| e.to_string())?;
            Ok(list
                .items
                .iter()
                .all(|d| {
                    let want = d.spec.as_ref().and_then(|s| s.replicas).unwrap_or(1);
                    d.status
                        .as_ref()
                        .and_then(|s| s.ready_replicas)
                        .unwrap_or(0)
                        == want
                })
                .then_some(()))
        }
    })
    .await
    .map_err(|e| anyhow!(e))
}

/// One scenario's objects; [`ScenarioWorld::clean_up`] removes them.
pub struct ScenarioWorld {
    /// The shoot namespace (also the Cluster's name).
    pub namespace: String,
    /// Its control-plane objects in the seed (past the front door).
    pub seed: SeedControlPlane,
    /// The simulated shoot (prober scenarios).
    pub sim: Option<SimShoot>,
    seed_direct: kube::Client,
    shoot_direct: kube::Client,
}

impl ScenarioWorld {
    /// Stops the simulation and deletes what could reach the lane's next binary: the Cluster,
    /// the namespace's Deployments, pods and slices, every Node and Lease of the shoot.
    pub async fn clean_up(mut self) -> Result<()> {
        self.sim.take();
        let dp = DeleteParams::default();
        let lp = ListParams::default();
        let clusters: Api<DynamicObject> =
            Api::all_with(self.seed_direct.clone(), &dwd_sim::seed::cluster_resource());
        match clusters.delete(&self.namespace, &dp).await {
            Ok(_) => {}
            Err(kube::Error::Api(s)) if s.code == 404 => {}
            Err(e) => return Err(e).context("delete the Cluster"),
        }
        let ns = &self.namespace;
        Api::<Deployment>::namespaced(self.seed_direct.clone(), ns)
            .delete_collection(&dp, &lp)
            .await
            .context("delete Deployments")?;
        Api::<Pod>::namespaced(self.seed_direct.clone(), ns)
            .delete_collection(&dp, &lp)
            .await
            .context("delete Pods")?;
        Api::<EndpointSlice>::namespaced(self.seed_direct.clone(), ns)
            .delete_collection(&dp, &lp)
            .await
            .context("delete EndpointSlices")?;
        Api::<Lease>::namespaced(
            self.shoot_direct.clone(),
            dwd_sim::shoot::NODE_LEASE_NAMESPACE,
        )
        .delete_collection(&dp, &lp)
        .await
        .context("delete shoot Leases")?;
        Api::<Node>::all(self.shoot_direct.clone())
            .delete_collection(&dp, &lp)
            .await
            .context("delete shoot Nodes")?;
        Ok(())
    }
}

/// The namespace Gardener deploys the watchdog in.
pub const GARDEN: &str = "garden";

async fn create_namespace(client: &kube::Client, name: &str) -> Result<()> {
    let ns: Namespace = serde_json::from_value(json!({"metadata": {"name": name}}))?;
    match Api::<Namespace>::all(client.clone())
        .create(&PostParams::default(), &ns)
        .await
    {
        Ok(_) => Ok(()),
        Err(kube::Error::Api(s)) if s.code == 409 => Ok(()),
        Err(e) => Err(e).with_context(|| format!("create namespace {name}")),
    }
}

/// Creates a pod and writes its status ([`PodState`]).
async fn create_pod(client: &kube::Client, namespace: &str, spec: &PodSpec) -> Result<()> {
    let seed = SeedControlPlane::new(client.clone(), namespace);
    match spec.state {
        PodState::Running => seed.create_running_pod(spec.name, &spec.labels).await?,
        PodState::CrashLooping => {
            seed.create_crashlooping_pod(spec.name, &spec.labels)
                .await?
        }
        PodState::InitCrashLooping => {
            // dwd-sim has no init containers: the pod and its status written here.
            let labels: std::collections::BTreeMap<&str, &str> =
                spec.labels.iter().copied().collect();
            let pod: Pod = serde_json::from_value(json!({
                "apiVersion": "v1", "kind": "Pod",
                "metadata": {"name": spec.name, "labels": labels},
                "spec": {
                    "initContainers": [{"name": "init", "image": "registry.invalid/init:1"}],
                    "containers": [{"name": "main", "image": "registry.invalid/main:1"}],
                    "terminationGracePeriodSeconds": 0
                }
            }))?;
            let api: Api<Pod> = Api::namespaced(client.clone(), namespace);
            api.create(&PostParams::default(), &pod)
                .await
                .with_context(|| format!("create Pod {namespace}/{}", spec.name))?;
            let now = chrono::Utc::now().to_rfc3339_opts(chrono::SecondsFormat::Secs, true);
            let status = json!({"status": {
                "phase": "Pending",
                "conditions": [{"type": "Ready", "status": "False", "lastTransitionTime": now}],
                "initContainerStatuses": [{
                    "name": "init", "image": "registry.invalid/init:1", "imageID": "",
                    "ready": false, "restartCount": 5,
                    "state": {"waiting": {"reason": "CrashLoopBackOff",
                              "message": "back-off 5m0s restarting failed container (simulated)"}},
                    "lastState": {"terminated": {"exitCode": 1, "reason": "Error",
                                  "startedAt": now, "finishedAt": now}}
                }],
                "containerStatuses": [{
                    "name": "main", "image": "registry.invalid/main:1", "imageID": "",
                    "ready": false, "restartCount": 0,
                    "state": {"waiting": {"reason": "PodInitializing"}}
                }]
            }});
            api.patch_status(spec.name, &PatchParams::default(), &Patch::Merge(status))
                .await
                .with_context(|| format!("write the status of Pod {namespace}/{}", spec.name))?;
        }
    }
    Ok(())
}

// --- Gardener's configs ---------------------------------------------------------------------

/// `deploy/gardener/` of this repository.
pub fn gardener_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../deploy/gardener")
}

/// The `dep-config.yaml` of the ConfigMap in `deploy/gardener/<role>.yaml`.
pub fn gardener_config(role: Role) -> Result<String> {
    let file = match role {
        Role::Prober => "prober.yaml",
        Role::Weeder => "weeder.yaml",
    };
    let path = gardener_dir().join(file);
    let text =
        std::fs::read_to_string(&path).with_context(|| format!("read {}", path.display()))?;
    let docs: Vec<Value> =
        serde_saphyr::from_multiple(&text).map_err(|e| anyhow!("parse {}: {e}", path.display()))?;
    docs.iter()
        .find(|d| d["kind"] == "ConfigMap")
        .and_then(|cm| cm["data"]["dep-config.yaml"].as_str())
        .map(str::to_string)
        .with_context(|| format!("no ConfigMap with dep-config.yaml in {}", path.display()))
}

/// MCM's scale-up `initialDelay` (Gardener's 30 s, shortened).
pub const MCM_UP_DELAY_S: u64 = 3;

/// Gardener's config with only its intervals shortened so a scenario takes seconds: probes
/// every second from 2 s after start, `probeTimeout` 5 s, leases count as expired 4.5 s after
/// their last renewal (grace 6 s × 0.75), MCM's scale-up delay 3 s; the weeder watches for
/// 15 s instead of 5 min. Targets, levels and everything else as gardenlet writes them.
pub fn shortened(role: Role) -> Result<String> {
    let config = gardener_config(role)?;
    match role {
        Role::Prober => {
            ensure!(
                config.contains("probeInterval: 30s\n") && config.contains("initialDelay: 30s\n"),
                "Gardener's prober config changed shape:\n{config}"
            );
            Ok(config
                .replace(
                    "probeInterval: 30s\n",
                    "probeInterval: 1s\ninitialDelay: 2s\nprobeTimeout: 5s\nkcmNodeMonitorGraceDuration: 6s\n",
                )
                .replace(
                    "initialDelay: 30s\n",
                    &format!("initialDelay: {MCM_UP_DELAY_S}s\n"),
                ))
        }
        Role::Weeder => {
            ensure!(
                config.contains("watchDuration: 5m0s\n"),
                "Gardener's weeder config changed shape:\n{config}"
            );
            Ok(config.replace("watchDuration: 5m0s\n", "watchDuration: 15s\n"))
        }
    }
}

/// The command line: Gardener's (deploy/gardener/*.yaml) with the config file, the seed
/// kubeconfig and loopback ports of our own.
pub fn command_line(
    scenario: &Scenario,
    config: &Path,
    kubeconfig: &Path,
    ports: [u16; 3],
    lease_namespace: &str,
) -> Vec<String> {
    let mut args = vec![
        match scenario.role {
            Role::Prober => "prober".to_string(),
            Role::Weeder => "weeder".to_string(),
        },
        format!("--config-file={}", config.display()),
        format!("--kubeconfig={}", kubeconfig.display()),
    ];
    if scenario.role == Role::Prober {
        args.extend([
            "--kube-api-qps=20.0".to_string(),
            "--kube-api-burst=100".to_string(),
            "--zap-log-level=INFO".to_string(),
        ]);
    }
    args.extend([
        format!("--metrics-bind-addr=127.0.0.1:{}", ports[0]),
        format!("--health-bind-addr=127.0.0.1:{}", ports[1]),
        format!("--pprof-bind-addr=127.0.0.1:{}", ports[2]),
    ]);
    if scenario.leader_election {
        args.extend([
            "--enable-leader-election=true".to_string(),
            format!("--leader-election-namespace={lease_namespace}"),
        ]);
    }
    args
}

/// The leader-election Lease's name.
pub fn lease_name(role: Role) -> &'static str {
    match role {
        Role::Prober => dwd_core::gardener::PROBER_LEASE,
        Role::Weeder => dwd_core::gardener::WEEDER_LEASE,
    }
}
